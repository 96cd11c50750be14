"""How many tokens to draft at each step.

The engine asks `choose()` before each step and reports the outcome with
`observe()`. FixedDraftLength is upstream's behaviour; the adaptive
controller (app.engine.adaptive) picks k from measured costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class StepTiming:
    draft_s: float  # drafter pass (0 when k = 0)
    verify_s: float  # target pass over k+1 tokens, with readout
    step_s: float  # the whole step


class DraftPolicy(Protocol):
    # True: the engine reads the drafter's confidence in each draft and asks truncate()
    uses_confidence: bool

    def choose(self) -> int:
        """Draft length for the next step (0 = plain decoding)."""

    def truncate(self, confidence: np.ndarray) -> int:
        """How many of the drafted tokens to verify, given the drafter's probability of each."""

    def observe(self, k: int, accepted: int, timing: StepTiming) -> None:
        """What happened at the step that drafted k tokens."""


class FixedDraftLength:
    uses_confidence = False

    def __init__(self, k: int):
        self.k = max(0, int(k))

    def choose(self) -> int:
        return self.k

    def truncate(self, confidence: np.ndarray) -> int:
        return len(confidence)

    def observe(self, k: int, accepted: int, timing: StepTiming) -> None:
        pass
