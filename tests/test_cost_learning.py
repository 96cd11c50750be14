"""The cost model learns from the loop: the steady steps a controller times are folded into the
cached model (calibration.learn), so that the next session starts from the mean over every step
seen rather than one ~50 s calibration on a machine whose speed drifts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import app.engine.calibration as calibration
from app.engine.calibration import LEARN_CAP, CostModel, LoopTimes, cache_key, calibrate, learn
from app.engine.controller import DraftController, new_controller
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import LOOKUP, StepInfo, StepTiming
from app.engine.lookup import LookupMatch
from app.engine.params import GenerationParams
from app.session.chat_session import ChatSession
from app.session.conversation_ops import send_user_message
from app.session.documents import ChatDocuments
from app.session.settings import ChatSettings
from app.store import Store


def test_fold_is_the_mean_over_every_step_capped() -> None:
    cm = CostModel(verify_s=[0.0, 0.010, 0.020], draft_s=[0.0, 0.001], verify_steps=[0.0, 32.0, 32.0],
                   draft_steps=[0.0, 32.0])
    seen = LoopTimes()
    for _ in range(96):
        seen.add(2, 0.030, 1, 0.002)
    seen.fold_into(cm)
    assert cm.verify_s[2] == pytest.approx((32 * 0.020 + 96 * 0.030) / 128)
    assert cm.verify_s[1] == 0.010 and cm.verify_steps == [0.0, 32.0, 128.0]  # a size not seen stays
    assert cm.draft_s[1] == pytest.approx((32 * 0.001 + 96 * 0.002) / 128) and cm.draft_steps[1] == 128.0
    assert not seen.verify and not seen.draft  # folded once
    # past the cap, newer steps weigh more: a machine that got slower is followed
    cm.verify_steps[2] = LEARN_CAP
    for _ in range(LEARN_CAP):
        seen.add(2, 0.040)
    seen.fold_into(cm)
    assert cm.verify_s[2] == pytest.approx((0.0275 + 0.040) / 2)  # the cap's worth of old, as many new
    assert cm.verify_steps[2] == LEARN_CAP
    # a model cached before the step counts existed (all lists short) takes the loop's mean
    old = CostModel(verify_s=[0.0, 0.010, 0.020], draft_s=[0.0, 0.001])
    seen.add(1, 0.012)
    seen.fold_into(old)
    assert old.verify_s[1] == pytest.approx(0.012) and old.verify_steps[1] == 1.0


def test_the_paces_carry_a_drift_to_sizes_not_seen() -> None:
    """What every pass costs and what more tokens add drift apart, each followed from the steps of
    two sizes; a size not drafted meanwhile is expected at both paces. With the machine faster at
    the pass alone, a draft costs more relative to a plain step and the controller drafts less."""
    def costs() -> CostModel:
        return CostModel(verify_s=[0.0, 0.010, 0.012, 0.014, 0.016], draft_s=[0.0] + [0.001] * 4)

    cm = costs()  # the pass 10% slower, what more tokens add as it was
    for _ in range(2000):
        cm.update(1, 0.011)
        cm.update(3, 0.015)
    assert cm.pace_pass == pytest.approx(1.1, rel=1e-3) and cm.pace_token == pytest.approx(1.0, abs=0.01)
    assert cm.step_times(False, np.ones(4)) == pytest.approx([0.011, 0.013, 0.015, 0.017], rel=5e-3)
    cm = costs()  # both 10% slower: what a size not seen adds follows (most of the way: the seen size's
    for _ in range(2000):  # own estimate takes part of its drift)
        cm.update(1, 0.011)
        cm.update(3, 0.0154)
    t = cm.step_times(False, np.ones(4))
    assert cm.pace_token > 1.03 and t[2] == pytest.approx(0.0154, rel=1e-3)
    assert 0.011 + 1.03 * 0.006 < t[3] <= 0.0176
    cm = costs()  # what learn folds: a step's time read back to paces of 1
    cm.pace_pass, cm.pace_token = 1.2, 0.9
    assert cm.at_unit_pace(4, float(cm.step_times(False, np.ones(4))[3])) == pytest.approx(0.016)
    # lookup drafts passing 30% of the time: worth it as calibrated (1.3 tokens for 1.2 plain steps),
    # not with a pass 40% faster (for 1.33)
    step = StepInfo(LookupMatch(6, (1, 2, 3)), False)
    fast = costs()
    pol = DraftController(fast, (LOOKUP,), refresh_costs=False)
    model = pol.lookup[0][6]
    model.acc[:], model.tried[:] = 30.0, 100.0
    assert pol.choose(step).k > 0
    fast.pace_pass = 0.6
    assert pol.choose(step).k == 0


def _cached(e: Engine, cache: Path) -> dict:
    return json.loads((cache / f"{cache_key(e)}.json").read_text())


def test_steps_past_the_near_context_terms_are_not_learned() -> None:
    """A step at a long document's context is read back to calib_ctx through far pieces fitted from one
    run each: the controller's live copy follows it, the cached model's sizes do not learn it."""
    cm = CostModel(verify_s=[0.0, 0.010, 0.012], draft_s=[0.0, 0.001], calib_ctx=200.0, ctx_token_s=1e-7,
                   far_ctx=[2000.0, 8000.0], far_ctx_step_s=[1e-6, 2e-6], far_ctx_token_s=[0.0, 0.0])
    assert cm.near_ctx_end == 2000.0 and CostModel(verify_s=[0.0, 0.01]).near_ctx_end == float("inf")
    p = DraftController(cm, (LOOKUP,))
    for n_past in (500, 1999, 2001, 9000):
        c = p.choose(StepInfo(None, False, 0, False, n_past))  # no match: plain steps, none rebuilt
        p.observe(c, 0, StepTiming(step_s=0.02))
    assert p.seen.verify[1][0] == 2  # at 500 and 1,999 cells
    assert p.cost.pace_pass > 1.0  # the live copy followed all four


def test_a_controllers_steps_go_into_the_cached_model(tiny_pair: tuple[Path, Path], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "calibration"
    monkeypatch.setattr(calibration, "cache_dir", lambda: cache)
    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    try:
        cal = calibrate(e)
        assert all(s > 0 for s in cal.verify_steps[1:])  # each size is a mean of the calibration's steps
        before = _cached(e, cache)
        pol = new_controller(e)
        e.complete(e.tokenize("one two three one two three one two"), GenerationParams(max_tokens=48), policy=pol)
        timed = {n: list(v) for n, v in pol.seen.verify.items()}
        assert sum(v[0] for v in timed.values()) > 10  # the reply's steady steps
        learn(e, pol.seen)
        after = _cached(e, cache)
        assert not pol.seen.verify  # folded
        for n, (steps, total) in timed.items():
            w = before["verify_steps"][n]
            assert after["verify_steps"][n] == min(w + steps, LEARN_CAP)
            assert after["verify_s"][n] == pytest.approx((w * before["verify_s"][n] + total) / (w + steps))
        assert calibrate(e).verify_s == after["verify_s"]  # the next session starts from it
    finally:
        e.close()


def test_a_chat_reply_in_auto_mode_teaches_the_cached_model(gemma_shipped_engine: Engine, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """On the bundled pair (a chat's text needs its tokenizer), from a cached model written here (the
    folding is under test, not the ~50 s measurement)."""
    e = gemma_shipped_engine
    e.reset()
    cache = tmp_path / "calibration"
    monkeypatch.setattr(calibration, "cache_dir", lambda: cache)
    n = e.block_size
    calibration._save(CostModel(verify_s=[0.0] + [0.010 + 0.002 * i for i in range(n)], draft_s=[0.0] + [0.001] * n,
                                verify_steps=[0.0] + [32.0] * n, draft_steps=[0.0] + [32.0] * n, key=cache_key(e)))
    store = Store(tmp_path / "fd.sqlite3")
    session = ChatSession(e, store, documents=ChatDocuments(tmp_path / "documents.sqlite3"))
    try:
        conv = store.create_conversation().id
        send_user_message(store, conv, "List the days of the week.")
        list(session.reply(conv, ChatSettings(max_tokens=32)))  # draft length "auto": the controller
        assert sum(_cached(e, cache)["verify_steps"]) > 32 * n
    finally:
        session.close()
        e.reset()
