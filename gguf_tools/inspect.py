"""What is in a GGUF file, from its header alone.

    python -m gguf_tools inspect FILE.gguf [--json]

Architecture, parameter count, quantization mix, size per layer, context
length, tokenizer and chat template presence, for a `dflash` drafter its
target layers, block size and mask token, and the draft format the file is
(gguf_tools.formats: DFlash v1, DFlash2, DSpark, EAGLE-3, a target with MTP
heads, a plain model) with what it needs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from gguf.constants import LlamaFileType

from gguf_tools.errors import FlashDeskError
from gguf_tools.formats import draft_format
from gguf_tools.reader import GGUFInfo, read_gguf
from gguf_tools.validate import check_model

_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _file_type_name(v: object) -> str | None:
    if v is None:
        return None
    try:
        return LlamaFileType(int(v)).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"unknown ({v})"


def _quant_mix(info: GGUFInfo) -> dict[str, dict[str, int]]:
    mix: dict[str, dict[str, int]] = {}
    for t in info.tensors:
        m = mix.setdefault(t.type_name, {"tensors": 0, "params": 0, "bytes": 0})
        m["tensors"] += 1
        m["params"] += t.n_elements
        m["bytes"] += t.n_bytes
    return dict(sorted(mix.items(), key=lambda kv: -kv[1]["bytes"]))


def _layers(info: GGUFInfo) -> tuple[list[dict], dict[str, int]]:
    """(per block: index, bytes, params, types), bytes of each tensor outside the blocks."""
    blocks: dict[int, dict] = {}
    other: dict[str, int] = {}
    for t in info.tensors:
        m = _BLOCK.match(t.name)
        if m is None:
            other[t.name] = t.n_bytes
            continue
        b = blocks.setdefault(int(m.group(1)), {"layer": int(m.group(1)), "bytes": 0, "params": 0, "types": {}})
        b["bytes"] += t.n_bytes
        b["params"] += t.n_elements
        b["types"][t.type_name] = b["types"].get(t.type_name, 0) + 1
    return [blocks[i] for i in sorted(blocks)], other


def _dflash(info: GGUFInfo) -> dict:
    mask = info.get("tokenizer.ggml.mask_token_id")
    n_tok = info.array_len("tokenizer.ggml.tokens") or 0
    mask_text = info.get("tokenizer.ggml.tokens")[mask] if isinstance(mask, int) and 0 <= mask < n_tok else None
    return {"target_layers": list(info.get("dflash.target_layers") or []),
            "block_size": int(info.get("dflash.block_size", 16)),
            "block_size_set": info.has("dflash.block_size"),
            "mask_token_id": mask, "mask_token": mask_text,
            "causal": bool(info.get("dflash.attention.causal", False)),
            "shares_target_head": info.tensor("output.weight") is None,
            "own_embeddings": info.tensor("token_embd.weight") is not None,
            "reduced_vocab_d2t": info.tensor("d2t") is not None}


def inspect_gguf(path: str | Path) -> dict:
    """A JSON-ready description of a GGUF file; raises ModelLoadError naming the file, for a file
    that cannot be read or whose metadata llama.cpp cannot load (gguf_tools.validate)."""
    info = check_model(read_gguf(path))
    layers, other = _layers(info)
    n_tokens = info.array_len("tokenizer.ggml.tokens")
    out = {
        "file": str(info.path), "file_size": info.file_size, "gguf_version": info.version,
        "architecture": info.arch, "name": info.get("general.name"),
        "file_type": _file_type_name(info.get("general.file_type")),
        "parameters": sum(t.n_elements for t in info.tensors), "tensor_bytes": info.tensor_bytes,
        "n_tensors": len(info.tensors),
        "context_length": info.arch_get("context_length"), "n_layer": info.n_layer, "n_embd": info.n_embd,
        "n_head": info.arch_get("attention.head_count"), "n_head_kv": info.arch_get("attention.head_count_kv"),
        "n_ff": info.arch_get("feed_forward_length"),
        "sliding_window": info.arch_get("attention.sliding_window"),
        "quantization_mix": _quant_mix(info),
        "layers": layers, "non_layer_tensors": other,
        "tokenizer": {"present": n_tokens is not None, "model": info.get("tokenizer.ggml.model"),
                      "pre": info.get("tokenizer.ggml.pre"), "n_tokens": n_tokens or 0,
                      "bos_token_id": info.get("tokenizer.ggml.bos_token_id"),
                      "eos_token_id": info.get("tokenizer.ggml.eos_token_id"),
                      "chat_template": info.has("tokenizer.chat_template")},
    }
    if info.arch == "dflash":
        out["dflash"] = _dflash(info)
    out["draft_format"] = draft_format(info).to_dict()
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def format_report(r: dict) -> str:
    """The report as plain text."""
    lines = [f"{r['file']}  ({_mb(r['file_size'])}, GGUF v{r['gguf_version']})",
             f"architecture   {r['architecture']}" + (f"  ({r['name']})" if r["name"] else ""),
             f"parameters     {r['parameters']:,}  in {r['n_tensors']} tensors, file type {r['file_type']}",
             f"shape          {r['n_layer']} layers, hidden {r['n_embd']}, heads {r['n_head']}/{r['n_head_kv']} kv, "
             f"ffn {r['n_ff']}",
             f"context        {r['context_length']} tokens"
             + (f", sliding window {r['sliding_window']}" if r["sliding_window"] else "")]
    tok = r["tokenizer"]
    lines.append(f"tokenizer      {tok['model']} / {tok['pre']}, {tok['n_tokens']} tokens" if tok["present"]
                 else "tokenizer      none")
    lines.append(f"chat template  {'yes' if tok['chat_template'] else 'no (the app uses its plain fallback format)'}")
    if "dflash" in r:
        d = r["dflash"]
        lines.append(f"dflash         target layers {d['target_layers']}, block size {d['block_size']}"
                     + ("" if d["block_size_set"] else " (default)")
                     + f", mask token {d['mask_token_id']}" + (f" {d['mask_token']!r}" if d["mask_token"] else "")
                     + (", shares the target's head" if d["shares_target_head"] else ", own output head"))
    f = r["draft_format"]
    lines.append(f"draft format   {f['label']}" + (f" (llama.cpp {f['llama_type']})" if f["llama_type"] else "")
                 + f": {f['detail']}")
    lines.append(f"  needs        {f['needs']}")
    lines.append("quantization")
    for name, m in r["quantization_mix"].items():
        lines.append(f"  {name:<8} {m['tensors']:>5} tensors {m['params']:>15,} params {_mb(m['bytes']):>12}")
    lines.append("per layer")
    for b in r["layers"]:
        types = ", ".join(f"{n} {k}" for k, n in sorted(b["types"].items()))
        lines.append(f"  blk.{b['layer']:<4} {_mb(b['bytes']):>12}  ({types})")
    for name, n in r["non_layer_tensors"].items():
        lines.append(f"  {name:<28} {_mb(n):>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gguf_tools inspect", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        rep = inspect_gguf(args.file)
    except FlashDeskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    return 0
