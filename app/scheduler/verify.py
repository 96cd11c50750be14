"""Check a plan against llama.cpp itself: load the pair on real devices as the
plan says, decode with DFlash, and compare the bytes each device really holds
(memory_breakdown, after decoding, so buffers grown at run time count) with
the plan's prediction.

    python -m app.scheduler.verify --target T.gguf [--drafter D.gguf] --ctx 512 \\
        --rpc 2 --budget 40MiB [--split 1,1] [--oracle 5,9,12] --json

With --rpc N it starts N ggml-rpc-servers on loopback and plans on their
devices only, each given --budget bytes. It prints JSON: the plan, the
decoded tokens and, per device, predicted vs actual bytes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from app.engine.dflash import Engine
from app.engine.draft_policy import Choice
from app.engine.params import GenerationParams
from app.scheduler.apply import engine_config
from app.scheduler.inventory import Inventory, detect_inventory, host_spec, parse_size
from app.scheduler.plan import SplitPlan
from app.scheduler.planner import PlanRequest, plan_split
from app.scheduler.rpc import RpcServer


def predicted_bytes(plan: SplitPlan) -> dict[str, int]:
    """What the plan says llama.cpp allocates per device (the host without the app-side output buffers,
    which memory_breakdown does not list)."""
    out = {d.name: d.bytes.used for d in plan.devices}
    out["CPU"] = plan.host.bytes.used - plan.host.bytes.host_buffers
    return out


def actual_bytes(rows: list[tuple[str, int, int, int]], plan: SplitPlan) -> dict[str, int]:
    """Sum memory_breakdown rows (buffer type, model, context, compute) per plan device."""
    out = {d.name: 0 for d in plan.devices}
    out["CPU"] = 0
    for name, model_b, ctx_b, compute_b in rows:
        total = model_b + ctx_b + compute_b
        for d in plan.devices:
            endpoint = d.spec.description if d.spec is not None else ""
            # RPC buffer types are named "RPC0[host:port]"; CUDA ones "CUDA0"
            if (endpoint and f"[{endpoint}]" in name) or name == d.name:
                out[d.name] += total
                break
        else:
            out["CPU"] += total  # CPU, CPU_Mapped, CPU_REPACK, CUDA_Host, ...
    return out


def measure(plan: SplitPlan, prompt: str, max_tokens: int, oracle: list[int] | None = None,
            n_threads: int = 0) -> dict:
    """Load the plan, decode greedily with DFlash (drafts forced to `oracle` when given), measure."""
    t0 = time.perf_counter()
    engine = Engine(plan.target.path, plan.drafter.path if plan.drafter else None,
                    engine_config(plan, n_threads=n_threads))
    load_s = time.perf_counter() - t0
    try:
        toks = engine.tokenize(prompt)
        override = None
        if oracle is not None:
            def override(history: list[int], choice: Choice) -> list[int]:
                done = len(history) - len(toks)
                ahead = oracle[done:done + choice.k]
                return ahead + [0] * (choice.k - len(ahead))
        done = engine.complete(toks, GenerationParams(max_tokens=max_tokens), draft_override=override)
        rows = engine.ctx.memory_breakdown() + (engine.dctx.memory_breakdown() if engine.dctx is not None else [])
        return {"tokens": done.tokens, "prompt_tokens": toks, "load_s": round(load_s, 3),
                "drafted": done.stats.drafted, "accepted": done.stats.accepted,
                "target_devices": engine.target.device_names(),
                "drafter_devices": engine.drafter.device_names() if engine.drafter else [],
                "breakdown": [list(r) for r in rows], "actual": actual_bytes(rows, plan),
                "predicted": predicted_bytes(plan)}
    finally:
        engine.close()


def rpc_inventory(n: int, budget: int) -> tuple[Inventory, list]:
    """Start n loopback rpc-servers, register them, and describe each as a card of `budget` bytes."""
    servers = [RpcServer().start() for _ in range(n)]
    endpoints = set()
    for s in servers:
        s.register()
        endpoints.add(s.endpoint)
    inv = detect_inventory()
    # only the RPC devices (a CUDA build would list its cards too); their memory is the host's, so cap it
    gpus = tuple(replace(g, memory_free=budget, memory_total=budget, bandwidth_gbs=None)
                 for g in inv.gpus if g.description in endpoints)
    return Inventory(gpus=gpus, host=host_spec(), sources=("rpc",)), servers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.scheduler.verify", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--rpc", type=int, default=2, help="loopback rpc-servers to start (0: detected devices)")
    ap.add_argument("--budget", default="64MiB", help="memory each RPC device may use")
    ap.add_argument("--margin", default="0", help="margin kept free per device (default 0 here)")
    ap.add_argument("--split", help="override the split ratio, e.g. 1,1")
    ap.add_argument("--prompt", default="the quick brown fox")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--oracle", help="comma-separated tokens to force as drafts (exercises acceptance)")
    ap.add_argument("--threads", type=int, default=1, help="host CPU threads (default 1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    servers: list = []
    try:
        if args.rpc:
            inv, servers = rpc_inventory(args.rpc, parse_size(args.budget))
        else:
            inv = detect_inventory()
        req = PlanRequest(n_ctx=args.ctx, kv_type=args.kv, n_batch=args.batch, margin=parse_size(args.margin + "B"),
                          split=tuple(float(x) for x in args.split.split(",")) if args.split else None)
        plan = plan_split(Path(args.target), Path(args.drafter) if args.drafter else None, inv, req)
        oracle = [int(x) for x in args.oracle.split(",")] if args.oracle else None
        result = {"plan": plan.to_dict(), **measure(plan, args.prompt, args.max_tokens, oracle, args.threads)}
        result["error"] = {k: (result["actual"][k] - v) / v if v else None for k, v in result["predicted"].items()}
    finally:
        for s in servers:
            s.stop()
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result["predicted"].items():
            print(f"{k}: predicted {v:,} actual {result['actual'][k]:,} ({result['error'][k]:+.1%})")
        print("tokens:", result["tokens"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
