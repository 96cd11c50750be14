"""What a load says about its draft sources (app.session.draft_sources), from real engines on the tiny
synthetic pair: the DFlash drafter (v1 and DFlash2), a classic draft model, none, and an EAGLE-3 file the
loop does not drive yet (left out of the load, with the reason, instead of refusing it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.dflash import Engine, EngineConfig
from app.errors import PairMismatch
from app.session.draft_sources import draft_source_lines, without_undriven_drafter
from app.session.models import ModelSpec, check_spec, load_engine
from gguf_tools.edit import copy_gguf
from gguf_tools.synth import write_eagle3_header


def _lines(spec: ModelSpec, left_out: str | None = None) -> tuple[str, ...]:
    e = Engine(spec.target, spec.drafter, EngineConfig(n_ctx=256, n_threads=1), draft_model=spec.draft_model)
    try:
        return draft_source_lines(e, spec, left_out)
    finally:
        e.close()


def test_each_source_in_use_is_named_with_its_reason(tiny_pair: tuple[Path, Path]) -> None:
    target, drafter = map(str, tiny_pair)
    assert _lines(ModelSpec(target, drafter)) == (
        f"DFlash drafter {Path(drafter).name} in use: blocks of 8 (up to 7 drafts a step), fed the target's "
        f"hidden states",
        "context lookup: on beside them (drafts copied from the conversation, no model pass)")
    # the target as its own classic draft model: it shares the vocabulary
    got = _lines(ModelSpec(target, None, draft_model=target))
    assert got[0] == f"draft model {Path(target).name} in use: shares the target's vocabulary (up to 8 drafts a " \
                     f"step, one pass each)"
    assert _lines(ModelSpec(target)) == ("no drafter: plain decoding with the context lookup",)


def test_dflash2_and_dspark_drafters_are_named_by_format(tiny_dflash2_pair: tuple[Path, Path],
                                                         tiny_dspark_pair: tuple[Path, Path]) -> None:
    for (target, drafter), kind in ((tiny_dflash2_pair, "DFlash2 drafter (its selector's walk)"),
                                    (tiny_dspark_pair, "DSpark drafter (its Markov head)")):
        assert _lines(ModelSpec(str(target), str(drafter)))[0] == (
            f"{kind} {drafter.name} in use: blocks of 8 (up to 7 drafts a step), fed the target's hidden states")


def test_an_undriven_drafter_is_left_out_with_the_reason(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, v1 = tiny_pair
    # an EAGLE-3 drafter, as far as its header says (the loop does not drive the format)
    e3 = write_eagle3_header(tmp_path / "tiny-eagle3.gguf", v1)
    chosen = ModelSpec(str(target), str(e3), n_ctx=256, n_threads=1)
    with pytest.raises(PairMismatch, match="EAGLE-3"):  # as a drafter the pair check refuses it
        check_spec(chosen)
    spec, why = without_undriven_drafter(chosen)
    assert spec.drafter is None and spec.target == chosen.target
    assert why == ("EAGLE-3 file tiny-eagle3.gguf: not yet driven by FlashDesk's loop, using the context lookup "
                   "only (llama-server runs it as draft-eagle3)")
    e = load_engine(spec)
    try:
        assert not e.has_drafter
        assert draft_source_lines(e, spec, why) == (why, "no drafter: plain decoding with the context lookup")
    finally:
        e.close()
    # a drafter the loop drives, or one that does not fit at all, is not touched here (check_spec refuses the latter)
    assert without_undriven_drafter(ModelSpec(str(target), str(v1))) == (ModelSpec(str(target), str(v1)), None)
    assert without_undriven_drafter(ModelSpec(str(target), str(target)))[1] is None


def test_a_target_with_mtp_heads_the_engine_did_not_load_says_so(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    # only the header says so (the tiny copy has no nextn tensors, so llama.cpp would not load it):
    # the lines read the target's header, the engine is the plain target's
    mtp = copy_gguf(tiny_pair[0], tmp_path / "tiny-mtp.gguf", meta={"qwen3.nextn_predict_layers": 1})
    e = Engine(str(tiny_pair[0]), None, EngineConfig(n_ctx=256, n_threads=1))
    try:
        lines = draft_source_lines(e, ModelSpec(str(mtp)))
    finally:
        e.close()
    assert lines == (
        "the target carries MTP heads (qwen3 with 1 MTP (nextn) head (blk.*.nextn.eh_proj)): not used: the loaded "
        "target has none",
        "no drafter: plain decoding with the context lookup")
