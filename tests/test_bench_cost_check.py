"""The bench's cost-model check: predicted against measured step times per choice."""

from __future__ import annotations

import pytest

from app.bench.runner import cost_model_by_category, cost_model_check
from app.engine.calibration import CostModel


def _row(sources: list[str], ks: list[int], acc: list[int], step_ms: list[float]) -> dict:
    by: dict[str, list[float]] = {}
    for s, k, t in zip(sources, ks, step_ms):
        e = by.setdefault(f"{s}:{k}", [0, 0.0])
        e[0] += 1
        e[1] += t
    return {"modes": {"hybrid": {"source_history": sources, "k_history": ks, "accepted_history": acc,
                                 "step_ms_by_choice": by}}}


def test_rebuilds_are_counted_where_the_verify_size_changes() -> None:
    cm = CostModel(verify_s=[0.0, 0.010, 0.012, 0.014], draft_s=[0.0, 0.001, 0.002], switch_s=0.002,
                   inject_row_s=0.0001)
    # plain (after the prompt's pass: a rebuild), plain, lookup:2 (rebuild) accepting 2, plain (rebuild)
    row = _row(["plain", "plain", "lookup", "plain"], [0, 0, 2, 0], [0, 0, 2, 0], [12.0, 10.0, 15.0, 12.0])
    out = cost_model_check([row], ["hybrid"], cm)["hybrid"]
    plain, look = out["plain:0"], out["lookup:2"]
    assert plain["steps"] == 3 and plain["measured_ms"] == pytest.approx(34 / 3, abs=1e-3)
    assert plain["calibrated_ms"] == pytest.approx(10.1, abs=1e-3)  # steady: verify + one row
    assert plain["calibrated_rebuilds_ms"] == pytest.approx(10.1 + 2 * 2 / 3, abs=1e-3)  # 2 of 3 rebuilt
    assert look["calibrated_rebuilds_ms"] == pytest.approx(14.0 + 0.3 + 2.0, abs=1e-3)  # 3 rows, a rebuild
    assert look["rebuilds_error"] == pytest.approx(16.3 / 15.0 - 1, abs=1e-3)


def test_the_worst_errors_are_given_per_category() -> None:
    """A category whose steps the model prices right and one it prices 2x: the worst error of each
    is its own (over choices with >= 20 steps), not the run's."""
    cm = CostModel(verify_s=[0.0, 0.010, 0.012], draft_s=[0.0, 0.001], inject_row_s=0.0)
    right = _row(["plain"] * 21, [0] * 21, [0] * 21, [10.0] * 21) | {"category": "short"}
    cheap = _row(["plain"] * 21, [0] * 21, [0] * 21, [5.0] * 21) | {"category": "long"}
    out = cost_model_by_category([right, cheap], ["hybrid"], cm)
    assert out["short"]["max_abs_error"] == pytest.approx(0.0, abs=1e-3)
    assert out["long"]["max_abs_error"] == pytest.approx(1.0, abs=1e-3)
    assert set(out["long"]) == {"max_abs_error", "max_abs_error_rebuilds", "max_abs_error_live"}
