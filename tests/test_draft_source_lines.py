"""What a load says about its draft sources (app.session.draft_sources), from real engines on the tiny
synthetic pair: the DFlash drafter (v1, DFlash2, DSpark), a classic draft model, none, a drafter that
does not fit (refused), a target's MTP heads the engine did not load. (The MTP head and EAGLE-3 in use:
tests/test_engine_pass_sources.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.dflash import Engine, EngineConfig
from app.errors import PairMismatch
from app.session.draft_sources import draft_source_lines
from app.session.models import ModelSpec, check_spec
from gguf_tools.edit import copy_gguf


def _lines(spec: ModelSpec) -> tuple[str, ...]:
    e = Engine(spec.target, spec.drafter, EngineConfig(n_ctx=256, n_threads=1), draft_model=spec.draft_model)
    try:
        return draft_source_lines(e, spec)
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


def test_a_drafter_that_does_not_fit_is_refused(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """Every drafter format is driven now: a file that does not fit is refused with the reason (here an
    EAGLE-3 header over a DFlash drafter's 2 target layers), not left out."""
    target, v1 = tiny_pair
    e3 = copy_gguf(v1, tmp_path / "tiny-eagle3.gguf", meta={
        "general.architecture": "eagle3", "eagle3.block_count": 2, "eagle3.embedding_length": 64,
        "eagle3.context_length": 1024, "eagle3.target_layers": [1, 3], "eagle3.target_hidden_size": 64})
    with pytest.raises(PairMismatch, match="3 layer ids within"):
        check_spec(ModelSpec(str(target), str(e3), n_ctx=256, n_threads=1))


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
