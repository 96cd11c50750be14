"""One script for a GPU machine (issue 30, point 4): build the CUDA variant for the device found,
check the hidden-state taps on CUDA against the CPU's, measure verify(n) for n = 1..16 and the
drafter pass, bench the bundled pair and the bandwidth-bound stand-in, and write one JSON.

    python scripts/gpu_check.py [--out docs/bench/gpu-check.json] [--standin qwen3-4b]
    python scripts/gpu_check.py --cpu-dry-run [--out FILE]   # CPU variant, tiny budgets, no bundled bench
    python scripts/gpu_check.py --taps-child ref.npz          # the CPU reference of the taps, made elsewhere
    python scripts/gpu_check.py --taps-ref ref.npz --deadline-s 420   # a lent machine's short lease

Every step runs as a child process (a process loads one native variant; a crash or hang is one
failed step, not a lost run) under a timeout, and is recorded as {ok, seconds, result | error};
the exit status is 0 only if every step passed. The CUDA build covers the device's one
architecture (FLASHDESK_CUDA_ARCHS) in a native cache of its own, so it never replaces the
shared three-architecture build under the same key. The stand-in (python -m gguf_tools synth
standin) is written once under ~/.cache/flashdesk/standin. The steps run in order of what they are
worth (the bundled pair's taps, verify cost, calibration and bench before the stand-in's), so that a
deadline (a lent GPU's minutes) cuts the least useful ones: a step past it is recorded as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# taps on CUDA against the CPU's: max |diff| over max |value| per tapped layer (CUDA's matmuls
# quantize activations and sum in another order; a wrong row or layer is off by O(1))
TAPS_TOL = 0.05
TAP_TOKENS = [(7 + 13 * i) % 4000 + 100 for i in range(48)]


@dataclass(frozen=True)
class Budget:
    verify_rounds: int
    bench_prompts: int
    bench_tokens: int
    forced_tokens: int
    standin: str
    step_timeout_s: int
    # the dry run benches the stand-in only: a bench calibrates its pair first, and the bundled pair's
    # calibration took over 9 minutes on this busy 2-core machine (the test suite covers it); its
    # calibration step measures the stand-in too
    bench_bundled: bool


GPU = Budget(verify_rounds=10, bench_prompts=8, bench_tokens=128, forced_tokens=256, standin="qwen3-4b",
             step_timeout_s=420, bench_bundled=True)
DRY = Budget(verify_rounds=1, bench_prompts=1, bench_tokens=16, forced_tokens=32, standin="small",
             step_timeout_s=300, bench_bundled=False)


def device() -> dict:
    """The first NVIDIA GPU: name, compute capability (its CUDA architecture), memory."""
    res = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=60, check=True)
    name, cap, mem, driver = [x.strip() for x in res.stdout.strip().splitlines()[0].split(",")]
    return {"name": name, "compute_cap": cap, "arch": cap.replace(".", ""), "memory": mem, "driver": driver}


def gpu_env(arch: str) -> dict[str, str]:
    """The environment of every CUDA child: the one-architecture build in its own native cache
    (the pinned sdist linked in from the shared cache, so nothing is downloaded again)."""
    from native import config

    shared = config.cache_root()
    own = shared.parent / f"native-sm{arch}"
    (own / "sdist").mkdir(parents=True, exist_ok=True)
    for tarball in (shared / "sdist").glob("*.tar.gz"):
        link = own / "sdist" / tarball.name
        if not link.exists():
            link.symlink_to(tarball)
    return {"FLASHDESK_VARIANT": "cuda", "FLASHDESK_CUDA_ARCHS": arch, "FLASHDESK_NATIVE_CACHE": str(own)}


def cpu_env() -> dict[str, str]:
    return {"FLASHDESK_VARIANT": "cpu"}


def child(cmd: list[str], env: dict[str, str], timeout: int) -> str:
    """Run a child of this checkout; its stdout, or an error with the tail of its stderr."""
    res = subprocess.run(cmd, cwd=ROOT, env=os.environ | env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"exit {res.returncode}: {res.stderr[-2000:]}")
    return res.stdout


def flashdesk(args: list[str], env: dict[str, str], timeout: int) -> str:
    return child([sys.executable, "-m", "app.cli", *args], env, timeout)


def taps_child(out: Path, gpu: bool) -> None:
    """Every layer's tap of the bundled target over TAP_TOKENS, and each row's argmax, to out (.npz)."""
    from app.bundled import default_target
    from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, ModelPlacement, TokenBatch

    model = LlamaModel(default_target(), ModelPlacement(n_gpu_layers=999 if gpu else 0))
    ctx = LlamaContext(model, ContextConfig(n_ctx=256, n_batch=64, n_ubatch=64))
    batch = TokenBatch(64)
    try:
        ctx.enable_taps(list(range(model.info.n_layer)))
        batch.set(TAP_TOKENS, 0, True)
        ctx.decode(batch)
        taps = ctx.taps(len(TAP_TOKENS)).reshape(len(TAP_TOKENS), model.info.n_layer, -1)
        argmax, _ = ctx.argmax_rows(list(range(len(TAP_TOKENS))))
        np.savez(out, taps=taps, argmax=argmax, devices=np.array(model.device_names()))
    finally:
        batch.close()
        ctx.close()
        model.close()


def compare_taps(cpu: Path, gpu: Path) -> dict:
    a, b = np.load(cpu), np.load(gpu)
    err = np.abs(a["taps"] - b["taps"]).max(axis=(0, 2)) / np.maximum(np.abs(a["taps"]).max(axis=(0, 2)), 1e-30)
    same = float((a["argmax"] == b["argmax"]).mean())
    return {"ok": bool(err.max() <= TAPS_TOL), "tolerance": TAPS_TOL, "max_rel_err_by_layer": err.round(5).tolist(),
            "argmax_agreement": same, "devices": b["devices"].tolist(), "rows": len(TAP_TOKENS)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-dry-run", action="store_true", help="CPU variant, tiny budgets: checks the script")
    ap.add_argument("--out", help="the JSON (default docs/bench/gpu-check.json; dry run: under ~/.cache/flashdesk)")
    ap.add_argument("--standin", help="stand-in shape (default qwen3-4b; dry run: small)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="CUDA build jobs (default: all cores)")
    ap.add_argument("--taps-ref", help="the CPU's taps (.npz from --taps-child on a CPU machine) instead of "
                    "computing them here (a lent machine that carries no CPU build)")
    ap.add_argument("--work", help="keep every step's own output (taps, verify-cost and bench JSONs) in this folder")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="skip the steps that would start after this many seconds; cap each step's timeout")
    ap.add_argument("--taps-child", help=argparse.SUPPRESS)
    ap.add_argument("--gpu", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.taps_child:
        taps_child(Path(args.taps_child), args.gpu)
        return 0

    dry = args.cpu_dry_run
    budget = DRY if dry else GPU
    standin_shape = args.standin or budget.standin
    out_path = Path(args.out or (Path.home() / ".cache/flashdesk/gpu-check-dry-run.json" if dry
                                 else ROOT / "docs/bench/gpu-check.json"))
    report: dict = {"dry_run": dry, "budget": budget.__dict__, "steps": {}}
    t_start = time.time()
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work = Path(args.work) if args.work else scratch
    work.mkdir(parents=True, exist_ok=True)

    def left() -> float:
        return float("inf") if args.deadline_s is None else args.deadline_s - (time.time() - t_start)

    def step(name: str, fn):  # noqa: ANN001, ANN202 - a step's body
        t0 = time.time()
        try:
            if left() <= 0:
                raise TimeoutError(f"skipped: past the deadline of {args.deadline_s} s")
            result = fn()
            entry = {"ok": not (isinstance(result, dict) and result.get("ok") is False), "result": result}
        except Exception as e:  # noqa: BLE001 - every failure is one step's record
            entry = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        entry["seconds"] = round(time.time() - t0, 1)
        report["steps"][name] = entry
        print(f"[gpu-check] {name}: {'ok' if entry['ok'] else 'FAILED'} ({entry['seconds']} s)", file=sys.stderr,
              flush=True)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(report, indent=2) + "\n")  # what is done so far survives a kill
        return entry.get("result")

    def t_left(cap: int) -> int:  # a step's timeout: its budget, or what is left before the deadline
        return max(1, int(min(cap, left())))

    t = budget.step_timeout_s
    dev = step("device", lambda: {"name": "cpu dry run", "arch": None} if dry else device())
    if dev is None:
        return 1
    env = cpu_env() if dry else gpu_env(dev["arch"])
    gpu = [] if dry else ["--gpu"]
    step("build", lambda: child([sys.executable, "-m", "native.build", "--variant", env["FLASHDESK_VARIANT"],
                                 "--jobs", str(args.jobs)], env, 1800).strip().splitlines()[-1:])

    def taps() -> dict:
        ref, got = scratch / "taps-cpu.npz", work / "taps-device.npz"
        if args.taps_ref:
            ref = Path(args.taps_ref)
        else:
            child([sys.executable, __file__, "--taps-child", str(ref)], cpu_env(), t_left(t))
        child([sys.executable, __file__, "--taps-child", str(got), *gpu], env, t_left(t))
        return compare_taps(ref, got)

    step("taps", taps)
    standin_dir = Path.home() / ".cache/flashdesk/standin"
    names = [standin_dir / f"standin-{standin_shape}-Q4_K_M.gguf",
             standin_dir / f"standin-{standin_shape}-dflash-Q8_0.gguf"]
    pair = ["--target", str(names[0]), "--drafter", str(names[1])]

    sizes = ",".join(str(n) for n in range(1, 17))

    def verify_cost(target: list[str], name: str) -> dict:
        f = work / f"verify-cost-{name}.json"
        flashdesk(["verify-cost", *target, "--sizes", sizes, "--rounds", str(budget.verify_rounds), *gpu,
                   "--json", str(f)], env, t_left(t))
        r = json.loads(f.read_text())
        return {"ms": r["flashdesk"]["ms"], "relative": r["flashdesk"]["relative"], "run": r["run"]}

    step("verify_cost_bundled", lambda: verify_cost([], "bundled"))

    def calibrate(model_args: list[str]) -> dict:  # the drafter pass (and every cost) as the loop sees it, afresh
        return json.loads(flashdesk(["calibrate", "--fresh", *model_args, *gpu], env, t_left(t)))

    prompts = scratch / "humaneval.jsonl"

    def bench(model_args: list[str], name: str) -> dict:
        if not prompts.exists():
            flashdesk(["prompts", "humaneval", "--out", str(prompts)], env, t_left(t))
        f = work / f"bench-{name}.json"
        flashdesk(["bench", *model_args, "--prompts", str(prompts), "--mode", "plain,fixed,hybrid", "--draft-max",
                   "15", "--limit", str(budget.bench_prompts), "--max-tokens", str(budget.bench_tokens), *gpu,
                   "--json", str(f)], env, t_left(t * 2))
        return json.loads(f.read_text())["summary"]

    if budget.bench_bundled:
        step("calibrate", lambda: calibrate([]))
        step("bench_bundled", lambda: bench([], "bundled"))

    def write_standin() -> list[str]:
        if not all(p.exists() for p in names):
            child([sys.executable, "-m", "gguf_tools", "synth", "standin", str(standin_dir), "--shape", standin_shape],
                  env, t_left(t))
        return [str(p) for p in names]

    have_standin = step("standin", write_standin) is not None
    if have_standin:
        step("verify_cost_standin", lambda: verify_cost(pair[:2], "standin"))
        if not budget.bench_bundled:  # the dry run calibrates the stand-in only (see Budget)
            step("calibrate", lambda: calibrate(pair))
        step("bench_standin", lambda: bench(pair, "standin"))

        def forced() -> dict:
            f = work / "forced-loop-standin.json"
            child([sys.executable, "-m", "app.bench.forced_loop", *pair, "--max-tokens", str(budget.forced_tokens),
                   *gpu, "--json", str(f)], env, t_left(t * 2))
            return json.loads(f.read_text())

        step("forced_loop_standin", forced)
    report["seconds"] = round(time.time() - t_start, 1)
    report["ok"] = all(s["ok"] for s in report["steps"].values())
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[gpu-check] wrote {out_path} ({report['seconds']} s): {'ok' if report['ok'] else 'FAILED'}",
          file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
