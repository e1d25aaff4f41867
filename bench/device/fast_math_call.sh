#!/usr/bin/env bash
# The SwiGLU kernels' FAST path (packed round trips to bf16, the flushing sigmoid) against the plain Triton ops, in
# one call of ~8 minutes:
#   bash bench/device/fast_math_call.sh     (carry .whl with bitsandbytes and pytest, .whl-swift for liger-kernel)
# 1. the GPU tests of core.train.lora_swiglu_kernel (the compiled kernels against torch, FAST against plain bit for bit);
# 2. bench/sol/kernels.py: the SwiGLU-down kernels with FAST, without, and their floor, alone;
# 3. the wizard's LoRA plan (engine_speed.py --rows plan-7b-lora) A B A B: as is, then without FAST
#    (bench/sol's plain_math), then LoRA dropout 0 (what the wizard says dropout costs), the plain recipe last;
#    nvidia-smi logs clocks and power at 100 ms beside it.
# Back in $OUT (at most 8 files): fast-math-tests.txt, fast-math-kernels.md, engine-speed-fm.md,
# engine-speed-fm-plain.md and fm.tgz with the JSON, the logs, the box and the clocks.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
pipi --target /tmp/site .whl-swift/liger_kernel-*.whl && pipi --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD/bench/sol:/tmp/site" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; df -h /tmp | tail -1; nproc
  python3 -c 'import torch, transformers, peft, triton; print(torch.__version__, transformers.__version__, peft.__version__, triton.__version__)'; } \
  > "$out/engine-speed-fm-box.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,power.draw.instant,temperature.gpu,utilization.gpu \
  --format=csv -lms 100 > /tmp/clocks.csv 2>&1 &
smi=$!
TUNEDECK_SOL= TUNEDECK_TEST_GPU=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/core/test_lora_swiglu_kernel.py > "$out/fast-math-tests.txt" 2>&1
echo "gpu tests: rc=$?"; tail -n 3 "$out/fast-math-tests.txt"
TUNEDECK_SOL= timeout 120 python3 bench/sol/kernels.py --out "$out/fast-math-kernels.md"
echo "kernels: rc=$?"
engines=tunedeck,tunedeck+env.TUNEDECK_SOL=plain_math,tunedeck,tunedeck+env.TUNEDECK_SOL=plain_math
engines=$engines,tunedeck+lora_dropout=0
timeout 400 python3 bench/engine_speed.py --out "$out/engine-speed-fm.md" --rows plan-7b-lora --engines "$engines" \
  --steps 10 --warmup 3 --drop-checkpoints --home /tmp/bh --budget-s 380 \
  2>&1 | tee "$out/engine-speed-fm.log" | grep -v '^\s*$' | tail -n 30
timeout 110 python3 bench/engine_speed.py --out "$out/engine-speed-fm-plain.md" --rows 7b-lora --engines plain \
  --steps 10 --warmup 3 --drop-checkpoints --home /tmp/bh --budget-s 100 \
  2>&1 | tee "$out/engine-speed-fm-plain.log" | grep -v '^\s*$' | tail -n 12
echo "engine speed: rc=$?"
kill "$smi"
gzip -c /tmp/clocks.csv > "$out/engine-speed-fm-clocks.csv.gz"
(cd "$out" && tar czf fm.tgz --remove-files ./*.json ./*.log engine-speed-fm-box.txt engine-speed-fm-clocks.csv.gz)
ls -l "$out"
