"""A recurrent target (Qwen3.5/3.6's gated delta nets, LFM2's short convolutions) takes back rejected
drafts from snapshots of its state, which llama.cpp keeps only when asked (n_rs_seq) and only for the
architectures it can roll back. The loop asks for one per draft; where llama.cpp grants none, replies
decode plain and the Model panel says why; a rollback that fails stops the reply instead of going on
from a state it cannot vouch for. (Identical output with forced partial drafts: test_engine_tiny.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import app.engine.dflash as dflash
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import Choice
from app.engine.params import GenerationParams
from app.errors import GenerationError
from app.session.draft_sources import draft_source_lines
from app.session.models import ModelSpec
from native.api import llama as lc

PROMPT = "the cat sat on the mat and then it ran out"


def test_a_recurrent_target_keeps_a_snapshot_per_draft(tiny_lfm2_pair: tuple[Path, Path]) -> None:
    e = Engine(*tiny_lfm2_pair, EngineConfig(n_ctx=512))
    try:
        assert e.target.recurrent and e.speculation_blocked is None
        # the longest draft any source makes (the lookup's 15, beyond this drafter's block of 8)
        assert e.ctx.n_rs_seq == dflash.verify_rows_max(tiny_lfm2_pair[1]) - 1 == 15
    finally:
        e.close()


def test_without_snapshots_replies_decode_plain_and_say_why(tiny_lfm2_pair: tuple[Path, Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """As for an architecture llama.cpp cannot roll back (it grants n_rs_seq = 0: Mamba, RWKV, Qwen3-Next)."""
    monkeypatch.setattr(lc, "llama_n_rs_seq", lambda ctx: 0)
    e = Engine(*tiny_lfm2_pair, EngineConfig(n_ctx=512))
    try:
        assert "cannot roll back the recurrent state of architecture lfm2" in e.speculation_blocked
        prompt = e.tokenize(PROMPT)
        plain = e.complete(prompt, GenerationParams(max_tokens=24, speculative=False)).tokens
        done = e.complete(prompt, GenerationParams(max_tokens=24))
        assert done.tokens == plain and done.stats.drafted == 0
        spec = ModelSpec(target=str(tiny_lfm2_pair[0]), drafter=str(tiny_lfm2_pair[1]))
        assert draft_source_lines(e, spec) == (e.speculation_blocked,)
    finally:
        e.close()


def test_a_rollback_that_fails_stops_the_reply(tiny_lfm2_pair: tuple[Path, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With the snapshots llama.cpp keeps cut to none behind the engine's back, the first rejected draft
    cannot be taken back: the reply ends with a clear error, and the next one starts from empty caches."""
    monkeypatch.setattr(dflash, "verify_rows_max", lambda drafter: 1)  # asks for no snapshots
    e = Engine(*tiny_lfm2_pair, EngineConfig(n_ctx=512))
    try:
        prompt = e.tokenize(PROMPT)
        plain = e.complete(prompt, GenerationParams(max_tokens=24, speculative=False)).tokens

        def wrong(hist: list[int], choice: Choice) -> list[int]:
            return [(plain[len(hist) - len(prompt)] + 1) % 64] * choice.k

        with pytest.raises(GenerationError, match="could not take back the rejected drafts"):
            e.complete(prompt, GenerationParams(max_tokens=24), draft_override=wrong)
        assert e.complete(prompt, GenerationParams(max_tokens=24, speculative=False)).tokens == plain
    finally:
        e.close()
