"""The sampler on real rows of the bundled Gemma 3 270M target (262,144 logits each): its candidates,
their probabilities and its draws for a seed equal those of the filters by the book (the whole row
sorted, ties to the lower id, then top-k, min-p, top-p and temperature) with the same uniforms.

The sampler never sorts a whole row: top-k's candidates come from the blocks whose max can reach
the k-th largest (sampling._largest) and top-p sorts a head of 64 ids, four times longer until it
holds top-p's mass (sampling._sorted_head). The rows include flattened ones (top-p's head runs to
thousands of ids), masked ones (all but a few ids at -inf, as a grammar leaves a row) and rows with
ties at the top-k cut. A head that never grows (too short for top-p, no fallback) fails the check:
the last test shows it sees that."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.engine import sampling
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, TokenBatch
from app.engine.params import GenerationParams
from app.engine.sampling import TokenSampler

pytestmark = pytest.mark.gemma

PROMPT = "The three most common ways to cook an egg are boiling, frying and"
DRAWS = 12  # per row and setting: each draw's uniform lands elsewhere in the same candidates
FLATTEN = 0.3  # flattened rows: the logits times this (top-p's head then runs to thousands of ids)
SETTINGS = [
    {"temperature": 0.8, "top_p": 0.95},  # top-k 40 (the default): a sampled reply's usual row
    {"temperature": 0.8, "top_k": 0, "top_p": 0.95},  # top-p over the whole vocabulary
    {"temperature": 1.0, "top_k": 0, "min_p": 0.05},
    {"temperature": 0.7, "top_k": 1000, "top_p": 0.9, "min_p": 0.01},
    {"temperature": 1.2, "top_k": 8000, "top_p": 0.99},  # more than SORT_MAX candidates
]


@pytest.fixture(scope="module")
def rows(gemma_target: Path) -> np.ndarray:
    return target_rows(gemma_target)


def target_rows(target: Path) -> np.ndarray:
    """Real rows of the target, then the same rows flattened, masked and quantised (ties)."""
    model = LlamaModel(target)
    ctx = LlamaContext(model, ContextConfig(n_ctx=256, n_batch=64, n_ubatch=64))
    batch = TokenBatch(64)
    try:
        toks = model.tokenize(PROMPT)[:10]
        batch.set(toks, 0, True)
        ctx.decode(batch)
        real = np.array(ctx.logits_rows(len(toks)), dtype=np.float32)
    finally:
        batch.close()
        ctx.close()
        model.close()
    flat = real[:3] * np.float32(FLATTEN)  # top-p 0.95 then needs a long head
    masked = np.full((2, real.shape[1]), -np.inf, dtype=np.float32)
    for r, allowed in zip(masked, (np.arange(7, 70_000, 9_001), np.arange(100, 110))):
        r[allowed] = real[4, allowed]  # a few ids allowed, as under a grammar
    tied = np.round(real[5:7])  # whole numbers: many ids tie at the top-k cut
    return np.vstack([real, flat, masked, tied]).astype(np.float32)


def _by_the_book(row: np.ndarray, order: np.ndarray, p: GenerationParams) -> tuple[np.ndarray, np.ndarray]:
    """The filters over the whole sorted row (`order`: every id, most likely first, ties to the lower id)."""
    if 0 < p.top_k < len(order):
        order = order[:p.top_k]
    v = row[order].astype(np.float64)
    top = v[0]
    w = np.exp(v - top)
    keep = len(order)
    if p.min_p > 0.0:
        keep = int(np.count_nonzero(v >= top + np.log(p.min_p)))
    if p.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(w) / w.sum(), p.top_p) + 1))
    probs = np.exp((v[:keep] - top) / p.temperature)
    return order[:keep], probs / probs.sum()


def _draw(ids: np.ndarray, probs: np.ndarray, u: float) -> int:
    """The candidate the uniform u selects (past the sum by rounding: the last one with a chance)."""
    i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(ids[i if i < len(ids) else np.flatnonzero(probs)[-1]])


def _mismatches(rows: np.ndarray) -> list[str]:
    """Every row and setting where the sampler's candidates, probabilities or draws differ from the book's."""
    bad = []
    for r, row in enumerate(rows):
        order = np.argsort(-row, kind="stable")
        for s, kw in enumerate(SETTINGS):
            p = GenerationParams(seed=100 * r + s, **kw)
            want_ids, want_probs = _by_the_book(row, order, p)
            sampler = TokenSampler(p)
            ids, probs = sampler.probabilities(row)
            if ids.tolist() != want_ids.tolist() or not np.allclose(probs, want_probs, rtol=1e-9, atol=0.0):
                bad.append(f"row {r}, {kw}: {len(ids)} candidates, the book {len(want_ids)}")
                continue
            rng = np.random.default_rng(p.seed)  # the sampler's own generator, seeded alike
            want = [_draw(want_ids, want_probs, rng.random()) for _ in range(DRAWS)]
            got = [sampler.pick(row) for _ in range(DRAWS)]
            if got != want:
                bad.append(f"row {r}, {kw}: draws {got}, the book {want}")
    return bad


def test_the_rows_exercise_every_path(rows: np.ndarray) -> None:
    """The rows reach what the check must cover: long top-p heads, ties at the cut, -inf rows."""
    heads = [len(TokenSampler(GenerationParams(**SETTINGS[1])).probabilities(r)[0]) for r in rows[10:13]]
    assert min(heads) > 4 * sampling.HEAD_FIRST  # the head grew at least twice
    tied = rows[15]
    kth = np.sort(tied)[::-1][39:41]
    assert kth[0] == kth[1]  # the 40th and 41st most likely tie: the lower id must win
    assert np.isfinite(rows[13]).sum() < 40  # fewer finite ids than top-k asks for


def test_the_sampler_equals_the_full_row_by_the_book(rows: np.ndarray) -> None:
    assert _mismatches(rows) == []


def test_the_check_catches_a_top_p_head_that_never_grows(rows: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    def head_without_growth(ids, vals, top, z, top_p):  # noqa: ANN001, ANN202 - the broken variant
        head = sampling._largest(vals, min(sampling.HEAD_FIRST, len(vals)))
        return ids[head], vals[head]

    monkeypatch.setattr(sampling, "_sorted_head", head_without_growth)
    bad = _mismatches(rows[10:13])  # the flattened rows
    assert bad and all("candidates" in b for b in bad)
