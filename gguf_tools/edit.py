"""Copies of a GGUF with metadata, tensor shapes or tensor bytes changed (tests, fuzzing, repairs).

    copy_gguf(src, dst, meta={"gemma3.block_count": 0}, drop=("dflash.block_size",),
              shapes={"blk.0.attn_q.weight": (640, 2**62)}, tensor_bytes={"d2t": arr.tobytes()},
              sparse=True)

The header is written anew from gguf_tools.reader's parse (each key keeps its
GGUF type; large arrays such as the token list are copied as their raw bytes,
not decoded) and the data section is copied verbatim, or, with `sparse`, left
as a hole of the right length: a file for header checks, not for llama.cpp.
Tensor offsets stay as they were, so a changed shape does not move any data.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any

from gguf.constants import GGMLQuantizationType

from gguf_tools.reader import GGUF_MAGIC, SCALAR_FORMATS, GGUFInfo, read_gguf

_STRING, _ARRAY = 8, 9
_BOOL, _U32, _I32, _F32, _I64 = 7, 4, 5, 6, 11


def _infer_type(value: Any) -> tuple[int, int | None]:
    if isinstance(value, bool):
        return _BOOL, None
    if isinstance(value, int):
        return (_U32 if 0 <= value < 2**32 else _I64 if -2**63 <= value < 2**63 else 10), None
    if isinstance(value, float):
        return _F32, None
    if isinstance(value, str):
        return _STRING, None
    if isinstance(value, list):
        sub, _ = _infer_type(value[0]) if value else (_I32, None)
        return _ARRAY, (_I32 if sub == _U32 and all(-2**31 <= v < 2**31 for v in value) else sub)
    raise TypeError(f"no GGUF type for {type(value).__name__}")


def _scalar(vtype: int, value: Any) -> bytes:
    return struct.pack(SCALAR_FORMATS[vtype], value)


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype: int, sub: int | None, value: Any) -> bytes:
    if vtype in SCALAR_FORMATS:
        return _scalar(vtype, value)
    if vtype == _STRING:
        return _string(value)
    if vtype == _ARRAY:
        assert sub is not None
        if sub == _ARRAY:
            raise ValueError("nested arrays are not rewritten")
        body = b"".join(_value(sub, None, v) for v in value)
        return struct.pack("<IQ", sub, len(value)) + body
    raise ValueError(f"unknown GGUF value type {vtype}")


def _kv_bytes(info: GGUFInfo, raw: bytes, meta: dict[str, Any], drop: set[str]) -> tuple[int, bytes]:
    out = []
    keys = [k for k in info.value_types if k not in drop]
    keys += [k for k in meta if k not in info.value_types and k not in drop]
    for key in keys:
        if key in meta:
            value = meta[key]
            vtype, sub = info.value_types.get(key) or _infer_type(value)
            out.append(_string(key) + struct.pack("<I", vtype) + _value(vtype, sub, value))
        elif key in info._lazy:
            lz = info._lazy[key]
            out.append(_string(key) + struct.pack("<IIQ", _ARRAY, lz.elem_type, lz.count) + raw[lz.start:lz.end])
        else:
            vtype, sub = info.value_types[key]
            out.append(_string(key) + struct.pack("<I", vtype) + _value(vtype, sub, info.metadata[key]))
    return len(out), b"".join(out)


def copy_gguf(src: str | Path, dst: str | Path, *, meta: dict[str, Any] | None = None, drop: tuple[str, ...] = (),
              shapes: dict[str, tuple[int, ...]] | None = None, tensor_bytes: dict[str, bytes] | None = None,
              sparse: bool = False) -> Path:
    """Write `dst`: `src` with `meta` keys set (existing keys keep their type), `drop` keys removed,
    tensor shapes replaced (`shapes`, ggml order) and tensor data replaced (`tensor_bytes`, same
    length as the original)."""
    info = read_gguf(src)
    meta, shapes, tensor_bytes = meta or {}, shapes or {}, tensor_bytes or {}
    with open(info.path, "rb") as f:
        raw = f.read(info.data_offset)
    n_kv, kv = _kv_bytes(info, raw, meta, set(drop))
    tinfo = b"".join(
        _string(t.name) + struct.pack("<I", len(shapes.get(t.name, t.shape)))
        + struct.pack(f"<{len(shapes.get(t.name, t.shape))}Q", *shapes.get(t.name, t.shape))
        + struct.pack("<IQ", GGMLQuantizationType[t.type_name].value, t.offset)
        for t in info.tensors)
    header = GGUF_MAGIC + struct.pack("<IQQ", info.version, len(info.tensors), n_kv) + kv + tinfo
    align = int(meta.get("general.alignment", info.get("general.alignment", 32)))
    header += b"\0" * (-len(header) % align)
    data_len = info.file_size - info.data_offset
    dst = Path(dst)
    with open(dst, "wb") as out:
        out.write(header)
        if sparse:
            out.truncate(len(header) + data_len)
        else:
            with open(info.path, "rb") as f:
                f.seek(info.data_offset)
                shutil.copyfileobj(f, out, 1 << 22)
        for name, data in tensor_bytes.items():
            t = info.tensor(name)
            if t is None or len(data) != t.n_bytes:
                raise ValueError(f"tensor {name}: {len(data)} bytes given, the tensor has "
                                 f"{t.n_bytes if t else 'no'} bytes")
            out.seek(len(header) + t.offset)
            out.write(data)
    return dst
