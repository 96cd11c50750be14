"""What llama.cpp allocates for a model on a device: cache and compute bytes.

The cache rules mirror llama.cpp (llama-context.cpp, llama-kv-cache*.cpp,
llama-memory-recurrent.cpp). The compute-buffer rules are the peak live
tensors of the reserve graph under ggml-alloc, found by reading the graph
and checked against memory_breakdown() of real loads (CPU, one and two RPC
devices; qwen3 and gemma3; tests/test_scheduler_rpc.py keeps them honest):

  graph inputs    KQ masks (f16 with flash attention: n_kv x n_tokens each), token
                  positions, KV row indices, output ids, the activation coming in;
                  with a pipelined split (2+ devices, all layers offloaded) the
                  scheduler keeps 4 copies of each (GGML_SCHED_MAX_COPIES)
  a layer         the FFN's gate, up and product (3 x n_ff) plus two residual-width
                  rows per token; a pipelined device that hands its output on keeps
                  one more query/residual-wide row per token
  the output      logits for every output row (n_vocab x n_outputs, f32) plus one
                  residual-width row per token: huge for 250k-token vocabularies
  taps            DFlash hidden-state taps are graph outputs: one residual row per
                  token each, on the device of the layer that produces them

Flash attention is assumed on (llama.cpp's "auto" picks it on CUDA and CPU);
without it attention would also hold n_kv x n_tokens x n_head scores.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from app.scheduler.errors import PlanInputError
from app.scheduler.profile import ModelProfile

# KV cache types the engine accepts (llama.cpp accepts more; these are the useful ones)
KV_TYPES = ("f16", "bf16", "f32", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
PIPELINE_COPIES = 4  # GGML_SCHED_MAX_COPIES of the pinned ggml


def ggml_type(name: str) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType[name.upper()]
    except KeyError:
        raise PlanInputError(f"unknown KV cache type {name!r}; use one of {', '.join(KV_TYPES)}") from None


def row_bytes(type_name: str, n: int) -> int:
    """ggml_row_size: bytes of n elements of a (possibly block-quantized) type."""
    block, size = GGML_QUANT_SIZES[ggml_type(type_name)]
    if n % block:
        raise PlanInputError(f"a {type_name} cache needs rows that are multiples of {block}; this model's are {n}")
    return n // block * size


def pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


@dataclass(frozen=True)
class ContextShape:
    """A context's sizes after llama.cpp's own adjustments (llama_context constructor)."""
    n_ctx: int  # padded to 256
    n_batch: int
    n_ubatch: int  # tokens of the worst-case (reserve) graph
    n_outputs: int  # output rows of the reserve graph
    type_k: str = "f16"
    type_v: str = "f16"
    n_rs_seq: int = 0  # recurrent-state rollback snapshots

    @classmethod
    def make(cls, n_ctx: int, n_batch: int = 512, n_ubatch: int = 512, causal: bool = True,
             type_k: str = "f16", type_v: str = "f16", n_rs_seq: int = 0) -> ContextShape:
        n_ctx = pad(max(1, n_ctx), 256)
        n_batch = min(n_ctx, n_batch) if causal else n_batch
        n_ubatch = min(n_batch, n_ubatch or n_batch)
        # n_outputs_max defaults to n_batch; the reserve graph asks for min(n_ubatch, that)
        return cls(n_ctx, n_batch, n_ubatch, min(n_ubatch, n_batch), type_k, type_v, n_rs_seq)


def cache_cells(p: ModelProfile, kind: str, cs: ContextShape) -> int:
    """KV cells of a layer kind: sliding-window caches hold the window plus one ubatch."""
    if kind == "swa":
        return min(cs.n_ctx, pad(p.n_swa + cs.n_ubatch, 256))
    return cs.n_ctx


def layer_cache_bytes(p: ModelProfile, il: int, cs: ContextShape) -> int:
    """The KV cache (or recurrent state) one layer keeps on its device."""
    ly = p.layers[il]
    if ly.kind == "recurrent":
        # f32 conv + ssm state, one row per sequence plus one per rollback snapshot
        return (p.n_embd_r + p.n_embd_s) * 4 * (1 + cs.n_rs_seq)
    cells = cache_cells(p, ly.kind, cs)
    return cells * (row_bytes(cs.type_k, ly.n_embd_k) + row_bytes(cs.type_v, ly.n_embd_v))


def _attn_kinds(p: ModelProfile, layers: list[int] | range) -> set[str]:
    return {p.layers[i].kind for i in layers if p.layers[i].kind in ("full", "swa")}


def _inputs(p: ModelProfile, cs: ContextShape, kinds: set[str]) -> int:
    """Masks, KV row indices and positions of the attention kinds in `kinds`."""
    T = cs.n_ubatch
    total = sum(cache_cells(p, k, cs) * T * 2 + T * 16 for k in kinds)  # f16 mask + i64 k/v row indices
    if kinds:
        total += T * 4 * p.n_pos_per_embd
    return total


def _layer_work(p: ModelProfile, T: int) -> int:
    return (3 * p.n_ff + 2 * p.n_embd) * T * 4


def logit_buffers(sampled: bool) -> int:
    """How many f32 logits buffers of the reserve graph's output rows the output device holds: llama.cpp's
    backend sampler attached (`sampled`: the argmax in the graph) keeps a second one (the RPC split's
    output device: +537.9 MB with Gemma's 262,144 x 512 output rows x 4 bytes = 536.9 MB, stop 45)."""
    return 2 if sampled else 1


def output_work(p: ModelProfile, cs: ContextShape, n_vocab: int | None = None, sampled: bool = False) -> int:
    """Peak of the output stage: f32 logits for every output row (logit_buffers of them)."""
    V = n_vocab if n_vocab is not None else p.n_vocab
    return (V * cs.n_outputs * logit_buffers(sampled) + p.n_embd * cs.n_ubatch) * 4


def device_compute(p: ModelProfile, cs: ContextShape, layers: list[int] | range, has_output: bool,
                   copies: int = 1, n_vocab: int | None = None, n_taps: int = 0, sampled: bool = False) -> int:
    """Compute buffer of a GPU-like device holding `layers` (and the output layer, with the backend
    sampler if `sampled`); `n_taps` hidden-state taps produced there are graph outputs, never reused
    by ggml-alloc."""
    if not layers and not has_output:
        return 0
    taps = n_taps * p.n_embd * cs.n_ubatch * 4
    T = cs.n_ubatch
    inputs = _inputs(p, cs, _attn_kinds(p, layers)) + p.n_embd * T * 4  # + the activation coming in
    if has_output:
        inputs += cs.n_outputs * 4  # output row ids
    work = _layer_work(p, T) if layers else 0
    if copies > 1 and layers and not has_output:
        work += max(p.n_embd, p.q_dim) * T * 4  # the hand-off row kept for the next device
    out = output_work(p, cs, n_vocab, sampled) if has_output else 0
    if copies > 1:
        return copies * inputs + max(work, out) + taps
    # one copy: inputs are ordinary tensors, freed before the output stage
    return max(inputs + work, out) + taps


def host_compute(p: ModelProfile, cs: ContextShape, copies: int, cpu_layers: list[int] | range,
                 cpu_has_output: bool, drafter: bool = False) -> int:
    """The CPU backend's compute buffer: every graph input lives there first, plus any
    layers (and the output layer) that run on the CPU."""
    T = cs.n_ubatch
    kinds = _attn_kinds(p, range(p.n_layer))
    inputs = _inputs(p, cs, kinds) + T * 4 + cs.n_outputs * 4  # + token ids + output ids
    emb = p.n_embd * T * 4  # token embeddings looked up on the CPU
    if drafter:
        # a DFlash drafter's reserve graph has no separate embeddings input
        return inputs + emb
    if copies > 1:
        # the embeddings input (unused by a token batch) is still a graph input, copied too
        return copies * (inputs + emb) + emb
    if not cpu_layers and not cpu_has_output:
        return inputs + 2 * emb
    work = _layer_work(p, T) if cpu_layers else 0
    out = output_work(p, cs) + emb + T * 4 if cpu_has_output else 0  # + the pinned embeddings input
    return max(inputs + 2 * emb + work, out)
