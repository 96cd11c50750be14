"""Sampling: the filters and penalties on known logits, and sampled speculative decoding against
plain sampling.

The statistical test forces drafts (the greedy continuation) so that tokens are sampled at
drafted positions after accepted drafts, up to DEPTH drafts deep, and compares the tokens there
with plain sampling under independent seeds (chi-square test of homogeneity). The same test
applied to a deliberately biased verifier (it accepts any draft the filters allow) must fail:
that shows it can. A verify whose penalties ignore the drafts accepted before a position is too
small a shift for it at N=150 (p=0.036 on the run that tried); greedy decoding with penalties is
checked token by token (the lossless check), which does catch that broken verify."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from app.engine.dflash import Engine
from app.engine.draft_policy import DFLASH, Choice, FixedDraftLength
from app.engine.lossless import check_lossless
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
DEPTH = 4  # drafts in the first step: positions 2..DEPTH+1 are sampled after 1..DEPTH accepted drafts


_VERIFY = Engine._verify


def _accept_any_allowed_draft(self: Engine, anchor, drafts, n_past, sampler, st):  # noqa: ANN001, ANN202
    """A broken verifier: a draft the filters allow is accepted without sampling (no rejection)."""
    if sampler.params.greedy:  # greedy runs as before
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
    return emitted, len(emitted) - 1, None


_PICK = TokenSampler.pick


def _penalties_blind_to_drafts(self: TokenSampler, logits, ahead=()):  # noqa: ANN001, ANN202
    """A broken verify: each row's penalties count the tokens emitted before the step, not the drafts
    accepted before it in the step (plain decoding, which has no drafts, is unchanged)."""
    return _PICK(self, logits, ())


def _tokens_at_depth(e: Engine, filters: dict, speculative: bool) -> tuple[list[Counter], int]:
    """The tokens sampled at positions 1..DEPTH+1 over N seeds (speculative: with the greedy
    continuation forced as the drafts, DEPTH of them in the first step), and how many drafts
    were accepted in all."""
    prompt = e.tokenize(PROMPT)
    greedy = e.complete(prompt, GenerationParams(max_tokens=DEPTH + 2, speculative=False, **filters)).tokens

    def forced(hist: list[int], choice: Choice) -> list[int]:
        done = len(hist) - len(prompt)
        return (greedy[done:done + choice.k] + [greedy[0]] * choice.k)[:choice.k]

    counts = [Counter() for _ in range(DEPTH + 1)]
    accepted = 0
    for i in range(N):
        seed = i if not speculative else 10_000 + i  # independent draws on the two sides
        # max_tokens DEPTH + 1 leaves room for DEPTH drafts in the first step (and its own token)
        params = GenerationParams(**{"max_tokens": DEPTH + 1, "temperature": 1.0, "top_k": 0, "seed": seed,
                                     **filters})
        done = e.complete(prompt, params, policy=FixedDraftLength(DEPTH if speculative else 0, DFLASH),
                          draft_override=forced if speculative else None)
        accepted += done.stats.accepted
        for j, t in enumerate(done.tokens[:DEPTH + 1]):
            counts[j][t] += 1
    return counts, accepted


def _homogeneity_p(a: Counter, b: Counter) -> float:
    keys = sorted(set(a) | set(b))
    table = np.array([[a.get(k, 0) for k in keys], [b.get(k, 0) for k in keys]])
    big = table.sum(0) >= 5
    table = np.column_stack([table[:, big], table[:, ~big].sum(1)]) if (~big).any() else table
    table = table[:, table.sum(0) > 0]
    return 1.0 if table.shape[1] < 2 else float(chi2_contingency(table)[1])


PENALTIES = {"top_k": 8, "frequency_penalty": 1.5, "presence_penalty": 0.5, "repeat_penalty": 1.3}
FILTERS = [{"top_k": 8}, {"top_p": 0.8}, {"min_p": 0.1}, PENALTIES]


# top-k, top-p and min-p alone run in `make test-slow` (~25 s each): the penalties' case samples through
# top-k and the penalties together, the hardest of them (the default suite's 10 minutes)
SLOW_FILTERS = ({"top_k": 8}, {"top_p": 0.8}, {"min_p": 0.1})


@pytest.mark.gemma
@pytest.mark.parametrize("filters", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FILTERS else f
                                     for f in FILTERS],
                         ids=lambda f: "penalties" if f is PENALTIES else next(iter(f)))
def test_sampled_speculation_keeps_the_target_distribution(gemma_engine: Engine, filters: dict) -> None:
    plain, _ = _tokens_at_depth(gemma_engine, filters, speculative=False)
    spec, accepted = _tokens_at_depth(gemma_engine, filters, speculative=True)
    assert accepted >= N  # drafts passed: positions 2..DEPTH+1 were often sampled after accepted drafts
    for j in range(1, DEPTH + 1):
        p = _homogeneity_p(plain[j], spec[j])
        assert p > 1e-3, (filters, j + 1, p, plain[j].most_common(6), spec[j].most_common(6))


@pytest.mark.gemma
def test_the_distribution_test_catches_a_biased_verifier(gemma_engine: Engine,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    plain, _ = _tokens_at_depth(gemma_engine, FILTERS[0], speculative=False)
    monkeypatch.setattr(Engine, "_verify", _accept_any_allowed_draft)
    biased, _ = _tokens_at_depth(gemma_engine, FILTERS[0], speculative=True)
    assert min(_homogeneity_p(plain[j], biased[j]) for j in range(1, DEPTH + 1)) < 1e-6


# --- penalties, greedy: the lossless check ---------------------------------------------------

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # repeats itself: the penalties change the reply within a few tokens
GREEDY_PENALTIES = {"frequency_penalty": 0.5, "presence_penalty": 0.3, "repeat_penalty": 1.2}


def _greedy_with_penalties(e: Engine, blind: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int],
                                                                                                   list[int]]:
    """(prompt, plain output, speculative output with the plain output forced as 4-token drafts)."""
    prompt = e.tokenize(COUNTING)
    params = GenerationParams(max_tokens=40, speculative=False, **GREEDY_PENALTIES)
    plain = e.complete(prompt, params).tokens
    if blind:
        monkeypatch.setattr(TokenSampler, "pick", _penalties_blind_to_drafts)

    def forced(hist: list[int], choice: Choice) -> list[int]:
        done = len(hist) - len(prompt)
        return (plain[done:done + choice.k] + [0] * choice.k)[:choice.k]

    spec = e.complete(prompt, GenerationParams(max_tokens=40, **GREEDY_PENALTIES),
                      policy=FixedDraftLength(4, DFLASH), draft_override=forced)
    if not blind:
        assert spec.stats.accepted > 20  # most tokens came from accepted drafts
    return prompt, plain, spec.tokens


@pytest.mark.gemma
def test_greedy_penalties_are_lossless_in_speculative_decoding(gemma_engine: Engine,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    prompt, plain, spec = _greedy_with_penalties(gemma_engine, False, monkeypatch)
    unpenalized = gemma_engine.complete(prompt, GenerationParams(max_tokens=40, speculative=False)).tokens
    assert plain != unpenalized  # the penalties changed the reply
    assert spec == plain
    params = GenerationParams(**GREEDY_PENALTIES)
    rep = check_lossless(gemma_engine, prompt, spec, params=params)
    assert rep.lossless and rep.n_checked == 40, rep.hard_mismatches
    assert not check_lossless(gemma_engine, prompt, spec).lossless  # the check sees the penalties


@pytest.mark.gemma
def test_the_lossless_check_catches_penalties_blind_to_the_drafts(gemma_engine: Engine,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    prompt, plain, spec = _greedy_with_penalties(gemma_engine, True, monkeypatch)
    assert spec != plain
    assert not check_lossless(gemma_engine, prompt, spec, params=GenerationParams(**GREEDY_PENALTIES)).lossless


# --- logprobs and grammars through the one loop -----------------------------------------------


def _run(e: Engine, prompt: list[int], params: GenerationParams, drafts: list[int] | None) -> tuple[list[int], list,
                                                                                                   object]:
    """(tokens, logprobs, stats) of one generation: plain, or with `drafts` forced 4 at a time."""
    def forced(hist: list[int], choice: Choice) -> list[int]:
        done = len(hist) - len(prompt)
        return (drafts[done:done + choice.k] + [drafts[0]] * choice.k)[:choice.k]

    params.speculative = drafts is not None
    events = list(e.generate(prompt, params, policy=FixedDraftLength(4 if drafts is not None else 0, DFLASH),
                             draft_override=forced if drafts is not None else None))
    return [t for ev in events for t in ev.tokens], [lp for ev in events for lp in ev.logprobs or []], events[-1].stats


@pytest.mark.gemma
def test_logprobs_are_the_targets_own_plain_or_speculative(gemma_engine: Engine) -> None:
    e = gemma_engine
    prompt = e.tokenize(COUNTING)
    plain_tokens, plain, _ = _run(e, prompt, GenerationParams(max_tokens=24, logprobs=3), None)
    spec_tokens, spec, st = _run(e, prompt, GenerationParams(max_tokens=24, logprobs=3), plain_tokens)
    assert st.accepted > 12  # most positions were read off a batched verify
    assert plain_tokens == spec_tokens and len(plain) == len(spec) == 24
    for a, b, t in zip(plain, spec, plain_tokens):
        assert a.token == b.token == t and a.logprob == pytest.approx(b.logprob, abs=1e-3)
        assert [i for i, _ in a.top] == [i for i, _ in b.top] and len(a.top) == 3
        assert a.top[0][0] == t and a.top[0][1] == pytest.approx(a.logprob)  # greedy: the most likely
    # they are the log-softmax of the target's row there: one token at a time gives the same
    for i in range(3):
        _, one, _ = _run(e, prompt + plain_tokens[:i], GenerationParams(max_tokens=1, logprobs=0), None)
        assert one[0].logprob == pytest.approx(plain[i].logprob, abs=1e-3) and one[0].top == []


JSON_GBNF = 'root ::= "{" ws "\\"n\\":" ws [0-9] [0-9]? ws "}"\nws ::= " "?'


@pytest.mark.gemma
def test_drafts_that_break_the_grammar_are_not_verified(gemma_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    e = gemma_engine
    prompt = e.tokenize("A JSON object with one number:")
    want, _, _ = _run(e, prompt, GenerationParams(max_tokens=12, grammar=JSON_GBNF), None)
    text = e.detokenize(want)
    assert re.fullmatch(r'\{ ?"n": ?[0-9]{1,2} ?\}', text), text
    good, _, st = _run(e, prompt, GenerationParams(max_tokens=12, grammar=JSON_GBNF), want)
    assert good == want and st.accepted > 0  # drafts the grammar allows are verified as usual
    junk = e.tokenize("Hello there, friend", add_special=False)  # no JSON here
    got, _, st = _run(e, prompt, GenerationParams(max_tokens=12, grammar=JSON_GBNF), junk)
    assert got == want and st.drafted == 0  # refused before the verify: not even counted
    monkeypatch.setattr(TokenSampler, "admissible", lambda self, drafts: drafts)  # broken: no check
    got, _, st = _run(e, prompt, GenerationParams(max_tokens=12, grammar=JSON_GBNF), junk)
    assert got == want and st.drafted > 0


def test_penalties_on_known_logits() -> None:
    logits = np.array([2.0, -1.0, 0.5, 0.0, 1.0], dtype=np.float32)
    p = GenerationParams(repeat_penalty=2.0, frequency_penalty=0.25, presence_penalty=0.5, repeat_last_n=3)
    s = TokenSampler(p, history=[4, 0, 0, 1])  # the window keeps the last 3: 0, 0, 1
    want = np.array([2.0 / 2 - 2 * 0.25 - 0.5, -1.0 * 2 - 0.25 - 0.5, 0.5, 0.0, 1.0])
    assert s.adjusted(logits) == pytest.approx(want)
    # `ahead` counts as emitted: token 2 seen once more, and the window slides past the first 0
    want_ahead = want.copy()
    want_ahead[0] = 2.0 / 2 - 0.25 - 0.5
    want_ahead[2] = 0.5 / 2 - 0.25 - 0.5
    assert s.adjusted(logits, [2]) == pytest.approx(want_ahead)
    s.accept([2])
    assert s.adjusted(logits) == pytest.approx(want_ahead)
    assert TokenSampler(GenerationParams(logit_bias={3: 5.0})).adjusted(logits)[3] == 5.0
    assert TokenSampler(GenerationParams(frequency_penalty=1.0, repeat_last_n=0), [0]).adjusted(logits)[0] == 2.0
