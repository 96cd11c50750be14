"""What a caller asks of one generation."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from app.errors import FlashDeskError


@dataclass
class GenerationParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_k: int = 40  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    seed: int = 0
    stop: list[str] = field(default_factory=list)  # any one ends the reply; the first is how a reply usually ends
    speculative: bool = True  # False: plain decoding through the same loop
    draft_max: int | None = None  # None: the drafter's block size - 1 (or the controller's choice)
    adaptive: bool = False  # draft length "auto": the controller chooses source and length per step

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        """Raises InvalidParams (a ValueError and a FlashDeskError) naming the first bad parameter and
        its allowed range: the one check the CLI, the app and the server make before generating."""
        _int("max_tokens", self.max_tokens, 1, MAX_TOKENS)
        _real("temperature", self.temperature, f"a number in 0..{TEMPERATURE_MAX} (0: greedy)",
              lambda v: 0.0 <= v <= TEMPERATURE_MAX)
        _real("top_p", self.top_p, "a number in (0, 1] (1: off)", lambda v: 0.0 < v <= 1.0)
        _real("min_p", self.min_p, "a number in [0, 1) (0: off)", lambda v: 0.0 <= v < 1.0)
        _int("top_k", self.top_k, 0, MAX_TOP_K, "(0: off)")
        _int("seed", self.seed, 0, 2**64 - 1)
        if self.draft_max is not None:
            _int("draft_max", self.draft_max, 0, MAX_DRAFT_MAX)
        if not isinstance(self.stop, list) or not all(isinstance(x, str) for x in self.stop):
            raise InvalidParams(f"stop must be a list of strings, got {self.stop!r:.60}")


class InvalidParams(FlashDeskError, ValueError):
    """A generation parameter out of its range; the message names it and the range."""


# the ranges GenerationParams.validate allows (the server's schemas narrow temperature to OpenAI's 0..2)
MAX_TOKENS = 1 << 20
TEMPERATURE_MAX = 100.0
MAX_TOP_K = 1 << 24
MAX_DRAFT_MAX = 256


def _int(name: str, v: object, lo: int, hi: int, note: str = "") -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidParams(f"{name} must be an integer in {lo}..{hi:,}{' ' + note if note else ''}, got {v!r:.60}")


def _real(name: str, v: object, allowed: str, ok: Callable[[float], bool]) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not ok(float(v)):
        raise InvalidParams(f"{name} must be {allowed}, got {v!r:.60}")
