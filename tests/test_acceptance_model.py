"""The acceptance model's expected tokens (read by the controller every step, issue 30's host time):
the Python-float recurrence equals the formula on arrays, and a kept answer never outlives the counts
it was read from (observe, forget, or counts set directly)."""

import numpy as np
import pytest

from app.engine.acceptance import AcceptanceModel
from app.engine.calibration import CostModel


def _reference(m: AcceptanceModel, z: float, first: float) -> tuple[np.ndarray, np.ndarray]:
    p = m.p  # the smoothed, clipped estimate
    n = m.tried + m.prior_weight
    both = np.stack((p, (p - z * np.sqrt(p * (1.0 - p) / (n + 1.0))).clip(0.0, 0.999)))
    both[:, :1] *= first
    e = np.ones((2, m.k_max + 1))
    e[:, 1:] += both.cumprod(axis=1).cumsum(axis=1)
    return e[0], e[1]


def test_expected_both_is_the_formula() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = AcceptanceModel(int(rng.integers(1, 16)), prior=float(rng.uniform(0.05, 0.95)))
        m.tried[:] = rng.uniform(0, 20, m.k_max)
        m.acc[:] = m.tried * rng.uniform(0, 1, m.k_max)
        z, first = float(rng.uniform(0, 2)), float(rng.uniform(0.3, 1))
        e, low = m.expected_both(z, first)
        ref_e, ref_low = _reference(m, z, first)
        assert e == pytest.approx(ref_e, abs=1e-12) and low == pytest.approx(ref_low, abs=1e-12)


def test_a_kept_answer_follows_the_counts() -> None:
    m = AcceptanceModel(8, prior=0.6)
    before = m.expected_both(0.5)[0].copy()
    assert m.expected_both(0.5)[0] is m.expected_both(0.5)[0]  # kept while nothing changed
    m.observe(8, 8)
    after = m.expected_both(0.5)[0]
    assert after[-1] > before[-1]
    m.forget(0.1)
    assert m.expected_both(0.5)[0][-1] < after[-1]
    m.acc[:] = 0.0  # set directly, as tests and the controller's own resets do
    assert m.expected_both(0.5)[0] == pytest.approx(_reference(m, 0.5, 1.0)[0])
    assert m.expected_both(0.5, 0.5)[0][1] == pytest.approx(_reference(m, 0.5, 0.5)[0][1])
    with pytest.raises(ValueError):
        m.expected_both(0.5)[0][1] = 2.0  # shared: read-only


def test_rising_costs_follow_the_lists() -> None:
    cm = CostModel(verify_s=[0.0, 0.010, 0.009, 0.012], draft_s=[0.0, 0.002, 0.001])
    assert list(cm.rising("verify_s")) == [0.010, 0.010, 0.012]  # a noisy low estimate does not undercut
    assert list(cm.step_times(False, np.ones(3))) == pytest.approx([0.010, 0.010, 0.012])
    cm.verify_s[2] = 0.011  # updated in place, as the live copy's are
    assert list(cm.rising("verify_s")) == [0.010, 0.011, 0.012]
    cm.update(3, 0.020)
    assert cm.rising("verify_s")[2] == pytest.approx(cm.verify_s[3]) and cm.verify_s[3] > 0.012
    assert "_rising" not in cm.to_dict()
