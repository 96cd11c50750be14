"""The cost model of speculation: how long a verify pass of n tokens and a
drafter pass of k drafts take on this machine, for this pair and build.

Measured by running the decode loop itself (Engine.generate with a fixed
draft length k, for every k, round-robin so that drift on a busy machine hits
every k alike): the costs are those of the loop's steady state, with
llama.cpp's compute graph reused from step to step as it is while k stays
put, both models alternating as they do. Cached on disk per (models, build,
threads), and refreshed while running from the step timings the engine
reports (an exponential moving average per size).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from app.engine.dflash import Engine
from app.engine.draft_policy import FixedDraftLength, StepTiming
from app.engine.params import GenerationParams
from native.lib import build_info

# the tokens do not change a pass's cost: a fixed run of ids (no text, so a
# vocabulary without byte tokens cannot abort the tokenizer). The context does
# (attention reads it): about what a chat turn or a code prompt holds.
CALIBRATION_PROMPT_LEN = 200


def _calibration_prompt(engine: Engine, shift: int, room: int) -> list[int]:
    """Prompt ids that leave `room` tokens of the context for the generation."""
    n = max(8, min(CALIBRATION_PROMPT_LEN, engine.n_ctx - room))
    n_vocab = engine.target.n_vocab
    ids = ((7 + 13 * i + 101 * shift) % n_vocab for i in range(4 * n))
    return [t for t in ids if not engine.target.is_eog(t)][:n]

@dataclass
class CostModel:
    """Seconds per step of the decode loop. verify_s[n]: a step that verifies n
    tokens, all but the drafter pass (target pass and readout, taps and the
    drafter's injection at the acceptance seen while measuring, host work);
    draft_s[k]: the drafter pass with k drafts, incl. readout and trim;
    inject_s: the injection cost per emitted token beyond that (0 when measured
    in the loop, which includes it)."""
    verify_s: list[float] = field(default_factory=list)  # index 0 unused
    draft_s: list[float] = field(default_factory=list)  # index 0 = 0.0
    inject_s: float = 0.0
    key: str = ""
    measured_at: float = 0.0

    @property
    def plain_tokens_per_s(self) -> float:
        """The measured plain-decoding baseline: one token per single-token verify pass."""
        return 1.0 / self.verify_s[1] if len(self.verify_s) > 1 and self.verify_s[1] > 0 else 0.0

    def step_time(self, k: int, n_emitted: float = 1.0) -> float:
        """Expected seconds of a step that drafts k tokens and emits n_emitted.
        Costs are read as non-decreasing in size: a noisy low estimate for a
        large batch must not make it look cheaper than a smaller one."""
        n = min(k + 1, len(self.verify_s) - 1)
        t = max(self.verify_s[1:n + 1])
        if k > 0:
            t += max(self.draft_s[1:min(k, len(self.draft_s) - 1) + 1])
        return t + self.inject_s * n_emitted

    def update(self, k: int, t_draft: float, t_verify: float, alpha: float = 0.05) -> None:
        """Refresh from one observed step (cheap: no extra decodes). Each
        observation is clipped to [0.5x, 2x] of the estimate first, so a
        stall caused by another program moves the estimate only a little."""
        n = k + 1
        if n < len(self.verify_s) and t_verify > 0:
            cur = self.verify_s[n]
            self.verify_s[n] += alpha * (min(max(t_verify, 0.5 * cur), 2.0 * cur) - cur)
        if 0 < k < len(self.draft_s) and t_draft > 0:
            cur = self.draft_s[k]
            self.draft_s[k] += alpha * (min(max(t_draft, 0.5 * cur), 2.0 * cur) - cur)

    def relative_verify(self) -> list[float]:
        return [v / self.verify_s[1] for v in self.verify_s[1:]]

    def to_dict(self) -> dict:
        return asdict(self)


def _file_id(p: Path) -> str:
    st = p.stat()
    return f"{p.resolve()}:{st.st_size}:{int(st.st_mtime)}"


def cache_key(engine: Engine) -> str:
    info = build_info()
    parts = [_file_id(engine.target.path), _file_id(engine.drafter.path) if engine.drafter else "-",
             info.patch_hash, info.variant, str(engine.config.n_threads or os.cpu_count()), str(engine.n_ctx)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flashdesk" / "calibration"


class _Recorder(FixedDraftLength):
    """A fixed draft length that keeps the loop's own timing of every step
    and stops the generation after `n` steps."""

    def __init__(self, k: int, n: int):
        super().__init__(k)
        self.n = n
        self.steps: list[tuple[int, StepTiming]] = []
        self.stop = threading.Event()

    def observe(self, k: int, accepted: int, timing: StepTiming) -> None:
        self.steps.append((k, timing))
        if len(self.steps) >= self.n:
            self.stop.set()


def measure(engine: Engine, max_k: int | None = None, rounds: int = 4, steps: int = 8) -> CostModel:
    """Run the loop: per round and per k in 0..max_k, one generation of `steps`
    steps drafting k (greedy, the drafter's own drafts); the first step after a
    change of k rebuilds llama.cpp's graph and is not counted. Per k, the median
    of the counted steps: verify_s[k+1] is everything but the drafter pass
    (target pass, readout, taps, the drafter's injection, host), draft_s[k] the
    drafter pass. Leaves the engine's caches empty."""
    max_k = engine.block_size - 1 if max_k is None else max_k
    ks = list(range(0, max_k + 1)) if engine.has_drafter else [0]
    rest: dict[int, list[float]] = {k: [] for k in ks}
    draft: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(rounds):
        for k in ks:
            rec = _Recorder(k, steps + 1)
            params = GenerationParams(max_tokens=(steps + 1) * (k + 1), draft_max=k, speculative=k > 0)
            for attempt in range(3):  # a generation that ends early (EOS) is continued from another prompt
                prompt = _calibration_prompt(engine, attempt, params.max_tokens + 1)
                engine.complete(prompt, params, cancel=rec.stop, policy=rec)
                if rec.stop.is_set():
                    break
            for used, t in rec.steps[1:]:
                if used == k:  # near the end the room left can force a shorter draft
                    rest[k].append(t.step_s - t.draft_s)
                    draft[k].append(t.draft_s)
    engine.reset()
    n = max(ks) + 1
    cm = CostModel(verify_s=[0.0] * (n + 1), draft_s=[0.0] * max(n, 2))
    for k in ks:
        if rest[k]:
            cm.verify_s[k + 1] = float(np.median(rest[k]))
            cm.draft_s[k] = float(np.median(draft[k])) if k > 0 else 0.0
    # sizes the loop never reached (a generation that stopped early) take their neighbour's cost
    for i in range(2, len(cm.verify_s)):
        cm.verify_s[i] = cm.verify_s[i] or cm.verify_s[i - 1]
    for i in range(2, len(cm.draft_s)):
        cm.draft_s[i] = cm.draft_s[i] or cm.draft_s[i - 1]
    cm.measured_at = time.time()
    return cm


def cached_calibration(engine: Engine) -> CostModel | None:
    """This pair's cost model from the on-disk cache, or None (none yet, or a damaged entry)."""
    path = cache_dir() / f"{cache_key(engine)}.json"
    try:
        cm = CostModel(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # missing, or damaged: measured again
    return cm if len(cm.verify_s) > 1 and cm.verify_s[1] > 0 else None


def calibrate(engine: Engine, use_cache: bool = True) -> CostModel:
    """The cost model for this engine: from the on-disk cache, or measured now (~15 s on a CPU)."""
    if use_cache:
        cm = cached_calibration(engine)
        if cm is not None:
            return cm
    key = cache_key(engine)
    path = cache_dir() / f"{key}.json"
    cm = measure(engine)
    cm.key = key
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cm.to_dict()))
        tmp.rename(path)
    except OSError:
        pass  # no cache on a read-only or full disk; the model still works
    return cm


def expected_tokens(p: np.ndarray, k: int) -> float:
    """1 + sum_j prod_{i<=j} p_i: tokens per step when drafting k with per-position
    conditional acceptance p (p[j] = P(draft j+1 accepted | drafts 1..j accepted))."""
    if k <= 0:
        return 1.0
    return 1.0 + float(np.cumprod(p[:k]).sum())
