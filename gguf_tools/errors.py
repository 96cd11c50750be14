"""The base of FlashDesk's user-facing errors, and those about GGUF files.

Defined at the lowest layer that raises them (reading and checking GGUF
files); app.errors builds the application's errors on the same base, so a
UI that catches FlashDeskError shows every one of them.
"""

from __future__ import annotations

# a user-facing message never quotes more of a file than this (a corrupt length can make a "name" megabytes long)
EXCERPT_CHARS = 60
# and never grows past this, whatever it quotes
MESSAGE_MAX_CHARS = 2000


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """repr() of a value read from a file, cut to `limit` characters with the full length said."""
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        size = f"{len(value):,} characters"
    elif isinstance(value, bytes):
        size = f"{len(value):,} bytes"
    elif isinstance(value, list | tuple):
        size = f"{len(value):,} items"
    else:
        size = f"{len(text):,} characters"
    return f"{text[:limit]}... ({size} in all)"


def _bounded(msg: str) -> str:
    if len(msg) <= MESSAGE_MAX_CHARS:
        return msg
    return f"{msg[:MESSAGE_MAX_CHARS - 200]} [... {len(msg):,} characters in all ...] {msg[-150:]}"


class FlashDeskError(Exception):
    """Base class: the message is meant for the user as is."""


class ModelLoadError(FlashDeskError):
    """A GGUF file could not be loaded (missing, truncated, corrupt, unsupported)."""

    def __init__(self, msg: str):
        super().__init__(_bounded(str(msg)))


class PairMismatch(FlashDeskError):
    """A drafter does not fit its target; `problems` lists every reason."""

    def __init__(self, target: str, drafter: str, problems: list[str]):
        self.target = target
        self.drafter = drafter
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"drafter {drafter} does not match target {target}:\n{lines}")
