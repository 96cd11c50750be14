"""Acceptance and timing statistics that travel with every generation event."""

from __future__ import annotations

from dataclasses import dataclass, field

_HISTORIES = ("k_history", "accepted_history", "step_s_history", "source_history")
DRAFT_SOURCES = ("lookup", "dflash")  # app.engine.draft_policy's sources that draft


def _per_source(names: tuple[str, ...] = DRAFT_SOURCES) -> dict[str, int]:
    return dict.fromkeys(names, 0)


@dataclass
class GenerationStats:
    block_size: int = 16
    n_prompt: int = 0
    n_prompt_reused: int = 0  # prompt tokens whose KV came from the previous turn
    n_generated: int = 0
    steps: int = 0  # verify passes
    spec_steps: int = 0  # verify passes that checked at least one drafted token
    drafted: int = 0
    accepted: int = 0
    # per block position 1..block_size-1: how often a draft was proposed / accepted there
    draft_by_pos: list[int] = field(default_factory=list)
    accept_by_pos: list[int] = field(default_factory=list)
    k_history: list[int] = field(default_factory=list)  # draft length chosen at each step
    accepted_history: list[int] = field(default_factory=list)  # accepted drafts at each step
    step_s_history: list[float] = field(default_factory=list)  # wall time of each step (draft + verify + sync)
    source_history: list[str] = field(default_factory=list)  # where each step's drafts came from
    # per draft source: steps that drafted from it, tokens drafted, drafts accepted
    steps_by_source: dict[str, int] = field(default_factory=_per_source)
    drafted_by_source: dict[str, int] = field(default_factory=_per_source)
    accepted_by_source: dict[str, int] = field(default_factory=_per_source)
    t_prefill_s: float = 0.0
    t_draft_s: float = 0.0  # drafter pass (+ its readout and cache trim)
    t_verify_s: float = 0.0  # target pass over [anchor, drafts] + readout / sampling
    t_inject_s: float = 0.0  # feeding target features to the drafter
    t_lookup_s: float = 0.0  # the context lookup: its index kept up, its query each step
    t_llama_s: float = 0.0  # all time inside llama.cpp calls during decoding
    t_decode_s: float = 0.0  # wall time of the decode loop (after prefill)
    t_total_s: float = 0.0

    def __post_init__(self) -> None:
        n = max(self.block_size - 1, 0)
        if not self.draft_by_pos:
            self.draft_by_pos = [0] * n
        if not self.accept_by_pos:
            self.accept_by_pos = [0] * n

    def record_step(self, source: str, k: int, a: int, n_emitted: int, step_s: float = 0.0) -> None:
        """One step that verified k drafts from `source` ("plain" when k = 0) and accepted a."""
        self.steps += 1
        self.step_s_history.append(step_s)
        self.source_history.append(source)
        self.n_generated += n_emitted
        self.k_history.append(k)
        self.accepted_history.append(a)
        if k > 0:
            self.spec_steps += 1
            self.drafted += k
            self.accepted += a
            self.steps_by_source[source] = self.steps_by_source.get(source, 0) + 1
            self.drafted_by_source[source] = self.drafted_by_source.get(source, 0) + k
            self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + a
            for j in range(min(k, len(self.draft_by_pos))):
                self.draft_by_pos[j] += 1
            for j in range(min(a, len(self.accept_by_pos))):
                self.accept_by_pos[j] += 1

    @property
    def tau(self) -> float:
        """Mean acceptance length: tokens per verify pass (accepted drafts + 1)."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def tau_spec(self) -> float:
        """tau over the steps that drafted (what the drafter achieves when used)."""
        return (self.accepted + self.spec_steps) / self.spec_steps if self.spec_steps else 0.0

    @property
    def tau_by_source(self) -> dict[str, float]:
        """tau over the steps that drafted from each source."""
        return {s: (self.accepted_by_source.get(s, 0) + n) / n if n else 0.0
                for s, n in self.steps_by_source.items()}

    @property
    def token_share(self) -> dict[str, float]:
        """The share of the generated tokens each produced: "target" (one per step: its own choice
        after the accepted drafts) and each draft source (its accepted drafts)."""
        n = self.n_generated
        if not n:
            return {}
        share = {"target": self.steps / n}
        share.update({s: a / n for s, a in self.accepted_by_source.items()})
        return share

    @property
    def acceptance_rate_by_pos(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accept_by_pos, self.draft_by_pos)]

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.t_decode_s if self.t_decode_s > 0 else 0.0

    @property
    def host_share(self) -> float:
        """Share of decode time spent outside llama.cpp calls (Python overhead)."""
        return (self.t_decode_s - self.t_llama_s) / self.t_decode_s if self.t_decode_s > 0 else 0.0

    def to_dict(self, history: bool = False) -> dict:
        """The one serialisation of these stats (stored with messages, printed by the CLI, written
        by the bench): every field, floats rounded, plus the derived rates. The per-step
        histories only with `history` (they grow with the reply; a UI writes this every step)."""
        d: dict = {}
        for name in self.__dataclass_fields__:
            if name in _HISTORIES and not history:
                continue
            v = getattr(self, name)
            d[name] = list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) \
                else round(v, 6) if isinstance(v, float) else v
        if history:
            d["step_s_history"] = [round(x, 6) for x in self.step_s_history]
        d.update(tau=round(self.tau, 4), tau_spec=round(self.tau_spec, 4),
                 tokens_per_s=round(self.tokens_per_s, 3), host_share=round(self.host_share, 5),
                 tau_by_source={s: round(t, 4) for s, t in self.tau_by_source.items()},
                 token_share={s: round(t, 4) for s, t in self.token_share.items()},
                 acceptance_rate_by_pos=[round(x, 4) for x in self.acceptance_rate_by_pos])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> GenerationStats:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})
