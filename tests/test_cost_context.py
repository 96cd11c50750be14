"""The cost model's context terms (issue 12: a verify pass gets dearer as the cache grows, more so for
more tokens): the fit from two contexts, step times at a step's context, refreshes read back to the
calibration context, the controller's choice at a long context, the bench's check step by step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.bench.runner import cost_model_check
from app.engine.calibration import CTX_N, PACE_ALPHA, SIZE_ALPHA, CostModel, fit_context_terms, measure
from app.engine.controller import DraftController
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import LOOKUP, StepInfo
from app.engine.lookup import LookupMatch

CELL = 1800  # cells between the two contexts below


def test_the_fit_splits_a_per_step_and_a_per_token_term() -> None:
    # 1 token: 10 ms at 300 cells, 11 ms at 2100; 8 tokens: 17 ms and 22 ms (as measured here, roughly)
    step, token = fit_context_terms(((0.010, 300), (0.017, 300)), ((0.011, 2100), (0.022, 2100)), 8)
    assert token == pytest.approx(0.004 / 7 / CELL)
    assert step == pytest.approx(0.001 / CELL - token)
    assert fit_context_terms(((0.010, 300), (0.017, 300)), ((0.011, 600), (0.022, 600)), 8) is None  # too close
    # a noisy long context that looks cheaper gives no negative term
    assert fit_context_terms(((0.010, 300), (0.017, 300)), ((0.009, 2100), (0.016, 2100)), 8) == (0.0, 0.0)


def _costs(step: float, token: float) -> CostModel:
    return CostModel(verify_s=[0.0, 0.010, 0.011, 0.012, 0.013] + [0.013 + 0.0005 * i for i in range(1, 12)],
                     draft_s=[0.0] + [0.003] * 15, inject_row_s=0.0, ctx_step_s=step, ctx_token_s=token,
                     calib_ctx=300.0)


def test_step_times_follow_the_context_and_refreshes_read_back() -> None:
    cm = _costs(1e-7, 3e-7)
    base = cm.step_times(False, np.ones(8))
    assert base[0] == pytest.approx(0.010) and base[3] == pytest.approx(0.013)
    long = cm.step_times(False, np.ones(8), n_past=2100)
    assert long[0] == pytest.approx(0.010 + (1e-7 + 3e-7) * CELL)
    assert long[3] == pytest.approx(0.013 + (1e-7 + 4 * 3e-7) * CELL)
    short = cm.step_times(False, np.ones(8), n_past=0)  # below calib_ctx: cheaper, at most by half
    assert 0.5 * base[3] <= short[3] < base[3]
    before = list(cm.verify_s)
    cm.update(4, float(long[3]), n_past=2100)  # exactly what the model expects there: nothing moves
    assert cm.verify_s == pytest.approx(before)
    cm.update(4, float(long[3]) + 0.002, n_past=2100)  # slower than expected: the paces, then the size move up
    r = PACE_ALPHA * 0.002 / (0.010 ** 2 + 0.003 ** 2)  # split by each part's share: 0.010 per pass, 0.003 more
    assert (cm.pace_pass, cm.pace_token) == pytest.approx((1.0 + r * 0.010, 1.0 + r * 0.003))
    assert cm.verify_s[4] == pytest.approx(0.013 + SIZE_ALPHA * 0.002 * (1.0 - PACE_ALPHA))
    assert cm.verify_s[:4] == before[:4]


def test_past_far_ctx_each_piece_prices_its_cells() -> None:
    # near: 0.4 + 0.2 n us per cell up to 2,100 cells; then 0.1 + 0.05 n to 8,100; then 0.6 + 0.3 n (as
    # measured on this CPU: little growth to 8k cells, steep past ~10k, where the cache leaves the CPU's)
    cm = _costs(4e-7, 2e-7)
    cm.far_ctx, cm.far_ctx_step_s, cm.far_ctx_token_s = [2100.0, 8100.0], [1e-7, 6e-7], [5e-8, 3e-7]
    at_knot = cm.step_times(False, np.ones(15), n_past=2100)
    assert at_knot[14] == pytest.approx(float(cm.verify_s[15]) + (4e-7 + 15 * 2e-7) * CELL)
    mid = cm.step_times(False, np.ones(15), n_past=8100)
    assert mid[0] == pytest.approx(at_knot[0] + (1e-7 + 5e-8) * 6000)
    far = cm.step_times(False, np.ones(15), n_past=32100)
    assert far[14] == pytest.approx(mid[14] + (6e-7 + 15 * 3e-7) * 24000)
    near_only = _costs(4e-7, 2e-7).step_times(False, np.ones(15), n_past=8100)
    assert mid[14] < near_only[14]  # the near terms alone would have extrapolated to 8k cells
    # a step timed far away is read back through every piece: exactly as expected moves nothing
    before = list(cm.verify_s)
    cm.update(15, float(far[14]), n_past=32100)
    assert cm.verify_s == pytest.approx(before) and (cm.pace_pass, cm.pace_token) == pytest.approx((1.0, 1.0))


def test_the_controller_drafts_less_at_a_long_context() -> None:
    cm = _costs(0.0, 3e-6)  # attention so dear that a 4-token verify at 4000 cells does not pay
    pol = DraftController(cm, (LOOKUP,), refresh_costs=False)
    match = LookupMatch(6, (1, 2, 3))
    short = pol.choose(StepInfo(match, has_drafter=False, n_past=300))
    long = pol.choose(StepInfo(match, has_drafter=False, n_past=4000))
    assert short.source == LOOKUP and short.k == 3
    assert long.k < short.k


def test_the_bench_check_predicts_each_step_at_its_context() -> None:
    cm = _costs(1e-7, 3e-7)
    # a 1000-token prompt: plain at 999 cells, lookup:3 (accepting 3) at 1000, plain at 1004
    row = {"modes": {"hybrid": {"n_prompt": 1000, "source_history": ["plain", "lookup", "plain"],
                                "k_history": [0, 3, 0], "accepted_history": [0, 3, 0],
                                "step_ms_by_choice": {"plain:0": [2, 22.0], "lookup:3": [1, 14.0]}}}}
    out = cost_model_check([row], ["hybrid"], cm)["hybrid"]
    plain = 2 * 10.0 + 1e3 * 4e-7 * ((999 - 300) + (1004 - 300))
    assert out["plain:0"]["calibrated_ms"] == pytest.approx(plain / 2, abs=1e-3)
    assert out["lookup:3"]["calibrated_ms"] == pytest.approx(13.0 + 1e3 * (1e-7 + 4 * 3e-7) * 700, abs=1e-3)


def test_calibration_measures_the_context_terms(gemma_target: Path) -> None:
    """On the bundled target (no drafter: forced lookup drafts) with room for a document-length
    context: the terms are measured, not left at their default (0): a CTX_N-token step after
    2,000 cells costs more than after 200 (README: 2.7-6.6 ms per 1,000 cells on a quiet machine;
    53 and 183 ms in two runs here with the machine three times oversubscribed, steps 5x slower:
    noisy, but a step at 2,000 cells measured no dearer than at 200 is what a 0 would take)."""
    e = Engine(gemma_target, None, EngineConfig(n_ctx=4096, n_threads=2))
    try:
        cm = measure(e, rounds=2, pairs=4)  # (1 round of 2 pairs read 0 once in 3 runs on a quiet EPYC)
    finally:
        e.close()
    assert 200 <= cm.calib_ctx <= 200 + 16 * 5 * 16  # the calibration prompt and what the steps emitted
    assert np.isfinite([cm.ctx_step_s, cm.ctx_token_s]).all() and cm.ctx_step_s >= 0 and cm.ctx_token_s >= 0
    assert cm.ctx_step_s + CTX_N * cm.ctx_token_s > 0, (cm.ctx_step_s, cm.ctx_token_s)
    # and one far piece, from 2,000 cells to as far as the 4,096-cell context allows
    assert len(cm.far_ctx) == 1 and 2000 <= cm.far_ctx[0] <= 2000 + 16 * 5 * 16
    assert np.isfinite([*cm.far_ctx_step_s, *cm.far_ctx_token_s]).all()
    assert min(cm.far_ctx_step_s) >= 0 and min(cm.far_ctx_token_s) >= 0
