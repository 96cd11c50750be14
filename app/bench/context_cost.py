"""`flashdesk context-cost`: what a step of the decode loop costs by context length (issue 29, item 1).

At each length (2k, 4k, 8k, 16k, ~32k cached tokens by default), one generation per round runs the
loop itself (calibration.run_choices) in cycles of 1, 1, n, n tokens verified per step for every
size n (DFlash drafting n-1 with a drafter, forced lookup drafts without; runs of three on a CUDA
device: calibration.steady_run), so the drafter attends over the same cache the target does. Per
size: the steady step (the last of its run: llama.cpp's graph reused) without the drafter's work,
read against the plain step next to it (this VM's drift cancels), the drafter's pass and the
injection call the step made first; then the injection of 1 and INJECT_ROWS rows after the cache
(Engine.time_injection). The cost model the controller prices steps by (the cached calibration, its
context terms fitted in pieces between 200, 2,000, 8,192 and ~32,768 cells) is set against each
measurement: its error by length is what says whether the linear terms hold at 32k.

    flashdesk context-cost --ctx 32768 --rounds 3 --json docs/bench/context-cost-cpu.json

One prompt of ids per length, each a prefix of the next (the cached prefix is reused where the
target's cache allows). Timings are only meaningful on a quiet machine.
"""

from __future__ import annotations

import statistics
import sys

import numpy as np

from app.bench.info import run_info
from app.engine.calibration import INJECT_ROWS, CostModel, cached_calibration, run_choices, steady_run
from app.engine.dflash import Engine
from app.engine.draft_policy import DFLASH, LOOKUP, PLAIN_STEP, Choice, StepTiming

CONTEXTS = (2048, 4096, 8192, 16384, 32768)
SIZES = tuple(range(1, 17))


def _rest(t: StepTiming) -> float:
    return t.step_s - t.draft_s - t.inject_s


def measure_at(engine: Engine, length: int, sizes: list[int], rounds: int) -> dict:
    """Steady step costs at a context of about `length` cells (less the generation's room)."""
    src = DFLASH if engine.has_drafter else LOOKUP
    big = [n for n in sizes if n > 1]
    run = steady_run(engine)
    cycle: list[Choice] = []
    for n in big:
        cycle += [PLAIN_STEP] * run + [Choice(src, n - 1)] * run
    plain: list[float] = []
    ratio: dict[int, list[float]] = {n: [] for n in big}
    draft: dict[int, list[float]] = {n: [] for n in big}
    inject: list[float] = []
    cells: list[int] = []
    for _ in range(rounds):
        steps = run_choices(engine, cycle, len(cycle), length)
        for i in range(0, len(steps) - 2 * run + 1, 2 * run):
            (k1, p1, c1), (k3, s1, _) = steps[i + run - 1], steps[i + 2 * run - 1]
            n = cycle[i + run].k + 1
            if k1 != 0 or k3 != n - 1:
                continue  # the room left forced a shorter draft
            plain.append(_rest(p1))
            ratio[n].append(_rest(s1) / _rest(p1))
            draft[n].append(s1.draft_s)
            if engine.has_drafter:
                inject.append(s1.inject_s)
            cells.append(c1)
    plain_s = statistics.median(plain) if plain else 0.0
    out: dict = {"length": length, "cells": int(statistics.median(cells)) if cells else 0,
                 "plain_ms": round(plain_s * 1e3, 3),
                 "verify_ms": {"1": round(plain_s * 1e3, 3)} | {
                     str(n): round(plain_s * statistics.median(r) * 1e3, 3) for n, r in ratio.items() if r},
                 "steps_per_size": rounds}
    if engine.has_drafter:
        out["draft_ms"] = {str(n - 1): round(statistics.median(d) * 1e3, 3) for n, d in draft.items() if d}
        out["inject_step_ms"] = round(statistics.median(inject) * 1e3, 3) if inject else None
        rows = min(INJECT_ROWS, max(2, engine.n_ctx - engine.cache_positions()[0] - 2))
        one, many = engine.time_injection(1), engine.time_injection(rows)
        out["inject_1_row_ms"] = round(one * 1e3, 3)
        out["inject_row_ms"] = round((many - one) / (rows - 1) * 1e3, 4)
    engine.reset()
    return out


def model_error(cm: CostModel, at: dict) -> dict:
    """What the cost model predicts for each measured size at the measured context, and its error
    (predicted / measured - 1): steady steps, no rebuild, the drafter's pass apart."""
    ns = [int(n) for n in at["verify_ms"]]
    pred = cm.step_times(False, np.ones(max(ns)), None, False, at["cells"])
    out = {"verify_ms": {str(n): round(float(pred[n - 1]) * 1e3, 3) for n in ns}}
    out["verify_error"] = {str(n): round(float(pred[n - 1]) * 1e3 / at["verify_ms"][str(n)] - 1.0, 4)
                           for n in ns if at["verify_ms"][str(n)] > 0}
    if "draft_ms" in at:
        out["draft_error"] = {k: round(cm.draft_time(int(k)) * 1e3 / v - 1.0, 4) if v > 0 else None
                              for k, v in at["draft_ms"].items()}
    return out


def run(engine: Engine, contexts: list[int], sizes: list[int], rounds: int) -> dict:
    """Every length in turn (shortest first: its prompt is a prefix of the next one's)."""
    cm = cached_calibration(engine)
    out: dict = {"run": run_info(engine.config.n_threads or 0), "target": str(engine.target.path),
                 "drafter": str(engine.drafter.path) if engine.drafter else None,
                 "drafter_window": engine.drafter_window, "n_ctx": engine.n_ctx,
                 "contexts": contexts, "sizes": sizes, "rounds": rounds,
                 "cost_model": cm.to_dict() if cm else None, "by_context": []}
    for length in sorted(contexts):
        if length > engine.n_ctx:
            print(f"[context-cost] {length} > the context ({engine.n_ctx}): skipped (--ctx)", file=sys.stderr)
            continue
        at = measure_at(engine, length, sizes, rounds)
        if cm is not None:
            at["cost_model"] = model_error(cm, at)
        out["by_context"].append(at)
        print(f"[context-cost] {at['cells']} cells: plain {at['plain_ms']} ms, verify(16) "
              f"{at['verify_ms'].get(str(max(sizes)))} ms", file=sys.stderr, flush=True)
    return out
