#!/usr/bin/env bash
# The call #13 has waited on since session 29, in one command of ~500 s on the one-GPU machine:
#   bash bench/device/qlora_ab_call.sh          (carry .whl with bitsandbytes alone, and .whl-swift)
# 1. the `qlora_upcast: true` row's allocations at its peak, beside the default QLoRA row's
#    (TUNEDECK_MEMORY_PROFILE=2:1: each run's memory.txt), for the memory fit that leaves that row out today;
# 2. 7B QLoRA against ms-swift 4.6 + Liger once more, ms-swift first (session 26: the first engine on a fresh
#    box ran slower, and the 1.3x target held in one call of two), the plain recipe last.
# Liger comes from .whl-swift (64 MiB: .whl holds bitsandbytes alone). nvidia-smi logs clocks and power at
# 100 ms beside it all. Back in $OUT: cal-upcast.tgz (the calibration rows, their log and every memory.txt),
# engine-speed-ab-qlora.{md,json,log}, engine-speed-ab-qlora-box.txt, engine-speed-ab-qlora-clocks.csv.gz.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
pipi --target /tmp/site .whl-swift/liger_kernel-*.whl && pipi --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,power.draw.instant,temperature.gpu,utilization.gpu \
  --format=csv -lms 100 > /tmp/clocks.csv 2>&1 &
smi=$!
TUNEDECK_MEMORY_PROFILE=2:1 timeout 200 python3 bench/calibration_matrix.py \
  --only '^7b-qlora-b4-s2048-ckpt(-qloraupcast-True)?$' --out /tmp/cal --home /tmp/bh --budget-s 180 \
  > /tmp/cal.log 2>&1
echo "calibration rows: rc=$?"; tail -n 5 /tmp/cal.log
(cd /tmp && tar czf "$out/cal-upcast.tgz" cal cal.log $(find bh -name memory.txt))
rm -rf /tmp/bh  # the disk is 64 GB
OUT=$out timeout 300 bash bench/device/engine_speed_call.sh engine-speed-ab-qlora --rows 7b-qlora \
  --engines swift-liger,tunedeck,plain --steps 10 --warmup 3 --drop-checkpoints --home /tmp/bh2 --budget-s 240
echo "engine speed: rc=$?"
kill "$smi"
gzip -c /tmp/clocks.csv > "$out/engine-speed-ab-qlora-clocks.csv.gz"
mv "$out/box.txt" "$out/engine-speed-ab-qlora-box.txt"
ls -l "$out"
