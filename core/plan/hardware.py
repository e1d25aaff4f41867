"""What the plan is for: GPUs of this box (or a box you do not have), host RAM, disk, price."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.errors import EXIT_USAGE, TunedeckError
from core.estimate import GpuSpec, UnknownGpuError, find_gpu, parse_hardware
from core.i18n import t

if TYPE_CHECKING:
    from core.hardware.snapshot import CacheDisk

GIB = 1024**3
# Memory other processes hold on a GPU above which the wizard's hardware step names it: an idle GPU with a
# process's CUDA context on it holds about 0.5-1.6 GiB (the recordings' idle H200s), which plans absorb.
BUSY_FLOOR_GIB = 2.0
# The CPU as a pseudo-GPU, so that the estimator sizes a CPU-only run (the tiny model on a laptop):
# memory is the host's RAM, no bf16, a modest fp32 throughput.
CPU_FP32_TFLOPS = 0.2


class HardwareError(TunedeckError, ValueError):
    """A hardware description that cannot be read (the message says what is accepted)."""

    exit_code = EXIT_USAGE


def read_price(text: str) -> float:
    """The price per GPU-hour ``text`` says: a finite number, at least 0 (a negative price made a negative
    cost, ``nan`` none at all). The one check of ``plan --price-per-gpu-hour`` and the wizard's field; raises
    argparse.ArgumentTypeError with what is wrong (``got -3.0; must be at least 0``)."""
    from core.config.checks import cli_number

    return float(cli_number(float, minimum=0)(text))


@dataclass(frozen=True)
class HardwareTarget:
    """The GPUs a plan may use. ``gpu`` is None for a CPU-only box."""

    gpu: GpuSpec | None
    count: int
    host_ram_gib: float | None = None
    disk_free_gib: float | None = None
    price_per_gpu_hour: float | None = None
    detected: bool = False  # True: this box (launch and probe possible)
    gpu_indices: tuple[int, ...] | None = None  # the chosen GPUs of this box, the freest first
    # GiB other processes hold now on each of ``gpu_indices`` (None: not this box, or not read): a plan for this
    # box must fit in what they leave (``free_gib``); a typed target (``1xH200``) is the whole card
    in_use_gib: tuple[float, ...] | None = None
    # This box's hub download caches on other file systems than the data root's (``HostSnapshot.cache_disks``):
    # a model's download fills theirs, the checkpoints (under the data root's runs) ``disk_free_gib``'s
    cache_disks: tuple[CacheDisk, ...] = ()

    @property
    def cpu_only(self) -> bool:
        return self.gpu is None

    def spec(self) -> GpuSpec:
        """The GpuSpec the estimator sizes against (a pseudo-spec for the CPU)."""
        if self.gpu is not None:
            return self.gpu
        ram_mib = int((self.host_ram_gib or 16.0) * 1024)
        return GpuSpec("CPU", ram_mib, False, 0.0, 0.0, CPU_FP32_TFLOPS, "cpu")

    def busy(self, num_gpus: int) -> tuple[int, float] | None:
        """(index, GiB in use) of the busiest of the first ``num_gpus`` chosen GPUs (those a plan of that many
        takes), or None when nothing is known of their use."""
        if not self.in_use_gib or not self.gpu_indices:
            return None
        used = list(zip(self.gpu_indices, self.in_use_gib, strict=False))[: max(1, num_gpus)]
        return max(used, key=lambda pair: pair[1])

    def held_by_others(self, num_gpus: int) -> tuple[int, float] | None:
        """``busy``, on this box only and where the busiest GPU holds more than an idle one does
        (``BUSY_FLOOR_GIB``): what the plan's memory line and its method reason speak of; None otherwise."""
        busiest = self.busy(num_gpus) if self.detected else None
        return busiest if busiest is not None and busiest[1] >= BUSY_FLOOR_GIB else None

    def free_gib(self, num_gpus: int) -> float | None:
        """The memory the busiest of the first ``num_gpus`` chosen GPUs has free now (None: not known)."""
        busiest = self.busy(num_gpus)
        if busiest is None or self.gpu is None:
            return None
        return max(0.0, self.gpu.memory_gib - busiest[1])

    def usable_now_gib(self, num_gpus: int, margin_gib: float) -> float | None:
        """What a plan of ``num_gpus`` may take on the busiest of its GPUs now, its safety margin kept: what other
        processes leave free less ``margin_gib``, where they hold more than an idle GPU does (``held_by_others``);
        None when nothing is held and the whole card is the room (a typed target, an idle box)."""
        free = self.free_gib(num_gpus)
        if self.held_by_others(num_gpus) is None or free is None:
            return None
        return max(0.0, free - margin_gib)

    def cache_disk(self, hub: str) -> CacheDisk | None:
        """The disk ``hub``'s download cache is on where that is not the data root's (None: it is, or not known)."""
        return next((disk for disk in self.cache_disks if hub in disk.hubs), None)

    def describe(self) -> str:
        """``2xA100-80GB`` / ``cpu``: also what ``--hardware`` accepts."""
        return "cpu" if self.gpu is None else f"{self.count}x{self.gpu.name}"

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": None if self.gpu is None else self.gpu.name,
            "count": self.count,
            "memory_gib": None if self.gpu is None else round(self.gpu.memory_gib, 2),
            "bf16": None if self.gpu is None else self.gpu.bf16,
            "host_ram_gib": None if self.host_ram_gib is None else round(self.host_ram_gib, 1),
            "disk_free_gib": None if self.disk_free_gib is None else round(self.disk_free_gib, 1),
            "price_per_gpu_hour": self.price_per_gpu_hour,
            "detected": self.detected,
            "gpu_indices": None if self.gpu_indices is None else list(self.gpu_indices),
            "in_use_gib": None if self.in_use_gib is None else [round(g, 2) for g in self.in_use_gib],
            "cache_disks": [{"hubs": list(disk.hubs), "path": disk.path,
                             "free_gib": None if disk.free_bytes is None else round(disk.free_bytes / GIB, 1)}
                            for disk in self.cache_disks],
        }


def parse_target(text: str, price_per_gpu_hour: float | None = None,
                 host_ram_gib: float | None = None, disk_free_gib: float | None = None) -> HardwareTarget:
    """``"8xA100-80GB"`` or ``"cpu"``: hardware you plan for (not necessarily this box)."""
    if text.strip().lower() in ("cpu", "none", "0"):
        return HardwareTarget(None, 1, host_ram_gib, disk_free_gib, price_per_gpu_hour)
    try:
        count, gpu = parse_hardware(text)
    except UnknownGpuError as exc:
        raise HardwareError(str(exc)) from exc
    return HardwareTarget(gpu, count, host_ram_gib, disk_free_gib, price_per_gpu_hour)


def on_this_host(target: HardwareTarget, detected: HardwareTarget | None) -> HardwareTarget:
    """A CPU target typed by hand (``cpu``) is this box's CPU: its RAM and free disk are this box's (what
    the hardware step and ``tunedeck hardware`` show), not a guess. What the target already says wins;
    a GPU target is hardware you may not have, and is returned as it is."""
    from dataclasses import replace

    if not target.cpu_only or detected is None:
        return target
    return replace(target,
                   host_ram_gib=target.host_ram_gib if target.host_ram_gib is not None else detected.host_ram_gib,
                   disk_free_gib=target.disk_free_gib if target.disk_free_gib is not None
                   else detected.disk_free_gib,
                   cache_disks=target.cache_disks if target.disk_free_gib is not None else detected.cache_disks)


def spec_for_gpu_name(name: str | None, memory_bytes: int | None) -> GpuSpec:
    """The table entry for an NVML name; an unknown GPU gets its real memory and Ampere-like speed."""
    try:
        return find_gpu(name or "")
    except UnknownGpuError:
        memory_mib = int((memory_bytes or 0) / 1024**2) or 16384
        return GpuSpec(name or "GPU", memory_mib, True, 150.0, 150.0, 19.5, "ampere")


def target_from_snapshot(snapshot: Any, indices: list[int] | None = None,
                         price_per_gpu_hour: float | None = None) -> HardwareTarget:
    """This box from a ``BoxSnapshot``: its GPUs (``indices`` picks some), host RAM and free disk."""
    host = snapshot.host
    ram = host.memory_total_bytes / GIB if host.memory_total_bytes else None
    disk = host.disk_free_bytes / GIB if host.disk_free_bytes is not None else None
    caches = tuple(getattr(host, "cache_disks", ()))
    gpus = list(snapshot.gpus)
    if indices is not None:
        known = {g.index for g in gpus}
        missing = [i for i in indices if i not in known]
        if missing and not known:  # "(it has: -)" and "chosen by index" said nothing to a box with no GPU
            raise HardwareError(t("plan.error.no_gpu_here", indices=", ".join(map(str, missing))))
        if missing:
            raise HardwareError(t("plan.error.no_such_gpu", indices=", ".join(map(str, missing)),
                                  known=", ".join(str(i) for i in sorted(known)) or "-"))
        gpus = [g for g in gpus if g.index in indices]
        lost = [g.index for g in gpus if getattr(g, "lost", False)]
        if lost:
            raise HardwareError(t("plan.error.gpu_lost", indices=", ".join(map(str, lost))))
    else:  # the freest first: a plan that takes fewer than all takes them (``run_config_values``)
        # A lost GPU (fallen off the bus) reads no memory in use: it would come first, as the freest.
        gpus = [g for g in gpus if not getattr(g, "lost", False)]
        gpus.sort(key=lambda g: g.memory_used_bytes or 0)
    if not gpus:
        return HardwareTarget(None, 1, ram, disk, price_per_gpu_hour, detected=True, gpu_indices=(),
                              cache_disks=caches)
    first = gpus[0]
    spec = spec_for_gpu_name(first.name, first.memory_total_bytes)
    return HardwareTarget(spec, len(gpus), ram, disk, price_per_gpu_hour, detected=True,
                          gpu_indices=tuple(g.index for g in gpus),
                          in_use_gib=tuple((g.memory_used_bytes or 0) / GIB for g in gpus), cache_disks=caches)


def parse_gpu_indices(text: str) -> list[int]:
    """``"0,1"`` -> [0, 1]."""
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError as exc:
        raise HardwareError(t("plan.error.gpu_indices", value=text)) from exc
