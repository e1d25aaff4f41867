"""Bytes per value of each kind of tensor, given a plan: the dtypes PyTorch, transformers and peft use.

The engine's recipes fix these:
- full + bf16/fp16 (mixed) without DeepSpeed: the model is held in fp32 and run under autocast, so
  weights and gradients are fp32 and AdamW's states fp32 (torch keeps states in the parameter dtype);
- full + bf16/fp16 with DeepSpeed: the model is bf16/fp16, DeepSpeed keeps fp32 master weights and
  fp32 Adam states in the optimizer;
- full + pure-bf16: weights, gradients and AdamW states all bf16;
- LoRA/DoRA: the frozen base is loaded in the compute dtype (fp32 only for precision fp32); peft
  upcasts the adapters to fp32 (``autocast_adapter_dtype``), so adapters, their grads and states are fp32;
- QLoRA: the decoder's linears are NF4; the rest (embedding, LM head, norms) is bf16, or fp32 after
  ``prepare_model_for_kbit_training``.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.estimate.plan import TrainingPlan


@dataclass(frozen=True)
class PrecisionLayout:
    """Bytes per element of each tensor kind for one plan."""

    trainable_weight: float  # a trainable parameter as stored on the GPU
    frozen_weight: float  # a frozen, unquantised parameter (LoRA base, QLoRA's embedding/norms)
    gradient: float  # one gradient element
    optimizer_state: float  # both Adam moments of one parameter together
    master_weight: float  # fp32 master copy kept by the optimizer (DeepSpeed mixed precision), else 0
    compute: float  # matmul input/output dtype (autocast dtype)
    residual: float  # the residual stream between blocks (follows the embedding's dtype)
    norm_weight: float  # RMSNorm weight dtype; decides the norm output dtype
    autocast_weight_cache: bool  # autocast keeps a compute-dtype copy of fp32 matmul weights


def precision_layout(plan: TrainingPlan, adam8bit_bytes: float) -> PrecisionLayout:
    """The dtype sizes for ``plan`` (see the module docstring for the recipes behind them)."""
    fp32_run = plan.precision == "fp32"
    compute = 4.0 if fp32_run else 2.0
    deepspeed = plan.uses_deepspeed
    if plan.method == "full":
        if fp32_run:
            weight = 4.0
        elif plan.precision == "pure-bf16" or deepspeed:
            weight = 2.0
        else:
            weight = 4.0  # mixed precision: fp32 model under autocast
        gradient = weight
        master = 4.0 if deepspeed and not fp32_run else 0.0
        state_dtype = 4.0 if deepspeed else weight
        frozen = weight
        norm_weight = weight
        residual = weight
        cache = plan.mixed_precision and not deepspeed
    else:
        weight = 4.0  # adapters are upcast to fp32 by peft
        gradient = 4.0
        master = 0.0
        state_dtype = 4.0
        if plan.method == "qlora":
            frozen = 4.0 if plan.kbit_upcast else 2.0
        else:
            frozen = 4.0 if fp32_run else 2.0
        norm_weight = frozen
        residual = frozen
        # autocast caches bf16 copies of fp32 leaf weights used in matmuls: the adapters, and the
        # upcast LM head of QLoRA.
        cache = not fp32_run
    state = adam8bit_bytes if plan.optimizer in ("adamw_8bit", "paged_adamw_8bit") else 2 * state_dtype
    return PrecisionLayout(
        trainable_weight=weight,
        frozen_weight=frozen,
        gradient=gradient,
        optimizer_state=state,
        master_weight=master,
        compute=compute,
        residual=residual,
        norm_weight=norm_weight,
        autocast_weight_cache=cache,
    )
