"""`flashdesk plan`: where a target (and drafter) would go, on this machine's
devices or on cards described with --gpu, as text or JSON.

    flashdesk plan --target T.gguf [--drafter D.gguf] --ctx 32768 [--kv q8_0]
                   [--gpu RTX3090:24GiB --gpu RTX3060:12GiB] [--ram 64GiB] [--json]

Exit status: 0 when the plan fits, 1 when it does not (the output says why
and what would), 2 for unusable input.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from app.engine.dflash import DRAFTER_WINDOW
from app.scheduler.errors import PlanInputError
from app.scheduler.explain import explain
from app.scheduler.inventory import Inventory, detect_inventory, host_spec, hypothetical_inventory, parse_size
from app.scheduler.plan import PlanRequest
from app.scheduler.planner import plan_split


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` subcommand to the flashdesk command."""
    p = subparsers.add_parser("plan", help="plan a target (+ drafter) across GPUs: layers, bytes, PCIe traffic",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target GGUF")
    p.add_argument("--drafter", help="DFlash drafter GGUF")
    p.add_argument("--ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("--kv", default="f16", help="KV cache type: f16 (default), q8_0, q4_0, ...")
    p.add_argument("--batch", type=int, default=512, help="batch size (default 512, the engine's)")
    p.add_argument("--drafter-window", type=int, default=None,
                   help="the drafter's window, as the model commands take it (default: the span it was trained on, "
                        f"where its file says, else {DRAFTER_WINDOW}; 0: the whole context): its cache is sized to it")
    p.add_argument("--gpu", action="append", metavar="NAME:SIZE",
                   help="a hypothetical card, e.g. RTX3090:24GiB (repeat for more; options :bw=GBs :pcie=4x16 "
                        ":free=SIZE :nvlink); without --gpu the detected devices are used")
    p.add_argument("--ram", help="host RAM for the plan (default: this machine's available RAM)")
    p.add_argument("--margin", default="1GiB", help="memory kept free on every GPU (default 1GiB)")
    p.add_argument("--split", help="override the split ratio per GPU, e.g. 3,1")
    p.add_argument("--n-gpu-layers", type=int, help="force partial offload (llama.cpp's meaning)")
    p.add_argument("--no-partial", action="store_true", help="never plan a partial offload")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)


def _inventory(args: argparse.Namespace) -> Inventory:
    host = host_spec()
    if args.ram:
        ram = parse_size(args.ram)
        host = replace(host, ram_total=ram, ram_free=ram)
    if args.gpu:
        return hypothetical_inventory(args.gpu, host)
    inv = detect_inventory()
    return replace(inv, host=host)


def cmd_plan(args: argparse.Namespace) -> int:
    for f in (args.target, args.drafter):
        if f and not Path(f).expanduser().is_file():
            raise PlanInputError(f"{f}: no such file")
    try:
        split = tuple(float(x) for x in args.split.split(",")) if args.split else None
    except ValueError:
        raise PlanInputError(f"--split {args.split!r}: expected numbers separated by commas, e.g. 3,1") from None
    inv = _inventory(args)
    req = PlanRequest(n_ctx=args.ctx, kv_type=args.kv.lower(), n_batch=args.batch, margin=parse_size(args.margin),
                      split=split, n_gpu_layers=args.n_gpu_layers, allow_partial=not args.no_partial,
                      drafter_window=args.drafter_window)
    plan = plan_split(Path(args.target).expanduser(), Path(args.drafter).expanduser() if args.drafter else None,
                      inv, req)
    lines = explain(plan)
    if args.json:
        print(json.dumps({**plan.to_dict(), "inventory": inv.to_dict(), "explanation": lines}, indent=2))
    else:
        print("\n".join(lines))
    return 0 if plan.fits else 1


