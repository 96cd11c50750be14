"""Build the drafts harness (native/harness/spec_drafts.cpp) against the pinned, patched tree, once, cached.

    python -m native.harness [--variant cpu] [--force] [--print-path]

The harness prints the drafts llama.cpp's own `common_speculative` (draft-simple or draft-dflash)
proposes at each step of a greedy generation, so that tests can hold FlashDesk's draft-model and
DFlash sources (DFlash v1 and DFlash2) to them (tests/test_drafts_equal_llama.py). It needs
libllama-common, which our library build does not make, so it is built in the llama-server peer's
work folder (native.server: the same sdist, patches and flags, GGML_NATIVE off), which this shares
and resumes: the targets `llama-common` and the CPU backends, then one `c++` of the harness linked
against them. The result (the program and the shared libraries it loads from its own folder) is
cached under

    <cache_root>/harness-<version>-<variant>-<key>/bin/spec-drafts

keyed by the sdist version, patch hash, variant, flags and the harness source, so a change of any
builds again and a second run returns at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from native import build as nb
from native import config
from native import server as ns

SOURCE = Path(__file__).parent / "harness" / "spec_drafts.cpp"
BINARY = "spec-drafts"


def harness_targets(variant: str) -> list[str]:
    """libllama-common (and libllama through it) and the backends loaded at run time."""
    return ["llama-common", *(f"ggml-cpu-{v}" for v in config.CPU_VARIANTS),
            *(["ggml-cuda"] if variant == "cuda" else [])]


def harness_dir(variant: str | None = None) -> Path:
    variant = variant or config.default_variant()
    h = hashlib.sha256(json.dumps([config.LLAMA_CPP_PYTHON_VERSION, config.patch_hash(), variant,
                                   ns.server_flags(variant), harness_targets(variant),
                                   hashlib.sha256(SOURCE.read_bytes()).hexdigest()]).encode())
    return config.cache_root() / f"harness-{config.LLAMA_CPP_PYTHON_VERSION}-{variant}-{h.hexdigest()[:16]}"


def harness_path(variant: str | None = None) -> Path | None:
    """The cached harness, or None when it has not been built."""
    out = harness_dir(variant)
    exe = out / "bin" / BINARY
    return exe if (out / "build_info.json").exists() and exe.exists() else None


def build_harness(variant: str | None = None, force: bool = False, jobs: int | None = None) -> Path:
    """The path of the harness, built (minutes on 2 cores from a bare cache) or found in the cache."""
    variant = variant or config.default_variant()
    out = harness_dir(variant)
    exe = out / "bin" / BINARY
    if harness_path(variant) is not None and not force:
        return exe
    tarball = nb.fetch_sdist()
    work = config.cache_root() / f"work-server-{ns.server_key(variant)}"
    llama_dir = work / nb.SDIST_NAME / "vendor" / "llama.cpp"
    if not (work / "sources.ok").exists():
        nb.extract_sdist(tarball, work)
        (llama_dir / ".git").unlink(missing_ok=True)
        nb.apply_patches(llama_dir)
        (work / "sources.ok").write_text(config.patch_hash())
    bdir = work / "build"
    log_file = work / "harness-build.log"
    jobs = jobs or os.cpu_count() or 2
    t0 = time.time()
    extra = nb.cuda_toolkit_flags(work)[0] if variant == "cuda" else []
    if not (bdir / "CMakeCache.txt").exists():
        nb.run_streamed(["cmake", "-S", str(llama_dir), "-B", str(bdir), *ns.server_flags(variant), *extra],
                        work, log_file)
    nb.run_streamed(["cmake", "--build", str(bdir), "--config", "Release", "-j", str(jobs),
                     "--target", *harness_targets(variant)], work, log_file)

    staged = out.with_name(out.name + ".partial")
    shutil.rmtree(staged, ignore_errors=True)
    bin_dir = staged / "bin"
    bin_dir.mkdir(parents=True)
    for f in (bdir / "bin").iterdir():
        if f.name.endswith(".so") or ".so." in f.name:
            shutil.copy2(f, bin_dir / f.name, follow_symlinks=False)
    m = re.search(r"^CMAKE_CXX_COMPILER:\w+=(.+)$", (bdir / "CMakeCache.txt").read_text(), re.M)
    cxx = m.group(1).strip() if m else "c++"
    cmd = [cxx, "-std=c++17", "-O2", str(SOURCE), "-o", str(bin_dir / BINARY),
           *(f"-I{llama_dir / d}" for d in ("include", "common", "ggml/include", "vendor")),
           f"-L{bin_dir}", "-lllama-common", "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath,$ORIGIN"]
    nb.run_streamed(cmd, work, log_file)
    seconds = time.time() - t0
    (staged / "build_info.json").write_text(json.dumps({
        "llama_cpp_python": config.LLAMA_CPP_PYTHON_VERSION, "llama_cpp_commit": nb.LLAMA_CPP_COMMIT,
        "patch_hash": config.patch_hash(), "variant": variant, "cmake_flags": ns.server_flags(variant) + extra,
        "targets": harness_targets(variant), "build_seconds": round(seconds, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2))
    # the work folder stays: it is the server's, which builds llama-server on from here
    shutil.rmtree(out, ignore_errors=True)
    staged.rename(out)
    nb.log(f"built {BINARY} ({variant}) in {seconds:.0f} s -> {exe}")
    return exe


def main(argv: list[str] | None = None) -> int:
    return ns.tool_main(argv, __doc__, harness_path, build_harness, print_built=True)


if __name__ == "__main__":
    sys.exit(main())
