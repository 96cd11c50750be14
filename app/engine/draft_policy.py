"""How many tokens to draft at each step.

The engine asks `choose()` before each step and reports the outcome with
`observe()`. FixedDraftLength is upstream's behaviour; the adaptive
controller (app.engine.adaptive) picks k from measured costs.
"""

from __future__ import annotations

from typing import Protocol


class DraftPolicy(Protocol):
    def choose(self) -> int:
        """Draft length for the next step (0 = plain decoding)."""

    def observe(self, k: int, accepted: int, t_step_s: float, t_llama_s: float) -> None:
        """What happened at the step that drafted k tokens."""


class FixedDraftLength:
    def __init__(self, k: int):
        self.k = max(0, int(k))

    def choose(self) -> int:
        return self.k

    def observe(self, k: int, accepted: int, t_step_s: float, t_llama_s: float) -> None:
        pass
