"""scripts/policy_replay.py: a reply replayed under a policy takes the steps the engine would take, and
each step is priced by the cost model at its context and size."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "policy_replay.py"
spec = importlib.util.spec_from_file_location("policy_replay", SCRIPT)
policy_replay = importlib.util.module_from_spec(spec)
sys.modules["policy_replay"] = policy_replay
spec.loader.exec_module(policy_replay)

from app.engine.calibration import CostModel  # noqa: E402
from app.engine.draft_policy import LOOKUP, FixedDraftLength  # noqa: E402

COST = CostModel(verify_s=[0.0, 0.010, 0.012, 0.014, 0.016, 0.018], draft_s=[0.0, 0.001], calib_ctx=6.0)


def test_a_copied_reply_is_one_step_of_the_fixed_lookup_and_four_plain_ones() -> None:
    prompt, output = [5, 1, 2, 3, 9, 5], [1, 2, 3, 4]
    fixed = policy_replay.replay(FixedDraftLength(3, LOOKUP), COST, prompt, output, [], max_tokens=16)
    assert (fixed["steps"], fixed["drafted"], fixed["accepted"], fixed["lookup_steps"]) == (1, 3, 3, 1)
    assert np.isclose(fixed["seconds"], COST.step_times(False, np.ones(4), 1, False, 5)[3])
    plain = policy_replay.replay(FixedDraftLength(0), COST, prompt, output, [], max_tokens=16)
    # a match at each of the first three steps (the last has no room to draft)
    assert (plain["steps"], plain["drafted"], plain["plain_with_match"]) == (4, 0, 3)
    assert plain["seconds"] > fixed["seconds"]


def test_a_rejected_draft_costs_its_verify_and_emits_one_token() -> None:
    prompt, output = [5, 1, 2, 3, 9, 5], [7, 8]
    r = policy_replay.replay(FixedDraftLength(3, LOOKUP), COST, prompt, output, [], max_tokens=16)
    # the first step drafts 1 (the room: the reply ends after 2 tokens), rejected; the second has no room
    assert (r["steps"], r["drafted"], r["accepted"]) == (2, 1, 0)


def test_the_oracle_is_never_slower_than_a_policy_and_equals_plain_where_no_draft_passes() -> None:
    prompt, output = [5, 1, 2, 3, 9, 5], [1, 2, 3, 4, 7, 1, 2, 6]
    oracle = policy_replay.oracle(COST, prompt, output, [], max_tokens=16)
    for k in (0, 1, 2, 3):
        r = policy_replay.replay(FixedDraftLength(k, LOOKUP), COST, prompt, output, [], max_tokens=16)
        assert oracle["seconds"] <= r["seconds"] + 1e-12
    # the copy [1, 2, 3] passes whole at the first step: the oracle takes it
    assert oracle["accepted"] >= 3 and oracle["seconds"] < policy_replay.replay(
        FixedDraftLength(0), COST, prompt, output, [], max_tokens=16)["seconds"]
    # nothing ever passes: the oracle drafts nothing and costs what plain costs
    wrong = [11, 12, 13, 14]  # the match after the prompt's 5 (7) fails, then none
    o = policy_replay.oracle(COST, [5, 7, 9, 7, 3, 5], wrong, [], max_tokens=16)
    p = policy_replay.replay(FixedDraftLength(0), COST, [5, 7, 9, 7, 3, 5], wrong, [], max_tokens=16)
    assert o["drafted"] == 0 and np.isclose(o["seconds"], p["seconds"])
