"""``estimate(plan, gpu) -> Estimate``: per-GPU peak memory with its breakdown, fit verdict and speed."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from core.estimate.architecture import count_parameters
from core.estimate.calibration import DEFAULT_CALIBRATION, Calibration
from core.estimate.gpus import GIB, GpuSpec
from core.estimate.memory import BREAKDOWN_KEYS, memory_phases
from core.estimate.model_source import load_model_config
from core.estimate.plan import TrainingPlan
from core.estimate.speed import estimate_speed
from core.units import json_cost, json_hours


@dataclass(frozen=True)
class Estimate:
    """What a plan needs on one GPU, whether it fits, and how fast it runs. Memory in GiB."""

    model: str
    gpu: str
    breakdown: dict[str, float]
    peak_phase: str
    phase_totals_gib: dict[str, float]
    capacity_gib: float
    margin_gib: float
    cpu_ram_gib: float
    total_params: int
    trainable_params: int
    param_count: str  # "exact" (meta device) or "analytic"
    flops_per_token: float
    efficiency: float
    tokens_per_s_per_gpu: float
    tokens_per_s: float
    seconds_per_step: float
    epoch_hours: float | None
    epoch_cost: float | None
    plan: dict[str, Any] = field(default_factory=dict)
    # The step waits on the CPU: launching its kernels takes longer than running them (speed.StepTime).
    waits_on_cpu: bool = False
    notes: tuple[str, ...] = ()

    @property
    def peak_gib(self) -> float:
        return sum(self.breakdown.values())

    @property
    def headroom_gib(self) -> float:
        """Capacity left after the peak (negative: short by that much)."""
        return self.capacity_gib - self.peak_gib

    @property
    def fits(self) -> bool:
        """The peak plus the safety margin is within the GPU's memory."""
        return self.peak_gib + self.margin_gib <= self.capacity_gib

    @property
    def verdict(self) -> str:
        """``fits``; ``tight`` (under capacity but inside the margin); ``does_not_fit``."""
        if self.fits:
            return "fits"
        return "tight" if self.peak_gib <= self.capacity_gib else "does_not_fit"

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json`` and for other tools (keys are stable)."""
        return {
            "model": self.model,
            "gpu": self.gpu,
            "peak_gib": round(self.peak_gib, 3),
            "breakdown": {key: round(value, 3) for key, value in self.breakdown.items()},
            "peak_phase": self.peak_phase,
            "phase_totals_gib": {key: round(value, 3) for key, value in self.phase_totals_gib.items()},
            "fits": self.fits,
            "verdict": self.verdict,
            "capacity_gib": round(self.capacity_gib, 3),
            "margin_gib": round(self.margin_gib, 3),
            "headroom_gib": round(self.headroom_gib, 3),
            "cpu_ram_gib": round(self.cpu_ram_gib, 3),
            "total_params": self.total_params,
            "trainable_params": self.trainable_params,
            "param_count": self.param_count,
            "flops_per_token": self.flops_per_token,
            "mfu": round(self.efficiency, 4),
            "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "seconds_per_step": round(self.seconds_per_step, 4),
            "epoch_hours": json_hours(self.epoch_hours),
            "epoch_cost": json_cost(self.epoch_cost),
            "waits_on_cpu": self.waits_on_cpu,
            "plan": self.plan,
            "notes": list(self.notes),
        }


def fit_margin_gib(capacity_gib: float, calibration: Calibration) -> float:
    """Safety margin kept free: a fraction of the capacity, at least a floor."""
    return max(calibration.fit_margin_fraction * capacity_gib, calibration.fit_margin_floor_gib)


def _plan_summary(plan: TrainingPlan) -> dict[str, Any]:
    return {
        "method": plan.method,
        "precision": plan.precision,
        "micro_batch_size": plan.micro_batch_size,
        "seq_len": plan.seq_len,
        "gradient_checkpointing": plan.gradient_checkpointing,
        "checkpointed_layers": plan.checkpointed_layers,
        "lora_rank": plan.lora_rank if plan.uses_lora else None,
        "lora_targets": list(plan.lora_targets) if plan.uses_lora else None,
        "lora_dropout": plan.lora_dropout if plan.uses_lora else None,
        "fused_ce": plan.fused_ce,
        "fused_ce_impl": plan.fused_ce_impl if plan.fused_ce else None,
        "ce_chunk": plan.ce_chunk if plan.fused_ce else None,
        "kbit_upcast": plan.kbit_upcast if plan.method == "qlora" else None,
        "offload_activations": plan.offloads_activations,
        "mlp_tiles": plan.mlp_tiles(plan.checkpointed_layers > 0),
        "optimizer": plan.optimizer,
        "num_gpus": plan.num_gpus,
        "zero_stage": plan.zero_stage,
        "offload": plan.offload,
        "grad_accum_steps": plan.grad_accum_steps,
        "attention": plan.attention,
        "dataset_tokens": plan.dataset_tokens,
        "lm_head_share": round(plan.lm_head_share, 4),
        "price_per_gpu_hour": plan.price_per_gpu_hour,
    }


def _notes(plan: TrainingPlan) -> tuple[str, ...]:
    notes = []
    if not plan.architecture.known_family:
        notes.append("unknown_family")
    if plan.method == "qlora" and plan.kbit_upcast:
        notes.append("kbit_upcast")
    if plan.optimizer == "paged_adamw_8bit":
        notes.append("paged_optimizer")
    if plan.method == "dora" and plan.lora_dropout > 0 and plan.lora_input_upcast:
        notes.append("dora_dropout")
    if not plan.fused_ce:
        notes.append("plain_ce")
    return tuple(notes)


def estimate(plan: TrainingPlan, gpu: GpuSpec, calibration: Calibration = DEFAULT_CALIBRATION, *,
             tiles_by_fit: bool = True) -> Estimate:
    """Estimate per-GPU memory, fit and speed of ``plan`` on ``gpu`` (raises ``PlanError`` if impossible).

    ``tiled_mlp: auto`` tiles the MLP only where the plan does not fit ``gpu`` untiled: tiles save memory
    and cost launch time (``mlp_tile_s``), several times the step of a small model. The launcher resolves
    a run's ``auto`` the same way (``core.estimate.checkpointing.resolve_tiled_mlp``). ``tiles_by_fit=False``:
    ``auto`` is the engine's rule alone (what runs where the launcher could not resolve it: no GPU known).
    """
    if tiles_by_fit and plan.tiled_mlp == "auto" and plan.tiles_mlp:
        untiled = _estimate(replace(plan, tiled_mlp="false"), gpu, calibration)
        if untiled.fits:
            return untiled
    return _estimate(plan, gpu, calibration)


def _estimate(plan: TrainingPlan, gpu: GpuSpec, calibration: Calibration) -> Estimate:
    plan.validate(gpu_bf16=gpu.bf16)
    arch = plan.architecture
    counts = count_parameters(arch)
    memory = memory_phases(arch, counts, plan, gpu, calibration)
    speed = estimate_speed(arch, counts, plan, gpu, calibration, trainable=memory.sizes.trainable)
    breakdown = {key: memory.peak[key] / GIB for key in BREAKDOWN_KEYS}
    capacity = gpu.memory_gib
    return Estimate(
        model=arch.name,
        gpu=gpu.name,
        breakdown=breakdown,
        peak_phase=memory.peak_phase,
        phase_totals_gib={name: sum(values.values()) / GIB for name, values in memory.phases.items()},
        capacity_gib=capacity,
        margin_gib=fit_margin_gib(capacity, calibration),
        cpu_ram_gib=memory.cpu_ram / GIB,
        total_params=memory.sizes.total,
        trainable_params=memory.sizes.trainable,
        param_count="exact" if plan.exact_total_params else "analytic",
        flops_per_token=speed.flops_per_token,
        efficiency=speed.efficiency,
        tokens_per_s_per_gpu=speed.tokens_per_s_per_gpu,
        tokens_per_s=speed.tokens_per_s,
        seconds_per_step=speed.seconds_per_step,
        epoch_hours=speed.epoch_hours,
        epoch_cost=speed.epoch_cost,
        plan=_plan_summary(plan),
        notes=_notes(plan),
        waits_on_cpu=speed.step is not None and speed.step.waits_on_cpu,
    )


def plan_for_model(model: str, exact_count: bool | None = None, hub_cache: bool = False, fetch: bool = False,
                   **options: Any) -> TrainingPlan:
    """A ``TrainingPlan`` for ``model`` (a config.json path, model folder, hub id or bundled name).

    ``exact_count`` builds the model on the meta device to count parameters exactly (needs torch and
    transformers; analytic without them). ``None`` does so only for architectures outside the known
    families, where the analytic count is an approximation; for the known ones the two agree (tested).
    ``hub_cache`` and ``fetch`` are ``load_model_config``'s (planning takes a config read from a hub; a run's
    own checks do not). ``options`` are ``TrainingPlan`` fields.
    """
    config = load_model_config(model, hub_cache=hub_cache, fetch=fetch)
    plan = TrainingPlan(architecture=config.architecture(), **options)
    wanted = (not plan.architecture.known_family) if exact_count is None else exact_count
    if wanted:
        from core.estimate.exact_count import count_parameters_exact, exact_counting_available

        if exact_counting_available():
            try:
                plan = replace(plan, exact_total_params=count_parameters_exact(config.config))
            except (ValueError, KeyError):
                pass  # a model_type this transformers does not know: keep the analytic count
    return plan
