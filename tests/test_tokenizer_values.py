"""Per-token scores and types are checked before llama.cpp sees a file: byte flips there hung
llama.cpp's tokenizer or broke generation in the fuzz run (scripts/fuzz_gguf.py)."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from gguf_tools.pair import check_pair
from gguf_tools.reader import read_gguf
from gguf_tools.validate import model_problems


def _patched(src: Path, dst: Path, key: str, index: int, packed: bytes) -> Path:
    """A copy of `src` with element `index` of metadata array `key` overwritten in place."""
    lz = read_gguf(src)._lazy[key]  # noqa: SLF001 - the array's byte range in the file
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(lz.start + index * len(packed))
        f.write(packed)
    return dst


@pytest.mark.parametrize(("key", "packed", "says"), [
    ("tokenizer.ggml.scores", struct.pack("<f", float("nan")), "score nan"),
    ("tokenizer.ggml.scores", struct.pack("<f", float("-inf")), "score -inf"),
    ("tokenizer.ggml.scores", struct.pack("<f", 3e38), "score 3e+38"),
    ("tokenizer.ggml.token_type", struct.pack("<i", 16777217), "type 16777217"),
    ("tokenizer.ggml.token_type", struct.pack("<i", -1), "type -1"),
])
def test_out_of_range_token_values_are_named(shipped_drafter: Path, tmp_path: Path, key: str, packed: bytes,
                                             says: str) -> None:
    bad = _patched(shipped_drafter, tmp_path / "d.gguf", key, 1234, packed)
    problems = [str(p) for p in model_problems(read_gguf(bad))]
    assert any(key in p and "token 1,234" in p and says in p for p in problems), problems
    assert all(len(p) < 300 for p in problems)


def test_the_bundled_files_pass(gemma_target: Path, shipped_drafter: Path) -> None:
    assert model_problems(read_gguf(gemma_target)) == []
    assert model_problems(read_gguf(shipped_drafter)) == []
    assert check_pair(gemma_target, shipped_drafter).ok


def test_a_drafter_whose_token_types_differ_from_the_targets_is_not_compatible(
        gemma_target: Path, shipped_drafter: Path, tmp_path: Path) -> None:
    """A valid type (control instead of normal) in the drafter only: in range, but not the target's."""
    bad = _patched(shipped_drafter, tmp_path / "d.gguf", "tokenizer.ggml.token_type", 5000, struct.pack("<i", 3))
    rep = check_pair(gemma_target, bad)
    assert not rep.ok
    tok = next(c for c in rep.checks if c.name == "tokenizer")
    assert not tok.ok and "token_type" in tok.detail and "differ from the target's" in tok.detail
