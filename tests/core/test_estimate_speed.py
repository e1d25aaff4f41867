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
from core.estimate.speed import flops_per_token, model_flops_efficiency

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


def test_tokens_per_second_from_peak_and_efficiency():
    p = plan_for_model("Qwen2.5-7B", method="lora", micro_batch_size=4, seq_len=2048)
    h100 = find_gpu("H100")
    result = estimate(p, h100)
    arch = p.architecture
    efficiency = CAL.efficiency["hopper"]["lora"] * 3584 / (3584 + 512) * 8192 / (8192 + 512)
    assert model_flops_efficiency(arch, p, h100, CAL) == pytest.approx(efficiency)
    flops = flops_per_token(arch, count_parameters(arch), p, CAL).total
    assert result.tokens_per_s == pytest.approx(989.4e12 * efficiency / flops)
    assert result.seconds_per_step == pytest.approx(8192 / result.tokens_per_s)


def test_more_gpus_scale_with_the_data_parallel_factor():
    p = plan_for_model("Qwen2.5-7B", method="full", micro_batch_size=1, seq_len=2048)
    one = estimate(replace(p, zero_stage=3, num_gpus=1), find_gpu("H200"))
    eight = estimate(replace(p, zero_stage=3, num_gpus=8), find_gpu("H200"))
    assert eight.tokens_per_s == pytest.approx(one.tokens_per_s * 8 * CAL.multi_gpu_scaling[3])


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
