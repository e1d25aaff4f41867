"""Is a plan inside what the estimator was measured on, and how well did it match there?

The constants of ``core.estimate.calibration`` were fitted on one H200 (see ``MEASURED_*`` and
``SPEED_ERROR`` / ``MEMORY_ERROR`` there). ``measured_domain`` says, for a plan and a GPU, every way it
is outside those rows; an empty list means inside, where ``MEMORY_ERROR`` and ``SPEED_ERROR`` are the
errors to expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.estimate.calibration import (
    MEASURED_GPU,
    MEASURED_GPU_FAMILY,
    MEASURED_HIDDEN_SIZES,
    MEASURED_NUM_GPUS,
    MEASURED_PRECISION,
    MEASURED_SEQ_LEN,
    MEMORY_ERROR,
    SPEED_ERROR,
    SPEED_ERROR_LONG_CONTEXT,
    SPEED_ERROR_SHORT_CONTEXT,
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


def measured_domain(plan: Any, gpu: Any) -> list[DomainGap]:
    """Every way ``plan`` (a ``TrainingPlan``) on ``gpu`` (a ``GpuSpec``, None for the CPU) is outside
    the measured rows; empty when inside. On the CPU that is the only gap said: nothing else carries over."""
    if gpu is None:
        return [DomainGap("cpu", "cpu", {"gpu": MEASURED_GPU})]
    gaps = []
    if gpu.family != MEASURED_GPU_FAMILY:
        family = FAMILY_NAMES.get(gpu.family, gpu.family)
        gaps.append(DomainGap("gpu_family", "gpu_family", {"family": family}))
    if plan.num_gpus != MEASURED_NUM_GPUS:
        gaps.append(DomainGap("num_gpus", "num_gpus", {"count": plan.num_gpus}))
    hidden = plan.architecture.hidden_size
    low, high = MEASURED_HIDDEN_SIZES
    if not low <= hidden <= high:
        gaps.append(DomainGap("hidden_size", "hidden_size", {"hidden": hidden, "low": low, "high": high}))
    if plan.method not in MEASURED_PRECISION:
        gaps.append(DomainGap("method", "method", {"method": METHOD_NAMES.get(plan.method, plan.method)}))
    elif plan.precision != MEASURED_PRECISION[plan.method]:
        gaps.append(DomainGap("precision", "precision", {
            "method": METHOD_NAMES.get(plan.method, plan.method), "precision": plan.precision,
            "measured": MEASURED_PRECISION[plan.method]}))
    low, high = MEASURED_SEQ_LEN
    if not low <= plan.seq_len <= high:
        gaps.append(DomainGap("seq_len", "seq_len", {"seq": plan.seq_len, "low": low // 1024, "high": high // 1024}))
    if plan.offload != "none":
        gaps.append(DomainGap("offload", "offload", {"offload": plan.offload}))
    return gaps


def _error_json(error: MeasuredError) -> dict[str, Any]:
    return {"median_pct": error.median_pct, "worst_pct": error.worst_pct, "rows": error.rows}


def domain_json(plan: Any, gpu: Any) -> dict[str, Any]:
    """What ``tunedeck plan --json`` says of the estimate's footing: inside or not, why, and the band."""
    gaps = measured_domain(plan, gpu)
    speed = _error_json(SPEED_ERROR)
    speed["short_context"] = _error_json(SPEED_ERROR_SHORT_CONTEXT)
    speed["long_context"] = _error_json(SPEED_ERROR_LONG_CONTEXT)
    return {
        "inside": not gaps,
        "outside": [gap.to_json() for gap in gaps],
        "measured_on": {"gpu": MEASURED_GPU, "gpu_family": MEASURED_GPU_FAMILY, "num_gpus": MEASURED_NUM_GPUS,
                        "hidden_sizes": list(MEASURED_HIDDEN_SIZES), "precision": dict(MEASURED_PRECISION),
                        "seq_len": list(MEASURED_SEQ_LEN), "offload": "none"},
        "error_band": {"peak_memory": _error_json(MEMORY_ERROR), "tokens_per_s": speed},
    }
