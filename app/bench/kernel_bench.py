"""Kernel microbenchmarks in C++ (native/harness/*_bench.cpp), compiled on each run (seconds) against
the pinned sdist's ggml headers and the cached build's libggml, and run through one or more CPU
backend libraries loaded side by side in one process, so that two builds (a kernel change beside the
cached one) meet the drift of a shared VM alike. Used by `flashdesk head-cost` and `attn-cost`.

A harness prints one JSON object whose "builds" hold, per library, "rounds_ms": one list per cell
(a column count, a context and row count...) of that cell's time in each round.
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

HARNESS_DIR = Path(__file__).resolve().parents[2] / "native" / "harness"


def compile_harness(source: Path, work: Path) -> Path:
    """The benchmark program `source`, built in `work` against the cached native build."""
    inc = work / "include"
    prefix = f"{nb.SDIST_NAME}/vendor/llama.cpp/ggml/include/"
    with tarfile.open(nb.fetch_sdist()) as tf:
        for m in tf.getmembers():
            if m.isfile() and m.name.startswith(prefix) and m.name.endswith(".h"):
                m.name = m.name[len(prefix):]
                tf.extract(m, inc, filter="data")
    lib_dir = build_info().lib_dir
    exe = work / source.stem
    res = subprocess.run(["c++", "-O2", "-std=c++17", str(source), f"-I{inc}", f"-L{lib_dir}", "-lggml",
                          "-lggml-base", f"-Wl,-rpath,{lib_dir}", "-o", str(exe)],
                         capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"compiling {source.name} failed: {res.stderr[-2000:]}")
    return exe


def paired_ratios(builds: list[dict], labels: list[str]) -> list[dict]:
    """Each library after the first against the first, round by round: {label: [median, p25, p75]}."""
    base = builds[0]["rounds_ms"]
    out = []
    for b in builds[1:]:
        by_cell = {}
        for label, mine, ref in zip(labels, b["rounds_ms"], base, strict=True):
            r = np.asarray(mine) / np.asarray(ref)
            by_cell[label] = [round(float(np.median(r)), 3), round(float(np.percentile(r, 25)), 3),
                              round(float(np.percentile(r, 75)), 3)]
        out.append({"lib": b["lib"], "over_first": by_cell})
    return out


def run_harness(name: str, args: list[str], libs: list[Path]) -> dict:
    """Run native/harness/<name>.cpp with `args`, through this build's CPU backend and then each of `libs`."""
    for lib in libs:
        if not lib.is_file():
            raise FileNotFoundError(f"{lib}: no such CPU backend library")
    first = cpu_variant().path
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        exe = compile_harness(HARNESS_DIR / f"{name}.cpp", Path(tmp))
        res = subprocess.run([str(exe), *args, str(first), *map(str, libs)], capture_output=True, text=True,
                             timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"{name} failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])
