"""Memory terms against hand-computed cases, the peak's phase, the fit verdict and plan validation."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from core.estimate import (
    Calibration,
    PlanError,
    TrainingPlan,
    architecture_from_config,
    count_parameters,
    estimate,
    find_gpu,
    lora_parameter_count,
    plan_for_model,
)
from core.estimate.activations import (
    activation_sizes,
    block_activations,
    head_activation_bytes,
    recompute_layers,
)
from core.estimate.calibration import DEFAULT_CALIBRATION
from core.estimate.estimator import Estimate
from core.estimate.gpus import GIB, GpuSpec
from core.estimate.memory import (
    BREAKDOWN_KEYS,
    autocast_cache_bytes,
    communication_buffer_bytes,
    cpu_ram_bytes,
    fused_ce_chunk_tokens,
    gradient_bytes,
    logits_and_loss_bytes,
    memory_phases,
    model_sizes,
    optimizer_bytes,
    optimizer_step_temporary_bytes,
    weight_bytes,
)
from core.estimate.precision import precision_layout

CAL = DEFAULT_CALIBRATION
H, F, LAYERS, HEADS, KV_HEADS, VOCAB = 64, 160, 2, 4, 2, 1000
Q, KV = HEADS * 16, KV_HEADS * 16
TINY = architecture_from_config({
    "model_type": "llama", "hidden_size": H, "intermediate_size": F, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
    "tie_word_embeddings": False,
}, name="tiny")
COUNTS = count_parameters(TINY)
N = COUNTS.total
LINEAR = LAYERS * (H * Q + 2 * H * KV + Q * H + 3 * H * F)
H200 = find_gpu("H200")


def plan(**options) -> TrainingPlan:
    return TrainingPlan(architecture=TINY, **options)


def sizes_and_layout(p: TrainingPlan):
    return model_sizes(TINY, COUNTS, p), precision_layout(p, CAL.adam8bit_bytes_per_param)


def weights_of(p: TrainingPlan) -> float:
    sizes, layout = sizes_and_layout(p)
    return weight_bytes(TINY, sizes, p, layout, CAL)


def test_tiny_counts_by_hand():
    assert N == 2 * VOCAB * H + LINEAR + LAYERS * 2 * H + H
    assert COUNTS.linear_in_layers == LINEAR


@pytest.mark.parametrize(("options", "expected"), [
    ({"method": "full", "precision": "bf16"}, 4 * N),  # fp32 model under autocast
    ({"method": "full", "precision": "pure-bf16"}, 2 * N),
    ({"method": "full", "precision": "fp32"}, 4 * N),
    ({"method": "full", "precision": "fp16"}, 4 * N),
    ({"method": "full", "precision": "bf16", "zero_stage": 2, "num_gpus": 2}, 2 * N),  # DeepSpeed: bf16 model
])
def test_full_fine_tuning_weight_bytes(options, expected):
    assert weights_of(plan(**options)) == expected


def test_lora_and_qlora_weight_bytes():
    lora = lora_parameter_count(TINY, 16, plan().lora_targets)
    assert weights_of(plan(method="lora")) == 2 * N + 4 * lora  # bf16 base, fp32 adapters
    assert weights_of(plan(method="lora", precision="fp32")) == 4 * N + 4 * lora
    rest = N - LINEAR
    nf4 = 0.5 + 1 / 64 + 4 / (64 * 256)
    assert weights_of(plan(method="qlora", kbit_upcast=True)) == pytest.approx(LINEAR * nf4 + 4 * rest + 4 * lora)
    assert weights_of(plan(method="qlora", kbit_upcast=False)) == pytest.approx(LINEAR * nf4 + 2 * rest + 4 * lora)


def test_zero3_shards_weights_and_adds_live_parameters():
    p = plan(method="full", zero_stage=3, num_gpus=4)
    per_layer = COUNTS.per_layer_linear + COUNTS.per_layer_norm
    live = (max(per_layer, VOCAB * H) + 0.9 * H * H) * 2
    assert weights_of(p) == pytest.approx(2 * N / 4 + live)
    assert weights_of(replace(p, offload="all")) == pytest.approx(live)


@pytest.mark.parametrize(("options", "expected"), [
    ({"method": "full"}, 8 * N),  # AdamW moments in fp32, no separate master
    ({"method": "full", "precision": "pure-bf16"}, 4 * N),  # torch keeps the moments in bf16
    # 8-bit moments, but transformers' Trainer keeps the embedding's at 32 bits (two fp32 moments)
    ({"method": "full", "optimizer": "adamw_8bit"}, (2 + 8 / 256) * N + (8 - 2 - 8 / 256) * COUNTS.embedding),
    ({"method": "full", "optimizer": "paged_adamw_8bit"}, (2 + 8 / 256) * N + (8 - 2 - 8 / 256) * COUNTS.embedding),
    ({"method": "full", "zero_stage": 1, "num_gpus": 4}, (8 + 4) * N / 4),  # + fp32 master, sharded
    ({"method": "full", "zero_stage": 3, "num_gpus": 8}, (8 + 4) * N / 8),
    ({"method": "full", "zero_stage": 2, "num_gpus": 2, "offload": "optimizer"}, 0),
    ({"method": "full", "precision": "fp32", "zero_stage": 2, "num_gpus": 2}, 8 * N / 2),  # no master in fp32
])
def test_optimizer_bytes(options, expected):
    p = plan(**options)
    sizes, layout = sizes_and_layout(p)
    assert optimizer_bytes(sizes, p, layout) == pytest.approx(expected)


def test_lora_optimizer_covers_only_the_adapters():
    p = plan(method="lora", lora_rank=8)
    sizes, layout = sizes_and_layout(p)
    assert optimizer_bytes(sizes, p, layout) == 8 * lora_parameter_count(TINY, 8, p.lora_targets)


def test_gradient_sharding_by_zero_stage():
    for stage, expected in ((0, 4 * N), (1, 2 * N), (2, 2 * N / 4), (3, 2 * N / 4)):
        p = plan(method="full", zero_stage=stage, num_gpus=4)
        sizes, layout = sizes_and_layout(p)
        assert gradient_bytes(sizes, p, layout) == pytest.approx(expected), stage


def test_logits_plain_versus_fused():
    p = plan(micro_batch_size=2, seq_len=4096)
    _, layout = sizes_and_layout(p)
    tokens = 8192
    assert logits_and_loss_bytes(TINY, replace(p, fused_ce=False), layout, CAL) == 12 * tokens * VOCAB
    # Liger's chunk: next_pow2(8192 / ceil(1000 / 64) = 16) = 512 tokens of bf16 logits (+ a copy under Liger's
    # loss; tunedeck's kernel frees a chunk's before the next's), the hidden-state gradient in bf16 and an fp32
    # loss per token.
    assert fused_ce_chunk_tokens(TINY, tokens) == 512 == p.ce_chunk
    rest = tokens * H * 2 + 4 * tokens
    fused = 512 * VOCAB * 2 + rest
    assert logits_and_loss_bytes(TINY, p, layout, CAL) == fused
    assert logits_and_loss_bytes(TINY, replace(p, fused_ce_impl="liger"), layout, CAL) == 512 * VOCAB * 4 + rest
    # ce_chunk_tokens: that many tokens' logits (at most the micro-batch's), for tunedeck's losses only
    wide = replace(p, ce_chunk_tokens=4096)
    assert wide.ce_chunk == 4096 and replace(p, ce_chunk_tokens=65536).ce_chunk == tokens
    assert logits_and_loss_bytes(TINY, wide, layout, CAL) == 4096 * VOCAB * 2 + rest
    assert replace(wide, fused_ce_impl="liger").ce_chunk == 512
    assert replace(wide, fused_ce_impl="chunked").ce_chunk == 4096
    full = plan(method="full", micro_batch_size=2, seq_len=4096)
    _, full_layout = sizes_and_layout(full)
    # a trained LM head takes the model's own loss (Liger's), and its weight gradient in fp32
    assert logits_and_loss_bytes(TINY, full, full_layout, CAL) == 512 * VOCAB * 4 + rest + VOCAB * H * 4
    assert fused_ce_chunk_tokens(TINY, 10) == 1  # 10 / 16 -> 1
    qwen = plan_for_model("Qwen2.5-7B").architecture
    assert fused_ce_chunk_tokens(qwen, 8192) == 256  # 8192 / 43 = 191 -> 256


def test_lora_block_activations_by_hand():
    p = plan(method="lora", lora_dropout=0.0, fused_ce=False, lora_grouped=False)  # peft's own linears
    _, layout = sizes_and_layout(p)
    r = 16
    norms = 2 * (4 * H + 4)  # fp32 inputs kept by pow(2) + fp32 rsqrt; frozen weights keep nothing else
    qkv = 3 * (2 * H + 2 * r)  # each target's bf16 copy of its fp32-cast input, and lora_A's output
    attention = 2 * Q + 2 * 2 * KV + 2 * Q + 4 * HEADS  # q, k, v, output, log-sum-exp
    o_proj = 2 * Q + 2 * r
    gate_up = 2 * (2 * H + 2 * r)
    mlp = 3 * 2 * F + 2 * F + 2 * r  # gate, silu(gate), up; down's input copy and lora_A output
    expected = norms + qkv + attention + o_proj + gate_up + mlp
    assert block_activations(TINY, p, layout, CAL).per_token == expected
    with_dropout = block_activations(TINY, replace(p, lora_dropout=0.1, lora_dropout_fused=False), layout, CAL)
    assert with_dropout.per_token == expected + (3 * H + Q + 2 * H + F)  # one 1-byte mask per target's input
    # the engine's grouped linears, without dropout or with the fused kernels: no copy and no mask a target;
    # a group keeps its bf16 input once (o_proj's is SDPA's output, kept already)
    once = expected - 2 * (3 * H + Q + 2 * H + F) + 2 * H + 2 * H + 2 * F
    grouped = replace(p, lora_grouped=True, lora_swiglu_down=False)
    assert block_activations(TINY, grouped, layout, CAL).per_token == once
    assert block_activations(TINY, replace(grouped, lora_dropout=0.1), layout, CAL).per_token == once
    unfused = replace(grouped, lora_dropout=0.1, lora_dropout_fused=False)  # torch's dropout in the group
    assert block_activations(TINY, unfused, layout, CAL).per_token == with_dropout.per_token
    # lora_swiglu_down (the default): the down projection keeps lora_A's output only, no input
    for inside in (replace(grouped, lora_swiglu_down=True), replace(grouped, lora_swiglu_down=True, lora_dropout=0.1)):
        assert inside.swiglu_down
        assert block_activations(TINY, inside, layout, CAL).per_token == once - 2 * F
    assert block_activations(TINY, replace(unfused, lora_swiglu_down=True), layout, CAL).per_token \
        == with_dropout.per_token  # torch's dropout: the down projection's own work, its input kept


def test_full_mixed_precision_block_activations_by_hand():
    p = plan(method="full", precision="bf16", fused_ce=False)
    _, layout = sizes_and_layout(p)
    assert layout.residual == 4  # fp32 embedding -> fp32 residual stream
    # o_proj reads SDPA's output as it is kept: no extra copy
    expected = 26 * H + 4 * Q + 4 * KV + 4 * HEADS + 8 * F + 8
    assert block_activations(TINY, p, layout, CAL).per_token == expected


def test_liger_kernels_shrink_norms_and_swiglu():
    plain = plan(method="lora", lora_dropout=0.0, fused_ce=False)
    fused = replace(plain, fused_ce=True)
    _, layout = sizes_and_layout(plain)
    # Norms keep the bf16 input + an fp32 scale instead of an fp32 copy; SwiGLU drops silu(gate).
    saved_by_norms = 2 * ((4 * H + 4) - (2 * H + 4))
    saved_by_swiglu = 2 * F
    difference = block_activations(TINY, plain, layout, CAL).per_token - block_activations(TINY, fused, layout, CAL).per_token
    assert difference == saved_by_norms + saved_by_swiglu


def test_checkpointing_keeps_block_inputs_plus_the_recomputed_block():
    p = plan(method="lora", micro_batch_size=2, seq_len=512, gradient_checkpointing=True)
    _, layout = sizes_and_layout(p)
    tokens = 1024
    block = block_activations(TINY, p, layout, CAL).per_token * tokens
    head = head_activation_bytes(TINY, p, layout) * tokens
    kept = LAYERS * 2 * H * tokens  # each block's bf16 input
    sizes = activation_sizes(TINY, p, layout, CAL)
    assert sizes.at_loss == kept + head
    assert sizes.in_backward == kept + recompute_layers(p, CAL) * block
    no_ckpt = activation_sizes(TINY, replace(p, gradient_checkpointing=False), layout, CAL)
    assert no_ckpt.at_loss == LAYERS * block + head
    working = CAL.backward_working_bytes_per_intermediate["lora"] * F * tokens
    assert no_ckpt.in_backward == no_ckpt.at_loss + working


def test_autocast_cache_only_for_fp32_weights_under_autocast():
    for options, expected in (
        ({"method": "full", "gradient_checkpointing": False}, 2 * (LINEAR + VOCAB * H)),
        ({"method": "full", "gradient_checkpointing": True}, 2 * VOCAB * H),  # checkpointed blocks: none kept
        ({"method": "full", "precision": "pure-bf16"}, 0),
        ({"method": "full", "zero_stage": 2, "num_gpus": 2}, 0),
        ({"method": "full", "precision": "fp32"}, 0),
    ):
        p = plan(**options)
        sizes, layout = sizes_and_layout(p)
        assert autocast_cache_bytes(sizes, p, layout) == expected, options


def test_ddp_and_zero_buffers():
    p = plan(method="full", num_gpus=2)
    sizes, layout = sizes_and_layout(p)
    assert communication_buffer_bytes(TINY, sizes, p, layout, CAL) == CAL.nccl_base_gib * GIB + 4 * N
    single = plan(method="full")
    sizes1, layout1 = sizes_and_layout(single)
    assert communication_buffer_bytes(TINY, sizes1, single, layout1, CAL) == 0


def test_cpu_ram_with_optimizer_offload_and_while_loading():
    processes = 2 * CAL.cpu_ram_per_process_gib * GIB
    p = plan(method="full", zero_stage=2, num_gpus=2, offload="optimizer")
    sizes, _ = sizes_and_layout(p)
    # offloaded: fp32 master + moments + fp32 grads; loading: each process holds the fp32 model
    assert cpu_ram_bytes(sizes, p, CAL) == processes + max(16 * N, 2 * 4 * N)
    lora = plan(method="lora", num_gpus=2)
    assert cpu_ram_bytes(model_sizes(TINY, COUNTS, lora), lora, CAL) == processes + 2 * 2 * N  # bf16 loads
    qlora = plan(method="qlora", num_gpus=2)
    assert cpu_ram_bytes(model_sizes(TINY, COUNTS, qlora), qlora, CAL) == processes + 2 * CAL.checkpoint_shard_gib * GIB
    zero3 = plan(method="full", zero_stage=3, num_gpus=2)
    assert cpu_ram_bytes(model_sizes(TINY, COUNTS, zero3), zero3, CAL) == processes + 2 * N


def test_peak_phase_moves_with_the_plan():
    qwen = plan_for_model("Qwen2.5-7B", method="full", micro_batch_size=1, seq_len=512)
    assert estimate(qwen, H200).peak_phase == "optimizer_step"
    long = replace(qwen, micro_batch_size=8, seq_len=4096, gradient_checkpointing=False, fused_ce=False)
    assert estimate(long, H200).peak_phase == "loss"


def test_gradient_accumulation_keeps_gradients_through_the_forward_pass():
    p = plan(method="full", gradient_checkpointing=False)
    one = memory_phases(TINY, COUNTS, p, H200, CAL).phases["loss"]["gradients"]
    many = memory_phases(TINY, COUNTS, replace(p, grad_accum_steps=4), H200, CAL).phases["loss"]["gradients"]
    assert one == 0 and many == 4 * N


def test_breakdown_keys_and_sum():
    result = estimate(plan_for_model("Qwen2.5-0.5B"), H200)
    assert tuple(result.breakdown) == BREAKDOWN_KEYS
    assert result.peak_gib == pytest.approx(sum(result.breakdown.values()))
    assert result.to_json()["peak_gib"] == pytest.approx(result.peak_gib, abs=1e-3)


def test_well_known_outcomes():
    a100 = find_gpu("A100-80GB")
    full = plan_for_model("Qwen/Qwen2.5-7B-Instruct", method="full", micro_batch_size=1, seq_len=2048)
    assert not estimate(full, a100).fits  # 16 bytes per parameter alone is > 110 GiB
    assert estimate(replace(full, zero_stage=3, num_gpus=8), a100).fits
    assert estimate(replace(full, method="lora"), a100).fits
    qlora = plan_for_model("Qwen/Qwen2.5-7B-Instruct", method="qlora", micro_batch_size=1, seq_len=2048)
    assert estimate(qlora, find_gpu("RTX 4090")).fits
    big = plan_for_model("Qwen/Qwen2.5-72B-Instruct", method="lora", micro_batch_size=1, seq_len=2048)
    assert not estimate(big, H200).fits  # 145 GB of bf16 weights
    assert estimate(replace(big, method="qlora"), H200).fits


def _estimate_with(peak_gib: float, capacity_gib: float, margin_gib: float) -> Estimate:
    return Estimate(
        model="m", gpu="g", breakdown={"weights": peak_gib}, peak_phase="loss", phase_totals_gib={},
        capacity_gib=capacity_gib, margin_gib=margin_gib, cpu_ram_gib=0, total_params=1, trainable_params=1,
        param_count="analytic", flops_per_token=1, efficiency=0.5, tokens_per_s_per_gpu=1, tokens_per_s=1,
        seconds_per_step=1, epoch_hours=None, epoch_cost=None,
    )


def test_fit_verdict_at_the_margin_edge():
    assert _estimate_with(70.0, 80.0, 10.0).verdict == "fits"  # exactly at the margin
    edge = _estimate_with(70.001, 80.0, 10.0)
    assert not edge.fits and edge.verdict == "tight"
    assert _estimate_with(80.001, 80.0, 10.0).verdict == "does_not_fit"


def test_fit_verdict_through_estimate_with_a_gpu_sized_to_the_edge():
    calibration = Calibration(fit_margin_fraction=0.0, fit_margin_floor_gib=1.0)
    p = plan_for_model("Qwen2.5-0.5B", method="lora")
    peak = estimate(p, H200, calibration).peak_gib
    roomy = GpuSpec("edge", math.ceil((peak + 1.0) * 1024), True, 100, 100, 10, "hopper")
    short = replace(roomy, memory_mib=math.floor((peak + 1.0) * 1024) - 1)
    assert estimate(p, roomy, calibration).fits
    result = estimate(p, short, calibration)
    assert not result.fits and result.verdict == "tight"


def test_margin_is_a_fraction_with_a_floor():
    result = estimate(plan_for_model("Qwen2.5-0.5B"), H200)
    assert result.margin_gib == pytest.approx(0.05 * H200.memory_gib)
    small = estimate(plan_for_model("Qwen2.5-0.5B"), GpuSpec("tiny-gpu", 8192, True, 10, 10, 1, "ampere"))
    assert small.margin_gib == 1.0


@pytest.mark.parametrize(("options", "gpu", "message"), [
    ({"offload": "optimizer"}, "H200", "--zero"),
    ({"offload": "all", "zero_stage": 2}, "H200", "--zero 3"),
    ({"offload": "optimizer", "zero_stage": 2, "optimizer": "adamw_8bit"}, "H200", "adamw"),
    ({"precision": "bf16"}, "V100", "fp16"),
    ({"micro_batch_size": 0}, "H200", "--batch-size"),
    ({"method": "qlora", "precision": "fp32"}, "H200", "QLoRA"),
])
def test_impossible_plans_say_what_to_change(options, gpu, message):
    with pytest.raises(PlanError, match=message):
        estimate(plan(**options), find_gpu(gpu))


def test_fp16_on_v100_is_estimated():
    result = estimate(plan_for_model("Qwen2.5-0.5B", precision="fp16"), find_gpu("V100"))
    assert result.tokens_per_s > 0


@pytest.mark.parametrize(("options", "expected"), [
    ({"method": "full", "optimizer": "adamw"}, 4 * N),  # foreach AdamW: sqrt(v) for the whole group, fp32
    ({"method": "full", "precision": "pure-bf16", "optimizer": "adamw"}, 2 * N),  # bf16 moments
    ({"method": "full"}, 0),  # the default: fused AdamW, as the engine's "auto" on a GPU
    ({"method": "full", "optimizer": "adamw_8bit"}, 0),
    ({"method": "full", "zero_stage": 2, "num_gpus": 4, "optimizer": "adamw"}, (4 + 4) * N / 4),  # + DeepSpeed's fp32 grad partition
    ({"method": "full", "zero_stage": 2, "num_gpus": 4, "optimizer": "adamw_fused"}, 4 * N / 4),
    ({"method": "full", "zero_stage": 2, "num_gpus": 4, "offload": "optimizer"}, 0),
])
def test_optimizer_step_temporaries(options, expected):
    p = plan(**options)
    sizes, layout = sizes_and_layout(p)
    assert optimizer_step_temporary_bytes(sizes, p, layout) == pytest.approx(expected)


def test_fused_adamw_lowers_the_step_peak_by_one_moment():
    p = plan_for_model("Qwen2.5-7B", method="full", micro_batch_size=1, seq_len=1024, optimizer="adamw")
    foreach = estimate(p, H200)
    fused = estimate(replace(p, optimizer="adamw_fused"), H200)
    assert foreach.peak_phase == fused.peak_phase == "optimizer_step"
    one_moment = 4 * foreach.total_params / GIB  # the step's slack follows the gradients, not this
    assert foreach.peak_gib - fused.peak_gib == pytest.approx(one_moment)


def test_engine_optimizer_spellings_are_understood():
    from core.estimate.plan import normalise_optimizer

    assert normalise_optimizer("adamw_torch") == "adamw"
    assert normalise_optimizer("adamw_torch_fused") == "adamw_fused"
    assert normalise_optimizer("ADAMW_BNB_8BIT") == "adamw_8bit"
    assert normalise_optimizer("auto") == "adamw_fused"  # the engine's default on a GPU


def test_memory_constants_are_the_committed_fit():
    """The CUDA context, the recompute factors, the allocator slack and the band are what bench/memory_fit.py
    fitted on the H200 calibration matrix (its JSON): change one only by re-running the fit and committing it."""
    import json
    from pathlib import Path

    from core.estimate.calibration import MEMORY_ERROR

    fitted = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" / "estimate_matrix"
                         / "memory-fit.json").read_text(encoding="utf-8"))
    assert CAL.cuda_context_gib["hopper"] == pytest.approx(fitted["cuda_context_gib_hopper"])
    assert CAL.checkpoint_recompute_layers == pytest.approx(fitted["checkpoint_recompute_layers"])
    assert CAL.allocator_slack_floor_gib == pytest.approx(fitted["allocator_slack_floor_gib"])
    assert CAL.allocator_slack_fraction == pytest.approx(fitted["allocator_slack_fraction"])
    held_out = fitted["leave_one_model_out"]["all"]
    assert (MEMORY_ERROR.median_pct, MEMORY_ERROR.worst_pct, MEMORY_ERROR.rows) == (
        held_out["median_pct"], held_out["worst_pct"], held_out["rows"])
    assert fitted["quality"]["met"] and fitted["quality"]["rows"] >= 60
    from core.estimate.calibration import MEMORY_DOMAIN

    assert list(MEMORY_DOMAIN.hidden_sizes) == fitted["domain"]["hidden_sizes"]
    assert list(MEMORY_DOMAIN.seq_len) == fitted["domain"]["seq_len"]


def test_a_tied_embedding_adds_its_gradient_at_the_end_of_backward():
    """Measured: the tied 1.5B/3B full rows ran one embedding gradient above weights + gradients + states at the
    optimizer step (the untied 7B did not); with the foreach AdamW the update's temporary is larger and sets it."""
    tied = plan_for_model("Qwen2.5-1.5B", method="full", precision="pure-bf16", micro_batch_size=8, seq_len=2048)
    assert tied.architecture.tie_word_embeddings
    step = estimate(tied, H200)
    assert step.peak_phase == "optimizer_step"
    sizes = memory_phases(tied.architecture, count_parameters(tied.architecture), tied, H200, CAL).sizes
    assert step.breakdown["gradients"] * GIB == pytest.approx(2 * (sizes.total + sizes.counts.embedding))
    untied = plan_for_model("Qwen2.5-7B", method="full", precision="pure-bf16", micro_batch_size=4, seq_len=2048)
    assert not untied.architecture.tie_word_embeddings
    assert estimate(untied, H200).breakdown["gradients"] * GIB == pytest.approx(
        2 * memory_phases(untied.architecture, count_parameters(untied.architecture), untied, H200, CAL).sizes.total)


def test_dora_keeps_a_weight_copy_only_on_fp32_lora_inputs():
    """Measured on the H200: 7B DoRA at b2 x 2048 without checkpointing peaked at 63.6 GiB on the engine's bf16
    inputs; the copy of every targeted weight (12 GiB over 28 layers) the estimate counted was not there."""
    plan = plan_for_model("Qwen2.5-7B", method="dora", micro_batch_size=2, seq_len=2048, gradient_checkpointing=False)
    upcast = replace(plan, lora_input_upcast=True)
    bf16, fp32 = estimate(plan, H200), estimate(upcast, H200)
    assert "dora_dropout" not in bf16.notes and "dora_dropout" in fp32.notes
    assert 12.0 < fp32.breakdown["activations"] - bf16.breakdown["activations"] < 13.0
    assert bf16.peak_gib == pytest.approx(63.55, rel=0.05)
