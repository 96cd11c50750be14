"""The host-cost bench (issue 30, point 1): every host part of a step is timed for n = 1..16 on the
real bundled target, and the 3090 projection's arithmetic is the one its note states."""

from __future__ import annotations

import pytest

from app.bench import host_cost
from app.bundled import default_drafter, default_target

PARTS = {"argmax_c", "backend_read", "sample_rows", "sample_rows_top_p", "taps_out", "taps_into_drafter_batch",
         "lookup_find", "controller", "text_and_stats", "ctypes_calls_x10", "pass_c", "pass_backend"}


def test_projection_arithmetic() -> None:
    row = {"greedy_total": 100.0, "sampling_total": 1000.0, "sampling_total_top_p": 2000.0,
           "greedy_total_backend": 50.0}
    p = host_cost.project({"1": row, "16": row})
    step_8b = 4.92e9 / 936e9 + 0.5e-3  # weights / bandwidth + launches
    assert p["8B"]["step_ms"] == pytest.approx(step_8b * 1e3, abs=1e-3)
    assert p["8B"]["by_n"]["1"]["host_greedy_share"] == pytest.approx(100e-6 / step_8b, abs=1e-4)
    assert p["8B"]["by_n"]["1"]["host_sampling_top_p_share"] == pytest.approx(2000e-6 / step_8b, abs=1e-4)
    # 16 rows of 128,256 logits and 5 taps of 4,096 floats at 25 GB/s
    assert p["8B"]["by_n"]["16"]["pcie_logits_and_taps_us"] == pytest.approx(
        16 * (128256 + 5 * 4096) * 4 / 25e9 * 1e6, abs=0.1)
    assert p["27B"]["step_ms"] > 3 * p["8B"]["step_ms"]
    # the backend-greedy path: its host total, and only the taps cross the bus
    assert p["8B"]["by_n"]["1"]["host_greedy_backend_share"] == pytest.approx(50e-6 / step_8b, abs=1e-4)
    assert p["8B"]["by_n"]["16"]["pcie_taps_only_us"] == pytest.approx(16 * 5 * 4096 * 4 / 25e9 * 1e6, abs=0.1)


@pytest.mark.slow  # ~60 s on 2 busy cores: 80 passes of up to 16 rows on two contexts
def test_every_part_is_timed_for_every_size() -> None:
    m = host_cost.measure(default_target(), default_drafter(), reps=1)
    assert list(m["us_by_n"]) == [str(n) for n in range(1, 17)]
    assert len(m["tap_layers"]) >= 1 and m["n_vocab"] == 262144
    for row in m["us_by_n"].values():
        assert PARTS <= set(row) and all(row[k] > 0 for k in PARTS)
        assert row["greedy_total"] == pytest.approx(sum(row[k] for k in host_cost.GREEDY_PARTS), abs=0.1)
        assert row["sampling_total_top_p"] == pytest.approx(
            row["greedy_total"] - row["argmax_c"] + row["sample_rows_top_p"], abs=0.1)
        assert row["greedy_total_backend"] == pytest.approx(
            row["greedy_total"] - row["argmax_c"] + row["backend_read"], abs=0.1)
        assert row["backend_pass_extra"] == pytest.approx(row["pass_backend"] - row["pass_c"], abs=0.1)
