"""Sampling: the filters on known logits, and sampled speculative decoding against plain sampling.

The statistical test forces drafts (the greedy continuation) so that tokens are sampled at
drafted positions after accepted drafts, several positions deep, and compares the tokens there
with plain sampling under independent seeds (chi-square test of homogeneity). The same test
applied to a deliberately biased verifier (it accepts any draft the filters allow) must fail:
that shows it can."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from app.engine.dflash import Engine
from app.engine.draft_policy import DFLASH, Choice, FixedDraftLength
from app.engine.params import GenerationParams
from app.engine.sampling import TokenSampler

LOGITS = np.log(np.array([0.4, 0.3, 0.15, 0.1, 0.05]))


def candidates(**kw) -> tuple[list[int], np.ndarray]:  # noqa: ANN003
    ids, probs = TokenSampler(GenerationParams(**{"temperature": 1.0, "top_k": 0, **kw})).probabilities(LOGITS)
    return ids.tolist(), probs


def test_top_k_keeps_the_k_most_likely() -> None:
    ids, probs = candidates(top_k=2)
    assert ids == [0, 1] and probs == pytest.approx([0.4 / 0.7, 0.3 / 0.7])


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    assert candidates(top_p=0.5)[0] == [0, 1]  # 0.4 < 0.5 <= 0.7
    assert candidates(top_p=0.7)[0] == [0, 1]
    assert candidates(top_p=0.71)[0] == [0, 1, 2]
    ids, probs = candidates(top_p=0.9)
    assert ids == [0, 1, 2, 3] and probs == pytest.approx(np.array([0.4, 0.3, 0.15, 0.1]) / 0.95)


def test_min_p_keeps_tokens_above_a_share_of_the_best() -> None:
    assert candidates(min_p=0.3)[0] == [0, 1, 2]  # 0.15 >= 0.3 * 0.4 = 0.12 > 0.1
    assert candidates(min_p=0.9)[0] == [0]


def test_temperature_applies_to_the_survivors() -> None:
    ids, probs = TokenSampler(GenerationParams(temperature=0.5, top_k=3)).probabilities(LOGITS)
    want = np.array([0.4, 0.3, 0.15]) ** 2
    assert ids.tolist() == [0, 1, 2] and probs == pytest.approx(want / want.sum())


def _full_sort_reference(logits: np.ndarray, top_p: float, min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The filters by the book: sort the whole vocabulary, cut by top-p and by min-p."""
    order = np.argsort(-logits, kind="stable")
    probs = np.exp(logits[order] - logits[order[0]])
    probs /= probs.sum()
    keep = min(int(np.searchsorted(np.cumsum(probs), top_p) + 1) if top_p < 1.0 else len(order),
               max(1, int(np.sum(probs >= min_p * probs[0]))))
    return order[:keep], probs[:keep] / probs[:keep].sum()


@pytest.mark.parametrize(("top_p", "min_p", "scale"), [(0.9, 0.0, 3.0), (0.95, 0.0, 0.5), (0.99, 0.0, 0.2),
                                                      (1.0, 0.05, 3.0), (0.8, 0.02, 1.0)])
def test_the_filters_over_a_whole_vocabulary_match_a_full_sort(top_p: float, min_p: float, scale: float) -> None:
    """Without top-k only the head of the vocabulary is sorted; flat and peaked logits alike
    (scale 0.2 spreads top-p's mass over ~200k of the 262k ids) give the full sort's set."""
    logits = np.random.default_rng(1).normal(0.0, scale, 262144).astype(np.float32)
    params = GenerationParams(temperature=1.0, top_k=0, top_p=top_p, min_p=min_p)
    ids, probs = TokenSampler(params).probabilities(logits)
    want_ids, want_probs = _full_sort_reference(logits.astype(np.float64), top_p, min_p)
    assert ids.tolist() == want_ids.tolist() and probs == pytest.approx(want_probs)


def test_a_seed_reproduces_the_draws_and_the_draws_follow_the_distribution() -> None:
    params = GenerationParams(temperature=1.0, top_k=0, seed=7)
    a = [TokenSampler(params).sample(LOGITS) for _ in range(3)]
    s = TokenSampler(params)
    draws = [s.sample(LOGITS) for _ in range(20000)]
    assert a == [a[0]] * 3 and draws[0] == a[0]
    freq = np.bincount(draws, minlength=5) / len(draws)
    assert freq == pytest.approx(np.exp(LOGITS), abs=0.015)


# --- sampled speculative decoding on the bundled target ----------------------------------------

PROMPT = "Monday, Tuesday, Wednesday,"  # the next tokens are likely but not certain: drafts pass often
N = 150  # generations per side
DEPTH = 4  # tokens drafted in the one step that produces them all (when every draft passes)


_VERIFY = Engine._verify


def _accept_any_allowed_draft(self: Engine, anchor, drafts, n_past, sampler, st):  # noqa: ANN001, ANN202
    """A broken verifier: a draft the filters allow is accepted without sampling (no rejection)."""
    if sampler is None:  # greedy runs as before
        return _VERIFY(self, anchor, drafts, n_past, sampler, st)
    self._tbatch.set([anchor] + drafts, n_past, True)
    self.ctx.decode(self._tbatch)
    emitted = []
    for i in range(len(drafts) + 1):
        ids, _ = sampler.probabilities(self.ctx.logits_row(i))
        t = drafts[i] if i < len(drafts) and drafts[i] in ids else sampler.sample(self.ctx.logits_row(i))
        emitted.append(t)
        if i == len(drafts) or t != drafts[i]:
            break
    return emitted, len(emitted) - 1


def _tokens_at_depth(e: Engine, filters: dict, speculative: bool) -> tuple[list[Counter], int]:
    """The tokens sampled at positions 1..DEPTH over N seeds (speculative: with the greedy
    continuation forced as the drafts), and how many drafts were accepted in all."""
    prompt = e.tokenize(PROMPT)
    greedy = e.complete(prompt, GenerationParams(max_tokens=DEPTH + 2, speculative=False)).tokens

    def forced(hist: list[int], choice: Choice) -> list[int]:
        done = len(hist) - len(prompt)
        return (greedy[done:done + choice.k] + [greedy[0]] * choice.k)[:choice.k]

    counts = [Counter() for _ in range(DEPTH)]
    accepted = 0
    for i in range(N):
        seed = i if not speculative else 10_000 + i  # independent draws on the two sides
        params = GenerationParams(**{"max_tokens": DEPTH, "temperature": 1.0, "top_k": 0, "seed": seed, **filters})
        done = e.complete(prompt, params, policy=FixedDraftLength(DEPTH if speculative else 0, DFLASH),
                          draft_override=forced if speculative else None)
        accepted += done.stats.accepted
        for j, t in enumerate(done.tokens[:DEPTH]):
            counts[j][t] += 1
    return counts, accepted


def _homogeneity_p(a: Counter, b: Counter) -> float:
    keys = sorted(set(a) | set(b))
    table = np.array([[a.get(k, 0) for k in keys], [b.get(k, 0) for k in keys]])
    big = table.sum(0) >= 5
    table = np.column_stack([table[:, big], table[:, ~big].sum(1)]) if (~big).any() else table
    table = table[:, table.sum(0) > 0]
    return 1.0 if table.shape[1] < 2 else float(chi2_contingency(table)[1])


FILTERS = [{"top_k": 8}, {"top_p": 0.8}, {"min_p": 0.1}]


@pytest.mark.gemma
@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: next(iter(f)))
def test_sampled_speculation_keeps_the_target_distribution(gemma_engine: Engine, filters: dict) -> None:
    plain, _ = _tokens_at_depth(gemma_engine, filters, speculative=False)
    spec, accepted = _tokens_at_depth(gemma_engine, filters, speculative=True)
    assert accepted >= N  # drafts passed: positions 2..4 were often sampled after accepted drafts
    for j in range(1, DEPTH):
        p = _homogeneity_p(plain[j], spec[j])
        assert p > 1e-3, (filters, j + 1, p, plain[j].most_common(6), spec[j].most_common(6))


@pytest.mark.gemma
def test_the_distribution_test_catches_a_biased_verifier(gemma_engine: Engine,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    plain, _ = _tokens_at_depth(gemma_engine, FILTERS[0], speculative=False)
    monkeypatch.setattr(Engine, "_verify", _accept_any_allowed_draft)
    biased, _ = _tokens_at_depth(gemma_engine, FILTERS[0], speculative=True)
    assert min(_homogeneity_p(plain[j], biased[j]) for j in range(1, DEPTH)) < 1e-6
