"""Is a plan inside what the estimator was measured on, and how well did it match there?

The constants of ``core.estimate.calibration`` were fitted on one H200: the speed constants on the rows of
``SPEED_DOMAIN``, the memory constants on the wider calibration matrix of ``MEMORY_DOMAIN`` (with
``SPEED_ERROR`` / ``MEMORY_ERROR`` the errors there). ``measured_domain`` says, for a plan, a GPU and one of
those domains, every way the plan is outside it; an empty list means inside, where that figure's error is
the one to expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.estimate.calibration import (
    MEASURED_GPU,
    MEASURED_GPU_FAMILY,
    MEASURED_NUM_GPUS,
    MEMORY_DOMAIN,
    MEMORY_ERROR,
    SPEED_DOMAIN,
    SPEED_ERROR,
    SPEED_ERROR_CPU_BOUND,
    SPEED_ERROR_GPU_BOUND,
    MeasuredDomain,
    MeasuredError,
)
from core.i18n import t

FAMILY_NAMES = {"hopper": "Hopper", "ampere": "Ampere", "ampere_ga10x": "Ampere", "ada": "Ada", "volta": "Volta"}
METHOD_NAMES = {"lora": "LoRA", "qlora": "QLoRA", "dora": "DoRA", "full": "full"}


@dataclass(frozen=True)
class DomainGap:
    """One way a plan is outside the measured rows: ``field`` names it, ``short`` fits on a line."""

    field: str  # cpu | gpu_family | num_gpus | hidden_size | method | precision | seq_len | offload
    key: str
    params: dict[str, Any]

    def message(self) -> str:
        return t(f"plan.domain.{self.key}", **self.params)

    def short(self) -> str:
        return t(f"plan.domain.short.{self.key}", **self.params)

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "message": self.message(), "short": self.short()}


def measured_domain(plan: Any, gpu: Any, domain: MeasuredDomain = SPEED_DOMAIN) -> list[DomainGap]:
    """Every way ``plan`` (a ``TrainingPlan``) on ``gpu`` (a ``GpuSpec``, None for the CPU) is outside
    ``domain``'s rows; empty when inside. On the CPU that is the only gap said: nothing else carries over."""
    if gpu is None:
        return [DomainGap("cpu", "cpu", {"gpu": MEASURED_GPU})]
    gaps = []
    if gpu.family != MEASURED_GPU_FAMILY:
        family = FAMILY_NAMES.get(gpu.family, gpu.family)
        gaps.append(DomainGap("gpu_family", "gpu_family", {"family": family}))
    if plan.num_gpus != MEASURED_NUM_GPUS:
        gaps.append(DomainGap("num_gpus", "num_gpus", {"count": plan.num_gpus}))
    hidden = plan.architecture.hidden_size
    low, high = domain.hidden_sizes
    if not low <= hidden <= high:
        gaps.append(DomainGap("hidden_size", "hidden_size", {"hidden": hidden, "low": low, "high": high}))
    if plan.method not in domain.precision:
        gaps.append(DomainGap("method", "method", {"method": METHOD_NAMES.get(plan.method, plan.method)}))
    elif plan.precision not in domain.precision[plan.method]:
        gaps.append(DomainGap("precision", "precision", {
            "method": METHOD_NAMES.get(plan.method, plan.method), "precision": plan.precision,
            "measured": " / ".join(domain.precision[plan.method])}))
    low, high = domain.seq_len
    if not low <= plan.seq_len <= high:
        gaps.append(DomainGap("seq_len", "seq_len", {"seq": plan.seq_len, "low": _tokens(low), "high": _tokens(high)}))
    if plan.offload != "none":
        gaps.append(DomainGap("offload", "offload", {"offload": plan.offload}))
    return gaps


def _tokens(count: int) -> str:
    """A sequence length as the bounds are said: 512, 2k, 192k."""
    return f"{count // 1024}k" if count >= 1024 else str(count)


def _error_json(error: MeasuredError) -> dict[str, Any]:
    return {"median_pct": error.median_pct, "worst_pct": error.worst_pct, "rows": error.rows}


def _measured_on(domain: MeasuredDomain) -> dict[str, Any]:
    return {"gpu": MEASURED_GPU, "gpu_family": MEASURED_GPU_FAMILY, "num_gpus": MEASURED_NUM_GPUS,
            "hidden_sizes": list(domain.hidden_sizes),
            "precision": {method: list(values) for method, values in domain.precision.items()},
            "seq_len": list(domain.seq_len), "offload": "none"}


def domain_json(plan: Any, gpu: Any, waits_on_cpu: bool = False) -> dict[str, Any]:
    """What ``tunedeck plan --json`` says of the estimate's footing: inside or not, why, and the bands. The
    top level is the speed figure's domain (the narrower); ``memory`` the peak memory figure's. The speed
    band is the one of the plan's kind of step (``waits_on``: its estimate says whether launching the
    kernels takes longer than running them), both kinds' under ``gpu_bound`` / ``cpu_bound``."""
    gaps = measured_domain(plan, gpu)
    memory_gaps = measured_domain(plan, gpu, MEMORY_DOMAIN)
    speed = {**_error_json(SPEED_ERROR_CPU_BOUND if waits_on_cpu else SPEED_ERROR_GPU_BOUND),
             "waits_on": "cpu" if waits_on_cpu else "gpu", "all": _error_json(SPEED_ERROR),
             "gpu_bound": _error_json(SPEED_ERROR_GPU_BOUND), "cpu_bound": _error_json(SPEED_ERROR_CPU_BOUND)}
    return {
        "inside": not gaps,
        "outside": [gap.to_json() for gap in gaps],
        "measured_on": _measured_on(SPEED_DOMAIN),
        "memory": {"inside": not memory_gaps, "outside": [gap.to_json() for gap in memory_gaps],
                   "measured_on": _measured_on(MEMORY_DOMAIN)},
        "error_band": {"peak_memory": _error_json(MEMORY_ERROR), "tokens_per_s": speed},
    }
