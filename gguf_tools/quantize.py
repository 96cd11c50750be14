"""Quantize a GGUF through llama.cpp's own quantizer (`llama_model_quantize`).

    python -m gguf_tools quantize IN.gguf OUT.gguf --type Q4_K_M [--keep-sensitive Q8_0]
                                  [--tensor-type 'REGEX=TYPE' ...] [--threads N] [--json]

`--keep-sensitive TYPE` keeps a DFlash drafter's most sensitive tensors at TYPE
while the rest goes to `--type`: `fc` (the projection of the target's hidden
states that every drafter layer reads) and attention K/V (computed from that
context for every block). Community drafters lose much of their acceptance at
plain Q4 (docs/design.md, section 5); `flashdesk` measures the cost with
`python -m app.distill.quant_tau` (one JSON line per variant).

The output appears atomically (quantized beside it, then renamed).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gguf.constants import GGMLQuantizationType

from gguf_tools.errors import FlashDeskError
from gguf_tools.reader import read_gguf
from native.lib import load

# llama.cpp file types offered here (those that need no importance matrix)
FILE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_0", "Q5_1", "Q4_K_M", "Q4_K_S",
              "Q4_0", "Q4_1", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K", "IQ4_NL", "IQ4_XS")
# per-tensor types an override may name
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_0", "Q5_1", "Q4_K", "Q4_0", "Q4_1", "Q3_K",
                "Q2_K", "IQ4_NL", "IQ4_XS")
# the drafter's sensitive tensors: fc and every layer's attention K and V
FC_PATTERN = r"^fc\.weight$"
SENSITIVE_PATTERNS = (FC_PATTERN, r"attn_k\.weight$", r"attn_v\.weight$")


class QuantizeError(FlashDeskError):
    """llama.cpp could not quantize a file; the message names it."""


@dataclass
class QuantizeResult:
    input: str
    output: str
    file_type: str
    bytes_in: int
    bytes_out: int
    tensor_types: dict[str, str] = field(default_factory=dict)  # name -> type in the output

    def to_dict(self) -> dict:
        return {"input": self.input, "output": self.output, "file_type": self.file_type, "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out, "tensor_types": self.tensor_types}


def _ftype(lc, name: str) -> int:  # noqa: ANN001 - the ctypes module
    if name.upper() not in FILE_TYPES:
        raise QuantizeError(f"unknown quantization type {name!r}; choose one of {', '.join(FILE_TYPES)}")
    attr = "LLAMA_FTYPE_ALL_F32" if name.upper() == "F32" else f"LLAMA_FTYPE_MOSTLY_{name.upper()}"
    return int(getattr(lc, attr))


def _ggml_type(name: str) -> int:
    if name.upper() not in TENSOR_TYPES:
        raise QuantizeError(f"unknown tensor type {name!r}; choose one of {', '.join(TENSOR_TYPES)}")
    return int(GGMLQuantizationType[name.upper()])


def tensor_overrides(keep_sensitive: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Regex -> tensor type, the sensitive-tensor preset first, then explicit ones.

    `fc` never becomes F16: ggml converts an F16 matmul's activations to F16, and the target's
    hidden states that fc reads exceed 65504 (Gemma's do), which turns every draft into NaN.
    Quantized types are safe (their activations are block-scaled), so fc stays F32 only where
    it would otherwise be F16. (llama.cpp applies overrides only under a quantized file type;
    `quantize` refuses an all-F16 drafter for the same reason.)"""
    out = {p: keep_sensitive for p in SENSITIVE_PATTERNS} if keep_sensitive else {}
    out.update(extra or {})
    if out.get(FC_PATTERN, "").upper() == "F16":
        out[FC_PATTERN] = "F32"
    return out


def quantize(src: str | Path, dst: str | Path, file_type: str = "Q4_K_M", *, keep_sensitive: str | None = None,
             overrides: dict[str, str] | None = None, threads: int = 0) -> QuantizeResult:
    """Quantize `src` into `dst` with llama.cpp; raises QuantizeError/ModelLoadError naming the file."""
    src_p, dst_p = Path(src).expanduser(), Path(dst).expanduser()
    info = read_gguf(src_p)  # a clear error for a missing, truncated or corrupt input, before llama.cpp sees it
    if src_p.resolve() == dst_p.resolve():
        raise QuantizeError(f"{dst_p}: the output would overwrite the input")
    if file_type.upper() == "F16" and any(t.name == "fc.weight" for t in info.tensors):
        raise QuantizeError(f"{src_p}: an F16 drafter would have an F16 fc, which overflows on target hidden states "
                            f"past 65504 (Gemma's) and makes every draft NaN; llama.cpp cannot keep one tensor "
                            f"F32 under an F16 file type. Use the F16 export of `flashdesk distill` as it is "
                            f"(fc stays F32), or a quantized type such as Q8_0")
    lc = load()
    params = lc.llama_model_quantize_default_params()
    params.ftype = _ftype(lc, file_type)
    params.nthread = threads
    # requantizing an already-quantized file loses precision twice: allow it only from float files
    params.allow_requantize = False
    table = tensor_overrides(keep_sensitive, overrides)
    keep: list = []  # ctypes buffers must outlive the call
    if table:
        arr = (lc.llama_model_tensor_override * (len(table) + 1))()
        for i, (pattern, ttype) in enumerate(table.items()):
            b = pattern.encode()
            keep.append(b)
            arr[i].pattern = b
            arr[i].type = _ggml_type(ttype)
        arr[len(table)].pattern = None  # the list ends at a null pattern
        params.tt_overrides = ctypes.cast(arr, ctypes.POINTER(lc.llama_model_tensor_override))
        keep.append(arr)
    dst_p.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst_p.with_name(f".{dst_p.name}.partial")
    try:
        rc = lc.llama_model_quantize(str(src_p).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0 or not tmp.exists():
            raise QuantizeError(f"{src_p}: llama.cpp could not quantize it to {file_type} (error {rc}; an "
                                f"already-quantized input cannot be requantized, use its F16/F32 source)")
        os.replace(tmp, dst_p)
    finally:
        tmp.unlink(missing_ok=True)
    out = read_gguf(dst_p)
    return QuantizeResult(str(src_p), str(dst_p), file_type.upper(), info.file_size, out.file_size,
                          {t.name: t.type_name for t in out.tensors})


def _parse_override(s: str) -> tuple[str, str]:
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"{s!r}: expected REGEX=TYPE, e.g. 'ffn_down\\.weight$=Q6_K'")
    pattern, _, ttype = s.rpartition("=")
    return pattern, ttype


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gguf_tools quantize", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--type", default="Q4_K_M", help=f"file type: {', '.join(FILE_TYPES)}")
    ap.add_argument("--keep-sensitive", metavar="TYPE", default=None,
                    help="keep fc and attention K/V at TYPE (e.g. Q8_0 or F16)")
    ap.add_argument("--tensor-type", action="append", type=_parse_override, default=[], metavar="REGEX=TYPE",
                    help="per-tensor type override (repeatable)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    try:
        res = quantize(args.input, args.output, args.type, keep_sensitive=args.keep_sensitive,
                       overrides=dict(args.tensor_type), threads=args.threads)
    except FlashDeskError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    else:
        mix: dict[str, int] = {}
        for t in res.tensor_types.values():
            mix[t] = mix.get(t, 0) + 1
        print(f"{res.output}: {res.file_type}, {res.bytes_in / 1e6:.1f} MB -> {res.bytes_out / 1e6:.1f} MB "
              f"({', '.join(f'{n} {k}' for k, n in sorted(mix.items()))})")
    return 0
