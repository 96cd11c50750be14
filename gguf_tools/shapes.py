"""Header-only GGUF files shaped like real large models (27B, 32B, 70B and
their DFlash drafters), for planning tests and "what would fit" questions.

A shape file holds the real metadata keys and every tensor's name, shape and
quantization type (llama.cpp's Q4_K_M recipe), but no tensor data: the file
is extended to its full length as a *sparse* file, so `read_gguf` accepts it
(its length check passes) while it takes a few kilobytes on disk. llama.cpp
would read zeros from it; it is meant for the scheduler, not for inference.

    python -m gguf_tools.shapes OUT_DIR      writes every preset below
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_tools.header import add_transformer_header

Q = GGMLQuantizationType


@dataclass(frozen=True)
class ModelShape:
    """The hyperparameters that decide a model's tensor sizes."""
    arch: str
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int = 131072
    tied_output: bool = False
    sliding_window: int = 0  # >0: sliding-window layers (pattern from the architecture's default)
    # hybrid gated-delta-net models (qwen35): every full_attention_interval-th layer is attention
    full_attention_interval: int = 0
    ssm_conv_kernel: int = 4
    ssm_state_size: int = 128
    ssm_group_count: int = 16
    ssm_time_step_rank: int = 48
    rope_sections: tuple[int, ...] = ()
    name: str = ""


@dataclass(frozen=True)
class DrafterShape:
    """A DFlash drafter: Qwen3-style layers fed by taps of the target."""
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    target_layers: tuple[int, ...]
    block_size: int = 16
    n_ctx_train: int = 131072
    name: str = ""
    # a self-contained drafter carries its own embeddings and output head
    own_head_vocab: int = 0
    extra: dict = field(default_factory=dict)


# Published configurations (Hugging Face config.json of each model), rounded to nothing.
QWEN36_27B = ModelShape("qwen35", n_embd=5120, n_layer=64, n_ff=17408, n_head=24, n_head_kv=4, head_dim=256,
                        n_vocab=248320, n_ctx_train=262144, full_attention_interval=4, ssm_conv_kernel=4,
                        ssm_state_size=128, ssm_group_count=16, ssm_time_step_rank=48,
                        rope_sections=(11, 11, 10, 0), name="Qwen3.6-27B-shaped")
QWEN36_27B_DFLASH = DrafterShape(n_embd=5120, n_layer=5, n_ff=17408, n_head=32, n_head_kv=8, head_dim=128,
                                 target_layers=(2, 17, 32, 47, 62), name="Qwen3.6-27B-DFlash-shaped")
LLAMA33_70B = ModelShape("llama", n_embd=8192, n_layer=80, n_ff=28672, n_head=64, n_head_kv=8, head_dim=128,
                         n_vocab=128256, name="Llama-3.3-70B-shaped")
LLAMA33_70B_DFLASH = DrafterShape(n_embd=8192, n_layer=2, n_ff=28672, n_head=64, n_head_kv=8, head_dim=128,
                                  target_layers=(2, 20, 39, 58, 77), name="Llama-3.3-70B-DFlash-shaped")
QWEN3_32B = ModelShape("qwen3", n_embd=5120, n_layer=64, n_ff=25600, n_head=64, n_head_kv=8, head_dim=128,
                       n_vocab=151936, n_ctx_train=40960, name="Qwen3-32B-shaped")
QWEN3_32B_DFLASH = DrafterShape(n_embd=5120, n_layer=5, n_ff=25600, n_head=64, n_head_kv=8, head_dim=128,
                                target_layers=(2, 17, 32, 47, 62), name="Qwen3-32B-DFlash-shaped")
GEMMA3_27B = ModelShape("gemma3", n_embd=5376, n_layer=62, n_ff=21504, n_head=32, n_head_kv=16, head_dim=128,
                        n_vocab=262144, tied_output=True, sliding_window=1024, name="Gemma-3-27B-shaped")

PRESETS: dict[str, ModelShape | DrafterShape] = {
    "qwen3.6-27b": QWEN36_27B, "qwen3.6-27b-dflash": QWEN36_27B_DFLASH,
    "llama3.3-70b": LLAMA33_70B, "llama3.3-70b-dflash": LLAMA33_70B_DFLASH,
    "qwen3-32b": QWEN3_32B, "qwen3-32b-dflash": QWEN3_32B_DFLASH,
    "gemma3-27b": GEMMA3_27B,
}


def _use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp: the first and last eighth and every third layer between get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, ne: tuple[int, ...], il: int, n_layer: int, tied: bool = False,
                n_gqa: int = 1) -> Q:
    """The type llama.cpp's Q4_K_M recipe gives a tensor (the size-relevant rules)."""
    if len(ne) == 1 or name.endswith("norm.weight") or "ssm_conv1d" in name or name.endswith((".bias", "ssm_a")):
        return Q.F32
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return Q.Q6_K
    if ne[0] % 256 != 0:
        return Q.Q8_0 if ne[0] % 32 == 0 else Q.F16
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and _use_more_bits(il, n_layer):
        return Q.Q6_K
    if name.endswith("attn_v.weight") and n_gqa >= 8:
        return Q.Q5_K  # the 70B rule: attn_v is 8x smaller than attn_q, so more bits cost little
    if name.endswith("attn_qkv.weight"):
        return Q.Q5_K
    return Q.Q4_K


def _nbytes(qt: Q, ne: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[qt]
    n = int(np.prod(ne))
    return n // block * size


def target_tensors(s: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, ggml shape) of every tensor llama.cpp loads for this shape."""
    E, F, hd = s.n_embd, s.n_ff, s.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (E, s.n_vocab)), ("output_norm.weight", (E,))]
    if not s.tied_output:
        out.append(("output.weight", (E, s.n_vocab)))
    if s.arch == "llama":
        out.append(("rope_freqs.weight", (hd // 2,)))
    for il in range(s.n_layer):
        p = f"blk.{il}."
        t = [(p + "attn_norm.weight", (E,))]
        recurrent = s.full_attention_interval > 0 and (il + 1) % s.full_attention_interval != 0
        if recurrent:
            key_dim = s.ssm_state_size * s.ssm_group_count
            value_dim = s.ssm_state_size * s.ssm_time_step_rank
            t += [(p + "attn_qkv.weight", (E, 2 * key_dim + value_dim)), (p + "attn_gate.weight", (E, value_dim)),
                  (p + "ssm_conv1d.weight", (s.ssm_conv_kernel, 2 * key_dim + value_dim)),
                  (p + "ssm_dt.bias", (s.ssm_time_step_rank,)), (p + "ssm_a", (s.ssm_time_step_rank,)),
                  (p + "ssm_beta.weight", (E, s.ssm_time_step_rank)),
                  (p + "ssm_alpha.weight", (E, s.ssm_time_step_rank)),
                  (p + "ssm_norm.weight", (s.ssm_state_size,)), (p + "ssm_out.weight", (value_dim, E))]
        else:
            q_rows = hd * s.n_head * (2 if s.arch == "qwen35" else 1)  # qwen35's attn_q carries its output gate
            t += [(p + "attn_q.weight", (E, q_rows)), (p + "attn_k.weight", (E, hd * s.n_head_kv)),
                  (p + "attn_v.weight", (E, hd * s.n_head_kv)), (p + "attn_output.weight", (hd * s.n_head, E))]
            if s.arch in ("qwen3", "qwen35", "gemma3"):
                t += [(p + "attn_q_norm.weight", (hd,)), (p + "attn_k_norm.weight", (hd,))]
        if s.arch in ("qwen35", "gemma3"):
            t.append((p + "post_attention_norm.weight", (E,)))
        if s.arch == "gemma3":
            t.append((p + "post_ffw_norm.weight", (E,)))
        t += [(p + "ffn_norm.weight", (E,)), (p + "ffn_gate.weight", (E, F)), (p + "ffn_up.weight", (E, F)),
              (p + "ffn_down.weight", (F, E))]
        out += t
    return out


def drafter_tensors(d: DrafterShape) -> list[tuple[str, tuple[int, ...]]]:
    E, hd = d.n_embd, d.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("fc.weight", (E * len(d.target_layers), E)),
                                              ("enc.output_norm.weight", (E,)), ("output_norm.weight", (E,))]
    if d.own_head_vocab:
        out += [("token_embd.weight", (E, d.own_head_vocab)), ("output.weight", (E, d.own_head_vocab))]
    for il in range(d.n_layer):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (E,)), (p + "attn_q.weight", (E, hd * d.n_head)),
                (p + "attn_k.weight", (E, hd * d.n_head_kv)), (p + "attn_v.weight", (E, hd * d.n_head_kv)),
                (p + "attn_output.weight", (hd * d.n_head, E)), (p + "attn_q_norm.weight", (hd,)),
                (p + "attn_k_norm.weight", (hd,)), (p + "ffn_norm.weight", (E,)),
                (p + "ffn_gate.weight", (E, d.n_ff)), (p + "ffn_up.weight", (E, d.n_ff)),
                (p + "ffn_down.weight", (d.n_ff, E))]
    return out


def _layer_of(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def _write(path: Path, w: gguf.GGUFWriter, tensors: list[tuple[str, tuple[int, ...]]], n_layer: int,
           tied: bool, n_gqa: int) -> Path:
    total = 0
    align = 32
    for name, ne in tensors:
        qt = q4_k_m_type(name, ne, _layer_of(name), n_layer, tied, n_gqa)
        nb = _nbytes(qt, ne)
        # numpy order is the reverse of ggml's; np.float32 is ignored when raw_dtype is given
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), nb, raw_dtype=qt)
        total += nb + (-nb % align)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = path.stat().st_size
    with open(path, "r+b") as f:
        # sparse: the data section exists (read_gguf's length check passes) but holds no blocks on disk
        f.truncate(header + (-header % align) + total)
    return path


def write_target_shape(path: str | Path, s: ModelShape) -> Path:
    """A header-only Q4_K_M target GGUF of shape `s` (sparse, full apparent length)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), s.arch)
    w.add_name(s.name or f"{s.arch}-shaped")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    add_transformer_header(w, n_ctx=s.n_ctx_train, n_embd=s.n_embd, n_layer=s.n_layer, n_ff=s.n_ff,
                           n_head=s.n_head, n_head_kv=s.n_head_kv, head_dim=s.head_dim)
    w.add_rope_freq_base(1e6)
    if s.sliding_window:
        w.add_sliding_window(s.sliding_window)
    if s.full_attention_interval:
        w.add_full_attention_interval(s.full_attention_interval)
        w.add_ssm_conv_kernel(s.ssm_conv_kernel)
        w.add_ssm_state_size(s.ssm_state_size)
        w.add_ssm_group_count(s.ssm_group_count)
        w.add_ssm_time_step_rank(s.ssm_time_step_rank)
        w.add_ssm_inner_size(s.ssm_state_size * s.ssm_time_step_rank)
    if s.rope_sections:
        w.add_rope_dimension_sections(list(s.rope_sections))
    return _write(path, w, target_tensors(s), s.n_layer, s.tied_output, s.n_head // max(1, s.n_head_kv))


def write_drafter_shape(path: str | Path, d: DrafterShape) -> Path:
    """A header-only Q4_K_M DFlash drafter GGUF of shape `d`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "dflash")
    w.add_name(d.name or "dflash-shaped")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    add_transformer_header(w, n_ctx=d.n_ctx_train, n_embd=d.n_embd, n_layer=d.n_layer, n_ff=d.n_ff,
                           n_head=d.n_head, n_head_kv=d.n_head_kv, head_dim=d.head_dim)
    w.add_target_layers(list(d.target_layers))
    w.add_block_size(d.block_size)
    return _write(path, w, drafter_tensors(d), d.n_layer, False, d.n_head // max(1, d.n_head_kv))


def write_preset(out_dir: str | Path, key: str) -> Path:
    """Write preset `key` (see PRESETS) as OUT_DIR/<key>.gguf."""
    if key not in PRESETS:
        raise KeyError(f"no shape preset {key!r}; have {', '.join(PRESETS)}")
    s = PRESETS[key]
    path = Path(out_dir) / f"{key}-Q4_K_M.shape.gguf"
    return write_drafter_shape(path, s) if isinstance(s, DrafterShape) else write_target_shape(path, s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gguf_tools.shapes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--only", action="append", choices=sorted(PRESETS), help="write only these presets")
    args = ap.parse_args(argv)
    for key in args.only or PRESETS:
        print(write_preset(args.out_dir, key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
