"""The target's own MTP head as a draft source (app.engine.sources.MtpSource), on the tiny Qwen3.5
target carrying one head (gguf_tools synth, `--mtp 1`): lossless at every draft length and in the
hybrid, right through forced partial acceptance and rollback, across turns that reuse the cache;
the head's cache and state follow the verified history at every step. (Its drafts equal llama.cpp's
draft-mtp: tests/test_drafts_equal_llama.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.controller import policy_for_mode
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import MTP, Choice, FixedDraftLength
from app.engine.events import FINISH_STOP
from app.engine.params import GenerationParams
from app.session.draft_sources import draft_source_lines
from app.session.models import ModelSpec
from gguf_tools.synth import write_tiny_target

PROMPT = "the cat sat on the mat and then it ran out"


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_target(tmp_path_factory.mktemp("mtp") / "tiny-qwen35-mtp.gguf", "qwen35", mtp_layers=1)


@pytest.fixture
def engine(mtp_target: Path):  # noqa: ANN201
    e = Engine(mtp_target, None, EngineConfig(n_ctx=512))
    yield e
    e.close()


def run(e: Engine, prompt: list[int], params: GenerationParams, **kw) -> tuple[list[int], object]:  # noqa: ANN003
    out: list[int] = []
    ev = None
    mtp = e.sources[MTP]
    for ev in e.generate(prompt, params, **kw):
        out += ev.tokens
        n_past = len(prompt) - 1 + len(out)
        # between steps the target holds positions 0..n_past-1; the head has read the target's state
        # for each of them, and its cache holds no position past them (no draft row stays)
        assert e.ctx.pos_max() == n_past - 1
        assert mtp._end == n_past
        assert mtp.ctx.pos_max() <= n_past - 1
    return out, ev


def test_the_head_loads_as_a_source_and_the_panel_says_so(engine: Engine, mtp_target: Path) -> None:
    assert list(engine.sources) == ["lookup", MTP] and engine.mtp_unused is None
    assert engine.target.n_mtp_heads == 1
    assert draft_source_lines(engine, ModelSpec(str(mtp_target)))[0] == (
        "the target's own MTP head in use: no second file, fed the target's last hidden state "
        "(up to 8 drafts a step, one pass of the head each)")


def test_turned_off_the_trunk_decodes_alone_and_says_why(mtp_target: Path) -> None:
    e = Engine(mtp_target, None, EngineConfig(n_ctx=512, mtp=False))
    try:
        assert MTP not in e.sources and e.target.n_mtp_heads == 0
        assert draft_source_lines(e, ModelSpec(str(mtp_target)))[0] == (
            "the target carries MTP heads (qwen35 with 1 MTP (nextn) head (blk.*.nextn.eh_proj)): not used: "
            "turned off for this load")
    finally:
        e.close()


@pytest.mark.parametrize("mode,k", [("mtp", 1), ("mtp", 3), ("mtp", 8), ("mtp", None), ("hybrid", None)])
def test_mtp_drafts_are_lossless(engine: Engine, mode: str, k: int | None) -> None:
    prompt = engine.tokenize(PROMPT)
    plain, _ = run(engine, prompt, GenerationParams(max_tokens=64, speculative=False))
    spec, ev = run(engine, prompt, GenerationParams(max_tokens=64), policy=policy_for_mode(engine, mode, k))
    assert spec == plain
    st = ev.stats
    if mode == "mtp":
        assert st.drafted_by_source.get(MTP, 0) > 0 and set(st.source_history) <= {MTP, "plain"}
    if k is not None:  # a fixed length drafts every step with room
        assert st.spec_steps >= st.steps - 1


def test_forced_partial_drafts_stay_identical(engine: Engine) -> None:
    """Drafts right for a varying prefix, then wrong, every step from the head's source: the head's
    state and cache follow what the target accepted (checked at every step by run())."""
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

    spec, ev = run(engine, prompt, GenerationParams(max_tokens=80), policy=FixedDraftLength(6, MTP),
                   draft_override=forced)
    assert spec == plain
    st = ev.stats
    assert st.accepted_history[:len(calls)] == calls
    assert max(st.accepted_history) >= 5 and st.accepted < st.drafted


def test_turns_that_reuse_the_cache(engine: Engine, mtp_target: Path) -> None:
    """A second turn extends the first (the cache reused), a third edits it (cut back: this recurrent
    target cannot roll back that far, so both caches start again): each reply is the plain reply of a
    fresh engine, and the head's bookkeeping holds at every step."""
    first = engine.tokenize(PROMPT)
    reply, _ = run(engine, first, GenerationParams(max_tokens=24), policy=policy_for_mode(engine, "mtp", 3))
    second = first + reply + engine.tokenize(" and the dog", add_special=False)
    third = first[:-2] + engine.tokenize(" a bird", add_special=False)
    fresh = Engine(mtp_target, None, EngineConfig(n_ctx=512))
    try:
        for prompt, reused in ((second, len(first) + len(reply) - 1), (third, 0)):
            want = fresh.complete(prompt, GenerationParams(max_tokens=24, speculative=False)).tokens
            fresh.reset()
            got, ev = run(engine, prompt, GenerationParams(max_tokens=24), policy=policy_for_mode(engine, "mtp", 3))
            assert got == want and ev.stats.n_prompt_reused == reused
    finally:
        fresh.close()
