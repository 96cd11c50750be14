"""Load llama-cpp-python's bindings on top of the patched libraries.

llama-cpp-python reads LLAMA_CPP_LIB_PATH when `llama_cpp` is first
imported, so this module must be imported before anything else imports
llama_cpp. Everything in FlashDesk gets llama.cpp through `load()`.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from native import config
from native.cpu_variant import CpuVariant
from native.cpu_variant import choose as cpu_choose


class NativeBuildMissing(RuntimeError):
    """The patched llama.cpp build for the chosen variant is not on disk."""


@dataclass(frozen=True)
class BuildInfo:
    lib_dir: Path
    variant: str
    llama_cpp_python: str
    llama_cpp_commit: str
    patch_hash: str
    tap_architectures: tuple[str, ...]
    runtime_libs: tuple[str, ...] = ()
    cpu_variants: tuple[str, ...] = ()


def build_info(variant: str | None = None) -> BuildInfo:
    """Describe the build that load() uses (FLASHDESK_LLAMA_LIB overrides the folder)."""
    variant = variant or config.default_variant()
    override = os.environ.get("FLASHDESK_LLAMA_LIB")
    root = Path(override).parent if override else config.build_dir(variant)
    info_file = root / "build_info.json"
    if not info_file.exists():
        raise NativeBuildMissing(
            f"no patched llama.cpp build ({variant}) at {root}: run `make setup`"
            + (" with FLASHDESK_CUDA=1" if variant == "cuda" else "")
            + " (or `python -m native.build --variant " + variant + "`)")
    info = json.loads(info_file.read_text())
    return BuildInfo(
        lib_dir=root / "lib",
        variant=info["variant"],
        llama_cpp_python=info["llama_cpp_python"],
        llama_cpp_commit=info["llama_cpp_commit"],
        patch_hash=info["patch_hash"],
        tap_architectures=tuple(info["tap_architectures"]),
        runtime_libs=tuple(info.get("runtime_libs", ())),
        cpu_variants=tuple(info.get("cpu_variants", ())),
    )


# the version of src/flashdesk-ext.h (native/patches/0002, 0007, 0008) that native/ext.py binds
EXT_API_VERSION = 5

_loaded: ModuleType | None = None
_cpu: CpuVariant | None = None




def load() -> ModuleType:
    """Import and initialise `llama_cpp.llama_cpp` from the patched build."""
    global _loaded
    if _loaded is not None:
        return _loaded
    info = build_info()
    os.environ["LLAMA_CPP_LIB_PATH"] = str(info.lib_dir)
    # a failed GGML_ASSERT would otherwise attach gdb to print a backtrace
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    _preload_runtime_libs(info)
    import llama_cpp.llama_cpp as lc  # noqa: PLC0415 - must follow the env var

    loaded_from = Path(lc._base_path).resolve()
    if loaded_from != info.lib_dir.resolve():
        raise NativeBuildMissing(
            f"llama_cpp was imported from {loaded_from} before FlashDesk set its library path "
            f"({info.lib_dir}); import native.lib first")
    version = lc._lib.flashdesk_ext_api_version
    version.restype = ctypes.c_int32
    if version() != EXT_API_VERSION:
        raise NativeBuildMissing(f"{info.lib_dir} has FlashDesk C API v{version()}, "
                                 f"expected v{EXT_API_VERSION}: rebuild with `make setup`")
    _quiet_logs(lc)
    _load_backends(info)
    lc.llama_backend_init()  # finds the backends registered: loads nothing more
    _loaded = lc
    return lc


def cpu_variant() -> CpuVariant:
    """The CPU backend load() chose (loads the library first)."""
    load()
    assert _cpu is not None
    return _cpu


def _load_backends(info: BuildInfo) -> None:
    """Register ggml's backends from the build folder: GPU and RPC backends
    where built, then the chosen CPU variant (native.cpu_variant)."""
    global _cpu
    ggml = ctypes.CDLL(str(info.lib_dir / "libggml.so"))
    ggml.ggml_backend_load.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_load.restype = ctypes.c_void_p
    if not info.cpu_variants:  # a build that links its backends into libggml
        _cpu = CpuVariant("built-in", "the cmake_flags of build_info.json", "the build has no CPU variants",
                          info.lib_dir / "libggml-cpu.so")
        return
    for name in ("cuda", "rpc"):
        path = info.lib_dir / f"libggml-{name}.so"
        if path.exists() and not ggml.ggml_backend_load(str(path).encode()):
            raise NativeBuildMissing(f"{path}: ggml could not load this backend (see the log above)")
    _cpu = cpu_choose(info.lib_dir, info.cpu_variants)
    if not ggml.ggml_backend_load(str(_cpu.path).encode()):
        raise NativeBuildMissing(f"{_cpu.path}: ggml could not load the CPU backend")


def _preload_runtime_libs(info: BuildInfo) -> None:
    """Load the CUDA runtime the build linked (cudart, cuBLAS) by full path,
    so libggml-cuda finds them by soname even when their folder is not on
    the loader's path (a PyPI cuBLAS, a toolkit outside ld.so.conf)."""
    for path in info.runtime_libs:
        if Path(path).exists():  # else the system loader's own search decides
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _quiet_logs(lc: ModuleType) -> None:
    """Route llama.cpp's log to Python logging; only warnings and errors by default."""
    logger = logging.getLogger("llama.cpp")
    verbose = os.environ.get("FLASHDESK_LLAMA_VERBOSE") == "1"

    @lc.llama_log_callback
    def _cb(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        # ggml levels: 1 debug? 2 info, 3 warn, 4 error (GGML_LOG_LEVEL_*)
        if verbose or level in (3, 4):
            logger.log(logging.ERROR if level == 4 else logging.WARNING if level == 3 else logging.INFO,
                       text.decode("utf-8", "replace").rstrip())

    global _log_cb_ref
    _log_cb_ref = _cb  # keep the ctypes callback alive
    lc.llama_log_set(_cb, None)


_log_cb_ref = None
