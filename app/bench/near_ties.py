"""`flashdesk near-ties`: how far a verify pass's logits move from single-token decoding.

The lossless check (app.engine.lossless) accepts an emitted token within
NEAR_TIE_MARGIN logits of the single-token argmax, because batched and
single-token kernels may round differently. This measures that difference
instead of asserting it: greedy plain outputs of a few prompts are decoded
again, teacher-forced, in windows of n tokens (one batched pass per window,
every row an output) and one token at a time, and for every position the
batched pass's argmax logit is compared with the single-token logit of the
same token (and the whole rows). Also counted: the positions whose
single-token top-1 / top-2 gap is inside the margin (where a rounding
difference could flip the greedy choice).

Run in child processes, since the kernels are chosen when the library loads:
FlashDesk's CPU kernels, and with --compare-stock llama.cpp's own
(GGML_CPU_SMALLBATCH=0, GGML_CPU_FA_SMALL=0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from app.bench.info import run_info
from app.bench.verify_cost import STOCK_ENV
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, ModelPlacement, TokenBatch
from app.engine.lossless import NEAR_TIE_MARGIN

QUANTILES = (0.5, 0.9, 0.99, 0.999, 1.0)


def measure(target: Path, prompts: list[str], sizes: list[int], n_tokens: int, n_threads: int = 0,
            n_gpu_layers: int = 0) -> dict:
    """{n: [(batch argmax logit - single logit of that token), max |row difference|, same argmax]...},
    and the single-token top-1/top-2 gaps of every output position (n_gpu_layers: llama.cpp's, 999 = all:
    a GPU's batched and single-token kernels differ more than the CPU's)."""
    model = LlamaModel(target, ModelPlacement(n_gpu_layers=n_gpu_layers))
    ctx = LlamaContext(model, ContextConfig(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=n_threads))
    batch = TokenBatch(512)
    per_n: dict[int, list[tuple[float, float, bool]]] = {n: [] for n in sizes}
    top_gaps: list[float] = []
    try:
        for text in prompts:
            prompt = model.tokenize(text, add_special=True, parse_special=True)
            ctx.clear()
            for i in range(0, len(prompt) - 1, 512):
                chunk = prompt[i:min(i + 512, len(prompt) - 1)]
                batch.set(chunk, i, False)
                ctx.decode(batch)
            seq = list(prompt)
            for _ in range(n_tokens):  # greedy plain decoding, one token at a time
                batch.set([seq[-1]], len(seq) - 1, True)
                ctx.decode(batch)
                tok, gap = ctx.argmax_rows([0])
                top_gaps.append(float(gap[0]))
                seq.append(int(tok[0]))
            # windows over the output, latest first: the cache only ever shrinks
            first = len(prompt) - 1
            windows = sorted(((s, n) for n in sizes for s in range(first, len(seq) - n, n)), reverse=True)
            for start, n in windows:
                ctx.seq_rm(start)
                batch.set(seq[start:start + n], start, True)
                ctx.decode(batch)
                rows = np.stack([ctx.logits_row(i).copy() for i in range(n)])
                ctx.seq_rm(start)
                for i in range(n):
                    batch.set([seq[start + i]], start + i, True)
                    ctx.decode(batch)
                    single = ctx.logits_row(0)
                    b = int(np.argmax(rows[i]))
                    per_n[n].append((float(rows[i][b] - single[b]), float(np.max(np.abs(rows[i] - single))),
                                     b == int(np.argmax(single))))
                ctx.seq_rm(start)
        return {"per_n": {str(n): v for n, v in per_n.items()}, "top_gaps": top_gaps}
    finally:
        batch.close()
        ctx.close()
        model.close()


def _quantiles(xs: list[float]) -> dict:
    a = np.abs(np.asarray(xs, dtype=np.float64))
    return {f"p{q * 100:g}": round(float(np.quantile(a, q)), 6) for q in QUANTILES} if a.size else {}


def summarize(raw: dict) -> dict:
    out = {"per_n": {}}
    every = []
    for n, rows in raw["per_n"].items():
        gaps = [r[0] for r in rows]
        every += gaps
        out["per_n"][n] = {"positions": len(rows), "abs_gap": _quantiles(gaps),
                           "max_abs_row_diff": round(max((r[1] for r in rows), default=0.0), 6),
                           "argmax_differs": sum(not r[2] for r in rows)}
    out["all"] = {"positions": len(every), "abs_gap": _quantiles(every),
                  "over_margin": sum(abs(g) > NEAR_TIE_MARGIN for g in every)}
    tg = raw["top_gaps"]
    out["outputs"] = {"positions": len(tg), "top1_top2_gap_within_margin": sum(g < NEAR_TIE_MARGIN for g in tg),
                      "top1_top2_gap": _quantiles(tg)}
    return out


def run(target: Path, prompts: list[str], sizes: list[int], n_tokens: int, compare_stock: bool,
        n_threads: int = 0, n_gpu_layers: int = 0) -> dict:
    out: dict = {"run": run_info(n_threads), "target": str(target), "margin": NEAR_TIE_MARGIN, "sizes": sizes,
                 "n_prompts": len(prompts), "n_tokens": n_tokens, "n_gpu_layers": n_gpu_layers}
    for kind in ["flashdesk"] + (["stock"] if compare_stock else []):
        env = os.environ | (STOCK_ENV if kind == "stock" else {})
        cmd = [sys.executable, "-m", "app.bench.near_ties", str(target), ",".join(map(str, sizes)), str(n_tokens),
               str(n_threads), str(n_gpu_layers)]
        res = subprocess.run(cmd, input=json.dumps(prompts), capture_output=True, text=True, env=env, timeout=3600)
        if res.returncode != 0:
            raise RuntimeError(f"near-ties child failed: {res.stderr[-1500:]}")
        out[kind] = summarize(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"[near-ties] {kind}: {out[kind]['all']}", file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":  # one child: TARGET SIZES N_TOKENS THREADS [GPU_LAYERS], prompts as JSON on stdin
    t, sz, n_tok, threads = sys.argv[1:5]
    print(json.dumps(measure(Path(t), json.loads(sys.stdin.read()), [int(x) for x in sz.split(",")], int(n_tok),
                             int(threads), int(sys.argv[5]) if len(sys.argv) > 5 else 0)))
