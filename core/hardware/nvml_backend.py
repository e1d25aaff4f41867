"""The GPUs through NVML: every NVML call goes through ``NvmlBackend._call``.

That one choke point turns an unsupported or failing field into ``None`` (N/A) instead of an
exception, remembers which functions a GPU does not support so they are not asked again each poll,
and turns the errors that mean "no NVML at all" into an ``NvmlUnavailable`` with a reason and an
action. NVML is initialised lazily on the first read; static facts (names, UUIDs, totals, limits,
maximum clocks, topology) are read once. The nvml module is injected (default: ``pynvml``) so that
the fake NVML of ``core.hardware.fake_nvml`` can run this same code against recordings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.hardware.processes import LiveProcessResolver, ProcessResolver
from core.hardware.snapshot import GpuProcess, GpuSnapshot, MigInstance, NvmlUnavailable, Topology
from core.i18n import t

_UINT_NA = 0xFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE for unsigned int fields
_ULL_NA = 0xFFFFFFFFFFFFFFFF  # ... and for unsigned long long ones

# NVML error codes (stable across versions; the module's own constants are used where it has them).
_ERROR_REASONS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "library_not_found",
    "NVML_ERROR_DRIVER_NOT_LOADED": "driver_not_loaded",
    "NVML_ERROR_NO_PERMISSION": "no_permission",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "driver_mismatch",
}
# Errors after a successful init that mean NVML as a whole is gone, not one field.
_FATAL_AFTER_INIT = ("NVML_ERROR_UNINITIALIZED", "NVML_ERROR_DRIVER_NOT_LOADED",
                     "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_LIB_RM_VERSION_MISMATCH")
# Errors that will not change while the process lives: do not ask again.
_PERMANENT_NA = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND")

# While NVML is unavailable (no driver yet, a driver reloaded or upgraded under a running app), a read tries
# to start it again this often: a driver that comes up (cloud-init installing it on a fresh box, modprobe,
# a reboot of the modules) shows its GPUs without restarting tunedeck.
RETRY_UNAVAILABLE_S = 10.0

_PCIE_LEVEL_NAMES = {
    "NVML_TOPOLOGY_INTERNAL": "PIX",  # two GPUs on one board
    "NVML_TOPOLOGY_SINGLE": "PIX",
    "NVML_TOPOLOGY_MULTIPLE": "PXB",
    "NVML_TOPOLOGY_HOSTBRIDGE": "PHB",
    "NVML_TOPOLOGY_NODE": "NODE",
    "NVML_TOPOLOGY_SYSTEM": "SYS",
}


def unavailable(reason: str, nvml_code: int | None = None, detail: str = "") -> NvmlUnavailable:
    """An ``NvmlUnavailable`` whose message (in the interface language) says what to do."""
    return NvmlUnavailable(reason, t(f"hardware.unavailable.{reason}", detail=detail), nvml_code)


class _GpuLost(Exception):
    """A call about one GPU answered NVML_ERROR_GPU_IS_LOST: that GPU cannot be read (until a reboot)."""


class _NvmlGone(Exception):
    def __init__(self, error: NvmlUnavailable) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class GpuReading:
    """What the backend read in one poll."""

    gpus: tuple[GpuSnapshot, ...] = ()
    topology: Topology | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    error: NvmlUnavailable | None = None


@dataclass(frozen=True)
class GpuIdentity:
    """Who one GPU is, without a reading: what starting a run asks (how many, bf16 or not, and the UUIDs a
    ``CUDA_VISIBLE_DEVICES`` may name it by: ``core.runs.gpus.run_gpu_indices`` takes these as snapshots)."""

    index: int
    name: str | None = None
    compute_capability: tuple[int, int] | None = None  # (major, minor); None where NVML cannot say
    uuid: str | None = None
    mig_instances: tuple[MigInstance, ...] = ()  # its MIG devices (their UUIDs), in MIG mode
    lost: bool = False  # NVML answers GPU_IS_LOST for it (fell off the bus, Xid 79): no run can use it


@dataclass(frozen=True)
class GpuIdentities:
    """The GPUs NVML sees, or (``error``) why it sees none."""

    gpus: tuple[GpuIdentity, ...] = ()
    error: NvmlUnavailable | None = None


@dataclass
class _StaticGpu:
    index: int
    handle: Any
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    power_limit_w: float | None = None
    clock_sm_max_mhz: int | None = None
    clock_memory_max_mhz: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    mig_enabled: bool | None = None
    mig_slots: int = 0
    lost: bool = False  # already lost when NVML started: no handle to read it by


def normalize_bus_id(bus_id: Any) -> str | None:
    """PCI bus id as "00000000:18:00.0" whatever form NVML gave (bytes, short domain, case)."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    if not isinstance(bus_id, str) or not bus_id.strip("\x00 "):
        return None
    text = bus_id.strip("\x00 ").upper()
    parts = text.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):08X}:{parts[1]}:{parts[2]}"
        except ValueError:
            return text
    return text


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None


def _uint(value: Any) -> int | None:
    return None if value is None or value == _UINT_NA else int(value)


def _ull(value: Any) -> int | None:
    return None if value is None or value == _ULL_NA else int(value)


def format_cuda_version(value: int | None) -> str | None:
    """NVML's CUDA driver version integer (13000) as "13.0"."""
    if value is None or value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


class NvmlBackend:
    """Reads GPUs through an nvml module (``pynvml`` or a stand-in with the same names)."""

    def __init__(self, nvml: Any = None, processes: ProcessResolver | None = None,
                 clock: Callable[[], float] = time.monotonic, retry_s: float = RETRY_UNAVAILABLE_S) -> None:
        self._nvml = nvml
        self._processes = processes
        self._clock = clock
        self._retry_s = retry_s
        self._failed_at: float | None = None  # when the kept ``_error`` was found
        self._started = False
        self._initialized = False  # nvmlInit succeeded: close() shuts it down, GPUs or not
        self._error: NvmlUnavailable | None = None
        self._gpus: list[_StaticGpu] = []
        self._driver_version: str | None = None
        self._cuda_driver_version: str | None = None
        self._topology: Topology | None = None
        self._topology_done = False
        self._permanent_na: set[tuple[Any, ...]] = set()
        self._handle_ids: dict[int, int] = {}  # id(handle) -> GPU index, for the handles kept in _gpus

    # --- the choke point ---------------------------------------------------------------------------

    def _code(self, name: str) -> int | None:
        return getattr(self._nvml, name, None)

    def _raw(self, function: str, *args: Any) -> Any:
        """The only place that calls into NVML."""
        return getattr(self._nvml, function)(*args)

    def _call(self, function: str, *args: Any) -> Any:
        """``nvml.<function>(*args)``, or None (N/A) when NVML cannot give it.

        Raises ``_NvmlGone`` only for errors that mean NVML as a whole stopped working.
        """
        key = self._memo_key(function, args)
        if key is not None and key in self._permanent_na:
            return None
        if getattr(self._nvml, function, None) is None:  # an older binding without this function
            if key is not None:
                self._permanent_na.add(key)
            return None
        mismatch = getattr(self._nvml, "NVMLLibraryMismatchError", None)
        try:
            return self._raw(function, *args)
        except self._nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code is not None and code in {self._code(n) for n in _FATAL_AFTER_INIT}:
                raise _NvmlGone(self._error_for(exc)) from exc
            if code is not None and code == self._code("NVML_ERROR_GPU_IS_LOST"):
                raise _GpuLost(function) from exc
            if key is not None and code is not None and code in {self._code(n) for n in _PERMANENT_NA}:
                self._permanent_na.add(key)
            return None
        except Exception as exc:
            # pynvml raises this (not an NVMLError) when the driver lacks a function's newest version.
            if mismatch is not None and isinstance(exc, mismatch):
                if key is not None:
                    self._permanent_na.add(key)
                return None
            raise

    def _call_unless_lost(self, function: str, *args: Any) -> Any:
        """``_call`` where a lost GPU's answer is just N/A (topology: the links of the others still count)."""
        try:
            return self._call(function, *args)
        except _GpuLost:
            return None

    def _memo_key(self, function: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """Key under which "not supported" is remembered; None for calls on short-lived handles
        (MIG devices are looked up each poll: an ``id`` could be reused by another one)."""
        parts: list[Any] = [function]
        for arg in args:
            if isinstance(arg, int):
                parts.append(arg)
            elif id(arg) in self._handle_ids:
                parts.append(("gpu", self._handle_ids[id(arg)]))
            else:
                return None
        return tuple(parts)

    def is_unsupported(self, function: str, *args: Any) -> bool:
        """Whether ``function(*args)`` answered NOT_SUPPORTED (or is missing) and is no longer asked."""
        key = self._memo_key(function, args)
        return key is not None and key in self._permanent_na

    def _error_for(self, exc: Exception) -> NvmlUnavailable:
        code = getattr(exc, "value", None)
        for name, reason in _ERROR_REASONS.items():
            if code is not None and code == self._code(name):
                return unavailable(reason, code)
        return unavailable("nvml_error", code, detail=str(exc))

    # --- lifetime ------------------------------------------------------------------------------------

    def _start(self) -> None:
        """Load and initialise NVML once; the outcome (GPUs or the reason there are none) is kept."""
        self._started = True
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                self._fail(unavailable("binding_missing"))
                return
            self._nvml = pynvml
        try:
            self._raw("nvmlInit")  # unguarded: its errors are the reasons NVML is unavailable
        except self._nvml.NVMLError as exc:
            self._fail(self._error_for(exc))
            return
        self._initialized = True
        try:
            self._driver_version = _text(self._call("nvmlSystemGetDriverVersion"))
            self._cuda_driver_version = format_cuda_version(
                self._call("nvmlSystemGetCudaDriverVersion_v2")
            )
            count = self._call("nvmlDeviceGetCount") or 0
            for index in range(count):
                self._gpus.append(self._read_static(index))
        except _NvmlGone as gone:
            self._fail(gone.error)
            return
        if not self._gpus:
            self._fail(unavailable("no_gpus"))

    def _fail(self, error: NvmlUnavailable) -> None:
        """Keep ``error`` as NVML's outcome, and when it was found: ``read`` starts NVML again ``retry_s``
        after it, whichever call (``read``, ``identities``) found it."""
        self._error = error
        self._failed_at = self._clock()

    def close(self) -> None:
        """Shut NVML down if this backend started it; a later read starts it again."""
        if self._initialized and self._nvml is not None:
            try:
                self._raw("nvmlShutdown")
            except self._nvml.NVMLError:
                pass
        self._started = False
        self._initialized = False
        self._error = None
        self._failed_at = None
        self._driver_version = self._cuda_driver_version = None  # a reloaded driver may be another version
        self._gpus = []
        self._topology = None
        self._topology_done = False
        self._permanent_na.clear()
        self._handle_ids.clear()

    # --- reading -------------------------------------------------------------------------------------

    def _read_static(self, index: int) -> _StaticGpu:
        try:
            return self._read_static_facts(index)
        except _GpuLost:  # what was read before it answered GPU_IS_LOST is not worth keeping
            return _StaticGpu(index=index, handle=None, lost=True)

    def _read_static_facts(self, index: int) -> _StaticGpu:
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        gpu = _StaticGpu(index=index, handle=handle)
        if handle is None:  # e.g. a GPU outside this container's cgroup: all its fields stay N/A
            return gpu
        self._handle_ids[id(handle)] = index  # the handle lives as long as this backend's _gpus
        nv = self._nvml
        gpu.name = _text(self._call("nvmlDeviceGetName", handle))
        gpu.uuid = _text(self._call("nvmlDeviceGetUUID", handle))
        pci = self._call("nvmlDeviceGetPciInfo", handle)
        gpu.pci_bus_id = normalize_bus_id(getattr(pci, "busId", None)) if pci is not None else None
        limit_mw = _uint(self._call("nvmlDeviceGetEnforcedPowerLimit", handle))
        gpu.power_limit_w = None if limit_mw is None else limit_mw / 1000.0
        gpu.clock_sm_max_mhz = _uint(self._call("nvmlDeviceGetMaxClockInfo", handle, nv.NVML_CLOCK_SM))
        gpu.clock_memory_max_mhz = _uint(self._call("nvmlDeviceGetMaxClockInfo", handle, nv.NVML_CLOCK_MEM))
        gpu.pcie_gen_max = _uint(self._call("nvmlDeviceGetMaxPcieLinkGeneration", handle))
        gpu.pcie_width_max = _uint(self._call("nvmlDeviceGetMaxPcieLinkWidth", handle))
        mig = self._call("nvmlDeviceGetMigMode", handle)
        if mig is not None:
            gpu.mig_enabled = bool(mig[0] == nv.NVML_DEVICE_MIG_ENABLE)
            if gpu.mig_enabled:
                gpu.mig_slots = _uint(self._call("nvmlDeviceGetMaxMigDeviceCount", handle)) or 0
        return gpu

    def _read_gpu(self, gpu: _StaticGpu) -> GpuSnapshot:
        """One GPU's readings; a GPU NVML calls lost (fallen off the bus) is marked so, with its static facts,
        rather than read as a GPU whose every field is unsupported and that runs nothing."""
        if gpu.lost:
            return GpuSnapshot(index=gpu.index, lost=True)
        try:
            return self._read_gpu_fields(gpu)
        except _GpuLost:
            return GpuSnapshot(index=gpu.index, name=gpu.name, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id,
                               memory_total_bytes=gpu.memory_total_bytes, power_limit_w=gpu.power_limit_w,
                               clock_sm_max_mhz=gpu.clock_sm_max_mhz, clock_memory_max_mhz=gpu.clock_memory_max_mhz,
                               pcie_gen_max=gpu.pcie_gen_max, pcie_width_max=gpu.pcie_width_max,
                               mig_enabled=gpu.mig_enabled, lost=True)

    def _read_gpu_fields(self, gpu: _StaticGpu) -> GpuSnapshot:
        handle = gpu.handle
        if handle is None:
            return GpuSnapshot(index=gpu.index)
        nv = self._nvml
        memory = self._call("nvmlDeviceGetMemoryInfo", handle)
        if memory is not None and gpu.memory_total_bytes is None:
            gpu.memory_total_bytes = _ull(memory.total)  # a static fact, taken from the first reading
        utilization = self._call("nvmlDeviceGetUtilizationRates", handle)
        power_mw = _uint(self._call("nvmlDeviceGetPowerUsage", handle))
        processes = self._read_processes(handle)
        return GpuSnapshot(
            index=gpu.index,
            name=gpu.name,
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            memory_total_bytes=gpu.memory_total_bytes,
            memory_used_bytes=None if memory is None else _ull(memory.used),
            utilization_gpu_pct=None if utilization is None else _uint(utilization.gpu),
            utilization_memory_pct=None if utilization is None else _uint(utilization.memory),
            temperature_c=_uint(self._call("nvmlDeviceGetTemperature", handle, nv.NVML_TEMPERATURE_GPU)),
            power_draw_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=gpu.power_limit_w,
            clock_sm_mhz=_uint(self._call("nvmlDeviceGetClockInfo", handle, nv.NVML_CLOCK_SM)),
            clock_sm_max_mhz=gpu.clock_sm_max_mhz,
            clock_memory_mhz=_uint(self._call("nvmlDeviceGetClockInfo", handle, nv.NVML_CLOCK_MEM)),
            clock_memory_max_mhz=gpu.clock_memory_max_mhz,
            pcie_gen=_uint(self._call("nvmlDeviceGetCurrPcieLinkGeneration", handle)),
            pcie_gen_max=gpu.pcie_gen_max,
            pcie_width=_uint(self._call("nvmlDeviceGetCurrPcieLinkWidth", handle)),
            pcie_width_max=gpu.pcie_width_max,
            ecc_uncorrected_volatile=_ull(self._call(
                "nvmlDeviceGetTotalEccErrors", handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
            )),
            ecc_uncorrected_aggregate=_ull(self._call(
                "nvmlDeviceGetTotalEccErrors", handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC
            )),
            mig_enabled=gpu.mig_enabled,
            mig_instances=self._read_mig(gpu),
            processes=processes or (),
            processes_known=processes is not None,
        )

    def _read_mig(self, gpu: _StaticGpu) -> tuple[MigInstance, ...]:
        instances = []
        for slot in range(gpu.mig_slots):
            mig = self._call("nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, slot)
            if mig is None:  # an empty slot answers NOT_FOUND
                continue
            memory = self._call("nvmlDeviceGetMemoryInfo", mig)
            instances.append(MigInstance(
                index=slot,
                uuid=_text(self._call("nvmlDeviceGetUUID", mig)),
                gpu_instance_id=_uint(self._call("nvmlDeviceGetGpuInstanceId", mig)),
                compute_instance_id=_uint(self._call("nvmlDeviceGetComputeInstanceId", mig)),
                memory_total_bytes=None if memory is None else _ull(memory.total),
                memory_used_bytes=None if memory is None else _ull(memory.used),
            ))
        return tuple(instances)

    def _read_processes(self, handle: Any) -> tuple[GpuProcess, ...] | None:
        """The GPU's compute processes by pid; None where NVML would not list them (not "none run")."""
        found = self._call("nvmlDeviceGetComputeRunningProcesses", handle)
        if found is None and self.is_unsupported("nvmlDeviceGetComputeRunningProcesses", handle):
            found = self._call("nvmlDeviceGetComputeRunningProcesses_v2", handle)  # older drivers
        if found is None:
            return None
        assert self._processes is not None
        out = []
        for entry in found:
            pid = int(entry.pid)
            out.append(self._processes.resolve(pid, _ull(getattr(entry, "usedGpuMemory", None))))
        return tuple(sorted(out, key=lambda p: p.pid))

    def _read_topology(self) -> Topology | None:
        gpus = [g for g in self._gpus if g.handle is not None]
        if len(gpus) < 2:
            return None
        nv = self._nvml
        levels = {getattr(nv, name): label for name, label in _PCIE_LEVEL_NAMES.items() if hasattr(nv, name)}
        n = len(gpus)
        pcie: list[list[str | None]] = [["X" if i == j else None for j in range(n)] for i in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                level = self._call_unless_lost("nvmlDeviceGetTopologyCommonAncestor", gpus[i].handle, gpus[j].handle)
                pcie[i][j] = pcie[j][i] = levels.get(level)
        by_bus = {g.pci_bus_id: k for k, g in enumerate(gpus) if g.pci_bus_id}
        direct = [[0] * n for _ in range(n)]
        switch_links = [0] * n
        gpu_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
        for i, gpu in enumerate(gpus):
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                if self._call_unless_lost("nvmlDeviceGetNvLinkState", gpu.handle, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                remote = self._call_unless_lost("nvmlDeviceGetNvLinkRemotePciInfo", gpu.handle, link)
                peer = by_bus.get(normalize_bus_id(getattr(remote, "busId", None)))
                if peer is not None and peer != i:
                    direct[i][peer] += 1
                    continue
                kind = self._call_unless_lost("nvmlDeviceGetNvLinkRemoteDeviceType", gpu.handle, link)
                # A link to none of our GPUs goes to an NVSwitch; where the driver cannot say the type,
                # an NVSwitch is still the likely end (HGX boards). A link to a GPU we cannot see
                # (outside this container) connects nothing we show.
                if kind != gpu_type:
                    switch_links[i] += 1
        return Topology(
            gpus=tuple(g.index for g in gpus),
            pcie=tuple(tuple(row) for row in pcie),
            nvlink_direct=tuple(tuple(row) for row in direct),
            nvswitch_links=tuple(switch_links),
        )

    def identities(self) -> GpuIdentities:
        """Each GPU's name and compute capability, from the static facts (no poll, no process lookup)."""
        if not self._started:
            self._start()
        if self._error is not None:
            return GpuIdentities(error=self._error)
        found = []
        try:
            for gpu in self._gpus:
                capability, migs, lost = None, (), gpu.lost
                try:
                    if gpu.handle is not None:
                        capability = self._call("nvmlDeviceGetCudaComputeCapability", gpu.handle)
                    migs = self._read_mig(gpu) if gpu.mig_enabled else ()
                except _GpuLost:
                    lost = True
                found.append(GpuIdentity(gpu.index, gpu.name,
                                         None if capability is None else (int(capability[0]), int(capability[1])),
                                         gpu.uuid, migs, lost))
        except _NvmlGone as gone:
            self._fail(gone.error)
            return GpuIdentities(error=self._error)
        return GpuIdentities(tuple(found))

    def read(self) -> GpuReading:
        """One poll of every GPU; NVML being unavailable is a normal result, not an exception (NVML is
        started again at most every ``retry_s`` while it is)."""
        if self._error is not None and self._failed_at is not None and self._clock() - self._failed_at >= self._retry_s:
            self.close()
        if not self._started:
            self._start()
        if self._processes is None:
            self._processes = LiveProcessResolver()
        if self._error is not None:
            return GpuReading(
                driver_version=self._driver_version,
                cuda_driver_version=self._cuda_driver_version,
                error=self._error,
            )
        try:
            if not self._topology_done:
                self._topology = self._read_topology()
                self._topology_done = True
            gpus = tuple(self._read_gpu(g) for g in self._gpus)
        except _NvmlGone as gone:
            self._fail(gone.error)
            return GpuReading(
                driver_version=self._driver_version,
                cuda_driver_version=self._cuda_driver_version,
                error=self._error,
            )
        assert self._processes is not None
        self._processes.forget_except({p.pid for g in gpus for p in g.processes})
        return GpuReading(
            gpus=gpus,
            topology=self._topology,
            driver_version=self._driver_version,
            cuda_driver_version=self._cuda_driver_version,
        )


def nvml_error_types() -> tuple[type[BaseException], ...]:
    """NVML's own exception types (none when the binding is missing), for callers that tell an expected
    NVML failure from a bug without importing the binding themselves."""
    try:
        from pynvml import NVMLError
    except ImportError:  # pragma: no cover - the binding is a dependency; NVML itself may be missing
        return ()
    return (NVMLError,)


def read_gpu_identities(nvml: Any = None) -> GpuIdentities:
    """The GPUs' names and compute capabilities, NVML started and shut down again around the read.

    For code that asks once (starting a run), not for monitoring. Without the binding the error's
    reason is "binding_missing"; without a driver or GPUs it is the reason NVML gave.
    """
    backend = NvmlBackend(nvml)
    try:
        return backend.identities()
    finally:
        backend.close()
