"""What the native build is: the pinned llama.cpp source, our patches, the
build flags per variant, and where the result is cached.

Both the build driver and the runtime loader import this module, so they
agree on the cache key without any state written elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# llama.cpp comes vendored in this sdist (it has the dflash arch, KV
# injection and the llama-ext.h taps API that FlashDesk builds on).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

NATIVE_DIR = Path(__file__).resolve().parent
PATCH_DIR = NATIVE_DIR / "patches"

# The CPU backend is built once per instruction-set level and the loader picks
# the best one this CPU runs (native.cpu_variant), in preference order, best
# last. No variant compiles AMX: CPUs (and VMs) that advertise AMX without the
# OS enabling it die with SIGILL on the first AMX instruction, which is also
# why the build never uses GGML_NATIVE=ON. AVX2 is the floor.
CPU_VARIANTS: dict[str, str] = {
    "haswell": "AVX2, FMA, F16C (x86-64-v3)",
    "alderlake": "AVX2 with AVX-VNNI",
    "icelake": "AVX-512 with VNNI and VBMI",
}

_COMMON_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_NATIVE=OFF",
    "-DGGML_BACKEND_DL=ON",
    "-DGGML_CPU_ALL_VARIANTS=ON",
    "-DGGML_CPU_VARIANT_LIST=" + ";".join(CPU_VARIANTS),  # native/patches/0004
    "-DGGML_RPC=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    # every artefact lands in one folder and finds its siblings there
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
]

VARIANT_FLAGS: dict[str, list[str]] = {
    "cpu": _COMMON_FLAGS,
    # RTX 30 (86), RTX 40 (89), RTX 50 (120)
    "cuda": _COMMON_FLAGS + ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=86;89;120"],
}

# Targets we need: the library, its backends (loaded at run time) and the RPC
# server (two-device tests on CPU).
BUILD_TARGETS = ["llama", "ggml-rpc", "ggml-rpc-server", *(f"ggml-cpu-{v}" for v in CPU_VARIANTS)]
VARIANT_TARGETS: dict[str, list[str]] = {"cpu": BUILD_TARGETS, "cuda": BUILD_TARGETS + ["ggml-cuda"]}


def cache_root() -> Path:
    """Where builds and the sdist are cached (override: FLASHDESK_NATIVE_CACHE)."""
    env = os.environ.get("FLASHDESK_NATIVE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "flashdesk" / "native"


def patch_files() -> list[Path]:
    return sorted(PATCH_DIR.glob("*.patch"))


def patch_hash() -> str:
    """sha256 over the patches, in order, name and content."""
    h = hashlib.sha256()
    for p in patch_files():
        h.update(p.name.encode())
        h.update(b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def build_key(variant: str) -> str:
    """The cache key: (sdist version, patch hash, variant and its flags)."""
    if variant not in VARIANT_FLAGS:
        raise ValueError(f"unknown native variant {variant!r}; expected one of {sorted(VARIANT_FLAGS)}")
    h = hashlib.sha256()
    h.update(json.dumps([LLAMA_CPP_PYTHON_VERSION, patch_hash(), variant,
                         VARIANT_FLAGS[variant], VARIANT_TARGETS[variant]]).encode())
    return f"{LLAMA_CPP_PYTHON_VERSION}-{variant}-{h.hexdigest()[:16]}"


def build_dir(variant: str) -> Path:
    """The folder holding one finished build: lib/ and build_info.json."""
    return cache_root() / build_key(variant)


def default_variant() -> str:
    """FLASHDESK_VARIANT (or FLASHDESK_CUDA=1) picks the build at run time; cpu unless told."""
    if os.environ.get("FLASHDESK_VARIANT"):
        return os.environ["FLASHDESK_VARIANT"]
    return "cuda" if os.environ.get("FLASHDESK_CUDA") == "1" else "cpu"
