"""The cost model of speculation: how long a verify pass of n tokens, a
drafter pass of k drafts, an injection and a graph rebuild take on this
machine, for this pair and build.

Measured by running the decode loop itself (Engine.generate with fixed
choices, steps verifying 1, 1, n, n tokens in turn, every size round-robin):
the costs are those of the loop's steady state, with llama.cpp's compute graph
reused from the step before, both models alternating as they do; the first
step of each pair measures the rebuild. Each size is read against the plain
step next to it, since this VM's speed drifts by 10-20% within a minute (two
calibrations of sizes measured in runs of their own differed by up to 40% at
one size). The same pairs of sizes at a document-length context give what
attention over the cache adds per step and per verified token (a verify of 8
costs ~5 ms more at 2k cells than at 200 on a 2-core CPU, a single token
~1 ms). Cached on disk per (models, build, threads, context), refreshed
while running from the step timings the engine reports (the controller's live
copy: two paces, of what every pass costs and of what each more token adds,
which this VM's drift moves, and an exponential moving average per size), and
learned: after a reply (or a bench) the steady steps the controller timed,
read back to paces of 1, are folded into the cached model (learn), each size
the mean over the steps seen.
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
from app.engine.draft_policy import DFLASH, LOOKUP, LOOKUP_K_MAX, PLAIN_STEP, Choice, StepInfo, StepTiming
from app.engine.params import GenerationParams
from app.errors import GenerationError
from native.lib import build_info

# the tokens do not change a pass's cost: a fixed run of ids (no text, so a
# vocabulary without byte tokens cannot abort the tokenizer). The context does
# (attention reads it): about what a chat turn or a code prompt holds.
CALIBRATION_PROMPT_LEN = 200
INJECT_ROWS = 64  # the per-row injection cost is read from a call this size and a one-row call
# the context terms: steps alternating 1 and CTX_N tokens at the calibration prompt's context and at
# this one (or as long as the context allows; under CTX_MIN_GAP more cells, they stay 0)
LONG_PROMPT_LEN = 2000
# and the far terms, beyond LONG_PROMPT_LEN: the same steps there and at each of these contexts (as
# far as the context allows), one run each, longest last (each prompt a prefix of the next: the cache
# keeps it). The cost is not linear in the context: on this CPU a step grew little from 2k to 8k cells
# and up to 2x faster per cell past ~10k (likely where the cache outgrows the CPU's last-level cache), so the
# terms of 200 and 2,000 cells priced a verify at 16k-32k up to 1.7x its measured cost, and those of
# 2,000 and 8,192 at 0.4x (docs/bench/context-cost-cpu.json, context-cost-s39-run1-cpu.json): one
# linear piece per pair of lengths
FAR_PROMPT_LENS = (8192, 32768)
CTX_N = 8
CTX_MIN_GAP = 500
# the most steps a size's cost is the mean of: past it, newer steps weigh more, so that a machine
# whose speed changed is followed within a few thousand steps
LEARN_CAP = 2000
# what a calibrated cost weighs against the loop's steps folded in (learn): a calibration is one ~50 s
# window of a machine whose speed drifts (its plain step measured 8.0 ms once, 10.6 over the bench
# that followed), worth a few seconds of the loop's steps however many it timed
CALIBRATION_WEIGHT = 16
# how fast a live model follows the steps: the paces in ~20 steps (this VM's plain step drifts by up to
# 40% between sessions and +-5-10% within minutes), a size's own estimate in ~100 of its steps
PACE_ALPHA = 0.05
SIZE_ALPHA = 0.01
CALIBRATION_VERSION = "8"  # part of the cache key: a new cost model format (8: far context pieces) is measured anew


def _calibration_prompt(engine: Engine, shift: int, room: int, length: int = CALIBRATION_PROMPT_LEN) -> list[int]:
    """Prompt ids (about `length`) that leave `room` tokens of the context for the generation."""
    n = max(8, min(length, engine.n_ctx - room))
    n_vocab = engine.target.n_vocab
    ids = ((7 + 13 * i + 101 * shift) % n_vocab for i in range(4 * n))
    return [t for t in ids if not engine.target.is_eog(t)][:n]

@dataclass
class CostModel:
    """Seconds per step of the decode loop.

    verify_s[n]: a step that verifies n tokens, all but the drafter's work:
        target pass and readout, taps, host (index 0 unused)
    draft_s[k]: the drafter pass with k drafts, incl. readout and trim (index 0 = 0)
    inject_call_s: one injection call into the drafter (a DFlash step makes one first, for the
        features of the tokens emitted since the drafter last ran)
    inject_row_s: per injected feature row: every emitted token's, once, whichever source
        drafted it (injection is lazy, so a lookup step pays it later, in a batch)
    switch_s: a step whose verify size differs from the step before (llama.cpp rebuilds its graph)
    ctx_step_s, ctx_token_s: per cache cell beyond calib_ctx, what a step pays (reading the cache)
        and what each verified token pays (its attention over it); verify_s holds the costs at
        calib_ctx cells, the context the sizes were measured at
    far_ctx[i], far_ctx_step_s[i], far_ctx_token_s[i]: the same per cell from far_ctx[i] cells on
        (to the next piece's start; none: the terms above hold at every length)
    verify_steps[n], draft_steps[k]: how many steps each estimate is the mean of (the calibration's,
        then the loop's own, folded in by learn(); at most LEARN_CAP)
    pace_pass, pace_token: the machine's speed now against these costs, apart for what every pass
        costs (verify_s[1]: reading the weights) and what the tokens beyond the first add
        (verify_s[n] - verify_s[1]): a verify of n is expected to cost pace_pass * verify_s[1] +
        pace_token * (verify_s[n] - verify_s[1]) + the rest. Both 1 as calibrated and learned; a
        controller's live copy follows them from every steady step (update). On this VM the two
        drift apart: over six bench runs the plain step's mean was 7.95-11.67 ms while a verify of
        4 (lookup) added 4.40-5.85 ms to it, so neither one scale for the whole step nor one for
        the pass alone follows both, and a fast machine makes drafting relatively dearer.
    """
    verify_s: list[float] = field(default_factory=list)
    draft_s: list[float] = field(default_factory=list)
    inject_call_s: float = 0.0
    inject_row_s: float = 0.0
    switch_s: float = 0.0
    ctx_step_s: float = 0.0
    ctx_token_s: float = 0.0
    calib_ctx: float = 0.0
    far_ctx: list[float] = field(default_factory=list)
    far_ctx_step_s: list[float] = field(default_factory=list)
    far_ctx_token_s: list[float] = field(default_factory=list)
    verify_steps: list[float] = field(default_factory=list)
    draft_steps: list[float] = field(default_factory=list)
    key: str = ""
    measured_at: float = 0.0
    pace_pass: float = 1.0
    pace_token: float = 1.0

    def __post_init__(self) -> None:
        self._rising: dict[str, tuple[tuple[float, ...], np.ndarray]] = {}  # not a field: never saved

    def rising(self, name: str) -> np.ndarray:
        """verify_s or draft_s past index 0 read as non-decreasing in size (a noisy low estimate for a
        large batch must not make it look cheaper than a smaller one); kept while the list is the same."""
        cur = tuple(getattr(self, name))
        hit = self._rising.get(name)
        if hit is None or hit[0] != cur:
            hit = cur, np.maximum.accumulate(np.asarray(cur[1:], dtype=np.float64))
            hit[1].flags.writeable = False  # shared by every caller until the list changes
            self._rising[name] = hit
        return hit[1]

    @property
    def plain_tokens_per_s(self) -> float:
        """The measured plain-decoding baseline: one token per single-token verify pass."""
        return 1.0 / self.verify_s[1] if len(self.verify_s) > 1 and self.verify_s[1] > 0 else 0.0

    @property
    def near_ctx_end(self) -> float:
        """Where the terms fitted at calib_ctx and LONG_PROMPT_LEN (several rounds) give way to the far
        pieces (one run each): the loop's steps past it are read back to calib_ctx through terms off by
        +-15-45% at 8k-32k (stop 39's context-cost runs), so learn() does not fold them."""
        return self.far_ctx[0] if self.far_ctx else float("inf")

    def context_terms(self, n_past: int | None) -> tuple[float, float]:
        """(a, b): a verify of n tokens after n_past cache cells costs a + b * n beyond (or, below
        calib_ctx, under) its cost at calib_ctx cells; (0, 0) for n_past None. Linear pieces joined at
        far_ctx. In Python floats: the controller reads it for every candidate of every step."""
        if n_past is None:
            return 0.0, 0.0
        starts = (self.calib_ctx, *self.far_ctx)
        ends = (*self.far_ctx, float("inf"))
        steps = (self.ctx_step_s, *self.far_ctx_step_s)
        tokens = (self.ctx_token_s, *self.far_ctx_token_s)
        a = b = 0.0
        for i, (start, end, step, token) in enumerate(zip(starts, ends, steps, tokens)):
            if i == 0 or n_past > start:  # the first piece also reaches below calib_ctx
                cells = min(n_past, end) - start
                a += step * cells
                b += token * cells
        return a, b

    def step_times(self, dflash: bool, emitted: np.ndarray, last_n: int | None = None,
                   inject: bool = True, n_past: int | None = None) -> np.ndarray:
        """Expected seconds of a step drafting k = 0..len(emitted)-1 tokens that emits emitted[k]:
        DFlash (a drafter pass, and an injection call if `inject`) or not (plain, lookup); the
        graph rebuild counted where k+1 != last_n (None: not at all); after n_past cache cells
        (None: at calib_ctx). Costs are read as non-decreasing in size (rising). At the paces."""
        emitted = np.asarray(emitted, dtype=np.float64)
        n = np.arange(1, len(emitted) + 1)  # the verify sizes
        verify = self.rising("verify_s")
        base = verify[:len(n)] if len(n) <= len(verify) else verify[np.minimum(n, len(verify)) - 1]
        a, b = self.context_terms(n_past)
        # a short context makes a pass cheaper, never less than half its calibrated cost (in place,
        # term by term: this runs for every source at every step)
        t = np.maximum(base + (a + b * n), 0.5 * base)
        t += (self.pace_pass - 1.0) * verify[0]
        t += (self.pace_token - 1.0) * (base - verify[0])
        t += self.inject_row_s * emitted
        if last_n is not None:
            t += self.switch_s * (n != last_n)
        if dflash and len(n) > 1:
            draft = self.rising("draft_s")
            k = len(n) - 1  # drafts 1..k read draft[0..k-1], the last cost past the drafter's block
            t[1:] += (draft[:k] if k <= len(draft) else draft[np.minimum(n[:k], len(draft)) - 1]) \
                + (self.inject_call_s if inject else 0.0)
        return t

    def draft_time(self, k: int) -> float:
        """The drafter pass with k drafts (read as non-decreasing in k)."""
        return max(self.draft_s[1:min(k, len(self.draft_s) - 1) + 1], default=0.0) + self.inject_call_s

    def at_unit_pace(self, n: int, t_verify: float, n_past: int | None = None) -> float:
        """A verify of n tokens that took t_verify after n_past cells, read back to calib_ctx cells and
        to paces of 1: what it would have cost when these costs were measured (learn folds these,
        so that the sizes' costs are learned in proportion whatever the machine's speed was)."""
        one, more = self._parts(n)
        a, b = self.context_terms(n_past)
        return (t_verify - (a + b * n) - (self.pace_pass - 1.0) * one
                - (self.pace_token - 1.0) * more)

    def _parts(self, n: int) -> tuple[float, float]:
        """A verify of n at paces of 1: what every pass costs, and what the tokens beyond the first
        add (the curve read as non-decreasing, as step_times reads it)."""
        one = self.verify_s[1]
        return one, max(self.verify_s[1:n + 1]) - one

    def update(self, n: int, t_verify: float, k_draft: int = 0, t_draft: float = 0.0,
               alpha: float = SIZE_ALPHA, n_past: int | None = None) -> None:
        """Refresh from one observed steady step after n_past cache cells (cheap: no extra decodes),
        its time without the drafter's work read back to calib_ctx cells and clipped to [0.5x, 2x]
        of the estimate (a stall caused by another program moves the estimates only a little): the
        paces take PACE_ALPHA of the difference, split by the share of each part in the step
        (normalised least mean squares), then verify_s[n] (n > 1) `alpha` of what is left; the
        drafter pass moves draft_s[k_draft]."""
        if 0 < n < len(self.verify_s) and t_verify > 0:
            one, more = self._parts(n)
            seen = self.at_unit_pace(n, t_verify, n_past)
            left = min(max(seen, 0.5 * (one + more)), 2.0 * (one + more)) - (one + more)
            r = PACE_ALPHA * left / (one * one + more * more)
            self.pace_pass += r * one
            self.pace_token += r * more
            if n > 1:  # the paces took PACE_ALPHA of the difference
                self.verify_s[n] += alpha * (1.0 - PACE_ALPHA) * left
        if 0 < k_draft < len(self.draft_s) and t_draft > 0:
            cur = self.draft_s[k_draft]
            self.draft_s[k_draft] += alpha * (min(max(t_draft, 0.5 * cur), 2.0 * cur) - cur)

    def relative_verify(self) -> list[float]:
        return [v / self.verify_s[1] for v in self.verify_s[1:]]

    def to_dict(self) -> dict:
        """The costs (the cache's and a bench's record); the paces are a live copy's, never kept."""
        d = asdict(self)
        del d["pace_pass"], d["pace_token"]
        return d


def _file_id(p: Path) -> str:
    st = p.stat()
    return f"{p.resolve()}:{st.st_size}:{int(st.st_mtime)}"


def cache_key(engine: Engine) -> str:
    info = build_info()
    parts = [CALIBRATION_VERSION, _file_id(engine.target.path),
             _file_id(engine.drafter.path) if engine.drafter else "-", info.patch_hash, info.variant,
             str(engine.config.n_threads or os.cpu_count()), str(engine.n_ctx)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


CALIBRATION_DIR_ENV = "FLASHDESK_CALIBRATION_DIR"  # the test suite keeps its own (tests/conftest.py)


def cache_dir() -> Path:
    """Where cost models are kept: $FLASHDESK_CALIBRATION_DIR, else the user's cache. (A cached model
    learns from every loop run on the machine, so what a run's controller chooses depends on it.)"""
    if os.environ.get(CALIBRATION_DIR_ENV):
        return Path(os.environ[CALIBRATION_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flashdesk" / "calibration"


class _Recorder:
    """Fixed choices (a cycle of them; the drafts of a lookup choice come from the override) that
    keeps the loop's own timing of every step and stops the generation after `n` steps."""

    uses_confidence = False

    def __init__(self, choices: list[Choice], n: int):
        self.choices = choices
        self.n = n
        self.steps: list[tuple[int, StepTiming, int]] = []  # (k used, its timing, cache cells before it)
        self.stop = threading.Event()
        self._n_past = 0

    def choose(self, step: StepInfo) -> Choice:
        self._n_past = step.n_past
        return self.choices[len(self.steps) % len(self.choices)]

    def truncate(self, confidence: np.ndarray) -> int:
        return len(confidence)

    def observe(self, choice: Choice, accepted: int, timing: StepTiming) -> None:
        self.steps.append((choice.k, timing, self._n_past))
        if len(self.steps) >= self.n:
            self.stop.set()


def _junk_drafts(history: list[int], choice: Choice) -> list[int] | None:
    """Drafts for a forced lookup step: the anchor repeated (the cost does not depend on the ids)."""
    return [history[-1]] * choice.k if choice.source == LOOKUP else None


# how many steps of one size in a row until one is steady: llama.cpp reuses its graph from the second
# step of a size on; on a GPU, CUDA graphs are captured on the second same-shaped step and replayed from
# the third (ggml-cuda's warm-up), and a step of another size runs without one. On an H200, the bundled
# target's plain step ran at 1.44 ms in a plain run and was calibrated at 5.5 ms with runs of two (the
# capture priced as the steady step), the same step among the hybrid's changing sizes at 4.3 ms
# (docs/bench/gpu-h200/)
STEADY_RUN_CPU = 2
STEADY_RUN_GPU = 3


def steady_run(engine: Engine) -> int:
    return STEADY_RUN_GPU if engine.target_on_cuda else STEADY_RUN_CPU


def run_choices(engine: Engine, choices: list[Choice], steps: int,
         prompt_len: int = CALIBRATION_PROMPT_LEN) -> list[tuple[int, StepTiming, int]]:
    """(k used, timing, cache cells before) of `steps` steps making `choices` in turn (greedy, from a
    calibration prompt of about prompt_len tokens; the same prompt each time, so a second run at a
    length reuses the cached prefix: app.bench.context_cost measures at 32k cells this way)."""
    rec = _Recorder(choices, steps)
    n_max = max(c.k for c in choices) + 1
    # at most half the context per generation (a small context would not hold steps * n_max tokens):
    # a generation that ends early (EOS, or out of room) is continued from another prompt
    max_tokens = max(n_max + 1, min(steps * n_max, engine.n_ctx // 2))
    params = GenerationParams(max_tokens=max_tokens, draft_max=n_max - 1, speculative=n_max > 1)
    for attempt in range(16):
        prompt = _calibration_prompt(engine, attempt, params.max_tokens + 1, prompt_len)
        engine.complete(prompt, params, cancel=rec.stop, policy=rec, draft_override=_junk_drafts)
        if rec.stop.is_set():
            break
    return rec.steps


def measure(engine: Engine, rounds: int = 4, pairs: int = 4) -> CostModel:
    """Run the loop in cycles of 1, 1, n, n tokens verified per step (greedy; with a drafter,
    DFlash drafting n-1 - its own drafts - else forced lookup drafts): per round and per size
    n = 2..N, one generation of `pairs` cycles, round-robin. The last step of each run of a size is
    steady (llama.cpp reuses the graph of the step before; on a GPU, runs of three: see
    steady_run); the first rebuilds it. A size's cost
    is read as its ratio to the plain step of the same cycle, a few ms apart, so that this VM's
    drift (+-10-20% within a minute) cancels; the plain step's is the median over the whole run.
    verify_s[n] is everything but the drafter's work, draft_s[n-1] the drafter pass, and a DFlash
    step's injection call; switch_s the median of (first - second) over every pair. The same with
    1 and CTX_N tokens at two contexts gives the context terms (_context_terms). The cost per
    injected row is timed on its own (Engine.time_injection). Leaves the engine's caches empty."""
    if engine.speculation_blocked:  # nothing drafts: every step would be plain, and the costs zeros
        raise GenerationError(engine.speculation_blocked)
    n_max = engine.block_size if engine.has_drafter else LOOKUP_K_MAX + 1
    plain: list[float] = []  # the steady plain steps
    ratio: dict[int, list[float]] = {n: [] for n in range(2, n_max + 1)}  # steady n-step / steady plain step
    draft: dict[int, list[float]] = {n: [] for n in range(2, n_max + 1)}
    inject: list[float] = []  # a DFlash step's injection call (of the rows emitted before it)
    rebuild: list[float] = []  # first step of a pair minus the second
    cells: list[int] = []  # the context of each steady step

    def rest(t: StepTiming) -> float:
        return t.step_s - t.draft_s - t.inject_s

    run = steady_run(engine)
    for _ in range(rounds):
        for n in range(2, n_max + 1):
            choice = Choice(DFLASH if engine.has_drafter else LOOKUP, n - 1)
            cycle = [PLAIN_STEP] * run + [choice] * run
            size = len(cycle)
            steps = run_choices(engine, cycle, size * pairs + size)[size:]  # the first cycle follows the prompt
            for i in range(0, len(steps) - size + 1, size):
                cyc = steps[i:i + size]
                if [used for used, _, _ in cyc] != [c.k for c in cycle]:
                    continue  # near the end the room left can force a shorter draft
                (_, p0, _), (_, p1, c1), (_, s0, _), (_, s1, c3) = cyc[0], cyc[run - 1], cyc[run], cyc[-1]
                plain.append(rest(p1))
                ratio[n].append(rest(s1) / rest(p1))
                draft[n].append(s1.draft_s)
                if engine.has_drafter:
                    inject.append(s1.inject_s)
                rebuild += [rest(p0) - rest(p1), rest(s0) - rest(s1)]
                cells += [c1, c3]
    cm = CostModel(verify_s=[0.0] * (n_max + 1), draft_s=[0.0] * max(n_max, 2))
    if plain:
        cm.verify_s[1] = float(np.median(plain))
    for n in range(2, n_max + 1):
        if ratio[n]:
            cm.verify_s[n] = cm.verify_s[1] * float(np.median(ratio[n]))
            cm.draft_s[n - 1] = float(np.median(draft[n])) if engine.has_drafter else 0.0
    # sizes the loop never reached (a generation that stopped early) take their neighbour's cost
    for i in range(2, len(cm.verify_s)):
        cm.verify_s[i] = cm.verify_s[i] or cm.verify_s[i - 1]
    for i in range(2, len(cm.draft_s)):
        cm.draft_s[i] = cm.draft_s[i] or cm.draft_s[i - 1]
    cm.verify_steps = [0.0] + [float(CALIBRATION_WEIGHT)] * n_max
    cm.draft_steps = [0.0] + [float(CALIBRATION_WEIGHT)] * (len(cm.draft_s) - 1)
    cm.calib_ctx = float(np.median(cells)) if cells else 0.0
    cm.switch_s = max(0.0, float(np.median(rebuild))) if rebuild else 0.0
    _context_terms(engine, cm, rounds * pairs * 4, max(1, rounds))
    if engine.has_drafter and inject:
        # per row: the difference of two sizes timed alone; per call: what the loop's calls took beyond
        # their row (in the loop the drafter's graph alternates between injection and drafting)
        rows = min(INJECT_ROWS, engine.n_ctx // 2)  # a small context holds fewer
        one, many = engine.time_injection(1), engine.time_injection(rows)
        cm.inject_row_s = max(0.0, (many - one) / (rows - 1))
        cm.inject_call_s = max(0.0, float(np.median(inject)) - cm.inject_row_s)
    engine.reset()
    cm.measured_at = time.time()
    return cm


def _cycle_medians(engine: Engine, n: int, pairs: int, prompt_lens: tuple[int, ...] = (CALIBRATION_PROMPT_LEN,),
                   rounds: int = 1) -> list[tuple[tuple[float, float], tuple[float, float]] | None]:
    """Steps of 1, 1, n, n, 1, 1, ... tokens (forced lookup drafts; runs of steady_run steps), `pairs`
    cycles from a prompt of each length in prompt_lens, in `rounds` runs per length taken in turn (so
    that drift on a busy machine hits every length alike): per length, the steady plain step's and the
    steady n-step's (median step time without injection, median context); None for a length where
    either got no step."""
    run = steady_run(engine)
    cycle = [PLAIN_STEP] * run + [Choice(LOOKUP, n - 1)] * run
    steady = (run - 1, 2 * run - 1)  # the positions in the cycle of the steady steps
    by_len: list[tuple[list[tuple[float, int]], ...]] = [([], []) for _ in prompt_lens]
    per_run = max(1, pairs // rounds)
    for _ in range(rounds):
        for by_pos, length in zip(by_len, prompt_lens):
            alt = run_choices(engine, cycle, len(cycle) * (per_run + 1), length)[len(cycle):]
            for i, (used, t, n_past) in enumerate(alt):
                pos = i % len(cycle)
                if pos in steady and used == cycle[pos].k:
                    by_pos[steady.index(pos)].append((t.step_s - t.inject_s, n_past))
    return [tuple((float(np.median([t for t, _ in p])), float(np.median([c for _, c in p]))) for p in by_pos)
            if all(by_pos) else None for by_pos in by_len]


def _context_terms(engine: Engine, cm: CostModel, pairs: int, rounds: int) -> None:
    """ctx_step_s and ctx_token_s from the steady steps of 1 and CTX_N tokens at the calibration
    prompt's context and at LONG_PROMPT_LEN, the two taken in turn `rounds` times: measured one
    after the other, a machine that slowed down between them read as a cost of the context (two
    runs a minute apart once fitted 0 + 0.64 n and 1.75 + 0 n ms per 1k cells). Then the far terms:
    one piece per pair of lengths from LONG_PROMPT_LEN on, through FAR_PROMPT_LENS as far as the
    context allows: one run each (a long prompt's prefill dominates; drift, +-10% of a plain step, is
    small beside what 8k-30k more cells add)."""
    if engine.n_ctx < LONG_PROMPT_LEN:
        return  # a context too small to tell (the measured gap is checked too)
    short, long = _cycle_medians(engine, CTX_N, pairs, (CALIBRATION_PROMPT_LEN, LONG_PROMPT_LEN), rounds)
    if short is None or long is None:
        return
    fit = fit_context_terms(short, long, CTX_N)
    if fit is None:
        return
    cm.ctx_step_s, cm.ctx_token_s = fit
    lens = (LONG_PROMPT_LEN, *(n for n in FAR_PROMPT_LENS if n < engine.n_ctx), engine.n_ctx)
    meds = _cycle_medians(engine, CTX_N, pairs // 2, lens, 1)  # half the steps: room for a longer prompt
    for a, b in zip(meds, meds[1:]):
        if a is None or b is None:
            break
        fit = fit_context_terms(a, b, CTX_N)
        if fit is None:
            continue  # under CTX_MIN_GAP apart (the context left no room): the next pair measures on
        cm.far_ctx.append((a[0][1] + a[1][1]) / 2)
        cm.far_ctx_step_s.append(fit[0])
        cm.far_ctx_token_s.append(fit[1])


def fit_context_terms(short: tuple[tuple[float, float], tuple[float, float]],
                      long: tuple[tuple[float, float], tuple[float, float]], n: int) -> tuple[float, float] | None:
    """(seconds per cell per step, per cell per verified token) from steady steps of 1 and n tokens,
    each given as (median seconds, median cache cells), at a short and a long context: fitted to
    t = base(size) + (step + token * size) * cells, neither negative. None when the two contexts
    are under CTX_MIN_GAP cells apart."""
    gap = (long[0][1] + long[1][1] - short[0][1] - short[1][1]) / 2
    if gap < CTX_MIN_GAP:
        return None
    d1, dn = (long[0][0] - short[0][0]) / gap, (long[1][0] - short[1][0]) / gap
    token = max(0.0, (dn - d1) / (n - 1))
    return max(0.0, d1 - token), token


def cached_calibration(engine: Engine) -> CostModel | None:
    """This pair's cost model from the on-disk cache, or None (none yet, or a damaged entry)."""
    path = cache_dir() / f"{cache_key(engine)}.json"
    try:
        cm = CostModel(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # missing, or damaged: measured again
    return cm if len(cm.verify_s) > 1 and cm.verify_s[1] > 0 else None


def calibrate(engine: Engine, use_cache: bool = True) -> CostModel:
    """The cost model for this engine: from the on-disk cache, or measured now (~50 s on a 2-core CPU)."""
    if use_cache:
        cm = cached_calibration(engine)
        if cm is not None:
            return cm
    cm = measure(engine)
    cm.key = cache_key(engine)
    _save(cm)
    return cm


def _save(cm: CostModel) -> None:
    path = cache_dir() / f"{cm.key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cm.to_dict()))
        tmp.rename(path)
    except OSError:
        pass  # no cache on a read-only or full disk; the model still works


class LoopTimes:
    """The steady steps the decode loop timed (a controller collects them as it observes): per
    verify size n the sum and count of the times without the drafter's work, read back to
    calib_ctx cells and to paces of 1 (CostModel.at_unit_pace); per draft length k the drafter
    pass's."""

    def __init__(self) -> None:
        self.verify: dict[int, list[float]] = {}  # n: [steps, seconds]
        self.draft: dict[int, list[float]] = {}

    def add(self, n: int, t_verify: float, k_draft: int = 0, t_draft: float = 0.0) -> None:
        e = self.verify.setdefault(n, [0, 0.0])
        e[0] += 1
        e[1] += t_verify
        if k_draft > 0 and t_draft > 0:
            d = self.draft.setdefault(k_draft, [0, 0.0])
            d[0] += 1
            d[1] += t_draft

    def fold_into(self, cm: CostModel) -> None:
        """Each size's estimate becomes the mean over the steps behind it and these (weighted
        as at most LEARN_CAP steps); then these are cleared."""
        for times, est, steps in ((self.verify, cm.verify_s, cm.verify_steps),
                                  (self.draft, cm.draft_s, cm.draft_steps)):
            steps.extend([0.0] * (len(est) - len(steps)))
            for i, (n, total) in times.items():
                if 0 < i < len(est) and n > 0:
                    w = steps[i]
                    est[i] = (w * est[i] + total) / (w + n)
                    steps[i] = min(w + n, LEARN_CAP)
            times.clear()


def learn(engine: Engine, seen: LoopTimes) -> CostModel | None:
    """Fold what the loop timed into this pair's cached cost model, so that the next session (or
    bench) starts from the mean over every step seen, not from one ~50 s calibration on a machine
    whose speed drifts by 10-20% within minutes; the cached model, or None if there is none (then
    nothing is learned). The live copy a controller refreshes is not touched."""
    cm = cached_calibration(engine)
    if cm is None:
        return None
    seen.fold_into(cm)
    cm.key = cache_key(engine)
    _save(cm)
    return cm
