"""Host memory a run needs before it starts: ``offload_activations`` keeps every checkpointed block's input
in pinned host memory for the whole step (28 layers x 96k tokens x 3584 x 2 bytes = 19.7 GB for a 7B), on
top of what the process itself takes. Pinned memory cannot be swapped: a box that has too little does not
slow down, it kills the trainer (or the machine's other work) hours in. So ``train`` and ``resume`` check it
against what the box has available, the way ``core.runs.disk_space`` checks checkpoints against the disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.i18n import Message

GIB = 1024**3
SHORT_FRACTION = 0.9  # more than this of the available memory: refused
CLOSE_FRACTION = 0.6  # more than this: a warning


@dataclass(frozen=True)
class OffloadNeed:
    layers: int
    tokens: int
    hidden: int
    width: int  # bytes per value
    processes: int  # training processes on this box: each parks its own micro-batch's inputs
    bytes: int  # the estimator's figure (``core.estimate.memory.activation_host_bytes``): the product above


def offload_need(cfg: dict[str, Any], processes: int = 1) -> OffloadNeed | None:
    """What ``offload_activations`` parks per micro-batch for the run ``cfg`` on a box where ``processes``
    ranks train (None: off, or a model the estimator cannot read). The figure is the estimator's, so the
    wizard's host RAM and this check cannot disagree."""
    if not (cfg.get("offload_activations") and cfg.get("gradient_checkpointing", True)):
        return None
    from core.estimate import ArchitectureError, ModelNotFoundError
    from core.estimate.memory import activation_host_bytes
    from core.estimate.plan import PlanError
    from core.estimate.run_plan import plan_for_run

    try:
        plan = plan_for_run(cfg, max(1, processes))
    except (ArchitectureError, ModelNotFoundError, PlanError, OSError, ValueError, TypeError):
        return None
    width = 4 if plan.precision == "fp32" or plan.kbit_upcast else 2
    return OffloadNeed(plan.checkpointed_layers, plan.tokens_per_micro_batch, plan.architecture.hidden_size, width,
                       plan.num_gpus, int(activation_host_bytes(plan)))


def available_bytes() -> int | None:
    """Memory the box can give a new process now (``MemAvailable``), None where it cannot be read."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # no psutil, no /proc: say nothing rather than guess
        return None


@dataclass(frozen=True)
class HostCheck:
    verdict: str  # "ok", "close" or "short"
    message: Message | None


def check_offload_ram(cfg: dict[str, Any], available: int | None = None, processes: int = 1) -> HostCheck | None:
    """The verdict on ``cfg``'s parked activations, ``processes`` ranks of it on this box, against the box's
    available memory (None: nothing to judge)."""
    need = offload_need(cfg, processes)
    if need is None:
        return None
    have = available_bytes() if available is None else available
    if not have:
        return None
    params = {"need": round(need.bytes / GIB, 1), "have": round(have / GIB, 1), "processes": need.processes,
              "layers": need.layers,
              "tokens": f"{need.tokens:,}", "hidden": need.hidden, "width": need.width}
    many = "_many" if need.processes > 1 else ""  # the formula names the processes when there are several
    if need.bytes > SHORT_FRACTION * have:
        return HostCheck("short", Message(f"runs.offload_ram_short{many}", **params))
    if need.bytes > CLOSE_FRACTION * have:
        return HostCheck("close", Message(f"runs.offload_ram_close{many}", **params))
    return HostCheck("ok", None)
