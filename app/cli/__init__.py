"""The `flashdesk` command.

    flashdesk                      start the desktop app on the bundled pair
    flashdesk generate ...         one generation, JSON out
    flashdesk bench ...            plain vs DFlash over a prompt file, JSON out
    flashdesk verify-cost          what a target pass of n tokens costs, JSON out
    flashdesk context-cost         a loop step's costs by context length (2k-32k), JSON out
    flashdesk calibrate            the cost model of speculation, measured in the loop, JSON out
    flashdesk doctor [--json]      the native build, its CPU variant, taps and devices
    flashdesk prompts NAME         write a prompt set as JSONL (humaneval, chat, docqa, docqa-long, ...)
    flashdesk plan ...             a layer split across GPUs
    flashdesk models ...           the model catalog and downloads
    flashdesk docs ...             document collections and questions
    flashdesk distill ...          train a drafter; quant-tau: its acceptance per quantization
    flashdesk serve ...            an OpenAI-compatible server on 127.0.0.1
    flashdesk serve-bench ...      tokens/s through the server vs Engine.complete, JSON out

One module per command group registers its subcommands here.
"""

from __future__ import annotations

import argparse
import sys

from app.cli import bench, distill, docs, doctor, generate, models, plan, serve
from app.errors import FlashDeskError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="flashdesk", description="Fast local chat through DFlash speculative decoding.")
    # the desktop app's options (used when no subcommand is given)
    ap.add_argument("--data-dir", help="where the app keeps its database (default: the user data directory)")
    ap.add_argument("--headless", action="store_true", help="no window: a short generation on the bundled pair")
    ap.add_argument("--report-startup", action="store_true",
                    help="print the time to the first window as JSON (scripts/measure_app.py)")
    ap.add_argument("--quit-after", type=float, default=None, metavar="SECONDS",
                    help="close the window after this many seconds (measurements, screenshots)")
    sub = ap.add_subparsers(dest="cmd")
    for group in (generate, bench, doctor, plan, models, docs, distill, serve):
        group.register(sub)
    return ap


def cmd_app(args: argparse.Namespace) -> int:
    from app.ui.main import run_app  # noqa: PLC0415 - Qt loads only for the app: the other commands start without it

    return run_app(args)


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
