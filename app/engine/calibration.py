"""The cost model of speculation: how long a verify pass of n tokens and a
drafter pass of k drafts take on this machine, for this pair and build.

Measured at load by a short calibration (a few decodes of each size after
a short prompt, the fastest of 5 repeats), cached on disk per (models, build,
threads), and refreshed while running from the step timings the engine
reports (an exponential moving average per size).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from app.engine.dflash import Engine

# decode time does not depend on which tokens are decoded: a fixed run of ids
CALIBRATION_PROMPT_LEN = 48


@dataclass
class CostModel:
    """Seconds per pass. verify_s[n]: target decode of n tokens (n = 1..max);
    draft_s[k]: drafter pass with k drafts (k = 1..max), incl. readout and trim;
    inject_s: feeding one token's features to the drafter."""
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
    from native.lib import build_info

    info = build_info()
    parts = [_file_id(engine.target.path), _file_id(engine.drafter.path) if engine.drafter else "-",
             info.patch_hash, info.variant, str(engine.config.n_threads or os.cpu_count()), str(engine.n_ctx)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flashdesk" / "calibration"


def _min_time(fn, repeats: int) -> float:  # noqa: ANN001
    """The fastest of a few runs: other programs only ever add time, so the
    minimum is the best estimate of what the pass itself costs."""
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def measure(engine: Engine, max_n: int | None = None, repeats: int = 5) -> CostModel:
    """Run the calibration decodes (leaves the engine's caches empty)."""
    max_n = max_n or max(engine.block_size, 16)
    engine.reset()
    n_vocab = engine.target.n_vocab
    prompt = [(7 + 13 * i) % n_vocab for i in range(CALIBRATION_PROMPT_LEN)]
    n_past = len(prompt)
    tb = engine._tbatch  # the engine's own batch objects: timings include exactly what a step does
    tb.set(prompt, 0, False)
    engine.ctx.decode(tb)
    if engine.dctx is not None:
        engine._inject(engine.ctx.taps(len(prompt)), 0)
    toks = prompt[-1:] * (max_n + 1)

    def verify(n: int) -> None:
        tb.set(toks[:n], n_past, True)
        engine.ctx.decode(tb)
        engine.ctx.argmax_rows(list(range(n)))
        engine.ctx.seq_rm(n_past)

    cm = CostModel(verify_s=[0.0] * (max_n + 1), draft_s=[0.0] * max_n)
    verify(1)  # warm-up
    for n in range(1, max_n + 1):
        cm.verify_s[n] = _min_time(lambda n=n: verify(n), repeats)
    if engine.dctx is not None:
        db = engine._dbatch

        def draft(k: int) -> None:
            db.set([toks[0]] + [engine.mask_token] * k, n_past, True)
            engine.dctx.decode(db)
            engine.dctx.argmax_rows(list(range(1, k + 1)))
            engine.dctx.seq_rm(n_past)

        draft(1)
        for k in range(1, min(max_n, engine.block_size)):
            cm.draft_s[k] = _min_time(lambda k=k: draft(k), repeats)
        for k in range(engine.block_size, max_n):
            cm.draft_s[k] = cm.draft_s[engine.block_size - 1]
        feats = engine.ctx.taps(1)

        def inject() -> None:
            engine._inject(feats, n_past)
            engine.dctx.seq_rm(n_past)

        cm.inject_s = _min_time(inject, repeats)
    engine.reset()
    cm.measured_at = time.time()
    return cm


def calibrate(engine: Engine, use_cache: bool = True, repeats: int = 5) -> CostModel:
    """The cost model for this engine: from the on-disk cache, or measured now (a few seconds)."""
    key = cache_key(engine)
    path = cache_dir() / f"{key}.json"
    if use_cache and path.exists():
        try:
            d = json.loads(path.read_text())
            cm = CostModel(**d)
            if len(cm.verify_s) > 1 and cm.verify_s[1] > 0:
                return cm
        except (ValueError, TypeError):
            pass  # a damaged cache entry is simply measured again
    cm = measure(engine, repeats=repeats)
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
