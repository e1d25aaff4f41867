"""What a model's config.json says, and whether it trains on this box (full / LoRA / QLoRA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.estimate import (
    ArchitectureError,
    PlanError,
    TrainingPlan,
    architecture_from_config,
    count_parameters,
    estimate,
    find_gpu,
)

if TYPE_CHECKING:
    from core.plan.hardware import HardwareTarget

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
    # fits | tight | does_not_fit | impossible, against the card; fits_card_not_free: the card, not what other
    # processes leave free on it now (``free_gib``, of which ``usable_gib`` is planned on)
    verdict: str
    reference: bool  # True: computed for REFERENCE_GPU because the box has no GPU
    free_gib: float | None = None  # what other processes leave free on the GPU now; None: they hold none to speak of
    usable_gib: float | None = None  # of it, what a run may plan on (less the planner's margin), judged against

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def fit_on_box(config: dict[str, Any], box: HardwareTarget | None, batch: int = DEFAULT_BATCH,
               seq_len: int = DEFAULT_SEQ_LEN, name: str = "") -> list[FitRow]:
    """Full / LoRA / QLoRA at ``batch`` x ``seq_len`` on one GPU of this box (one GPU per run: the freest).

    ``box`` is this box (``core.plan.target_from_snapshot``); with none, or no GPU, the rows are for an
    H200 and marked ``reference``. Where other processes hold memory on that GPU, a method is judged against
    what they leave, as the planner sizes a plan (``HardwareTarget.usable_now_gib``): one that fits only the
    whole card reads ``fits_card_not_free``.
    """
    reference = box is None or box.gpu is None
    spec = find_gpu(REFERENCE_GPU) if box is None or box.gpu is None else box.gpu
    arch = architecture_from_config(config, name=name)
    free = None if reference else box.free_gib(1)
    rows = []
    for method in FIT_METHODS:
        plan = TrainingPlan(architecture=arch, method=method, micro_batch_size=batch, seq_len=seq_len,
                            precision="bf16" if spec.bf16 else "fp16")
        try:
            result = estimate(plan, spec)
        except (PlanError, ArchitectureError):
            rows.append(FitRow(method, spec.name, 0.0, spec.memory_gib, "impossible", reference))
            continue
        room = None if box is None or reference else box.usable_now_gib(1, result.margin_gib)
        verdict = result.verdict
        if room is not None and verdict in ("fits", "tight") and result.peak_gib > room:
            verdict = "fits_card_not_free"
        rows.append(FitRow(method, spec.name, result.peak_gib, result.capacity_gib, verdict, reference,
                           None if room is None else free, room))
    return rows
