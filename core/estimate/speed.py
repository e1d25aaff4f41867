"""Training speed from FLOPs: FLOPs per token over the GPU's dense peak at a calibrated efficiency.

FLOPs per token (a matmul of an n-parameter weight costs 2n per token forward):
- full fine-tuning: forward 2N, backward 4N (gradients for inputs and weights) -> 6N;
- LoRA/QLoRA/DoRA: the frozen base needs input gradients only -> 2N + 2N = 4N, plus 6x the adapters;
- attention scores and weighted sum: 12 x layers x q_dim x seq per token (forward 4, backward 8);
- gradient checkpointing runs the forward pass again (x4/3 for full, x3/2 for LoRA).
N here is the parameters that take part in matmuls: the blocks' linears and the LM head (the embedding
lookup is not a matmul).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.estimate.architecture import ModelArchitecture, ParameterCounts, lora_parameter_count
from core.estimate.calibration import Calibration
from core.estimate.gpus import GpuSpec
from core.estimate.plan import TrainingPlan


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token, split into the forward pass and the rest."""

    forward: float
    backward: float
    recompute: float

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def matmul_parameters(counts: ParameterCounts) -> int:
    """Parameters used in matmuls: the blocks' linear weights and the LM head."""
    return counts.linear_in_layers + counts.embedding


def attention_flops_per_token(arch: ModelArchitecture, seq_len: int, calibration: Calibration) -> float:
    """Forward attention FLOPs per token: QK^T and the weighted sum of V, 2 x 2 x q_dim x seq per layer."""
    return 4.0 * arch.num_layers * arch.q_dim * seq_len * calibration.attention_flops_factor


def flops_per_token(arch: ModelArchitecture, counts: ParameterCounts, plan: TrainingPlan,
                    calibration: Calibration) -> FlopsPerToken:
    """Training FLOPs per token for ``plan`` (see the module docstring)."""
    n = matmul_parameters(counts)
    attention = attention_flops_per_token(arch, plan.seq_len, calibration)
    if plan.method == "full":
        forward = 2.0 * n + attention
        backward = 4.0 * n + 2.0 * attention
    else:
        adapters = lora_parameter_count(arch, plan.lora_rank, plan.lora_targets)
        forward = 2.0 * n + 2.0 * adapters + attention
        backward = 2.0 * n + 4.0 * adapters + 2.0 * attention
    recompute = forward if plan.gradient_checkpointing else 0.0
    return FlopsPerToken(forward=forward, backward=backward, recompute=recompute)


def model_flops_efficiency(arch: ModelArchitecture, plan: TrainingPlan, gpu: GpuSpec,
                           calibration: Calibration) -> float:
    """Fraction of the GPU's dense peak one GPU reaches for this plan (calibration table x size terms)."""
    if plan.precision == "fp32":
        base = calibration.fp32_efficiency
    else:
        family = calibration.efficiency.get(gpu.family) or calibration.efficiency["ampere"]
        base = family[plan.method]
    hidden_term = arch.hidden_size / (arch.hidden_size + calibration.hidden_half_efficiency)
    tokens = plan.tokens_per_micro_batch
    tokens_term = tokens / (tokens + calibration.tokens_half_efficiency)
    return base * hidden_term * tokens_term


def parallel_efficiency(plan: TrainingPlan, calibration: Calibration) -> float:
    """Per-GPU throughput kept with several GPUs and with ZeRO offload."""
    factor = 1.0
    if plan.num_gpus > 1:
        factor *= calibration.multi_gpu_scaling.get(plan.zero_stage, 0.8)
    if plan.offload == "optimizer":
        factor *= calibration.offload_optimizer_speed
    elif plan.offload == "all":
        factor *= calibration.offload_all_speed
    return factor


@dataclass(frozen=True)
class SpeedEstimate:
    """Throughput of the whole job and what follows from it."""

    flops_per_token: float
    efficiency: float  # model FLOPs utilisation of one GPU, parallel overheads included
    tokens_per_s_per_gpu: float
    tokens_per_s: float  # all GPUs together
    seconds_per_step: float  # one optimizer step: micro-batch x accumulation x GPUs tokens
    epoch_hours: float | None
    epoch_cost: float | None


def estimate_speed(arch: ModelArchitecture, counts: ParameterCounts, plan: TrainingPlan, gpu: GpuSpec,
                   calibration: Calibration) -> SpeedEstimate:
    """Tokens/s from FLOPs, then time per epoch and cost when the plan gives tokens and a price."""
    flops = flops_per_token(arch, counts, plan, calibration).total
    efficiency = model_flops_efficiency(arch, plan, gpu, calibration) * parallel_efficiency(plan, calibration)
    per_gpu = gpu.peak_tflops(plan.precision) * 1e12 * efficiency / flops
    total = per_gpu * plan.num_gpus
    step_tokens = plan.tokens_per_micro_batch * plan.grad_accum_steps * plan.num_gpus
    epoch_hours = None
    cost = None
    if plan.dataset_tokens is not None and total > 0:
        epoch_hours = plan.dataset_tokens / total / 3600.0
        if plan.price_per_gpu_hour is not None:
            cost = epoch_hours * plan.num_gpus * plan.price_per_gpu_hour
    return SpeedEstimate(
        flops_per_token=flops,
        efficiency=efficiency,
        tokens_per_s_per_gpu=per_gpu,
        tokens_per_s=total,
        seconds_per_step=step_tokens / total if total > 0 else float("inf"),
        epoch_hours=epoch_hours,
        epoch_cost=cost,
    )
