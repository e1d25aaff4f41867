"""Memory and speed estimator: pure functions of (model shape, training plan, GPU).

``estimate(plan, gpu)`` gives per-GPU peak memory with a breakdown, a fit verdict and tokens/s; the
constants it rests on live in ``calibration.py``. Nothing here needs torch or a GPU (exact parameter
counting on the meta device is optional).
"""

from __future__ import annotations

from core.estimate.architecture import (
    ArchitectureError,
    ModelArchitecture,
    ParameterCounts,
    architecture_from_config,
    count_parameters,
    lora_parameter_count,
    normalise_lora_targets,
)
from core.estimate.calibration import DEFAULT_CALIBRATION, Calibration
from core.estimate.estimator import Estimate, estimate, plan_for_model
from core.estimate.gpus import GPUS, GpuSpec, UnknownGpuError, find_gpu, known_gpu_names, parse_hardware
from core.estimate.memory import BREAKDOWN_KEYS
from core.estimate.model_source import ModelConfig, ModelNotFoundError, known_model_names, load_model_config
from core.estimate.plan import (
    METHODS,
    OFFLOADS,
    OPTIMIZERS,
    PRECISIONS,
    PlanError,
    TrainingPlan,
    normalise_optimizer,
)

__all__ = [
    "BREAKDOWN_KEYS",
    "DEFAULT_CALIBRATION",
    "GPUS",
    "METHODS",
    "OFFLOADS",
    "OPTIMIZERS",
    "PRECISIONS",
    "ArchitectureError",
    "Calibration",
    "Estimate",
    "GpuSpec",
    "ModelArchitecture",
    "ModelConfig",
    "ModelNotFoundError",
    "ParameterCounts",
    "PlanError",
    "TrainingPlan",
    "UnknownGpuError",
    "architecture_from_config",
    "count_parameters",
    "estimate",
    "find_gpu",
    "known_gpu_names",
    "known_model_names",
    "load_model_config",
    "lora_parameter_count",
    "normalise_lora_targets",
    "normalise_optimizer",
    "parse_hardware",
    "plan_for_model",
]
