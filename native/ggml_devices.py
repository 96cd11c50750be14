"""ctypes bindings for ggml's backend-device API (ggml-backend.h, ggml-rpc.h):
what devices the loaded build sees, with their memory and capabilities, and
RPC servers as extra devices. The libraries are loaded (native.lib.load) on
the first call, not at import."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace

from native.lib import build_info, load

_dev_t = ctypes.c_void_p
_reg_t = ctypes.c_void_p

DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


class _Caps(ctypes.Structure):
    _fields_ = [("async_", ctypes.c_bool), ("host_buffer", ctypes.c_bool), ("buffer_from_host_ptr", ctypes.c_bool),
                ("events", ctypes.c_bool), ("mmap_support", ctypes.c_bool)]


class DeviceProps(ctypes.Structure):
    # struct ggml_backend_dev_props (ggml-backend.h of the pinned llama.cpp)
    _fields_ = [("name", ctypes.c_char_p), ("description", ctypes.c_char_p), ("memory_free", ctypes.c_size_t),
                ("memory_total", ctypes.c_size_t), ("type", ctypes.c_int), ("device_id", ctypes.c_char_p),
                ("caps", _Caps)]


def _bind(lib: ctypes.CDLL, name: str, argtypes: list, restype):  # noqa: ANN001
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


@cache
def _api() -> SimpleNamespace:
    """The bound functions (after the patched build is loaded and its backends registered)."""
    load()
    lib_dir = build_info().lib_dir
    ggml = ctypes.CDLL(str(lib_dir / "libggml.so"))
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    return SimpleNamespace(
        # size_t ggml_backend_dev_count(void);
        dev_count=_bind(ggml, "ggml_backend_dev_count", [], ctypes.c_size_t),
        # ggml_backend_dev_t ggml_backend_dev_get(size_t index);
        dev_get=_bind(ggml, "ggml_backend_dev_get", [ctypes.c_size_t], _dev_t),
        # const char * ggml_backend_dev_name(ggml_backend_dev_t device);
        dev_name=_bind(base, "ggml_backend_dev_name", [_dev_t], ctypes.c_char_p),
        # const char * ggml_backend_dev_description(ggml_backend_dev_t device);
        dev_description=_bind(base, "ggml_backend_dev_description", [_dev_t], ctypes.c_char_p),
        # void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
        dev_memory=_bind(base, "ggml_backend_dev_memory",
                         [_dev_t, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)], None),
        # enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
        dev_type=_bind(base, "ggml_backend_dev_type", [_dev_t], ctypes.c_int),
        # void ggml_backend_dev_get_props(ggml_backend_dev_t device, struct ggml_backend_dev_props * props);
        dev_get_props=_bind(base, "ggml_backend_dev_get_props", [_dev_t, ctypes.POINTER(DeviceProps)], None),
        # void ggml_backend_register(ggml_backend_reg_t reg);
        register=_bind(ggml, "ggml_backend_register", [_reg_t], None),
    )


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
    api = _api()
    out = []
    for i in range(api.dev_count()):
        d = api.dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        api.dev_memory(d, ctypes.byref(free), ctypes.byref(total))
        out.append(Device(i, d, (api.dev_name(d) or b"").decode(), (api.dev_description(d) or b"").decode(),
                          DEVICE_TYPES.get(api.dev_type(d), "?"), free.value, total.value))
    return out


def device_props(handle: int) -> DeviceProps:
    """A device's properties (its PCI id, whether it runs asynchronously with events, ...)."""
    props = DeviceProps()
    _api().dev_get_props(handle, ctypes.byref(props))
    return props


def add_rpc_server(endpoint: str) -> list[Device]:
    """Register an rpc-server (host:port) as device(s); returns the new devices."""
    rpc = ctypes.CDLL(str(build_info().lib_dir / "libggml-rpc.so"))
    add = _bind(rpc, "ggml_backend_rpc_add_server", [ctypes.c_char_p], _reg_t)
    before = {d.handle for d in list_devices()}
    reg = add(endpoint.encode())
    if not reg:
        raise ConnectionError(f"could not reach the RPC server at {endpoint}")
    _api().register(reg)
    return [d for d in list_devices() if d.handle not in before]
