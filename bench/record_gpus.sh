#!/usr/bin/env bash
# Record a real GPU fixture: `tunedeck gpus --json` on a GPU box, taken while every GPU runs a small
# bf16 matmul loop (so the recording has utilisation, power, clocks and one compute process per GPU).
#
#   bench/record_gpus.sh [OUT.json]      default OUT: tests/fixtures/gpus/h200x<N>.json (N = GPU count)
#
# Environment: PYTHON (default .venv/bin/python, else python3) must import pynvml (nvidia-ml-py) and
# psutil; torch with CUDA is optional (without it the recording is of idle GPUs). LOAD_SECONDS (default
# 8) is how long the load runs before the snapshot. Run from the repository root.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-}"
if [[ -z "$PYTHON" ]]; then
  if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
LOAD_SECONDS="${LOAD_SECONDS:-8}"

if ! "$PYTHON" -c "import pynvml, psutil" 2>/dev/null; then
  echo "record_gpus: $PYTHON cannot import pynvml and psutil; install nvidia-ml-py and psutil" >&2
  exit 1
fi

probe="$(mktemp)"
if ! TUNEDECK_FAKE_GPUS= "$PYTHON" -m core gpus --json >"$probe"; then
  rm -f "$probe"
  echo "record_gpus: no GPUs to record (reason above)" >&2
  exit 2
fi
count="$("$PYTHON" -c "import json, sys; print(len(json.load(open(sys.argv[1]))['gpus']))" "$probe")"
rm -f "$probe"
out="${1:-tests/fixtures/gpus/h200x${count}.json}"
echo "record_gpus: $count GPU(s); recording to $out" >&2

pids=()
cleanup() {
  for pid in ${pids[@]+"${pids[@]}"}; do kill "$pid" 2>/dev/null || true; done
  for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

if "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  for ((i = 0; i < count; i++)); do
    # Stops on its own after a minute even if the trap never runs.
    "$PYTHON" -c "
import time, torch
x = torch.randn(8192, 8192, device='cuda:$i', dtype=torch.bfloat16)
end = time.time() + 60
while time.time() < end:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize($i)
" &
    pids+=("$!")
  done
  sleep "$LOAD_SECONDS"
else
  echo "record_gpus: no torch with CUDA here; recording idle GPUs" >&2
fi

tmp="$(mktemp)"
status=0
TUNEDECK_FAKE_GPUS= "$PYTHON" -m core gpus --json >"$tmp" || status=$?
"$PYTHON" -m core gpus >&2 || true
if [[ $status -ne 0 ]]; then
  echo "record_gpus: tunedeck gpus --json exited $status; nothing written" >&2
  cat "$tmp"
  rm -f "$tmp"
  exit "$status"
fi
mkdir -p "$(dirname "$out")"
mv "$tmp" "$out"
echo "record_gpus: wrote $out" >&2
