"""Build the patched llama.cpp once and cache it.

    python -m native.build [--variant cpu|cuda] [--python-package] [--force]

Steps: fetch the pinned llama-cpp-python sdist through pip (a package
registry), apply native/patches/*.patch to its vendored llama.cpp, configure
and build with CMake, and copy the shared libraries and rpc server into the
cache folder named by native.config.build_key. A second run finds the folder
and returns at once. `--python-package` also installs llama-cpp-python's
Python bindings (without compiling its own copy of llama.cpp) into the
running interpreter; the libraries are loaded from the cache by native.lib.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from native import config

SDIST_NAME = f"llama_cpp_python-{config.LLAMA_CPP_PYTHON_VERSION}"
# the llama.cpp commit that llama-cpp-python 0.3.36 vendors (its CHANGELOG)
LLAMA_CPP_COMMIT = "0c1e57098"
CUDA_ARCHS_ENV = "FLASHDESK_CUDA_ARCHS"  # e.g. "90": build the cuda variant for these architectures only


class BuildError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[native] {msg}", flush=True)


def fetch_sdist() -> Path:
    """The pinned sdist, downloaded once into the cache."""
    dest = config.cache_root() / "sdist"
    tarball = dest / f"{SDIST_NAME}.tar.gz"
    if tarball.exists():
        return tarball
    dest.mkdir(parents=True, exist_ok=True)
    log(f"downloading llama-cpp-python=={config.LLAMA_CPP_PYTHON_VERSION} sdist (~77 MB) from the package index")
    tmp = dest / "partial"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--progress-bar", "on", "-d", str(tmp), f"llama-cpp-python=={config.LLAMA_CPP_PYTHON_VERSION}"],
        check=True,
    )
    got = next(tmp.glob("*.tar.gz"), None)
    if got is None:
        raise BuildError(f"pip download produced no sdist in {tmp}")
    got.rename(tarball)
    shutil.rmtree(tmp, ignore_errors=True)
    return tarball


def extract_sdist(tarball: Path, into: Path) -> Path:
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    log(f"extracting {tarball.name}")
    with tarfile.open(tarball) as tf:
        tf.extractall(into, filter="data")
    return into / SDIST_NAME


def apply_patches(llama_dir: Path) -> None:
    for patch in config.patch_files():
        log(f"applying {patch.name}")
        res = subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(patch)],
                             cwd=llama_dir, capture_output=True, text=True)
        if res.returncode != 0:
            raise BuildError(f"patch {patch} does not apply to llama.cpp {LLAMA_CPP_COMMIT}:\n{res.stdout}{res.stderr}")


def scan_tap_architectures(llama_dir: Path) -> list[str]:
    """Architectures whose graph records layer inputs (t_layer_inp), read
    from the patched source: arch name -> enum -> model class -> the file
    that builds its graph (following graphs borrowed from another class)."""
    src = llama_dir / "src"
    names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+)\s*,\s*"([^"]+)"\s*\}', (src / "llama-arch.cpp").read_text()))
    enum_to_class: dict[str, str] = {}
    pending: list[str] = []
    for line in (src / "llama-model.cpp").read_text().splitlines():
        m = re.match(r"\s*case (LLM_ARCH_\w+):\s*$", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*return new llama_model_(\w+)\(params\);", line)
        if m and pending:
            for e in pending:
                enum_to_class.setdefault(e, m.group(1))
        pending = []
    files = {p: p.read_text() for p in (src / "models").glob("*.cpp")}

    def has_taps(cls: str, seen: frozenset[str] = frozenset()) -> bool:
        if cls in seen:
            return False
        for text in files.values():
            m = re.search(rf"llama_model_{cls}::build_arch_graph\(.*?\n\}}", text, re.S)
            if not m:
                continue
            borrowed = re.findall(r"llama_model_(\w+)::graph", m.group(0))
            if any(b != cls and has_taps(b, seen | {cls}) for b in borrowed):
                return True
            return "t_layer_inp[" in text
        return False

    return sorted(names[e] for e, cls in enum_to_class.items() if e in names and has_taps(cls))


def cuda_toolkit_flags(work: Path) -> tuple[list[str], list[str]]:
    """Fill gaps of a pip-installed CUDA toolkit (nvcc without cuBLAS or the
    driver stub, as on FlashDesk's build machines): fetch cuBLAS from PyPI
    and build without the driver-API memory pool (VMM) when there is no
    libcuda to link. A full toolkit needs neither and gets no extra flags.

    Also returns the CUDA runtime libraries the build links (cudart, cuBLAS)
    as full paths: the toolkit's lib folder is often not on the loader's
    path, and the PyPI cuBLAS never is, so native.lib preloads them."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError("the cuda variant needs nvcc on PATH (CUDA toolkit 12 or 13)")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise BuildError(f"cannot read the CUDA version from `nvcc --version`: {out!r}")
    major, minor = m.groups()
    toolkit = Path(nvcc).resolve().parent.parent
    for cand in (Path(nvcc).parent.parent, Path("/usr/local/cuda")):
        if (cand / "include" / "cuda_runtime.h").exists():
            toolkit = cand
    flags: list[str] = []
    lib_dirs = [toolkit / "lib64", toolkit / "lib"]
    if not (toolkit / "include" / "cublas_v2.h").exists():
        wheel_dir = config.cache_root() / f"cublas-{major}.{minor}"
        if not wheel_dir.exists():
            log(f"cuBLAS is missing from {toolkit}; fetching nvidia-cublas=={major}.{minor}.* from PyPI")
            tmp = work / "cublas"
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp),
                            f"nvidia-cublas=={major}.{minor}.*"], check=True)
            with zipfile.ZipFile(next(tmp.glob("*.whl"))) as zf:
                zf.extractall(wheel_dir)
        inc = next(wheel_dir.glob("nvidia/*/include"))
        lib = inc.parent / "lib"
        lib_dirs.append(lib)
        flags += [f"-DCUDA_cublas_LIBRARY={next(lib.glob('libcublas.so*'))}",
                  f"-DCUDA_cublasLt_LIBRARY={next(lib.glob('libcublasLt.so*'))}",
                  f"-DCMAKE_CUDA_FLAGS=-isystem {inc}", f"-DCMAKE_CXX_FLAGS=-isystem {inc}",
                  # executables (the rpc server) link libggml-cuda, whose cuBLAS the linker
                  # must find by soname in a folder it does not search
                  f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,{lib}"]
    driver_dirs = (toolkit / "lib64" / "stubs", toolkit / "lib64", Path("/usr/lib/x86_64-linux-gnu"))
    has_driver = any(any(d.glob("libcuda.so*")) for d in driver_dirs if d.exists())
    if not has_driver:
        log("no libcuda (driver or stub) to link: building without the VMM memory pool")
        flags.append("-DGGML_CUDA_NO_VMM=ON")
    return flags, cuda_runtime_libs(lib_dirs, major)


def cuda_runtime_libs(lib_dirs: list[Path], major: str) -> list[str]:
    """cudart, cuBLASLt, cuBLAS of CUDA `major` (in load order) found in lib_dirs."""
    found = []
    for name in ("libcudart", "libcublasLt", "libcublas"):
        hits = [d / f"{name}.so.{major}" for d in lib_dirs if (d / f"{name}.so.{major}").exists()]
        if hits:
            found.append(str(hits[0].resolve()))
    return found


def run_streamed(cmd: list[str], cwd: Path, log_file: Path) -> None:
    """Run a long command, keep its full log, and show progress lines."""
    log("$ " + " ".join(cmd))
    with open(log_file, "a") as lf:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        last = 0.0
        for line in proc.stdout:
            lf.write(line)
            m = re.match(r"\[\s*(\d+)%\]", line)
            now = time.time()
            if m and now - last > 5:
                log(f"build {m.group(1)}% {line.strip()[7:90]}")
                last = now
        if proc.wait() != 0:
            raise BuildError(f"{cmd[0]} failed with exit code {proc.returncode}; full log: {log_file}")


def build(variant: str, force: bool = False, jobs: int | None = None) -> Path:
    """Build (or find cached) the patched libraries for `variant`."""
    out = config.build_dir(variant)
    if (out / "build_info.json").exists() and not force:
        log(f"cached: {out}")
        return out
    tarball = fetch_sdist()
    # the work folder is keyed like the cache, so an interrupted build (the
    # CUDA variant takes hours on a small CPU) resumes where make stopped
    work = config.cache_root() / f"work-{config.build_key(variant)}"
    sources_ready = work / "sources.ok"
    llama_dir = work / SDIST_NAME / "vendor" / "llama.cpp"
    resumed = sources_ready.exists() and not force
    if resumed:
        log(f"resuming the build in {work}")
    else:
        extract_sdist(tarball, work)
        # the vendored tree carries a submodule .git file that confuses tools
        (llama_dir / ".git").unlink(missing_ok=True)
        apply_patches(llama_dir)
        sources_ready.write_text(config.patch_hash())
    tap_archs = scan_tap_architectures(llama_dir)
    log(f"architectures with hidden-state taps: {', '.join(tap_archs)}")

    bdir = work / "build"
    log_file = work / "build.log"
    jobs = jobs or os.cpu_count() or 2
    t0 = time.time()
    extra, runtime_libs = cuda_toolkit_flags(work) if variant == "cuda" else ([], [])
    if variant == "cuda" and os.environ.get(CUDA_ARCHS_ENV):
        # one device's architecture only (scripts/gpu_check.py: minutes instead of three archs' worth);
        # the later -D wins. Such a build belongs in its own FLASHDESK_NATIVE_CACHE: the key ignores it
        extra.append(f"-DCMAKE_CUDA_ARCHITECTURES={os.environ[CUDA_ARCHS_ENV]}")
    run_streamed(["cmake", "-S", str(llama_dir), "-B", str(bdir), *config.VARIANT_FLAGS[variant], *extra],
                 work, log_file)
    run_streamed(["cmake", "--build", str(bdir), "--config", "Release", "-j", str(jobs),
                  "--target", *config.VARIANT_TARGETS[variant]], work, log_file)
    seconds = time.time() - t0

    staged = work / "staged"
    shutil.rmtree(staged, ignore_errors=True)
    lib = staged / "lib"
    lib.mkdir(parents=True)
    for f in (bdir / "bin").iterdir():
        if f.name.endswith(".so") or ".so." in f.name or f.name == "ggml-rpc-server" or f.suffix in (".dylib", ".dll"):
            shutil.copy2(f, lib / f.name, follow_symlinks=False)
    if not any(lib.glob("libllama*")):
        raise BuildError(f"the build produced no libllama in {bdir / 'bin'}; full log: {log_file}")
    publish(work, staged, out, {
        "variant": variant,
        "cmake_flags": config.VARIANT_FLAGS[variant] + extra,
        "tap_architectures": tap_archs,
        "cpu_variants": [v for v in config.CPU_VARIANTS if (lib / f"libggml-cpu-{v}.so").exists()],
        "runtime_libs": runtime_libs,
        "build_seconds": round(seconds, 1),  # of this run: a resumed build counts only the rest
        "resumed": resumed,
    })
    log(f"built {variant} in {seconds:.0f} s -> {out}")
    return out


def publish(work: Path, staged: Path, out: Path, info: dict) -> None:
    """Record a build in staged/build_info.json (the source facts every build shares, then `info`)
    and move it to its cache folder `out`: atomic, so a half-finished build never looks cached."""
    record = {"llama_cpp_python": config.LLAMA_CPP_PYTHON_VERSION, "llama_cpp_commit": LLAMA_CPP_COMMIT,
              "patch_hash": config.patch_hash(), "patches": [p.name for p in config.patch_files()],
              **info, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (staged / "build_info.json").write_text(json.dumps(record, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    staged.rename(out)
    shutil.rmtree(work, ignore_errors=True)


def install_python_packages() -> None:
    """llama-cpp-python's Python bindings (without its own llama.cpp build)
    and the gguf-py of the same llama.cpp tree (PyPI's gguf 0.19.0 predates
    the dflash architecture) into the running interpreter."""
    def installed(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    tarball = fetch_sdist()
    if installed("gguf") is None or not _gguf_has_dflash():
        log("installing gguf-py from the pinned llama.cpp tree")
        tmp = config.cache_root() / "sdist" / "gguf-py-src"
        shutil.rmtree(tmp, ignore_errors=True)
        prefix = f"{SDIST_NAME}/vendor/llama.cpp/gguf-py/"
        with tarfile.open(tarball) as tf:
            members = [m for m in tf.getmembers() if m.name.startswith(prefix)]
            tf.extractall(tmp, members=members, filter="data")
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--force-reinstall",
                        "--no-deps", str(tmp / prefix)], check=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "numpy>=2.2.6", "tqdm", "pyyaml", "requests"],
                       check=True)
        shutil.rmtree(tmp, ignore_errors=True)
    if installed("llama_cpp_python") != config.LLAMA_CPP_PYTHON_VERSION:
        log("installing llama-cpp-python's Python bindings (libraries come from the patched build)")
        # no pip cache: a wheel without libraries must never be reused for a normal install
        env = dict(os.environ, CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF")
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-deps", str(tarball)],
                       check=True, env=env)
        subprocess.run([sys.executable, "-m", "pip", "install", "typing-extensions>=4.5.0", "numpy",
                        "diskcache>=5.6.1", "jinja2>=2.11.3"], check=True)


def _gguf_has_dflash() -> bool:
    res = subprocess.run([sys.executable, "-c", "import gguf; gguf.MODEL_ARCH.DFLASH"], capture_output=True)
    return res.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default=None, choices=sorted(config.VARIANT_FLAGS),
                    help="cpu (default) or cuda; FLASHDESK_CUDA=1 also selects cuda")
    ap.add_argument("--python-package", action="store_true",
                    help="also install the llama-cpp-python bindings and gguf-py")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args(argv)
    variant = args.variant or config.default_variant()
    try:
        if args.python_package:
            install_python_packages()
        build(variant, force=args.force, jobs=args.jobs)
    except (BuildError, subprocess.CalledProcessError) as e:
        print(f"[native] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
