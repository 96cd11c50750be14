"""What the stats panel shows, computed from GenerationStats (the panel only draws it)."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field

from app.engine.draft_policy import SOURCES
from app.engine.stats import GenerationStats


@dataclass
class ReplySummary:
    """One reply, and the running totals of its conversation including it."""
    tau: float = 0.0
    tokens_per_s: float = 0.0
    speedup: float | None = None  # vs the measured plain baseline; None when none was measured
    tau_running: float = 0.0
    tokens_per_s_running: float = 0.0
    speedup_running: float | None = None
    baseline_tokens_per_s: float | None = None
    baseline_source: str = ""
    t_draft_s: float = 0.0
    t_verify_s: float = 0.0
    t_inject_s: float = 0.0
    t_other_s: float = 0.0  # decode wall time not spent drafting, verifying or injecting (host side)
    drafted: int = 0
    accepted: int = 0
    n_generated: int = 0
    acceptance_by_pos: list[float] = field(default_factory=list)
    drafts_by_pos: list[int] = field(default_factory=list)
    # per draft source (app.engine.draft_policy.SOURCES): drafted, accepted, tau over its steps; and the share
    # of the reply's tokens each source (and "target": the target's own token of each step) produced
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    tau_by_source: dict[str, float] = field(default_factory=dict)
    token_share: dict[str, float] = field(default_factory=dict)
    # what a source is called where the loaded files decide it (draft_sources.source_labels): the dflash source
    # running a DFlash2 drafter is "DFlash2 drafter"; stored with the reply, so a reply read later keeps its name
    source_labels: dict[str, str] = field(default_factory=dict)

    @property
    def sources_used(self) -> list[str]:
        """The draft sources that drafted in this reply, in a fixed order."""
        return [s for s in SOURCES if self.drafted_by_source.get(s)]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> ReplySummary:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in (d or {}).items() if k in names})


@dataclass
class RunningTotals:
    """Sums over a conversation's finished replies (tau and tokens/s are ratios of sums)."""
    tokens: int = 0  # accepted + steps: the tokens that verify passes produced
    steps: int = 0
    generated: int = 0
    decode_s: float = 0.0

    def add(self, st: GenerationStats) -> None:
        self.tokens += st.accepted + st.steps
        self.steps += st.steps
        self.generated += st.n_generated
        self.decode_s += st.t_decode_s


def summarize(st: GenerationStats, before: RunningTotals, baseline_tps: float | None,
              baseline_source: str = "", source_labels: dict[str, str] | None = None) -> ReplySummary:
    """The reply's numbers and the running ones (previous replies + this one)."""
    tot = RunningTotals(before.tokens, before.steps, before.generated, before.decode_s)
    tot.add(st)
    tps = st.tokens_per_s
    tps_run = tot.generated / tot.decode_s if tot.decode_s > 0 else 0.0
    base = baseline_tps if baseline_tps and baseline_tps > 0 else None
    other = max(0.0, st.t_decode_s - st.t_draft_s - st.t_verify_s - st.t_inject_s)
    return ReplySummary(
        tau=st.tau, tokens_per_s=tps, speedup=(tps / base) if base and tps > 0 else None,
        tau_running=tot.tokens / tot.steps if tot.steps else 0.0, tokens_per_s_running=tps_run,
        speedup_running=(tps_run / base) if base and tps_run > 0 else None,
        baseline_tokens_per_s=base, baseline_source=baseline_source,
        t_draft_s=st.t_draft_s, t_verify_s=st.t_verify_s, t_inject_s=st.t_inject_s, t_other_s=other,
        drafted=st.drafted, accepted=st.accepted, n_generated=st.n_generated,
        acceptance_by_pos=list(st.acceptance_rate_by_pos), drafts_by_pos=list(st.draft_by_pos),
        drafted_by_source=dict(st.drafted_by_source), accepted_by_source=dict(st.accepted_by_source),
        tau_by_source=st.tau_by_source, token_share=st.token_share, source_labels=dict(source_labels or {}))


class RateSeries:
    """Tokens/s over time: the rate over a short sliding window, one sample per step."""

    def __init__(self, window_s: float = 0.3, max_points: int = 240):
        self._window_s = window_s
        self._recent: deque[tuple[float, int]] = deque()
        self.points: list[float] = []
        self._max = max_points

    def add(self, t_decode_s: float, n_generated: int) -> None:
        self._recent.append((t_decode_s, n_generated))
        # keep at least two samples, drop those older than the window
        while len(self._recent) > 2 and t_decode_s - self._recent[1][0] >= self._window_s:
            self._recent.popleft()
        t0, n0 = self._recent[0] if len(self._recent) > 1 else (0.0, 0)
        dt = t_decode_s - t0
        self.points.append((n_generated - n0) / dt if dt > 0 else 0.0)
        if len(self.points) > self._max:
            # halve the resolution instead of dropping the start: the whole reply stays visible
            self.points = self.points[::2]
