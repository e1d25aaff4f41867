"""Who owns a pid that NVML reports, without trusting it blindly.

NVML returns pids of the host's pid namespace. Inside a container the same number is either absent
here or belongs to a different, unrelated process; showing that process's user and command would be
wrong. A process is shown only when it exists here and (where /proc lets us look) has the CUDA driver
or an NVIDIA device mapped; otherwise it is marked ``visible=False`` with the reason.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from core.hardware.snapshot import GpuProcess
from core.secrets import scrub_argv

# Substrings of /proc/<pid>/maps lines that only a process using a GPU has.
GPU_MAPPING_MARKERS = ("/dev/nvidia", "libcuda.so")

NOT_IN_NAMESPACE = "not_in_namespace"
NOT_A_GPU_PROCESS = "not_a_gpu_process"


def redact_command(argv: list[str]) -> str:
    """The command line with secret values (``--hub-token X``, ``--api_key=X``, ``hf_…``) masked."""
    return " ".join(scrub_argv(argv))


class ProcessResolver(Protocol):
    def resolve(self, pid: int, used_memory_bytes: int | None) -> GpuProcess: ...

    def forget_except(self, pids: set[int]) -> None: ...


def maps_show_gpu_use(pid: int) -> bool | None:
    """Whether /proc/<pid>/maps shows a GPU mapping; None where it cannot be read (other user, no /proc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            return any(marker in line for line in handle for marker in GPU_MAPPING_MARKERS)
    except OSError:  # another user's process, or it just exited: cannot tell
        return None


class LiveProcessResolver:
    """Resolves pids against this machine's pid namespace with psutil; caches per process lifetime.

    Who a process is (user, command, whether it uses a GPU) is read once per process; what it uses
    (CPU since the previous poll, resident memory) is read at every poll, from /proc through psutil.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        import psutil

        self._psutil = psutil
        self._clock = clock
        # (pid, create_time) -> resolved fields; a pid reused by a new process gets a new key.
        self._cache: dict[tuple[int, float], GpuProcess] = {}
        # (pid, create_time) -> (CPU seconds used, clock) at the previous poll, for CPU %.
        self._cpu_seen: dict[tuple[int, float], tuple[float, float]] = {}

    def resolve(self, pid: int, used_memory_bytes: int | None) -> GpuProcess:
        psutil = self._psutil
        started: float | None
        try:
            proc = psutil.Process(pid)
            started = proc.create_time()
            key = (pid, started)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError):
            return GpuProcess(pid, used_memory_bytes, visible=False, hidden_reason=NOT_IN_NAMESPACE)
        except psutil.AccessDenied:
            key = (pid, 0.0)
            proc = None
            started = None
        cached = self._cache.get(key)
        if cached is None:
            cached = self._inspect(pid, proc)
            self._cache[key] = cached
        if not cached.visible:
            return GpuProcess(pid, used_memory_bytes, visible=False, hidden_reason=cached.hidden_reason)
        cpu, rss = self._usage(key, proc)
        return GpuProcess(
            pid,
            used_memory_bytes,
            visible=True,
            user=cached.user,
            command=cached.command,
            started_at=started,
            cpu_percent=cpu,
            host_memory_bytes=rss,
        )

    def _usage(self, key: tuple[int, float], proc: Any | None) -> tuple[float | None, int | None]:
        """CPU % since this process's previous reading (None the first time) and its RSS in bytes."""
        if proc is None:
            return None, None
        psutil = self._psutil
        try:
            with proc.oneshot():  # one read of /proc/<pid>/stat for both
                times = proc.cpu_times()
                rss = int(proc.memory_info().rss)
        except psutil.Error:
            return None, None
        used = float(times.user + times.system)
        now = self._clock()
        previous = self._cpu_seen.get(key)
        self._cpu_seen[key] = (used, now)
        if previous is None or now <= previous[1]:
            return None, rss
        return max(0.0, (used - previous[0]) / (now - previous[1]) * 100.0), rss

    def _inspect(self, pid: int, proc: object | None) -> GpuProcess:
        psutil = self._psutil
        if maps_show_gpu_use(pid) is False:
            return GpuProcess(pid, visible=False, hidden_reason=NOT_A_GPU_PROCESS)
        user = command = None
        if proc is not None:
            try:
                user = proc.username()  # type: ignore[attr-defined]
            except (psutil.Error, KeyError):
                user = None
            try:
                argv = proc.cmdline()  # type: ignore[attr-defined]
                command = redact_command(argv) if argv else proc.name()  # type: ignore[attr-defined]
            except psutil.Error:
                command = None
        return GpuProcess(pid, visible=True, user=user, command=command)

    def forget_except(self, pids: set[int]) -> None:
        """Drop cache entries of pids no GPU reports any more."""
        for cache in (self._cache, self._cpu_seen):
            for key in [k for k in cache if k[0] not in pids]:
                del cache[key]


class RecordedProcessResolver:
    """Takes user, command, visibility and usage from a recording: replays show what the recorded box
    showed (a recorded pid is never looked up here, where it may name an unrelated process)."""

    def __init__(self, processes: dict[int, GpuProcess]) -> None:
        self._processes = processes

    def resolve(self, pid: int, used_memory_bytes: int | None) -> GpuProcess:
        known = self._processes.get(pid)
        if known is None:
            return GpuProcess(pid, used_memory_bytes, visible=False, hidden_reason=NOT_IN_NAMESPACE)
        return dataclasses.replace(known, used_memory_bytes=used_memory_bytes)

    def forget_except(self, pids: set[int]) -> None:
        pass
