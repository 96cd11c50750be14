"""The `flashdesk` command.

    flashdesk                      start the desktop app on the bundled pair
    flashdesk generate ...         one generation, JSON out
    flashdesk bench ...            plain vs DFlash over a prompt file, JSON out
    flashdesk calibrate            verify/draft pass costs for 1..16 tokens, JSON out
    flashdesk doctor [--json]      the native build, its taps, the devices
    flashdesk prompts humaneval    write the HumanEval prompt set as JSONL

Other subcommands (plan, docs) register themselves in COMMANDS below.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.errors import FlashDeskError


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="target GGUF (default: the bundled Gemma 3 270M)")
    p.add_argument("--drafter", help="DFlash drafter GGUF (default: the bundled drafter)")
    p.add_argument("--no-drafter", action="store_true", help="load no drafter")
    p.add_argument("--ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")


def _open_engine(args: argparse.Namespace):  # noqa: ANN202
    from app.bundled import default_drafter, default_target
    from app.engine.dflash import Engine, EngineConfig

    target = Path(args.target) if args.target else default_target()
    drafter = None
    if not args.no_drafter:
        drafter = Path(args.drafter) if args.drafter else (default_drafter() if not args.target else None)
    return Engine(target, drafter, EngineConfig(n_ctx=args.ctx, n_threads=args.threads))


def cmd_generate(args: argparse.Namespace) -> int:
    from app.engine.params import GenerationParams
    from app.engine.prompt_format import PLAIN_STOP, ChatMessage, render_plain

    engine = _open_engine(args)
    text = args.prompt if args.prompt is not None else sys.stdin.read()
    stop = list(args.stop or [])
    if args.chat:
        text = render_plain([ChatMessage("user", text)])
        stop += PLAIN_STOP
    params = GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, min_p=args.min_p, seed=args.seed, stop=stop,
                              speculative=not args.no_spec, draft_max=args.draft_max)
    prompt = engine.tokenize(text)
    tokens: list[int] = []
    out = ""
    ev = None
    policy = None
    if args.adaptive and engine.has_drafter and not args.no_spec:
        from app.engine.adaptive import new_adaptive_policy
        policy = new_adaptive_policy(engine)
    for ev in engine.generate(prompt, params, policy=policy):
        tokens += ev.tokens
        out += ev.text
        if not args.json:
            print(ev.text, end="", flush=True)
    st = ev.stats
    if args.json:
        stats = {"steps": st.steps, "drafted": st.drafted, "accepted": st.accepted, "tau": round(st.tau, 4),
                 "accept_by_pos": st.accept_by_pos, "t_draft_s": round(st.t_draft_s, 6),
                 "t_verify_s": round(st.t_verify_s, 6), "t_inject_s": round(st.t_inject_s, 6),
                 "t_prefill_s": round(st.t_prefill_s, 6), "t_total_s": round(st.t_total_s, 6),
                 "tokens_per_s": round(st.tokens_per_s, 3), "host_share": round(st.host_share, 5),
                 "n_prompt": st.n_prompt, "n_generated": st.n_generated}
        print(json.dumps({"text": out, "prompt_tokens": prompt, "tokens": tokens, "stats": stats,
                          "finish_reason": ev.finish_reason,
                          "speculative": params.speculative and engine.has_drafter}))
    else:
        print(f"\n[{st.n_generated} tokens, {st.tokens_per_s:.1f} tok/s, tau {st.tau:.2f}, {ev.finish_reason}]",
              file=sys.stderr)
    engine.close()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from app import bench

    engine = _open_engine(args)
    prompts = bench.load_prompts(args.prompts, args.limit)
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    result = bench.bench(engine, prompts, modes, max_tokens=args.max_tokens, draft_max=args.draft_max,
                         check=not args.no_check, progress=bench.log,
                         partial=(lambda r: bench.write_json(r, args.json)) if args.json else None)
    result["target"] = str(engine.target.path)
    result["drafter"] = str(engine.drafter.path) if engine.drafter else None
    if args.json:
        bench.write_json(result, args.json)
        bench.log(f"wrote {args.json}")
    if args.plot:
        from app.bench_plot import plot_bench
        plot_bench(result, args.plot)
        bench.log(f"wrote {args.plot}")
    print(json.dumps(result["summary"], indent=2))
    engine.close()
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from app.engine.calibration import calibrate

    engine = _open_engine(args)
    cm = calibrate(engine, use_cache=not args.fresh)
    rel = cm.relative_verify()
    print(json.dumps({"target": str(engine.target.path),
                      "drafter": str(engine.drafter.path) if engine.drafter else None,
                      "plain_tokens_per_s": round(cm.plain_tokens_per_s, 3),
                      "verify_ms": [round(x * 1e3, 3) for x in cm.verify_s[1:]],
                      "verify_relative": [round(x, 3) for x in rel],
                      "draft_ms": [round(x * 1e3, 3) for x in cm.draft_s[1:]],
                      "draft_relative_to_plain_step": [round(x / cm.verify_s[1], 3) for x in cm.draft_s[1:]],
                      "inject_ms_per_token": round(cm.inject_s * 1e3, 4)}, indent=2))
    engine.close()
    return 0


def cmd_verify_cost(args: argparse.Namespace) -> int:
    from app import bench_verify
    from app.bundled import default_target

    target = Path(args.target) if args.target else default_target()
    sizes = [int(x) for x in args.sizes.split(",")]
    out = bench_verify.run(target, sizes, args.rounds, args.compare_stock, args.threads)
    text = json.dumps(out, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    if args.plot:
        from app.bench_plot import plot_verify_cost
        plot_verify_cost(out, args.plot)
    print(text)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from app.doctor import doctor_report

    rep = doctor_report()
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        for k, v in rep.items():
            print(f"{k}: {v}")
    return 0 if rep.get("ok") else 1


def cmd_prompts(args: argparse.Namespace) -> int:
    from app.prompt_sets import write_prompt_set

    n = write_prompt_set(args.name, args.out)
    print(f"wrote {n} prompts to {args.out}", file=sys.stderr)
    return 0


def cmd_app(args: argparse.Namespace) -> int:
    from app.ui.main import run_app

    return run_app(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="flashdesk", description="Fast local chat through DFlash speculative decoding.")
    # the desktop app's options (used when no subcommand is given)
    ap.add_argument("--data-dir", help="where the app keeps its database (default: the user data directory)")
    ap.add_argument("--headless", action="store_true", help="no window: a short generation on the bundled pair")
    ap.add_argument("--report-startup", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quit-after", type=float, default=None, help=argparse.SUPPRESS)
    sub = ap.add_subparsers(dest="cmd")

    g = sub.add_parser("generate", help="one generation (JSON with --json)")
    _add_model_args(g)
    g.add_argument("--prompt", help="prompt text (default: stdin)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the app's chat format")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--no-spec", action="store_true", help="plain decoding (the baseline)")
    g.add_argument("--draft-max", type=int, default=None, help="fixed draft length (default: block size - 1)")
    g.add_argument("--adaptive", action="store_true", help="choose the draft length per step from measured costs")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="plain vs DFlash over a JSONL prompt file")
    _add_model_args(b)
    b.add_argument("--prompts", required=True, help="JSONL with id, prompt, optional category and format")
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--draft-max", type=int, default=None)
    b.add_argument("--mode", default="plain,fixed", help="comma list of plain,fixed,adaptive")
    b.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    b.add_argument("--no-check", action="store_true", help="skip the teacher-forced lossless check")
    b.add_argument("--json", help="write full results here")
    b.add_argument("--plot", help="write a PNG plot here")
    b.set_defaults(func=cmd_bench)

    v = sub.add_parser("verify-cost", help="steady-state cost of a target pass of n tokens (JSON)")
    v.add_argument("--target", help="target GGUF (default: the bundled Gemma 3 270M)")
    v.add_argument("--sizes", default="1,2,3,4,5,6,7,8,12,16", help="token counts n (default 1..8,12,16)")
    v.add_argument("--rounds", type=int, default=10, help="rounds over all sizes (default 10)")
    v.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    v.add_argument("--compare-stock", action="store_true",
                   help="also measure llama.cpp's stock CPU kernels (same build, kernels switched off)")
    v.add_argument("--json", help="also write the result to this file")
    v.add_argument("--plot", help="also draw it to this PNG")
    v.set_defaults(func=cmd_verify_cost)

    c = sub.add_parser("calibrate", help="measure verify and draft costs for 1..16 tokens (JSON)")
    _add_model_args(c)
    c.add_argument("--fresh", action="store_true", help="measure again instead of reading the cache")
    c.set_defaults(func=cmd_calibrate)

    d = sub.add_parser("doctor", help="the native build, its taps and devices")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_doctor)

    p = sub.add_parser("prompts", help="write a bundled prompt set as JSONL")
    p.add_argument("name", help="humaneval | low-acceptance | distill-eval")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_prompts)

    for register in _extra_commands():
        register(sub)
    return ap


def _extra_commands() -> list:
    """Subcommands owned by other packages (scheduler, documents, ...)."""
    regs = []
    for mod_name in ("app.scheduler.cli", "app.documents.cli", "app.hub.cli"):
        try:
            mod = __import__(mod_name, fromlist=["register"])
        except ModuleNotFoundError as e:
            if e.name and mod_name.startswith(e.name):
                continue
            raise
        regs.append(mod.register)
    return regs


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        if args.cmd is None:
            return cmd_app(args)
        return int(args.func(args) or 0)
    except FlashDeskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
