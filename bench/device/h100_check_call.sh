#!/usr/bin/env bash
# The estimator, fitted on H200 rows, checked on an H100 (80 GB, 3.35 TB/s; the same Hopper matmul peak), the card
# most users rent: `run` with kind nvidia-h100-x1, carry .whl (bitsandbytes) and .whl-swift (liger-kernel):
#   bash bench/device/h100_check_call.sh
# Eight calibration rows the H200 measured (LoRA with and without checkpointing, the b8 edge and the b10 row the
# H100 cannot hold, QLoRA, pure-bf16 full, the 14B and Llama-3-8B shapes), then the wizard's own LoRA and QLoRA
# plans for this card (bench/engine_speed.py's plan rows: `tunedeck plan` on the detected GPU, then
# `tunedeck train`). Back in $OUT: calibration-h100.{md,json,log}, engine-speed-h100-plans.{md,json,log},
# box.txt, clocks.csv.gz (nvidia-smi at 100 ms).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
pipi --target /tmp/site .whl-swift/liger_kernel-*.whl && pipi --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv; nproc; free -g | head -2
  python3 -c 'import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)'; } \
  > "$out/box.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 100 \
  > /tmp/clocks.csv 2>&1 &
smi=$!
rows='^(7b-lora-b4-s2048-(no)?ckpt|7b-lora-b(8|10)-s2048-nockpt|7b-qlora-b4-s2048-ckpt|7b-full-bf16-b4-s2048-ckpt|14b-lora-b4-s2048-ckpt|8b-qlora-b4-s2048-ckpt)$'
timeout 395 python3 bench/calibration_matrix.py --only "$rows" --out /tmp/cal --home /tmp/bh --budget-s 380 \
  > "$out/calibration-h100.log" 2>&1
echo "calibration rows: rc=$?"
cp /tmp/cal/calibration-rows.md "$out/calibration-h100.md"; cp /tmp/cal/calibration-rows.json "$out/calibration-h100.json"
rm -rf /tmp/bh  # the disk is 64 GB
timeout 160 python3 bench/engine_speed.py --out "$out/engine-speed-h100-plans.md" --rows plan-7b-lora,plan-7b-qlora \
  --engines tunedeck --steps 10 --warmup 3 --drop-checkpoints --home /tmp/bh2 --budget-s 150 \
  > "$out/engine-speed-h100-plans.log" 2>&1
echo "plans: rc=$?"
kill "$smi"; gzip -c /tmp/clocks.csv > "$out/clocks.csv.gz"
grep -h '^|' "$out/calibration-h100.md" "$out/engine-speed-h100-plans.md" | cut -c1-240
