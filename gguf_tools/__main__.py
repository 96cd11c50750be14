"""python -m gguf_tools {inspect,pair,convert,quantize,synth} ...

(The drafter trainer, which runs the engine, is `flashdesk distill`.)
"""

from __future__ import annotations

import sys

from gguf_tools import convert, inspect, pair, quantize, synth

COMMANDS = {"inspect": inspect.main, "pair": pair.main, "convert": convert.main, "quantize": quantize.main,
            "synth": synth.main}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        print("commands: " + ", ".join(COMMANDS), file=sys.stderr)
        return 2
    return int(COMMANDS[argv[0]](argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
