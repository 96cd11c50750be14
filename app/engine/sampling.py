"""Sampling one token from a row of target logits.

The chain follows llama.cpp's default order: top-k, top-p and min-p are
applied to the untempered distribution, then temperature to the survivors.
One uniform draw per emitted token, from a numpy Generator seeded once per
generation, so a seed reproduces a run and plain and speculative decoding
consume randomness identically.
"""

from __future__ import annotations

import numpy as np

from app.engine.params import GenerationParams


class TokenSampler:
    def __init__(self, params: GenerationParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def probabilities(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(candidate token ids, their probabilities) after the filters and temperature."""
        p = self.params
        x = np.asarray(logits, dtype=np.float32)
        if 0 < p.top_k < x.shape[0]:
            ids = np.argpartition(-x, p.top_k - 1)[:p.top_k]
        else:
            ids = np.arange(x.shape[0])
        vals = x[ids].astype(np.float64)
        order = np.argsort(-vals, kind="stable")
        ids, vals = ids[order], vals[order]
        probs = np.exp(vals - vals[0])
        probs /= probs.sum()
        keep = len(ids)
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p) + 1))
        if p.min_p > 0.0:
            keep = min(keep, max(1, int(np.sum(probs >= p.min_p * probs[0]))))
        ids, vals = ids[:keep], vals[:keep]
        t = max(p.temperature, 1e-6)
        probs = np.exp((vals - vals[0]) / t)
        probs /= probs.sum()
        return ids, probs

    def sample(self, logits: np.ndarray) -> int:
        ids, probs = self.probabilities(logits)
        u = self.rng.random()
        i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return int(ids[min(i, len(ids) - 1)])
