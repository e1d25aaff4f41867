#!/usr/bin/env bash
# shellcheck disable=SC2012  # ls of wheel and test file names we made
# Issue #15: the whole test suite on the one-GPU machine (no network there), in ONE device call.
#
#   here:    bash bench/device/test_wheels.sh      (after the last commit: it also archives HEAD; ~10 s
#            once its wheels are there, and it checks that they fit the carry beside the tree)
#   device:  run  command "bash bench/device/pytest_call.sh"  carry [".whl-test"]  timeout_s 600
#   then:    copy pytest-summary.md from the files that come back to bench/results/pytest-gpu.md, commit it
#
# What it does: extracts .whl-test/devtree.tar.gz (HEAD; the carried working tree when it is missing) into
# /tmp/tree and runs there, so a read-only repository copy is never written to; installs .whl-test's wheels
# (test_wheels.sh says which, and why) into python3's own environment without network or dependencies
# (falling back to --target /tmp/site + PYTHONPATH when that environment is not writable), and tunedeck
# itself editable as install.sh does; then runs five pytest processes side by side, each serial in itself,
# each with its own HOME, --basetemp and junit file:
#   core-a, core-b  tests/core, every other file: plain `pytest` as CI runs it (tests/conftest.py hides
#                   CUDA; NVML and nvidia-smi stay real, so a test that assumes no GPU without saying so
#                   by a fake recording shows up here)
#   tui-a, tui-b    tests/tui, likewise
#   gpu             TUNEDECK_TEST_GPU=1 pytest tests -m gpu: the tests marked gpu, with the GPU visible
# They share no fixed path or port (each test's TUNEDECK_HOME / tmp_path, ephemeral ports; HOME apart, so
# the tests that fall back to ~/.local/share/tunedeck don't meet either; the random-init cache there
# differs between a CPU and a CUDA process). Not pytest-xdist: that would mix tests of one file across
# processes, which nobody has checked. The suite takes ~16 min on the 2-core CI box (tests/core ~9.5,
# tests/tui ~6); the parts here are ~3-5 min of that each, on 16 cores with OMP_NUM_THREADS=2 each (the
# CI box's torch threads), LANG=C.UTF-8, TERM=xterm, TZ=UTC, CI=1 and plugin autoload off (the image's
# pytest plugins are not CI's). Whatever still runs at the wall-clock guard (TOTAL_S, 540 s from the
# start in all) gets SIGINT: pytest stops there and still writes its junit file and summary.
# Expected device time: a machine start (1-2 min) + transfer and install (~1 min) + the parts (<= 8.5
# min, likely 4-6): ~7-12 min of the 30.
#
# Other forms: named parts only, e.g. `bash bench/device/pytest_call.sh tui-b`; `core`, `tui`, `all` (one
# process each); a part that starts with tests/ is its own pytest arguments (commas for spaces), e.g.
# `... pytest_call.sh tests/core/test_plan_cli.py`; PARALLEL=0 (the parts one after another under the
# same guard); TOTAL_S=N. A second call while the machine is warm (30 s) skips the install.
#
# Back in $OUT (3 files): pytest-summary.md (counts per part, failures and errors by name with file:line
# and first line, skips by reason, versions, GPU), box.txt (GPU, cores, install mode, pip check, which
# variables the image had set), logs.tar.gz (junit-<part>.xml, each part's log with its 30 slowest tests,
# the install log, versions.json, any tests/tui/snapshots/*.new.svg that a snapshot mismatch left).
set -uo pipefail
start=$(date +%s)
total_s=${TOTAL_S:-540}
here=$(pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
tmp=${PYTEST_CALL_TMP:-/tmp}  # scratch: the tree, homes, basetemps, logs
logs=$tmp/pytest-logs; rm -rf "$logs"; mkdir -p "$logs"
wheels=$here/.whl-test
parts=${*:-core-a core-b tui-a tui-b gpu}

ls "$wheels"/*.whl >/dev/null 2>&1 || { echo "no wheels in $wheels: run bash bench/device/test_wheels.sh there and carry .whl-test"; exit 2; }

# --- the tree ---------------------------------------------------------------------------------------
rm -rf "$tmp/tree" && mkdir -p "$tmp/tree"
if [ -f "$wheels/devtree.tar.gz" ]; then
    tar -xzf "$wheels/devtree.tar.gz" -C "$tmp/tree" || exit 1
    tree="HEAD $(cat "$wheels/devtree.sha" 2>/dev/null)"
else
    tar -C "$here" --exclude=./.whl-test --exclude=./.whl --exclude=./.venv --exclude=./.git -cf - . \
        | tar -xf - -C "$tmp/tree" || exit 1
    tree="the carried working tree (no .whl-test/devtree.tar.gz)"
fi
cd "$tmp/tree" || exit 1

# --- the wheels -------------------------------------------------------------------------------------
stamp=$(ls -l "$wheels"/*.whl 2>/dev/null | md5sum | cut -c1-16)
mark=$tmp/.tunedeck-test-wheels
pipi=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --disable-pip-version-check)
if [ "$(cut -d' ' -f1 "$mark" 2>/dev/null)" = "$stamp" ]; then
    mode=$(cut -d' ' -f2 "$mark"); echo "wheels already installed ($mode)" > "$logs/install.txt"
elif "${pipi[@]}" "$wheels"/*.whl > "$logs/install.txt" 2>&1; then
    mode=environment
else
    echo "--- into python3's environment failed; into /tmp/site instead" >> "$logs/install.txt"
    "${pipi[@]}" --target "$tmp/site" "$wheels"/*.whl >> "$logs/install.txt" 2>&1 || { tail -n 20 "$logs/install.txt"; exit 1; }
    mode=target
fi
echo "$stamp $mode" > "$mark"
[ "$mode" = target ] && export PYTHONPATH=$tmp/site PATH=$tmp/site/bin:$PATH
# tunedeck itself, editable, as install.sh installs it: without it the test package tests/tui (imported as
# `tui` under pytest's default import mode) hides the app's `tui` and tests/tui fails to collect.
import_mode=()
if [ "$mode" = target ] || ! python3 -m pip install -q --no-index --no-deps --no-build-isolation \
        --disable-pip-version-check -e . >> "$logs/install.txt" 2>&1; then
    import_mode=(--import-mode=importlib); mode="$mode, tunedeck not installed: --import-mode=importlib"
fi

# --- the environment: the CI box's, not whatever the image sets --------------------------------------
env_seen=$(env | grep -E '^(HF_|TRANSFORMERS_|MODELSCOPE|CUDA_|TORCH|PYTHON|PYTEST|OMP_|LANG|LC_|TERM|TZ|CI|COLORTERM|NO_COLOR|FORCE_COLOR|XDG_|TUNEDECK)' \
           | grep -viE 'token|key|secret|pass' | cut -d= -f1 | tr '\n' ' ')
export PYTHONUNBUFFERED=1 LANG=C.UTF-8 TERM=xterm TZ=UTC CI=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 OMP_NUM_THREADS=2
unset LC_ALL LC_MESSAGES LANGUAGE COLORTERM NO_COLOR FORCE_COLOR PYTEST_ADDOPTS PYTEST_PLUGINS \
      XDG_CONFIG_HOME XDG_DATA_HOME XDG_CACHE_HOME HF_HOME HF_HUB_CACHE HF_ENDPOINT HF_HUB_OFFLINE \
      TRANSFORMERS_OFFLINE HF_DATASETS_OFFLINE MODELSCOPE_CACHE MODELSCOPE_ENDPOINT \
      TUNEDECK_HOME TUNEDECK_FAKE_GPUS TUNEDECK_TEST_GPU TUNEDECK_UPDATE_SNAPSHOTS CUDA_VISIBLE_DEVICES

python3 - > "$logs/versions.json" 2>> "$logs/install.txt" <<'EOF'
import json, sys
from importlib import metadata
names = ["torch", "transformers", "peft", "accelerate", "huggingface_hub", "tokenizers", "safetensors", "textual",
         "rich", "pygments", "datasets", "modelscope", "modelscope-hub", "bitsandbytes", "liger_kernel", "deepspeed",
         "triton", "tensorboard", "protobuf", "openai", "import-linter", "pytest", "nvidia-ml-py", "psutil", "numpy"]
found = {}
for name in names:
    try:
        found[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
        found[name] = None
info = {"python": sys.version.split()[0], "executable": sys.executable, "versions": found}
try:
    import torch
    info["cuda"] = torch.version.cuda
    info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
except Exception as exc:  # noqa: BLE001
    info["torch_error"] = repr(exc)
print(json.dumps(info, indent=1))
EOF

{ echo "tree: $tree"; echo "wheels: $mode ($(ls "$wheels"/*.whl | wc -l) wheels)"
  echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1)"
  echo "cores: $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc); memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}'); /tmp: $(df -h /tmp | awk 'END {print $4 " free"}')"
  echo "python3: $(command -v python3) -> $(python3 -c 'import sys; print(sys.executable, sys.version.split()[0])')"
  python3 -c 'import ctypes; ctypes.CDLL("libnvidia-ml.so.1"); print("libnvidia-ml.so.1 loads: NVML is real here")' 2>&1 | tail -1
  python3 -c 'import bitsandbytes, liger_kernel, deepspeed, textual, transformers; print("bitsandbytes, liger-kernel, deepspeed, textual, transformers import")' 2>&1 | tail -3
  echo "variables the image had set (names; unset or overridden for the tests): $env_seen"
  echo "--- pip check (conflicts among everything installed; the image's own extras may show too)"
  python3 -m pip check --disable-pip-version-check 2>&1 | head -40; } > "$out/box.txt" 2>&1

# --- the parts --------------------------------------------------------------------------------------
deal() { ls "tests/$1"/test_*.py | sort | awk -v k="$2" 'NR % 2 == k'; }  # every other file of a folder
args_of() {  # a part's pytest arguments; a part that starts with tests/ is its own arguments
    case "$1" in
        tests/*) echo "$1" | tr ',' ' ' ;;
        core-a) deal core 1 ;; core-b) deal core 0 ;; tui-a) deal tui 1 ;; tui-b) deal tui 0 ;;
        core) echo tests/core ;; tui) echo tests/tui ;; all) echo tests ;;
        gpu) echo "tests -m gpu" ;; *) echo "unknown part $1" >&2; return 1 ;;
    esac
}
run_part() {  # part, seconds
    local part=$1 limit=$2 env=() name
    name=$(echo "$part" | tr -c 'A-Za-z0-9_\n-' '-')
    # a list of files makes a name too long for a file: its first 60 characters and a hash of the rest
    [ ${#name} -gt 80 ] && name="${name:0:60}-$(echo "$part" | md5sum | cut -c1-8)"
    [ "$part" = gpu ] && env=(TUNEDECK_TEST_GPU=1)
    mkdir -p "$tmp/td-home-$name"
    local t0; t0=$(date +%s)
    # shellcheck disable=SC2046  # the file list splits on purpose
    env ${env[@]+"${env[@]}"} HOME="$tmp/td-home-$name" timeout -s INT -k 30 "$limit" \
        python3 -m pytest $(args_of "$part") ${import_mode[@]+"${import_mode[@]}"} -p no:cacheprovider -q -rs --durations=30 \
        --basetemp="$tmp/pt-$name" --junitxml="$logs/junit-$name.xml" -o junit_family=xunit1 \
        > "$logs/pytest-$name.log" 2>&1
    echo "$name $? $(( $(date +%s) - t0 ))" >> "$logs/parts.txt"
}
for part in $parts; do args_of "$part" > /dev/null || exit 2; done  # a typo must not become the whole suite
: > "$logs/parts.txt"
left=$(( total_s - ($(date +%s) - start) - 15 ))
echo "setup took $(( $(date +%s) - start )) s; parts: $parts; $left s left for them"
if [ "${PARALLEL:-1}" = 1 ]; then
    for part in $parts; do run_part "$part" "$left" & done
    wait
else
    for part in $parts; do
        left=$(( total_s - ($(date +%s) - start) - 15 ))
        [ "$left" -gt 30 ] && run_part "$part" "$left" || echo "$part 124 0" >> "$logs/parts.txt"
    done
fi

# --- what comes back --------------------------------------------------------------------------------
summary=bench/device/pytest_summary.py; [ -f "$summary" ] || summary=$here/$summary
python3 "$summary" --out "$out/pytest-summary.md" --box "$out/box.txt" \
    --versions "$logs/versions.json" --parts "$logs/parts.txt" --junit-dir "$logs" --tree "$tree" \
    --limit "$total_s" --install "$mode" --logs-dir "$logs"
find tests -name '*.new.svg' -exec cp {} "$logs"/ \; 2>/dev/null
tar -czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null
cat "$out/pytest-summary.md" | head -n 60
