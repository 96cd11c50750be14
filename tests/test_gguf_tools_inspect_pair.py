"""inspect and pair: on tiny synthetic files, on the real Gemma target, on every
compatibility failure, and on truncated and corrupted files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from app.errors import ModelLoadError, PairMismatch
from gguf_tools.__main__ import main as tools_main
from gguf_tools.inspect import format_report, inspect_gguf
from gguf_tools.pair import check_pair
from gguf_tools.synth import TinyShape, write_drafter, write_tiny_target

_DROP = object()


def rewrite_gguf(src: Path, dst: Path, meta: dict[str, Any] | None = None,
                 drop_tensors: tuple[str, ...] = ()) -> Path:
    """Copy a GGUF with gguf-py, replacing (or, with _DROP, removing) metadata values of the same type."""
    meta = meta or {}
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = meta.get(key, f.contents())
        if value is _DROP:
            continue
        vtype = gguf.GGUFValueType(f.types[0])
        sub = gguf.GGUFValueType(f.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(int(x) for x in reversed(t.shape)),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


# --- inspect ---------------------------------------------------------------------------------------------------

def test_inspect_tiny_target_and_drafter(tiny_pair: tuple[Path, Path]) -> None:
    target, drafter = tiny_pair
    t = inspect_gguf(target)
    assert t["architecture"] == "qwen3" and t["n_layer"] == 4 and t["n_embd"] == 64
    assert [b["layer"] for b in t["layers"]] == [0, 1, 2, 3]
    assert t["parameters"] == sum(m["params"] for m in t["quantization_mix"].values())
    assert t["quantization_mix"]["F32"]["tensors"] == t["n_tensors"]
    assert t["tokenizer"]["n_tokens"] == 64 and not t["tokenizer"]["chat_template"]
    assert "dflash" not in t
    d = inspect_gguf(drafter)
    assert d["dflash"] == {"target_layers": [1, 3], "block_size": 8, "block_size_set": True, "mask_token_id": 3,
                           "mask_token": "<mask>", "causal": False, "shares_target_head": True,
                           "own_embeddings": False, "reduced_vocab_d2t": False}
    text = format_report(d)
    assert "target layers [1, 3], block size 8, mask token 3 '<mask>'" in text


@pytest.mark.gemma
def test_inspect_real_gemma(gemma_target: Path, capsys: pytest.CaptureFixture) -> None:
    assert tools_main(["inspect", str(gemma_target), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["architecture"] == "gemma3" and r["n_layer"] == 18 and r["n_embd"] == 640
    assert r["file_type"] == "Q4_K_M" and r["sliding_window"] == 512
    assert r["tokenizer"]["n_tokens"] == 262144 and r["tokenizer"]["chat_template"] is False
    assert 260e6 < r["parameters"] < 280e6  # "270M"
    assert {"Q4_K", "Q6_K"} <= set(r["quantization_mix"])
    assert len(r["layers"]) == 18 and sum(b["bytes"] for b in r["layers"]) < r["tensor_bytes"]


def test_inspect_truncated_and_corrupt_files(tiny_pair: tuple[Path, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    raw = tiny_pair[0].read_bytes()
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ModelLoadError, match="truncated") as ei:
        inspect_gguf(trunc)
    assert str(trunc) in str(ei.value)
    assert tools_main(["inspect", str(trunc)]) == 2
    assert "truncated" in capsys.readouterr().err

    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\xff" * 60 + raw[64:])  # version and counts overwritten
    with pytest.raises(ModelLoadError, match=str(corrupt)):
        inspect_gguf(corrupt)
    notgguf = tmp_path / "notes.gguf"
    notgguf.write_text("hello, not a model at all" * 4)
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        inspect_gguf(notgguf)
    with pytest.raises(ModelLoadError, match="no such file"):
        inspect_gguf(tmp_path / "missing.gguf")


# --- pair: one test per compatibility failure -----------------------------------------------------------------

TAPS = ("qwen3", "llama", "gemma3")


def test_pair_ok_has_a_reason_for_every_check(tiny_pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    rep = check_pair(*tiny_pair, tap_archs=TAPS)
    assert rep.ok, rep.problems
    names = [c.name for c in rep.checks]
    for n in ("drafter_architecture", "target_architecture", "hidden_size", "vocab_size", "tokenizer",
              "target_layers", "fc_width", "taps", "mask_token", "block_size", "shared_head"):
        assert n in names
    assert all(c.detail for c in rep.checks)
    assert rep.check("block_size").detail == "block size 8: up to 7 drafted tokens per step"
    assert rep.check("mask_token").detail == "mask token id 3 ('<mask>')"
    assert tools_main(["pair", str(tiny_pair[0]), str(tiny_pair[1]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


@pytest.fixture
def variants(tiny_pair: tuple[Path, Path], tmp_path: Path):
    target, drafter = tiny_pair

    def make(meta: dict | None = None, drop_tensors: tuple[str, ...] = ()) -> Path:
        return rewrite_gguf(drafter, tmp_path / f"v{len(list(tmp_path.iterdir()))}.gguf", meta, drop_tensors)
    return target, drafter, make


def _fails(rep, name: str, words: str) -> None:  # noqa: ANN001
    c = rep.check(name)
    assert c is not None and not c.ok, [(x.name, x.ok, x.detail) for x in rep.checks]
    assert words in c.detail, c.detail
    assert not rep.ok
    with pytest.raises(PairMismatch) as ei:
        rep.raise_if_bad()
    assert words in str(ei.value) and rep.drafter in str(ei.value)


def test_pair_drafter_is_not_dflash(tiny_pair: tuple[Path, Path]) -> None:
    target, _ = tiny_pair
    _fails(check_pair(target, target, tap_archs=TAPS), "drafter_architecture", "not 'dflash': it is a plain model")


def test_pair_target_is_a_drafter(tiny_pair: tuple[Path, Path]) -> None:
    _, drafter = tiny_pair
    _fails(check_pair(drafter, drafter, tap_archs=TAPS), "target_architecture", "itself a DFlash drafter")


def test_pair_hidden_size(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    other = write_tiny_target(tmp_path / "t32.gguf", "qwen3", TinyShape(n_embd=32))
    _fails(check_pair(other, tiny_pair[1], tap_archs=TAPS), "hidden_size", "built for 64, the target has 32")


def test_pair_vocab_size(variants) -> None:  # noqa: ANN001
    target, drafter, make = variants
    toks = gguf.GGUFReader(drafter).fields["tokenizer.ggml.tokens"].contents()
    scores = gguf.GGUFReader(drafter).fields["tokenizer.ggml.scores"].contents()
    types = gguf.GGUFReader(drafter).fields["tokenizer.ggml.token_type"].contents()
    d = make({"tokenizer.ggml.tokens": toks[:60], "tokenizer.ggml.scores": scores[:60],
              "tokenizer.ggml.token_type": types[:60]})
    _fails(check_pair(target, d, tap_archs=TAPS), "vocab_size", "the target has 64 tokens, the drafter 60")


def test_pair_tokenizer_identity(variants) -> None:  # noqa: ANN001
    target, drafter, make = variants
    toks = gguf.GGUFReader(drafter).fields["tokenizer.ggml.tokens"].contents()
    toks[10], toks[11] = toks[11], toks[10]
    rep = check_pair(target, make({"tokenizer.ggml.tokens": toks}), tap_archs=TAPS)
    _fails(rep, "tokenizer", "same vocabulary size but different tokens")
    assert rep.check("vocab_size").ok
    # same ids, different pre-tokenizer name: drafting only uses ids, so it passes and says so
    rep = check_pair(target, make({"tokenizer.ggml.pre": "qwen2"}), tap_archs=TAPS)
    assert rep.ok and "differs in pre, which drafting does not use" in rep.check("tokenizer").detail


def test_pair_drafter_without_tokenizer(variants) -> None:  # noqa: ANN001
    target, _, make = variants
    d = make({k: _DROP for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")})
    _fails(check_pair(target, d, tap_archs=TAPS), "tokenizer", "carries no tokenizer")


def test_pair_target_layers_too_deep(variants) -> None:  # noqa: ANN001
    target, _, make = variants
    _fails(check_pair(target, make({"dflash.target_layers": [1, 7]}), tap_archs=TAPS), "target_layers",
           "reads target layers [7], but the target has only 4 layers")


def test_pair_target_layers_missing(variants) -> None:  # noqa: ANN001
    target, _, make = variants
    _fails(check_pair(target, make({"dflash.target_layers": _DROP}), tap_archs=TAPS), "target_layers",
           "no dflash.target_layers")


def test_pair_fc_width(variants) -> None:  # noqa: ANN001
    target, _, make = variants
    _fails(check_pair(target, make({"dflash.target_layers": [1, 2, 3]}), tap_archs=TAPS), "fc_width",
           "fc.weight expects 128 input features but 3 layers x 64 = 192")


def test_pair_taps_unavailable(tiny_gemma_pair: tuple[Path, Path]) -> None:
    _fails(check_pair(*tiny_gemma_pair, tap_archs=("llama", "qwen3")), "taps",
           "cannot tap hidden states of 'gemma3' models")


def test_pair_taps_skipped_without_build_is_not_a_failure(tiny_pair: tuple[Path, Path]) -> None:
    from gguf_tools.pair import tap_architectures

    rep = check_pair(*tiny_pair)
    c = rep.check("taps")
    assert c.ok
    assert c.skipped == (tap_architectures() is None)


def test_pair_mask_token(variants) -> None:  # noqa: ANN001
    target, _, make = variants
    _fails(check_pair(target, make({"tokenizer.ggml.mask_token_id": _DROP}), tap_archs=TAPS), "mask_token",
           "sets no tokenizer.ggml.mask_token_id")
    _fails(check_pair(target, make({"tokenizer.ggml.mask_token_id": 64}), tap_archs=TAPS), "mask_token",
           "mask token id 64 is outside the vocabulary of 64 tokens")


@pytest.mark.parametrize("bs", [1, 100])
def test_pair_block_size(variants, bs: int) -> None:  # noqa: ANN001
    target, _, make = variants
    _fails(check_pair(target, make({"dflash.block_size": bs}), tap_archs=TAPS), "block_size",
           f"block size {bs} is not usable")


def test_pair_own_head_without_d2t(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """A drafter with its own (smaller) output head and no d2t map cannot draft target ids."""
    target, drafter = tiny_pair
    r = gguf.GGUFReader(drafter)
    w = gguf.GGUFWriter(str(tmp_path / "own-head.gguf"), "dflash")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = gguf.GGUFValueType(f.types[0])
        w.add_key_value(key, f.contents(), vtype,
                        sub_type=gguf.GGUFValueType(f.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.add_tensor("output.weight", np.zeros((32, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _fails(check_pair(target, tmp_path / "own-head.gguf", tap_archs=TAPS), "draft_head",
           "covers 32 tokens but has no d2t map to the target's 64")


def test_pair_cli_lists_every_failure(variants, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    target, _, make = variants
    d = make({"dflash.block_size": 1, "tokenizer.ggml.mask_token_id": 99})
    assert tools_main(["pair", str(target), str(d)]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] mask_token" in out and "[FAIL] block_size" in out and "NOT compatible" in out


def test_pair_truncated_drafter_is_a_clear_error(tiny_pair: tuple[Path, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    trunc = tmp_path / "d.gguf"
    trunc.write_bytes(tiny_pair[1].read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="truncated"):
        check_pair(tiny_pair[0], trunc)
    assert tools_main(["pair", str(tiny_pair[0]), str(trunc)]) == 2
    assert str(trunc) in capsys.readouterr().err


@pytest.mark.gemma
def test_pair_real_gemma_with_random_drafter(gemma_target: Path, gemma_random_drafter: Path, tmp_path: Path) -> None:
    rep = check_pair(gemma_target, gemma_random_drafter)
    assert rep.ok, rep.problems
    assert rep.check("mask_token").detail == "mask token id 4 ('<mask>')"
    # a drafter written for the tiny qwen3 target does not fit Gemma, and says why
    tiny_t = write_tiny_target(tmp_path / "t.gguf")
    bad = check_pair(gemma_target, write_drafter(tmp_path / "d.gguf", tiny_t, target_layers=[1, 3]))
    assert {"hidden_size", "vocab_size"} <= {c.name for c in bad.checks if not c.ok}
