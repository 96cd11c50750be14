"""`flashdesk attn-cost`: the small-batch flash attention alone (native/patches/0005), by cached cells
and query rows.

At long context a step's cost past the weights is attention over the cache, and what a verify of n
tokens adds to a plain step is mostly its extra rows there (stop 57's `flashdesk context-cost`: verify(2)
1.10x plain at 2k cells, 1.24x at 32k). This times one attention op at the bundled target's global-layer
shape (head size 256, 4 query heads sharing 1 KV head, F16 K/V, a causal mask over the verified
tokens) for every (cells, rows) pair, through this build's CPU backend and any other build's
(`--lib`) in the same process, interleaved as `head-cost` does, with paired ratios per round.
native/harness/attn_bench.cpp, through app/bench/kernel_bench.py.
"""

from __future__ import annotations

from pathlib import Path

from app.bench.kernel_bench import paired_ratios, run_harness

HEAD_DIM, HEADS, KV_HEADS = 256, 4, 1  # the bundled Gemma 3 270M's attention
CONTEXTS = (2048, 8192, 32768)
SIZES = (1, 2, 3, 4, 8, 16)


def run(libs: list[Path], threads: int, rounds: int = 10, reps: int = 5, contexts: tuple[int, ...] = CONTEXTS,
        sizes: tuple[int, ...] = SIZES) -> dict:
    """Time the op through this build's CPU backend, then each of `libs`."""
    args = [str(threads), str(rounds), str(reps), str(HEAD_DIM), str(HEADS), str(KV_HEADS),
            ",".join(map(str, contexts)), ",".join(map(str, sizes))]
    out = run_harness("attn_bench", args, libs)
    out["paired"] = paired_ratios(out["builds"], out["cells"])
    return out
