"""A stand-in for the ``pynvml`` module that replays a recording (``tunedeck gpus --json``).

It has the same function names, constants and exception classes (``NVMLError`` and its per-code
subclasses, taken from the real binding, which imports without a driver) as the parts of pynvml that
``NvmlBackend`` uses, so the real wrapper code runs against recorded values. It counts every call
(``calls``), can make values move over time (a deterministic waveform seeded per GPU, for charts and
demos), and can simulate a missing library, an unloaded driver, missing permissions, zero GPUs,
unsupported fields and a lost GPU (``lost``: NVML_ERROR_GPU_IS_LOST, as after an Xid 79). A field recorded as null answers NVML_ERROR_NOT_SUPPORTED, as the real GPU did.

``TUNEDECK_FAKE_GPUS=/path/to/recording.json`` makes ``open_monitor()`` use it (demos, benchmarks
with 8 GPUs on a laptop).
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml as _real

from core.hardware.host import LiveHostSampler, RecordedHostSampler
from core.hardware.monitor import HardwareMonitor
from core.hardware.nvml_backend import NvmlBackend
from core.hardware.processes import ProcessResolver, RecordedProcessResolver
from core.hardware.snapshot import BoxSnapshot, GpuSnapshot, load_snapshot

# How each simulated failure shows up at nvmlInit.
FAILURES = {
    "library_not_found": _real.NVML_ERROR_LIBRARY_NOT_FOUND,
    "driver_not_loaded": _real.NVML_ERROR_DRIVER_NOT_LOADED,
    "no_permission": _real.NVML_ERROR_NO_PERMISSION,
    "driver_mismatch": _real.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    "nvml_error": _real.NVML_ERROR_UNKNOWN,
}
_LEVELS = {
    "PIX": _real.NVML_TOPOLOGY_SINGLE,
    "PXB": _real.NVML_TOPOLOGY_MULTIPLE,
    "PHB": _real.NVML_TOPOLOGY_HOSTBRIDGE,
    "NODE": _real.NVML_TOPOLOGY_NODE,
    "SYS": _real.NVML_TOPOLOGY_SYSTEM,
}


def _nvml_function(method: Callable[..., Any]) -> Callable[..., Any]:
    """Count the call, insist on nvmlInit first, answer NOT_SUPPORTED for simulated unsupported calls."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: FakeNvml, *args: Any) -> Any:
        self.calls[name] += 1
        if name != "nvmlInit" and not self.initialized:
            raise self.NVMLError(self.NVML_ERROR_UNINITIALIZED)
        if name in self.unsupported:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return method(self, *args)

    return wrapper


class _Handle:
    def __init__(self, position: int, mig_slot: int | None = None) -> None:
        self.position = position
        self.mig_slot = mig_slot


class FakeNvml:
    """Module-like object: ``NvmlBackend(nvml=FakeNvml(recording))``."""

    def __init__(
        self,
        recording: BoxSnapshot,
        clock: Callable[[], float] = time.monotonic,
        animate: bool = False,
        fail: str | None = None,
        unsupported: Iterable[str] = (),
        compute_capability: tuple[int, int] | None = None,
    ) -> None:
        # The binding's constants and exception classes, so `except nvml.NVMLError` and the codes match.
        for name in dir(_real):
            if name.startswith(("NVML_", "NVMLError")) or name == "NVMLLibraryMismatchError":
                setattr(self, name, getattr(_real, name))
        self.recording = recording
        self.clock = clock
        self.animate = animate
        error = recording.nvml_error
        self.fail = fail if fail is not None else (error.reason if error and error.reason in FAILURES else None)
        if self.fail is not None and self.fail not in FAILURES:
            raise ValueError(f"unknown simulated failure '{fail}'; one of: {', '.join(FAILURES)}")
        self.unsupported = set(unsupported)
        self.compute_capability = compute_capability  # of every GPU; recordings do not hold it
        # GPU indices that answer GPU_IS_LOST to every call (a GPU recorded as lost does too); a test may add
        # one mid-session, as a GPU falls off the bus while the app watches.
        self.lost: set[int] = {g.index for g in recording.gpus if g.lost}
        self.calls: Counter[str] = Counter()
        self.initialized = False
        self._t0: float | None = None
        self._links = self._build_links()

    def _raise(self, code_name: str) -> None:
        raise self.NVMLError(getattr(self, code_name))

    def _gpu(self, handle: Any) -> GpuSnapshot:
        if not isinstance(handle, _Handle):
            self._raise("NVML_ERROR_INVALID_ARGUMENT")
        gpu = self.recording.gpus[handle.position]
        if gpu.index in self.lost:
            self._raise("NVML_ERROR_GPU_IS_LOST")
        return gpu

    def _value(self, value: Any) -> Any:
        if value is None:
            self._raise("NVML_ERROR_NOT_SUPPORTED")
        return value

    def _build_links(self) -> list[list[tuple[str, int]]]:
        """Per GPU position, its NVLinks as (remote PCI bus id, remote device type)."""
        gpus = self.recording.gpus
        links: list[list[tuple[str, int]]] = [[] for _ in gpus]
        topo = self.recording.topology
        if topo is None:
            return links
        position = {g.index: k for k, g in enumerate(gpus)}
        for i, gpu_index in enumerate(topo.gpus):
            own = links[position[gpu_index]]
            for j, peer_index in enumerate(topo.gpus):
                count = topo.nvlink_direct[i][j] if topo.nvlink_direct else 0
                peer_bus = gpus[position[peer_index]].pci_bus_id or f"FAKE:{peer_index}"
                own.extend([(peer_bus, _real.NVML_NVLINK_DEVICE_TYPE_GPU)] * count)
            switches = topo.nvswitch_links[i] if topo.nvswitch_links else 0
            for link in range(switches):
                # Each link of an HGX GPU ends on one of several NVSwitches.
                own.append((f"00000000:{0xA0 + link % 4:02X}:00.0", _real.NVML_NVLINK_DEVICE_TYPE_SWITCH))
        return links

    # --- the waveform ----------------------------------------------------------------------------------

    def _elapsed(self) -> float:
        now = self.clock()
        if self._t0 is None:
            self._t0 = now
        return now - self._t0

    def _wave(self, position: int) -> dict[str, float]:
        """Deterministic readings for one GPU at the current clock: utilisation, memory, power, heat."""
        gpu = self.recording.gpus[position]
        rng = random.Random(1000 + gpu.index)
        phase = rng.uniform(0, 2 * math.pi)
        slow, fast = rng.uniform(23, 47), rng.uniform(5, 11)
        t = self._elapsed()
        base_util = gpu.utilization_gpu_pct if (gpu.utilization_gpu_pct or 0) >= 20 else rng.uniform(60, 80)
        util = base_util + 20 * math.sin(2 * math.pi * t / slow + phase) + 8 * math.sin(2 * math.pi * t / fast)
        util = min(100.0, max(0.0, util))
        total = gpu.memory_total_bytes or 0
        used = gpu.memory_used_bytes or 0
        base_fraction = used / total if total and used / total > 0.05 else rng.uniform(0.5, 0.7)
        # Memory only rises above the recorded level (never below what the processes hold).
        fraction = base_fraction + 0.03 * (1 + math.sin(2 * math.pi * t / (3 * slow) + phase))
        limit = gpu.power_limit_w or 700.0
        idle = 0.1 * limit
        return {
            "util": util,
            "mem_util": util * 0.6,
            "mem_used": min(1.0, max(0.0, fraction)) * total,
            "power": idle + (limit * 0.92 - idle) * util / 100,
            "temp": 32 + 0.4 * util,
        }

    # --- library ---------------------------------------------------------------------------------------

    @_nvml_function
    def nvmlInit(self) -> None:
        if self.fail is not None:
            raise self.NVMLError(FAILURES[self.fail])
        self.initialized = True

    @_nvml_function
    def nvmlShutdown(self) -> None:
        self.initialized = False

    @_nvml_function
    def nvmlSystemGetDriverVersion(self) -> str:
        return self._value(self.recording.driver_version)

    @_nvml_function
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        text = self._value(self.recording.cuda_driver_version)
        major, _, minor = text.partition(".")
        return int(major) * 1000 + int(minor or 0) * 10

    @_nvml_function
    def nvmlDeviceGetCount(self) -> int:
        return len(self.recording.gpus)

    @_nvml_function
    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.recording.gpus):
            self._raise("NVML_ERROR_INVALID_ARGUMENT")
        if self.recording.gpus[index].index in self.lost:
            self._raise("NVML_ERROR_GPU_IS_LOST")
        return _Handle(index)

    # --- static facts ----------------------------------------------------------------------------------

    @_nvml_function
    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._value(self._gpu(handle).name)

    @_nvml_function
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        self._gpu(handle)
        return self._value(self.compute_capability)

    @_nvml_function
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._gpu(handle)
        if handle.mig_slot is not None:
            return self._value(self._mig(handle).uuid)
        return self._value(gpu.uuid)

    @_nvml_function
    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:
        bus = self._value(self._gpu(handle).pci_bus_id)
        return SimpleNamespace(busId=bus.encode("ascii"))  # the real struct gives bytes

    @_nvml_function
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return round(self._value(self._gpu(handle).power_limit_w) * 1000)

    @_nvml_function
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle)
        return self._value(gpu.clock_sm_max_mhz if clock_type == self.NVML_CLOCK_SM else gpu.clock_memory_max_mhz)

    @_nvml_function
    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._value(self._gpu(handle).pcie_gen_max)

    @_nvml_function
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._value(self._gpu(handle).pcie_width_max)

    @_nvml_function
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        enabled = self._value(self._gpu(handle).mig_enabled)
        mode = self.NVML_DEVICE_MIG_ENABLE if enabled else self.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    @_nvml_function
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        return max([7, *(m.index + 1 for m in gpu.mig_instances)])

    # --- readings --------------------------------------------------------------------------------------

    @_nvml_function
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> SimpleNamespace:
        gpu = self._gpu(handle)
        if handle.mig_slot is not None:
            mig = self._mig(handle)
            total, used = self._value(mig.memory_total_bytes), self._value(mig.memory_used_bytes)
        else:
            total, used = self._value(gpu.memory_total_bytes), self._value(gpu.memory_used_bytes)
            if self.animate:
                used = int(self._wave(handle.position)["mem_used"])
        return SimpleNamespace(total=total, used=used, free=total - used)

    @_nvml_function
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        gpu = self._gpu(handle)
        util, mem = self._value(gpu.utilization_gpu_pct), self._value(gpu.utilization_memory_pct)
        if self.animate:
            wave = self._wave(handle.position)
            util, mem = round(wave["util"]), round(wave["mem_util"])
        return SimpleNamespace(gpu=util, memory=mem)

    @_nvml_function
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        value = self._value(self._gpu(handle).temperature_c)
        return round(self._wave(handle.position)["temp"]) if self.animate else value

    @_nvml_function
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        watts = self._value(self._gpu(handle).power_draw_w)
        if self.animate:
            watts = self._wave(handle.position)["power"]
        return round(watts * 1000)

    @_nvml_function
    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu(handle)
        return self._value(gpu.clock_sm_mhz if clock_type == self.NVML_CLOCK_SM else gpu.clock_memory_mhz)

    @_nvml_function
    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._value(self._gpu(handle).pcie_gen)

    @_nvml_function
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._value(self._gpu(handle).pcie_width)

    @_nvml_function
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle)
        if error_type != self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        volatile = counter_type == self.NVML_VOLATILE_ECC
        return self._value(gpu.ecc_uncorrected_volatile if volatile else gpu.ecc_uncorrected_aggregate)

    @_nvml_function
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory_bytes, gpuInstanceId=0xFFFFFFFF,
                            computeInstanceId=0xFFFFFFFF)
            for p in self._gpu(handle).processes
        ]

    # --- MIG -------------------------------------------------------------------------------------------

    def _mig(self, handle: _Handle) -> Any:
        gpu = self._gpu(handle)
        for mig in gpu.mig_instances:
            if mig.index == handle.mig_slot:
                return mig
        self._raise("NVML_ERROR_NOT_FOUND")

    @_nvml_function
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, slot: int) -> _Handle:
        self._gpu(handle)
        mig_handle = _Handle(handle.position, slot)
        self._mig(mig_handle)
        return mig_handle

    @_nvml_function
    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._value(self._mig(handle).gpu_instance_id)

    @_nvml_function
    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._value(self._mig(handle).compute_instance_id)

    # --- topology --------------------------------------------------------------------------------------

    @_nvml_function
    def nvmlDeviceGetTopologyCommonAncestor(self, first: Any, second: Any) -> int:
        topo = self.recording.topology
        a, b = self._gpu(first).index, self._gpu(second).index
        if topo is None or not topo.pcie or a not in topo.gpus or b not in topo.gpus:
            self._raise("NVML_ERROR_NOT_SUPPORTED")
        label = topo.pcie[topo.gpus.index(a)][topo.gpus.index(b)]
        if label not in _LEVELS:
            self._raise("NVML_ERROR_NOT_SUPPORTED")
        return _LEVELS[label]

    def _link(self, handle: Any, link: int) -> tuple[str, int]:
        self._gpu(handle)
        links = self._links[handle.position]
        if not links:
            self._raise("NVML_ERROR_NOT_SUPPORTED")
        if not 0 <= link < len(links):
            self._raise("NVML_ERROR_INVALID_ARGUMENT")
        return links[link]

    @_nvml_function
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        self._link(handle, link)
        return self.NVML_FEATURE_ENABLED

    @_nvml_function
    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._link(handle, link)[0].encode("ascii"))

    @_nvml_function
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        return self._link(handle, link)[1]


def fake_nvml_from_recording(path: Path | BoxSnapshot, **options: Any) -> FakeNvml:
    """A ``FakeNvml`` replaying the recording at ``path`` (options as for ``FakeNvml``)."""
    recording = path if isinstance(path, BoxSnapshot) else load_snapshot(Path(path))
    return FakeNvml(recording, **options)


def fake_monitor_from_recording(
    path: Path | BoxSnapshot,
    clock: Callable[[], float] = time.monotonic,
    animate: bool = False,
    interval_s: float = 1.0,
    live_host: bool = False,
    processes: ProcessResolver | None = None,
    fail: str | None = None,
    unsupported: Iterable[str] = (),
    wall_clock: Callable[[], float] = time.time,
) -> HardwareMonitor:
    """A ``HardwareMonitor`` over fake GPUs replaying a recording through the real NVML wrapper.

    With ``animate`` utilisation, memory, power and temperature move along a per-GPU waveform of
    ``clock``; otherwise they are the recorded values. The host is the recorded one unless
    ``live_host``; process owners are the recorded ones unless a ``processes`` resolver is given.
    ``wall_clock`` stamps ``taken_at``. Snapshots are marked ``synthetic``; the monitor's ``source`` is
    ``path`` (None for a recording given as a ``BoxSnapshot``).
    """
    fake = fake_nvml_from_recording(path, clock=clock, animate=animate, fail=fail, unsupported=unsupported)
    recording = fake.recording
    if processes is None:
        processes = RecordedProcessResolver({p.pid: p for g in recording.gpus for p in g.processes})
    host = LiveHostSampler() if live_host else RecordedHostSampler(recording.host)
    return HardwareMonitor(
        NvmlBackend(fake, processes, clock=clock), host, interval_s=interval_s, clock=clock, wall_clock=wall_clock,
        synthetic=True, source=None if isinstance(path, BoxSnapshot) else Path(path),
    )
