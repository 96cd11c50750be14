"""The DFlash loop on tiny F32 pairs, where batched and single-token numerics
agree: speculative greedy output must be identical to plain decoding."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import Choice
from app.engine.events import FINISH_CANCELLED, FINISH_LENGTH, FINISH_STOP
from app.engine.params import GenerationParams
from app.errors import ContextOverflow

PROMPT = "the cat sat on the mat and then it ran out"


def run(engine: Engine, prompt: list[int], params: GenerationParams, **kw) -> tuple[list[int], object]:
    out: list[int] = []
    ev = None
    for ev in engine.generate(prompt, params, **kw):
        out += ev.tokens
        # the cache invariant: both caches hold exactly positions 0..n_past-1 between steps
        n_past = len(prompt) - 1 + len(out)
        tgt, dft = engine.cache_positions()
        assert tgt == n_past - 1
        if engine.has_drafter:
            assert dft == n_past - 1
    return out, ev


@pytest.mark.parametrize("pair", ["tiny_pair", "tiny_gemma_pair", "tiny_dflash2_pair", "tiny_dspark_pair",
                                  "tiny_lfm2_pair", "tiny_qwen35_pair"])
def test_speculative_greedy_equals_plain(pair: str, request: pytest.FixtureRequest) -> None:
    e = Engine(*request.getfixturevalue(pair), EngineConfig(n_ctx=512))
    prompt = e.tokenize(PROMPT)
    plain, ev_plain = run(e, prompt, GenerationParams(max_tokens=64, speculative=False))
    spec, ev_spec = run(e, prompt, GenerationParams(max_tokens=64))
    assert spec == plain
    assert ev_plain.stats.drafted == 0 and ev_spec.stats.drafted > 0
    assert ev_spec.stats.spec_steps >= ev_spec.stats.steps - 1  # the last step has no room to draft
    e.close()


@pytest.mark.parametrize("pair", ["tiny_pair", "tiny_gemma_pair", "tiny_dflash2_pair", "tiny_dspark_pair",
                                  "tiny_lfm2_pair", "tiny_qwen35_pair"])
def test_forced_partial_drafts_stay_identical(pair: str, request: pytest.FixtureRequest) -> None:
    """Drafts right for a varying prefix, then wrong: multi-token acceptance, rejection and rollback."""
    e = Engine(*request.getfixturevalue(pair), EngineConfig(n_ctx=512))
    prompt = e.tokenize(PROMPT)
    plain, ev_plain = run(e, prompt, GenerationParams(max_tokens=80, speculative=False))
    # a reply that ends with its end-of-generation token: the verify stops at that token's row
    end = len(plain) - 1 if ev_plain.finish_reason == FINISH_STOP else len(plain)
    calls = []

    def forced(hist: list[int], choice: Choice) -> list[int]:
        i, k = len(hist) - len(prompt), choice.k
        good = len(calls) % (k + 1)  # 0..k correct drafts, then a wrong one
        calls.append(min(good, end - i))
        d = plain[i:i + k]
        return d[:good] + [(t + 1) % 64 for t in d[good:]]

    spec, ev = run(e, prompt, GenerationParams(max_tokens=80), draft_override=forced)
    assert spec == plain
    st = ev.stats
    # each step accepted exactly the drafts the schedule made right (the first wrong one stops it);
    # the last step(s), with no room left to draft, verified none
    assert st.accepted_history[:len(calls)] == calls
    assert st.accepted_history[len(calls):] == [0] * (st.steps - len(calls)) and st.steps - len(calls) <= 1
    assert max(st.accepted_history) >= 5 and st.accepted < st.drafted
    assert sum(st.accept_by_pos) == st.accepted
    # tau counts what was emitted: tokens per verify pass
    assert st.n_generated == len(spec) and st.tau == pytest.approx(len(spec) / st.steps)
    e.close()


def test_multi_turn_reuses_both_caches(tiny_engine: Engine) -> None:
    e = tiny_engine
    p1 = e.tokenize("the cat sat on the mat")
    out1, ev1 = run(e, p1, GenerationParams(max_tokens=12))
    assert ev1.stats.n_prompt_reused == 0
    p2 = p1 + out1 + e.tokenize("and then", add_special=False)
    out2, ev2 = run(e, p2, GenerationParams(max_tokens=12))
    # everything up to the last emitted token was already in both caches
    assert ev2.stats.n_prompt_reused == len(p1) + len(out1) - 1
    # and the continuation is what a fresh engine computes
    e.reset()
    fresh, _ = run(e, p2, GenerationParams(max_tokens=12))
    assert fresh == out2


def test_regenerate_trims_caches(tiny_engine: Engine) -> None:
    e = tiny_engine
    p = e.tokenize("the cat sat on the mat")
    a, _ = run(e, p, GenerationParams(max_tokens=20))
    b, ev = run(e, p, GenerationParams(max_tokens=20))  # same prompt again: caches trimmed back
    assert a == b
    assert ev.stats.n_prompt_reused == len(p) - 1


def test_max_tokens_stop_strings_and_eog(tiny_engine: Engine) -> None:
    e = tiny_engine
    p = e.tokenize(PROMPT)
    out, ev = run(e, p, GenerationParams(max_tokens=7))
    assert len(out) == 7 and ev.finish_reason == FINISH_LENGTH
    full_text = "".join(x.text for x in e.generate(p, GenerationParams(max_tokens=40)))
    stop = full_text[5:8]
    assert stop
    evs = list(e.generate(p, GenerationParams(max_tokens=40, stop=[stop])))
    assert "".join(x.text for x in evs) == full_text[:full_text.index(stop)]
    assert evs[-1].finish_reason == FINISH_STOP and evs[-1].stats.n_generated < 40


def test_cancel_between_steps(tiny_engine: Engine) -> None:
    cancel = threading.Event()
    p = tiny_engine.tokenize(PROMPT)
    events = []
    for ev in tiny_engine.generate(p, GenerationParams(max_tokens=200), cancel=cancel):
        events.append(ev)
        if len(events) == 3:
            cancel.set()
    n = len(events)
    assert events[-1].finish_reason == FINISH_CANCELLED and events[-1].tokens == []
    assert n == 4  # three steps, then the cancelled final event
    got = [t for ev in events for t in ev.tokens]
    assert got and events[-1].stats.n_generated == len(got)
    # the caches stay at what was emitted: the next turn reuses them and continues as a fresh
    # engine does from the same tokens
    p2 = p + got
    out, ev = run(tiny_engine, p2, GenerationParams(max_tokens=12))
    assert ev.stats.n_prompt_reused == len(p2) - 1
    tiny_engine.reset()
    fresh, _ = run(tiny_engine, p2, GenerationParams(max_tokens=12))
    assert out == fresh and len(out) == 12


def test_context_overflow_is_a_clear_error(tiny_pair: tuple[Path, Path]) -> None:
    e = Engine(*tiny_pair, EngineConfig(n_ctx=256))
    n_ctx = e.n_ctx  # llama.cpp may round the requested size up
    p = e.tokenize(PROMPT)
    with pytest.raises(ContextOverflow, match=f"context holds {n_ctx} tokens"):
        list(e.generate(p, GenerationParams(max_tokens=n_ctx - len(p) + 1)))
    out, _ = run(e, p, GenerationParams(max_tokens=n_ctx - len(p)))  # exactly fits
    assert len(out) == n_ctx - len(p)
    e.close()


def test_sampling_is_seeded_and_identical_on_tiny_pair(tiny_engine: Engine) -> None:
    p = tiny_engine.tokenize(PROMPT)
    params = dict(max_tokens=40, temperature=0.9, top_k=20, top_p=0.95, seed=11)
    a, _ = run(tiny_engine, p, GenerationParams(**params, speculative=False))
    b, _ = run(tiny_engine, p, GenerationParams(**params))
    c, _ = run(tiny_engine, p, GenerationParams(**{**params, "seed": 12}))
    assert a == b  # same seed, same distribution, batch-invariant numerics: same text
    assert a != c


def test_end_of_generation_ends_the_reply_even_mid_draft(tiny_engine: Engine) -> None:
    """A sampled reply that reaches </s>: plain decoding stops there (STOP, </s> the last token,
    nothing of it in the text), and speculation with drafts that run on past </s> (the right
    tokens, then </s>, then more) emits exactly the same tokens and stops at the same place."""
    e = tiny_engine
    eos = 2
    assert e.target.is_eog(eos)
    p = e.tokenize(PROMPT)
    # a near-uniform sampler over the 64-token vocabulary meets </s> within a few dozen tokens;
    # the first seed that does (deterministic: the same seed gives the same text)
    base = dict(max_tokens=120, temperature=4.0, top_k=0)
    for seed in range(40):
        plain, ev = run(e, p, GenerationParams(**base, seed=seed, speculative=False))
        if eos in plain:
            break
    assert eos in plain, "no seed reached </s>"
    assert plain.index(eos) == len(plain) - 1 < 119 and ev.finish_reason == FINISH_STOP
    assert "</s>" not in "".join(x.text for x in e.generate(p, GenerationParams(**base, seed=seed,
                                                                                speculative=False)))

    def past_eos(hist: list[int], choice: Choice) -> list[int]:
        i = len(hist) - len(p)
        return (plain[i:] + [5, 6, 7] * choice.k)[:choice.k]

    spec, ev = run(e, p, GenerationParams(**base, seed=seed, draft_max=6), draft_override=past_eos)
    assert spec == plain and ev.finish_reason == FINISH_STOP
    assert ev.tokens[-1] == eos and ev.stats.accepted > 0


def test_plain_steps_feed_the_drafter_nothing_until_it_drafts(tiny_pair: tuple[Path, Path]) -> None:
    """Features emitted by plain (and lookup) steps wait for the next DFlash step instead of being
    fed a ubatch at a time: a plain reply longer than a ubatch makes no drafter call, and the next
    speculative turn, which feeds them first, still equals plain decoding."""
    e = Engine(*tiny_pair, EngineConfig(n_ctx=1024))
    try:
        prompt = e.tokenize(PROMPT)
        c = e.complete(prompt, GenerationParams(max_tokens=400, speculative=False))
        assert len(c.tokens) > 256  # more rows than one injection call (a ubatch) holds
        assert c.stats.t_inject_s == 0.0
        assert e.pending_rows == len(prompt) - 1 + len(c.tokens)
        follow = prompt + c.tokens + e.tokenize(" and the dog", add_special=False)
        spec, _ = run(e, follow, GenerationParams(max_tokens=48))  # checks both caches every step
        fresh = Engine(*tiny_pair, EngineConfig(n_ctx=1024))
        try:
            plain, _ = run(fresh, follow, GenerationParams(max_tokens=48, speculative=False))
        finally:
            fresh.close()
        assert spec == plain
    finally:
        e.close()


def test_the_policy_is_told_which_step_starts_the_reply_and_what_waits(tiny_engine: Engine) -> None:
    from app.engine.draft_policy import PLAIN_STEP, StepInfo

    class Recorder:
        uses_confidence = False

        def __init__(self) -> None:
            self.first: list[bool] = []
            self.pending: list[int] = []

        def choose(self, step: StepInfo) -> Choice:
            self.first.append(step.first)
            self.pending.append(step.pending_rows)
            return PLAIN_STEP

        def truncate(self, conf: object) -> int:
            return 0

        def observe(self, choice: Choice, accepted: int, timing: object) -> None:
            pass

    rec = Recorder()
    c = tiny_engine.complete(tiny_engine.tokenize(PROMPT), GenerationParams(max_tokens=6), policy=rec)
    # the last step has no room left to draft: the policy is not asked
    assert len(c.tokens) == 6 and rec.first == [True] + [False] * 4
    # a speculative reply reads the whole prompt into the drafter before its first step; the plain
    # steps' features then wait (one row each)
    assert rec.pending == [0, 1, 2, 3, 4]


def test_a_generation_abandoned_after_its_engine_closed_is_finalized_safely(tiny_pair: tuple[Path, Path]) -> None:
    """An unfinished generator that outlives its engine (a failed test, a dropped reply) is closed
    later by the GC: its cleanup resets caches that are gone, which must do nothing (it segfaulted
    the test process in llama_memory_clear)."""
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    g = e.generate(e.tokenize(PROMPT), GenerationParams(max_tokens=20))
    next(g)
    e.close()
    g.close()  # GeneratorExit inside the loop: its reset() meets closed contexts
