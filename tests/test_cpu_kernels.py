"""The CPU kernels of the patched build (native/patches/0003, 0005) and its sliding-window cache (0009): batch-
invariant small-batch matmuls and flash attention, the CPU variant chosen at
load, and agreement with llama.cpp's stock kernels."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.bundled import default_drafter
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import Choice
from app.engine.params import GenerationParams

ROOT = Path(__file__).resolve().parent.parent
STORY = "Write a long story about a dragon who learns to program computers. Chapter 1:"

# run in a fresh interpreter: teacher-forced logits of the bundled target over a fixed text
_LOGITS_SCRIPT = """
import json, sys
import numpy as np
from app.bundled import default_target
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, TokenBatch
from native.lib import cpu_variant
m = LlamaModel(default_target())
ctx = LlamaContext(m, ContextConfig(n_ctx=1024, n_batch=512, n_ubatch=512))
toks = m.tokenize(sys.argv[1])
tb = TokenBatch(512)
rows = []
for i, t in enumerate(toks):  # one token at a time: the plain-decoding path
    tb.set([t], i, True)
    ctx.decode(tb)
    rows.append(ctx.logits_row(0).copy())
np.save(sys.argv[2], np.stack(rows))
print(json.dumps({"cpu_variant": cpu_variant().name, "n": len(toks)}))
"""

_TEXT = ("The history of the printing press begins in the fifteenth century, when movable type made "
         "books cheaper to produce than ever before. def fibonacci(n):\n    if n < 2:\n        return n\n"
         "    return fibonacci(n - 1) + fibonacci(n - 2)\n") * 2


def _teacher_forced_logits(tmp_path: Path, name: str, **env: str) -> tuple[np.ndarray, dict]:
    out = tmp_path / f"{name}.npy"
    res = subprocess.run([sys.executable, "-c", _LOGITS_SCRIPT, _TEXT, str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env=os.environ | env)
    assert res.returncode == 0, res.stderr[-2000:]
    return np.load(out), json.loads(res.stdout.strip().splitlines()[-1])


def _generate(e: Engine, prompt: list[int], params: GenerationParams, override=None) -> list[int]:  # noqa: ANN001
    e.reset()
    out: list[int] = []
    for ev in e.generate(prompt, params, draft_override=override):
        out += ev.tokens
    return out


@pytest.mark.gemma
def test_speculative_greedy_is_bit_identical_to_plain(gemma_target: Path) -> None:
    """Every column of a verify pass is computed as a single-token pass would compute it, so
    greedy speculative output equals plain decoding token for token, whatever the drafts:
    the bundled drafter's, all-correct ones (every block accepted) and ones with a wrong
    token in most blocks (rollbacks). 600 tokens: past Gemma's 512-token sliding window.
    With llama.cpp's stock kernels this fails within a few tokens (docs/design.md, section 3)."""
    e = Engine(gemma_target, default_drafter(), EngineConfig(n_ctx=2048))
    try:
        prompt = e.tokenize(STORY)
        n = 600
        plain = _generate(e, prompt, GenerationParams(max_tokens=n, speculative=False))
        assert len(plain) == n

        def oracle(hist: list[int], choice: Choice) -> list[int]:
            i, k = len(hist) - len(prompt), choice.k
            return (plain[i:i + k] + [0] * k)[:k]

        rng = random.Random(0)

        def noisy(hist: list[int], choice: Choice) -> list[int]:
            d = oracle(hist, choice)
            if rng.random() < 0.7:
                d[rng.randrange(choice.k)] = rng.randrange(1000, 20000)
            return d

        for k, override in ((3, None), (15, oracle), (7, noisy)):
            out = _generate(e, prompt, GenerationParams(max_tokens=n, draft_max=k), override)
            first = next((i for i, (a, b) in enumerate(zip(plain, out)) if a != b), None)
            assert out == plain, f"k={k} {'natural' if override is None else override.__name__}: differs at {first}"
    finally:
        e.close()


@pytest.mark.gemma
def test_small_batch_kernels_agree_with_stock_kernels(tmp_path: Path) -> None:
    """The same build with the new kernels switched off (GGML_CPU_SMALLBATCH=0,
    GGML_CPU_FA_SMALL=0: llama.cpp's own kernels) gives the same teacher-forced argmax
    almost everywhere and logits within rounding. The bounds come from how far llama.cpp's
    stock kernels differ from themselves between two builds (the AVX2 and the AVX-512 one,
    measured 2026-12-01 on this text: mean |diff| 0.25 logits, argmax agreement 96.9%; ours
    against stock: 0.27, 97.6%): a wrong kernel (a misplaced block, a wrong scale) moves
    logits by whole units and breaks the argmax."""
    ours, info = _teacher_forced_logits(tmp_path, "ours")
    stock, _ = _teacher_forced_logits(tmp_path, "stock", GGML_CPU_SMALLBATCH="0", GGML_CPU_FA_SMALL="0")
    assert ours.shape == stock.shape and info["n"] > 100
    agree = float((ours.argmax(1) == stock.argmax(1)).mean())
    diff = float(np.abs(ours - stock).mean())
    assert agree >= 0.95, agree
    assert diff < 0.6, diff


# run in a fresh interpreter (the kernel switch is read once per process): a prompt of `cells`
# tokens, then verify passes of n = 1..16 tokens after it, each removed from the cache before the
# next; per output row its argmax and every 8th logit (the whole rows would be 140 MB)
_VERIFY_SCRIPT = """
import sys
import numpy as np
import pydoc_data.topics
from app.bundled import default_target
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, TokenBatch
cells, out, drop = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
m = LlamaModel(default_target())
ctx = LlamaContext(m, ContextConfig(n_ctx=1024, n_threads=2))
toks = m.tokenize(pydoc_data.topics.topics["execmodel"])[:cells + 16]
assert len(toks) == cells + 16
tb = TokenBatch(512)
for p0 in range(0, cells, 512):  # 64+ rows a batch: llama.cpp's tiled path on both sides, the same cache
    tb.set(toks[p0:min(p0 + 512, cells)], p0, False)
    ctx.decode(tb)
if drop:  # a stand-in for a kernel that skips a chunk: 64 cells of the global layers' context gone
    ctx.seq_rm(drop, drop + 64)
top, sub = [], []
for n in range(1, 17):
    tb.set(toks[cells:cells + n], cells, True)
    ctx.decode(tb)
    for i in range(n):
        row = ctx.logits_row(i)
        top.append(int(row.argmax()))
        sub.append(row[::8].copy())
    ctx.seq_rm(cells)
np.savez(out, top=np.array(top), sub=np.stack(sub))
"""
VERIFY_CELLS = 760  # past the 512-cell sliding window, 11 full 64-cell chunks and a partial one


def _verify_logits(tmp_path: Path, name: str, drop: int = 0, **env: str) -> dict[str, np.ndarray]:
    out = tmp_path / f"{name}.npz"
    res = subprocess.run([sys.executable, "-c", _VERIFY_SCRIPT, str(VERIFY_CELLS), str(out), str(drop)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env=os.environ | env)
    assert res.returncode == 0, res.stderr[-2000:]
    return dict(np.load(out))


@pytest.mark.gemma
def test_attention_kernel_agrees_with_stock_past_the_window_at_every_batch_size(tmp_path: Path) -> None:
    """Patch 0005 against llama.cpp's own flash attention (GGML_CPU_FA_SMALL=0; the matmuls and the
    prompt's pass are the same on both sides, so only the small-batch attention differs) where its
    chunking matters: verify passes of n = 1..16 tokens after 760 cells, 11 chunks of 64 and a part (the
    sliding-window layers mask whole chunks in front of their 512 cells; one-token stock decode
    takes its split-KV path past 512 keys). Measured 2026-12-02 on the 136 rows (every 8th logit):
    mean |diff| 0.11-0.30 per n, 0.136 with each row's mean difference taken out (a shift of a whole
    row changes no probability), argmax 136/136 (stock accumulates V in F16, ours in F32). The
    bounds are 1.5x those and 5 argmax flips. 64 cells missing from the cache, as a kernel that
    skipped a chunk would read it, measured: cells 640-703 (inside every layer's window) 0.34-0.62
    per n, 0.277 centred, 120/136 argmax; cells 128-191 (global layers only) 125/136 argmax."""
    ours = _verify_logits(tmp_path, "ours")
    stock = _verify_logits(tmp_path, "stock", GGML_CPU_FA_SMALL="0")
    assert ours["sub"].shape == stock["sub"].shape and len(ours["top"]) == sum(range(1, 17))
    diff = ours["sub"] - stock["sub"]
    row = 0
    for n in range(1, 17):
        d = float(np.abs(diff[row:row + n]).mean())
        assert d < 0.45, f"n={n}: mean |diff| {d:.3f}"
        row += n
    centred = float(np.abs(diff - diff.mean(axis=1, keepdims=True)).mean())
    assert centred < 0.2, centred
    assert int((ours["top"] != stock["top"]).sum()) <= 5


# run in a fresh interpreter (llama.cpp reads LLAMA_KV_SWA_BY_POS once): a prompt that fills the 1,024-cell
# ring of the sliding-window layers to 2 cells short of its end, then 8 tokens one at a time ("plain"), and
# again from the same prompt with a verify of 4 tokens that wraps past the ring's end and keeps only its
# first ("spec": 3 rejected, as speculation rejects drafts), then the same 7 tokens one at a time
_WRAP_SCRIPT = """
import sys
import numpy as np
import pydoc_data.topics
from app.bundled import default_target
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, TokenBatch
out, ring = sys.argv[1], 1024
m = LlamaModel(default_target())
ctx = LlamaContext(m, ContextConfig(n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=2))
toks = m.tokenize(" ".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)))[:ring + 6]
tb = TokenBatch(512)
def prompt():
    ctx.clear()
    for p0 in range(0, ring - 2, 512):
        tb.set(toks[p0:min(p0 + 512, ring - 2)], p0, False)
        ctx.decode(tb)
def one_at_a_time(p0):
    rows = []
    for p in range(p0, ring + 6):
        tb.set([toks[p]], p, True)
        ctx.decode(tb)
        rows.append(ctx.logits_row(0).copy())
    return rows
prompt()
plain = one_at_a_time(ring - 2)
prompt()
tb.set(toks[ring - 2:ring + 2], ring - 2, True)
ctx.decode(tb)
spec = [ctx.logits_row(0).copy()]
ctx.seq_rm(ring - 1)
spec += one_at_a_time(ring - 1)
np.savez(out, plain=np.stack(plain), spec=np.stack(spec))
"""


def _wrap_rows(tmp_path: Path, name: str, **env: str) -> dict[str, np.ndarray]:
    out = tmp_path / f"{name}.npz"
    res = subprocess.run([sys.executable, "-c", _WRAP_SCRIPT, str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=os.environ | env)
    assert res.returncode == 0, res.stderr[-2000:]
    return dict(np.load(out))


@pytest.mark.gemma
def test_a_rejected_verify_across_the_rings_wrap_leaves_decoding_bit_identical(tmp_path: Path) -> None:
    """Patch 0009: the sliding-window cache keeps each position in cell pos % size, so after a verify that
    wraps past the ring's end and is partly rejected the next tokens sit where one-token decoding puts them,
    and every row equals plain decoding's to the bit. With the stock search (LLAMA_KV_SWA_BY_POS=0) the
    rejection moves the cache's head to the wrapped cells and the rows after it differ (the same window,
    summed in another order): the replies of ~2,040-token document prompts cross this wrap at position
    2,048, and 3-4 of 8 parted from plain decoding at a near-tie (stop 60)."""
    ours = _wrap_rows(tmp_path, "ours")
    assert ours["plain"].shape == ours["spec"].shape == (8, ours["plain"].shape[1])
    assert np.array_equal(ours["plain"], ours["spec"])
    stock = _wrap_rows(tmp_path, "stock", LLAMA_KV_SWA_BY_POS="0")
    assert np.array_equal(stock["plain"][0], stock["spec"][0])  # before the rejection: the same cells
    assert not np.array_equal(stock["plain"][1:], stock["spec"][1:])


def test_forced_avx2_variant_runs(tmp_path: Path) -> None:
    """FLASHDESK_CPU_VARIANT picks the CPU backend: the AVX2 one runs on any x86-64 with AVX2
    (this machine too) and doctor says which one runs and why."""
    res = subprocess.run([sys.executable, "-m", "app.cli", "doctor", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=os.environ | {"FLASHDESK_CPU_VARIANT": "haswell"})
    rep = json.loads(res.stdout)
    assert rep["ok"], rep
    assert rep["cpu_variant"]["name"] == "haswell"
    assert rep["cpu_variant"]["reason"] == "forced by FLASHDESK_CPU_VARIANT"
    assert "haswell" in rep["cpu_variants_built"]


@pytest.mark.gemma
def test_avx2_variant_is_batch_invariant_too(gemma_target: Path, tmp_path: Path) -> None:
    """The AVX2 build of the kernels (VPMADDUBSW instead of VPDPBUSD) keeps the invariance."""
    script = """
import json, sys
from app.bundled import default_drafter, default_target
from app.engine.dflash import Engine, EngineConfig
from app.engine.params import GenerationParams
from native.lib import cpu_variant
e = Engine(default_target(), default_drafter(), EngineConfig(n_ctx=1024))
p = e.tokenize(sys.argv[1])
def run(params, override=None):
    e.reset(); out = []
    for ev in e.generate(p, params, draft_override=override):
        out += ev.tokens
    return out
plain = run(GenerationParams(max_tokens=120, speculative=False))
oracle = lambda h, c: (plain[len(h) - len(p):len(h) - len(p) + c.k] + [0] * c.k)[:c.k]
spec = run(GenerationParams(max_tokens=120, draft_max=7), oracle)
natural = run(GenerationParams(max_tokens=120, draft_max=3))
print(json.dumps({"variant": cpu_variant().name, "oracle": spec == plain, "natural": natural == plain}))
"""
    res = subprocess.run([sys.executable, "-c", script, STORY], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=os.environ | {"FLASHDESK_CPU_VARIANT": "haswell"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {"variant": "haswell", "oracle": True, "natural": True}


def test_unknown_cpu_variant_is_a_clear_error() -> None:
    res = subprocess.run([sys.executable, "-m", "app.cli", "doctor", "--json"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env=os.environ | {"FLASHDESK_CPU_VARIANT": "pentium"})
    rep = json.loads(res.stdout)
    assert rep["ok"] is False
    assert "FLASHDESK_CPU_VARIANT=pentium" in rep["error"] and "haswell" in rep["error"]
