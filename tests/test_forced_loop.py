"""The forced-acceptance loop (app.bench.forced_loop, issue 30) on the tiny pair: every mode lossless,
and each run's steps judged apart from its acceptance draw (the cost model's price of the steps
taken against their measured time; the profile's expected tokens for the ks chosen against those
drawn)."""

from pathlib import Path

import pytest

from app.bench import forced_loop
from app.bench.forced import tau
from app.engine.dflash import Engine, EngineConfig


def test_steps_are_judged_apart_from_the_draw(tiny_pair: tuple[Path, Path], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import app.engine.calibration as calibration

    monkeypatch.setattr(calibration, "cache_dir", lambda: tmp_path / "calibration")
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    try:
        sure = (1.0,) * 7  # every draft passes: the draw is the expectation, but for the budget's last step
        out = forced_loop.run(e, list(forced_loop.MODES), max_tokens=64, profile=sure, prompt_len=20)
    finally:
        e.close()
    plain, fixed = out["modes"]["plain"]["steps_judged"], out["modes"]["fixed"]["steps_judged"]
    assert plain["drawn_tokens"] == 64 and plain["expected_tokens"] == 64 and plain["drawn_over_expected"] == 1.0
    assert list(plain["step_time_ratio_by_k"]) == ["0"]
    again = out["modes"]["plain-again"]  # the noise band: plain once more, after the other modes
    assert again["k"] == 0 and again["steps_judged"]["drawn_tokens"] == 64 and again["steps"] == 64
    steps = out["modes"]["fixed"]["steps"]
    assert fixed["expected_tokens"] == pytest.approx(steps * tau(sure), abs=0.1)
    assert 64 - 8 < fixed["drawn_tokens"] <= 64 and fixed["drawn_tokens"] > (steps - 1) * 8
    for mode in out["modes"].values():
        j = mode["steps_judged"]
        assert j["predicted_s"] > 0 and j["measured_s"] > 0
        assert j["time_over_predicted"] == pytest.approx(j["measured_s"] / j["predicted_s"], rel=0.01)
