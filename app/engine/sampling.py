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

SORT_MAX = 4096  # more candidates than this are sorted only as far as top-p needs


class TokenSampler:
    def __init__(self, params: GenerationParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def probabilities(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(candidate token ids, their probabilities) after the filters and temperature; most
        likely first, except a whole unfiltered vocabulary (kept in id order: a draw needs none)."""
        p = self.params
        x = np.asarray(logits, dtype=np.float32)
        if 0 < p.top_k < x.shape[0]:
            ids = np.argpartition(-x, p.top_k - 1)[:p.top_k]
        else:
            ids = np.arange(x.shape[0])
        vals = x[ids].astype(np.float64)
        top = vals.max()
        # top-p's mass is a share of every top-k candidate's; min-p's cut is a ratio to the best
        z = np.exp(vals - top).sum() if p.top_p < 1.0 else 1.0
        if p.min_p > 0.0:
            keep = vals >= top + np.log(p.min_p)  # p_i >= min_p * p_max, exactly
            ids, vals = ids[keep], vals[keep]
        if p.top_p < 1.0 or len(vals) <= SORT_MAX:
            ids, vals = _sorted_head(ids, vals, top, z * p.top_p if p.top_p < 1.0 else None)
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(np.exp(vals - top)) / z, p.top_p) + 1)
            ids, vals = ids[:keep], vals[:keep]
        t = max(p.temperature, 1e-6)
        probs = np.exp((vals - top) / t)
        probs /= probs.sum()
        return ids, probs

    def sample(self, logits: np.ndarray) -> int:
        ids, probs = self.probabilities(logits)
        u = self.rng.random()
        i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return int(ids[min(i, len(ids) - 1)])


def _sorted_head(ids: np.ndarray, vals: np.ndarray, top: float, mass: float | None) -> tuple[np.ndarray, np.ndarray]:
    """The candidates in descending order, or (with `mass`) only as many of the most likely as
    reach that unnormalised probability mass: with top-k off the vocabulary is 262k ids, and a
    full sort per token would cost more than the target's step."""
    n = 64
    while mass is not None and n < len(vals):
        head = np.argpartition(-vals, n - 1)[:n]
        if np.exp(vals[head] - top).sum() >= mass:
            order = head[np.lexsort((ids[head], -vals[head]))]  # ties: the lower id first
            return ids[order], vals[order]
        n *= 4
    order = np.lexsort((ids, -vals))
    return ids[order], vals[order]
