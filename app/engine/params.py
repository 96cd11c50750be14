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
    # penalties (llama.cpp's): over the last repeat_last_n tokens of prompt and reply (-1: all, 0: none)
    presence_penalty: float = 0.0  # subtracted once from each token seen there (0: off)
    frequency_penalty: float = 0.0  # subtracted per time a token was seen there (0: off)
    repeat_penalty: float = 1.0  # a seen token's logit divided by it (multiplied, if negative) (1: off)
    repeat_last_n: int = 64  # llama.cpp's default window
    logit_bias: dict[int, float] = field(default_factory=dict)  # added to the logits of these token ids
    grammar: str | None = None  # GBNF the reply must follow (app.engine.grammar)
    logprobs: int | None = None  # each emitted token's log-probability and this many alternatives (None: off)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        return self.repeat_last_n != 0 and (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                                            or self.repeat_penalty != 1.0)

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
        for name in ("presence_penalty", "frequency_penalty"):
            _real(name, getattr(self, name), f"a number in -{PENALTY_MAX}..{PENALTY_MAX} (0: off)",
                  lambda v: -PENALTY_MAX <= v <= PENALTY_MAX)
        _real("repeat_penalty", self.repeat_penalty, f"a number in (0, {PENALTY_MAX}] (1: off)",
              lambda v: 0.0 < v <= PENALTY_MAX)
        _int("repeat_last_n", self.repeat_last_n, -1, MAX_TOKENS, "(-1: the whole context, 0: off)")
        if not isinstance(self.logit_bias, dict) or len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidParams(f"logit_bias must map at most {MAX_LOGIT_BIAS} token ids to numbers", "logit_bias")
        for tok, bias in self.logit_bias.items():
            _int("logit_bias token id", tok, 0, 2**31 - 1)
            _real("logit_bias", bias, "numbers in -100..100", lambda v: -100.0 <= v <= 100.0)
        if self.grammar is not None and not isinstance(self.grammar, str):
            raise InvalidParams("grammar must be a GBNF string", "grammar")
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, 0, MAX_TOP_LOGPROBS)
        if not isinstance(self.stop, list) or not all(isinstance(x, str) for x in self.stop):
            raise InvalidParams(f"stop must be a list of strings, got {self.stop!r:.60}")


class InvalidParams(FlashDeskError, ValueError):
    """A generation parameter out of its range; the message names it and the range (`param`: its name)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


# the ranges GenerationParams.validate allows (the server's schemas narrow temperature to OpenAI's 0..2)
MAX_TOKENS = 1 << 20
TEMPERATURE_MAX = 100.0
MAX_TOP_K = 1 << 24
MAX_DRAFT_MAX = 256
PENALTY_MAX = 100.0  # the server narrows presence and frequency to OpenAI's -2..2
MAX_LOGIT_BIAS = 1024
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


def _int(name: str, v: object, lo: int, hi: int, note: str = "") -> None:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidParams(f"{name} must be an integer in {lo}..{hi:,}{' ' + note if note else ''}, got {v!r:.60}",
                            name.split()[0])


def _real(name: str, v: object, allowed: str, ok: Callable[[float], bool]) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not ok(float(v)):
        raise InvalidParams(f"{name} must be {allowed}, got {v!r:.60}", name)
