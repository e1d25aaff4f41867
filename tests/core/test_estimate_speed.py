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
    attention_efficiency,
    data_parallel_seconds,
    dora_output_bytes,
    flops_per_token,
    gemm_efficiency,
    lora_input_bytes,
    step_time,
    weight_pass_bytes,
)

CAL = DEFAULT_CALIBRATION
TINY = architecture_from_config({
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
})
COUNTS = count_parameters(TINY)
HEAD = 1000 * 64  # the LM head
MATMUL = COUNTS.linear_in_layers + HEAD  # block linears + LM head (embedding lookup excluded)


def test_full_fine_tuning_flops_are_6n_plus_causal_attention():
    p = TrainingPlan(architecture=TINY, method="full", seq_len=512, gradient_checkpointing=False)
    attention = 12 * 2 * 64 * 512 / 2  # 12 x layers x q_dim x seq, half the scores: a causal kernel
    flops = flops_per_token(TINY, COUNTS, p, CAL)
    assert flops.total == 6 * MATMUL + attention
    assert flops.attention == attention
    # eager attention computes every score of the s x s matrix and masks after
    eager = flops_per_token(TINY, COUNTS, replace(p, attention="eager"), CAL)
    assert eager.total == 6 * MATMUL + 2 * attention and eager.attention == 2 * attention


def test_checkpointing_reruns_the_decoder_layers_forward_not_the_lm_head():
    full = TrainingPlan(architecture=TINY, method="full", seq_len=512, gradient_checkpointing=False)
    plain = flops_per_token(TINY, COUNTS, full, CAL)
    ckpt = flops_per_token(TINY, COUNTS, replace(full, gradient_checkpointing=True), CAL)
    assert ckpt.recompute == pytest.approx(plain.forward - 2 * HEAD)
    assert ckpt.total == pytest.approx(plain.total + plain.forward - 2 * HEAD)
    assert ckpt.attention == pytest.approx(plain.attention * 4 / 3)  # forward again: 1 + 2 + 1
    half = replace(full, gradient_checkpointing=True, checkpoint_layers=1)  # 1 of the 2 layers
    assert flops_per_token(TINY, COUNTS, half, CAL).recompute == pytest.approx(ckpt.recompute / 2)


def test_lora_flops_are_4n_plus_adapters_plus_attention():
    p = TrainingPlan(architecture=TINY, method="lora", lora_rank=8, seq_len=256, gradient_checkpointing=False)
    adapters = lora_parameter_count(TINY, 8, p.lora_targets)
    attention = 12 * 2 * 64 * 256 / 2
    assert flops_per_token(TINY, COUNTS, p, CAL).total == 4 * MATMUL + 6 * adapters + attention
    with_ckpt = flops_per_token(TINY, COUNTS, replace(p, gradient_checkpointing=True, recompute_skip_down=False), CAL)
    assert with_ckpt.recompute == 2 * COUNTS.linear_in_layers + 2 * adapters + attention / 3


def test_the_lm_head_reads_only_the_rows_with_a_target():
    """tunedeck's losses (triton, chunked) send only the rows with a target through the LM head: its forward and
    input gradient scale with the data's share; Liger's loss and the model's own read every row. The MFU's
    model FLOPs count every row, whatever an engine skips."""
    from core.estimate.speed import model_flops_per_token

    p = TrainingPlan(architecture=TINY, method="lora", seq_len=256, gradient_checkpointing=False)
    every = flops_per_token(TINY, COUNTS, p, CAL)
    half = replace(p, target_share=0.5)
    assert half.lm_head_share == 0.5
    assert every.total - flops_per_token(TINY, COUNTS, half, CAL).total == pytest.approx(4 * HEAD * 0.5)
    for reads_all in (replace(half, fused_ce_impl="liger"), replace(half, fused_ce=False)):
        assert reads_all.lm_head_share == 1.0 and flops_per_token(TINY, COUNTS, reads_all, CAL).total == every.total
    assert replace(half, fused_ce_impl="chunked").lm_head_share == 0.5
    # full fine-tuning: the head's weight gradient over those rows too; the recompute never runs the head
    full = TrainingPlan(architecture=TINY, method="full", seq_len=256, gradient_checkpointing=True)
    assert flops_per_token(TINY, COUNTS, full, CAL).total - flops_per_token(
        TINY, COUNTS, replace(full, target_share=0.25), CAL).total == pytest.approx(6 * HEAD * 0.75)
    assert model_flops_per_token(half) == model_flops_per_token(p)
    # the wizard's 7B plan on one H200 with half of every row a prompt (0.49 of the tokens with a target, against
    # 0.95): measured 2.6% faster (19,240 against 18,749 tok/s, bench/results/estimate_matrix/calibration-prompt-b.md)
    plan = plan_for_model("Qwen2.5-7B", method="lora", micro_batch_size=16, seq_len=2048, gradient_checkpointing=False)
    gpu = find_gpu("H200")
    ratio = estimate(replace(plan, target_share=0.49), gpu).tokens_per_s / estimate(
        replace(plan, target_share=0.95), gpu).tokens_per_s
    assert 1.01 < ratio < 1.045


def test_attention_runs_at_the_kernels_own_efficiency():
    p = plan_for_model("Qwen2.5-7B", method="qlora", seq_len=98304, offload_activations=True)
    h200 = find_gpu("H200")
    arch, counts = p.architecture, count_parameters(p.architecture)
    trainable = lora_parameter_count(arch, p.lora_rank, p.lora_targets)
    assert attention_efficiency(arch, p, h200, CAL) == CAL.attention_efficiency["hopper"]
    assert attention_efficiency(arch, replace(p, attention="eager"), h200, CAL) == gemm_efficiency(arch, p, h200, CAL)
    step = step_time(arch, counts, trainable, p, h200, CAL)
    flops = flops_per_token(arch, counts, p, CAL)
    assert step.attention_s == pytest.approx(flops.attention * 98304 / (989.4e12 * CAL.attention_efficiency["hopper"]))
    assert step.attention_s > step.matmul_s  # at 96k tokens the attention is most of the step
    faster = replace(CAL, attention_efficiency={**CAL.attention_efficiency, "hopper": 2 * CAL.attention_efficiency["hopper"]})
    quicker = step_time(arch, counts, trainable, p, h200, faster)
    assert quicker.attention_s == pytest.approx(step.attention_s / 2) and quicker.matmul_s == step.matmul_s


def test_lora_dropout_and_input_upcast_are_traffic_over_the_lora_inputs():
    p = TrainingPlan(architecture=TINY, method="lora", micro_batch_size=2, seq_len=256, gradient_checkpointing=True,
                     lora_dropout_fused=False, lora_swiglu_fused=False,  # (the SwiGLU's own test takes its adds)
                     lora_fold_dh=False)  # (and the fold's own its reads)
    elements = (6 * 64 + 160) * 2 * 512  # q, k, v, o (q_dim 64), gate, up read h; down reads f; x layers x tokens
    passes = 3  # forward, recompute, backward
    assert lora_input_bytes(TINY, p, CAL) == pytest.approx(passes * 5.0 * elements)  # bf16 dropout: 2 + 2 + 1
    # the fused kernels: their measured time beyond plain lora_A matmuls, each forward pass and the backward
    fused = CAL.lora_fused_dropout_bytes_per_element
    assert lora_input_bytes(TINY, replace(p, lora_dropout_fused=True), CAL) == pytest.approx(
        (2 * fused["forward"] + fused["backward"]) * elements)
    assert lora_input_bytes(TINY, replace(p, lora_dropout_fused=True, lora_dropout=0.5), CAL) == pytest.approx(
        passes * 5.0 * elements)  # p >= 0.5: torch's dropout, as the engine falls back
    assert lora_input_bytes(TINY, replace(p, lora_dropout=0.0), CAL) == 0.0
    upcast = replace(p, lora_input_upcast=True)
    assert lora_input_bytes(TINY, upcast, CAL) == pytest.approx(passes * (9.0 + 12.0) * elements)
    assert lora_input_bytes(TINY, replace(upcast, lora_dropout=0.0), CAL) == pytest.approx(passes * 12.0 * elements)
    assert lora_input_bytes(TINY, replace(p, gradient_checkpointing=False), CAL) == pytest.approx(2 * 5.0 * elements)
    assert lora_input_bytes(TINY, replace(p, method="full"), CAL) == 0.0
    only_q = replace(p, lora_targets=("q_proj",))
    assert lora_input_bytes(TINY, only_q, CAL) == pytest.approx(passes * 5.0 * 64 * 2 * 512)


def test_dh_from_the_base_matmul_takes_one_read_of_each_folded_output_gradient():
    """``lora_fold_dh``: LoRA's q/k/v and gate/up groups (two or more of a group adapted) and a down projection inside
    the SwiGLU kernels stop reading their output gradient for ``dh``: 2 bytes an output element, once a micro-step
    (backward only, checkpointed or not); o, QLoRA (4-bit bases), a lone q and a CPU plan keep the matmuls."""
    from core.estimate.speed import lora_output_elements

    p = TrainingPlan(architecture=TINY, method="lora", micro_batch_size=2, seq_len=256, gradient_checkpointing=True)
    assert p.folded_dh == ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj")
    off = replace(p, lora_fold_dh=False)
    assert off.folded_dh == ()
    outputs = (64 + 32 + 32 + 160 + 160 + 64) * 2  # q, k, v (kv_dim 32), gate, up, down; x layers
    assert lora_output_elements(TINY, p, p.folded_dh) == outputs
    for plan in (p, replace(p, gradient_checkpointing=False)):
        saved = lora_input_bytes(TINY, replace(plan, lora_fold_dh=False), CAL) - lora_input_bytes(TINY, plan, CAL)
        assert saved == pytest.approx(CAL.lora_dh_read_bytes_per_element * outputs * 512)
    assert replace(p, method="qlora").folded_dh == ()
    assert replace(p, lora_swiglu_fused=False).folded_dh == ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    assert replace(p, lora_targets=("q_proj", "o_proj", "gate_proj", "up_proj")).folded_dh == ("gate_proj", "up_proj")


def test_ungrouped_lora_pays_the_fused_adds_copy_of_every_adapted_output():
    """``lora_grouped: false``: the fused add copies each adapted linear's output in every forward pass (read
    2, write 2). On the H200's 7B LoRA b4 x 2048 checkpointed row the profile shows 20.6 ms of such copies
    a step without grouping and none with it; grouping measured +0.7% to +3.4% (engine-speed-lora-c, -d,
    -dropout0-b), and the estimate's difference stays in that range."""
    from core.estimate import estimate, find_gpu, plan_for_model
    from core.estimate.run_plan import plan_options_for_run

    p = TrainingPlan(architecture=TINY, method="qlora", micro_batch_size=2, seq_len=256, gradient_checkpointing=True,
                     lora_dropout_fused=False, lora_swiglu_fused=False)  # (ungrouped, neither is fused)
    outputs = (64 + 32 + 32 + 64 + 160 + 160 + 64) * 2  # q, k, v (kv_dim 32), o, gate, up, down; x layers
    ungrouped = replace(p, lora_grouped=False)
    extra = lora_input_bytes(TINY, ungrouped, CAL) - lora_input_bytes(TINY, p, CAL)
    assert extra == pytest.approx(2 * 4.0 * outputs * 512)  # forward and recompute
    no_ckpt = replace(ungrouped, gradient_checkpointing=False)
    assert lora_input_bytes(TINY, no_ckpt, CAL) - lora_input_bytes(TINY, replace(no_ckpt, lora_grouped=True), CAL) \
        == pytest.approx(4.0 * outputs * 512)
    assert lora_input_bytes(TINY, replace(ungrouped, method="dora"), CAL) \
        == lora_input_bytes(TINY, replace(p, method="dora"), CAL)  # DoRA never groups; its outputs are timed apart
    gpu = find_gpu("H200")
    row = plan_for_model("Qwen/Qwen2.5-7B", exact_count=False, method="lora", micro_batch_size=4, seq_len=2048,
                         gradient_checkpointing=True, lora_dropout_fused=False, lora_swiglu_fused=False,
                         recompute_skip_down=False, lora_fold_dh=False)  # (as the rows that measured grouping ran)
    gain = estimate(row, gpu).tokens_per_s / estimate(replace(row, lora_grouped=False), gpu).tokens_per_s
    assert 1.005 < gain < 1.04
    assert plan_options_for_run({"method": "lora", "lora_grouped": False, "max_seq_len": 2048})["lora_grouped"] is False
    assert plan_options_for_run({"method": "qlora", "max_seq_len": 2048})["lora_grouped"] is True


def test_dora_rescales_every_adapted_output_a_cost_per_token_and_out_feature():
    """peft DoRA's fp32 rescaling runs over tokens x out_features of the adapted linears, once a micro-step
    (the H200 rows with and without checkpointing solved to the same bytes): not for LoRA, not per weight."""
    p = TrainingPlan(architecture=TINY, method="dora", micro_batch_size=2, seq_len=256, gradient_checkpointing=True)
    outputs = (64 + 32 + 32 + 64 + 160 + 160 + 64) * 2  # q, k, v (kv_dim 32), o, gate, up, down; x layers
    per_element = CAL.dora_output_bytes_per_element
    assert dora_output_bytes(TINY, p, CAL) == pytest.approx(per_element * outputs * 512)
    assert dora_output_bytes(TINY, replace(p, gradient_checkpointing=False), CAL) == dora_output_bytes(TINY, p, CAL)
    assert dora_output_bytes(TINY, replace(p, micro_batch_size=4), CAL) == pytest.approx(2 * dora_output_bytes(TINY, p, CAL))
    assert dora_output_bytes(TINY, replace(p, lora_targets=("k_proj",)), CAL) == pytest.approx(per_element * 32 * 2 * 512)
    assert dora_output_bytes(TINY, replace(p, method="lora"), CAL) == 0.0
    h200 = find_gpu("H200")
    dora = step_time(TINY, COUNTS, 1000, p, h200, CAL)
    assert dora.dora_output_s == pytest.approx(dora_output_bytes(TINY, p, CAL) / (4800e9 * CAL.memory_bandwidth_efficiency))


def test_tokens_per_second_from_the_step_time():
    p = plan_for_model("Qwen2.5-7B", method="lora", micro_batch_size=4, seq_len=2048)
    h100 = find_gpu("H100")
    result = estimate(p, h100)
    arch = p.architecture
    counts = count_parameters(arch)
    gemm = CAL.efficiency["hopper"]["lora"] * 3584 / (3584 + CAL.hidden_half_efficiency)
    assert gemm_efficiency(arch, p, h100, CAL) == pytest.approx(gemm)
    step = step_time(arch, counts, result.trainable_params, p, h100, CAL)
    per_token = flops_per_token(arch, counts, p, CAL)
    flops = per_token.total
    assert step.matmul_s == pytest.approx((flops - per_token.attention) * 8192 / (989.4e12 * gemm))
    assert step.attention_s == pytest.approx(per_token.attention * 8192 / (989.4e12 * CAL.attention_efficiency["hopper"]))
    # dropout 0.05 by default costs time; the fused SwiGLU's adds taken away are the fit's, so that term
    # alone can go below zero
    unfused = step_time(arch, counts, result.trainable_params, replace(p, lora_swiglu_fused=False), h100, CAL)
    assert unfused.lora_input_s > 0 and step.lora_input_s < unfused.lora_input_s
    assert step.dora_output_s == 0.0  # LoRA: no rescaling
    assert step.gpu_s == pytest.approx(step.matmul_s + step.attention_s + step.weight_pass_s + step.lora_input_s
                                       + step.dora_output_s + step.fp32_model_s + step.loss_s + step.optimizer_s
                                       + step.norm_s)
    # A 7B model at 8k tokens per step is GPU-bound: the CPU's launches hide behind the GPU's work (the
    # current engine's profile: ~50 ms of launch gaps in a 780 ms QLoRA step).
    assert step.dispatch_s < step.gpu_s * 0.6
    assert step.gpu_s < step.total_s < step.gpu_s * 1.03  # (the fitted overlap adds 2.4% to this one)
    assert result.tokens_per_s == pytest.approx(8192 / step.total_s)
    assert result.efficiency == pytest.approx(result.tokens_per_s * flops / 989.4e12)
    assert result.seconds_per_step == pytest.approx(8192 / result.tokens_per_s)


def test_a_small_model_is_launch_bound_as_measured():
    """On the H200, 0.5B LoRA took ~0.23 s per step at 4k and at 8k tokens; 7B full scales with tokens
    (at 2048-token rows, the engine rows' length: at 1024 one row is near the CPU's launch floor)."""
    h200 = find_gpu("H200")
    small = plan_for_model("Qwen2.5-0.5B", method="lora", seq_len=1024, gradient_checkpointing=False)
    t4 = estimate(replace(small, micro_batch_size=4), h200).seconds_per_step
    t8 = estimate(replace(small, micro_batch_size=8), h200).seconds_per_step
    assert t8 < 1.3 * t4
    big = plan_for_model("Qwen2.5-7B", method="full", precision="pure-bf16", seq_len=2048)
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
    p = TrainingPlan(architecture=TINY, method="qlora", gradient_checkpointing=True,
                     qlora_reuse_dequantised=False)  # (its own test below)
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


def test_the_fused_swiglu_takes_the_gate_up_adds_away():
    """``lora_swiglu_fused``: the gate/up LoRA updates added in the SwiGLU kernel, so the ``lora_B`` adds'
    read and write of those outputs go (2 + 2 bytes per element, each forward pass); only with both adapted,
    grouped, and not under peft's input upcast. The run key reaches the plan on a GPU only."""
    from core.estimate.run_plan import plan_options_for_run

    p = TrainingPlan(architecture=TINY, method="lora", micro_batch_size=2, seq_len=256, gradient_checkpointing=True,
                     lora_swiglu_down=False)  # (the down projection's work in the SwiGLU: its own test)
    assert p.swiglu_fused  # on by default
    fused, p = p, replace(p, lora_swiglu_fused=False)
    assert lora_input_bytes(TINY, p, CAL) - lora_input_bytes(TINY, fused, CAL) == pytest.approx(
        2 * 4.0 * (160 + 160) * 2 * 512)  # forward and recompute, gate + up outputs, layers x tokens
    for off in (replace(fused, lora_targets=("gate_proj", "q_proj")), replace(fused, lora_grouped=False),
                replace(fused, lora_input_upcast=True), replace(fused, method="dora")):
        assert not off.swiglu_fused
    config = {"method": "lora", "lora_swiglu_fused": True}
    assert plan_options_for_run(config, cuda=True)["lora_swiglu_fused"]
    assert not plan_options_for_run(config, cuda=False)["lora_swiglu_fused"]


def test_the_down_projection_inside_the_swiglu_drops_its_dropout_kernel_work():
    """``lora_swiglu_down``: the down projection's dropout and ``lora_A`` work runs inside the SwiGLU kernels,
    whose memory traffic hides it (H200, 16,384 rows: 2.2 ms against 2.8), so the fused dropout kernels' cost
    over its input goes, in every forward pass (recompute included) and in backward. Only where the SwiGLU is
    fused, ``down_proj`` adapted and its dropout none or the fused kernels'; the run key reaches the plan."""
    from core.estimate.run_plan import plan_options_for_run

    p = TrainingPlan(architecture=TINY, method="lora", micro_batch_size=2, seq_len=256, gradient_checkpointing=True,
                     lora_fold_dh=False, lora_swiglu_db=False)  # (the fold's and the B gradients' own tests)
    assert p.swiglu_down and p.dropout_fused  # on by default
    off = replace(p, lora_swiglu_down=False)
    fused = CAL.lora_fused_dropout_bytes_per_element
    down_inputs = 160 * 2 * 512  # the intermediate width, layers x tokens
    assert lora_input_bytes(TINY, off, CAL) - lora_input_bytes(TINY, p, CAL) == pytest.approx(
        (2 * fused["forward"] + fused["backward"]) * down_inputs)  # forward and recompute, backward
    for other in (replace(p, lora_swiglu_fused=False), replace(p, lora_targets=("q_proj", "gate_proj", "up_proj")),
                  replace(p, lora_dropout_fused=False), replace(p, lora_input_upcast=True), off):
        assert not other.swiglu_down
    assert replace(p, lora_dropout=0.0).swiglu_down  # no dropout: the kernels' lora_A alone
    assert plan_options_for_run({"method": "lora"}, cuda=True)["lora_swiglu_down"]
    assert not plan_options_for_run({"method": "lora", "lora_swiglu_down": False}, cuda=True)["lora_swiglu_down"]


def test_the_b_gradients_in_the_swiglu_kernel_drop_the_db_matmuls_read():
    """``lora_swiglu_db``: with the down projection's LoRA work in the SwiGLU kernels, the backward kernel also sums
    the gate/up adapters' B gradients, so two skinny matmuls no longer read d gate and d up again: the plan moves
    ``lora_swiglu_db_bytes_per_element`` less over each gate/up output element, once a micro-step (backward
    only, recompute or not). Only where ``swiglu_down`` applies; the run key reaches the plan."""
    from core.estimate.run_plan import plan_options_for_run

    p = TrainingPlan(architecture=TINY, method="lora", micro_batch_size=2, seq_len=256, gradient_checkpointing=True)
    assert p.swiglu_db  # on by default
    off = replace(p, lora_swiglu_db=False)
    gate_up_outputs = 2 * 160 * 2 * 512  # gate and up, the intermediate width, layers x tokens
    assert lora_input_bytes(TINY, off, CAL) - lora_input_bytes(TINY, p, CAL) == pytest.approx(
        CAL.lora_swiglu_db_bytes_per_element * gate_up_outputs)
    for other in (replace(p, lora_swiglu_down=False), replace(p, lora_swiglu_fused=False), off):
        assert not other.swiglu_db
    assert plan_options_for_run({"method": "lora"}, cuda=True)["lora_swiglu_db"]
    assert not plan_options_for_run({"method": "lora", "lora_swiglu_db": False}, cuda=True)["lora_swiglu_db"]

def test_reusing_the_dequantised_weights_drops_the_backwards_pass_and_keeps_one_blocks_weights():
    """``qlora_reuse_dequantised``: checkpointed blocks' backward takes the weights their recompute dequantised,
    so the adapted linears' NF4 weights are dequantised twice a step, not three times; the recomputed block
    keeps them in bf16 until its backward. Only for grouped QLoRA with checkpointing."""
    from core.estimate.activations import activation_sizes
    from core.estimate.precision import precision_layout
    from core.estimate.run_plan import plan_options_for_run

    reused = TrainingPlan(architecture=TINY, method="qlora", micro_batch_size=2, seq_len=256,
                          gradient_checkpointing=True)
    assert reused.reuses_dequantised  # on by default
    p = replace(reused, qlora_reuse_dequantised=False)
    per_block = sum(shape.weight_params for shape in TINY.linear_shapes())  # all-linear: every weight adapted
    assert weight_pass_bytes(COUNTS, TINY, p, CAL) == pytest.approx(3 * COUNTS.linear_in_layers * CAL.qlora_dequant_bytes_per_weight)
    assert weight_pass_bytes(COUNTS, TINY, reused, CAL) == pytest.approx(
        2 * COUNTS.linear_in_layers * CAL.qlora_dequant_bytes_per_weight)
    layout = precision_layout(p, CAL.adam8bit_bytes_per_param)
    kept = activation_sizes(TINY, reused, layout, CAL).in_backward - activation_sizes(TINY, p, layout, CAL).in_backward
    assert kept == pytest.approx(2.0 * per_block)  # one block's weights in bf16
    half = replace(p, checkpoint_layers=1)  # one of two blocks recomputed: half a pass saved
    assert weight_pass_bytes(COUNTS, TINY, half, CAL) == pytest.approx(
        2.5 * COUNTS.linear_in_layers * CAL.qlora_dequant_bytes_per_weight)
    assert weight_pass_bytes(COUNTS, TINY, replace(half, qlora_reuse_dequantised=True), CAL) == pytest.approx(
        2 * COUNTS.linear_in_layers * CAL.qlora_dequant_bytes_per_weight)
    for off in (replace(reused, gradient_checkpointing=False), replace(reused, lora_grouped=False),
                replace(reused, lora_input_upcast=True), replace(reused, method="lora")):
        assert not off.reuses_dequantised
    assert plan_options_for_run({"method": "qlora", "qlora_reuse_dequantised": True}, cuda=False)["qlora_reuse_dequantised"]


def test_skipping_the_down_projection_in_the_recompute_takes_its_flops_away():
    """``recompute_skip_down``: a checkpointed block's recompute runs no frozen down-projection matmul (2 x its
    weights a token); only for grouped LoRA/QLoRA with an adapted down_proj, checkpointing, and a block that
    ends with its MLP (Llama here; not Gemma 2). The run key reaches the plan."""
    from core.estimate.run_plan import plan_options_for_run

    skip = TrainingPlan(architecture=TINY, method="lora", micro_batch_size=2, seq_len=256,
                        gradient_checkpointing=True)
    assert skip.skips_down_recompute  # on by default
    p = replace(skip, recompute_skip_down=False)
    down = 160 * 64 * 2  # weights x layers
    assert flops_per_token(TINY, COUNTS, p, CAL).recompute - flops_per_token(TINY, COUNTS, skip, CAL).recompute \
        == pytest.approx(2.0 * down)
    half = replace(skip, checkpoint_layers=1)
    assert flops_per_token(TINY, COUNTS, replace(half, recompute_skip_down=False), CAL).recompute \
        - flops_per_token(TINY, COUNTS, half, CAL).recompute == pytest.approx(down)  # one of two blocks
    assert flops_per_token(TINY, COUNTS, skip, CAL).forward == flops_per_token(TINY, COUNTS, p, CAL).forward
    gemma = replace(skip, architecture=replace(TINY, model_type="gemma2"))
    for off in (replace(skip, gradient_checkpointing=False), replace(skip, lora_grouped=False),
                replace(skip, lora_targets=("q_proj", "v_proj")), replace(skip, method="full"), gemma):
        assert not off.skips_down_recompute
    assert estimate(skip, find_gpu("H200")).tokens_per_s > estimate(p, find_gpu("H200")).tokens_per_s
    assert plan_options_for_run({"method": "lora", "recompute_skip_down": True})["recompute_skip_down"]


def test_keeping_the_lora_a_products_takes_the_recomputes_dropout_kernels_away_for_their_memory():
    """``recompute_keep_lora_a``: the fused dropout kernels run in the forward only (the recompute takes their
    kept products), for tokens x rank x adapted linears kept per checkpointed block; only with the fused
    kernels and checkpointing."""
    from core.estimate.activations import activation_sizes
    from core.estimate.precision import precision_layout

    p = TrainingPlan(architecture=TINY, method="lora", micro_batch_size=2, seq_len=256, gradient_checkpointing=True)
    assert p.dropout_fused and not p.keeps_lora_a  # off by default
    p = replace(p, lora_swiglu_down=False)  # (with it the down projection keeps nothing: below)
    kept = replace(p, recompute_keep_lora_a=True)
    assert kept.keeps_lora_a
    elements = (6 * 64 + 160) * 2 * 512  # the adapted linears' inputs (see the dropout test above) x tokens
    assert lora_input_bytes(TINY, p, CAL) - lora_input_bytes(TINY, kept, CAL) == pytest.approx(
        CAL.lora_fused_dropout_bytes_per_element["forward"] * elements)
    layout = precision_layout(p, CAL.adam8bit_bytes_per_param)
    more = activation_sizes(TINY, kept, layout, CAL).in_backward - activation_sizes(TINY, p, layout, CAL).in_backward
    assert more == pytest.approx(2 * 16 * 7 * 2.0 * 512)  # blocks x rank x linears x bf16 x tokens
    inside = replace(p, lora_swiglu_down=True)
    more = activation_sizes(TINY, replace(inside, recompute_keep_lora_a=True), layout, CAL).in_backward \
        - activation_sizes(TINY, inside, layout, CAL).in_backward
    assert more == pytest.approx(2 * 16 * 6 * 2.0 * 512)  # the down projection's are the SwiGLU kernels'
    for off in (replace(kept, gradient_checkpointing=False), replace(kept, lora_dropout=0.0),
                replace(kept, lora_dropout_fused=False)):
        assert not off.keeps_lora_a


def test_the_row_norm_kernels_take_the_measured_walk_off_the_step():
    """``rms_norm_rows``: the fit's rows ran Liger's norms; the row kernels take the backward's walk off, as
    measured on the H200 (step-parts-b: 0.201 ms a norm at 32,768 x 3,584), for Llama-casting blocks only, and
    not where Liger's norms do not run (the chunked loss) or for full fine-tuning (trained norms)."""
    p = plan_for_model("Qwen/Qwen2.5-7B", method="lora", micro_batch_size=16, seq_len=2048)
    h200 = find_gpu("H200")
    arch, counts = p.architecture, count_parameters(p.architecture)
    on = step_time(arch, counts, 1, p, h200, CAL)
    off = step_time(arch, counts, 1, replace(p, rms_norm_rows=False), h200, CAL)
    assert off.norm_s == 0.0 and on.norm_s < 0
    per_norm_ms = -on.norm_s / (2 * 28 + 1) * 1e3
    assert per_norm_ms == pytest.approx(0.201, rel=0.05)  # the measured walk a norm at 32,768 rows
    assert on.total_s < off.total_s
    assert step_time(arch, counts, 1, replace(p, method="full"), h200, CAL).norm_s == 0.0
    from core.estimate.speed import eager_kernel_bytes, memory_bandwidth_bytes_per_s

    chunked = replace(p, fused_ce_impl="chunked")  # the model's own norms there: no row kernels, their traffic instead
    eager = eager_kernel_bytes(arch, chunked, CAL)
    assert eager > 0 and step_time(arch, counts, 1, chunked, h200, CAL).norm_s == pytest.approx(
        eager / memory_bandwidth_bytes_per_s(h200, CAL))


def test_the_fused_kernels_save_what_the_base_holds_not_more_on_a_slower_memory():
    """The savings against the fit's rows (``lora_saved_bytes``, the norms' walk) are time the H200-fitted base
    efficiency holds, so they come off at the H200's bandwidth scaled by the card's matmul rate: an H100 SXM (the
    same die and peak, 3.35 against 4.8 TB/s) saves what the H200 saves, and a LoRA plan is no faster on it (the
    H100 ran the same rows 0.5-2% slower; taking the savings at its own bandwidth made it 1.4% faster)."""
    from core.estimate.speed import base_bandwidth, lora_saved_bytes, memory_bandwidth_bytes_per_s

    p = plan_for_model("Qwen/Qwen2.5-7B", method="lora", micro_batch_size=4, seq_len=2048,
                       gradient_checkpointing=False)
    arch, counts = p.architecture, count_parameters(p.architecture)
    trainable = lora_parameter_count(arch, p.lora_rank, p.lora_targets)
    h200, h100, pcie = find_gpu("H200"), find_gpu("H100-80GB-SXM"), find_gpu("H100-80GB-PCIe")
    assert lora_saved_bytes(arch, p, CAL) > 0 and p.norm_rows
    assert base_bandwidth(arch, p, h100, CAL) == pytest.approx(memory_bandwidth_bytes_per_s(h200, CAL))
    assert base_bandwidth(arch, p, pcie, CAL) == pytest.approx(
        memory_bandwidth_bytes_per_s(h200, CAL) * pcie.bf16_tflops / h200.bf16_tflops)  # a slower base: more held
    on_h200, on_h100 = step_time(arch, counts, trainable, p, h200, CAL), step_time(arch, counts, trainable, p, h100, CAL)
    assert on_h200.norm_s < 0 and on_h100.norm_s == pytest.approx(on_h200.norm_s)
    saved = lora_saved_bytes(arch, p, CAL) / memory_bandwidth_bytes_per_s(h200, CAL)
    moved = lora_input_bytes(arch, p, CAL) + lora_saved_bytes(arch, p, CAL)  # what the step's kernels move
    assert on_h100.lora_input_s == pytest.approx(moved / memory_bandwidth_bytes_per_s(h100, CAL) - saved)
    assert on_h100.total_s > on_h200.total_s


def test_without_liger_the_models_own_norms_rotary_and_swiglu_add_their_traffic():
    """``fused_ce: false`` or ``chunked`` runs transformers' RMSNorm, rotary embedding and SwiGLU instead of Liger's
    (``TrainingPlan.liger_kernels``): the bytes beyond Liger's, counted from the ops, each block's forward twice where
    it is checkpointed, the final norm once, the SwiGLU only where tunedeck's LoRA SwiGLU kernel does not run (the
    measured row: tests/core/test_calibration_matrix_bench.py)."""
    from core.estimate.speed import eager_kernel_bytes

    p = TrainingPlan(architecture=TINY, method="lora", micro_batch_size=2, seq_len=256, gradient_checkpointing=True)
    assert p.liger_kernels and eager_kernel_bytes(TINY, p, CAL) == 0.0
    off = replace(p, fused_ce=False)
    norms = 2 * 2 * 64 * (2 * 32 + 54) + 64 * (32 + 54)  # two a block x 2 blocks, recomputed; the final one
    rope = 2 * (64 + 32) * (2 * 16 + 20)  # q and k of each block
    assert eager_kernel_bytes(TINY, off, CAL) == pytest.approx((norms + rope) * 512)
    assert eager_kernel_bytes(TINY, replace(p, fused_ce_impl="chunked"), CAL) == eager_kernel_bytes(TINY, off, CAL)
    full = replace(off, method="full")  # no LoRA SwiGLU kernel: the model's own SwiGLU too
    assert eager_kernel_bytes(TINY, full, CAL) == pytest.approx((norms + rope + 2 * 160 * (2 * 4 + 8)) * 512)
    no_ckpt = replace(off, gradient_checkpointing=False)
    assert eager_kernel_bytes(TINY, no_ckpt, CAL) == pytest.approx(
        (2 * 2 * 64 * (32 + 54) + 64 * (32 + 54) + 2 * 96 * (16 + 20)) * 512)


def test_the_chunked_loss_makes_its_logits_again_in_backward_and_moves_them_in_fp32():
    """``fused_ce: chunked`` runs each chunk under checkpointing (core.train.fused_loss): backward runs the LM head
    over the chunk's rows again (2 x its weights a token with a target) and the chunk's logits go through the fp32
    log-softmax as the model's own loss's do, over the rows with a target only; the fused kernels keep them on chip.
    On an H100 the 7B LoRA row with it ran 10,727 tok/s where the estimate without these said 11,867 (+10.6%;
    bench/results/h100/calibration-nolig)."""
    from core.estimate.speed import loss_bytes

    p = TrainingPlan(architecture=TINY, method="lora", micro_batch_size=2, seq_len=256, gradient_checkpointing=False,
                     target_share=0.5)
    chunked = replace(p, fused_ce_impl="chunked")
    head = 0.5 * HEAD  # the rows with a target
    assert flops_per_token(TINY, COUNTS, p, CAL).recompute == 0.0
    assert flops_per_token(TINY, COUNTS, chunked, CAL).recompute == pytest.approx(2 * head)
    assert loss_bytes(TINY, p, CAL) == 0.0
    assert loss_bytes(TINY, chunked, CAL) == pytest.approx(512 * 0.5 * 1000 * CAL.plain_ce_traffic_bytes_per_logit)
    plain = replace(p, fused_ce=False)  # the model's own loss: every row
    assert loss_bytes(TINY, plain, CAL) == pytest.approx(512 * 1000 * CAL.plain_ce_traffic_bytes_per_logit)
    assert flops_per_token(TINY, COUNTS, plain, CAL).recompute == 0.0
