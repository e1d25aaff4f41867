#!/usr/bin/env bash
# One device call of bench/engine_speed.py on the one-GPU machine (no network there):
#   bash bench/device/engine_speed_call.sh OUT_NAME [engine_speed.py args ...]
# with .whl (bitsandbytes, liger-kernel: ../shared/device/wheels.sh) and .whl-swift (ms-swift 4.6.0 and its
# own pins: ../shared/device/swift-wheels.sh) carried. ms-swift goes into its own folder, first on the
# PYTHONPATH of the ms-swift processes only. Results land in $OUT/OUT_NAME.md/.json, the box in $OUT/box.txt.
set -uo pipefail
name=$1; shift
out=${OUT:-/tmp/out}; mkdir -p "$out"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
pipi --upgrade --target /tmp/site .whl/*.whl || exit 1
[ -d .whl-swift ] && { pipi --target /tmp/swift .whl-swift/*.whl || exit 1; }
export PYTHONPATH=/tmp/site TUNEDECK_BENCH_SWIFT_SITE=/tmp/swift PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; df -h /tmp | tail -1; nproc; free -g | head -2
  python3 -c 'import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)'; } \
  > "$out/box.txt" 2>&1
python3 bench/engine_speed.py --out "$out/$name.md" "$@" 2>&1 | tee "$out/$name.log" | grep -v '^\s*$' | tail -n 60
