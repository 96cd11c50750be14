"""Tiny Hugging Face-format checkpoints for tests of the converter and the hub.

Two kinds, both random and small (a few hundred KB):

- `write_hf_target(dir)`: a LlamaForCausalLM folder as published on the hub
  (config.json, SentencePiece tokenizer.model, tokenizer_config.json,
  model.safetensors). llama.cpp's reference converter turns it into a target
  GGUF, and it is the `--target-model-dir` the reference needs for a drafter.
- `write_zlab_checkpoint(dir)`: a DFlash drafter in z-lab's published layout
  (config.json with `dflash_config`, model.safetensors with unprefixed names
  `fc`, `hidden_norm`, `layers.N.*`, `norm`), bf16 like the real ones; with
  `dflash2` a DFlash2 drafter (DFlash2DraftModel: per-layer `attention_conv` and
  `mlp_conv`, a `candidate_selector`, the conv/selector keys and a sliding
  window), shaped as the pinned llama.cpp's src/models/dflash.cpp loads it.

torch, safetensors and sentencepiece are test-time dependencies only.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

from gguf_tools.synth import DFlash2Shape

# words the tiny SentencePiece model is trained on (any lowercase text then tokenizes)
_CORPUS = ("the quick brown fox jumps over the lazy dog. a speculative decoder drafts a block of tokens "
           "and the target verifies it in one pass. hello world, this is flashdesk on a tiny model. "
           "numbers 0 1 2 3 4 5 6 7 8 9 and letters abcdefghijklmnopqrstuvwxyz.")


@dataclass(frozen=True)
class HFShape:
    hidden_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    max_position_embeddings: int = 1024


def train_tiny_sentencepiece(vocab_size: int = 96) -> bytes:
    """A small SentencePiece model with `<mask>` as a user-defined symbol (id 3)."""
    # test and convert tools only: torch (~1.6 s to import), sentencepiece, safetensors are extras
    import sentencepiece as spm

    buf = io.BytesIO()
    lines = [_CORPUS] * 8 + _CORPUS.split(". ")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size, model_type="bpe",
        user_defined_symbols=["<mask>"], character_coverage=1.0, num_threads=1, minloglevel=2,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, hard_vocab_limit=False)
    return buf.getvalue()


def _save_safetensors(tensors: dict, path: Path) -> None:
    # test and convert tools only: torch (~1.6 s to import), sentencepiece, safetensors are extras
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def write_hf_target(out_dir: str | Path, shape: HFShape = HFShape(), seed: int = 0, pad_vocab: int = 4) -> Path:
    """A tiny random LlamaForCausalLM checkpoint; the vocabulary is the SentencePiece
    model's plus `pad_vocab` padding rows (like Qwen3's padded embedding table)."""
    # test and convert tools only: torch (~1.6 s to import), sentencepiece, safetensors are extras
    import sentencepiece as spm
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sp_bytes = train_tiny_sentencepiece()
    (out / "tokenizer.model").write_bytes(sp_bytes)
    n_sp = spm.SentencePieceProcessor(model_proto=sp_bytes).vocab_size()
    vocab = n_sp + pad_vocab
    s = shape
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s.hidden_size,
           "intermediate_size": s.intermediate_size, "num_hidden_layers": s.n_layer,
           "num_attention_heads": s.n_head, "num_key_value_heads": s.n_head_kv, "head_dim": s.head_dim,
           "hidden_act": "silu", "max_position_embeddings": s.max_position_embeddings, "rms_norm_eps": 1e-6,
           "rope_theta": 10000.0, "vocab_size": vocab, "tie_word_embeddings": False, "bos_token_id": 1,
           "eos_token_id": 2, "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": s.max_position_embeddings, "tokenizer_class": "LlamaTokenizer"}))
    g = torch.Generator().manual_seed(seed)

    def mat(n_out: int, n_in: int) -> torch.Tensor:
        return torch.randn(n_out, n_in, generator=g) / n_in ** 0.5

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    t = {"model.embed_tokens.weight": torch.randn(vocab, s.hidden_size, generator=g),
         "model.norm.weight": norm(s.hidden_size), "lm_head.weight": mat(vocab, s.hidden_size)}
    for i in range(s.n_layer):
        p = f"model.layers.{i}."
        t |= {p + "input_layernorm.weight": norm(s.hidden_size),
              p + "post_attention_layernorm.weight": norm(s.hidden_size),
              p + "self_attn.q_proj.weight": mat(q, s.hidden_size),
              p + "self_attn.k_proj.weight": mat(kv, s.hidden_size),
              p + "self_attn.v_proj.weight": mat(kv, s.hidden_size),
              p + "self_attn.o_proj.weight": mat(s.hidden_size, q),
              p + "mlp.gate_proj.weight": mat(s.intermediate_size, s.hidden_size),
              p + "mlp.up_proj.weight": mat(s.intermediate_size, s.hidden_size),
              p + "mlp.down_proj.weight": mat(s.hidden_size, s.intermediate_size)}
    _save_safetensors(t, out / "model.safetensors")
    return out


def write_zlab_checkpoint(out_dir: str | Path, *, hidden_size: int = 64, n_layer: int = 2, n_head: int = 4,
                          n_head_kv: int = 2, head_dim: int = 16, intermediate_size: int = 128,
                          vocab_size: int, mask_token_id: int, target_layer_ids: list[int],
                          block_size: int = 16, dtype: str = "bfloat16", seed: int = 1,
                          extra_dflash_config: dict | None = None, extra_config: dict | None = None,
                          shards: int = 1, dflash2: DFlash2Shape | None = None) -> Path:
    """A random DFlash drafter in z-lab's layout. `target_layer_ids` are HF ids
    (the output of layer id), as z-lab writes them; GGUF stores them + 1."""
    # test and convert tools only: torch (~1.6 s to import), sentencepiece, safetensors are extras
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
    dcfg = {"mask_token_id": mask_token_id, "target_layer_ids": list(target_layer_ids)}
    if dflash2 is not None:
        dcfg |= {"conv_kernel_size": dflash2.conv_kernel_size, "conv_group_size": dflash2.conv_group_size,
                 "selector_rank": dflash2.selector_rank, "selector_top_k": dflash2.selector_top_k,
                 "use_swa": True, "swa_window_size": dflash2.window}
    dcfg |= extra_dflash_config or {}
    cfg = {"architectures": ["DFlashDraftModel"], "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
           "model_type": "qwen3", "attention_bias": False, "attention_dropout": 0.0, "block_size": block_size,
           "dflash_config": dcfg, "dtype": dtype, "head_dim": head_dim, "hidden_act": "silu",
           "hidden_size": hidden_size, "intermediate_size": intermediate_size,
           "layer_types": ["full_attention"] * n_layer, "max_position_embeddings": 1024, "max_window_layers": n_layer,
           "num_attention_heads": n_head, "num_hidden_layers": n_layer, "num_key_value_heads": n_head_kv,
           "num_target_layers": max(target_layer_ids) + 3, "rms_norm_eps": 1e-6, "rope_scaling": None,
           "rope_theta": 10000.0, "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
           "use_sliding_window": False, "vocab_size": vocab_size} | (extra_config or {})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    g = torch.Generator().manual_seed(seed)

    def mat(n_out: int, n_in: int) -> torch.Tensor:
        return (torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(tdtype)

    def norm(n: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(tdtype)

    q, kv = n_head * head_dim, n_head_kv * head_dim
    t = {"fc.weight": mat(hidden_size, hidden_size * len(target_layer_ids)), "hidden_norm.weight": norm(hidden_size),
         "norm.weight": norm(hidden_size)}
    for i in range(n_layer):
        p = f"layers.{i}."
        t |= {p + "input_layernorm.weight": norm(hidden_size), p + "post_attention_layernorm.weight": norm(hidden_size),
              p + "self_attn.q_proj.weight": mat(q, hidden_size), p + "self_attn.k_proj.weight": mat(kv, hidden_size),
              p + "self_attn.v_proj.weight": mat(kv, hidden_size), p + "self_attn.o_proj.weight": mat(hidden_size, q),
              p + "self_attn.q_norm.weight": norm(head_dim), p + "self_attn.k_norm.weight": norm(head_dim),
              p + "mlp.gate_proj.weight": mat(intermediate_size, hidden_size),
              p + "mlp.up_proj.weight": mat(intermediate_size, hidden_size),
              p + "mlp.down_proj.weight": mat(hidden_size, intermediate_size)}
    if dflash2 is not None:
        if cfg["architectures"] == ["DFlashDraftModel"]:
            cfg["architectures"] = ["DFlash2DraftModel"]
            (out / "config.json").write_text(json.dumps(cfg, indent=2))
        d2 = dflash2
        projected = 2 * d2.conv_kernel_size * (hidden_size // d2.conv_group_size)
        for i in range(n_layer):
            for part in ("attention_conv", "mlp_conv"):
                # numpy/torch shape = ggml's reversed: base {n_embd, kernel, 2}, projection {n_embd, projected}
                t[f"layers.{i}.{part}.base_kernel"] = (0.1 * torch.randn(2, d2.conv_kernel_size, hidden_size,
                                                                         generator=g)).to(tdtype)
                t[f"layers.{i}.{part}.kernel_projection.weight"] = mat(projected, hidden_size)
        t["candidate_selector.predecessor_codebook"] = mat(vocab_size, d2.selector_rank)
        t["candidate_selector.successor_codebook"] = mat(vocab_size, d2.selector_rank)
        t["candidate_selector.hidden_projection.weight"] = mat(d2.selector_rank, hidden_size)
    if shards <= 1:
        _save_safetensors(t, out / "model.safetensors")
        return out
    names = sorted(t)
    weight_map = {}
    for k in range(shards):
        part = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: t[n] for n in names[k::shards]}
        _save_safetensors(chunk, out / part)
        weight_map |= {n: part for n in chunk}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out
