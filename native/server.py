"""Build llama.cpp's own `llama-server` from the same patched tree as our libraries, once, cached.

    python -m native.server [--variant cpu|cuda] [--force] [--jobs N]

Only `flashdesk bench`'s peer modes (app.bench.peers) need it, so nothing in
`make setup` or `make test`'s default path builds it. The source is the
pinned sdist with native/patches applied (native.build: upstream alone cannot
tap gemma3, which llama.cpp's draft-dflash needs), configured with the
variant's flags (native.config.VARIANT_FLAGS: GGML_NATIVE stays OFF, the CPU
backend is built per instruction-set level and chosen at run time) plus the
server switched on. The result, the server and the shared libraries it loads
from its own folder, is cached under

    <cache_root>/server-<version>-<variant>-<key>/bin/llama-server

keyed like the libraries (sdist version, patch hash, variant, flags, targets),
so a change of patch or flag builds again and a second run returns at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from native import build as nb
from native import config

SERVER_BINARY = "llama-server"


def server_flags(variant: str) -> list[str]:
    """The library build's flags with the server on and its web UI off (no npm, no download)."""
    flags = [f for f in config.VARIANT_FLAGS[variant]
             if not f.startswith(("-DLLAMA_BUILD_SERVER=", "-DLLAMA_BUILD_UI="))]
    assert "-DGGML_NATIVE=OFF" in flags  # the CPU may advertise AMX it cannot run (SIGILL)
    return flags + ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"]


def server_targets(variant: str) -> list[str]:
    """llama-server and the backends it loads at run time (GGML_BACKEND_DL)."""
    backends = [f"ggml-cpu-{v}" for v in config.CPU_VARIANTS]
    return [SERVER_BINARY, *backends, *(["ggml-cuda"] if variant == "cuda" else [])]


def server_key(variant: str) -> str:
    if variant not in config.VARIANT_FLAGS:
        raise ValueError(f"unknown native variant {variant!r}; expected one of {sorted(config.VARIANT_FLAGS)}")
    h = hashlib.sha256(json.dumps([config.LLAMA_CPP_PYTHON_VERSION, config.patch_hash(), variant,
                                   server_flags(variant), server_targets(variant)]).encode())
    return f"{config.LLAMA_CPP_PYTHON_VERSION}-{variant}-{h.hexdigest()[:16]}"


def server_dir(variant: str | None = None) -> Path:
    return config.cache_root() / f"server-{server_key(variant or config.default_variant())}"


def server_path(variant: str | None = None) -> Path | None:
    """The cached llama-server, or None when it has not been built (FLASHDESK_LLAMA_SERVER overrides)."""
    override = os.environ.get("FLASHDESK_LLAMA_SERVER")
    if override:
        return Path(override)
    out = server_dir(variant)
    exe = out / "bin" / SERVER_BINARY
    return exe if (out / "build_info.json").exists() and exe.exists() else None


def build_server(variant: str | None = None, force: bool = False, jobs: int | None = None) -> Path:
    """The path of llama-server, built (a few minutes on 2 cores) or found in the cache."""
    variant = variant or config.default_variant()
    out = server_dir(variant)
    exe = out / "bin" / SERVER_BINARY
    if (out / "build_info.json").exists() and exe.exists() and not force:
        nb.log(f"cached: {exe}")
        return exe
    tarball = nb.fetch_sdist()
    work = config.cache_root() / f"work-server-{server_key(variant)}"
    sources_ready = work / "sources.ok"
    llama_dir = work / nb.SDIST_NAME / "vendor" / "llama.cpp"
    resumed = sources_ready.exists() and not force
    if resumed:
        nb.log(f"resuming the server build in {work}")
    else:
        nb.extract_sdist(tarball, work)
        (llama_dir / ".git").unlink(missing_ok=True)
        nb.apply_patches(llama_dir)
        sources_ready.write_text(config.patch_hash())
    bdir = work / "build"
    log_file = work / "build.log"
    jobs = jobs or os.cpu_count() or 2
    t0 = time.time()
    extra, runtime_libs = nb.cuda_toolkit_flags(work) if variant == "cuda" else ([], [])
    nb.run_streamed(["cmake", "-S", str(llama_dir), "-B", str(bdir), *server_flags(variant), *extra], work, log_file)
    nb.run_streamed(["cmake", "--build", str(bdir), "--config", "Release", "-j", str(jobs),
                     "--target", *server_targets(variant)], work, log_file)
    seconds = time.time() - t0

    staged = work / "staged"
    shutil.rmtree(staged, ignore_errors=True)
    bin_dir = staged / "bin"
    bin_dir.mkdir(parents=True)
    for f in (bdir / "bin").iterdir():
        if f.name == SERVER_BINARY or f.name.endswith(".so") or ".so." in f.name:
            shutil.copy2(f, bin_dir / f.name, follow_symlinks=False)
    if not (bin_dir / SERVER_BINARY).exists():
        raise nb.BuildError(f"the build produced no {SERVER_BINARY} in {bdir / 'bin'}; full log: {log_file}")
    nb.publish(work, staged, out, {
        "variant": variant,
        "cmake_flags": server_flags(variant) + extra,
        "targets": server_targets(variant),
        "runtime_libs": runtime_libs,
        "build_seconds": round(seconds, 1),
        "resumed": resumed,
    })
    nb.log(f"built {SERVER_BINARY} ({variant}) in {seconds:.0f} s -> {out / 'bin' / SERVER_BINARY}")
    return out / "bin" / SERVER_BINARY


def tool_main(argv: list[str] | None, doc: str | None, path_of, build, print_built: bool = False) -> int:
    """The command line of a cached native tool (llama-server, the drafts harness): build it, or
    print where the cached one is."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default=None, choices=sorted(config.VARIANT_FLAGS))
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--print-path", action="store_true", help="only print the cached path (empty if not built)")
    args = ap.parse_args(argv)
    if args.print_path:
        p = path_of(args.variant)
        print(p or "")
        return 0 if p else 1
    try:
        built = build(args.variant, force=args.force, jobs=args.jobs)
    except (nb.BuildError, subprocess.CalledProcessError) as e:
        print(f"[native] error: {e}", file=sys.stderr)
        return 1
    if print_built:
        print(built)
    return 0


def main(argv: list[str] | None = None) -> int:
    return tool_main(argv, __doc__, server_path, build_server)


if __name__ == "__main__":
    sys.exit(main())
