"""FLOPs per token, efficiency, tokens/s, time and cost per epoch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.estimate import (
    DEFAULT_CALIBRATION,
    TrainingPlan,
    architecture_from_config,
    count_parameters,
    estimate,
    find_gpu,
    lora_parameter_count,
    plan_for_model,
)
from core.estimate.speed import (
    data_parallel_seconds,
    flops_per_token,
    gemm_efficiency,
    step_time,
    weight_pass_bytes,
)

CAL = DEFAULT_CALIBRATION
TINY = architecture_from_config({
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
})
COUNTS = count_parameters(TINY)
MATMUL = COUNTS.linear_in_layers + 1000 * 64  # block linears + LM head (embedding lookup excluded)


def test_full_fine_tuning_flops_are_6n_plus_attention():
    p = TrainingPlan(architecture=TINY, method="full", seq_len=512, gradient_checkpointing=False)
    attention = 12 * 2 * 64 * 512  # 12 x layers x q_dim x seq
    assert flops_per_token(TINY, COUNTS, p, CAL).total == 6 * MATMUL + attention


def test_checkpointing_adds_a_forward_pass():
    full = TrainingPlan(architecture=TINY, method="full", seq_len=512, gradient_checkpointing=False)
    base = flops_per_token(TINY, COUNTS, full, CAL).total
    assert flops_per_token(TINY, COUNTS, replace(full, gradient_checkpointing=True), CAL).total == pytest.approx(base * 4 / 3)


def test_lora_flops_are_4n_plus_adapters_plus_attention():
    p = TrainingPlan(architecture=TINY, method="lora", lora_rank=8, seq_len=256, gradient_checkpointing=False)
    adapters = lora_parameter_count(TINY, 8, p.lora_targets)
    attention = 12 * 2 * 64 * 256
    assert flops_per_token(TINY, COUNTS, p, CAL).total == 4 * MATMUL + 6 * adapters + attention
    with_ckpt = flops_per_token(TINY, COUNTS, replace(p, gradient_checkpointing=True), CAL)
    assert with_ckpt.recompute == 2 * MATMUL + 2 * adapters + attention / 3


def test_tokens_per_second_from_the_step_time():
    p = plan_for_model("Qwen2.5-7B", method="lora", micro_batch_size=4, seq_len=2048)
    h100 = find_gpu("H100")
    result = estimate(p, h100)
    arch = p.architecture
    counts = count_parameters(arch)
    gemm = CAL.efficiency["hopper"]["lora"] * 3584 / (3584 + CAL.hidden_half_efficiency)
    assert gemm_efficiency(arch, p, h100, CAL) == pytest.approx(gemm)
    step = step_time(arch, counts, result.trainable_params, p, h100, CAL)
    flops = flops_per_token(arch, counts, p, CAL).total
    assert step.matmul_s == pytest.approx(flops * 8192 / (989.4e12 * gemm))
    assert step.gpu_s == pytest.approx(step.matmul_s + step.weight_pass_s + step.loss_s + step.optimizer_s)
    # A 7B model at 8k tokens per step is GPU-bound: the CPU's launches hide behind the GPU's work.
    assert step.dispatch_s < step.gpu_s / 3
    assert step.gpu_s < step.total_s < step.gpu_s * 1.01
    assert result.tokens_per_s == pytest.approx(8192 / step.total_s)
    assert result.efficiency == pytest.approx(result.tokens_per_s * flops / 989.4e12)
    assert result.seconds_per_step == pytest.approx(8192 / result.tokens_per_s)


def test_a_small_model_is_launch_bound_as_measured():
    """On the H200, 0.5B LoRA took ~0.23 s per step at 4k and at 8k tokens; 7B full scales with tokens."""
    h200 = find_gpu("H200")
    small = plan_for_model("Qwen2.5-0.5B", method="lora", seq_len=1024, gradient_checkpointing=False)
    t4 = estimate(replace(small, micro_batch_size=4), h200).seconds_per_step
    t8 = estimate(replace(small, micro_batch_size=8), h200).seconds_per_step
    assert t8 < 1.3 * t4
    big = plan_for_model("Qwen2.5-7B", method="full", precision="pure-bf16", seq_len=1024)
    b1 = estimate(replace(big, micro_batch_size=1), h200).seconds_per_step
    b4 = estimate(replace(big, micro_batch_size=4), h200).seconds_per_step
    assert 2.5 * b1 < b4 < 4 * b1


def test_dora_with_dropout_runs_the_targeted_linears_twice():
    p = TrainingPlan(architecture=TINY, method="dora", seq_len=256, gradient_checkpointing=False)
    lora = flops_per_token(TINY, COUNTS, replace(p, method="lora"), CAL).total
    targeted = sum(shape.weight_params for shape in TINY.linear_shapes()) * TINY.num_layers
    assert flops_per_token(TINY, COUNTS, p, CAL).total == pytest.approx(lora + 4 * targeted)
    assert flops_per_token(TINY, COUNTS, replace(p, lora_dropout=0.0), CAL).total == pytest.approx(lora)


def test_qlora_dequantises_every_pass_and_dora_norms_every_forward():
    p = TrainingPlan(architecture=TINY, method="qlora", gradient_checkpointing=True)
    per_weight = CAL.qlora_dequant_bytes_per_weight
    assert weight_pass_bytes(COUNTS, TINY, p, CAL) == pytest.approx(3 * COUNTS.linear_in_layers * per_weight)
    no_ckpt = replace(p, gradient_checkpointing=False)
    assert weight_pass_bytes(COUNTS, TINY, no_ckpt, CAL) == pytest.approx(2 * COUNTS.linear_in_layers * per_weight)
    dora = replace(p, method="dora")
    targeted = sum(shape.weight_params for shape in TINY.linear_shapes()) * TINY.num_layers
    assert weight_pass_bytes(COUNTS, TINY, dora, CAL) == pytest.approx(2 * targeted * CAL.dora_norm_bytes_per_weight)
    assert weight_pass_bytes(COUNTS, TINY, replace(p, method="lora"), CAL) == 0.0


def test_more_gpus_add_the_data_parallel_time():
    p = plan_for_model("Qwen2.5-7B", method="full", micro_batch_size=1, seq_len=2048, zero_stage=3)
    h200 = find_gpu("H200")
    one = estimate(replace(p, num_gpus=1), h200)
    eight = estimate(replace(p, num_gpus=8), h200)
    arch = p.architecture
    counts = count_parameters(arch)
    plan8 = replace(p, num_gpus=8)
    added = data_parallel_seconds(arch, counts, eight.trainable_params, plan8, CAL)
    assert added > 0 and data_parallel_seconds(arch, counts, one.trainable_params, replace(p, num_gpus=1), CAL) == 0
    step8 = step_time(arch, counts, eight.trainable_params, plan8, h200, CAL)
    assert step8.data_parallel_s == pytest.approx(added)
    assert eight.tokens_per_s == pytest.approx(8 * 2048 / step8.total_s)
    # ZeRO shards the optimizer step: each GPU updates an eighth of the parameters.
    step1 = step_time(arch, counts, one.trainable_params, replace(p, num_gpus=1), h200, CAL)
    assert step8.optimizer_s == pytest.approx(step1.optimizer_s / 8)
    assert eight.tokens_per_s < 8 * one.tokens_per_s


def test_gradient_sync_follows_the_accumulation_by_zero_stage():
    """DDP (no_sync on the other micro-steps) and ZeRO-1 synchronise once per optimizer step; ZeRO-2/3
    reduce-scatter in every micro-step's backward."""
    p = plan_for_model("Qwen2.5-7B", method="full", micro_batch_size=1, seq_len=2048, num_gpus=8)
    counts = count_parameters(p.architecture)
    trainable = counts.total

    def per_micro_step(stage: int, accumulation: int, precision: str = "bf16") -> float:
        plan = replace(p, zero_stage=stage, grad_accum_steps=accumulation, precision=precision)
        return data_parallel_seconds(p.architecture, counts, trainable, plan, CAL)

    for stage in (0, 1):
        assert per_micro_step(stage, 4) == pytest.approx(per_micro_step(stage, 1) / 4)
    for stage in (2, 3):
        assert per_micro_step(stage, 4) == pytest.approx(per_micro_step(stage, 1)) and per_micro_step(stage, 1) > 0
    # DDP all-reduces the gradients in their own dtype: fp32 under mixed precision, twice pure bf16's traffic
    overhead = 28 * CAL.data_parallel_s_per_layer[0]
    assert per_micro_step(0, 1) - overhead == pytest.approx(2 * (per_micro_step(0, 1, "pure-bf16") - overhead))


def test_offload_slows_down_and_qlora_is_slower_than_lora():
    p = plan_for_model("Qwen2.5-7B", method="full", zero_stage=2, num_gpus=2)
    gpu = find_gpu("A100-80GB")
    assert estimate(replace(p, offload="optimizer"), gpu).tokens_per_s < estimate(p, gpu).tokens_per_s
    lora = plan_for_model("Qwen2.5-7B", method="lora")
    assert estimate(replace(lora, method="qlora"), gpu).tokens_per_s < estimate(lora, gpu).tokens_per_s


def test_fp32_uses_the_fp32_peak():
    p = plan_for_model("Qwen2.5-0.5B", method="full", precision="fp32")
    a100 = find_gpu("A100-80GB")
    bf16 = estimate(replace(p, precision="bf16"), a100).tokens_per_s
    assert estimate(p, a100).tokens_per_s < bf16 / 5  # 19.5 vs 312 TFLOPs


def test_epoch_time_and_cost():
    p = plan_for_model("Qwen2.5-7B", method="lora", num_gpus=2, dataset_tokens=50_000_000, price_per_gpu_hour=2.5)
    result = estimate(p, find_gpu("H100"))
    hours = 50_000_000 / result.tokens_per_s / 3600
    assert result.epoch_hours == pytest.approx(hours)
    assert result.epoch_cost == pytest.approx(hours * 2 * 2.5)
    assert estimate(replace(p, price_per_gpu_hour=None), find_gpu("H100")).epoch_cost is None
