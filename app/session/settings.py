"""Generation settings a user picks (globally or per chat) and how they map to GenerationParams."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from app.engine.params import GenerationParams
from app.errors import FlashDeskError

AUTO = "auto"
MAX_DRAFT = 15


class SettingsError(FlashDeskError):
    pass


@dataclass
class ChatSettings:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    max_tokens: int = 256
    speculative: bool = True
    draft_length: str | int = AUTO  # "auto" (adaptive) or a fixed 1..15

    @classmethod
    def from_dict(cls, d: dict | None) -> ChatSettings:
        """Known keys only; a bad value falls back to the default (settings come from disk)."""
        out = cls()
        for f in fields(cls):
            if d and f.name in d:
                old = getattr(out, f.name)
                setattr(out, f.name, d[f.name])
                try:
                    out.validate()
                except SettingsError:
                    setattr(out, f.name, old)
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    def merged(self, overrides: dict | None) -> ChatSettings:
        """These settings with a chat's overrides on top."""
        return ChatSettings.from_dict({**self.to_dict(), **(overrides or {})})

    def diff(self, base: ChatSettings) -> dict:
        """The keys where these settings differ from `base` (what a per-chat override stores)."""
        b = base.to_dict()
        return {k: v for k, v in self.to_dict().items() if b.get(k) != v}

    @property
    def adaptive(self) -> bool:
        return self.draft_length == AUTO

    def validate(self) -> None:
        if self.draft_length != AUTO and not (isinstance(self.draft_length, int)
                                               and 1 <= self.draft_length <= MAX_DRAFT):
            raise SettingsError(f"draft length must be 'auto' or 1..{MAX_DRAFT}, got {self.draft_length!r}")
        try:
            self.to_params([]).validate()
        except (ValueError, TypeError) as e:
            raise SettingsError(str(e)) from e

    def to_params(self, stop: list[str]) -> GenerationParams:
        return GenerationParams(
            max_tokens=int(self.max_tokens), temperature=float(self.temperature), top_k=int(self.top_k),
            top_p=float(self.top_p), min_p=float(self.min_p), seed=int(self.seed), stop=list(stop),
            speculative=bool(self.speculative),
            draft_max=None if self.adaptive else int(self.draft_length), adaptive=self.adaptive)
