"""The planner behind the wizard and ``tunedeck plan``: candidates, rules, ranking and reasons.

Public interface::

    recommend(PlanRequest(model, hardware, goal=..., ...)) -> Recommendation
    parse_target("2xA100-80GB") / target_from_snapshot(box_snapshot, indices) -> HardwareTarget
    summarise_dataset(path, model=None) -> DatasetSummary
    save_run_config(candidate, request, path) -> Path
    save_run_config_keeping(candidate, request, path, written) -> Path   (never replaces what it did not write)

Pure: no textual, no torch (the probe, in ``core.plan.probe``, starts short runs through the engine).
"""

from __future__ import annotations

from core.plan.candidates import Candidate, Finding
from core.plan.dataset import DatasetSummary, summarise_dataset
from core.plan.hardware import (
    HardwareError,
    HardwareTarget,
    parse_gpu_indices,
    parse_target,
    target_from_snapshot,
)
from core.plan.planner import Recommendation, evaluate, plan_key, recommend
from core.plan.request import GOALS, OVERRIDABLE, PlanRequest
from core.plan.run_config import (
    build_run_config,
    default_config_path,
    equivalent_command,
    run_config_values,
    save_run_config,
    save_run_config_keeping,
)

__all__ = [
    "GOALS",
    "OVERRIDABLE",
    "Candidate",
    "DatasetSummary",
    "Finding",
    "HardwareError",
    "HardwareTarget",
    "PlanRequest",
    "Recommendation",
    "build_run_config",
    "default_config_path",
    "equivalent_command",
    "evaluate",
    "parse_gpu_indices",
    "parse_target",
    "plan_key",
    "recommend",
    "run_config_values",
    "save_run_config",
    "save_run_config_keeping",
    "summarise_dataset",
    "target_from_snapshot",
]
