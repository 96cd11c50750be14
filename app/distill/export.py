"""Write a trained drafter as a `dflash` GGUF that the patched llama.cpp loads.

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

from app.distill.model import Drafter
from gguf_tools.header import add_transformer_header
from gguf_tools.reader import read_gguf
from gguf_tools.synth import copy_vocab


def export_gguf(model: Drafter, target: str | Path, out: str | Path, dtype: str = "f16",
                name: str = "flashdesk dflash drafter") -> Path:
    """dtype: f16 or f32 for the matrices (norms stay f32). Quantize afterwards with gguf_tools.quantize."""
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

    def t(x: torch.Tensor, matrix: bool = True) -> np.ndarray:
        a = x.detach().to(torch.float32).cpu().numpy()
        return a.astype(mat_dtype) if matrix else a

    # fc stays F32: it multiplies the raw target features, and ggml converts the
    # activations of an F16 matmul to F16, where Gemma's (values past 65504) overflow to inf
    w.add_tensor("fc.weight", t(model.fc.weight, matrix=False))
    w.add_tensor("enc.output_norm.weight", t(model.hidden_norm.weight, False))
    w.add_tensor("output_norm.weight", t(model.output_norm.weight, False))
    w.add_tensor("output.weight", t(model.head))
    w.add_tensor("d2t", model.d2t.detach().cpu().numpy().astype(np.int64))
    for i, layer in enumerate(model.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", t(layer.attn_norm.weight, False))
        w.add_tensor(p + "attn_q.weight", t(layer.wq.weight))
        w.add_tensor(p + "attn_k.weight", t(layer.wk.weight))
        w.add_tensor(p + "attn_v.weight", t(layer.wv.weight))
        w.add_tensor(p + "attn_output.weight", t(layer.wo.weight))
        w.add_tensor(p + "attn_q_norm.weight", t(layer.q_norm.weight, False))
        w.add_tensor(p + "attn_k_norm.weight", t(layer.k_norm.weight, False))
        w.add_tensor(p + "ffn_norm.weight", t(layer.ffn_norm.weight, False))
        w.add_tensor(p + "ffn_gate.weight", t(layer.gate.weight))
        w.add_tensor(p + "ffn_up.weight", t(layer.up.weight))
        w.add_tensor(p + "ffn_down.weight", t(layer.down.weight))
        if layer.attn_post_norm is not None:
            w.add_tensor(p + "post_attention_norm.weight", t(layer.attn_post_norm.weight, False))
            w.add_tensor(p + "post_ffw_norm.weight", t(layer.ffn_post_norm.weight, False))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(out)
    return out
