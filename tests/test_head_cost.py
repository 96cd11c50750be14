"""`flashdesk head-cost`: the small-batch Q8_0 matmul microbenchmark, compiled against the cached
native build and run through real CPU backend libraries."""

from __future__ import annotations

import pytest

from app.bench import head_cost
from app.bench.kernel_bench import paired_ratios
from native.lib import build_info, cpu_variant


def test_paired_ratios_are_taken_round_by_round():
    builds = [{"lib": "a", "rounds_ms": [[1.0, 2.0, 4.0], [2.0, 2.0, 2.0]]},
              {"lib": "b", "rounds_ms": [[2.0, 2.0, 4.0], [1.0, 1.0, 3.0]]}]
    (b,) = paired_ratios(builds, ["1", "2"])
    assert b["lib"] == "b"
    assert b["over_first"]["1"][0] == 1.0  # ratios 2, 1, 1: the median pairs each round with its own
    assert b["over_first"]["2"] == [0.5, 0.5, 1.0]


def test_head_cost_times_every_column_count_through_two_libraries():
    this = cpu_variant().path
    out = head_cost.run([this], threads=1, rounds=2, reps=1, m=4096, nmax=4)
    assert (out["K"], out["M"], out["rounds"]) == (head_cost.HEAD_K, 4096, 2)
    assert [b["lib"] for b in out["builds"]] == [str(this), str(this)]
    for b in out["builds"]:
        assert len(b["median_ms"]) == 4 and all(t > 0 for t in b["median_ms"])
        assert [len(r) for r in b["rounds_ms"]] == [2, 2, 2, 2]
    assert list(out["paired"][0]["over_first"]) == ["1", "2", "3", "4"]


def test_head_cost_names_a_missing_library(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.so"):
        head_cost.run([tmp_path / "nope.so"], threads=1, rounds=1, reps=1, m=4096)


def test_head_cost_refuses_a_library_that_is_not_a_cpu_backend():
    base = build_info().lib_dir / "libggml-base.so"
    with pytest.raises(RuntimeError, match="head_bench failed"):
        head_cost.run([base], threads=1, rounds=1, reps=1, m=4096)
