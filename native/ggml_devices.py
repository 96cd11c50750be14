"""ctypes bindings for ggml's backend-device API (ggml-backend.h, ggml-rpc.h):
what devices the loaded build sees, with their memory, and RPC servers as
extra devices. Import after native.lib.load()."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from native.lib import build_info

_dir = build_info().lib_dir
_ggml = ctypes.CDLL(str(_dir / "libggml.so"))
_ggml_base = ctypes.CDLL(str(_dir / "libggml-base.so"))

_dev_t = ctypes.c_void_p
_reg_t = ctypes.c_void_p

DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


def _bind(lib: ctypes.CDLL, name: str, argtypes: list, restype):  # noqa: ANN001
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


# size_t ggml_backend_dev_count(void);
ggml_backend_dev_count = _bind(_ggml, "ggml_backend_dev_count", [], ctypes.c_size_t)
# ggml_backend_dev_t ggml_backend_dev_get(size_t index);
ggml_backend_dev_get = _bind(_ggml, "ggml_backend_dev_get", [ctypes.c_size_t], _dev_t)
# const char * ggml_backend_dev_name(ggml_backend_dev_t device);
ggml_backend_dev_name = _bind(_ggml_base, "ggml_backend_dev_name", [_dev_t], ctypes.c_char_p)
# const char * ggml_backend_dev_description(ggml_backend_dev_t device);
ggml_backend_dev_description = _bind(_ggml_base, "ggml_backend_dev_description", [_dev_t], ctypes.c_char_p)
# void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
ggml_backend_dev_memory = _bind(_ggml_base, "ggml_backend_dev_memory",
                                [_dev_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None)
# enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
ggml_backend_dev_type = _bind(_ggml_base, "ggml_backend_dev_type", [_dev_t], ctypes.c_int)
# void ggml_backend_register(ggml_backend_reg_t reg);
ggml_backend_register = _bind(_ggml, "ggml_backend_register", [_reg_t], None)


@dataclass(frozen=True)
class Device:
    index: int
    handle: int
    name: str
    description: str
    type: str
    memory_free: int
    memory_total: int

    def to_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "description": self.description, "type": self.type,
                "memory_free": self.memory_free, "memory_total": self.memory_total}


def list_devices() -> list[Device]:
    """Every ggml backend device of the loaded build, in ggml's order."""
    out = []
    for i in range(ggml_backend_dev_count()):
        d = ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml_backend_dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        out.append(Device(i, d, (ggml_backend_dev_name(d) or b"").decode(),
                          (ggml_backend_dev_description(d) or b"").decode(),
                          DEVICE_TYPES.get(ggml_backend_dev_type(d), "?"), free.value, total.value))
    return out


def add_rpc_server(endpoint: str) -> list[Device]:
    """Register an rpc-server (host:port) as device(s); returns the new devices."""
    rpc = ctypes.CDLL(str(_dir / "libggml-rpc.so"))
    add = _bind(rpc, "ggml_backend_rpc_add_server", [ctypes.c_char_p], _reg_t)
    before = {d.handle for d in list_devices()}
    reg = add(endpoint.encode())
    if not reg:
        raise ConnectionError(f"could not reach the RPC server at {endpoint}")
    ggml_backend_register(reg)
    return [d for d in list_devices() if d.handle not in before]
