"""The base of FlashDesk's user-facing errors, and those about GGUF files.

Defined at the lowest layer that raises them (reading and checking GGUF
files); app.errors builds the application's errors on the same base, so a
UI that catches FlashDeskError shows every one of them.
"""

from __future__ import annotations


class FlashDeskError(Exception):
    """Base class: the message is meant for the user as is."""


class ModelLoadError(FlashDeskError):
    """A GGUF file could not be loaded (missing, truncated, corrupt, unsupported)."""


class PairMismatch(FlashDeskError):
    """A drafter does not fit its target; `problems` lists every reason."""

    def __init__(self, target: str, drafter: str, problems: list[str]):
        self.target = target
        self.drafter = drafter
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"drafter {drafter} does not match target {target}:\n{lines}")
