"""gguf_tools.formats on synthetic GGUF headers: every draft format the pinned llama.cpp loads is
named by the keys and tensors llama.cpp reads, and `pair` / `inspect` say which one a file is."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from gguf_tools.edit import copy_gguf
from gguf_tools.formats import DFLASH2, DFLASH_V1, DSPARK, EAGLE3, MTP, PLAIN, draft_format
from gguf_tools.inspect import format_report, inspect_gguf
from gguf_tools.pair import check_draft_model, check_pair
from gguf_tools.reader import read_gguf

TAPS = ("qwen3", "gemma3")


def header(path: Path, arch: str, meta: dict, tensors: tuple[str, ...]) -> Path:
    """A GGUF with these keys and one-element tensors: enough for header-only checks."""
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in meta.items():
        if isinstance(v, list):
            w.add_array(k, v)
        else:
            w.add_uint32(k, v)
    for name in tensors:
        w.add_tensor(name, np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def dflash2(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny DFlash drafter with DFlash2's selector keys (z-lab's: top 16, a 2,048-token window)."""
    out = tmp_path_factory.mktemp("fmt") / "tiny-dflash2.gguf"
    copy_gguf(tiny_pair[1], out, meta={"dflash.selector_top_k": 16, "dflash.selector_rank": 32,
                                       "dflash.attention.sliding_window": 2048})
    return out


def test_every_format_is_named(tmp_path: Path, tiny_pair: tuple[Path, Path], dflash2: Path) -> None:
    target, v1 = tiny_pair
    got = {
        "v1": draft_format(read_gguf(v1)),
        "v2": draft_format(read_gguf(dflash2)),
        "plain": draft_format(read_gguf(target)),
        "dspark": draft_format(read_gguf(header(
            tmp_path / "dspark.gguf", "dflash", {"dflash.block_size": 16, "dflash.target_layers": [1, 3]},
            ("markov_w1.weight", "markov_w2.weight", "conf_proj.weight")))),
        "eagle3": draft_format(read_gguf(header(
            tmp_path / "eagle3.gguf", "eagle3", {"eagle3.target_layers": [2, 5, 8], "eagle3.target_hidden_size": 64},
            ("fc.weight", "d2t")))),
        # qwen35-style: the key and the last block's nextn tensors; and the tensor alone (llama.cpp's test)
        "mtp": draft_format(read_gguf(header(
            tmp_path / "mtp.gguf", "qwen35", {"qwen35.block_count": 3, "qwen35.nextn_predict_layers": 1},
            ("blk.2.nextn.eh_proj.weight", "blk.2.nextn.enorm.weight")))),
        "mtp_tensor_only": draft_format(read_gguf(header(
            tmp_path / "mtp2.gguf", "glm4moe", {"glm4moe.block_count": 4}, ("blk.3.nextn.eh_proj.weight",)))),
    }
    want = {"v1": (DFLASH_V1, "draft-dflash", True), "v2": (DFLASH2, "draft-dflash", True),
            "plain": (PLAIN, "draft-simple", True), "dspark": (DSPARK, "draft-dspark", True),
            "eagle3": (EAGLE3, "draft-eagle3", True), "mtp": (MTP, "draft-mtp", True),
            "mtp_tensor_only": (MTP, "draft-mtp", True)}
    assert {k: (f.format, f.llama_type, f.in_loop) for k, f in got.items()} == want
    assert "top 16" in got["v2"].needs and "sliding window 2048" in got["v2"].detail
    assert "confidence head" in got["dspark"].detail
    assert "[2, 5, 8]" in got["eagle3"].detail


def test_pair_names_the_drafter_format(tiny_pair: tuple[Path, Path], tiny_dflash2_pair: tuple[Path, Path],
                                       tiny_dspark_pair: tuple[Path, Path], dflash2: Path, tmp_path: Path) -> None:
    target, v1 = tiny_pair
    assert check_pair(target, v1, tap_archs=TAPS).ok
    rep = check_pair(*tiny_dspark_pair, tap_archs=TAPS)
    assert rep.ok and rep.check("drafter_architecture").detail == "the drafter is a DSpark model"
    # a DFlash2 drafter (gguf_tools synth: its conv and selector tensors) pairs as DFlash2
    rep = check_pair(*tiny_dflash2_pair, tap_archs=TAPS)
    assert rep.ok and rep.check("drafter_architecture").detail == "the drafter is a DFlash2 model"
    assert rep.check("dflash2_selector").detail == "DFlash2 selector over the top 4 candidates"
    # the selector's keys without its tensors: llama.cpp would read a lattice its graph never writes
    rep = check_pair(target, dflash2, tap_archs=TAPS)
    assert rep.check("drafter_architecture").ok
    sel = rep.check("dflash2_selector")
    assert not rep.ok and not sel.ok and "selector_hidden.weight" in sel.detail and "inconsistent" in sel.detail
    plain = check_pair(target, target, tap_archs=TAPS).check("drafter_architecture")
    assert not plain.ok and "--draft-model" in plain.detail
    dm = check_draft_model(target, dflash2)
    assert not dm.ok and "DFlash2" in " ".join(dm.problems)
    # the selector key removed again: v1 as before
    back = tmp_path / "v1-again.gguf"
    copy_gguf(dflash2, back, drop=("dflash.selector_top_k",))
    assert check_pair(target, back, tap_archs=TAPS).ok


def test_inspect_reports_the_format(dflash2: Path, tiny_pair: tuple[Path, Path]) -> None:
    r = inspect_gguf(dflash2)
    assert r["draft_format"]["format"] == DFLASH2
    assert "draft format   DFlash2 (llama.cpp draft-dflash)" in format_report(r)
    assert inspect_gguf(tiny_pair[0])["draft_format"]["format"] == PLAIN
