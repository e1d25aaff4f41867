#!/usr/bin/env bash
# The LM head in larger chunks (run key ce_chunk_tokens), alone and in the wizard's 7B LoRA plan, in one call:
#   bash bench/device/lm_head_call.sh   (needs_h200: the plan's ~121 GiB; carry .whl with bitsandbytes and pytest,
#                                        .whl-swift with liger-kernel alone)
# fast_math_call.sh with bench/lm_head_chunks.py first (each chunk's time and the allocator's peak), then the plan's
# runs: with the loss's own chunks (ce_chunk_tokens auto), then as planned (the wizard now saves 8,192), A B A B, then
# at LoRA dropout 0 (what the wizard says dropout costs);
# the plain recipe; the GPU tests of the fused LoRA kernels and of the loss kernel. Back in $OUT: lmh-kernels.md
# (the chunks), engine-speed-lmh.md, engine-speed-lmh-plain.md, lmh-tests.txt, lmh.tgz.
NAME=lmh KERNEL_BENCH=bench/lm_head_chunks.py KERNEL_S=100 PLAN_S=370 \
  PLAN_ENGINES="tunedeck+ce_chunk_tokens=auto,tunedeck,tunedeck+ce_chunk_tokens=auto,tunedeck,tunedeck+lora_dropout=0" \
  TESTS="tests/core/test_lora_swiglu_kernel.py tests/core/test_lora_dropout_kernel.py tests/core/test_linear_ce_kernel.py" \
  exec bash "$(dirname "$0")/fast_math_call.sh"
