#!/usr/bin/env bash
# An adapted linear's update first and the frozen matmul into it (the default; TUNEDECK_LORA_B_FIRST=0: the base
# first, as before), alone and in the wizard's 7B LoRA plan, in one call:
#   bash bench/device/lora_b_first_call.sh   (H200: needs_h200, the plan's ~121 GiB; carry .whl with bitsandbytes and
#                                             pytest, .whl-swift with liger-kernel alone)
# fast_math_call.sh with bench/lora_b_first.py first (the five adapted linears of a block, both orders), then the plan
# A B A B (the base first, then as is: the update first), the plain recipe (PLAIN_S=0: none, where its figure on the
# card is known) and the GPU tests of the grouped LoRA node (both orders against peft's forward) and of the loss kernel.
# Back in $OUT: bfirst-kernels.md, engine-speed-bfirst.md, engine-speed-bfirst-plain.md, bfirst-tests.txt, bfirst.tgz.
NAME=bfirst KERNEL_BENCH=bench/lora_b_first.py KERNEL_S=${KERNEL_S:-60} PLAN_S=${PLAN_S:-360} \
  PLAN_ENGINES="tunedeck+env.TUNEDECK_LORA_B_FIRST=0,tunedeck,tunedeck+env.TUNEDECK_LORA_B_FIRST=0,tunedeck" \
  TESTS="tests/core/test_lora_group.py tests/core/test_linear_ce_kernel.py" \
  exec bash "$(dirname "$0")/fast_math_call.sh"
