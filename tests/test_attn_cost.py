"""`flashdesk attn-cost`: the small-batch flash attention microbenchmark, compiled against the cached
native build and run through real CPU backend libraries."""

from __future__ import annotations

import pytest

from app.bench import attn_cost
from native.lib import build_info, cpu_variant


def test_attn_cost_times_every_cell_through_two_libraries():
    this = cpu_variant().path
    out = attn_cost.run([this], threads=1, rounds=2, reps=1, contexts=(256, 1024), sizes=(1, 3))
    assert out["cells"] == ["256x1", "256x3", "1024x1", "1024x3"]
    assert (out["head_dim"], out["heads"], out["kv_heads"]) == (attn_cost.HEAD_DIM, attn_cost.HEADS, attn_cost.KV_HEADS)
    assert [b["lib"] for b in out["builds"]] == [str(this), str(this)]
    for b in out["builds"]:
        assert len(b["median_ms"]) == 4 and all(t > 0 for t in b["median_ms"])
        assert [len(r) for r in b["rounds_ms"]] == [2, 2, 2, 2]
        # four times the cells cost more than one (not a no-op): the op reads the whole cache
        assert b["median_ms"][2] > b["median_ms"][0]
    assert list(out["paired"][0]["over_first"]) == out["cells"]


def test_attn_cost_names_a_missing_library(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.so"):
        attn_cost.run([tmp_path / "nope.so"], threads=1, rounds=1, reps=1, contexts=(256,), sizes=(1,))


def test_attn_cost_refuses_a_library_that_is_not_a_cpu_backend():
    base = build_info().lib_dir / "libggml-base.so"
    with pytest.raises(RuntimeError, match="attn_bench failed"):
        attn_cost.run([base], threads=1, rounds=1, reps=1, contexts=(256,), sizes=(1,))


def test_attn_cost_refuses_more_rows_than_cells():
    with pytest.raises(RuntimeError, match="bad cell"):
        attn_cost.run([], threads=1, rounds=1, reps=1, contexts=(4,), sizes=(8,))
