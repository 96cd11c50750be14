"""z-lab DFlash checkpoint (config.json with `dflash_config` + safetensors) -> `dflash` GGUF:
DFlash v1, and DFlash2 (its conv/selector keys and tensors, as llama.cpp's conversion/qwen.py
writes them; the pinned llama.cpp then loads it as draft-dflash with the selector).

    python -m gguf_tools convert CKPT_DIR --target TARGET.gguf --out D.gguf [--outtype auto|f32|f16|bf16|q8_0]

FlashDesk's own converter, written with gguf-py. It produces the same file as
llama.cpp's `convert_hf_to_gguf.py CKPT --target-model-dir T` (tensors, values,
metadata; tests/test_gguf_tools_convert.py asserts it tensor by tensor), but
takes the target as the GGUF the user already has: the drafter's tokenizer is
copied from it, and the drafter is checked against it before anything is
written. The output appears atomically (written beside it, then renamed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from gguf_tools.errors import FlashDeskError, ModelLoadError
from gguf_tools.reader import GGUFInfo, read_gguf

# HF (z-lab, unprefixed) tensor names -> GGUF names; per layer below
_GLOBAL = {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
           "norm.weight": "output_norm.weight", "embed_tokens.weight": "token_embd.weight",
           "lm_head.weight": "output.weight",
           # DFlash2: the candidate selector (llama.cpp's conversion/qwen.py adds .weight to the codebooks)
           "candidate_selector.predecessor_codebook": "selector_predecessor.weight",
           "candidate_selector.successor_codebook": "selector_successor.weight",
           "candidate_selector.hidden_projection.weight": "selector_hidden.weight"}
_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight",
          # DFlash2: the per-layer short convolutions (the base kernels are bare parameters: no .weight)
          "attention_conv.base_kernel": "attn_conv_base", "attention_conv.kernel_projection.weight":
          "attn_conv_proj.weight", "mlp_conv.base_kernel": "ffn_conv_base",
          "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight"}
# a DFlash2 checkpoint's dflash_config keys (conv/selector), written as dflash.* keys after the block size
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# interleaved-RoPE checkpoints are permuted to NeoX layout (as llama.cpp's converter does)
_ROPE_PERMUTE = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.q_norm.weight",
                 "self_attn.k_norm.weight")
_ST_DTYPES = {"BF16": (np.uint16, 2), "F16": (np.float16, 2), "F32": (np.float32, 4)}
OUTTYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
            "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
_FTYPE_QTYPE = {gguf.LlamaFileType.ALL_F32: gguf.GGMLQuantizationType.F32,
                gguf.LlamaFileType.MOSTLY_F16: gguf.GGMLQuantizationType.F16,
                gguf.LlamaFileType.MOSTLY_BF16: gguf.GGMLQuantizationType.BF16,
                gguf.LlamaFileType.MOSTLY_Q8_0: gguf.GGMLQuantizationType.Q8_0}


class ConversionError(FlashDeskError):
    """A checkpoint cannot be converted; the message names the file and the reason."""


@dataclass(frozen=True)
class _StTensor:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int
    n_bytes: int

    def load(self) -> np.ndarray:
        """float16 stays float16 and everything else becomes float32, as in llama.cpp's converter."""
        np_dtype, _ = _ST_DTYPES[self.dtype]
        raw = np.fromfile(self.file, dtype=np_dtype, count=self.n_bytes // np.dtype(np_dtype).itemsize,
                          offset=self.offset)
        if self.dtype == "BF16":  # bf16 is the top half of a float32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.reshape(self.shape)


def is_zlab_checkpoint(path: str | Path) -> bool:
    """True for a folder holding a DFlash config.json (what the hub converts on arrival)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return False
    try:
        hp = json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return "dflash_config" in hp or any("DFlash" in a for a in hp.get("architectures") or [])


def _read_safetensors_header(path: Path) -> dict[str, _StTensor]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ConversionError(f"{path}: only {size} bytes, not a safetensors file (truncated?)")
        n = int.from_bytes(head, "little")
        if n > size - 8 or n > 100_000_000:
            raise ConversionError(f"{path}: header length {n} does not fit in a {size}-byte file "
                                  f"(truncated or corrupt)")
        try:
            meta = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ConversionError(f"{path}: the safetensors header is not valid JSON (corrupt file)") from None
    out = {}
    for name, m in meta.items():
        if name == "__metadata__":
            continue
        dt = m.get("dtype")
        if dt not in _ST_DTYPES:
            raise ConversionError(f"{path}: tensor {name!r} has dtype {dt}; only BF16, F16 and F32 checkpoints "
                                  f"are supported")
        begin, end = m["data_offsets"]
        shape = tuple(int(d) for d in m["shape"])
        want = int(np.prod(shape, dtype=np.int64)) * _ST_DTYPES[dt][1]
        if end - begin != want:
            raise ConversionError(f"{path}: tensor {name!r} declares {end - begin} bytes for shape {shape} ({want} "
                                  f"expected): corrupt file")
        if 8 + n + end > size:
            raise ConversionError(f"{path}: truncated: tensor {name!r} ends at byte {8 + n + end:,} but the file has "
                                  f"{size:,} (an interrupted download?)")
        out[name] = _StTensor(path, dt, shape, 8 + n + begin, end - begin)
    return out


def _checkpoint_tensors(ckpt: Path) -> dict[str, _StTensor]:
    """All tensors in file order: parts sorted by name, names sorted within a part (like llama.cpp)."""
    parts = sorted(p for p in os.listdir(ckpt) if p.startswith("model") and p.endswith(".safetensors"))
    if not parts:
        raise ConversionError(f"{ckpt}: no model*.safetensors file (a z-lab checkpoint has model.safetensors)")
    out: dict[str, _StTensor] = {}
    for part in parts:
        for name, t in sorted(_read_safetensors_header(ckpt / part).items()):
            if name in out:
                raise ConversionError(f"{ckpt / part}: tensor {name!r} also appears in {out[name].file.name}")
            out[name] = t
    if (ckpt / "mask_embedding.pt").exists():
        raise ConversionError(f"{ckpt}: mask_embedding.pt (a drafter-specific mask embedding patched into the "
                              f"target's table) is not supported by this converter; use llama.cpp's "
                              f"convert_hf_to_gguf.py for this checkpoint")
    return out


def _gguf_name(hf_name: str) -> str:
    name = hf_name.removeprefix("model.")
    if name in _GLOBAL:
        return _GLOBAL[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "layers" and parts[1].isdecimal() and parts[2] in _LAYER:
        return f"blk.{int(parts[1])}.{_LAYER[parts[2]]}"
    raise ConversionError(f"tensor {hf_name!r} is not part of a DFlash drafter this converter knows "
                          f"(DFlash v1 and DFlash2; DSpark's Markov head and EAGLE-3 checkpoints are not "
                          f"supported here: llama.cpp's convert_hf_to_gguf.py converts them)")


def _guess_ftype(tensors: dict[str, _StTensor]) -> gguf.LlamaFileType:
    # the dtype of the first matrix decides, like llama.cpp's "auto" outtype
    for t in tensors.values():
        if len(t.shape) >= 2:
            if t.dtype == "BF16":
                return gguf.LlamaFileType.MOSTLY_BF16
            if t.dtype == "F16":
                return gguf.LlamaFileType.MOSTLY_F16
            break
    return gguf.LlamaFileType.MOSTLY_F16


def _tensor_qtype(name: str, n_dims: int, ftype: gguf.LlamaFileType) -> gguf.GGMLQuantizationType:
    if n_dims <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return gguf.GGMLQuantizationType.F32  # norms and vectors stay F32 (llama.cpp needs them so)
    return _FTYPE_QTYPE[ftype]


def _load_config(ckpt: Path) -> dict[str, Any]:
    cfg_path = ckpt / "config.json"
    if not cfg_path.is_file():
        raise ConversionError(f"{ckpt}: no config.json (not a Hugging Face checkpoint folder)")
    try:
        hp = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ConversionError(f"{cfg_path}: not valid JSON ({e})") from None
    archs = hp.get("architectures") or []
    other = next((f for a in archs for f in ("DSpark", "Eagle3", "EAGLE3") if f in a), None)
    if other is not None:
        raise ConversionError(f"{cfg_path}: a {other} checkpoint ({', '.join(archs)}): this converter handles "
                              f"DFlash v1 and DFlash2 drafters; llama.cpp's convert_hf_to_gguf.py converts it")
    if "dflash_config" not in hp and not any("DFlash" in a for a in archs):
        raise ConversionError(f"{cfg_path}: not a DFlash drafter (no dflash_config and no DFlash architecture)")
    dcfg = hp.get("dflash_config", {})
    if any(k in dcfg for k in DFLASH2_KEYS):
        missing = [k for k in DFLASH2_KEYS if k not in dcfg]
        if missing:
            raise ConversionError(f"{cfg_path}: a DFlash2 checkpoint (conv/selector) without dflash_config "
                                  f"{', '.join(missing)}")
        # llama.cpp refuses these at load (src/models/dflash.cpp): say so before writing anything
        n, group, top_k = hp.get("hidden_size", 0), int(dcfg["conv_group_size"]), int(dcfg["selector_top_k"])
        if group <= 0 or n % group:
            raise ConversionError(f"{cfg_path}: DFlash2 hidden size {n} is not a multiple of conv_group_size {group}")
        if top_k <= 0 or n < top_k * (top_k + 1):
            raise ConversionError(f"{cfg_path}: DFlash2 hidden size {n} is too small for a selector lattice of top "
                                  f"{top_k} (needs {top_k * (top_k + 1)})")
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if key not in hp:
            raise ConversionError(f"{cfg_path}: missing {key!r}")
    return hp


def _rope_params(hp: dict[str, Any]) -> dict[str, Any]:
    rope = dict(hp.get("rope_parameters") or hp.get("rope_scaling") or {})
    rope = rope.get("full_attention", rope)
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope["type"]
    if "rope_theta" not in rope and "rope_theta" in hp:
        rope["rope_theta"] = hp["rope_theta"]
    return rope


def _check_against_target(hp: dict[str, Any], ckpt: Path, t: GGUFInfo) -> None:
    dcfg = hp.get("dflash_config", {})
    problems = []
    if hp["hidden_size"] != t.n_embd:
        problems.append(f"hidden size {hp['hidden_size']} but the target's is {t.n_embd}")
    vocab = hp.get("vocab_size")
    if vocab is not None and t.n_vocab and vocab != t.n_vocab:
        problems.append(f"vocabulary of {vocab} tokens but the target has {t.n_vocab}")
    layers = dcfg.get("target_layer_ids", hp.get("target_layer_ids", []))
    if not layers:
        problems.append("no dflash_config.target_layer_ids")
    elif max(layers) + 1 > t.n_layer:
        problems.append(f"reads the output of target layer {max(layers)}, but the target has {t.n_layer} layers")
    mask = dcfg.get("mask_token_id")
    if mask is None:
        problems.append("no dflash_config.mask_token_id")
    elif not 0 <= int(mask) < t.n_vocab:
        problems.append(f"mask token id {mask} is outside the target's vocabulary of {t.n_vocab}")
    if not t.has("tokenizer.ggml.tokens"):
        problems.append("the target GGUF carries no tokenizer to copy")
    if problems:
        raise ConversionError(f"{ckpt} does not fit target {t.path}: " + "; ".join(problems))


def _add_parameters(w: gguf.GGUFWriter, hp: dict[str, Any], ftype: gguf.LlamaFileType, target: GGUFInfo) -> None:
    """The hyperparameters, in the order and with the types llama.cpp's DFlashModel writes them."""
    dcfg = hp.get("dflash_config", {})
    n_layer = hp["num_hidden_layers"]
    w.add_block_count(n_layer)
    for keys, add in ((("max_position_embeddings",), w.add_context_length), (("hidden_size",), w.add_embedding_length),
                      (("intermediate_size",), w.add_feed_forward_length), (("num_attention_heads",), w.add_head_count),
                      (("num_key_value_heads",), w.add_head_count_kv)):
        if (v := next((hp[k] for k in keys if k in hp), None)) is not None:
            add(v)
    if hp.get("is_causal") is False:
        w.add_causal_attention(False)
    rope = _rope_params(hp)
    rope_type, factor = rope.get("rope_type"), rope.get("factor")
    if rope_type == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif rope_type == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                         ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if rope.get(key) is not None:
                add(rope[key])
        if (attn := rope.get("attention_factor", rope.get("attn_factor"))) is not None:
            w.add_rope_scaling_yarn_attn_factor(attn)
    elif rope_type not in (None, "default"):
        raise ConversionError(f"RoPE scaling {rope_type!r} is not supported by this converter")
    if "mrope_section" in rope:
        w.add_rope_dimension_sections((list(rope["mrope_section"]) + [0, 0, 0, 0])[:4])
    if rope.get("rope_theta") is not None:
        w.add_rope_freq_base(rope["rope_theta"])
    if hp.get("rms_norm_eps") is not None:
        w.add_layer_norm_rms_eps(hp["rms_norm_eps"])
    head_dim = hp.get("head_dim")
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(ftype)

    # DFlash's own keys (conversion/qwen.py DFlashModel.set_gguf_parameters)
    if (prf := rope.get("partial_rotary_factor", hp.get("partial_rotary_factor"))) is not None:
        hd = head_dim or hp["hidden_size"] // hp["num_attention_heads"]
        w.add_rope_dimension_count(int(hd * prf))
    if (vs := dcfg.get("attention_value_scale")) is not None:
        w.add_attn_value_scale(float(vs))
    w.add_block_size(dcfg.get("block_size", hp.get("block_size", 16)))
    if "conv_kernel_size" in dcfg:  # DFlash2 (checked complete by _load_config)
        w.add_conv_kernel_size(int(dcfg["conv_kernel_size"]))
        w.add_conv_group_size(int(dcfg["conv_group_size"]))
        w.add_selector_rank(int(dcfg["selector_rank"]))
        w.add_selector_top_k(int(dcfg["selector_top_k"]))
    if (om := dcfg.get("output_multiplier", hp.get("output_multiplier"))) is not None:
        w.add_logit_scale(float(om))
    sc = dcfg.get("final_logit_softcapping", hp.get("final_logit_softcapping"))
    if sc is not None and float(sc) > 0:
        w.add_final_logit_softcapping(float(sc))
    if (es := dcfg.get("input_embedding_scale", hp.get("input_embedding_scale"))) is not None:
        w.add_embedding_scale(float(es))
    # z-lab stores HF ids (output of layer id); GGUF stores layer-input ids (+1)
    w.add_target_layers([i + 1 for i in dcfg.get("target_layer_ids", hp.get("target_layer_ids", []))])
    use_swa = hp.get("use_sliding_window", False) or dcfg.get("use_swa", False)
    window = dcfg.get("swa_window_size") or hp.get("sliding_window")
    if use_swa and window:
        is_swa = ([True] * n_layer if dcfg.get("use_swa", False)
                  else [lt == "sliding_attention" for lt in hp.get("layer_types") or []])
        w.add_sliding_window(window)
        w.add_sliding_window_pattern(is_swa)
    causal = hp.get("is_causal")
    if causal is None:
        causal = dcfg.get("causal")
    if causal is not None:
        w.add_causal_attention(bool(causal))
    if target.has(f"{target.arch}.rope.dimension_sections"):
        # an M-RoPE target: the drafter ropes on the temporal sections only
        hd = head_dim or hp["hidden_size"] // hp["num_attention_heads"]
        w.add_rope_dimension_sections([hd // 2, 0, 0, 0])


def _copy_tokenizer(w: gguf.GGUFWriter, t: GGUFInfo) -> None:
    """Every tokenizer.* key of the target with its exact GGUF types (the mask id is the drafter's)."""
    for key in t.value_types:  # file order, so a copy of the same tokenizer is byte-identical
        if not key.startswith("tokenizer.") or key == "tokenizer.ggml.mask_token_id":
            continue
        vtype, sub = t.value_types[key]
        value = t.get(key)
        if vtype == gguf.GGUFValueType.ARRAY:
            # GGUFWriter picks the element type from Python values; keep the target's instead
            w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType(sub))
        else:
            w.add_key_value(key, value, gguf.GGUFValueType(vtype))


def _iter_tensors(hp: dict[str, Any], tensors: dict[str, _StTensor],
                  ftype: gguf.LlamaFileType) -> Iterator[tuple[str, np.ndarray, gguf.GGMLQuantizationType]]:
    neox = hp.get("rope_is_neox_style", True)
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    for hf_name, st in tensors.items():
        name = _gguf_name(hf_name)
        data = st.load()
        if not neox and hf_name.endswith(_ROPE_PERMUTE):
            shape = data.shape  # per head: even dims first, then odd (NeoX layout)
            data = data.reshape(-1, head_dim // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
        qtype = _tensor_qtype(name, data.ndim, ftype)
        try:
            q = gguf.quants.quantize(data, qtype)
        except gguf.QuantError:
            qtype = gguf.GGMLQuantizationType.F16  # rows that do not fill a block
            q = gguf.quants.quantize(data, qtype)
        yield name, q, qtype


def convert_checkpoint(ckpt_dir: str | Path, target_gguf: str | Path, out: str | Path, outtype: str = "auto",
                       progress: Callable[[str], None] | None = None) -> Path:
    """Convert a z-lab DFlash checkpoint folder into a `dflash` GGUF for `target_gguf`.

    Raises ConversionError (or ModelLoadError for an unreadable target) naming the
    file and the problem; on any error nothing is left at `out`."""
    ckpt = Path(ckpt_dir).expanduser()
    out = Path(out).expanduser()
    if not ckpt.is_dir():
        raise ConversionError(f"{ckpt}: not a folder (expected a z-lab checkpoint folder with config.json)")
    if outtype != "auto" and outtype not in OUTTYPES:
        raise ConversionError(f"unknown outtype {outtype!r}; expected auto or one of {', '.join(OUTTYPES)}")
    hp = _load_config(ckpt)
    target = read_gguf(target_gguf)
    if target.arch == "dflash":
        raise ConversionError(f"{target.path}: is itself a DFlash drafter; pass the target model")
    _check_against_target(hp, ckpt, target)
    tensors = _checkpoint_tensors(ckpt)
    missing = [n for n in ("fc.weight", "hidden_norm.weight", "norm.weight") if n not in tensors
               and "model." + n not in tensors]
    if missing:
        raise ConversionError(f"{ckpt}: missing tensors {', '.join(missing)} (not a complete DFlash checkpoint)")
    ftype = _guess_ftype(tensors) if outtype == "auto" else OUTTYPES[outtype]

    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.DFLASH])
    for name, data, qtype in _iter_tensors(hp, tensors, ftype):
        w.add_tensor(name, data, raw_dtype=qtype)
        if progress:
            progress(f"{name} {qtype.name} {list(reversed(data.shape))}")
    # descriptive general.* keys the way llama.cpp derives them (name from the folder, size label)
    total, shared, expert, n_expert = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, ckpt, None, total)
    if meta.name is None:
        meta.name = ckpt.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_expert)
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)
    _add_parameters(w, hp, ftype, target)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _copy_tokenizer(w, target)
    w.add_mask_token_id(int(hp["dflash_config"]["mask_token_id"]))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial")
    try:
        w.write_header_to_file(path=tmp)
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gguf_tools convert", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="z-lab checkpoint folder (config.json + model*.safetensors)")
    ap.add_argument("--target", required=True, help="the target GGUF the drafter is for (its tokenizer is copied)")
    ap.add_argument("--out", required=True, help="output .gguf")
    ap.add_argument("--outtype", default="auto", choices=["auto", *OUTTYPES],
                    help="tensor type for matrices (auto: the checkpoint's, bf16 for z-lab)")
    ap.add_argument("--verbose", action="store_true", help="print each tensor")
    args = ap.parse_args(argv)
    try:
        out = convert_checkpoint(args.checkpoint, args.target, args.out, args.outtype,
                                 progress=(lambda m: print(m, file=sys.stderr)) if args.verbose else None)
    except (FlashDeskError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(out)
    return 0
