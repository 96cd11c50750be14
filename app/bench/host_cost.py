"""`python -m app.bench.host_cost`: the host-side work of one decode step with the model's compute
left out (issue 30, point 1), for verify sizes n = 1..16, projected against an RTX 3090 step.

The target decodes n tokens once per size; then each part a step does on the host around that pass
is timed on its own, repeated: the argmax of each row (in C, the greedy path), a sampled pick per
row over the logits in place (the sampling path: temperature 0.8, top-p 0.95, with top-k 40 and with
top-k off), the tapped hidden-state rows copied out of the target and into the
drafter's embedding batch, the context lookup, the controller's choice and observation, the
reply's text and stats (what an event carries), and a bare ctypes call (each step makes ~10).

Beside the argmax in C, the backend-greedy path (llama.cpp's backend sampling: a greedy sampler
chain attached to the context, the argmax in the graph, no logits copied out): reading its n
sampled tokens (backend_read), and the pass with the pick, timed whole on both paths, alternating,
on two contexts of the same model (pass_c: decode + argmax in C; pass_backend: decode with the
sampler + backend_read). Their difference is what the backend path costs or saves on this machine,
the argmax in the graph and the logits copy it no longer makes included.

On a GPU two more costs come with the pass and cannot be timed here: llama.cpp copies every
output row's logits from the device (n x n_vocab x 4 bytes over PCIe) and the taps likewise
(n x taps x n_embd x 4). They are projected at PCIE_BPS. A 3090 step of a bandwidth-bound
target is at least its weight bytes / RTX3090_BPS (the projection's step: that bound plus
STEP_OVERHEAD_S of launches and syncs).

    python -m app.bench.host_cost [--target T.gguf --drafter D.gguf] [--reps 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from app.bench.info import emit_result, run_info
from app.bundled import default_drafter, default_target
from app.engine.calibration import CostModel
from app.engine.controller import DraftController
from app.engine.draft_policy import DFLASH, Choice, StepInfo, StepTiming
from app.engine.llama_objects import ContextConfig, EmbeddingBatch, LlamaContext, LlamaModel, ModelPlacement, TokenBatch
from app.engine.lookup import ContextLookup
from app.engine.params import GenerationParams
from app.engine.sampling import TokenSampler
from app.engine.stats import GenerationStats
from app.engine.text_stream import TextStream
from gguf_tools.reader import read_gguf
from native.api import llama as lc

RTX3090_BPS = 936e9  # memory bandwidth, bytes/s (spec sheet)
PCIE_BPS = 25e9  # PCIe 4.0 x16, what a device-to-host copy gets in practice (32 GB/s nominal)
STEP_OVERHEAD_S = 0.5e-3  # kernel launches and the sync of one step (CUDA graphs cut it; assumed)
# Q4_K_M files (their sizes as published): an 8B (Llama 3.1 8B) and a 27B (Gemma 3 27B) target;
# vocabularies and widths for the PCIe copies
TARGETS = {"8B": {"bytes": 4.92e9, "n_vocab": 128256, "n_embd": 4096},
           "27B": {"bytes": 16.5e9, "n_vocab": 262144, "n_embd": 5376}}
N_TAPS = 5
PASS_REPS = 15  # whole passes per size and path (a pass is ~10-100 ms here: fewer than the parts)
# the parts of a greedy step on the argmax-in-C path (greedy_total sums these)
GREEDY_PARTS = ("argmax_c", "taps_out", "taps_into_drafter_batch", "lookup_find", "controller",
                "text_and_stats", "ctypes_calls_x10")


def _time(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of fn over reps calls (after one warm-up)."""
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _passes(ctx: LlamaContext, bctx: LlamaContext, batch: TokenBatch, tokens: list[int], pos: int,
            reps: int) -> dict[str, float]:
    """Median seconds of a pass of `tokens` at pos with its greedy pick, on the argmax-in-C path
    (ctx) and the backend-greedy path (bctx), alternating; each context is left with the pass."""
    times: dict[str, list[float]] = {"pass_c": [], "pass_backend": []}
    for i in range(reps + 1):  # the first round warms up
        for name, c in (("pass_c", ctx), ("pass_backend", bctx)):
            c.seq_rm(pos)
            batch.set(tokens, pos, True)
            t0 = time.perf_counter()
            c.decode(batch)
            c.greedy_rows(list(range(len(tokens))))
            if i:
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _parts(ctx: LlamaContext, bctx: LlamaContext, model: LlamaModel, n: int, prompt: list[int],
           inject: EmbeddingBatch, lookup: ContextLookup, policy: DraftController, step: StepInfo,
           reps: int) -> dict[str, float]:
    """Seconds of each host part of a step that verified n tokens (the pass just decoded, on ctx and
    on bctx, the backend-greedy context)."""
    idx = list(range(n))
    feats = ctx.taps(n)
    stream = TextStream(lambda t: model.token_to_piece(t), ["\nUser:"])
    stats = GenerationStats()
    sampler = TokenSampler(GenerationParams(temperature=0.8, top_p=0.95, seed=0))  # top-k 40, the default
    sampler_top_p = TokenSampler(GenerationParams(temperature=0.8, top_k=0, top_p=0.95, seed=0))

    def observe() -> None:
        c = policy.choose(step)
        policy.observe(Choice(DFLASH, c.k), n - 1, StepTiming(step_s=0.01))

    def event() -> None:
        stream.push(prompt[:n])
        stats.record_step(DFLASH, n - 1, n - 1, n, 0.01)

    return {
        "argmax_c": _time(lambda: ctx.argmax_rows(idx), reps),
        "backend_read": _time(lambda: bctx.greedy_rows(idx), reps),
        # a sampled reply (temperature 0.8, top-p 0.95; top-k 40, then off): each row's pick over the
        # logits in place (sampling.py: top-k's candidates by blocks, top-p's head sorted, not the row)
        "sample_rows": _time(lambda: [sampler.pick(ctx.logits_row(i)) for i in idx], reps),
        "sample_rows_top_p": _time(lambda: [sampler_top_p.pick(ctx.logits_row(i)) for i in idx], reps),
        "taps_out": _time(lambda: ctx.taps(n), reps),
        "taps_into_drafter_batch": _time(lambda: inject.set(feats, 0), reps),
        "lookup_find": _time(lambda: lookup.find(15), reps),
        "controller": _time(observe, reps),
        "text_and_stats": _time(event, reps),
        "ctypes_calls_x10": 10 * _time(lambda: lc.llama_n_ctx(ctx.ptr), reps),
    }


def measure(target: Path, drafter: Path | None, reps: int, n_threads: int = 0, pass_reps: int = PASS_REPS,
            gpu: bool = False) -> dict:
    model = LlamaModel(target, ModelPlacement(n_gpu_layers=999 if gpu else 0))
    ctx = LlamaContext(model, ContextConfig(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=n_threads))
    bctx = LlamaContext(model, ContextConfig(n_ctx=1024, n_batch=256, n_ubatch=256, n_threads=n_threads,
                                             backend_greedy_rows=16))
    # the drafter's tapped layers (layer-input ids), else N_TAPS spread over the target
    layers = list(read_gguf(drafter).arch_get("target_layers", [])) if drafter else []
    layers = layers or list(range(1, model.info.n_layer, max(1, model.info.n_layer // N_TAPS)))[:N_TAPS]
    ctx.enable_taps(layers)
    batch = TokenBatch(256)
    inject = EmbeddingBatch(64, len(layers) * model.n_embd)
    prompt = [(7 + 13 * i) % 4000 + 100 for i in range(200)]
    history = prompt + prompt[:300]  # a reply that repeats: the lookup finds matches
    lookup = ContextLookup()
    lookup.set_history(history)
    lookup.find(15)  # index it once, as the loop keeps it indexed
    cost = CostModel(verify_s=[0.0] + [0.008 * (1 + 0.1 * n / 15) for n in range(16)], draft_s=[0.0] + [0.0008] * 15)
    policy = DraftController(cost)
    step = StepInfo(lookup=lookup.find(15), has_drafter=True, pending_rows=1, n_past=len(history))
    rows: dict = {}
    try:
        if not bctx.use_backend_greedy(True):
            raise RuntimeError("llama.cpp could not attach a backend greedy sampler to this model's context")
        batch.set(prompt, 0, False)
        ctx.decode(batch)
        bctx.decode(batch)
        for n in range(1, 17):
            passes = _passes(ctx, bctx, batch, prompt[-1:] * n, len(prompt), max(1, min(reps, pass_reps)))
            part = _parts(ctx, bctx, model, n, prompt, inject, lookup, policy, step, reps)
            rows[str(n)] = {k: round(v * 1e6, 2) for k, v in {**part, **passes}.items()}
            # the greedy path pays the argmax, a sampled reply the picks instead
            greedy = sum(part[k] for k in GREEDY_PARTS)
            rows[str(n)]["greedy_total"] = round(greedy * 1e6, 2)
            rows[str(n)]["sampling_total"] = round((greedy - part["argmax_c"] + part["sample_rows"]) * 1e6, 2)
            rows[str(n)]["sampling_total_top_p"] = round(
                (greedy - part["argmax_c"] + part["sample_rows_top_p"]) * 1e6, 2)
            rows[str(n)]["sample_rows_per_row"] = round(part["sample_rows"] / n * 1e6, 2)
            rows[str(n)]["sample_rows_top_p_per_row"] = round(part["sample_rows_top_p"] / n * 1e6, 2)
            # the backend-greedy path: the tokens read instead of the argmax in C (on a GPU the argmax
            # in the graph is device time), and what its whole pass costs here beyond the C path's
            backend = greedy - part["argmax_c"] + part["backend_read"]
            rows[str(n)]["greedy_total_backend"] = round(backend * 1e6, 2)
            rows[str(n)]["backend_pass_extra"] = round((passes["pass_backend"] - passes["pass_c"]) * 1e6, 2)
            rows[str(n)]["argmax_c_per_row"] = round(part["argmax_c"] / n * 1e6, 2)
            rows[str(n)]["backend_read_per_row"] = round(part["backend_read"] / n * 1e6, 2)
            rows[str(n)]["backend_pass_extra_per_row"] = round((passes["pass_backend"] - passes["pass_c"]) / n * 1e6, 2)
    finally:
        inject.close()
        batch.close()
        ctx.close()
        bctx.close()
        model.close()
    return {"us_by_n": rows, "tap_layers": layers, "n_vocab": model.n_vocab, "n_embd": model.n_embd}


def project(us_by_n: dict) -> dict:
    """Each 3090 target's step and the share of it the host work and the PCIe copies take, per n."""
    out = {}
    for name, t in TARGETS.items():
        step_s = t["bytes"] / RTX3090_BPS + STEP_OVERHEAD_S
        by_n = {}
        for n, row in us_by_n.items():
            k = int(n)
            pcie_s = (k * t["n_vocab"] * 4 + k * N_TAPS * t["n_embd"] * 4) / PCIE_BPS
            taps_s = k * N_TAPS * t["n_embd"] * 4 / PCIE_BPS  # backend greedy: no logits copied
            by_n[n] = {"host_greedy_share": round(row["greedy_total"] * 1e-6 / step_s, 4),
                       "host_sampling_share": round(row["sampling_total"] * 1e-6 / step_s, 4),
                       "pcie_logits_and_taps_us": round(pcie_s * 1e6, 1),
                       "pcie_share": round(pcie_s / step_s, 4)}
            if "sampling_total_top_p" in row:
                by_n[n]["host_sampling_top_p_share"] = round(row["sampling_total_top_p"] * 1e-6 / step_s, 4)
            if "greedy_total_backend" in row:
                by_n[n].update({"host_greedy_backend_share": round(row["greedy_total_backend"] * 1e-6 / step_s, 4),
                                "pcie_taps_only_us": round(taps_s * 1e6, 1),
                                "pcie_taps_only_share": round(taps_s / step_s, 4)})
        out[name] = {"step_ms": round(step_s * 1e3, 3),
                     "arithmetic": f"{t['bytes'] / 1e9:.2f} GB / {RTX3090_BPS / 1e9:.0f} GB/s + "
                                   f"{STEP_OVERHEAD_S * 1e3:.1f} ms; PCIe n x ({t['n_vocab']} logits + {N_TAPS} x "
                                   f"{t['n_embd']} tap floats) x 4 B / {PCIE_BPS / 1e9:.0f} GB/s",
                     "by_n": by_n}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.bench.host_cost", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target GGUF (default: the bundled Gemma 3 270M: 262k vocabulary)")
    ap.add_argument("--drafter", help="its drafter, for the tapped layers (default: the bundled one)")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--pass-reps", type=int, default=PASS_REPS,
                    help="whole passes per size and path for pass_c / pass_backend")
    ap.add_argument("--gpu", action="store_true", help="every layer and the output on the GPU (a CUDA build)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    target = Path(args.target) if args.target else default_target()
    drafter = Path(args.drafter) if args.drafter else (default_drafter() if not args.target else None)
    m = measure(target, drafter, args.reps, args.threads, args.pass_reps, args.gpu)
    out = {"run": run_info(args.threads), "target": str(target), "reps": args.reps, "gpu": args.gpu, **m,
           "projection_rtx3090": project(m["us_by_n"])}
    return emit_result(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
