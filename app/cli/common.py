"""What the model-running subcommands share: the model options and opening the pair."""

from __future__ import annotations

import argparse
import sys

from app.engine.dflash import DRAFTER_WINDOW, Engine
from app.session.models import DEVICE_CPU, DEVICE_GPU, load_engine, resolve_spec


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", help="target GGUF (default: the bundled Gemma 3 270M)")
    p.add_argument("--drafter", help="DFlash (v1, DFlash2, DSpark) or EAGLE-3 drafter GGUF (default: the bundled "
                                      "drafter with the bundled target)")
    p.add_argument("--no-drafter", action="store_true", help="load no drafter")
    p.add_argument("--draft-model", help="a classic draft model GGUF sharing the target's vocabulary (a small "
                                         "model of the same family; the draft-model and hybrid modes use it)")
    p.add_argument("--no-mtp", action="store_true",
                   help="leave the target's own MTP head unused (default: a target that carries one drafts with it)")
    p.add_argument("--ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    p.add_argument("--gpu", action="store_true", help="place the layers on the GPUs (the split planner's plan)")
    p.add_argument("--drafter-window", type=_window, default=None,
                   help="the DFlash drafter attends to the last N injected positions only (default: the span it was "
                        f"trained on, where its file says, else {DRAFTER_WINDOW} as DFlash2; 0: the whole context)")


def _window(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n}: expected 0 (unbounded) or a positive count")
    return n


def open_engine(args: argparse.Namespace) -> Engine:
    """The pair the options name, loaded the way the app loads it (session.models)."""
    spec = resolve_spec(args.target, args.drafter, args.no_drafter, n_ctx=args.ctx, n_threads=args.threads,
                        device=DEVICE_GPU if args.gpu else DEVICE_CPU, draft_model=args.draft_model,
                        mtp=not args.no_mtp)
    engine = load_engine(spec)
    engine.set_drafter_window(args.drafter_window)
    return engine


def read_prompt(text: str | None) -> str:
    """The prompt from --prompt, or stdin when none was given; bytes that are not UTF-8 (in either)
    become U+FFFD instead of an exception."""
    if text is None:
        return sys.stdin.buffer.read().decode("utf-8", "replace")
    # argv is decoded with surrogateescape: undo it and decode leniently
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
