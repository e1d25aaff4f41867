"""The memory-driven ``auto`` run keys made concrete for a GPU: how many decoder layers need gradient
checkpointing (``checkpoint_layers: auto``) and whether the MLP needs tiles (``tiled_mlp: auto``).

Checkpointing every layer is the safe default and the slowest: each checkpointed layer is computed twice.
On a card with room to spare only some layers need it. The estimator is monotone in the number of
checkpointed layers (each one trades its kept activations for its kept input), so the fewest that still
fit, with the estimator's own safety margin, are found by bisection.

The tiled MLP saves memory at long micro-batches and costs launch time per tile and layer (about 2.7 ms per
tile and layer for LoRA on the H200 box: 2.3 s of a 0.5B LoRA step of 32k tokens in 37 tiles, 24 layers).
``auto`` keeps it only where the plan does not fit untiled.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from core.estimate.calibration import DEFAULT_CALIBRATION, Calibration
from core.estimate.estimator import estimate
from core.estimate.gpus import GpuSpec
from core.estimate.plan import PlanError, TrainingPlan


def fewest_checkpointed_layers(plan: TrainingPlan, gpu: GpuSpec,
                               calibration: Calibration = DEFAULT_CALIBRATION) -> int:
    """The smallest number of checkpointed layers with which ``plan`` fits ``gpu`` (all when none fits)."""
    layers = plan.architecture.num_layers

    def fits(count: int) -> bool:
        return estimate(replace(plan, gradient_checkpointing=True, checkpoint_layers=count), gpu, calibration).fits

    if not fits(layers):
        return layers
    low, high = 0, layers  # fits(high) holds throughout
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return high


def _run_plan_on(config: Any, gpu_name: str | GpuSpec, num_gpus: int) -> tuple[TrainingPlan, GpuSpec] | None:
    """The plan the engine will run for ``config`` (its optimizer, loss, targets, tiles) and ``gpu_name``'s
    spec (a ``GpuSpec`` as it is: a card with its free memory as the capacity, ``core.runs.gpu_memory``);
    None where the estimator cannot describe the GPU or the model."""
    from core.estimate.architecture import ArchitectureError
    from core.estimate.gpus import UnknownGpuError, find_gpu
    from core.estimate.model_source import ModelNotFoundError
    from core.estimate.run_plan import plan_for_run

    try:
        return plan_for_run(config, num_gpus), gpu_name if isinstance(gpu_name, GpuSpec) else find_gpu(gpu_name)
    except (UnknownGpuError, ModelNotFoundError, ArchitectureError, PlanError, OSError, ValueError):
        return None


def resolve_checkpoint_layers(config: Any, gpu_name: str | GpuSpec | None, num_gpus: int = 1) -> str | int:
    """A run config's ``checkpoint_layers`` with ``auto`` made concrete for ``num_gpus`` of ``gpu_name``.

    ``all`` where the choice cannot be made (no GPU, a GPU or model the estimator does not know, no
    checkpointing): the plain behaviour is the safe one.
    """
    value = getattr(config, "checkpoint_layers", "all")
    if value != "auto":
        return value
    if not config.gradient_checkpointing or not gpu_name:
        return "all"
    found = _run_plan_on(config, gpu_name, num_gpus)
    if found is None:
        return "all"
    plan, gpu = found
    count = fewest_checkpointed_layers(plan, gpu)
    return "all" if count >= plan.architecture.num_layers else count


def resolve_tiled_mlp(config: Any, gpu_name: str | GpuSpec | None, num_gpus: int = 1) -> str | int:
    """A run config's ``tiled_mlp``, ``auto`` made ``false`` where the run fits ``gpu_name`` untiled.

    ``auto`` stays where the choice cannot be made (no GPU, a GPU or model the estimator does not know):
    the engine then tiles long checkpointed micro-batches, the safe side for memory.
    """
    value = getattr(config, "tiled_mlp", "auto")
    if value != "auto" or not gpu_name:
        return value
    found = _run_plan_on(config, gpu_name, num_gpus)
    if found is None or not found[0].tiles_mlp:
        return "auto"  # unknown, or the engine would not tile it either
    try:
        chosen = estimate(*found)  # auto: tiled only where untiled does not fit
    except PlanError:
        return "auto"
    return "false" if chosen.plan["mlp_tiles"] == 1 else "auto"
