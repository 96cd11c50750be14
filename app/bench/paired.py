"""`python -m app.bench.paired NEW.json OLD.json`: two drafters compared prompt by prompt.

Two `flashdesk bench` runs over the same prompts with the same target are paired: with greedy
decoding both produce the plain reply, so a prompt's tau in a fixed mode is a deterministic
function of the drafter and the difference of two drafters' taus on one prompt carries no timing
noise. What is uncertain is which prompts were asked: the 95% interval of the mean difference is
a bootstrap over the prompts (resampled with their pairs, within each category for the category
rows). A new drafter is better on a set when the interval lies above zero; a step inside the
interval is one the set cannot see (stop 41: F3 against F2 read -0.03 on 75 prompts, an interval
of about +-0.04).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from app.bench.info import run_info
from app.bench.runner import write_json

RESAMPLES = 5000


def prompt_taus(result: dict, mode: str) -> dict[str, tuple[str, float, list[int]]]:
    """{prompt id: (category, tau, output tokens)} for the prompts run in `mode`."""
    out = {}
    for p in result["prompts"]:
        m = p["modes"].get(mode)
        if m is not None:
            out[p["id"]] = (p["category"], float(m["tau"]), list(m.get("tokens", [])))
    return out


def mean_interval(diffs: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """The 2.5% and 97.5% points of the bootstrap mean of `diffs` (resampled with replacement)."""
    idx = rng.integers(0, len(diffs), size=(RESAMPLES, len(diffs)))
    means = diffs[idx].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def _row(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> dict:
    d = a - b
    lo, hi = mean_interval(d, rng)
    return {"n": len(d), "tau_new": round(float(a.mean()), 4), "tau_old": round(float(b.mean()), 4),
            "diff": round(float(d.mean()), 4), "ci95": [round(lo, 4), round(hi, 4)],
            "new_ahead": int((d > 0).sum()), "old_ahead": int((d < 0).sum()),
            "verdict": "new" if lo > 0 else "old" if hi < 0 else "cannot tell"}


def compare(new: dict, old: dict, mode: str = "fixed", seed: int = 0) -> dict:
    """The paired comparison of two bench results (see the module's doc)."""
    a, b = prompt_taus(new, mode), prompt_taus(old, mode)
    ids = [i for i in a if i in b]
    if not ids:
        raise ValueError(f"the two runs share no prompt run in mode {mode!r}")
    differ = [i for i in ids if a[i][2] != b[i][2]]
    rng = np.random.default_rng(seed)
    ta = np.array([a[i][1] for i in ids])
    tb = np.array([b[i][1] for i in ids])
    cats = sorted({a[i][0] for i in ids})
    by_cat = {}
    for c in cats:
        sel = np.array([a[i][0] == c for i in ids])
        by_cat[c] = _row(ta[sel], tb[sel], rng)
    return {"mode": mode, "resamples": RESAMPLES, "seed": seed,
            "new": {"drafter": new.get("drafter"), "run": new.get("run", {}).get("command")},
            "old": {"drafter": old.get("drafter"), "run": old.get("run", {}).get("command")},
            "outputs_differ": differ,  # pairs whose replies differ are still compared, and named
            "all": _row(ta, tb, rng), "by_category": by_cat}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.bench.paired", description=__doc__.split("\n\n")[0])
    ap.add_argument("new", help="bench JSON of the new drafter")
    ap.add_argument("old", help="bench JSON of the drafter it would replace (same prompts, same target)")
    ap.add_argument("--mode", default="fixed", help="the bench mode whose tau is compared (default fixed)")
    ap.add_argument("--json", help="write the comparison here")
    args = ap.parse_args(argv)
    try:
        new, old = (json.loads(Path(f).read_text()) for f in (args.new, args.old))
        result = {"run": run_info(), "files": [args.new, args.old], **compare(new, old, args.mode)}
    except (OSError, ValueError, KeyError) as e:
        print(f"paired: {e}", file=sys.stderr)
        return 2
    if args.json:
        write_json(result, args.json)
    a = result["all"]
    print(json.dumps({"all": a, "by_category": {c: f"{r['diff']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}]"
                                                for c, r in result["by_category"].items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
