"""A recurrent target (Qwen3.5/3.6's gated delta nets, LFM2's short convolutions) takes back rejected
drafts from snapshots of its state, which llama.cpp keeps only when asked (n_rs_seq) and only for the
architectures it can roll back. The loop asks for one per draft; where llama.cpp grants none, replies
decode plain and the Model panel says why; a rollback that fails stops the reply instead of going on
from a state it cannot vouch for. (Identical output with forced partial drafts: test_engine_tiny.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import app.engine.dflash as dflash
from app.bench.runner import bench
from app.engine.calibration import calibrate
from app.engine.controller import policy_for_mode
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import Choice
from app.engine.params import GenerationParams
from app.errors import GenerationError
from app.session.draft_sources import draft_source_lines
from app.session.models import ModelSpec
from gguf_tools.formats import MTP, draft_format
from gguf_tools.reader import read_gguf
from gguf_tools.synth import write_tiny_target
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
        # nothing drafts, so there are no draft costs to measure (and none cached) nor a bench against plain
        with pytest.raises(GenerationError, match="cannot roll back"):
            calibrate(e, use_cache=False)
        with pytest.raises(ValueError, match="cannot roll back"):
            bench(e, [], ["plain", "hybrid"])
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


def test_a_qwen35_target_with_mtp_heads(tmp_path: Path) -> None:
    """The tiny Qwen3.5 target with an MTP head (what Qwen3.5/3.6 GGUFs carry): llama.cpp loads the head
    and makes an MTP context on it (what draft-mtp drafts from); the pair check names the format; the
    trunk speculates with the lookup, identical to plain decoding, and the head drafts beside it
    (tests/test_engine_mtp.py)."""
    target = write_tiny_target(tmp_path / "qwen35-mtp.gguf", "qwen35", mtp_layers=1)
    assert draft_format(read_gguf(target)).format == MTP
    mp = lc.llama_model_default_params()
    mp.load_mtp = True  # (the engine's trunk skips the head's tensors)
    model = lc.llama_model_load_from_file(str(target).encode(), mp)
    assert model and lc.llama_model_n_layer_nextn(model) == 1 and lc.llama_model_n_layer(model) == 4
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.ctx_type = 256, 64, 64, lc.LLAMA_CONTEXT_TYPE_MTP
    mtp = lc.llama_init_from_model(model, cp)
    assert mtp, "llama.cpp made no MTP context on the synthetic head"
    lc.llama_free(mtp)
    lc.llama_model_free(model)
    e = Engine(target, None, EngineConfig(n_ctx=512))
    try:
        prompt = e.tokenize(PROMPT + " " + PROMPT)
        plain = e.complete(prompt, GenerationParams(max_tokens=48, speculative=False)).tokens
        done = e.complete(prompt, GenerationParams(max_tokens=48), policy=policy_for_mode(e, "lookup", 3))
        assert done.tokens == plain and done.stats.drafted > 0
        lines = draft_source_lines(e, ModelSpec(target=str(target)))
        assert lines[0].startswith("the target's own MTP head in use: no second file")
    finally:
        e.close()
