"""The paired drafter comparison (app.bench.paired) on bench JSONs the tool wrote (docs/bench), and
the held-out prompts as a bench set."""

import copy
import json
from pathlib import Path

import numpy as np

from app.bench import paired
from app.bench.prompt_sets import prompt_set

BENCH = Path(__file__).resolve().parents[1] / "docs" / "bench"
NEW = json.loads((BENCH / "drafter-s41-cpu.json").read_text())
OLD = json.loads((BENCH / "drafter-s41-previous-cpu.json").read_text())


def _shifted(result: dict, by: float) -> dict:
    out = copy.deepcopy(result)
    for p in out["prompts"]:
        p["modes"]["fixed"]["tau"] += by
    return out


def test_the_same_run_against_itself_differs_by_nothing():
    r = paired.compare(OLD, OLD)
    assert r["all"]["diff"] == 0 and r["all"]["ci95"] == [0.0, 0.0] and r["all"]["verdict"] == "cannot tell"
    assert r["outputs_differ"] == []


def test_the_means_are_the_prompts_taus():
    r = paired.compare(NEW, OLD)
    taus = [p["modes"]["fixed"]["tau"] for p in NEW["prompts"]]
    assert r["all"]["n"] == 75 and abs(r["all"]["tau_new"] - np.mean(taus)) < 1e-4
    assert sum(row["n"] for row in r["by_category"].values()) == 75
    lo, hi = r["all"]["ci95"]
    assert lo < r["all"]["diff"] < hi


def test_pairing_sees_a_step_smaller_than_the_spread_between_prompts():
    # +0.03 on every prompt: the prompts' taus spread by ~0.5, so two independent means cannot tell
    # the runs apart; the paired differences can (the reason the tool pairs)
    new = _shifted(OLD, 0.03)
    r = paired.compare(new, OLD)
    assert r["all"]["verdict"] == "new" and r["all"]["ci95"][0] > 0
    a = np.array([p["modes"]["fixed"]["tau"] for p in new["prompts"]])
    b = np.array([p["modes"]["fixed"]["tau"] for p in OLD["prompts"]])
    rng = np.random.default_rng(0)
    unpaired = [rng.choice(a, len(a)).mean() - rng.choice(b, len(b)).mean() for _ in range(2000)]
    assert np.quantile(unpaired, 0.025) < 0 < np.quantile(unpaired, 0.975)
    assert paired.compare(_shifted(OLD, -0.03), OLD)["all"]["verdict"] == "old"


def test_replies_that_differ_are_named(tmp_path, capsys):
    new = copy.deepcopy(NEW)
    new["prompts"][0]["modes"]["fixed"]["tokens"] = [1, 2, 3]
    assert paired.compare(new, OLD)["outputs_differ"] == [new["prompts"][0]["id"]]
    out = tmp_path / "cmp.json"
    assert paired.main([str(BENCH / "drafter-s41-cpu.json"), str(BENCH / "drafter-s41-previous-cpu.json"),
                        "--json", str(out)]) == 0
    assert json.loads(out.read_text())["all"]["n"] == 75
    assert paired.main([str(tmp_path / "missing.json"), str(out)]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_no_shared_prompt_is_a_clear_error(capsys):
    assert paired.main([str(BENCH / "drafter-s41-cpu.json"), str(BENCH / "drafter-s41-previous-cpu.json"),
                        "--mode", "no-such-mode"]) == 2
    assert "share no prompt" in capsys.readouterr().err


def test_the_heldout_bench_set_is_both_curve_sets():
    rows = prompt_set("heldout")
    assert len(rows) == len({r["id"] for r in rows}) == 154
    assert {r["format"] for r in rows} == {"raw"}
    cats = {r["category"] for r in rows}
    assert {"heldout-code", "heldout-email", "heldout-story", "heldout-docqa"} <= cats
    # a chat reply stops where the held-out reply stopped (the next "User:" turn); code runs to the budget
    email = next(r for r in rows if r["category"] == "heldout-email")
    assert "\nUser:" in email["stop"] and next(r for r in rows if r["category"] == "heldout-code")["stop"] == []
