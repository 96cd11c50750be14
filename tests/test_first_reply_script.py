"""scripts/first_reply.py (issue 29, item 5): the headless first reply in fresh processes against the
same prompt decoded plain, its line parsed, and whether the ratio it printed is the one measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import first_reply  # noqa: E402 - scripts/ is not a package


def test_the_line_is_parsed_as_the_app_prints_it() -> None:
    out = "Assistant: It drafts.\n\n[19 tokens, 84.4 tok/s, tau 1.27, 0.88x vs plain 96.1 tok/s measured, stop]\n"
    r = first_reply.parse_line(out)
    assert (r["tokens"], r["tokens_per_s"], r["tau"], r["speedup_printed"], r["baseline_printed"], r["finish"]) == (
        19, 84.4, 1.27, 0.88, 96.1, "stop")
    assert first_reply.parse_line("[3 tokens, 5.0 tok/s, tau 1.00, length]")["speedup_printed"] is None
    with pytest.raises(ValueError):
        first_reply.parse_line("no line here")
    assert first_reply.parse_plain_after(out + "[plain after: 97.5 tok/s]\n") == 97.5
    assert first_reply.parse_plain_after(out) is None


@pytest.mark.slow
def test_one_run_on_a_tiny_budget_writes_a_truthful_line(tmp_path: Path) -> None:
    """One fresh headless reply of 8 tokens on the bundled pair and one plain: the JSON holds both lines,
    the printed ratio is the printed tokens/s over the printed baseline, and it is within the
    tolerance of the ratio measured against plain in the same process after the reply (a wide one: this
    machine is shared; the lead's quiet run uses 10%)."""
    out = tmp_path / "first-reply.json"
    assert first_reply.main(["--runs", "1", "--max-tokens", "8", "--tolerance", "0.5", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    (run,) = d["runs"]
    spec, plain = run["speculative"], run["plain"]
    assert spec["tokens"] == plain["tokens"] and 0 < spec["tokens"] <= 8
    assert plain["tau"] == 1.0
    tps, base = spec["tokens_per_s"], spec["baseline_printed"]  # printed to 0.1 tok/s, the ratio to 0.01
    assert spec["speedup_printed"] == pytest.approx(tps / base, abs=0.005 + tps / base * (0.05 / tps + 0.05 / base))
    assert run["speedup_measured"] == pytest.approx(spec["tokens_per_s"] / plain["tokens_per_s"], rel=1e-3)
    after = spec["plain_after_tokens_per_s"]  # plain again in the speculative process, after its reply
    assert after and run["speedup_same_process"] == pytest.approx(tps / after, rel=1e-3)
    assert run["truthful"] and d["all_truthful"], run
    assert d["median_speedup_measured"] == run["speedup_measured"]


def test_the_window_line_is_parsed_as_the_chat_shows_it() -> None:
    """The window child's result line carries the chat's own line under the reply (message_stats_line of
    the stored record); the parse reads the ratio from that text, as the user reads it."""
    from app.session.summary import ReplySummary
    from app.ui.chat_view import message_stats_line

    s = ReplySummary(tau=1.9, tokens_per_s=120.14, speedup=1.2345, baseline_tokens_per_s=97.3,
                     baseline_source="calibration", drafted=12, accepted=9, n_generated=19,
                     drafted_by_source={"dflash": 12})
    line = message_stats_line({"summary": s.to_dict()})
    out = "qt noise\n" + first_reply.WINDOW_RESULT + json.dumps(
        {"line": line, "status": "done", "tokens_per_s": 120.14, "baseline_tokens_per_s": 97.3,
         "baseline_source": "calibration", "plain_after_tokens_per_s": 99.0}) + "\n"
    r = first_reply.parse_window_result(out)
    assert (r["tokens"], r["tokens_per_s"], r["tau"], r["speedup_printed"], r["baseline_printed"]) == (
        19, 120.1, 1.9, 1.23, 97.3)
    assert (r["baseline_source"], r["finish"], r["plain_after_tokens_per_s"]) == ("calibration", "done", 99.0)
    plain = ReplySummary(tau=1.0, tokens_per_s=95.0, n_generated=19)  # no baseline: no ratio printed
    out = first_reply.WINDOW_RESULT + json.dumps(
        {"line": message_stats_line({"summary": plain.to_dict()}), "status": "done", "tokens_per_s": 95.0,
         "baseline_tokens_per_s": None, "baseline_source": "", "plain_after_tokens_per_s": None})
    assert first_reply.parse_window_result(out)["speedup_printed"] is None
    with pytest.raises(ValueError):
        first_reply.parse_window_result("no result here")


@pytest.mark.slow
def test_one_window_run_on_a_tiny_budget_writes_a_truthful_line(tmp_path: Path) -> None:
    """One fresh window (offscreen, the bundled pair) answering 8 tokens, one plain: the chat's line
    parses, its ratio is its tokens/s over its baseline, and plain after it in the same window was
    measured (the truthfulness itself is the lead's quiet run: this machine is shared)."""
    out = tmp_path / "first-reply-window.json"
    assert first_reply.main(["--runs", "1", "--max-tokens", "8", "--window", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["where"] == "window"
    (run,) = d["runs"]
    spec, plain = run["speculative"], run["plain"]
    assert spec["tokens"] == plain["tokens"] and 0 < spec["tokens"] <= 8
    assert spec["finish"] == plain["finish"] == "done"
    tps, base = spec["tokens_per_s"], spec["baseline_printed"]
    assert spec["speedup_printed"] == pytest.approx(tps / base, abs=0.005 + tps / base * 0.05 / tps)
    assert spec["plain_after_tokens_per_s"] and run["speedup_same_process"] is not None
