"""A trained drafter as a `dflash` GGUF that the patched llama.cpp loads, and
back: `export_gguf` writes one, `load_drafter_gguf` reads one into PyTorch (a
warm start: training goes on from a shipped drafter, with its draft vocabulary).

Keys and tensor names: docs/design.md, section 2. The drafter
carries its own copy of the target's tokenizer and sets
tokenizer.ggml.mask_token_id (Gemma's GGUF has `<mask>` at id 4 but no key).
With a reduced draft vocabulary it ships its own head (`output.weight`, the
target's rows for those tokens) and `d2t` (draft row -> target token id);
the token embeddings stay shared with the target through ctx_other.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from app.distill.model import Drafter, DrafterConfig
from app.distill.target_weights import TargetWeights
from gguf_tools.formats import TRAINED_SPAN_KEY
from gguf_tools.header import add_transformer_header
from gguf_tools.reader import read_gguf
from gguf_tools.synth import copy_vocab

TOKENS_KEY = "flashdesk.distill.tokens"  # labelled tokens the drafter has been trained on, warm starts included

# drafter layer attribute -> GGUF tensor name (blk.<i>.<name>.weight); the one table both directions use
LAYER_TENSORS = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
                 "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "ffn_norm": "ffn_norm", "gate": "ffn_gate",
                 "up": "ffn_up", "down": "ffn_down", "attn_post_norm": "post_attention_norm",
                 "ffn_post_norm": "post_ffw_norm"}


def trained_tensors(model: Drafter) -> list[tuple[str, torch.nn.Parameter]]:
    """(GGUF name, parameter) of every trained weight (the head and d2t are not trained)."""
    out = [("fc.weight", model.fc.weight), ("enc.output_norm.weight", model.hidden_norm.weight),
           ("output_norm.weight", model.output_norm.weight)]
    for i, layer in enumerate(model.layers):
        for attr, name in LAYER_TENSORS.items():
            mod = getattr(layer, attr)
            if mod is not None:
                out.append((f"blk.{i}.{name}.weight", mod.weight))
    return out


def export_gguf(model: Drafter, target: str | Path, out: str | Path, dtype: str = "f16",
                name: str = "flashdesk dflash drafter", tokens: int | None = None, span: int | None = None) -> Path:
    """dtype: f16 or f32 for the matrices (norms stay f32). Quantize afterwards with gguf_tools.quantize.
    `tokens`: the labelled tokens it has been trained on (kept in the file for the learning curve);
    `span`: the longest sequence it was trained on (the engine's default window for it)."""
    c = model.c
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    info = read_gguf(target)
    mat_dtype = np.float16 if dtype == "f16" else np.float32
    w = gguf.GGUFWriter(str(tmp), "dflash")
    w.add_name(name)
    add_transformer_header(w, n_ctx=int(info.arch_get("context_length", c.n_ctx)), n_embd=c.n_embd,
                           n_layer=c.n_layer, n_ff=c.n_ff, n_head=c.n_head, n_head_kv=c.n_head_kv,
                           head_dim=c.head_dim, rms_eps=c.rms_eps)
    w.add_rope_freq_base(c.rope_base)
    w.add_target_layers(list(c.target_layers))
    w.add_block_size(c.block_size)
    if c.embedding_scale != 1.0:
        w.add_float32("dflash.embedding_scale", float(c.embedding_scale))
    if c.activation == "gelu":
        w.add_string("dflash.hidden_activation", "gelu_pytorch_tanh")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    copy_vocab(w, Path(target))
    w.add_mask_token_id(int(c.mask_token_id))
    if tokens is not None:
        w.add_uint64(TOKENS_KEY, int(tokens))
    if span is not None:
        w.add_uint32(TRAINED_SPAN_KEY, int(span))

    def t(x: torch.Tensor, matrix: bool = True) -> np.ndarray:
        a = x.detach().to(torch.float32).cpu().numpy()
        return a.astype(mat_dtype) if matrix else a

    w.add_tensor("output.weight", t(model.head))
    w.add_tensor("d2t", model.d2t.detach().cpu().numpy().astype(np.int64))
    for gname, p in trained_tensors(model):
        # fc stays F32: it multiplies the raw target features, and ggml converts the activations of an
        # F16 matmul to F16, where Gemma's (values past 65504) overflow to inf; norms are vectors
        w.add_tensor(gname, t(p, matrix=p.dim() == 2 and gname != "fc.weight"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(out)
    return out


def load_drafter_gguf(path: str | Path, target: str | Path) -> tuple[Drafter, int | None]:
    """A drafter GGUF (any type gguf-py dequantizes: F16, Q8_0, ...) as a trainable model, with its own
    draft vocabulary and the target's head rows for it (what export writes); and the tokens it says it
    was trained on (None when the file does not say)."""
    path = Path(path)
    d, t = read_gguf(path), read_gguf(target)
    if d.arch != "dflash":
        raise ValueError(f"{path}: a {d.arch!r} file, not a DFlash drafter")
    if d.n_embd != t.n_embd:
        raise ValueError(f"{path}: width {d.n_embd}, the target {Path(target).name} has {t.n_embd}")
    dw, tw = TargetWeights(path), TargetWeights(target)
    c = DrafterConfig(
        n_embd=d.n_embd, n_layer=d.n_layer, n_head=int(d.arch_get("attention.head_count")),
        n_head_kv=int(d.arch_get("attention.head_count_kv")), head_dim=int(d.arch_get("attention.key_length")),
        n_ff=int(d.arch_get("feed_forward_length")), target_layers=[int(x) for x in d.arch_get("target_layers")],
        block_size=int(d.arch_get("block_size", 16)), mask_token_id=int(d.get("tokenizer.ggml.mask_token_id")),
        rms_eps=float(d.arch_get("attention.layer_norm_rms_epsilon")), rope_base=float(d.arch_get("rope.freq_base")),
        embedding_scale=float(d.arch_get("embedding_scale", 1.0)),
        activation="gelu" if "gelu" in str(d.arch_get("hidden_activation", "silu")) else "silu",
        post_norms=dw.has("blk.0.post_attention_norm.weight"), n_ctx=int(d.arch_get("context_length", 32768)))
    d2t = torch.from_numpy(dw.integers("d2t") if dw.has("d2t") else np.arange(t.n_vocab, dtype=np.int64))
    model = Drafter(c, torch.from_numpy(tw.token_embd().copy()), torch.from_numpy(tw.output_head()[d2t.numpy()]), d2t)
    with torch.no_grad():
        for gname, p in trained_tensors(model):
            p.copy_(torch.from_numpy(dw.get(gname)).reshape(p.shape))
    tokens = d.get(TOKENS_KEY)
    return model, int(tokens) if tokens is not None else None
