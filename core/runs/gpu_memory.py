"""GPU memory a run needs before it starts: the estimator's per-GPU peak of the run as the engine will run
it, against the memory of the GPUs it gets as they are now (their total less what other processes hold).

The planner only makes plans that fit; a hand-written YAML, an imported one or a plan with overrides on top
did not meet the estimator until the trainer loaded the model and died of CUDA OOM. ``train``, ``train
--check`` and ``resume`` now ask it first, the way ``core.runs.host_memory`` checks pinned host memory and
``core.runs.disk_space`` the checkpoints::

    room = read_room(gpus)                      # Room (the cards, the tightest one's spec) or why not read
    check = check_gpu_memory(config, room, 2)   # GpuMemoryCheck: fits, tight, does_not_fit or unchecked

Nothing here imports torch: the estimator is arithmetic and the cards are read through NVML.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from core.i18n import Message

GIB = 1024**3
MIB = 1024**2
# NVML counts as used what the driver reserves on an idle card (a few hundred MiB: 0.6 GiB on an idle H200),
# which the estimator's CUDA context and margin already stand for. Memory used beyond the listed processes'
# by less than this is that reserve; more is held by processes NVML does not list (another container's).
RESERVED_SLACK_BYTES = GIB
# The keys of a run config the estimate reads (``core.estimate.run_plan``): a resume that changes none of them
# runs what the run already ran on its GPUs.
MEMORY_KEYS = frozenset({
    "model", "method", "precision", "pure_bf16", "gpus", "micro_batch_size", "gradient_accumulation", "max_seq_len",
    "gradient_checkpointing", "checkpoint_layers", "tiled_mlp", "zero_stage", "offload", "offload_activations",
    "optimizer", "attn", "ce_chunk_tokens", "fused_ce", "lora_rank", "lora_targets", "lora_dropout",
    "lora_dropout_fused", "lora_fold_dh", "lora_grouped", "lora_input_upcast", "lora_swiglu_db", "lora_swiglu_down",
    "lora_swiglu_fused", "qlora_reuse_dequantised", "qlora_upcast", "recompute_keep_lora_a", "recompute_skip_down",
    "rms_norm_rows"})
# Family of a GPU the estimator's table does not name, by compute capability (its CUDA context's size).
_FAMILIES = {9: "hopper", 8: "ampere", 7: "volta"}


@dataclass(frozen=True)
class CardRoom:
    """One GPU the run gets: ``gpu`` is the run's index (within ``CUDA_VISIBLE_DEVICES``), ``physical`` the GPU
    as nvidia-smi names it (its index or UUID: ``core.runs.gpus.physical_gpus``), what messages say."""

    gpu: int
    name: str
    total_bytes: int
    in_use_bytes: int
    capability: tuple[int, int] | None = None
    physical: str | None = None

    @property
    def available_bytes(self) -> int:
        return max(0, self.total_bytes - self.in_use_bytes)

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "name": self.name, "total_gib": _gib(self.total_bytes),
                "in_use_gib": _gib(self.in_use_bytes), "available_gib": _gib(self.available_bytes)}


@dataclass(frozen=True)
class Room:
    """The cards of a run and the estimator's spec of the one with the least memory free (its capacity
    that free memory): every rank holds the same, so the tightest card decides."""

    cards: tuple[CardRoom, ...]
    tightest: CardRoom
    spec: Any  # core.estimate.gpus.GpuSpec


@dataclass(frozen=True)
class GpuMemoryCheck:
    """The verdict on a run's GPU memory. ``verdict``: ``fits``, ``tight`` (under the free memory, within
    the estimator's margin), ``does_not_fit`` or ``unchecked`` (``message`` says why); ``fitting_micro_batch``:
    the largest micro_batch_size below the run's that fits, None where none does."""

    verdict: Literal["fits", "tight", "does_not_fit", "unchecked"]
    message: Message | None = None
    peak_gib: float | None = None
    margin_gib: float | None = None
    cards: tuple[CardRoom, ...] = ()
    fitting_micro_batch: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "peak_gib": None if self.peak_gib is None else round(self.peak_gib, 1),
                "margin_gib": None if self.margin_gib is None else round(self.margin_gib, 1),
                "gpus": [card.to_json() for card in self.cards], "fitting_micro_batch_size": self.fitting_micro_batch,
                "message": None if self.message is None else self.message.text()}


def _gib(value: float) -> float:
    return round(value / GIB, 1)


def in_use_bytes(used: int | None, processes: Any) -> int:
    """What other processes hold on a card: its listed processes' memory, or NVML's ``used`` where that is
    more than the driver's reserve above them (processes NVML does not list: another container's)."""
    listed = sum(int(p.used_memory_bytes or 0) for p in processes or ())
    used = int(used or 0)
    return used if used - listed > RESERVED_SLACK_BYTES else listed


def read_room(gpus: list[int], visible: str | None | Literal["ours"] = "ours", nvml: Any = None) -> Room | Message:
    """The memory of the run's GPUs ``gpus`` (indices within ``visible``: ``CUDA_VISIBLE_DEVICES``, "ours" for
    this process's) as NVML reads it now, or the Message saying why it cannot be read."""
    import os

    from core.hardware.nvml_backend import NvmlBackend
    from core.hardware.processes import RecordedProcessResolver
    from core.runs.gpus import VISIBLE_ENV, nvml_index, physical_gpus, uuid_indices

    if visible == "ours":
        visible = os.environ.get(VISIBLE_ENV)
    backend = NvmlBackend(nvml, processes=RecordedProcessResolver({}))  # the memory alone: no process look-up
    try:
        identities = backend.identities()
        reading = backend.read()
    finally:
        backend.close()
    if identities.error is not None or reading.error is not None:
        error = identities.error or reading.error
        return Message("runs.gpu_memory_no_nvml", reason=getattr(error, "message", "") or getattr(error, "reason", ""))
    by_index = {gpu.index: gpu for gpu in reading.gpus}
    capability = {gpu.index: gpu.compute_capability for gpu in identities.gpus}
    by_uuid = uuid_indices(identities.gpus)
    cards = []
    for gpu, name in zip(gpus, physical_gpus(list(gpus), visible), strict=True):
        index = nvml_index(name, by_uuid)
        snapshot = by_index.get(index) if index is not None else None
        if name.startswith("MIG-") or (snapshot is not None and snapshot.mig_enabled):
            return Message("runs.gpu_memory_mig", gpu=name)
        if snapshot is None or not snapshot.memory_total_bytes:
            return Message("runs.gpu_memory_unread", gpu=name)
        cards.append(CardRoom(gpu, snapshot.name or "GPU", int(snapshot.memory_total_bytes),
                              in_use_bytes(snapshot.memory_used_bytes, snapshot.processes), capability.get(index),
                              name))
    tightest = min(cards, key=lambda card: card.available_bytes)
    return Room(tuple(cards), tightest, card_spec(tightest))


def card_spec(card: CardRoom) -> Any:
    """The estimator's ``GpuSpec`` of ``card`` with its free memory as the capacity: the table's entry for its
    name, else one made from NVML's facts (bf16 from compute capability 8+; speed figures unused here)."""
    from core.estimate.gpus import GpuSpec, UnknownGpuError, find_gpu

    memory_mib = card.available_bytes // MIB
    try:
        return replace(find_gpu(card.name), memory_mib=memory_mib)
    except UnknownGpuError:
        major = card.capability[0] if card.capability else 8
        return GpuSpec(card.name, memory_mib, major >= 8, 1.0, 1.0, 1.0, _FAMILIES.get(major, "ampere"))


def check_gpu_memory(config: Any, room: Room | Message | None, num_gpus: int,
                     resume: int | None = None) -> GpuMemoryCheck | None:
    """The verdict on ``config`` (a ``RunConfig``: ``checkpoint_layers: auto`` resolved as ``prepare_run``
    resolves it, on the free memory; ``tiled_mlp: auto`` as the estimator tiles) over ``num_gpus`` GPUs (the
    world: ZeRO shards over every node's) against ``room``. None for a CPU run (``room`` None). A resume
    gives ``resume``, the samples per optimizer step its checkpoint trained with: it is told only ways that keep
    that number (it refuses another)."""
    if room is None:
        return None
    if isinstance(room, Message):
        return GpuMemoryCheck("unchecked", Message("runs.gpu_memory_unchecked", reason=room))
    from core.estimate import ArchitectureError, ModelNotFoundError, PlanError, estimate
    from core.estimate.checkpointing import resolve_checkpoint_layers
    from core.estimate.run_plan import plan_for_run

    try:
        layers = resolve_checkpoint_layers(config, room.spec, num_gpus)  # as prepare_run: the same function
        plan = plan_for_run(config, num_gpus, checkpoint_layers=None if layers in ("all", "auto") else int(layers))
        found = estimate(plan, room.spec)
    except (ArchitectureError, ModelNotFoundError, PlanError, OSError, ValueError, TypeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return GpuMemoryCheck("unchecked", Message("runs.gpu_memory_unchecked",
                                                   reason=Message("runs.gpu_memory_model_unknown", reason=reason)))
    verdict = found.verdict
    if verdict == "fits":
        return GpuMemoryCheck("fits", None, found.peak_gib, found.margin_gib, room.cards)
    # The way out at this config: the largest micro-batch that fits (checkpointing as auto would choose it)
    auto = str(getattr(config, "checkpoint_layers", "all")) in ("auto", "all")
    fitting: dict[int, float] = {}  # micro-batch size -> peak, of those below the run's that fit
    for batch in range(plan.micro_batch_size - 1, 0, -1):  # not monotone (MLP tiles): each one asked
        try:
            tried = estimate(replace(plan, micro_batch_size=batch, **({"checkpoint_layers": None} if auto else {})),
                             room.spec)
        except PlanError:
            continue
        if tried.fits:
            fitting[batch] = tried.peak_gib
    way: Message | str
    way, planner = _ways(config, plan, room, fitting, estimate, resume)
    if verdict == "tight" and not fitting:  # under the card: "not even 1 fits" would not be true
        way = ""
    tightest = room.tightest
    key = "runs.gpu_memory_short" if verdict == "does_not_fit" else "runs.gpu_memory_tight"
    used = (Message("runs.gpu_memory_in_use", in_use=f"{tightest.in_use_bytes / GIB:.1f}") if tightest.in_use_bytes
            else Message("runs.gpu_memory_none_in_use"))
    message = Message(key, peak=f"{found.peak_gib:.1f}", margin=f"{found.margin_gib:.1f}",
                      gpu=tightest.physical if tightest.physical is not None else tightest.gpu, name=tightest.name,
                      available=f"{tightest.available_bytes / GIB:.1f}", total=f"{tightest.total_bytes / GIB:.1f}",
                      used=used, way=way, plan=planner)
    suggested = (_kept(resume, fitting) or None) if resume else max(fitting, default=None)
    return GpuMemoryCheck(verdict, message, found.peak_gib, found.margin_gib, room.cards, suggested)


def _kept(total: int, fitting: dict[int, float]) -> int:
    """The largest fitting micro-batch that divides ``total`` (samples per optimizer step), 0 where none does."""
    return max(batch for batch in [*fitting, 0] if batch == 0 or total % batch == 0)


def _ways(config: Any, plan: Any, room: Room, fitting: dict[int, float], estimate: Any,
          resume: int | None = None) -> tuple[Message, Message]:
    """What makes the run fit, in concrete settings: the largest micro-batch that fits, and the largest that
    keeps the sequences per optimizer step with a gradient_accumulation where that is another one; where none
    fits, checkpointing or QLoRA if those do; then the planner's command. A resume (``resume``: the samples per
    step of its checkpoint) refuses another number of sequences per step: it is told only the ways that keep it."""
    import shlex

    from core.estimate import PlanError

    lines: list[Message] = []
    total = resume or plan.micro_batch_size * plan.grad_accum_steps
    if fitting:
        largest = max(fitting)
        kept = _kept(total, fitting)
        if kept == largest or (resume and kept):
            lines.append(Message("runs.gpu_memory_way_batch_accum", batch=kept, accum=total // kept, total=total,
                                 peak=f"{fitting[kept]:.1f}"))
        elif kept:
            lines.append(Message("runs.gpu_memory_way_batch_or_accum", batch=largest, peak=f"{fitting[largest]:.1f}",
                                 kept=kept, accum=total // kept, total=total))
        elif not resume:
            lines.append(Message("runs.gpu_memory_way_batch", batch=largest, peak=f"{fitting[largest]:.1f}"))
    if not lines:
        tries = []
        if not plan.gradient_checkpointing:
            tries.append(("gradient_checkpointing=true", {"gradient_checkpointing": True, "checkpoint_layers": None}))
        if plan.method == "lora":
            tries.append(("method=qlora", {"method": "qlora"}))
        for setting, change in tries:
            try:
                tried = estimate(replace(plan, micro_batch_size=1, **change), room.spec)
            except PlanError:
                continue
            if tried.fits:
                one = f"micro_batch_size=1 gradient_accumulation={total} " if resume else "micro_batch_size=1 "
                lines.append(Message("runs.gpu_memory_way_setting", setting=f"{one}{setting}"
                                     if plan.micro_batch_size > 1 else setting, peak=f"{tried.peak_gib:.1f}"))
                break
        if not lines:
            lines.append(Message("runs.gpu_memory_way_none"))
    model = str(getattr(config, "model", ""))
    gpus = getattr(config, "gpus", None)
    plan_command = f"tunedeck plan --model {shlex.quote(model)}" + (
        f" --gpus {','.join(str(card.gpu) for card in room.cards)}" if isinstance(gpus, list) else "")
    return lines[0], Message("runs.gpu_memory_way_plan", command=plan_command)
