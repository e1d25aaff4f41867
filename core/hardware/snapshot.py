"""What the box looks like at one instant: GPUs, their processes, the host, the topology.

Every value NVML or the OS cannot give (unsupported on this GPU, no permission, not applicable) is
``None`` — the "N/A" value — and serialises as JSON ``null``; readers never get an exception for a
missing field. The JSON form is documented in ``core/hardware/SCHEMA.md`` and is also the format of
the recordings that the fake NVML replays (``tests/fixtures/gpus/*.json``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Union

from core.errors import EXIT_USAGE, TunedeckError

SCHEMA_VERSION = 1

# PCIe-path levels between two GPUs, as `nvidia-smi topo -m` names them.
TOPOLOGY_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")


class SnapshotFormatError(TunedeckError, ValueError):
    """A snapshot/recording JSON that does not follow SCHEMA.md; the message says where."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class GpuProcess:
    """A compute process NVML reports on a GPU.

    ``visible`` is False when the pid NVML gives (a pid of the host's namespace, inside a container) is
    absent from this pid namespace or belongs to a process here that does not use a GPU; ``user``,
    ``command`` and the host-side readings are then ``None`` rather than another process's.
    ``hidden_reason`` says which case. ``started_at`` (the process's start, Unix time) tells this
    process from a later one that reuses its pid; ``cpu_percent`` is its CPU use since the previous
    poll (100 = one core; None on the first poll), ``host_memory_bytes`` its resident memory (RSS).
    """

    pid: int
    used_memory_bytes: int | None = None
    visible: bool = True
    user: str | None = None
    command: str | None = None
    hidden_reason: str | None = None  # "not_in_namespace" | "not_a_gpu_process"
    started_at: float | None = None
    cpu_percent: float | None = None
    host_memory_bytes: int | None = None


@dataclass(frozen=True)
class MigInstance:
    """One MIG device of a GPU in MIG mode."""

    index: int
    uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU at one instant (static facts and the latest readings)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    utilization_gpu_pct: int | None = None  # share of time a kernel ran (nvidia-smi "GPU-Util")
    utilization_memory_pct: int | None = None  # share of time device memory was read or written
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    clock_sm_mhz: int | None = None
    clock_sm_max_mhz: int | None = None
    clock_memory_mhz: int | None = None
    clock_memory_max_mhz: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    mig_enabled: bool | None = None
    mig_instances: tuple[MigInstance, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    # NVML answers GPU_IS_LOST for it (fallen off the bus, Xid 79): no reading, no process list (an empty
    # ``processes`` then says nothing about what ran on it); only a reboot brings it back.
    lost: bool = False
    # False where NVML would not list its processes (not supported, no permission: a MIG GPU for a user who is
    # not root): ``processes`` is then empty for want of a list, not because the GPU is free.
    processes_known: bool = True

    @property
    def memory_free_bytes(self) -> int | None:
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return max(0, self.memory_total_bytes - self.memory_used_bytes)

    @property
    def memory_used_fraction(self) -> float | None:
        if not self.memory_total_bytes or self.memory_used_bytes is None:
            return None
        return self.memory_used_bytes / self.memory_total_bytes


@dataclass(frozen=True)
class CacheDisk:
    """A hub's download cache (where ``models download`` writes) on another file system than tunedeck's data
    root: its free space is not the data root's. ``hubs``: the hubs whose caches it holds ("modelscope",
    "hf"); ``path``: the first one's cache root, or its nearest existing parent."""

    hubs: tuple[str, ...] = ()
    path: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None


@dataclass(frozen=True)
class HostSnapshot:
    """The machine around the GPUs: CPU, RAM, load, disk under tunedeck's data root (and the hub caches'
    disks where they are other file systems)."""

    hostname: str | None = None
    cpu_percent: float | None = None
    cpu_per_core_percent: tuple[float, ...] = ()
    cpu_count_logical: int | None = None
    cpu_count_physical: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_available_bytes: int | None = None
    load_average: tuple[float, ...] = ()  # 1, 5, 15 minutes; empty where the OS has none
    disk_path: str | None = None  # the data root, or its nearest existing parent
    disk_total_bytes: int | None = None
    disk_free_bytes: int | None = None
    cache_disks: tuple[CacheDisk, ...] = ()  # none where every hub cache is on the data root's file system
    # Why the data root (``disk_path``) could not be read (``Permission denied``): its disk is not known, and
    # no hub cache is said to be on another one. None where it read.
    disk_error: str | None = None


@dataclass(frozen=True)
class Topology:
    """How GPUs are linked, pair by pair, in the order of ``gpus`` (GPU indices).

    ``pcie[i][j]`` is the PCIe-path level ("PIX", "PXB", "PHB", "NODE", "SYS"; "X" on the diagonal;
    None where NVML cannot tell); ``nvlink_direct[i][j]`` counts active NVLinks from GPU i straight to
    GPU j; ``nvswitch_links[i]`` counts GPU i's active NVLinks into NVSwitches, which reach every other
    GPU that also has some (HGX boards).
    """

    gpus: tuple[int, ...] = ()
    pcie: tuple[tuple[str | None, ...], ...] = ()
    nvlink_direct: tuple[tuple[int, ...], ...] = ()
    nvswitch_links: tuple[int, ...] = ()

    def nvlink_count(self, i: int, j: int) -> int:
        """Active NVLinks usable between the i-th and j-th GPU (direct plus through NVSwitches)."""
        if i == j:
            return 0
        direct = self.nvlink_direct[i][j] if self.nvlink_direct else 0
        through_switch = min(self.nvswitch_links[i], self.nvswitch_links[j]) if self.nvswitch_links else 0
        return direct + through_switch

    def label(self, i: int, j: int) -> str:
        """The cell of ``nvidia-smi topo -m``: "X", "NV<n>", a PCIe level, or "N/A"."""
        if i == j:
            return "X"
        links = self.nvlink_count(i, j)
        if links:
            return f"NV{links}"
        return (self.pcie[i][j] if self.pcie else None) or "N/A"

    def matrix(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(self.label(i, j) for j in range(len(self.gpus))) for i in range(len(self.gpus)))


@dataclass(frozen=True)
class NvmlUnavailable:
    """Why there are no GPU readings, with what to do about it in ``message``.

    ``reason`` is stable for programs: "library_not_found", "driver_not_loaded", "no_permission",
    "driver_mismatch", "no_gpus", "nvml_error".
    """

    reason: str
    message: str
    nvml_code: int | None = None


@dataclass(frozen=True)
class BoxSnapshot:
    """One poll of the whole box; shared, read-only, by every consumer."""

    taken_at: float  # Unix time, seconds
    host: HostSnapshot
    gpus: tuple[GpuSnapshot, ...] = ()
    topology: Topology | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # e.g. "13.0", the CUDA version the driver supports
    nvml_error: NvmlUnavailable | None = None
    synthetic: bool = False  # True in hand-made or derived recordings, never in real ones
    schema: int = SCHEMA_VERSION

    @property
    def pid_namespace_mismatch(self) -> bool:
        """True when NVML reported a pid that this pid namespace cannot show (containers)."""
        return any(not p.visible for gpu in self.gpus for p in gpu.processes)

    def gpu(self, index: int) -> GpuSnapshot | None:
        return next((g for g in self.gpus if g.index == index), None)

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready dict of SCHEMA.md (derived fields included for readers)."""
        data = {"schema": self.schema, **_encode(self)}
        data["pid_namespace_mismatch"] = self.pid_namespace_mismatch
        if self.topology is not None:
            data["topology"]["matrix"] = [list(row) for row in self.topology.matrix()]
        return data

    @classmethod
    def from_json(cls, data: Any, where: str = "snapshot") -> BoxSnapshot:
        """Rebuild a snapshot from ``to_json()`` output; derived and unknown keys are ignored."""
        if not isinstance(data, dict):
            raise SnapshotFormatError(f"{where}: expected a JSON object")
        schema = data.get("schema", SCHEMA_VERSION)
        if not isinstance(schema, int) or schema > SCHEMA_VERSION:
            raise SnapshotFormatError(
                f"{where}: schema {schema!r} is newer than this tunedeck reads ({SCHEMA_VERSION}); "
                "update tunedeck"
            )
        return _decode(cls, data, where)


def load_snapshot(path: Path) -> BoxSnapshot:
    """Read a recording (the output of ``tunedeck gpus --json``) from ``path``."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SnapshotFormatError(f"{path}: cannot read GPU recording ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise SnapshotFormatError(f"{path}: not valid JSON ({exc})") from exc
    return BoxSnapshot.from_json(raw, where=str(path))


# --- generic codec over the dataclasses above ---------------------------------------------------------


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))


def _decode(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return _decode(inner, value, where)
    if origin is tuple:
        if not isinstance(value, list):
            raise SnapshotFormatError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        raise TypeError(f"unsupported tuple type {tp}")  # a programming error in this module
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SnapshotFormatError(f"{where}: expected a JSON object, got {value!r}")
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _decode(_hints(tp)[f.name], value[f.name], f"{where}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SnapshotFormatError(f"{where}: key '{f.name}' is missing")
        return tp(**kwargs)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool):
        if not isinstance(value, tp) or (tp is not bool and isinstance(value, bool)):
            raise SnapshotFormatError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    raise TypeError(f"unsupported field type {tp}")


__all__ = [
    "SCHEMA_VERSION",
    "TOPOLOGY_LEVELS",
    "BoxSnapshot",
    "CacheDisk",
    "GpuProcess",
    "GpuSnapshot",
    "HostSnapshot",
    "MigInstance",
    "NvmlUnavailable",
    "SnapshotFormatError",
    "Topology",
    "load_snapshot",
]
