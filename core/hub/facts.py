"""What a model's config.json says, and whether it trains on this box (full / LoRA / QLoRA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.estimate import (
    ArchitectureError,
    GpuSpec,
    PlanError,
    TrainingPlan,
    UnknownGpuError,
    architecture_from_config,
    count_parameters,
    estimate,
    find_gpu,
)

FIT_METHODS = ("full", "lora", "qlora")
DEFAULT_BATCH = 1
DEFAULT_SEQ_LEN = 2048
REFERENCE_GPU = "H200"  # what the fit rows are computed for when the box has no GPU


@dataclass(frozen=True)
class ModelFacts:
    """The architecture facts the details pane lists."""

    architecture: str
    model_type: str
    params: int
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    vocab_size: int
    context_length: int | None
    dtype: str | None
    known_family: bool

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def model_facts(config: dict[str, Any], name: str = "") -> ModelFacts:
    """Facts from ``config``; parameters counted from the architecture (``core.estimate``).

    Raises ``ArchitectureError`` for a config that does not describe a decoder we can size.
    """
    arch = architecture_from_config(config, name=name)
    inner = config.get("text_config") if "hidden_size" not in config and isinstance(config.get("text_config"), dict) else config
    architectures = config.get("architectures") or []
    dtype = inner.get("torch_dtype") or inner.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    return ModelFacts(
        architecture=str(architectures[0]) if architectures else arch.model_type,
        model_type=arch.model_type, params=count_parameters(arch).total, layers=arch.num_layers,
        hidden_size=arch.hidden_size, heads=arch.num_heads, kv_heads=arch.num_kv_heads,
        vocab_size=arch.vocab_size, context_length=arch.max_position_embeddings,
        dtype=str(dtype) if dtype else None, known_family=arch.known_family,
    )


@dataclass(frozen=True)
class FitRow:
    """One training method on one GPU: the estimated per-GPU peak and the verdict."""

    method: str
    gpu: str
    peak_gib: float
    capacity_gib: float
    verdict: str  # fits | tight | does_not_fit | impossible
    reference: bool  # True: computed for REFERENCE_GPU because the box has no GPU

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def gpu_spec_for(name: str | None, memory_total_bytes: int | None) -> GpuSpec:
    """The estimator's spec for a GPU the monitor reports; an unknown model gets the reported memory."""
    try:
        return find_gpu(name or "")
    except UnknownGpuError:
        from dataclasses import replace

        base = find_gpu(REFERENCE_GPU)
        memory_mib = int((memory_total_bytes or base.memory_mib * 1024**2) // 1024**2)
        return replace(base, name=name or "GPU", memory_mib=memory_mib, aliases=())


def fit_on_box(config: dict[str, Any], gpus: list[tuple[str | None, int | None]], batch: int = DEFAULT_BATCH,
               seq_len: int = DEFAULT_SEQ_LEN, name: str = "") -> list[FitRow]:
    """Full / LoRA / QLoRA at ``batch`` x ``seq_len`` on the box's first GPU (one GPU per run).

    ``gpus`` are (name, memory_total_bytes) from the hardware monitor; with none, the rows are for an
    H200 and marked ``reference``.
    """
    reference = not gpus
    spec = find_gpu(REFERENCE_GPU) if reference else gpu_spec_for(*gpus[0])
    arch = architecture_from_config(config, name=name)
    rows = []
    for method in FIT_METHODS:
        plan = TrainingPlan(architecture=arch, method=method, micro_batch_size=batch, seq_len=seq_len,
                            precision="bf16" if spec.bf16 else "fp16")
        try:
            result = estimate(plan, spec)
        except (PlanError, ArchitectureError):
            rows.append(FitRow(method, spec.name, 0.0, spec.memory_gib, "impossible", reference))
            continue
        rows.append(FitRow(method, spec.name, result.peak_gib, result.capacity_gib, result.verdict, reference))
    return rows
