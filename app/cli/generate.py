"""`flashdesk generate`: one generation from the command line (text, or JSON with --json)."""

from __future__ import annotations

import argparse
import json
import sys

from app.chat.format import ChatMessage, prompt_format_of, with_format_stops
from app.cli.common import add_model_args, open_engine, read_prompt
from app.engine.controller import DRAFT_MODES, policy_for_mode
from app.engine.params import GenerationParams


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="one generation (JSON with --json)")
    add_model_args(g)
    g.add_argument("--prompt", help="prompt text (default: stdin)")
    g.add_argument("--chat", action="store_true",
                   help="send the prompt as a user turn in the model's chat format (its template, or the app's "
                        "plain format)")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--no-spec", action="store_true", help="plain decoding (the baseline)")
    g.add_argument("--draft-mode", choices=DRAFT_MODES, default="hybrid",
                   help="hybrid (default, as the app): the context lookup, the DFlash drafter or plain decoding, "
                        "step by step, by expected tokens/s; adaptive: DFlash's draft length so chosen; "
                        "fixed: DFlash's block (or --draft-max) every step; lookup: the lookup's draft of "
                        "--draft-max tokens; draft-model: the --draft-model's drafts (k chosen step by step, or "
                        "--draft-max every step); mtp: the same from the target's own MTP head (Qwen3.5/3.6 "
                        "GGUFs carry one); eagle3: the same from an EAGLE-3 --drafter; dflash2, dspark: fixed, refused "
                        "unless the --drafter is of that format; plain")
    g.add_argument("--draft-max", type=int, default=None,
                   help="draft length of the fixed and lookup modes (default: block size - 1; lookup 3)")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    # every parameter is checked before a model loads (InvalidParams: one line, exit code 2)
    params = GenerationParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, min_p=args.min_p, seed=args.seed,
                              stop=[read_prompt(s) for s in args.stop or []],
                              speculative=not args.no_spec, draft_max=args.draft_max)
    params.validate()
    text = read_prompt(args.prompt)
    engine = open_engine(args)
    try:
        if args.chat:
            fmt = prompt_format_of(engine.target)
            text = fmt.render([ChatMessage("user", text)])
            params.stop = with_format_stops(fmt.stop, params.stop)
        prompt = engine.tokenize(text)
        policy = policy_for_mode(engine, "plain" if args.no_spec else args.draft_mode, args.draft_max)
        echo = None if args.json else (lambda t: print(t, end="", flush=True))
        done = engine.complete(prompt, params, policy=policy, on_text=echo)
        st = done.stats
        if args.json:
            print(json.dumps({"text": done.text, "prompt_tokens": prompt, "tokens": done.tokens,
                              "stats": st.to_dict(), "finish_reason": done.finish_reason,
                              "draft_mode": "plain" if args.no_spec else args.draft_mode,
                              "drafter_window": engine.drafter_window}))
        else:
            print(f"\n[{st.n_generated} tokens, {st.tokens_per_s:.1f} tok/s, tau {st.tau:.2f}, {done.finish_reason}]",
                  file=sys.stderr)
    finally:
        engine.close()
    return 0
