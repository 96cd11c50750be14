"""The draft controller: plain decoding when drafts never pass, long drafts when they always do,
the source that is right when only one is, deterministic, and never lossy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from app.engine.acceptance import expected_tokens
from app.engine.calibration import CostModel, calibrate
from app.engine.controller import DraftController, new_controller
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import DFLASH, LOOKUP, PLAIN, Choice, FixedDraftLength, StepInfo, StepTiming
from app.engine.lookup import AGREED, MIXED, LookupMatch
from app.engine.params import GenerationParams

# the CPU cost curve of Gemma 3 270M before the small-batch kernels: verify of n tokens relative to n = 1
CPU_CURVE = [1.0, 1.37, 1.7, 2.0, 2.4, 2.8, 3.2, 3.7, 3.9, 4.1, 4.3, 4.5, 4.7, 4.8, 5.0, 5.1]
DFLASH_ONLY = StepInfo(lookup=None, has_drafter=True, pending_rows=1)


def cpu_costs(draft_ms: float = 5.0) -> CostModel:
    return CostModel(verify_s=[0.0] + [0.021 * r for r in CPU_CURVE], draft_s=[0.0] + [draft_ms / 1e3] * 15,
                     inject_call_s=0.0003, inject_row_s=0.00002, switch_s=0.001)


def gpu_like_costs() -> CostModel:
    """Drafting cheap relative to verification, as on a GPU."""
    return CostModel(verify_s=[0.0] + [0.01 * (1 + 0.05 * n) for n in range(16)], draft_s=[0.0] + [0.002] * 15,
                     inject_row_s=0.0001)


def dflash_controller(cost: CostModel, **kw) -> DraftController:  # noqa: ANN003
    return DraftController(cost, (DFLASH,), refresh_costs=False, **kw)


def replay(policy: DraftController, accept: Callable[[Choice], int], steps: int,
           step: StepInfo = DFLASH_ONLY) -> list[Choice]:
    out = []
    for _ in range(steps):
        c = policy.choose(step)
        out.append(c)
        policy.observe(c, accept(c), StepTiming())
    return out


def ks(choices: list[Choice]) -> list[int]:
    return [c.k for c in choices]


def best(policy: DraftController, step: StepInfo = DFLASH_ONLY) -> Choice:
    return max(policy.candidates(step), key=lambda x: x[0])[2]


def test_choose_is_the_best_candidate_whose_cautious_rate_beats_plain() -> None:
    """choose() works per source on arrays (its host time is a share of a GPU step); it must pick
    what the rule says over the candidates one by one: the best mean rate among those whose cautious
    rate beats plain decoding, ties to the earlier candidate, else plain (probes off here)."""
    rng = np.random.default_rng(3)
    chosen = set()
    for _ in range(300):
        c = cpu_costs()
        c.verify_s = [0.0, *np.sort(rng.uniform(0.01, 0.04, 16))]
        c.draft_s = [0.0, *rng.uniform(0.0005, 0.01, 15)]
        p = DraftController(c, refresh_costs=False, probe_every=10**9)
        dflash = [m for pair in p.dflash_by_context for m in dict.fromkeys(pair)]
        for m in dict.fromkeys([*dflash, *p._text_models()]):
            m.tried[:] = rng.uniform(0, 10, m.k_max)
            m.acc[:] = m.tried * rng.uniform(0, 1, m.k_max) ** 0.3
        p._lookup_passed, p._lookup_expected = rng.uniform(0, 5), rng.uniform(0, 5)
        match = (LookupMatch(int(rng.integers(1, 7)), tuple(range(int(rng.integers(1, 16)))),
                             int(rng.integers(0, 3))) if rng.random() < 0.7 else None)
        step = StepInfo(lookup=match, has_drafter=bool(rng.random() < 0.8), pending_rows=int(rng.integers(0, 2)),
                        n_past=int(rng.integers(100, 3000)))
        cands = p.candidates(step)
        sure = []
        for i, (_, t, ch) in enumerate(cands[1:], 1):
            model = p._dflash_model(step) if ch.source == DFLASH else p._lookup_model(step)
            trust = p.lookup_trust if ch.source == LOOKUP else 1.0
            if model.expected_cautious(p.caution, trust)[ch.k] / t > cands[0][0]:
                sure.append(i)
        want = cands[max(sure, key=lambda i: (cands[i][0], -i), default=0)][2]
        got = p.choose(step)
        assert got == want
        chosen.add(got.source)
    assert chosen == {PLAIN, LOOKUP, DFLASH}  # every branch was taken


def test_picks_plain_decoding_when_drafts_never_pass() -> None:
    k = ks(replay(dflash_controller(cpu_costs()), lambda c: 0, 200))
    assert k[-100:].count(0) >= 95  # plain decoding, with rare probes
    assert any(x > 0 for x in k[50:])  # still probing now and then


def test_probes_back_off_while_partial_acceptance_does_not_pay() -> None:
    """Probes that accept a token half the time still leave plain decoding the best choice on the
    old CPU curve: they must grow rarer, not reset to every few steps on each acceptance."""
    p = dflash_controller(cpu_costs())
    probes = iter(range(10**6))
    k = ks(replay(p, lambda c: min(c.k, next(probes) % 2) if c.k else 0, 400))
    assert best(p).k == 0
    assert sum(x > 0 for x in k[-200:]) <= 5  # gap grown to probe_max_gap (64)


def test_picks_a_long_draft_when_drafts_always_pass() -> None:
    k = ks(replay(dflash_controller(cpu_costs()), lambda c: c.k, 200))
    assert min(k[-50:]) >= 10


def test_resumes_drafting_when_text_becomes_predictable() -> None:
    p = dflash_controller(cpu_costs())
    replay(p, lambda c: 0, 150)
    assert best(p).k == 0
    k = ks(replay(p, lambda c: c.k, 150))
    assert min(k[-30:]) >= 8


def test_choice_is_deterministic_given_the_same_measurements() -> None:
    rng = np.random.default_rng(0)
    outcomes = rng.integers(0, 16, size=300)
    matches = rng.integers(0, 7, size=300)
    runs = []
    for _ in range(2):
        p = DraftController(cpu_costs())  # costs refreshed from the (same) timings
        out = []
        for o, n in zip(outcomes.tolist(), matches.tolist()):
            step = StepInfo(lookup=LookupMatch(n, (1,) * 8) if n else None, has_drafter=True, pending_rows=1)
            c = p.choose(step)
            out.append(c)
            # the lookup right after long matches, DFlash now and then
            acc = c.k if c.source == LOOKUP and n >= 4 else min(c.k, o % 3)
            p.observe(c, acc, StepTiming(draft_s=0.004, verify_s=0.03, inject_s=0.0003, step_s=0.035))
        runs.append(out)
    assert runs[0] == runs[1]
    assert {c.source for c in runs[0]} == {PLAIN, LOOKUP, DFLASH}


def test_rates_follow_the_cost_model() -> None:
    """candidates() is vectorised; each rate must equal E(k) / step time, with the cost curve read as
    non-decreasing, the drafter pass and injection call for DFlash only, the rebuild for a new size."""
    assert expected_tokens(np.array([0.5, 0.5]), 2) == pytest.approx(1.75)
    rng = np.random.default_rng(1)
    for _ in range(50):
        c = cpu_costs()
        c.verify_s = [0.0, *rng.uniform(0.01, 0.1, 16)]
        c.draft_s = [0.0, *rng.uniform(0.001, 0.02, 15)]
        p = DraftController(c, refresh_costs=False)
        p.dflash.acc[:] = rng.uniform(0, 5, p.dflash.k_max)
        p.dflash.tried[:] = p.dflash.acc + rng.uniform(0, 5, p.dflash.k_max)
        n = int(rng.integers(1, 7))
        step = StepInfo(lookup=LookupMatch(n, tuple(range(int(rng.integers(1, 16))))), has_drafter=True,
                        pending_rows=int(rng.integers(0, 3)))
        for rate, t, ch in p.candidates(step):
            model = p.dflash if ch.source == DFLASH else p.lookup[step.lookup.agreement][n]
            e = expected_tokens(model.p, ch.k)
            want = max(c.verify_s[1:ch.k + 2]) + c.inject_row_s * e + (c.switch_s if ch.k + 1 != 1 else 0.0)
            if ch.source == DFLASH:
                want += max(c.draft_s[1:ch.k + 1]) + (c.inject_call_s if step.pending_rows else 0.0)
            assert t == pytest.approx(want, rel=1e-12) and rate == pytest.approx(e / want, rel=1e-12)


@pytest.mark.parametrize("right, wrong", [
    (LookupMatch(4, (1,) * 8), LookupMatch(1, (1,) * 8)),  # per match length
    (LookupMatch(2, (1,) * 8, AGREED), LookupMatch(2, (1,) * 8, MIXED)),  # per agreement, same length
])
def test_lookup_acceptance_is_learned_apart_per_match(right: LookupMatch, wrong: LookupMatch) -> None:
    """Acceptance is tracked per match length and agreement: drafts right after 4-token matches (or
    n-grams always followed by the same token) and wrong after 1-token ones (or n-grams followed
    by different tokens) are drafted only at the former. (The estimates' learning, without the
    caution gate: steps interleaved two by two put every probe on the same kind of match.)"""
    p = DraftController(cpu_costs(), (LOOKUP,), refresh_costs=False, caution=0.0)
    good, bad = StepInfo(right, False), StepInfo(wrong, False)
    for _ in range(100):
        for step, passes in ((good, True), (bad, False)):
            c = p.choose(step)
            p.observe(c, c.k if passes else 0, StepTiming())
    assert best(p, good).source == LOOKUP and best(p, good).k >= 4
    assert best(p, bad) == Choice(PLAIN, 0)


def test_dflash_acceptance_is_learned_apart_where_the_lookup_has_nothing() -> None:
    """A drafter right where the text repeats (the lookup has a match, but a wrong one) and wrong
    where it has none is drafted from at the matches only; plain decoding elsewhere. (The estimates,
    ungated: interleaved steps put every probe on the same kind of step.)"""
    p = DraftController(cpu_costs(draft_ms=1.0), refresh_costs=False, caution=0.0)
    matched = StepInfo(LookupMatch(1, (1,) * 8), has_drafter=True)
    unmatched = StepInfo(None, has_drafter=True)
    for _ in range(100):
        for step, dflash_right in ((matched, True), (unmatched, False)):
            c = p.choose(step)
            p.observe(c, c.k if c.source == DFLASH and dflash_right else 0, StepTiming())
    assert best(p, matched).source == DFLASH
    assert best(p, unmatched) == Choice(PLAIN, 0)


@pytest.mark.parametrize("right", [LOOKUP, DFLASH])
def test_picks_the_source_that_is_right(right: str) -> None:
    p = DraftController(cpu_costs(draft_ms=1.0), refresh_costs=False)
    step = StepInfo(LookupMatch(3, (1,) * 15), has_drafter=True, pending_rows=1)
    choices = replay(p, lambda c: c.k if c.source == right else 0, 150, step)
    assert [c.source for c in choices[-50:]].count(right) >= 48


def test_confidence_truncation_learns_where_drafts_fail() -> None:
    p = dflash_controller(cpu_costs(), use_confidence=True)
    conf = np.array([0.99, 0.97, 0.95, 0.3, 0.2, 0.1, 0.05])
    for _ in range(60):  # confident drafts pass, unsure ones fail
        k = p.truncate(conf)
        p.observe(Choice(DFLASH, k), min(k, 3), StepTiming())
    assert p.truncate(conf) == 3
    assert p.truncate(np.array([0.99] * 7)) >= 5  # sure drafts are kept as far as the CPU cost curve pays
    assert p.truncate(np.array([0.05] * 7)) == 0


def _generate(e: Engine, prompt: list[int], params: GenerationParams, **kw) -> tuple[list[int], object]:
    out, ev = [], None
    for ev in e.generate(prompt, params, **kw):
        out += ev.tokens
    return out, ev


def _forced(prompt: list[int], plain: list[int], right: tuple[str, ...]) -> Callable:
    """Drafts that follow the plain output for the sources in `right` and miss it for the others."""
    def forced(hist: list[int], choice: Choice) -> list[int]:
        i = len(hist) - len(prompt)
        d = plain[i:i + choice.k]
        return d if choice.source in right else [(t + 1) % 64 for t in d]
    return forced


@pytest.mark.parametrize("right", [(DFLASH,), ()])
def test_forced_drafts_on_the_tiny_pair(tiny_pair: tuple[Path, Path], right: tuple[str, ...]) -> None:
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    prompt = e.tokenize("the cat sat on the mat")
    plain, _ = _generate(e, prompt, GenerationParams(max_tokens=150, speculative=False))
    policy = dflash_controller(gpu_like_costs())
    out, ev = _generate(e, prompt, GenerationParams(max_tokens=150), policy=policy,
                        draft_override=_forced(prompt, plain, right))
    assert out == plain  # identical whatever k is chosen
    k = ev.stats.k_history
    if right:
        assert np.mean(k[-10:]) >= e.block_size - 2
    else:
        assert k[-40:].count(0) >= 34
    e.close()


@pytest.mark.parametrize("right", [LOOKUP, DFLASH])
def test_hybrid_picks_the_right_source_in_the_loop(tiny_pair: tuple[Path, Path], right: str) -> None:
    """The hybrid controller in the real loop, drafts forced: identical to plain decoding, and the
    steps draft from the source that is right (the lookup offers a draft at every step here: the
    tiny model's 64-token vocabulary repeats)."""
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    prompt = e.tokenize("the cat sat on the mat")
    plain, _ = _generate(e, prompt, GenerationParams(max_tokens=200, speculative=False))
    policy = DraftController(gpu_like_costs(), dflash_k_max=e.block_size - 1, refresh_costs=False)
    out, ev = _generate(e, prompt, GenerationParams(max_tokens=200), policy=policy,
                        draft_override=_forced(prompt, plain, (right,)))
    assert out == plain
    st = ev.stats
    late = st.source_history[len(st.source_history) // 2:]
    assert late.count(right) >= 0.8 * len(late), late
    assert st.accepted_by_source[right] > 0 and st.accepted_by_source[{LOOKUP: DFLASH, DFLASH: LOOKUP}[right]] == 0
    e.close()


@pytest.mark.parametrize("controlled", [False, True])
def test_speculation_without_a_drafter_is_identical(tiny_pair: tuple[Path, Path], controlled: bool) -> None:
    """Any target speculates: with no drafter, the lookup (fixed, or under the controller) drafts from
    the context, and the output is plain decoding's. (The tiny model's own costs would keep the
    controller on plain decoding: a graph rebuild costs it 3-4 single-token steps.)"""
    e = Engine(tiny_pair[0], None, EngineConfig(n_ctx=512))
    prompt = e.tokenize("the cat sat on the mat the cat sat on the mat the cat")
    plain, _ = _generate(e, prompt, GenerationParams(max_tokens=120, speculative=False))
    policy = (DraftController(gpu_like_costs(), (LOOKUP,), refresh_costs=False) if controlled
              else FixedDraftLength(4, LOOKUP))
    out, ev = _generate(e, prompt, GenerationParams(max_tokens=120), policy=policy)
    assert out == plain
    st = ev.stats
    assert st.drafted_by_source["lookup"] > 0 and st.drafted_by_source["dflash"] == 0
    assert st.accepted_by_source["lookup"] > 0
    e.close()


def test_calibration_is_cached(tiny_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.engine.calibration as calibration

    monkeypatch.setattr(calibration, "cache_dir", lambda: tmp_path / "flashdesk" / "calibration")
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    a = calibrate(e)
    assert len(a.verify_s) == e.block_size + 1 and all(v > 0 for v in a.verify_s[1:])  # n = 1..block
    assert all(d > 0 for d in a.draft_s[1:])
    assert a.plain_tokens_per_s > 0 and a.inject_row_s >= 0 and a.switch_s >= 0
    files = list((tmp_path / "flashdesk" / "calibration").glob("*.json"))
    assert len(files) == 1
    b = calibrate(e)
    assert b.verify_s == a.verify_s  # read back, not measured again
    pol = new_controller(e)
    assert pol.dflash_k_max == e.block_size - 1 and pol.sources == (LOOKUP, DFLASH)
    assert pol.cost.verify_s == a.verify_s and pol.cost is not a  # its own copy: refreshing it changes no cache
    e.close()


def test_engine_calls_truncate_with_drafter_confidence(tiny_pair: tuple[Path, Path]) -> None:
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    prompt = e.tokenize("the cat sat on the mat")
    plain, _ = _generate(e, prompt, GenerationParams(max_tokens=40, speculative=False))
    seen: list[np.ndarray] = []

    class Recorder(DraftController):
        def truncate(self, conf: np.ndarray) -> int:
            seen.append(conf)
            return min(2, len(conf))

    pol = Recorder(cpu_costs(draft_ms=0.1), (DFLASH,), use_confidence=True, refresh_costs=False)
    pol.dflash.prior = 0.99
    out, ev = _generate(e, prompt, GenerationParams(max_tokens=40), policy=pol)
    assert out == plain
    assert seen and all(((c > 0) & (c <= 1)).all() for c in seen)
    assert max(ev.stats.k_history) <= 2
    e.close()


def test_drafts_that_end_the_reply_learn_their_acceptance_apart() -> None:
    """A one-token mixed match that fails stops being drafted; the same match ending the reply at its
    stop string (where replies keep ending) goes on drafting the whole marker."""
    cost = CostModel(verify_s=[0.0] + [0.010 * (1 + 0.08 * n) for n in range(16)], draft_s=[0.0] * 16)
    policy = DraftController(cost, (LOOKUP,), refresh_costs=False, caution=0.0)  # the estimates, ungated
    mixed = StepInfo(LookupMatch(1, (1, 2, 3), MIXED), has_drafter=False)
    ending = StepInfo(LookupMatch(1, (1, 2, 3), MIXED, ends_reply=True), has_drafter=False)
    for _ in range(20):
        replay(policy, lambda c: 0, 1, mixed)
        replay(policy, lambda c: c.k, 1, ending)
    assert best(policy, mixed).k == 0
    assert best(policy, ending) == Choice(LOOKUP, 3)


def test_a_replys_first_step_learns_its_lookup_apart() -> None:
    """A lookup at a reply's first step proposes how an earlier turn began (the anchor is the turn
    marker): when those fail, the controller stops drafting there, and keeps drafting lookups
    of the same match length later in the reply, where they pass."""
    cost = CostModel(verify_s=[0.0] + [0.010 * (1 + 0.08 * n) for n in range(16)], draft_s=[0.0] * 16)
    policy = DraftController(cost, (LOOKUP,), refresh_costs=False, caution=0.0)  # the estimates, ungated
    match = LookupMatch(4, (1, 2, 3, 4, 5, 6, 7))
    first = StepInfo(lookup=match, has_drafter=False, first=True)
    later = StepInfo(lookup=match, has_drafter=False)
    firsts = []
    for _ in range(30):  # 30 replies: a first step that fails, then 10 steps whose lookups pass
        c = policy.choose(first)
        firsts.append(c)
        policy.observe(c, 0, StepTiming())
        replay(policy, lambda c: c.k, 10, later)
    assert firsts[0].source == LOOKUP  # the prior lets it try
    assert all(c.k == 0 for c in firsts[-10:])  # learned: plain at the first step (probes aside)
    assert best(policy, later).source == LOOKUP and best(policy, later).k >= 3
