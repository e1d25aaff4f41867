#!/usr/bin/env bash
# The wizard's 7B LoRA plan against the plain recipe's default shape, in turns, ROUNDS times (3 unless set), in one
# call: plain, plan, plain, plan, ... so that each ratio has its own baseline next to it and the pooled ratio rests on
# more than one plain run (the plain recipe alone moves ~1% from one call to the next):
#   bash bench/device/plan_ratio_call.sh   (H200: needs_h200, the plan's ~121 GiB; carry .whl with bitsandbytes,
#                                            .whl-swift with liger-kernel)
# Back in $OUT: engine-speed-ratio-plain-N.md, engine-speed-ratio-plan-N.md, ratio.md (each pair's ratio and the
# pooled one, from the JSON rows) and ratio.tgz with the JSON, the logs, the box and the clocks.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
left() { echo $((${DEADLINE:-540} - SECONDS)); }
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
pipi --target /tmp/site .whl-swift/liger_kernel-*.whl && pipi --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="$PWD/bench/sol:/tmp/site" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv; nproc
  python3 -c 'import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)'; } \
  > "$out/engine-speed-ratio-box.txt" 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu \
  --format=csv -lms 100 > /tmp/clocks.csv 2>&1 &
smi=$!
speed() {  # NAME ROWS ENGINES
  local budget=$(( 110 < $(left) - 10 ? 110 : $(left) - 10 ))
  [ "$budget" -gt 95 ] || { echo "$1: no time left"; return 1; }  # engine_speed starts no row under 90 s
  timeout $((budget + 10)) python3 bench/engine_speed.py --out "$out/$1.md" --rows "$2" --engines "$3" \
    --steps 10 --warmup 3 --drop-checkpoints --home /tmp/bh --budget-s "$budget" \
    2>&1 | tee "$out/$1.log" | grep -E 'finished|failed|error' | tail -n 3
  echo "$1: done ($(left) s left)"
}
for i in $(seq 1 "${ROUNDS:-3}"); do
  speed "engine-speed-ratio-plain-$i" 7b-lora plain || break
  speed "engine-speed-ratio-plan-$i" plan-7b-lora tunedeck || break
done
kill "$smi"
gzip -c /tmp/clocks.csv > "$out/engine-speed-ratio-clocks.csv.gz"
python3 - "$out" > "$out/ratio.md" <<'PY'
import json, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
def rate(kind, i):
    p = out / f"engine-speed-ratio-{kind}-{i}.json"
    rows = json.loads(p.read_text())["results"] if p.exists() else []
    done = [r for r in rows if r.get("status") == "finished"]
    return done[0]["tokens_per_s"] if done else None
print("# The wizard's 7B LoRA plan against the plain recipe, in turns\n")
print("| round | plain tok/s | plan tok/s | plan / the plain run before it |\n|---|---|---|---|")
plains, plans = [], []
for i in range(1, 10):
    a, b = rate("plain", i), rate("plan", i)
    if a is None and b is None:
        break
    plains += [a] if a else []
    plans += [b] if b else []
    print(f"| {i} | {a or '-'} | {b or '-'} | {f'{b / a:.3f}x' if a and b else '-'} |")
if plains and plans:
    print(f"\npooled: {statistics.mean(plans):.1f} / {statistics.mean(plains):.1f} = "
          f"**{statistics.mean(plans) / statistics.mean(plains):.3f}x** ({len(plans)} plan and {len(plains)} plain runs)")
PY
cat "$out/ratio.md"
(cd "$out" && shopt -s nullglob && tar czf ratio.tgz --remove-files ./*.json ./*.log engine-speed-ratio-box.txt \
  engine-speed-ratio-clocks.csv.gz)
ls -l "$out"
