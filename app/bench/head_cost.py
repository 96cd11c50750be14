"""`flashdesk head-cost`: the small-batch Q8_0 matmul alone (native/patches/0003), n = 1..8 columns.

The bundled target's tied output head (262,144 x 640, Q8_0) is about half of a plain step here, so
its cost by column count decides much of what a verify of n tokens costs. `verify-cost` times the
whole pass, in separate processes per build; this times the head's matmul alone, and can hold
another build's CPU backend (`--lib`, e.g. a kernel change built beside the cached one) in the same
process: every round visits every n in a random order and, for each n, every library back to back
in a random order, so the drift of a shared VM (separate processes of one build read up to 36%
apart, stop 57) hits them alike. Each library's time is reported as a ratio to the first's, paired
round by round (median and quartiles over rounds).

native/harness/head_bench.cpp is compiled on each run (seconds) against the pinned sdist's ggml
headers and the cached build's libggml; the libraries compared are CPU backends
(libggml-cpu-<variant>.so), the first the one this process would load.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from native import build as nb
from native.lib import build_info, cpu_variant

SOURCE = Path(__file__).resolve().parents[2] / "native" / "harness" / "head_bench.cpp"
HEAD_K, HEAD_M = 640, 262144  # the bundled Gemma 3 270M's tied embedding / output head


def compile_bench(work: Path) -> Path:
    """The benchmark program, built in `work` against the cached native build."""
    inc = work / "include"
    prefix = f"{nb.SDIST_NAME}/vendor/llama.cpp/ggml/include/"
    with tarfile.open(nb.fetch_sdist()) as tf:
        for m in tf.getmembers():
            if m.isfile() and m.name.startswith(prefix) and m.name.endswith(".h"):
                m.name = m.name[len(prefix):]
                tf.extract(m, inc, filter="data")
    lib_dir = build_info().lib_dir
    exe = work / "head_bench"
    res = subprocess.run(["c++", "-O2", "-std=c++17", str(SOURCE), f"-I{inc}", f"-L{lib_dir}", "-lggml",
                          "-lggml-base", f"-Wl,-rpath,{lib_dir}", "-o", str(exe)],
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"compiling {SOURCE.name} failed: {res.stderr[-2000:]}")
    return exe


def paired_ratios(builds: list[dict]) -> list[dict]:
    """Each library after the first against the first, round by round: {n: [median, p25, p75]}."""
    base = builds[0]["rounds_ms"]
    out = []
    for b in builds[1:]:
        by_n = {}
        for n, (mine, ref) in enumerate(zip(b["rounds_ms"], base), start=1):
            r = np.asarray(mine) / np.asarray(ref)
            by_n[str(n)] = [round(float(np.median(r)), 3), round(float(np.percentile(r, 25)), 3),
                            round(float(np.percentile(r, 75)), 3)]
        out.append({"lib": b["lib"], "over_first": by_n})
    return out


def run(libs: list[Path], threads: int, rounds: int = 30, reps: int = 7, k: int = HEAD_K, m: int = HEAD_M,
        nmax: int = 8) -> dict:
    """Time the matmul through this build's CPU backend, then each of `libs`."""
    for lib in libs:
        if not lib.is_file():
            raise FileNotFoundError(f"{lib}: no such CPU backend library")
    first = cpu_variant().path
    with tempfile.TemporaryDirectory(prefix="head-bench-") as tmp:
        exe = compile_bench(Path(tmp))
        res = subprocess.run([str(exe), str(threads), str(rounds), str(reps), str(k), str(m), str(nmax),
                              str(first), *map(str, libs)], capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"head_bench failed: {res.stderr[-2000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["paired"] = paired_ratios(out["builds"])
    return out
