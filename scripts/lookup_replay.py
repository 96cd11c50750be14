"""How often the context lookup's drafts pass: a bench run's plain outputs replayed through
app.engine.lookup.ContextLookup, printed as JSON.

    python scripts/lookup_replay.py [--bench docs/bench/hybrid-attn-cpu.json]
                                    [--sets low-acceptance,chat,docqa,humaneval] [--ctx 4096]

Each prompt is rebuilt as the bench sent it (the sets `flashdesk prompts NAME` writes, rendered by
app.bench.prompt_sets.prompt_text in the bundled target's format, tokenized by the engine; --sets
must name those of the run's prompt file, see the bench JSON's run.command); a prompt whose token
count differs from the bench's n_prompt is left out and listed. The lookup starts from the prompt
with the stop strings as the engine passes them (reply_ends), and at every position of the
reply it is asked for a draft as the engine asks (k = min(LOOKUP_K_MAX, room)); the draft's first
token is compared with the token plain decoding emitted there, and the whole draft with the
tokens that followed. Each query is counted where the controller learns it
(DraftController._lookup_model): "first" (a reply's first step), "reply_end" (a draft that ends
the reply at its stop string; "whole" counts those whose every token passed, the end marker
included), else by agreement (agreed / once / mixed) and match length n. Grouped by the bench's
category and by kind: humaneval, documents (docqa), chat (the rest); `replies_ending_with` counts
the replies whose last tokens are each stop string's. The lookup's time (queries and indexing, a
query at every reply position) per reply token and per token indexed (prompt and reply); on a shared
machine an upper bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.engine.draft_policy import LOOKUP_K_MAX  # noqa: E402
from app.engine.lookup import AGREED, MIXED, ONCE, ContextLookup  # noqa: E402

AGREEMENT_NAMES = {AGREED: "agreed", ONCE: "once", MIXED: "mixed"}


def group_of(category: str) -> str:
    if category.startswith("docqa"):  # docqa and docqa-long-2k/8k/...
        return "documents"
    return "humaneval" if category == "humaneval" else "chat"


def replay(prompt: list[int], output: list[int], reply_ends: list[list[int]], max_tokens: int) -> dict:
    """One reply's lookup queries: {bucket: [queries, first token passed, whole draft passed]}, the
    buckets "first", "reply_end", "none" (no match), "agreed"/"once"/"mixed" and "agreed:n" etc."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    lk = ContextLookup()
    lk.set_history(prompt)
    lk.reply_ends = reply_ends
    for i, tok in enumerate(output):
        room = max_tokens - i - 1  # the engine's room with the context not binding (Engine._run)
        if room > 0:
            m = lk.find(min(LOOKUP_K_MAX, room))
            if m is None:
                keys = ["none"]
            elif i == 0:
                keys = ["first"]
            elif m.ends_reply:
                keys = ["reply_end"]
            else:
                name = AGREEMENT_NAMES[m.agreement]
                keys = [name, f"{name}:{m.n}"]
            for key in keys:
                c = counts[key]
                c[0] += 1
                if m is not None:
                    c[1] += m.tokens[0] == tok
                    c[2] += list(m.tokens) == output[i:i + len(m.tokens)]
        lk.append([tok])
    return dict(counts)


def bench_replies(bench: dict, sets: list[str], ctx: int, left_out: list[str]) -> Iterator[tuple]:
    """(row, prompt tokens, plain output, stop strings, their tokens) of each of a bench run's prompts,
    rebuilt as the bench sent them (sets: those of the run's prompt file, in the bundled target's
    format); a prompt that cannot be rebuilt to the run's n_prompt is added to left_out."""
    from app.bench.prompt_sets import BenchPrompt, prompt_set, prompt_text  # noqa: PLC0415
    from app.bundled import default_target  # noqa: PLC0415
    from app.chat.format import prompt_format_of  # noqa: PLC0415
    from app.engine.dflash import Engine, EngineConfig  # noqa: PLC0415

    engine = Engine(default_target(), None, EngineConfig(n_ctx=ctx, n_threads=1))
    try:
        fmt = prompt_format_of(engine.target)
        prompts = {}
        for name in sets:
            for r in prompt_set(name, engine):
                prompts[str(r["id"])] = BenchPrompt(str(r["id"]), r["prompt"], r.get("category", "default"),
                                                    r.get("format", "chat"), list(r.get("stop", [])))
        for row in bench["prompts"]:
            bp = prompts.get(row["id"])
            text, stop = prompt_text(bp, fmt) if bp is not None else ("", [])
            tokens = engine.tokenize(text) if bp is not None else []
            if bp is None or len(tokens) != row["n_prompt"]:
                left_out.append(row["id"])
                continue
            ends = [engine.target.tokenize(s, add_special=False, parse_special=False) for s in stop]
            yield row, tokens, row["modes"]["plain"]["tokens"], stop, ends
    finally:
        engine.close()


def add(into: dict, counts: dict) -> None:
    for key, c in counts.items():
        into[key] = [a + b for a, b in zip(into.get(key, [0, 0, 0]), c)]


def table(counts: dict) -> dict:
    def order(key: str) -> tuple:
        name, _, n = key.partition(":")
        return (["first", "reply_end", "agreed", "once", "mixed", "none"].index(name), int(n or 0))

    out = {}
    for key in sorted(counts, key=order):
        q, first, whole = counts[key]
        out[key] = {"queries": q} if key == "none" else {
            "queries": q, "first_passed": first, "first_rate": round(first / q, 3),
            "whole_passed": whole, "whole_rate": round(whole / q, 3)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default="docs/bench/hybrid-attn-cpu.json")
    ap.add_argument("--sets", default="low-acceptance,chat,docqa,humaneval")
    ap.add_argument("--ctx", type=int, default=4096, help="the bench's --ctx (docqa prompts fit n_ctx - max_tokens)")
    args = ap.parse_args()

    from app.bench.info import run_info  # noqa: PLC0415

    bench = json.loads(Path(args.bench).read_text())
    by_group: dict[str, dict] = defaultdict(dict)
    by_category: dict[str, dict] = defaultdict(dict)
    left_out, replies = [], defaultdict(int)
    ended: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    n_tokens, n_reply, t_lookup = 0, 0, 0.0
    for row, tokens, output, stop, ends in bench_replies(bench, args.sets.split(","), args.ctx, left_out):
        t0 = time.perf_counter()
        counts = replay(tokens, output, ends, bench["max_tokens"])
        t_lookup += time.perf_counter() - t0
        n_tokens += len(tokens) + len(output)
        n_reply += len(output)
        group = group_of(row["category"])
        add(by_group[group], counts)
        add(by_category[row["category"]], counts)
        replies[group] += 1
        how = [s for s, e in zip(stop, ends) if e and output[-len(e):] == e]
        ended[group][how[0] if how else "no stop string"] += 1
    out = {
        "run": run_info(1),
        "bench": {"file": args.bench, "command": bench["run"]["command"], "git_commit": bench["run"]["git_commit"],
                  "max_tokens": bench["max_tokens"]},
        "sets": args.sets.split(","),
        "replies": dict(replies),
        "replies_ending_with": {g: dict(c) for g, c in sorted(ended.items())},
        "left_out": left_out,
        "us_per_reply_token": round(1e6 * t_lookup / max(n_reply, 1), 1),
        "us_per_token_indexed": round(1e6 * t_lookup / max(n_tokens, 1), 1),
        "by_group": {g: table(c) for g, c in sorted(by_group.items())},
        "by_category": {g: table(c) for g, c in sorted(by_category.items())},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
