"""`flashdesk verify-cost`: what a target pass of n tokens costs on this machine.

The shape the speculative loop produces: after a fixed context, decode n
tokens (every one an output row, argmax read in C), remove them, repeat.
Rounds go over every n in turn, so drift on a busy machine hits all sizes
alike; within a round each n is decoded `reps` times and the first one is
not counted (it may rebuild llama.cpp's graph), so the numbers are the
steady state with the graph reused, as in a fixed-length run. n = 1 is
measured twice per round (`1` and `1-again`): their ratio is the noise band.

`--compare-stock` measures the same build twice more, in separate processes
with the FlashDesk CPU kernels switched off (GGML_CPU_SMALLBATCH=0,
GGML_CPU_FA_SMALL=0: llama.cpp's own kernels), alternating processes round
by round. `--compare-build DIR` does the same against another native build (a folder as
`python -m native.build` writes one: build_info.json and lib/), e.g. a kernel change built beside
the cached one: two builds on a drifting VM are compared only this way (stop 57: separate runs of
one build read up to 36% apart).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from app.bench.info import run_info
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, ModelPlacement, TokenBatch

STOCK_ENV = {"GGML_CPU_SMALLBATCH": "0", "GGML_CPU_FA_SMALL": "0"}


def measure(target: Path, ns: list[int], rounds: int, reps: int = 3, context: int = 120,
            n_threads: int = 0, n_gpu_layers: int = 0) -> dict[str, list[float]]:
    """Seconds per pass, per size (and "1-again"), over all rounds (n_gpu_layers: llama.cpp's, 999 = all)."""

    model = LlamaModel(target, ModelPlacement(n_gpu_layers=n_gpu_layers))
    ctx = LlamaContext(model, ContextConfig(n_ctx=max(1024, context + 64), n_batch=512, n_ubatch=512,
                                            n_threads=n_threads))
    batch = TokenBatch(512)
    try:
        prompt = [(7 + 13 * i) % model.n_vocab for i in range(context)]
        batch.set(prompt, 0, False)
        ctx.decode(batch)
        keys = [str(n) for n in ns] + ["1-again"]
        times: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(rounds):
            for key in keys:
                n = 1 if key == "1-again" else int(key)
                for rep in range(reps):
                    batch.set(prompt[-1:] * n, context, True)
                    t0 = time.perf_counter()
                    ctx.decode(batch)
                    ctx.argmax_rows(list(range(n)))
                    dt = time.perf_counter() - t0
                    ctx.seq_rm(context)
                    if rep > 0:
                        times[key].append(dt)
        return times
    finally:
        batch.close()
        ctx.close()
        model.close()


def summarize(times: dict[str, list[float]]) -> dict:
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["1"]
    return {"ms": {k: round(v * 1e3, 3) for k, v in med.items()},
            "relative": {k: round(v / base, 3) for k, v in med.items()},
            "p10_p90_ms": {k: [round(float(x) * 1e3, 3) for x in _p10_p90(v)] for k, v in times.items()}}


def _p10_p90(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    return s[int(0.1 * (len(s) - 1))], s[int(0.9 * (len(s) - 1))]


def run(target: Path, ns: list[int], rounds: int, compare_stock: bool, n_threads: int = 0,
        n_gpu_layers: int = 0, compare_build: Path | None = None) -> dict:
    """Measure in child processes (the kernels are chosen when the library loads): ours, and
    with --compare-stock the stock kernels, with --compare-build another build's, alternating one
    round at a time."""
    envs = {"flashdesk": {}}
    if compare_stock:
        envs["stock"] = STOCK_ENV
    if compare_build is not None:
        if not (compare_build / "build_info.json").is_file() or not (compare_build / "lib").is_dir():
            raise ValueError(f"{compare_build}: not a native build folder (build_info.json and lib/)")
        envs["other"] = {"FLASHDESK_LLAMA_LIB": str(compare_build / "lib")}  # lib.build_info reads its parent
    kinds = list(envs)
    acc: dict[str, dict[str, list[float]]] = {k: {} for k in kinds}
    for r in range(rounds):
        for kind in kinds:
            env = os.environ | envs[kind]
            cmd = [sys.executable, "-m", "app.bench.verify_cost", str(target), ",".join(map(str, ns)), "1",
                   str(n_threads), str(n_gpu_layers)]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
            if res.returncode != 0:
                raise RuntimeError(f"verify-cost child failed: {res.stderr[-1500:]}")
            for key, v in json.loads(res.stdout.strip().splitlines()[-1]).items():
                acc[kind].setdefault(key, []).extend(v)
        print(f"[verify-cost] round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    out: dict = {"run": run_info(n_threads), "target": str(target), "context": 120, "rounds": rounds,
                 "sizes": ns, "n_gpu_layers": n_gpu_layers}
    for kind in kinds:
        out[kind] = summarize(acc[kind])
    for kind in kinds[1:]:
        out[f"flashdesk_over_{kind}"] = {k: round(out["flashdesk"]["ms"][k] / out[kind]["ms"][k], 3)
                                         for k in out["flashdesk"]["ms"]}
    if compare_build is not None:
        out["other_build"] = str(compare_build)
    return out


if __name__ == "__main__":  # one child measurement: TARGET SIZES ROUNDS THREADS [GPU_LAYERS] -> JSON of seconds
    t, sizes, n_rounds, threads = sys.argv[1:5]
    print(json.dumps(measure(Path(t), [int(x) for x in sizes.split(",")], int(n_rounds), n_threads=int(threads),
                             n_gpu_layers=int(sys.argv[5]) if len(sys.argv) > 5 else 0)))
