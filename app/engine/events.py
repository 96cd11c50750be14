"""What the engine yields: one event per decode step, and a whole completion."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.engine.stats import GenerationStats

if TYPE_CHECKING:
    from app.engine.sampling import TokenLogprob

FINISH_STOP = "stop"  # end-of-generation token or a stop string
FINISH_LENGTH = "length"  # max tokens reached
FINISH_CANCELLED = "cancelled"


@dataclass
class GenerationEvent:
    text: str  # newly visible text (may be empty while a stop string is pending)
    tokens: list[int]  # tokens emitted this step
    drafted: list[bool]  # per token: True if it came from an accepted draft
    stats: GenerationStats  # running stats of this generation (same object each event)
    finish_reason: str | None = None  # set on the last event
    source: str = "plain"  # where this step's drafts came from (app.engine.draft_policy)
    logprobs: list[TokenLogprob] | None = None  # per token, when GenerationParams.logprobs asks

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Completion:
    """A whole generation, collected (Engine.complete)."""
    tokens: list[int]  # every emitted token, stop string and EOS included as decoded
    text: str  # the visible text (without a stop string)
    stats: GenerationStats
    finish_reason: str | None
