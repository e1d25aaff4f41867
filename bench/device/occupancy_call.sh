#!/usr/bin/env bash
# The fused LoRA kernels with fewer registers a thread (bench/kernel_occupancy.py), alone and in the wizard's 7B plan:
#   bash bench/device/occupancy_call.sh     (carry .whl with bitsandbytes and pytest, .whl-swift for liger-kernel)
# fast_math_call.sh with the occupancy bench first: its fastest tiles (occ-kernels-{dropout,swiglu}-tiles.json) go
# to the plan's runs A B A B (the module's own tiles, then those), then the plain recipe, then the GPU tests of both
# kernel modules. Back in $OUT: occ-kernels.md, engine-speed-occ.md, engine-speed-occ-plain.md, occ-tests.txt, occ.tgz.
out=${OUT:-/tmp/out}
tiles="env.TUNEDECK_LORA_DROPOUT_TILES=$out/occ-kernels-dropout-tiles.json+env.TUNEDECK_LORA_SWIGLU_TILES=$out/occ-kernels-swiglu-tiles.json"
NAME=occ KERNEL_BENCH=bench/kernel_occupancy.py KERNEL_S=130 PLAN_ENGINES="tunedeck,tunedeck+$tiles,tunedeck,tunedeck+$tiles" \
  TESTS="tests/core/test_lora_swiglu_kernel.py tests/core/test_lora_dropout_kernel.py" \
  exec bash "$(dirname "$0")/fast_math_call.sh"
