"""The lookup's drafting policies on a bench run's replies, on one clock: the run's own calibrated
cost model. Printed as JSON.

    python scripts/policy_replay.py --bench docs/bench/docs-ab-s44-after-cpu.json --sets docqa,docqa-long \
        --ctx 16384 [--caution 0.5,0.25,0] [--categories docqa,docqa-long-2k]

Each prompt's plain output is replayed as the engine would decode it under a policy: at every step
the context lookup is asked for a match as the engine asks (app.engine.lookup through
scripts/lookup_replay.bench_replies' rebuilt prompts), the policy chooses a draft, the draft's
tokens that equal plain decoding's pass, and the step is priced by the run's calibration
(CostModel.step_times at the step's context, with its graph switches). The policies: plain, the
fixed lookup (k = --fixed-k at every match: `bench --mode lookup`), the controller over the
lookup alone (DraftController, costs not refreshed) at each --caution; one controller per policy
for all the replies in the run's order, as one bench mode keeps its controller; and the oracle:
the fastest sequence of lookup drafts for the reply, knowing what plain decoding emits (a dynamic
programme over the reply's positions and the last step's size), the bound no lookup policy can
pass on this clock. Each category gives the speedup over its summed seconds and the median of its
replies' speedups (the bench's measure). DFlash is left
out: over documents it drafts a few steps in a hundred (docs/bench/docs-ab-s44-after-cpu.json), and
its acceptance cannot be replayed without the drafter. The result is a prediction: what the cost
model says each policy's choices cost, not a timing; it ranks policies on the same replies without
the run-to-run band of a bench, and a change it favours is then judged by a bench.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from lookup_replay import bench_replies  # noqa: E402

from app.engine.calibration import CostModel  # noqa: E402
from app.engine.controller import DraftController  # noqa: E402
from app.engine.draft_policy import LOOKUP, LOOKUP_K_MAX, PLAIN_STEP, Choice, FixedDraftLength, StepInfo, StepTiming  # noqa: E402
from app.engine.lookup import ContextLookup  # noqa: E402


def replay(policy, cost: CostModel, prompt: list[int], output: list[int], ends: list[list[int]],  # noqa: ANN001
           max_tokens: int) -> dict:
    """One reply decoded under `policy`, priced by `cost`: steps, drafted, accepted, seconds, and the
    plain steps taken where the lookup had a match; the lookup's steps and their seconds."""
    lk = ContextLookup()
    lk.set_history(prompt)
    lk.reply_ends = ends
    n_past, i, last_n = len(prompt) - 1, 0, 1
    out = {"steps": 0, "drafted": 0, "accepted": 0, "seconds": 0.0, "plain_with_match": 0, "lookup_steps": 0,
           "lookup_seconds": 0.0}
    while i < len(output):
        room = min(max_tokens - i, len(output) - i) - 1  # the engine's room; the reply ends where plain's did
        m = lk.find(min(LOOKUP_K_MAX, room)) if room > 0 else None
        step = StepInfo(lookup=m, has_drafter=False, first=i == 0, n_past=n_past, sources=(LOOKUP,))
        choice = policy.choose(step) if room > 0 else PLAIN_STEP
        drafts = list(m.tokens[:min(choice.k, room)]) if m is not None and choice.source == LOOKUP else []
        k = len(drafts)
        acc = 0
        while acc < k and drafts[acc] == output[i + acc]:
            acc += 1
        t = float(cost.step_times(False, np.ones(k + 1), last_n, False, n_past)[k])
        policy.observe(Choice(LOOKUP, k) if k else PLAIN_STEP, acc, StepTiming(verify_s=t, step_s=t))
        out["plain_with_match"] += int(k == 0 and m is not None and bool(m.tokens))
        out["lookup_steps"] += int(k > 0)
        out["lookup_seconds"] += t if k > 0 else 0.0
        out["steps"] += 1
        out["drafted"] += k
        out["accepted"] += acc
        out["seconds"] += t
        lk.append(output[i:i + acc + 1])
        i += acc + 1
        n_past += acc + 1
        last_n = k + 1
    return out


def lookup_matches(prompt: list[int], output: list[int], ends: list[list[int]], max_tokens: int) -> list:
    """The lookup's match at every position of the reply (None where it has none or there is no room): the
    lookup's state at a position depends only on the tokens before it, whatever steps emitted them."""
    lk = ContextLookup()
    lk.set_history(prompt)
    lk.reply_ends = ends
    out = []
    for i, tok in enumerate(output):
        room = min(max_tokens - i, len(output) - i) - 1
        out.append(lk.find(min(LOOKUP_K_MAX, room)) if room > 0 else None)
        lk.append([tok])
    return out


def oracle(cost: CostModel, prompt: list[int], output: list[int], ends: list[list[int]], max_tokens: int) -> dict:
    """The reply's fastest decode by lookup drafts on `cost`'s clock, knowing the output: best[i][last] is
    the least time from position i after a step of size `last` (the graph switch is priced)."""
    matches = lookup_matches(prompt, output, ends, max_tokens)
    n, top = len(output), LOOKUP_K_MAX + 1
    best = np.zeros((n + 1, top + 1))
    pick = np.zeros((n + 1, top + 1), dtype=int)
    for i in range(n - 1, -1, -1):
        m = matches[i]
        drafts = list(m.tokens) if m is not None else []
        passed = 0
        while passed < len(drafts) and drafts[passed] == output[i + passed]:
            passed += 1
        ks = np.arange(len(drafts) + 1)
        nxt = i + np.minimum(ks, passed) + 1
        for last in range(1, top + 1):
            t = cost.step_times(False, np.ones(len(ks)), last, False, len(prompt) - 1 + i)
            total = t + best[nxt, ks + 1]
            pick[i, last] = int(np.argmin(total))
            best[i, last] = total[pick[i, last]]
    out = {"steps": 0, "drafted": 0, "accepted": 0, "seconds": float(best[0, 1]), "plain_with_match": 0,
           "lookup_steps": 0, "lookup_seconds": 0.0}
    i, last = 0, 1
    while i < n:
        k = int(pick[i, last])
        m = matches[i]
        acc = 0
        while acc < k and m.tokens[acc] == output[i + acc]:
            acc += 1
        out["steps"] += 1
        out["drafted"] += k
        out["accepted"] += acc
        out["lookup_steps"] += int(k > 0)
        out["plain_with_match"] += int(k == 0 and m is not None)
        i, last = i + acc + 1, k + 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="a `flashdesk bench --json` file (its plain outputs, calibration)")
    ap.add_argument("--sets", required=True, help="the prompt sets of the run's prompt file (see lookup_replay)")
    ap.add_argument("--ctx", type=int, default=4096, help="the bench's --ctx")
    ap.add_argument("--categories", default="", help="only these categories (default: all)")
    ap.add_argument("--caution", default="0.5,0.25,0", help="the controller's caution values to replay")
    ap.add_argument("--fixed-k", type=int, default=3, help="the fixed lookup's draft length")
    args = ap.parse_args()

    from app.bench.info import run_info  # noqa: PLC0415

    bench = json.loads(Path(args.bench).read_text())
    cal = {k: v for k, v in bench["calibration"].items() if k in CostModel.__dataclass_fields__}
    wanted = set(filter(None, args.categories.split(",")))
    cautions = [float(c) for c in args.caution.split(",")]

    def cost() -> CostModel:
        return CostModel(**json.loads(json.dumps(cal)))  # each policy its own copy

    policies = {"plain": FixedDraftLength(0), f"lookup-{args.fixed_k}": FixedDraftLength(args.fixed_k, LOOKUP)}
    for c in cautions:
        policies[f"controller-caution-{c:g}"] = DraftController(cost(), (LOOKUP,), refresh_costs=False, caution=c)
    totals: dict[str, dict[str, dict]] = defaultdict(lambda: defaultdict(lambda: defaultdict(float)))
    ratios: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))  # per reply: plain s / s
    left_out: list[str] = []
    for row, tokens, output, _stop, ends in bench_replies(bench, args.sets.split(","), args.ctx, left_out):
        if wanted and row["category"] not in wanted:
            continue
        runs = {name: replay(policy, cost(), tokens, output, ends, bench["max_tokens"])
                for name, policy in policies.items()}
        runs["oracle"] = oracle(cost(), tokens, output, ends, bench["max_tokens"])
        for name, r in runs.items():
            for key, v in r.items():
                totals[row["category"]][name][key] += v
            totals[row["category"]][name]["replies"] += 1
            ratios[row["category"]][name].append(runs["plain"]["seconds"] / r["seconds"])
    table = {}
    for cat, by_policy in sorted(totals.items()):
        plain_s = by_policy["plain"]["seconds"]
        table[cat] = {name: {k: (round(v, 4) if k.endswith("seconds") else int(v)) for k, v in r.items()}
                      | {"speedup": round(plain_s / r["seconds"], 3),
                         "median_speedup": round(float(np.median(ratios[cat][name])), 3),
                         "tau": round((r["accepted"] + r["steps"]) / max(r["steps"], 1), 3)}
                      for name, r in by_policy.items()}
    print(json.dumps({"run": run_info(1), "bench": {"file": args.bench, "git_commit": bench["run"]["git_commit"]},
                      "left_out": left_out, "by_category": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
