#!/usr/bin/env bash
# How much of the wizard's 7B LoRA plan's step the fused SwiGLU-down kernels still hold (session 36), in one call:
#   bash bench/device/sol_call.sh          (carry .whl with bitsandbytes and pytest, .whl-swift for liger-kernel)
# bench/device/fast_math_call.sh with the plan as is, with the SwiGLU-down floor (bench/sol: wrong training, the
# step's floor), at LoRA dropout 0 with and without that floor, and as is again; files named sol (sol-kernels.md,
# engine-speed-sol.md, engine-speed-sol-plain.md, sol-tests.txt, sol.tgz).
engines=tunedeck,tunedeck+env.TUNEDECK_SOL=swiglu_down,tunedeck+lora_dropout=0+env.TUNEDECK_SOL=swiglu_down
NAME=sol PLAN_ENGINES=$engines,tunedeck+lora_dropout=0,tunedeck exec bash "$(dirname "$0")/fast_math_call.sh"
