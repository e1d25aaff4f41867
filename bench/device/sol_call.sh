#!/usr/bin/env bash
# How much of the wizard's 7B LoRA plan's step the fused LoRA kernels still hold, in one call of ~7 minutes:
#   bash bench/device/sol_call.sh          (carry .whl with bitsandbytes, and .whl-swift for liger-kernel)
# 1. bench/sol/kernels.py: the SwiGLU-down kernels and their floor stand-ins alone (ms, GB/s);
# 2. the plan (engine_speed.py --rows plan-7b-lora) as is, with the SwiGLU-down floor (bench/sol: wrong training,
#    the step's floor), at LoRA dropout 0 with and without that floor, as is again, and the plain recipe last;
#    nvidia-smi logs clocks and power at 100 ms beside it.
# Back in $OUT (the device tool returns at most 8 files): the three tables (sol-kernels.md, engine-speed-sol.md,
# engine-speed-sol-plain.md) and sol.tgz with their JSON, the logs, the box and the clocks (session 36's call
# wrote ten files and lost two).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
pipi --target /tmp/site .whl-swift/liger_kernel-*.whl && pipi --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD/bench/sol:/tmp/site" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; df -h /tmp | tail -1; nproc
  python3 -c 'import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)'; } \
  > "$out/engine-speed-sol-box.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,power.draw.instant,temperature.gpu,utilization.gpu \
  --format=csv -lms 100 > /tmp/clocks.csv 2>&1 &
smi=$!
TUNEDECK_SOL= timeout 90 python3 bench/sol/kernels.py --out "$out/sol-kernels.md"
echo "kernels: rc=$?"
engines=tunedeck,tunedeck+env.TUNEDECK_SOL=swiglu_down,tunedeck+lora_dropout=0+env.TUNEDECK_SOL=swiglu_down
engines=$engines,tunedeck+lora_dropout=0,tunedeck
timeout 400 python3 bench/engine_speed.py --out "$out/engine-speed-sol.md" --rows plan-7b-lora --engines "$engines" \
  --steps 10 --warmup 3 --drop-checkpoints --home /tmp/bh --budget-s 380 \
  2>&1 | tee "$out/engine-speed-sol.log" | grep -v '^\s*$' | tail -n 30
timeout 110 python3 bench/engine_speed.py --out "$out/engine-speed-sol-plain.md" --rows 7b-lora --engines plain \
  --steps 10 --warmup 3 --drop-checkpoints --home /tmp/bh --budget-s 100 \
  2>&1 | tee "$out/engine-speed-sol-plain.log" | grep -v '^\s*$' | tail -n 12
echo "engine speed: rc=$?"
kill "$smi"
gzip -c /tmp/clocks.csv > "$out/engine-speed-sol-clocks.csv.gz"
(cd "$out" && tar czf sol.tgz --remove-files ./*.json ./*.log engine-speed-sol-box.txt engine-speed-sol-clocks.csv.gz)
ls -l "$out"
