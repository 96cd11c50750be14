"""The measuring subcommands: `flashdesk bench`, `bench-plot`, `verify-cost`, `context-cost`, `near-ties`, `calibrate`
and `prompts`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from app.bench import attn_cost, context_cost, head_cost, near_ties, plot, prompt_sets, runner, verify_cost
from app.bench.info import emit_result, run_info
from app.bundled import default_target
from app.cli.common import add_model_args, open_engine
from app.engine.calibration import calibrate
from app.engine.draft_policy import DFLASH, EAGLE3
from app.engine.params import GenerationParams


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="plain vs DFlash over a JSONL prompt file")
    add_model_args(b)
    b.add_argument("--prompts", required=True, help="JSONL with id, prompt, optional category and format")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--draft-max", type=int, default=None)
    b.add_argument("--mode", default="plain,fixed",
                   help=f"comma list of {','.join(runner.MODES)}; peers (app.bench.peers, llama-server built "
                        f"on first use): {','.join(runner.PEER_MODES)}, e.g. upstream-dflash@7, "
                        "upstream-lookup:ngram-simple, upstream-chain:ngram-mod+draft-dflash")
    b.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    b.add_argument("--repeat", type=int, default=1,
                   help="runs of every mode per prompt (default 1); each entry is the run of median tokens/s")
    b.add_argument("--no-check", action="store_true", help="skip the teacher-forced lossless check")
    b.add_argument("--recalibrate", action="store_true",
                   help="measure the cost model afresh at the start (the cost check then compares the run with "
                        "a calibration minutes old, not one cached days before on a machine whose speed drifts)")
    b.add_argument("--json", help="write full results here")
    b.add_argument("--plot", help="write a PNG plot here")
    b.set_defaults(func=cmd_bench)

    bp = sub.add_parser("bench-plot", help="draw the plot of a bench JSON (again, e.g. after a plot change)")
    bp.add_argument("json", help="a JSON file `bench --json` wrote")
    bp.add_argument("--plot", required=True, help="write the PNG here")
    bp.set_defaults(func=cmd_bench_plot)

    v = sub.add_parser("verify-cost", help="steady-state cost of a target pass of n tokens (JSON)")
    v.add_argument("--target", help="target GGUF (default: the bundled Gemma 3 270M)")
    v.add_argument("--sizes", default="1,2,3,4,5,6,7,8,12,16", help="token counts n (default 1..8,12,16)")
    v.add_argument("--rounds", type=int, default=10, help="rounds over all sizes (default 10)")
    v.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    v.add_argument("--gpu", action="store_true", help="all layers on the GPU (a CUDA build: FLASHDESK_CUDA=1)")
    v.add_argument("--compare-stock", action="store_true",
                   help="also measure llama.cpp's stock CPU kernels (same build, kernels switched off)")
    v.add_argument("--compare-build", type=Path, metavar="DIR",
                   help="also measure another native build (a folder with build_info.json and lib/), "
                        "alternating processes round by round")
    v.add_argument("--json", help="also write the result to this file")
    v.add_argument("--plot", help="also draw it to this PNG")
    v.set_defaults(func=cmd_verify_cost)

    hc = sub.add_parser("head-cost", help="the small-batch Q8_0 matmul alone at the bundled target's output head, "
                        "n = 1..8 columns, against other CPU backend builds in the same process (JSON)")
    add_kernel_bench_args(hc, rounds=30, reps=7)
    hc.add_argument("--rows", type=int, default=head_cost.HEAD_M, help="output rows (default 262144, the head)")
    hc.set_defaults(func=cmd_head_cost)

    ac = sub.add_parser("attn-cost", help="the small-batch flash attention alone at the bundled target's shape, "
                        "by cached cells and query rows, against other CPU backend builds in the same process (JSON)")
    add_kernel_bench_args(ac, rounds=10, reps=5)
    ac.add_argument("--contexts", default=",".join(map(str, attn_cost.CONTEXTS)),
                    help="cached cells (default 2048,8192,32768)")
    ac.add_argument("--sizes", default=",".join(map(str, attn_cost.SIZES)), help="query rows n (default 1,2,3,4,8,16)")
    ac.set_defaults(func=cmd_attn_cost)

    cc = sub.add_parser("context-cost", help="a loop step's costs by context length: verify(n), the drafter's "
                        "pass and injection at 2k..32k cached tokens, against the cost model (JSON)")
    add_model_args(cc)  # --ctx 32768 for the 32k length
    cc.add_argument("--contexts", default=",".join(map(str, context_cost.CONTEXTS)),
                    help="cached tokens (default 2048,4096,8192,16384,32768; each less the generation's room)")
    cc.add_argument("--sizes", default=",".join(map(str, context_cost.SIZES)), help="verify sizes n (default 1..16)")
    cc.add_argument("--rounds", type=int, default=3, help="generations per length (default 3)")
    cc.add_argument("--json", help="also write the result to this file")
    cc.add_argument("--plot", help="also draw it to this PNG")
    cc.set_defaults(func=cmd_context_cost)

    nt = sub.add_parser("near-ties", help="how far verify-pass logits move from single-token decoding (JSON)")
    nt.add_argument("--target", help="target GGUF (default: the bundled Gemma 3 270M)")
    nt.add_argument("--prompts", help="JSONL prompt file (default: the first 4 HumanEval prompts)")
    nt.add_argument("--limit", type=int, default=4, help="prompts to use (default 4)")
    nt.add_argument("--sizes", default="2,3,4,6,8,12,16", help="verify sizes n (default 2,3,4,6,8,12,16)")
    nt.add_argument("--tokens", type=int, default=128, help="greedy tokens per prompt (default 128)")
    nt.add_argument("--threads", type=int, default=0)
    nt.add_argument("--compare-stock", action="store_true", help="also with llama.cpp's stock CPU kernels")
    nt.add_argument("--gpu", action="store_true", help="all layers on the GPU (a CUDA build: FLASHDESK_CUDA=1)")
    nt.add_argument("--json", help="also write the result to this file")
    nt.set_defaults(func=cmd_near_ties)

    c = sub.add_parser("calibrate", help="the cost model of speculation for this pair, measured in the loop (JSON)")
    add_model_args(c)
    c.add_argument("--fresh", action="store_true", help="measure again instead of reading the cache")
    c.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("prompts", help="write a bundled prompt set as JSONL")
    p.add_argument("name", choices=prompt_sets.NAMES)
    p.add_argument("--out", required=True)
    add_model_args(p)  # docqa, docqa-long: the target whose tokenizer sizes the prompts
    p.set_defaults(func=cmd_prompts)


def cmd_bench(args: argparse.Namespace) -> int:
    GenerationParams(max_tokens=args.max_tokens, draft_max=args.draft_max).validate()  # before anything loads
    engine = open_engine(args)
    try:
        prompts = prompt_sets.load_prompts(args.prompts, args.limit)
        modes = [m.strip() for m in args.mode.split(",") if m.strip()]
        result = runner.bench(engine, prompts, modes, max_tokens=args.max_tokens, draft_max=args.draft_max,
                              check=not args.no_check, recalibrate=args.recalibrate, progress=runner.log,
                              repeat=args.repeat,
                              partial=(lambda r: runner.write_json(r, args.json)) if args.json else None)
        result["target"] = str(engine.target.path)
        result["drafter"] = str(engine.drafter_path) if engine.drafter_path else None
        # the drafter file's format (dflash, dflash2, dspark, eagle3): the runner's record of the load's sources
        result["drafter_format"] = result["source_formats"].get(DFLASH) or result["source_formats"].get(EAGLE3)
        result["drafter_window"] = engine.drafter_window  # 0: the drafter attends to the whole context
    finally:
        engine.close()
    if args.json:
        runner.write_json(result, args.json)
        runner.log(f"wrote {args.json}")
    if args.plot:
        plot.plot_bench(result, args.plot)
        runner.log(f"wrote {args.plot}")
    print(json.dumps(result["summary"], indent=2))
    return 0


def cmd_bench_plot(args: argparse.Namespace) -> int:
    try:
        result = json.loads(Path(args.json).read_text())
        plot.plot_bench(result, args.plot)
    except (OSError, ValueError, KeyError) as e:
        print(f"flashdesk bench-plot: {args.json}: not a bench result ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    runner.log(f"wrote {args.plot}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    engine = open_engine(args)
    try:
        cm = calibrate(engine, use_cache=not args.fresh)
        print(json.dumps({"target": str(engine.target.path),
                          "drafter": str(engine.drafter.path) if engine.drafter else None,
                          "plain_tokens_per_s": round(cm.plain_tokens_per_s, 3),
                          "verify_ms": [round(x * 1e3, 3) for x in cm.verify_s[1:]],
                          "verify_relative": [round(x, 3) for x in cm.relative_verify()],
                          # how many steps each size's cost is the mean of (calibration's, then the loop's)
                          "verify_steps": [int(x) for x in cm.verify_steps[1:]],
                          "draft_ms": [round(x * 1e3, 3) for x in cm.draft_s[1:]],
                          "draft_relative_to_plain_step": [round(x / cm.verify_s[1], 3) for x in cm.draft_s[1:]],
                          "inject_call_ms": round(cm.inject_call_s * 1e3, 4),
                          "inject_row_ms": round(cm.inject_row_s * 1e3, 4),
                          "switch_ms": round(cm.switch_s * 1e3, 4),
                          # per 1,000 cache cells beyond the context the sizes were measured at
                          "calibration_context": round(cm.calib_ctx),
                          "context_ms_per_1k_cells_per_step": round(cm.ctx_step_s * 1e6, 4),
                          "context_ms_per_1k_cells_per_token": round(cm.ctx_token_s * 1e6, 4),
                          # the same from each far_context on (none: the terms above hold at every length)
                          "far_context": [round(x) for x in cm.far_ctx],
                          "far_context_ms_per_1k_cells_per_step": [round(x * 1e6, 4) for x in cm.far_ctx_step_s],
                          "far_context_ms_per_1k_cells_per_token": [round(x * 1e6, 4) for x in cm.far_ctx_token_s]},
                         indent=2))
    finally:
        engine.close()
    return 0


def cmd_context_cost(args: argparse.Namespace) -> int:
    engine = open_engine(args)
    try:
        out = context_cost.run(engine, [int(x) for x in args.contexts.split(",")],
                               [int(x) for x in args.sizes.split(",")], args.rounds)
    finally:
        engine.close()
    return emit_result(out, args.json, args.plot, plot.plot_context_cost)


def add_kernel_bench_args(p: argparse.ArgumentParser, rounds: int, reps: int) -> None:
    """The options of the in-process kernel microbenchmarks (app/bench/kernel_bench.py)."""
    p.add_argument("--lib", type=Path, action="append", default=[], metavar="SO",
                   help="another build's libggml-cpu-<variant>.so to time beside this one (repeatable)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--rounds", type=int, default=rounds, help=f"rounds over every cell and library (default {rounds})")
    p.add_argument("--reps", type=int, default=reps, help=f"timed passes per cell, their median kept (default {reps})")
    p.add_argument("--json", help="also write the result to this file")


def cmd_verify_cost(args: argparse.Namespace) -> int:
    target = Path(args.target) if args.target else default_target()
    sizes = [int(x) for x in args.sizes.split(",")]
    out = verify_cost.run(target, sizes, args.rounds, args.compare_stock, args.threads, 999 if args.gpu else 0,
                          args.compare_build)
    return emit_result(out, args.json, args.plot, plot.plot_verify_cost)


def cmd_head_cost(args: argparse.Namespace) -> int:
    threads = args.threads or os.cpu_count() or 1
    out = {"run": run_info(threads), **head_cost.run(args.lib, threads, args.rounds, args.reps, m=args.rows)}
    return emit_result(out, args.json)


def cmd_attn_cost(args: argparse.Namespace) -> int:
    threads = args.threads or os.cpu_count() or 1
    contexts = tuple(int(x) for x in args.contexts.split(","))
    sizes = tuple(int(x) for x in args.sizes.split(","))
    out = {"run": run_info(threads), **attn_cost.run(args.lib, threads, args.rounds, args.reps, contexts, sizes)}
    return emit_result(out, args.json)


def cmd_near_ties(args: argparse.Namespace) -> int:
    target = Path(args.target) if args.target else default_target()
    if args.prompts:
        rows = prompt_sets.load_prompts(args.prompts, args.limit)
        texts = [bp.prompt for bp in rows]
    else:
        texts = [r["prompt"] for r in prompt_sets.humaneval_prompts()[:args.limit]]
    out = near_ties.run(target, texts, [int(x) for x in args.sizes.split(",")], args.tokens, args.compare_stock,
                        args.threads, 999 if args.gpu else 0)
    return emit_result(out, args.json)


def cmd_prompts(args: argparse.Namespace) -> int:
    engine = open_engine(args) if args.name in ("docqa", "docqa-long") else None  # their tokenizer
    try:
        n = prompt_sets.write_prompt_set(args.name, args.out, engine)
    finally:
        if engine is not None:
            engine.close()
    print(f"wrote {n} prompts to {args.out}", file=sys.stderr)
    return 0
