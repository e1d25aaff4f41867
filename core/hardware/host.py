"""Readings of the machine around the GPUs (CPU, RAM, load, disk: the data root's and the hub caches'), through
psutil."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from core.hardware.snapshot import CacheDisk, HostSnapshot
from core.paths import data_root, nearest_existing_dir

# psutil's CPU % is the busy share since the previous call: the first sample needs a baseline this old.
CPU_SAMPLE_MIN_S = 0.2


class HostSampler(Protocol):
    def sample(self) -> HostSnapshot: ...


def download_caches() -> list[tuple[str, Path]]:
    """Where each hub's downloads go (``MODELSCOPE_CACHE``; ``HF_HUB_CACHE`` / ``HF_HOME``), hub first."""
    from core.hub.hf_source import hf_hub_cache
    from core.hub.modelscope_source import modelscope_cache_root

    return [("modelscope", modelscope_cache_root()), ("hf", hf_hub_cache())]


def cache_variable(hub: str) -> str:
    """The environment variable that moves ``hub``'s download cache: ``MODELSCOPE_CACHE``; ``HF_HUB_CACHE`` where it
    is set (it wins), else ``HF_HOME``."""
    if hub == "hf":
        return "HF_HUB_CACHE" if os.environ.get("HF_HUB_CACHE") else "HF_HOME"
    return "MODELSCOPE_CACHE"


def cache_disks(data_dir: Path, caches: list[tuple[str, Path]]) -> tuple[CacheDisk, ...]:
    """The file systems of the hub ``caches`` other than ``data_dir``'s (an existing folder), one entry per
    file system with the hubs it holds: a download fills that disk, not the data root's. A cache whose
    folder (or nearest existing parent) cannot be read is left out. None (``()``) where ``data_dir`` itself cannot be
    read: its file system is not known, so no cache can be said to be on another one (every one was)."""
    try:
        data_dev = os.stat(data_dir).st_dev
    except OSError:
        return ()
    found: dict[int, tuple[list[str], Path]] = {}
    for hub, path in caches:
        try:
            folder = nearest_existing_dir(path)
            dev = os.stat(folder).st_dev
        except OSError:  # a folder on the way that may not be searched (Permission denied)
            continue
        if dev == data_dev:
            continue
        found.setdefault(dev, ([], folder))[0].append(hub)
    disks = []
    for hubs, folder in found.values():
        try:
            usage = shutil.disk_usage(folder)
            total, free = usage.total, usage.free
        except OSError:
            total = free = None
        disks.append(CacheDisk(hubs=tuple(hubs), path=str(folder), total_bytes=total, free_bytes=free))
    return tuple(disks)


class LiveHostSampler:
    """Samples this machine; CPU % is measured between consecutive samples."""

    def __init__(
        self,
        disk_path: Callable[[], Path] = data_root,
        caches: Callable[[], list[tuple[str, Path]]] = download_caches,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        import psutil

        self._psutil = psutil
        self._disk_path = disk_path
        self._caches = caches
        self._sleep = sleep
        self._clock = clock
        self._first_sample = True
        # Start the CPU % baseline now, so that the first sample has an interval to measure.
        psutil.cpu_percent(interval=None)
        psutil.cpu_percent(interval=None, percpu=True)
        self._baseline_at = clock()

    def sample(self) -> HostSnapshot:
        """One reading of the host; the first call may wait up to CPU_SAMPLE_MIN_S for a valid CPU %."""
        psutil = self._psutil
        if self._first_sample:
            wait = CPU_SAMPLE_MIN_S - (self._clock() - self._baseline_at)
            if wait > 0:
                self._sleep(wait)
            self._first_sample = False
        cpu = psutil.cpu_percent(interval=None)
        per_core = tuple(float(v) for v in psutil.cpu_percent(interval=None, percpu=True))
        memory = psutil.virtual_memory()
        try:
            load: tuple[float, ...] = tuple(float(v) for v in os.getloadavg())
        except (AttributeError, OSError):
            load = ()
        wanted = self._disk_path()
        disk_error = None
        try:
            disk_dir = nearest_existing_dir(wanted)
            usage = shutil.disk_usage(disk_dir)
            disk_total, disk_free = usage.total, usage.free
        except OSError as exc:  # a folder on its way that may not be searched: said, not a failed sample
            disk_dir = Path(wanted).expanduser().absolute()
            disk_total = disk_free = None
            disk_error = exc.strerror or str(exc)
        return HostSnapshot(
            hostname=socket.gethostname() or None,
            cpu_percent=float(cpu),
            cpu_per_core_percent=per_core,
            cpu_count_logical=psutil.cpu_count(logical=True),
            cpu_count_physical=psutil.cpu_count(logical=False),
            memory_total_bytes=int(memory.total),
            memory_used_bytes=int(memory.total - memory.available),
            memory_available_bytes=int(memory.available),
            load_average=load,
            disk_path=str(disk_dir),
            disk_total_bytes=disk_total,
            disk_free_bytes=disk_free,
            cache_disks=() if disk_error else cache_disks(disk_dir, self._caches()),
            disk_error=disk_error,
        )


class RecordedHostSampler:
    """Replays the host of a recording (so a fake 8-GPU box shows its own 128-core host)."""

    def __init__(self, host: HostSnapshot) -> None:
        self._host = host

    def sample(self) -> HostSnapshot:
        return self._host
