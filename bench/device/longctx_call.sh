#!/usr/bin/env bash
# One device call of the long-context bench on the one-GPU machine (no network there):
#   bash bench/device/longctx_call.sh OUT_NAME [engine_longctx.py args ...]
# Runs from a clean tree (devtree.tar: `git archive HEAD`, so that uncommitted work in the checkout
# never reaches the GPU), installs .whl (bitsandbytes, liger-kernel, pytest), runs the GPU tests of
# the offload and tiled-MLP paths (GPU_TESTS=0 skips them), then the bench. Results land in $OUT.
set -uo pipefail
name=$1; shift
. bench/device/setup.sh
[ "${GPU_TESTS:-1}" = 0 ] || TUNEDECK_TEST_GPU=1 timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core/test_train_offload.py \
  tests/core/test_train_tiled_mlp.py tests/core/test_engine_switches.py > "$out/$name-gpu-tests.txt" 2>&1
[ "${GPU_TESTS:-1}" = 0 ] || tail -n 5 "$out/$name-gpu-tests.txt"
python3 bench/engine_longctx.py --out "$out/$name.md" "$@" 2>&1 | tee "$out/$name.log" | grep -v '^\s*$' | tail -n 40
