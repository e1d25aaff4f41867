"""Candidate plans: every sensible combination of method, parallelism, batch and checkpointing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from core.estimate import Estimate, PlanError, TrainingPlan, estimate
from core.plan.request import MAX_CONTEXT, PlanRequest

GIB = 1024**3
MAX_MICRO_BATCH = 64


@dataclass(frozen=True)
class Finding:
    """One rule's verdict on a candidate: an i18n key and its parameters (text made on demand)."""

    key: str
    params: tuple[tuple[str, Any], ...] = ()

    def text(self) -> str:
        from core.i18n import t

        return t(self.key, **dict(self.params))

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.key.split(".")[-1], "message": self.text()}


def finding(key: str, **params: Any) -> Finding:
    return Finding(key, tuple(params.items()))


@dataclass(frozen=True)
class Candidate:
    """One plan with its estimate, the rules it breaks (``problems``) and remarks (``warnings``)."""

    plan: TrainingPlan
    estimate: Estimate | None
    problems: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()
    hours: float | None = None
    measured: dict[str, Any] | None = None  # a probe's peak memory and tokens/s, when measured

    @property
    def feasible(self) -> bool:
        return self.estimate is not None and not self.problems

    @property
    def peak_gib(self) -> float:
        if self.measured and self.measured.get("peak_gib") is not None:
            return float(self.measured["peak_gib"])
        return self.estimate.peak_gib if self.estimate else float("inf")

    @property
    def tokens_per_s(self) -> float:
        if self.measured and self.measured.get("tokens_per_s"):
            return float(self.measured["tokens_per_s"])
        return self.estimate.tokens_per_s if self.estimate else 0.0

    @property
    def effective_batch(self) -> int:
        p = self.plan
        return p.micro_batch_size * p.grad_accum_steps * p.num_gpus

    def cost(self, price_per_gpu_hour: float | None) -> float | None:
        if self.hours is None or price_per_gpu_hour is None:
            return None
        return self.hours * self.plan.num_gpus * price_per_gpu_hour

    def shape(self) -> tuple[Any, ...]:
        """What makes two candidates different kinds of plan (for alternatives)."""
        p = self.plan
        return (p.method, p.num_gpus, p.zero_stage, p.offload)


def _powers_of_two_up_to(limit: int) -> list[int]:
    values, n = [], 1
    while n <= limit:
        values.append(n)
        n *= 2
    return values


def gpu_counts(request: PlanRequest) -> list[int]:
    pinned = request.overrides.get("num_gpus")
    if pinned:
        return [int(pinned)]
    if request.hardware.cpu_only:
        return [1]
    return sorted(set(_powers_of_two_up_to(request.hardware.count)) | {request.hardware.count})


def methods(request: PlanRequest) -> list[str]:
    pinned = request.overrides.get("method")
    if pinned:
        return [str(pinned)]
    return ["lora", "full"] if request.hardware.cpu_only else ["lora", "qlora", "full"]


def precision_for(request: PlanRequest) -> str:
    """bf16 where the GPU has it (Ampere and newer), fp16 before, fp32 on the CPU."""
    pinned = request.overrides.get("precision")
    if pinned:
        return str(pinned)
    gpu = request.hardware.gpu
    if gpu is None:
        return "fp32"
    return "bf16" if gpu.bf16 else "fp16"


def parallelism(request: PlanRequest, method: str, num_gpus: int) -> list[tuple[int, str]]:
    """(ZeRO stage, offload) pairs worth trying; QLoRA never with ZeRO-3 (4-bit weights do not shard).

    On one GPU, LoRA's states are small: only ZeRO-3's offload of the base weights helps it fit (a 72B on a 24 GB
    card: 143 GiB of host RAM, where full fine-tuning offloaded needs 1,223 GiB and runs slower)."""
    if request.hardware.cpu_only:
        options = [(0, "none")]
    elif num_gpus == 1:
        options = [(0, "none"), (2, "optimizer"), (3, "all")] if method == "full" else [(0, "none"), (3, "all")]
    else:
        options = [(0, "none"), (2, "none"), (3, "none"), (2, "optimizer"), (3, "all")]
    if method == "qlora":
        options = [o for o in options if o[0] != 3]
    zero, offload = request.overrides.get("zero_stage"), request.overrides.get("offload")
    if zero is not None or offload is not None:
        z = int(zero) if zero is not None else None
        options = [(oz, oo) for oz, oo in options if (z is None or oz == z) and (offload is None or oo == offload)]
        if not options:  # a pinned pair outside the usual set: try it as asked (the rules judge it)
            options = [(z if z is not None else (2 if offload and offload != "none" else 0), offload or "none")]
    return options


def seq_lens(request: PlanRequest) -> list[int]:
    base = request.seq_len
    if request.goal != "longest_context" or "seq_len" in request.overrides:
        return [base]
    limit = MAX_CONTEXT
    values = [base]
    while values[-1] * 2 <= limit:
        values.append(values[-1] * 2)
    return values


def micro_batches(request: PlanRequest, num_gpus: int) -> list[int]:
    pinned = request.overrides.get("micro_batch_size")
    if pinned:
        return [int(pinned)]
    limit = max(1, min(MAX_MICRO_BATCH, request.effective_batch // num_gpus))
    return _powers_of_two_up_to(limit)


def checkpointing(request: PlanRequest) -> list[bool]:
    pinned = request.overrides.get("gradient_checkpointing")
    return [bool(pinned)] if pinned is not None else [True, False]


def activation_offloads(request: PlanRequest, checkpointed: bool) -> list[bool]:
    """Whether to weigh ``offload_activations`` too: for the longest-context goal on a GPU, with
    checkpointing (the kept block inputs are what it moves to host memory)."""
    if request.goal != "longest_context" or not checkpointed or request.hardware.cpu_only:
        return [False]
    return [False, True]


def candidate_plans(request: PlanRequest, base: TrainingPlan) -> Iterator[TrainingPlan]:
    """Every plan the planner weighs for ``request`` (``base`` carries the model's architecture)."""
    precision = precision_for(request)
    lora_rank = int(request.overrides.get("lora_rank") or base.lora_rank)
    share = base.target_share if request.dataset_target_share is None else request.dataset_target_share
    for num_gpus in gpu_counts(request):
        for method in methods(request):
            for zero, offload in parallelism(request, method, num_gpus):
                for seq_len in seq_lens(request):
                    for micro in micro_batches(request, num_gpus):
                        accum = request.overrides.get("grad_accum_steps")
                        accum = int(accum) if accum else max(1, request.effective_batch // (micro * num_gpus))
                        for gc in checkpointing(request):
                            for parked in activation_offloads(request, gc):
                                plan = replace(
                                    base, method=method, precision=precision, num_gpus=num_gpus,
                                    zero_stage=zero, offload=offload, seq_len=seq_len, micro_batch_size=micro,
                                    grad_accum_steps=accum, gradient_checkpointing=gc, lora_rank=lora_rank,
                                    offload_activations=parked,
                                    price_per_gpu_hour=request.hardware.price_per_gpu_hour,
                                    target_share=share,
                                )
                                yield on_the_cpu(plan) if request.hardware.cpu_only else plan


def on_the_cpu(plan: TrainingPlan) -> TrainingPlan:
    """``plan`` as a CPU run makes it: the fused kernels run on GPUs, so it takes torch's dropout, SwiGLU and
    RMSNorm and the chunked loss (``resolve_fused_ce``)."""
    return replace(plan, fused_ce_impl="chunked", lora_dropout_fused=False, lora_swiglu_fused=False,
                   rms_norm_rows=False, lora_fold_dh=False)


def estimate_plan(plan: TrainingPlan, request: PlanRequest) -> tuple[Estimate | None, Finding | None]:
    """The estimate of ``plan`` on the request's GPU, or the reason it cannot run at all."""
    try:
        return estimate(plan, request.hardware.spec()), None
    except PlanError as exc:
        return None, finding("plan.rule.invalid", problem=str(exc))


def hours_for(result: Estimate, request: PlanRequest) -> float | None:
    """Hours of the plan ``result`` estimated: the tokens it reads at its own sequence length, over its speed."""
    tokens = request.training_tokens_at(result.plan["seq_len"])
    if tokens is None or result.tokens_per_s <= 0:
        return None
    return tokens / result.tokens_per_s / 3600.0
