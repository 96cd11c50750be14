"""What a caller asks of one generation."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0: greedy
    top_k: int = 40  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    speculative: bool = True  # False: plain decoding through the same loop
    draft_max: int | None = None  # None: the drafter's block size - 1 (or the controller's choice)
    adaptive: bool = False  # draft length "auto": the controller chooses source and length per step

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.draft_max is not None and self.draft_max < 0:
            raise ValueError(f"draft_max must be >= 0, got {self.draft_max}")
