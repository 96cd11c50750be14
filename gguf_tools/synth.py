"""Tiny random GGUF models for tests: targets of several architectures, DFlash
drafters that fit them, and a random drafter for any real target.

    python -m gguf_tools synth pair OUT_DIR [--arch qwen3|gemma3|lfm2|qwen35|...] [--mtp N]
    python -m gguf_tools synth drafter --target T.gguf --out D.gguf [--dflash2 K | --dspark | --eagle3]
    python -m gguf_tools synth standin OUT_DIR [--shape qwen3-4b|qwen3-1.7b|small]

A tiny target has a 64-token SPM vocabulary (lowercase letters, digits,
a few bigrams; `<mask>` = 3), 64-dim, 2-4
layers: about 1 MB, loads in milliseconds. Random weights give ~0 natural
acceptance; tests force drafts to exercise multi-token acceptance.

A stand-in (issue 30) is a real consumer target's shape (layers, widths,
vocabulary size) with random weights, quantized Q4_K_M, and a random Q8_0
DFlash drafter of the published drafters' shape: a pass reads as many bytes
as the real model's, so verify(n)/verify(1) and the drafter pass cost what
they would, while acceptance is forced (app.bench.forced).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from gguf_tools.header import add_transformer_header
from gguf_tools.quantize import quantize
from gguf_tools.reader import read_gguf

# Architectures with a tiny-target recipe here (see _layer_tensors).
TINY_ARCHS = ("qwen3", "llama", "gemma3", "gemma2", "mistral3", "phi3", "granite", "lfm2", "qwen35")
# lfm2: a hybrid whose even layers are short convolutions (a recurrent state of this many tokens, no KV)
LFM2_CONV_L_CACHE = 3
# qwen35 (Qwen3.5/3.6): gated-delta-net layers with full attention every 4th, and optionally MTP heads
# (nextn layers after the trunk); the delta net's sizes: conv kernel, state (= head size), key heads
# (groups), value heads (time-step rank)
QWEN35_SSM = {"d_conv": 4, "d_state": 16, "n_group": 2, "dt_rank": 4}
QWEN35_FULL_ATTENTION_INTERVAL = 4

_SPECIALS = ["<unk>", "<s>", "</s>", "<mask>"]
# single characters first (so any lowercase text tokenizes: SPM merges only
# through pieces in the vocabulary), then frequent bigrams; "<0x0A>" is newline
_PIECES = (["\u2581", "<0x0A>"] + list("abcdefghijklmnopqrstuvwxyz0123456789.,") +
           ["\u2581t", "th", "he", "\u2581a", "in", "er", "an", "re", "on", "at", "en", "nd", "es", "or",
            "\u2581s", "\u2581the", "ou", "it", "is", "\u2581i"])
TINY_VOCAB = _SPECIALS + _PIECES
TINY_MASK_ID = 3
assert len(TINY_VOCAB) == 64


@dataclass(frozen=True)
class TinyShape:
    n_embd: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_ctx: int = 1024


@dataclass(frozen=True)
class DFlash2Shape:
    """DFlash2's extra numbers (z-lab's drafters: top 16 candidates, a 2,048-token window; the
    tiny default keeps the hidden size >= top_k * (top_k + 1), which llama.cpp requires)."""
    conv_kernel_size: int = 3
    conv_group_size: int = 16
    selector_rank: int = 16
    selector_top_k: int = 4
    window: int = 2048


@dataclass(frozen=True)
class DSparkShape:
    """DSpark's extra parts: a Markov head (markov_w1/markov_w2 of this rank: a bias on each block
    position's logits from the previous draft token), a confidence head, and the block layout (the
    anchor's own row drafts first unless sample_from_anchor is false)."""
    markov_rank: int = 16
    confidence: bool = True
    sample_from_anchor: bool = True


def _tiny_vocab(w: gguf.GGUFWriter, n_vocab: int = len(TINY_VOCAB)) -> None:
    """The tiny vocabulary; a stand-in's padded to n_vocab with the byte tokens (any text tokenizes:
    SentencePiece falls back to bytes) and then pieces no text produces."""
    tokens = list(TINY_VOCAB)
    if n_vocab > len(tokens):
        tokens += [f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in TINY_VOCAB]
        tokens += [f"<r{i}>" for i in range(n_vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
             gguf.TokenType.NORMAL, gguf.TokenType.BYTE]
    w.add_token_types(types + [gguf.TokenType.BYTE if t.startswith("<0x") else gguf.TokenType.NORMAL
                               for t in tokens[len(types):]])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_mask_token_id(TINY_MASK_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def copy_vocab(w: gguf.GGUFWriter, target: Path) -> None:
    """A drafter carries its own copy of the target's tokenizer."""
    info = read_gguf(target)
    for key in info.metadata_keys():
        if not key.startswith("tokenizer.") or key == "tokenizer.ggml.mask_token_id":
            continue
        value = info.get(key)
        if key == "tokenizer.ggml.tokens":
            w.add_token_list(value)
        elif key == "tokenizer.ggml.scores":
            w.add_token_scores(value)
        elif key == "tokenizer.ggml.token_type":
            w.add_token_types(value)
        elif key == "tokenizer.ggml.merges":
            w.add_token_merges(value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)


class _Rand:
    def __init__(self, seed: int, dtype: type = np.float32):
        self.rng = np.random.default_rng(seed)
        self.dtype = dtype

    def mat(self, n_in: int, n_out: int, scale: float | None = None) -> np.ndarray:
        # numpy shape (n_out, n_in) == ggml ne (n_in, n_out)
        s = scale if scale is not None else 1.0 / math.sqrt(n_in)
        return (self.rng.standard_normal((n_out, n_in)) * s).astype(self.dtype)

    def norm(self, n: int) -> np.ndarray:
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)


def _lfm2_is_conv(il: int) -> bool:
    return il % 2 == 0


def _ffn_tensors(s: TinyShape, r: _Rand, p: str) -> dict[str, np.ndarray]:
    return {p + "ffn_gate.weight": r.mat(s.n_embd, s.n_ff), p + "ffn_up.weight": r.mat(s.n_embd, s.n_ff),
            p + "ffn_down.weight": r.mat(s.n_ff, s.n_embd)}


def _qwen35_layer_tensors(s: TinyShape, r: _Rand, il: int) -> dict[str, np.ndarray]:
    """A Qwen3.5 block: gated delta net or gated full attention (its attn_q carries the output gate),
    post-attention norm, FFN; a layer past the trunk is an MTP head (full attention + the nextn parts)."""
    p = f"blk.{il}."
    q_dim, kv_dim = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    t = {p + "attn_norm.weight": r.norm(s.n_embd), p + "post_attention_norm.weight": r.norm(s.n_embd),
         **_ffn_tensors(s, r, p)}
    if il < s.n_layer and (il + 1) % QWEN35_FULL_ATTENTION_INTERVAL != 0:
        ssm = QWEN35_SSM
        key_dim, value_dim = ssm["d_state"] * ssm["n_group"], ssm["d_state"] * ssm["dt_rank"]
        conv_dim = 2 * key_dim + value_dim
        return t | {p + "attn_qkv.weight": r.mat(s.n_embd, conv_dim),
                    p + "attn_gate.weight": r.mat(s.n_embd, value_dim),
                    p + "ssm_conv1d.weight": r.mat(ssm["d_conv"], conv_dim, scale=0.5),
                    p + "ssm_dt.bias": (0.1 * r.rng.standard_normal(ssm["dt_rank"])).astype(np.float32),
                    p + "ssm_a": (-np.exp(0.1 * r.rng.standard_normal(ssm["dt_rank"]))).astype(np.float32),
                    p + "ssm_beta.weight": r.mat(s.n_embd, ssm["dt_rank"]),
                    p + "ssm_alpha.weight": r.mat(s.n_embd, ssm["dt_rank"]),
                    p + "ssm_norm.weight": r.norm(ssm["d_state"]), p + "ssm_out.weight": r.mat(value_dim, s.n_embd)}
    t |= {p + "attn_q.weight": r.mat(s.n_embd, 2 * q_dim), p + "attn_k.weight": r.mat(s.n_embd, kv_dim),
          p + "attn_v.weight": r.mat(s.n_embd, kv_dim), p + "attn_output.weight": r.mat(q_dim, s.n_embd),
          p + "attn_q_norm.weight": r.norm(s.head_dim), p + "attn_k_norm.weight": r.norm(s.head_dim)}
    if il >= s.n_layer:  # an MTP head: [embedding ; hidden state] -> n_embd, then the block above
        t |= {p + "nextn.eh_proj.weight": r.mat(2 * s.n_embd, s.n_embd), p + "nextn.enorm.weight": r.norm(s.n_embd),
              p + "nextn.hnorm.weight": r.norm(s.n_embd), p + "nextn.shared_head_norm.weight": r.norm(s.n_embd)}
    return t


def _layer_tensors(arch: str, s: TinyShape, r: _Rand, il: int) -> dict[str, np.ndarray]:
    p = f"blk.{il}."
    q_dim, kv_dim = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    if arch == "qwen35":
        return _qwen35_layer_tensors(s, r, il)
    if arch == "lfm2" and _lfm2_is_conv(il):
        return {p + "attn_norm.weight": r.norm(s.n_embd), p + "ffn_norm.weight": r.norm(s.n_embd),
                p + "shortconv.conv.weight": r.mat(LFM2_CONV_L_CACHE, s.n_embd),
                p + "shortconv.in_proj.weight": r.mat(s.n_embd, 3 * s.n_embd),
                p + "shortconv.out_proj.weight": r.mat(s.n_embd, s.n_embd), **_ffn_tensors(s, r, p)}
    t = {p + "attn_norm.weight": r.norm(s.n_embd), p + "ffn_norm.weight": r.norm(s.n_embd),
         p + "attn_output.weight": r.mat(q_dim, s.n_embd), p + "ffn_down.weight": r.mat(s.n_ff, s.n_embd)}
    if arch == "phi3":
        t[p + "attn_qkv.weight"] = r.mat(s.n_embd, q_dim + 2 * kv_dim)
        t[p + "ffn_up.weight"] = r.mat(s.n_embd, 2 * s.n_ff)
        return t
    t[p + "attn_q.weight"] = r.mat(s.n_embd, q_dim)
    t[p + "attn_k.weight"] = r.mat(s.n_embd, kv_dim)
    t[p + "attn_v.weight"] = r.mat(s.n_embd, kv_dim)
    t[p + "ffn_gate.weight"] = r.mat(s.n_embd, s.n_ff)
    t[p + "ffn_up.weight"] = r.mat(s.n_embd, s.n_ff)
    if arch in ("qwen3", "gemma3", "lfm2"):
        t[p + "attn_q_norm.weight"] = r.norm(s.head_dim)
        t[p + "attn_k_norm.weight"] = r.norm(s.head_dim)
    if arch in ("gemma2", "gemma3"):
        t[p + "post_attention_norm.weight"] = r.norm(s.n_embd)
        t[p + "post_ffw_norm.weight"] = r.norm(s.n_embd)
    return t


def write_tiny_target(path: str | Path, arch: str = "qwen3", shape: TinyShape = TinyShape(), seed: int = 0,
                      tied_output: bool = False, chat_template: str | None = None, mtp_layers: int = 0) -> Path:
    """A tiny random F32 target of architecture `arch` with the tiny vocabulary
    (and `chat_template` as its tokenizer.chat_template, when given); qwen35 with `mtp_layers` MTP heads."""
    if mtp_layers and arch != "qwen35":
        raise ValueError(f"MTP heads: only the qwen35 recipe has them, not {arch!r}")
    if arch not in TINY_ARCHS:
        raise ValueError(f"no tiny recipe for architecture {arch!r}; have {', '.join(TINY_ARCHS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    r = _Rand(seed)
    s = shape
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("flashdesk tiny random target")  # no arch in the name: llama.cpp special-cases "phi3" names
    n_head_kv = ([0 if _lfm2_is_conv(il) else s.n_head_kv for il in range(s.n_layer)] if arch == "lfm2"
                 else s.n_head_kv)
    add_transformer_header(w, n_ctx=s.n_ctx, n_embd=s.n_embd, n_layer=s.n_layer + mtp_layers, n_ff=s.n_ff,
                           n_head=s.n_head, n_head_kv=n_head_kv, head_dim=s.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(s.head_dim)
    if arch == "qwen35":
        ssm = QWEN35_SSM
        w.add_ssm_conv_kernel(ssm["d_conv"])
        w.add_ssm_state_size(ssm["d_state"])
        w.add_ssm_group_count(ssm["n_group"])
        w.add_ssm_time_step_rank(ssm["dt_rank"])
        w.add_ssm_inner_size(ssm["d_state"] * ssm["dt_rank"])
        w.add_full_attention_interval(QWEN35_FULL_ATTENTION_INTERVAL)
        half = s.head_dim // 2  # interleaved M-RoPE over the rotary pairs (text: all sections one position)
        w.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
        if mtp_layers:
            w.add_nextn_predict_layers(mtp_layers)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch == "gemma2":
        w.add_sliding_window(256)
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(30.0)
    if arch == "gemma3":
        w.add_sliding_window(256)
    if arch == "lfm2":
        w.add_shortconv_l_cache(LFM2_CONV_L_CACHE)
    if arch == "granite":
        w.add_logit_scale(1.0 / 4.0)
        w.add_residual_scale(0.5)
        w.add_embedding_scale(2.0)
        w.add_attention_scale(1.0 / s.head_dim)
    _tiny_vocab(w)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", r.mat(s.n_embd, len(TINY_VOCAB), scale=1.0))
    # (llama.cpp reads LFM2's final norm under the name token_embd_norm)
    w.add_tensor("token_embd_norm.weight" if arch == "lfm2" else "output_norm.weight", r.norm(s.n_embd))
    if not tied_output and arch not in ("gemma2", "gemma3"):
        w.add_tensor("output.weight", r.mat(s.n_embd, len(TINY_VOCAB)))
    for il in range(s.n_layer + mtp_layers):
        for name, arr in _layer_tensors(arch, s, r, il).items():
            w.add_tensor(name, arr)
    _finish(w)
    return path


def default_target_layers(n_layer: int, n_taps: int) -> list[int]:
    """DFlash's spacing (z-lab build_target_layer_ids): n_taps layers evenly from
    1 to n_layer-3, as layer-input ids (+1), the convention of llama.cpp GGUFs."""
    if n_taps == 1:
        return [n_layer // 2 + 1]
    lo, hi = 1, max(1, n_layer - 3)
    return [int(round(lo + i * (hi - lo) / (n_taps - 1))) + 1 for i in range(n_taps)]


def write_drafter(path: str | Path, target: str | Path, *, n_layer: int = 2, target_layers: list[int] | None = None,
                  block_size: int = 16, n_head: int | None = None, n_head_kv: int | None = None,
                  head_dim: int | None = None, n_ff: int | None = None, seed: int = 1,
                  dtype: type = np.float32, mask_token_id: int | None = None,
                  embedding_scale: float | None = None, dflash2: DFlash2Shape | None = None,
                  dspark: DSparkShape | None = None) -> Path:
    """A random DFlash drafter that fits `target` (any GGUF target): hidden size,
    vocabulary and tokenizer copied from it, the target's embeddings and output
    head shared through ctx_other (the drafter file has neither). `dflash2`: a
    DFlash2 drafter (per-layer short convolutions and the candidate selector, the
    keys and tensors llama.cpp's DFlash2 graph reads; no sliding window); `dspark`:
    a DSpark drafter (its Markov and confidence heads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    info = read_gguf(target)
    n_embd = info.n_embd
    n_head = n_head or int(info.arch_get("attention.head_count", 4))
    kv = info.arch_get("attention.head_count_kv", n_head)
    n_head_kv = n_head_kv or int(max(kv) if isinstance(kv, list) else kv)  # per layer in a hybrid (0: recurrent)
    head_dim = head_dim or int(info.arch_get("attention.key_length", n_embd // n_head))
    n_ff = n_ff or int(info.arch_get("feed_forward_length", 4 * n_embd))
    layers = target_layers or default_target_layers(info.n_layer, min(5, max(2, info.n_layer // 2)))
    if mask_token_id is None:
        mask_token_id = info.get("tokenizer.ggml.mask_token_id")
    if mask_token_id is None:
        tokens = info.get("tokenizer.ggml.tokens") or []
        mask_token_id = tokens.index("<mask>") if "<mask>" in tokens else None
    if mask_token_id is None:
        raise ValueError(f"{target}: no mask token (no tokenizer.ggml.mask_token_id and no '<mask>' in the vocabulary)")
    if embedding_scale is None and info.arch in ("gemma", "gemma2", "gemma3"):
        embedding_scale = math.sqrt(n_embd)  # Gemma scales its input embeddings by sqrt(n_embd)

    r = _Rand(seed, dtype)
    w = gguf.GGUFWriter(str(path), "dflash")
    w.add_name(f"dflash-random-for-{info.arch}")
    add_transformer_header(w, n_ctx=int(info.arch_get("context_length", 4096)), n_embd=n_embd, n_layer=n_layer,
                           n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim)
    w.add_rope_freq_base(float(info.arch_get("rope.freq_base", 10000.0)))
    w.add_target_layers(layers)
    w.add_block_size(block_size)
    if dflash2 is not None:
        w.add_conv_kernel_size(dflash2.conv_kernel_size)
        w.add_conv_group_size(dflash2.conv_group_size)
        w.add_selector_rank(dflash2.selector_rank)
        w.add_selector_top_k(dflash2.selector_top_k)
    if embedding_scale:
        w.add_float32("dflash.embedding_scale", float(embedding_scale))
    if dspark is not None and not dspark.sample_from_anchor:
        w.add_bool("dflash.sample_from_anchor", False)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == np.float32 else gguf.LlamaFileType.MOSTLY_F16)
    copy_vocab(w, Path(target))
    w.add_mask_token_id(int(mask_token_id))
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    w.add_tensor("fc.weight", r.mat(n_embd * len(layers), n_embd))
    w.add_tensor("enc.output_norm.weight", r.norm(n_embd))
    w.add_tensor("output_norm.weight", r.norm(n_embd))
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", r.norm(n_embd))
        w.add_tensor(p + "attn_q.weight", r.mat(n_embd, q_dim))
        w.add_tensor(p + "attn_k.weight", r.mat(n_embd, kv_dim))
        w.add_tensor(p + "attn_v.weight", r.mat(n_embd, kv_dim))
        w.add_tensor(p + "attn_output.weight", r.mat(q_dim, n_embd))
        w.add_tensor(p + "attn_q_norm.weight", r.norm(head_dim))
        w.add_tensor(p + "attn_k_norm.weight", r.norm(head_dim))
        w.add_tensor(p + "ffn_norm.weight", r.norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", r.mat(n_embd, n_ff))
        w.add_tensor(p + "ffn_up.weight", r.mat(n_embd, n_ff))
        w.add_tensor(p + "ffn_down.weight", r.mat(n_ff, n_embd))
        if dflash2 is not None:
            kernel, groups = dflash2.conv_kernel_size, n_embd // dflash2.conv_group_size
            for part in ("attn", "ffn"):
                # (a bare parameter, added to the projected kernel: kept f32)
                w.add_tensor(p + f"{part}_conv_base",
                             r.mat(n_embd, 2 * kernel).reshape(2, kernel, n_embd).astype(np.float32))
                w.add_tensor(p + f"{part}_conv_proj.weight", r.mat(n_embd, 2 * kernel * groups))
    if dflash2 is not None:
        n_vocab, rank = len(info.get("tokenizer.ggml.tokens") or []), dflash2.selector_rank
        w.add_tensor("selector_predecessor.weight", r.mat(rank, n_vocab, 1.0))
        w.add_tensor("selector_successor.weight", r.mat(rank, n_vocab, 1.0))
        w.add_tensor("selector_hidden.weight", r.mat(n_embd, rank))
    if dspark is not None:
        n_vocab, rank = len(info.get("tokenizer.ggml.tokens") or []), dspark.markov_rank
        w.add_tensor("markov_w1.weight", r.mat(rank, n_vocab, 1.0))
        w.add_tensor("markov_w2.weight", r.mat(rank, n_vocab))
        if dspark.confidence:
            w.add_tensor("conf_proj.weight", r.mat(n_embd + rank, 1))
            w.add_tensor("conf_proj.bias", np.zeros(1, dtype=np.float32))
    _finish(w)
    return path


def write_eagle3(path: str | Path, target: str | Path, *, target_layers: list[int] | None = None,
                 n_ff: int | None = None, seed: int = 3, dtype: type = np.float32) -> Path:
    """A random EAGLE-3 drafter that fits `target` (the keys and tensors llama.cpp's eagle3 graph
    reads): one decoder layer over [its token's embedding ; a state], the state first fc over three of
    the target's layer inputs (the encoder), then its own pre-norm output while it drafts; the target's
    embeddings and output head shared through ctx_other (the file has neither), its tokenizer copied."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    info = read_gguf(target)
    n_embd = info.n_embd
    n_head = int(info.arch_get("attention.head_count", 4))
    kv = info.arch_get("attention.head_count_kv", n_head)
    n_head_kv = int(max(kv) if isinstance(kv, list) else kv)
    head_dim = int(info.arch_get("attention.key_length", n_embd // n_head))
    n_ff = n_ff or int(info.arch_get("feed_forward_length", 4 * n_embd))
    layers = target_layers or [1, max(1, info.n_layer // 2), max(1, info.n_layer - 1)]
    if len(layers) != 3:
        raise ValueError(f"EAGLE-3 reads exactly 3 target layers, not {layers}")
    r = _Rand(seed, dtype)
    w = gguf.GGUFWriter(str(path), "eagle3")
    w.add_name(f"eagle3-random-for-{info.arch}")
    add_transformer_header(w, n_ctx=int(info.arch_get("context_length", 4096)), n_embd=n_embd, n_layer=1,
                           n_ff=n_ff, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim)
    w.add_rope_freq_base(float(info.arch_get("rope.freq_base", 10000.0)))
    w.add_target_layers(layers)
    w.add_target_hidden_size(n_embd)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == np.float32 else gguf.LlamaFileType.MOSTLY_F16)
    copy_vocab(w, Path(target))
    q_dim, kv_dim = n_head * head_dim, n_head_kv * head_dim
    w.add_tensor("fc.weight", r.mat(3 * n_embd, n_embd))
    w.add_tensor("output_norm.weight", r.norm(n_embd))
    p = "blk.0."
    w.add_tensor(p + "attn_norm.weight", r.norm(n_embd))
    w.add_tensor(p + "attn_norm_2.weight", r.norm(n_embd))
    w.add_tensor(p + "attn_q.weight", r.mat(2 * n_embd, q_dim))
    w.add_tensor(p + "attn_k.weight", r.mat(2 * n_embd, kv_dim))
    w.add_tensor(p + "attn_v.weight", r.mat(2 * n_embd, kv_dim))
    w.add_tensor(p + "attn_output.weight", r.mat(q_dim, n_embd))
    w.add_tensor(p + "ffn_norm.weight", r.norm(n_embd))
    for name, t in _ffn_tensors(TinyShape(n_embd=n_embd, n_ff=n_ff), r, p).items():
        w.add_tensor(name, t)
    _finish(w)
    return path


def write_tiny_pair(out_dir: str | Path, arch: str = "qwen3", seed: int = 0, block_size: int = 8,
                    shape: TinyShape = TinyShape(), chat_template: str | None = None,
                    mtp_layers: int = 0) -> tuple[Path, Path]:
    """(target, drafter) of about 1 MB together; drafter taps layers [1, n_layer-1]."""
    out_dir = Path(out_dir)
    target = write_tiny_target(out_dir / f"tiny-{arch}-target.gguf", arch, shape, seed,
                               chat_template=chat_template, mtp_layers=mtp_layers)
    drafter = write_drafter(out_dir / f"tiny-{arch}-dflash.gguf", target, n_layer=2,
                            target_layers=[1, shape.n_layer - 1], block_size=block_size, seed=seed + 1)
    return target, drafter


@dataclass(frozen=True)
class StandinShape:
    shape: TinyShape
    n_vocab: int
    drafter_layers: int


# Qwen3's published config.json (tied embeddings up to 4B); drafters of 5 layers, as z-lab's Qwen3 DFlash
# drafters (the 8B's config; the 4B's is not checked here). `small` is the dry run's, seconds to write,
# with Qwen3-4B's quirks: attention wider than the model (8 x 64 > 256) and 4 query heads per KV head.
STANDINS = {
    "qwen3-4b": StandinShape(TinyShape(n_embd=2560, n_layer=36, n_head=32, n_head_kv=8, head_dim=128, n_ff=9728,
                                       n_ctx=40960), 151936, 5),
    "qwen3-1.7b": StandinShape(TinyShape(n_embd=2048, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=6144,
                                         n_ctx=40960), 151936, 5),
    "small": StandinShape(TinyShape(n_embd=256, n_layer=6, n_head=8, n_head_kv=2, head_dim=64, n_ff=768,
                                    n_ctx=4096), 8192, 2),
}


def write_standin(out_dir: str | Path, key: str = "qwen3-4b", seed: int = 0) -> tuple[Path, Path]:
    """(target, drafter): a Qwen3 target of shape STANDINS[key], random Q4_K_M (written F16, quantized,
    the F16 file deleted), and a random Q8_0 DFlash drafter (block 16) for it. Every layer holds the
    same random tensors (the F16 file is streamed from one layer's arrays); the cost of a pass does
    not depend on the values."""
    spec = STANDINS[key]
    s = spec.shape
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    f16 = out_dir / f"standin-{key}-F16.tmp.gguf"
    target = out_dir / f"standin-{key}-Q4_K_M.gguf"
    r = _Rand(seed, np.float16)
    w = gguf.GGUFWriter(str(f16), "qwen3")
    w.add_name(f"flashdesk stand-in {key} (random weights)")
    add_transformer_header(w, n_ctx=s.n_ctx, n_embd=s.n_embd, n_layer=s.n_layer, n_ff=s.n_ff,
                           n_head=s.n_head, n_head_kv=s.n_head_kv, head_dim=s.head_dim)
    w.add_rope_freq_base(1e6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _tiny_vocab(w, spec.n_vocab)
    emb = np.empty((spec.n_vocab, s.n_embd), dtype=np.float16)  # tied: the output head too
    for i in range(0, spec.n_vocab, 8192):  # in chunks: float64 noise for all of it would be GBs
        emb[i:i + 8192] = r.rng.standard_normal((min(8192, spec.n_vocab - i), s.n_embd)).astype(np.float16)
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", r.norm(s.n_embd))
    layer = {name.split(".", 2)[2]: arr for name, arr in _layer_tensors("qwen3", s, r, 0).items()}
    for il in range(s.n_layer):
        for name, arr in layer.items():
            w.add_tensor(f"blk.{il}.{name}", arr)
    _finish(w)
    try:
        quantize(f16, target, "Q4_K_M")
    finally:
        f16.unlink(missing_ok=True)
    # the drafter as we ship drafters, Q8_0: an F16 one reads twice the bytes, and its pass on a CPU
    # cost 0.6-1.6x a target step (stop 40), far from a GPU's ~0.1x
    d16 = out_dir / f"standin-{key}-dflash-F16.tmp.gguf"
    drafter = out_dir / f"standin-{key}-dflash-Q8_0.gguf"
    write_drafter(d16, target, n_layer=spec.drafter_layers, block_size=16, seed=seed + 1, dtype=np.float16,
                  mask_token_id=TINY_MASK_ID)
    try:
        quantize(d16, drafter, "Q8_0")
    finally:
        d16.unlink(missing_ok=True)
    return target, drafter


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gguf_tools synth", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pair", help="write a tiny target + drafter")
    p.add_argument("out_dir")
    p.add_argument("--arch", default="qwen3", choices=TINY_ARCHS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mtp", type=int, default=0, metavar="N", help="qwen35: a target carrying N MTP heads")
    d = sub.add_parser("drafter", help="write a random drafter for a target GGUF")
    d.add_argument("--target", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--layers", type=int, default=2)
    d.add_argument("--block-size", type=int, default=16)
    d.add_argument("--f16", action="store_true")
    d.add_argument("--dflash2", type=int, default=0, metavar="TOP_K",
                   help="a DFlash2 drafter whose selector keeps the top TOP_K candidates (z-lab's: 16)")
    d.add_argument("--dspark", action="store_true", help="a DSpark drafter (Markov and confidence heads)")
    d.add_argument("--eagle3", action="store_true", help="an EAGLE-3 drafter (fc over 3 target layers, 1 layer)")
    st = sub.add_parser("standin", help="write a real target shape with random Q4_K_M weights + its drafter")
    st.add_argument("out_dir", help="e.g. ~/.cache/flashdesk/standin (GBs: not the repository)")
    st.add_argument("--shape", default="qwen3-4b", choices=sorted(STANDINS))
    args = ap.parse_args(argv)
    if args.cmd == "standin":
        for p in write_standin(Path(args.out_dir).expanduser(), args.shape):
            print(p)
    elif args.cmd == "pair":
        t, dr = write_tiny_pair(args.out_dir, args.arch, args.seed, mtp_layers=args.mtp)
        print(t)
        print(dr)
    elif args.eagle3:
        print(write_eagle3(args.out, args.target, dtype=np.float16 if args.f16 else np.float32))
    else:
        print(write_drafter(args.out, args.target, n_layer=args.layers, block_size=args.block_size,
                            dtype=np.float16 if args.f16 else np.float32,
                            dflash2=DFlash2Shape(selector_top_k=args.dflash2) if args.dflash2 else None,
                            dspark=DSparkShape() if args.dspark else None))
    return 0
