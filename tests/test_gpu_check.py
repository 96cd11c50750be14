"""scripts/gpu_check.py (issue 30, point 4): its CPU dry run goes through every step the GPU run makes
(build, taps against the CPU's, verify cost, calibration, the benches of the bundled pair and of the
stand-in, the forced-acceptance loop) and writes one JSON; the taps comparison catches a wrong row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402

STEPS = ["device", "build", "taps", "verify_cost_bundled", "standin", "verify_cost_standin", "calibrate",
         "bench_standin", "forced_loop_standin"]  # the GPU run calibrates and benches the bundled pair too


def _taps(path: Path, taps: np.ndarray) -> Path:
    np.savez(path, taps=taps, argmax=np.zeros(taps.shape[0], dtype=np.int32), devices=np.array(["CPU"]))
    return path


def test_taps_comparison_catches_a_shifted_row(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((8, 3, 16)).astype(np.float32)
    near = ref + 1e-3 * rng.standard_normal(ref.shape).astype(np.float32)  # rounding, as CUDA's
    assert gpu_check.compare_taps(_taps(tmp_path / "a.npz", ref), _taps(tmp_path / "b.npz", near))["ok"]
    shifted = ref.copy()
    shifted[:, 1] = np.roll(ref[:, 1], 1, axis=0)  # layer 1 read one row off
    got = gpu_check.compare_taps(_taps(tmp_path / "a.npz", ref), _taps(tmp_path / "c.npz", shifted))
    assert not got["ok"] and got["max_rel_err_by_layer"][1] > 0.5 and got["max_rel_err_by_layer"][0] == 0


@pytest.mark.slow
def test_cpu_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--cpu-dry-run", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=1800)
    report = json.loads(out.read_text())
    failed = {k: v.get("error") for k, v in report["steps"].items() if not v["ok"]}
    assert res.returncode == 0 and report["ok"], (failed, res.stderr[-3000:])
    assert list(report["steps"]) == STEPS
    taps = report["steps"]["taps"]["result"]
    assert taps["argmax_agreement"] == 1.0 and max(taps["max_rel_err_by_layer"]) == 0.0  # CPU against CPU
    assert [int(n) for n in report["steps"]["verify_cost_standin"]["result"]["ms"] if n != "1-again"] == \
        list(range(1, 17))
    forced = report["steps"]["forced_loop_standin"]["result"]["modes"]
    assert set(forced) == {"plain", "fixed", "adaptive", "plain-again"} and forced["fixed"]["tokens_per_step"] > 1.5


def test_steps_past_the_deadline_are_skipped(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--cpu-dry-run", "--deadline-s", "0", "--out", str(out)]) == 1
    device = json.loads(out.read_text())["steps"]["device"]
    assert not device["ok"] and "past the deadline" in device["error"]
