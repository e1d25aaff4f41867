#!/usr/bin/env bash
# The fused SwiGLU-down kernels on the GPU, alone and in the wizard's 7B LoRA plan, in one call of under ten minutes
# (every step fits what is left of DEADLINE, 560 s unless set):
#   bash bench/device/fast_math_call.sh     (carry .whl with bitsandbytes and pytest, .whl-swift for liger-kernel)
# 1. bench/sol/kernels.py: the kernels with FAST, without (bit for bit the same?), and their floor (bench/sol);
# 2. the plan (engine_speed.py --rows plan-7b-lora) for each engine of PLAN_ENGINES, by default A B A B: as is,
#    then without FAST (bench/sol's plain_math); the plain recipe; then, with the default list only, the plan at
#    LoRA dropout 0 (what the wizard says dropout costs); nvidia-smi logs clocks and power at 100 ms beside it;
# 3. the GPU tests of core.train.lora_swiglu_kernel (the compiled kernels against torch, FAST against plain).
# Back in $OUT (at most 8 files), NAME (fm unless set) naming them: NAME-kernels.md, engine-speed-NAME.md,
# engine-speed-NAME-plain.md, engine-speed-NAME-dropout0.md, NAME-tests.txt and NAME.tgz with the JSON, the logs,
# the box and the clocks. bench/device/sol_call.sh is this with session 36's list; occupancy_call.sh runs another
# kernel bench first (KERNEL_BENCH, for KERNEL_S seconds at most) and other GPU tests (TESTS); PLAN_S: the seconds the
# plan's runs may take (300), PLAIN_S the plain recipe's (120; 0 runs none).
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
name=${NAME:-fm}
left() { echo $((${DEADLINE:-560} - SECONDS)); }
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
pipi --target /tmp/site .whl-swift/liger_kernel-*.whl && pipi --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD/bench/sol:/tmp/site" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; df -h /tmp | tail -1; nproc
  python3 -c 'import torch, transformers, peft, triton; print(torch.__version__, transformers.__version__, peft.__version__, triton.__version__)'; } \
  > "$out/engine-speed-$name-box.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,power.draw.instant,temperature.gpu,utilization.gpu \
  --format=csv -lms 100 > /tmp/clocks.csv 2>&1 &
smi=$!
TUNEDECK_SOL= timeout "${KERNEL_S:-100}" python3 "${KERNEL_BENCH:-bench/sol/kernels.py}" --out "$out/$name-kernels.md"
echo "kernels: rc=$? ($(left) s left)"
speed() {  # NAME ROWS ENGINES BUDGET
  local budget=$(( $4 < $(left) - 10 ? $4 : $(left) - 10 ))
  [ "$budget" -gt 95 ] || { echo "$1: no time left"; return; }  # engine_speed starts no row under 90 s
  timeout $((budget + 10)) python3 bench/engine_speed.py --out "$out/$1.md" --rows "$2" --engines "$3" \
    --steps 10 --warmup 3 --drop-checkpoints --home /tmp/bh --budget-s "$budget" \
    2>&1 | tee "$out/$1.log" | grep -v '^\s*$' | tail -n 14
  echo "$1: done ($(left) s left)"
}
# PLAN_ENGINES: another list for the plan's runs (then no separate dropout-0 run): sol_call.sh's, or session 37's
# last H200 call's, PLAN_ENGINES=tunedeck with DEADLINE=120 (the kernels and the GPU tests only, as time allowed)
speed "engine-speed-$name" plan-7b-lora \
  "${PLAN_ENGINES:-tunedeck,tunedeck+env.TUNEDECK_SOL=plain_math,tunedeck,tunedeck+env.TUNEDECK_SOL=plain_math}" \
  "${PLAN_S:-300}"
speed "engine-speed-$name-plain" 7b-lora plain "${PLAIN_S:-120}"  # PLAIN_S=0: none
[ -n "${PLAN_ENGINES:-}" ] || speed "engine-speed-$name-dropout0" plan-7b-lora tunedeck+lora_dropout=0 110
kill "$smi"
gzip -c /tmp/clocks.csv > "$out/engine-speed-$name-clocks.csv.gz"
t=$(( $(left) > 20 ? $(left) : 20 ))
TUNEDECK_SOL= TUNEDECK_TEST_GPU=1 timeout "$t" python3 -m pytest -q -p no:cacheprovider -m gpu \
  ${TESTS:-tests/core/test_lora_swiglu_kernel.py} > "$out/$name-tests.txt" 2>&1
echo "gpu tests: rc=$?"; tail -n 3 "$out/$name-tests.txt"
(cd "$out" && shopt -s nullglob && tar czf "$name.tgz" --remove-files ./*.json ./*.log "engine-speed-$name-box.txt" \
  "engine-speed-$name-clocks.csv.gz")
ls -l "$out"
