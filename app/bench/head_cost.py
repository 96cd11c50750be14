"""`flashdesk head-cost`: the small-batch Q8_0 matmul alone (native/patches/0003), n = 1..8 columns.

The bundled target's tied output head (262,144 x 640, Q8_0) is about half of a plain step here, so
its cost by column count decides much of what a verify of n tokens costs. `verify-cost` times the
whole pass, in separate processes per build; this times the head's matmul alone, and can hold
another build's CPU backend (`--lib`, e.g. a kernel change built beside the cached one) in the same
process: every round visits every n in a random order and, for each n, every library back to back
in a random order, so the drift of a shared VM (separate processes of one build read up to 36%
apart, stop 57) hits them alike. Each library's time is reported as a ratio to the first's, paired
round by round (median and quartiles over rounds). native/harness/head_bench.cpp, through
app/bench/kernel_bench.py.
"""

from __future__ import annotations

from pathlib import Path

from app.bench.kernel_bench import paired_ratios, run_harness

HEAD_K, HEAD_M = 640, 262144  # the bundled Gemma 3 270M's tied embedding / output head


def run(libs: list[Path], threads: int, rounds: int = 30, reps: int = 7, k: int = HEAD_K, m: int = HEAD_M,
        nmax: int = 8) -> dict:
    """Time the matmul through this build's CPU backend, then each of `libs`."""
    out = run_harness("head_bench", [str(threads), str(rounds), str(reps), str(k), str(m), str(nmax)], libs)
    out["paired"] = paired_ratios(out["builds"], [str(n) for n in range(1, nmax + 1)])
    return out
