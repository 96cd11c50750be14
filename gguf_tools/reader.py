"""Fast GGUF header reader: metadata and tensor infos, no tensor data.

gguf-py's GGUFReader decodes every array eagerly (12 s for Gemma's 262k-token
vocabulary); the pair check, the inspector and the scheduler only need the
header, so this reader walks it once, keeps large arrays as raw byte spans
(decoded on demand, hashed for tokenizer identity) and checks that the file
is long enough for every tensor it declares.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from gguf_tools.errors import ModelLoadError, excerpt

GGUF_MAGIC = b"GGUF"
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
SCALAR_FORMATS = _SCALAR  # GGUF scalar value type -> struct format (gguf_tools.edit writes with them)
# arrays longer than this stay raw until asked for (token lists, merges, scores)
_EAGER_ARRAY_MAX = 4096
# past these a value in the header is not a model's but a corrupt byte's
_KEY_MAX_BYTES = 1 << 16  # keys are dotted names of tens of bytes
_NAME_MAX_BYTES = 63  # tensor names: ggml's GGML_MAX_NAME is 64 with the NUL
_TENSOR_MAX_BYTES = 1 << 44  # 16 TiB in one tensor
_DIM_MAX = 1 << 40


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: ne[0] is the row length
    type_name: str
    n_elements: int
    n_bytes: int
    offset: int  # from the start of the data section


@dataclass
class LazyArray:
    """A large metadata array kept as its raw bytes in the file."""
    elem_type: int
    count: int
    start: int
    end: int


@dataclass
class GGUFInfo:
    path: Path
    version: int
    file_size: int
    data_offset: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    _lazy: dict[str, LazyArray] = field(default_factory=dict, repr=False)
    # key -> (GGUF value type, element type for arrays): lets a copy keep the exact types
    value_types: dict[str, tuple[int, int | None]] = field(default_factory=dict, repr=False)

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.metadata:
            return self.metadata[key]
        if key in self._lazy:
            return self._decode_lazy(key)
        return default

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """`{arch}.{suffix}`, e.g. arch_get("block_count")."""
        return self.get(f"{self.arch}.{suffix}", default)

    def has(self, key: str) -> bool:
        return key in self.metadata or key in self._lazy

    def array_len(self, key: str) -> int | None:
        if key in self._lazy:
            return self._lazy[key].count
        v = self.metadata.get(key)
        return len(v) if isinstance(v, list) else None

    def array_digest(self, key: str) -> str | None:
        """sha256 of an array's raw bytes (tokenizer identity without decoding it)."""
        if key in self._lazy:
            lz = self._lazy[key]
            with open(self.path, "rb") as f:
                f.seek(lz.start)
                return hashlib.sha256(f.read(lz.end - lz.start)).hexdigest()
        v = self.metadata.get(key)
        return hashlib.sha256(repr(v).encode()).hexdigest() if v is not None else None

    def scalar_array(self, key: str) -> np.ndarray | None:
        """A numeric metadata array's values (None: absent, or not an array of numbers); a large
        one is read from its raw bytes in one go (a vocabulary's scores: 262k floats)."""
        if key in self._lazy:
            lz = self._lazy[key]
            if lz.elem_type not in _SCALAR:
                return None
            dt = np.dtype(_SCALAR[lz.elem_type])
            with open(self.path, "rb") as f:
                f.seek(lz.start)
                return np.frombuffer(f.read(dt.itemsize * lz.count), dtype=dt)
        v = self.metadata.get(key)
        return np.asarray(v) if isinstance(v, list) and all(isinstance(x, int | float) for x in v) else None

    def tensor(self, name: str) -> TensorInfo | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def metadata_keys(self) -> list[str]:
        return sorted([*self.metadata, *self._lazy])

    def _decode_lazy(self, key: str) -> list[Any]:
        lz = self._lazy[key]
        with open(self.path, "rb") as f:
            f.seek(lz.start)
            buf = f.read(lz.end - lz.start)
        _, value = _read_array_body(memoryview(buf), 0, lz.elem_type, lz.count, self.path, eager=True)
        return value

    # convenience accessors used across the project
    @property
    def n_layer(self) -> int:
        return int(self.arch_get("block_count", 0))

    @property
    def n_embd(self) -> int:
        return int(self.arch_get("embedding_length", 0))

    @property
    def n_vocab(self) -> int:
        n = self.array_len("tokenizer.ggml.tokens")
        if n:
            return n
        t = self.tensor("output.weight") or self.tensor("token_embd.weight")
        return t.shape[1] if t else 0

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)


def _fail(path: Path, msg: str) -> ModelLoadError:
    return ModelLoadError(f"{path}: {msg}")


def _read_array_body(buf: memoryview, pos: int, elem_type: int, count: int, path: Path,
                     eager: bool) -> tuple[int, Any]:
    n = len(buf)
    if elem_type in _SCALAR:
        size = struct.calcsize(_SCALAR[elem_type])
        end = pos + size * count
        if end > n:
            raise _fail(path, "the file ends inside a metadata array (truncated or corrupt header)")
        if not eager:
            return end, None
        fmt = "<" + _SCALAR[elem_type][1] * count
        return end, list(struct.unpack_from(fmt, buf, pos))
    if elem_type == _STRING:
        out = [] if eager else None
        for _ in range(count):
            if pos + 8 > n:
                raise _fail(path, "the file ends inside a string array (truncated or corrupt header)")
            ln = int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
            if pos + ln > n:
                raise _fail(path, f"a string in a metadata array claims {ln:,} bytes, past the end of the file "
                                  f"(corrupt header, or a truncated file)")
            if out is not None:
                out.append(bytes(buf[pos:pos + ln]).decode("utf-8", "replace"))
            pos += ln
        return pos, out
    if elem_type == _ARRAY:
        out = [] if eager else None
        for _ in range(count):
            if pos + 12 > n:
                raise _fail(path, "the file ends inside a nested metadata array (truncated or corrupt header)")
            sub_t, sub_n = struct.unpack_from("<IQ", buf, pos)
            pos, v = _read_array_body(buf, pos + 12, sub_t, sub_n, path, eager)
            if out is not None:
                out.append(v)
        return pos, out
    raise _fail(path, f"unknown metadata value type {elem_type} (corrupt header)")


def _parse(path: Path) -> GGUFInfo:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file") from None
    if size < 24:
        raise _fail(path, f"only {size} bytes: not a GGUF model (truncated or empty)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = memoryview(mm)
        try:
            return _parse_buf(path, buf, size)
        finally:
            buf.release()


def _parse_buf(path: Path, buf: memoryview, size: int) -> GGUFInfo:
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise _fail(path, f"not a GGUF file (starts with {bytes(buf[:4])!r}, expected b'GGUF')")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise _fail(path, f"unsupported GGUF version {version}")
    if n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise _fail(path, f"implausible header ({n_tensors} tensors, {n_kv} keys): corrupt file")
    pos = 24
    meta: dict[str, Any] = {}
    lazy: dict[str, LazyArray] = {}
    vtypes: dict[str, tuple[int, int | None]] = {}

    def need(k: int) -> None:
        if pos + k > size:
            raise _fail(path, f"the file ends at byte {size} inside the header (truncated)")

    def read_str(what: str, max_len: int | None = None) -> str:
        nonlocal pos
        need(8)
        ln = int.from_bytes(buf[pos:pos + 8], "little")
        if max_len is not None and ln > max_len:
            raise _fail(path, f"{what} at byte {pos:,} claims to be {ln:,} bytes long (at most {max_len:,} "
                              f"expected): corrupt header")
        if pos + 8 + ln > size:
            raise _fail(path, f"{what} at byte {pos:,} claims {ln:,} bytes but the file has only "
                              f"{size - pos - 8:,} more (corrupt header, or a truncated file)")
        pos += 8
        s = bytes(buf[pos:pos + ln]).decode("utf-8", "replace")
        pos += ln
        return s

    try:
        for i in range(n_kv):
            key = read_str(f"metadata key {i}", _KEY_MAX_BYTES)
            if key in vtypes:
                raise _fail(path, f"metadata key {excerpt(key)} appears twice (corrupt header)")
            need(4)
            vtype = int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
            if vtype in _SCALAR:
                fmt = _SCALAR[vtype]
                need(struct.calcsize(fmt))
                meta[key] = struct.unpack_from(fmt, buf, pos)[0]
                pos += struct.calcsize(fmt)
                vtypes[key] = (vtype, None)
            elif vtype == _STRING:
                meta[key] = read_str(f"the value of {excerpt(key)}")
                vtypes[key] = (vtype, None)
            elif vtype == _ARRAY:
                need(12)
                et, cnt = struct.unpack_from("<IQ", buf, pos)
                vtypes[key] = (vtype, et)
                pos += 12
                eager = cnt <= _EAGER_ARRAY_MAX
                start = pos
                pos, value = _read_array_body(buf, pos, et, cnt, path, eager)
                if eager:
                    meta[key] = value
                else:
                    lazy[key] = LazyArray(et, cnt, start, pos)
            else:
                raise _fail(path, f"unknown metadata value type {vtype} for key {excerpt(key)} (corrupt header)")
        tensors_raw = []
        names: set[str] = set()
        for i in range(n_tensors):
            name = read_str(f"the name of tensor {i}", _NAME_MAX_BYTES)
            if name in names:
                raise _fail(path, f"tensor {excerpt(name)} appears twice (corrupt header)")
            names.add(name)
            need(4)
            nd = int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
            if nd > 4:
                raise _fail(path, f"tensor {excerpt(name)} has {nd:,} dimensions (at most 4: corrupt header)")
            need(8 * nd + 12)
            dims = struct.unpack_from(f"<{nd}Q", buf, pos)
            pos += 8 * nd
            ttype, off = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            tensors_raw.append((name, dims, ttype, off))
    except struct.error:
        raise _fail(path, "the header is truncated or corrupt") from None

    align = meta.get("general.alignment", 32)
    if ("general.alignment" in vtypes and vtypes["general.alignment"] != (4, None)) or not isinstance(align, int) \
            or not 1 <= align <= 1 << 16 or align & (align - 1):
        raise _fail(path, f"general.alignment = {excerpt(align)} is not usable (allowed: a power of two, "
                          f"1..65536): corrupt header")
    data_offset = pos + (-pos % align)
    tensors = []
    end_needed, end_tensor = data_offset, None
    packed = data_offset  # where the data would end if the tensors were stored back to back
    for name, dims, ttype, off in tensors_raw:
        try:
            qt = GGMLQuantizationType(ttype)
        except ValueError:
            raise _fail(path, f"tensor {excerpt(name)} has unknown type {ttype} "
                              f"(corrupt, or newer than this build)") from None
        n_el = 1
        for d in dims:
            n_el *= d
        block, tsize = GGML_QUANT_SIZES[qt]
        nbytes = n_el // block * tsize
        if any(d > _DIM_MAX for d in dims) or nbytes > _TENSOR_MAX_BYTES:
            raise _fail(path, f"tensor {excerpt(name)} has an absurd shape {list(dims)} "
                              f"({nbytes:,} bytes of {qt.name}): corrupt header")
        if dims and dims[0] % block:
            raise _fail(path, f"tensor {excerpt(name)} has rows of {dims[0]:,} values, not a multiple of the "
                              f"{qt.name} block of {block}: corrupt header")
        if off != packed - data_offset:  # llama.cpp's reader requires the tensors back to back, in order
            raise _fail(path, f"tensor {excerpt(name)} has its data at offset {off:,} of the data section, "
                              f"expected {packed - data_offset:,} (corrupt header)")
        tensors.append(TensorInfo(name, tuple(dims), qt.name, n_el, nbytes, off))
        packed += nbytes + (-nbytes % align)
        if data_offset + off + nbytes > end_needed:
            end_needed, end_tensor = data_offset + off + nbytes, name
    if end_needed > size:
        if packed <= size:  # the sizes fit the file: an offset is wrong, not the length
            raise _fail(path, f"tensor {excerpt(end_tensor)} has its data at an offset past the end of the "
                              f"file ({end_needed:,} bytes needed, the file has {size:,}): corrupt header")
        raise _fail(path, f"truncated: its tensors need {end_needed:,} bytes but the file has {size:,} "
                          f"(an interrupted download or copy?)")
    return GGUFInfo(path=path, version=version, file_size=size, data_offset=data_offset,
                    metadata=meta, tensors=tensors, _lazy=lazy, value_types=vtypes)


@lru_cache(maxsize=32)
def _cached(path: str, mtime_ns: int, size: int) -> GGUFInfo:
    return _parse(Path(path))


def parse_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """read_gguf without its cache: parses the file as it is now (a file rewritten within one
    mtime tick is read again)."""
    return _parse(Path(path).expanduser())


def read_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Parse a GGUF header; raises ModelLoadError naming the file on any problem."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelLoadError(f"{p}: no such file") from None
    if p.is_dir():
        raise ModelLoadError(f"{p}: is a folder, not a GGUF file")
    return _cached(str(p.resolve()), st.st_mtime_ns, st.st_size)
