"""Which GPUs a run gets: a light NVML count, no torch import (the CLI must stay quick)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from core.i18n import t


def visible_gpu_count(nvml: Any = None) -> int:
    """GPUs this process may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES; 0 without a driver.

    NVML is asked through the hardware backend (``nvml`` stands in for ``pynvml`` in tests)."""
    from core.hardware.nvml_backend import read_gpu_identities

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        if not entries:
            return 0
    found = read_gpu_identities(nvml)
    if found.error is not None:
        if found.error.reason == "binding_missing":
            return _torch_gpu_count()  # no nvidia-ml-py: ask CUDA itself (slower: imports torch)
        return 0  # no driver, no permission, no GPUs: a CPU box as far as we are concerned
    count = len(found.gpus)
    if visible is not None:
        return min(count, len(entries))
    return count


VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


def lost_gpus(nvml: Any = None, visible: str | None = "ours") -> list[int]:
    """The GPUs NVML calls lost (GPU_IS_LOST: fallen off the bus, Xid 79), as a run's ``gpus`` count them:
    indices within ``CUDA_VISIBLE_DEVICES`` (``visible``: that variable, "ours" for this process's). An entry by
    UUID matches where NVML still knows the lost GPU's UUID; a GPU lost before NVML read its UUID (or its PCI
    bus id: nothing of it is read) cannot be matched so, and a ``GPU-…`` / ``MIG-…`` entry that names none of
    the GPUs NVML reaches counts as lost while such a GPU is: it names no GPU a trainer could use here, and
    the one that went is the GPU it named (the run trained on it). ``visible_gpu_count`` counts them (they keep
    their index); a run must not be given one: its trainer would hang or fail with a CUDA error far from the
    cause. [] where NVML cannot say."""
    from core.hardware.nvml_backend import read_gpu_identities

    if visible == "ours":
        visible = os.environ.get(VISIBLE_ENV)
    entries = [v.strip() for v in (visible or "").split(",") if v.strip() and v.strip() != "-1"]
    if visible is not None and not entries:
        return []
    found = read_gpu_identities(nvml)
    lost = {g.index for g in found.gpus if g.lost}
    if found.error is not None or not lost:
        return []
    if visible is None:
        return sorted(lost)
    by_uuid = uuid_indices(found.gpus)
    unread = any(g.lost and not g.uuid for g in found.gpus)  # lost before its UUID was read
    return [i for i, entry in enumerate(entries)
            if nvml_index(entry, by_uuid) in lost or (unread and _names_no_gpu(entry, by_uuid))]


def _names_no_gpu(entry: str, by_uuid: Mapping[str, int]) -> bool:
    """A ``GPU-…`` / ``MIG-…`` entry of ``CUDA_VISIBLE_DEVICES`` that no UUID NVML read is, nor starts with."""
    return not entry.isdigit() and not any(uuid.startswith(entry) for uuid in by_uuid)


def physical_gpus(gpus: Sequence[int], visible: str | None) -> list[str]:
    """The GPUs that indices ``gpus`` name under ``CUDA_VISIBLE_DEVICES=visible``: the entry each counts to
    (a physical index, or a ``GPU-…`` / ``MIG-…`` UUID as given), or the index itself where ``visible`` is
    unset or too short. Run A under ``2,3`` on its GPU 0 and run B unrestricted on GPU 2 both say ``"2"``."""
    given = [v.strip() for v in (visible or "").split(",") if v.strip()]
    if not given:
        return [str(g) for g in gpus]
    return [given[g] if g < len(given) else str(g) for g in gpus]


def recorded_visible(record: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(known, ``CUDA_VISIBLE_DEVICES`` the run was launched under) from its run.json: its ``env`` (what
    ``create_run`` recorded) says it, absent there when it was unset; a run.json without ``env`` does not
    know (False, None)."""
    env = record.get("env")
    if not isinstance(env, dict):
        return False, None
    value = env.get(VISIBLE_ENV)
    return True, value if isinstance(value, str) else None


def run_physical_gpus(record: Mapping[str, Any], unrecorded: str | None = None) -> list[str]:
    """The GPUs a run uses, as this box names them: run.json's ``gpus`` indices mapped through the
    ``CUDA_VISIBLE_DEVICES`` its ``env`` recorded at launch (``physical_gpus``: a physical index as NVML
    numbers them, or a ``GPU-…`` / ``MIG-…`` UUID as given). A run.json without ``env`` counts within
    ``unrecorded``. The mapping the supervisor applies, so the GPUs the trainer holds."""
    gpus = [int(g) for g in record.get("gpus") or []]
    known, visible = recorded_visible(record)
    return physical_gpus(gpus, visible if known else unrecorded)


def run_gpu_indices(record: Mapping[str, Any], box: Sequence[Any] = ()) -> list[int]:
    """The NVML indices (those of a ``GpuSnapshot``, which ``CUDA_VISIBLE_DEVICES`` does not renumber) of
    the GPUs a run uses (``run_physical_gpus``): a UUID entry is the index of the GPU of ``box`` (GPU
    snapshots) with that UUID, or a start of it only one UUID has (as CUDA takes), or holding that MIG device; one ``box``
    does not list is left out. Run.json ``gpus`` [0] under ``CUDA_VISIBLE_DEVICES=2,3`` is [2]."""
    by_uuid = uuid_indices(box)
    indices: list[int] = []
    for name in run_physical_gpus(record):
        index = nvml_index(name, by_uuid)
        if index is not None and index not in indices:
            indices.append(index)
    return indices


def uuid_indices(box: Sequence[Any]) -> dict[str, int]:
    """The NVML index of each UUID of ``box`` (GPU snapshots or ``GpuIdentity``): a GPU's own, and its MIG
    devices', which count as the GPU that holds them."""
    by_uuid: dict[str, int] = {}
    for gpu in box:
        for uuid in [getattr(gpu, "uuid", None)] + [m.uuid for m in getattr(gpu, "mig_instances", ())]:
            if uuid:
                by_uuid[uuid] = gpu.index
    return by_uuid


def nvml_index(name: str, by_uuid: Mapping[str, int]) -> int | None:
    """The NVML index a ``physical_gpus`` entry names: a physical index as it is, a ``GPU-…`` / ``MIG-…``
    UUID (or a start of it that only one UUID has, as CUDA takes it) through ``by_uuid`` (``uuid_indices``);
    None where none matches, or where the start is more than one UUID's (CUDA names no device by it)."""
    if name.isdigit():
        return int(name)
    if name in by_uuid:
        return by_uuid[name]
    matches = [i for u, i in by_uuid.items() if u.startswith(name)]
    return matches[0] if len(matches) == 1 else None


def resolve_gpus(requested: object, available: int, lost: Sequence[int] = ()) -> list[int]:
    """``gpus`` from the config (all / a count / a list of indices) as indices on this box.

    ``lost``: indices of GPUs NVML calls lost (``lost_gpus``): all or a count leaves them out (``gpus_left_out``
    says which it left), a list that names one is refused, as the planner refuses it.
    Raises ValueError with a message naming what is missing when the request cannot be met.
    """
    usable = [i for i in range(available) if i not in lost]
    if requested in (None, "all"):
        if available and not usable:
            raise ValueError(lost_message(lost))
        return usable
    if isinstance(requested, bool):
        raise ValueError(t("runs.gpus_bad_value", given=repr(requested)))
    if isinstance(requested, int):
        if requested > available:
            raise ValueError(t("runs.gpus_too_many", wanted=requested, available=available))
        if requested > len(usable):
            raise ValueError(t("runs.gpus_too_many_lost", wanted=requested, usable=len(usable),
                               lost=lost_message(lost)))
        return usable[:requested]
    indices = [int(i) for i in requested]  # type: ignore[union-attr]
    missing = [i for i in indices if i >= available or i < 0]
    if missing:
        raise ValueError(t("runs.gpus_index_missing", index=missing[0], available=available))
    named = [i for i in indices if i in lost]
    if named:
        raise ValueError(lost_message(named))
    return indices


def gpus_left_out(requested: object, lost: Sequence[int]) -> list[int]:
    """The lost GPUs that all or a count (``resolve_gpus``) stepped over; none for a list (it is refused)."""
    if requested in (None, "all"):
        return sorted(lost)
    if isinstance(requested, int) and not isinstance(requested, bool) and requested > 0:
        skipped: list[int] = []
        for index in range(requested + len(lost)):  # the first ``requested`` usable GPUs lie within these
            if index in lost:
                skipped.append(index)
            elif index - len(skipped) + 1 >= requested:
                break
        return skipped
    return []


def lost_message(lost: Sequence[int | str]) -> str:
    """The planner's words for a lost GPU (what it is, and the way out: other GPUs, or a reboot)."""
    return t("plan.error.gpu_lost", indices=", ".join(map(str, lost)))


def _torch_gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
