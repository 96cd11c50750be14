"""`flashdesk context-cost` (issue 29, item 1): the loop's step costs measured at several context
lengths, every size at each, and the cost model's prediction set against each measurement."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.bench.context_cost import model_error, run
from app.bench.plot import plot_context_cost
from app.engine.calibration import CostModel
from app.engine.dflash import Engine, EngineConfig


def test_every_size_is_measured_at_each_length_with_the_drafters_costs(tiny_pair: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    e = Engine(*tiny_pair, EngineConfig(n_ctx=1024))
    try:
        out = run(e, [128, 512, 4096], [1, 2, 4, 8], rounds=1)
    finally:
        e.close()
    assert [at["length"] for at in out["by_context"]] == [128, 512]  # 4096 does not fit the context: skipped
    short, long = out["by_context"]
    assert 128 - 8 <= short["cells"] <= 128 + 40 and 400 <= long["cells"] <= 512 + 40  # less the room, plus steps
    for at in (short, long):
        assert set(at["verify_ms"]) == {"1", "2", "4", "8"} and all(v > 0 for v in at["verify_ms"].values())
        assert set(at["draft_ms"]) == {"1", "3", "7"} and all(v > 0 for v in at["draft_ms"].values())
        assert at["inject_row_ms"] >= 0 and at["inject_1_row_ms"] > 0
    assert e.block_size == 8
    png = plot_context_cost(out, tmp_path / "context-cost.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cost_models_error_is_its_prediction_at_the_measured_context() -> None:
    cm = CostModel(verify_s=[0.0, 0.010, 0.012, 0.014], draft_s=[0.0, 0.001, 0.002, 0.003],
                   ctx_token_s=1e-6, calib_ctx=200.0)
    at = {"cells": 2200, "verify_ms": {"1": 12.0, "3": 20.0}, "draft_ms": {"2": 4.0}}
    err = model_error(cm, at)
    assert err["verify_ms"] == {"1": pytest.approx(12.0), "3": pytest.approx(20.0)}  # 10 + 2, 14 + 3 * 2
    assert err["verify_error"] == {"1": pytest.approx(0.0), "3": pytest.approx(0.0)}
    assert err["draft_error"] == {"2": pytest.approx(-0.5)}
