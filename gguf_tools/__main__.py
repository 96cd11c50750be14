"""python -m gguf_tools {inspect,pair,convert,quantize,synth} ...

(The drafter trainer, which runs the engine, is `flashdesk distill`.)
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "inspect": "gguf_tools.inspect",
    "pair": "gguf_tools.pair",
    "convert": "gguf_tools.convert",
    "quantize": "gguf_tools.quantize",
    "synth": "gguf_tools.synth",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        print("commands: " + ", ".join(COMMANDS), file=sys.stderr)
        return 2
    mod = importlib.import_module(COMMANDS[argv[0]])
    return int(mod.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
