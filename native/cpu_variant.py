"""Which build of ggml's CPU backend this process runs, and why.

The native build holds one CPU backend per instruction-set level
(native.config.CPU_VARIANTS). ggml's own loader only searches the folder of
the executable (python's bin/ here) and the working directory, so FlashDesk
chooses and loads the backends itself: the best variant whose
`ggml_backend_score()` says this CPU can run it, or the one named by
FLASHDESK_CPU_VARIANT (tests force the AVX2 one; a variant the CPU cannot
run is refused, not loaded). The score checks CPUID and the OS (XCR0), so a
CPU or VM that advertises AVX-512 without enabling it gets the AVX2 build.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from native import config

ENV = "FLASHDESK_CPU_VARIANT"


class CpuVariantError(RuntimeError):
    """No CPU backend of this build runs here, or the forced one does not."""


@dataclass(frozen=True)
class CpuVariant:
    name: str
    features: str  # what the variant is compiled for
    reason: str    # why it was chosen
    path: Path

    def to_dict(self) -> dict:
        return {"name": self.name, "features": self.features, "reason": self.reason, "path": str(self.path)}


def variant_path(lib_dir: Path, name: str) -> Path:
    return lib_dir / f"libggml-cpu-{name}.so"


def runs_here(path: Path) -> bool:
    """The variant's own `ggml_backend_score()`: > 0 when this CPU and OS run its code
    (ggml loads every candidate to ask; its kernels are not touched)."""
    lib = ctypes.CDLL(str(path))
    score = lib.ggml_backend_score
    score.restype = ctypes.c_int
    score.argtypes = []
    return score() > 0


def choose(lib_dir: Path, built: tuple[str, ...]) -> CpuVariant:
    """The CPU backend to load from lib_dir (variants `built`, in preference order, best last)."""
    forced = os.environ.get(ENV, "").strip()
    if forced:
        if forced not in built:
            raise CpuVariantError(f"{ENV}={forced}: this build has the CPU variants {', '.join(built)}")
        path = variant_path(lib_dir, forced)
        if not runs_here(path):
            raise CpuVariantError(f"{ENV}={forced}: this CPU lacks {config.CPU_VARIANTS[forced]}")
        return CpuVariant(forced, config.CPU_VARIANTS[forced], f"forced by {ENV}", path)
    skipped = []
    for name in reversed(built):
        path = variant_path(lib_dir, name)
        if runs_here(path):
            reason = ("the best this build has" if not skipped
                      else f"this CPU lacks {'; '.join(config.CPU_VARIANTS[s] for s in skipped)}")
            return CpuVariant(name, config.CPU_VARIANTS[name], reason, path)
        skipped.append(name)
    raise CpuVariantError(f"no CPU backend in {lib_dir} runs on this CPU (it needs at least "
                          f"{config.CPU_VARIANTS[built[0]]})" if built else f"no CPU backend in {lib_dir}")
