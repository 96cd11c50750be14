"""`flashdesk distill` (train a drafter) and `flashdesk quant-tau` (acceptance per quantization).

Each keeps its own options (`flashdesk distill --help`); the trainer needs
the `distill` extra (PyTorch), imported only when it runs.
"""

from __future__ import annotations

import argparse

from app.distill import quant_tau


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("distill", help="train a DFlash drafter for a target by self-distillation",
                       add_help=False, prefix_chars="\0")  # every argument goes to the pipeline's own parser
    d.add_argument("args", nargs=argparse.REMAINDER)
    d.set_defaults(func=cmd_distill)
    q = sub.add_parser("quant-tau", help="a drafter's acceptance at several quantizations (JSON lines)",
                       add_help=False, prefix_chars="\0")
    q.add_argument("args", nargs=argparse.REMAINDER)
    q.set_defaults(func=cmd_quant_tau)


def cmd_distill(args: argparse.Namespace) -> int:
    from app.distill.pipeline import main  # noqa: PLC0415 - PyTorch loads only for this command

    return main(args.args)


def cmd_quant_tau(args: argparse.Namespace) -> int:
    return quant_tau.main(args.args)
