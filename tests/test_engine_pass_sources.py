"""The draft sources fed the target's own states that draft a pass per token: the target's MTP head
(app.engine.sources.MtpSource, on the tiny Qwen3.5 target carrying one head, `synth --mtp 1`) and an
EAGLE-3 drafter (Eagle3Source, a random one for the tiny qwen3 target, gguf_tools.synth.write_eagle3):
lossless at every draft length and in the hybrid, right through forced partial acceptance and
rollback, across turns that reuse the cache; each source's cache and state follow the verified
history at every step. (Their drafts equal llama.cpp's draft-mtp and draft-eagle3:
tests/test_drafts_equal_llama.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.controller import policy_for_mode
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import EAGLE3, MTP, Choice, FixedDraftLength
from app.engine.events import FINISH_STOP
from app.engine.params import GenerationParams
from app.session.draft_sources import draft_source_lines
from app.session.models import ModelSpec

PROMPT = "the cat sat on the mat and then it ran out"


def open_engine(source: str, request: pytest.FixtureRequest, **cfg) -> Engine:  # noqa: ANN003
    if source == MTP:
        return Engine(request.getfixturevalue("tiny_mtp_target"), None, EngineConfig(n_ctx=512, **cfg))
    return Engine(*request.getfixturevalue("tiny_eagle3_pair"), EngineConfig(n_ctx=512, **cfg))


@pytest.fixture(params=[MTP, EAGLE3])
def engine(request: pytest.FixtureRequest):  # noqa: ANN201
    e = open_engine(request.param, request)
    e.source_under_test = request.param
    yield e
    e.close()


def run(e: Engine, prompt: list[int], params: GenerationParams, **kw) -> tuple[list[int], object]:  # noqa: ANN003
    out: list[int] = []
    ev = None
    src = e.sources[e.source_under_test]
    for ev in e.generate(prompt, params, **kw):
        out += ev.tokens
        n_past = len(prompt) - 1 + len(out)
        # between steps the target holds positions 0..n_past-1; the source has read the target's states
        # for each of them, and its cache holds no position past them (no draft row stays)
        assert e.ctx.pos_max() == n_past - 1
        assert src._end == n_past
        assert src.ctx.pos_max() <= n_past - 1
    return out, ev


def test_each_loads_as_a_source_and_the_panel_says_so(request: pytest.FixtureRequest, tiny_mtp_target: Path,
                                                      tiny_eagle3_pair: tuple[Path, Path]) -> None:
    e = open_engine(MTP, request)
    try:
        assert list(e.sources) == ["lookup", MTP] and e.mtp_unused is None
        assert e.target.n_mtp_heads == 1
        assert draft_source_lines(e, ModelSpec(str(tiny_mtp_target)))[0] == (
            "the target's own MTP head in use: no second file, fed the target's last hidden state "
            "(up to 8 drafts a step, one pass of the head each)")
    finally:
        e.close()
    e = open_engine(EAGLE3, request)
    try:
        assert list(e.sources) == ["lookup", EAGLE3] and not e.has_drafter  # (no DFlash graph)
        assert draft_source_lines(e, ModelSpec(*map(str, tiny_eagle3_pair)))[0] == (
            "EAGLE-3 drafter tiny-eagle3.gguf in use: fed 3 of the target's hidden states (layers [1, 2, 3]), "
            "up to 8 drafts a step, one pass each")
    finally:
        e.close()


def test_mtp_turned_off_the_trunk_decodes_alone_and_says_why(tiny_mtp_target: Path) -> None:
    e = Engine(tiny_mtp_target, None, EngineConfig(n_ctx=512, mtp=False))
    try:
        assert MTP not in e.sources and e.target.n_mtp_heads == 0
        assert draft_source_lines(e, ModelSpec(str(tiny_mtp_target)))[0] == (
            "the target carries MTP heads (qwen35 with 1 MTP (nextn) head (blk.*.nextn.eh_proj)): not used: "
            "turned off for this load")
    finally:
        e.close()


@pytest.mark.parametrize("mode,k", [("alone", 1), ("alone", 3), ("alone", 8), ("alone", None), ("hybrid", None)])
def test_drafts_are_lossless(engine: Engine, mode: str, k: int | None) -> None:
    name = engine.source_under_test
    prompt = engine.tokenize(PROMPT)
    plain, _ = run(engine, prompt, GenerationParams(max_tokens=64, speculative=False))
    policy = policy_for_mode(engine, name if mode == "alone" else mode, k)
    spec, ev = run(engine, prompt, GenerationParams(max_tokens=64), policy=policy)
    assert spec == plain
    st = ev.stats
    if mode == "alone":
        assert set(st.source_history) <= {name, "plain"}
    if k is not None:
        assert st.drafted_by_source.get(name, 0) > 0
    if k is not None:  # a fixed length drafts every step with room
        assert st.spec_steps >= st.steps - 1


def test_forced_partial_drafts_stay_identical(engine: Engine) -> None:
    """Drafts right for a varying prefix, then wrong, every step from the source: its state and cache
    follow what the target accepted (checked at every step by run())."""
    prompt = engine.tokenize(PROMPT)
    plain, ev_plain = run(engine, prompt, GenerationParams(max_tokens=80, speculative=False))
    end = len(plain) - 1 if ev_plain.finish_reason == FINISH_STOP else len(plain)
    calls = []

    def forced(hist: list[int], choice: Choice) -> list[int]:
        i, k = len(hist) - len(prompt), choice.k
        good = len(calls) % (k + 1)
        calls.append(min(good, end - i))
        d = plain[i:i + k]
        return d[:good] + [(t + 1) % 64 for t in d[good:]]

    spec, ev = run(engine, prompt, GenerationParams(max_tokens=80),
                   policy=FixedDraftLength(6, engine.source_under_test),
                   draft_override=forced)
    assert spec == plain
    st = ev.stats
    assert st.accepted_history[:len(calls)] == calls
    assert max(st.accepted_history) >= 5 and st.accepted < st.drafted


def test_turns_that_reuse_the_cache(engine: Engine, request: pytest.FixtureRequest) -> None:
    """A second turn extends the first (the cache reused), a third edits it (cut back; the recurrent
    MTP target cannot roll back that far, so there both caches start again): each reply is the plain
    reply of a fresh engine, and the source's bookkeeping holds at every step."""
    name = engine.source_under_test
    first = engine.tokenize(PROMPT)
    reply, _ = run(engine, first, GenerationParams(max_tokens=24), policy=policy_for_mode(engine, name, 3))
    second = first + reply + engine.tokenize(" and the dog", add_special=False)
    third = first[:-2] + engine.tokenize(" a bird", add_special=False)
    fresh = open_engine(name, request)
    try:
        for prompt, reused in ((second, len(first) + len(reply) - 1), (third, 0 if name == MTP else len(first) - 2)):
            want = fresh.complete(prompt, GenerationParams(max_tokens=24, speculative=False)).tokens
            fresh.reset()
            got, ev = run(engine, prompt, GenerationParams(max_tokens=24), policy=policy_for_mode(engine, name, 3))
            assert got == want
            assert ev.stats.n_prompt_reused == reused if reused == 0 else ev.stats.n_prompt_reused >= reused
    finally:
        fresh.close()
