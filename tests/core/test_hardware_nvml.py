"""The NVML wrapper (NvmlBackend) running against the fake NVML driven by recordings."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import pynvml
import pytest

from core.hardware.fake_nvml import FakeNvml, fake_monitor_from_recording, fake_nvml_from_recording
from core.hardware.host import RecordedHostSampler
from core.hardware.monitor import HardwareMonitor
from core.hardware.nvml_backend import NvmlBackend, format_cuda_version, normalize_bus_id
from core.hardware.processes import RecordedProcessResolver
from core.hardware.snapshot import (
    BoxSnapshot,
    GpuSnapshot,
    HostSnapshot,
    MigInstance,
    Topology,
    load_snapshot,
)
from core.i18n import t

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpus"


class SteppingClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def monitor_over(fake: FakeNvml, clock: SteppingClock) -> HardwareMonitor:
    recording = fake.recording
    resolver = RecordedProcessResolver({p.pid: p for g in recording.gpus for p in g.processes})
    return HardwareMonitor(NvmlBackend(fake, resolver), RecordedHostSampler(recording.host), clock=clock)


def comparable(snapshot: BoxSnapshot) -> dict:
    data = snapshot.to_json()
    data.pop("taken_at")
    data.pop("synthetic")
    return data


@pytest.mark.parametrize("name", ["h200x1.json", "h200x2.json", "h200x8.json", "none.json", "zero.json"])
def test_replay_through_the_real_wrapper_gives_back_the_recording(name):
    recording = load_snapshot(FIXTURES / name)
    monitor = fake_monitor_from_recording(FIXTURES / name, clock=SteppingClock())
    replayed = monitor.poll()
    assert comparable(replayed) == comparable(recording)
    assert replayed.synthetic is True  # a replay is never passed off as a real recording


def test_recorded_values_arrive_with_nvml_units_converted():
    # Expected values come from the file, so that real recordings can replace the hand-made ones.
    recording = load_snapshot(FIXTURES / "h200x2.json")
    snapshot = fake_monitor_from_recording(FIXTURES / "h200x2.json", clock=SteppingClock()).poll()
    for gpu, recorded in zip(snapshot.gpus, recording.gpus, strict=True):
        assert gpu.name == recorded.name == "NVIDIA H200"
        assert gpu.memory_total_bytes == recorded.memory_total_bytes
        assert gpu.power_draw_w == recorded.power_draw_w  # through NVML's milliwatts and back
        assert gpu.power_limit_w == recorded.power_limit_w
        assert gpu.pci_bus_id == recorded.pci_bus_id  # bytes from the PCI struct, decoded
        assert [p.pid for p in gpu.processes] == [p.pid for p in recorded.processes]
    assert snapshot.cuda_driver_version == recording.cuda_driver_version  # through the integer form
    assert snapshot.driver_version == recording.driver_version
    assert snapshot.topology is not None and snapshot.topology.matrix() == recording.topology.matrix()


def test_static_facts_are_queried_once_and_readings_every_poll():
    clock = SteppingClock()
    fake = fake_nvml_from_recording(FIXTURES / "h200x8.json", clock=clock)
    monitor = monitor_over(fake, clock)
    monitor.poll()
    after_first = dict(fake.calls)
    for _ in range(4):
        clock.now += 1.0
        monitor.poll()
    n = 8
    for static in ("nvmlInit", "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion_v2",
                   "nvmlDeviceGetCount"):
        assert fake.calls[static] == 1, static
    for static, per_gpu in (("nvmlDeviceGetHandleByIndex", 1), ("nvmlDeviceGetName", 1),
                            ("nvmlDeviceGetUUID", 1), ("nvmlDeviceGetPciInfo", 1),
                            ("nvmlDeviceGetEnforcedPowerLimit", 1), ("nvmlDeviceGetMaxClockInfo", 2),
                            ("nvmlDeviceGetMaxPcieLinkGeneration", 1), ("nvmlDeviceGetMigMode", 1)):
        assert fake.calls[static] == n * per_gpu, static
    # Topology: read on the first poll only.
    assert fake.calls["nvmlDeviceGetTopologyCommonAncestor"] == n * (n - 1) // 2
    for topo in ("nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetNvLinkState",
                 "nvmlDeviceGetNvLinkRemotePciInfo"):
        assert fake.calls[topo] == after_first[topo] > 0, topo
    for dynamic, per_gpu in (("nvmlDeviceGetUtilizationRates", 1), ("nvmlDeviceGetMemoryInfo", 1),
                             ("nvmlDeviceGetPowerUsage", 1), ("nvmlDeviceGetClockInfo", 2),
                             ("nvmlDeviceGetComputeRunningProcesses", 1)):
        assert fake.calls[dynamic] == 5 * n * per_gpu, dynamic


def test_nvswitch_topology_reads_eighteen_links_per_gpu():
    fake = fake_nvml_from_recording(FIXTURES / "h200x8.json", clock=SteppingClock())
    snapshot = monitor_over(fake, SteppingClock()).poll()
    topo = snapshot.topology
    assert topo is not None
    assert topo.nvswitch_links == (18,) * 8
    assert topo.pcie[0][4] == "SYS" and topo.pcie[0][3] == "NODE"
    assert {topo.label(i, j) for i in range(8) for j in range(8) if i != j} == {"NV18"}


def test_direct_nvlink_and_pcie_topology_replays():
    host = HostSnapshot()
    gpus = tuple(GpuSnapshot(index=i, name="NVIDIA A100-SXM4-80GB", pci_bus_id=f"00000000:{0x10 + i:02X}:00.0")
                 for i in range(4))
    topology = Topology(
        gpus=(0, 1, 2, 3),
        pcie=(("X", "PIX", "PHB", "SYS"), ("PIX", "X", "PXB", "SYS"), ("PHB", "PXB", "X", "NODE"),
              ("SYS", "SYS", "NODE", "X")),
        nvlink_direct=((0, 4, 0, 0), (4, 0, 0, 0), (0, 0, 0, 2), (0, 0, 2, 0)),
        nvswitch_links=(0, 0, 0, 0),
    )
    recording = BoxSnapshot(taken_at=0.0, host=host, gpus=gpus, topology=topology, driver_version="535.1",
                            cuda_driver_version="12.2")
    snapshot = fake_monitor_from_recording(recording, clock=SteppingClock()).poll()
    assert snapshot.topology == topology
    assert snapshot.topology.matrix()[0] == ("X", "NV4", "PHB", "SYS")
    assert snapshot.topology.matrix()[2] == ("PHB", "PXB", "X", "NV2")


def test_fields_recorded_as_null_come_back_as_na_not_exceptions():
    recording = load_snapshot(FIXTURES / "h200x1.json")
    gpu = dataclasses.replace(recording.gpus[0], temperature_c=None, ecc_uncorrected_volatile=None,
                              ecc_uncorrected_aggregate=None, clock_sm_max_mhz=None, pcie_gen=None,
                              mig_enabled=None)
    recording = dataclasses.replace(recording, gpus=(gpu,))
    snapshot = fake_monitor_from_recording(recording, clock=SteppingClock()).poll()
    replayed = snapshot.gpus[0]
    assert replayed.temperature_c is None and replayed.clock_sm_max_mhz is None and replayed.pcie_gen is None
    assert replayed.ecc_uncorrected_volatile is None and replayed.mig_enabled is None
    assert replayed.memory_used_bytes == gpu.memory_used_bytes  # the rest still arrives
    assert snapshot.to_json()["gpus"][0]["temperature_c"] is None


def test_unsupported_functions_give_na_and_are_not_asked_again():
    clock = SteppingClock()
    fake = fake_nvml_from_recording(
        FIXTURES / "h200x2.json",
        clock=clock,
        unsupported={"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPciInfo"},
    )
    monitor = monitor_over(fake, clock)
    for _ in range(3):
        snapshot = monitor.poll()
        clock.now += 1.0
    for gpu in snapshot.gpus:
        assert gpu.ecc_uncorrected_volatile is None and gpu.ecc_uncorrected_aggregate is None
        assert gpu.utilization_gpu_pct is None and gpu.utilization_memory_pct is None
        assert gpu.pci_bus_id is None
        assert gpu.power_draw_w is not None  # supported fields are unaffected
    # NOT_SUPPORTED is remembered per GPU and argument: asked once, not every poll.
    n = len(snapshot.gpus)
    assert n == 2
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 2 * n
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == n
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 3 * n


def test_a_binding_without_a_function_gives_na():
    fake = fake_nvml_from_recording(FIXTURES / "h200x1.json", clock=SteppingClock())

    class OldBinding:
        """An older nvml module: no _v2 CUDA version function."""

        def __getattr__(self, name):
            if name == "nvmlSystemGetCudaDriverVersion_v2":
                raise AttributeError(name)
            return getattr(fake, name)

    snapshot = HardwareMonitor(NvmlBackend(OldBinding(), RecordedProcessResolver({})),
                               RecordedHostSampler(HostSnapshot()), clock=SteppingClock()).poll()
    assert snapshot.cuda_driver_version is None
    recorded = load_snapshot(FIXTURES / "h200x1.json")
    assert snapshot.driver_version == recorded.driver_version and len(snapshot.gpus) == 1


def test_old_driver_without_the_newest_process_query_falls_back_to_v2():
    clock = SteppingClock()
    recording = load_snapshot(FIXTURES / "h200x1.json")

    class OldDriverNvml(FakeNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            self.calls["v3 attempts"] += 1
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called ...")

        def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):
            return FakeNvml.nvmlDeviceGetComputeRunningProcesses(self, handle)

    fake = OldDriverNvml(recording, clock=clock)
    monitor = monitor_over(fake, clock)
    for _ in range(3):
        snapshot = monitor.poll()
        clock.now += 1.0
    assert [p.pid for p in snapshot.gpus[0].processes] == [p.pid for p in recording.gpus[0].processes]
    assert snapshot.gpus[0].processes  # the fixture has a process to find
    assert fake.calls["v3 attempts"] == 1  # not asked again after the mismatch


@pytest.mark.parametrize(
    ("fail", "code"),
    [
        ("library_not_found", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND),
        ("driver_not_loaded", pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
        ("no_permission", pynvml.NVML_ERROR_NO_PERMISSION),
        ("driver_mismatch", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH),
        ("nvml_error", pynvml.NVML_ERROR_UNKNOWN),
    ],
)
def test_nvml_unavailable_is_a_normal_snapshot_with_reason_and_action(fail, code):
    clock = SteppingClock()
    fake = fake_nvml_from_recording(FIXTURES / "h200x2.json", clock=clock, fail=fail)
    monitor = monitor_over(fake, clock)
    snapshot = monitor.poll()
    assert snapshot.gpus == ()
    assert snapshot.nvml_error is not None
    assert snapshot.nvml_error.reason == fail
    assert snapshot.nvml_error.nvml_code == code
    detail = str(pynvml.NVMLError(code)) if fail == "nvml_error" else ""
    assert snapshot.nvml_error.message == t(f"hardware.unavailable.{fail}", detail=detail)
    assert snapshot.host == fake.recording.host  # host info is still there
    clock.now += 1.0
    monitor.poll()
    assert fake.calls["nvmlInit"] == 1  # the outcome is kept, not retried every poll
    assert sum(fake.calls.values()) == 1


def test_library_missing_message_says_what_to_do():
    snapshot = fake_monitor_from_recording(FIXTURES / "none.json", clock=SteppingClock()).poll()
    assert snapshot.nvml_error.reason == "library_not_found"
    assert "install the NVIDIA driver" in snapshot.nvml_error.message
    assert "--gpus all" in snapshot.nvml_error.message


def test_zero_gpus_is_unavailable_but_keeps_the_driver_version():
    snapshot = fake_monitor_from_recording(FIXTURES / "zero.json", clock=SteppingClock()).poll()
    assert snapshot.gpus == ()
    assert snapshot.nvml_error.reason == "no_gpus" and snapshot.nvml_error.nvml_code is None
    assert snapshot.driver_version == "580.95.05"


def test_nvml_going_away_mid_session_turns_into_an_error_snapshot():
    clock = SteppingClock()
    fake = fake_nvml_from_recording(FIXTURES / "h200x1.json", clock=clock)
    monitor = monitor_over(fake, clock)
    assert len(monitor.poll().gpus) == 1
    fake.initialized = False  # every call now answers NVML_ERROR_UNINITIALIZED, as after a driver unload
    clock.now += 1.0
    snapshot = monitor.poll()
    assert snapshot.gpus == () and snapshot.nvml_error.reason == "nvml_error"
    assert snapshot.nvml_error.nvml_code == pynvml.NVML_ERROR_UNINITIALIZED


def test_close_shuts_nvml_down_and_a_later_poll_starts_it_again():
    clock = SteppingClock()
    fake = fake_nvml_from_recording(FIXTURES / "h200x1.json", clock=clock)
    monitor = monitor_over(fake, clock)
    monitor.poll()
    monitor.close()
    assert fake.calls["nvmlShutdown"] == 1 and not fake.initialized
    clock.now += 1.0
    assert len(monitor.poll().gpus) == 1
    assert fake.calls["nvmlInit"] == 2


def test_mig_instances_are_listed_by_slot():
    recording = load_snapshot(FIXTURES / "h200x1.json")
    migs = (
        MigInstance(index=0, uuid="MIG-aaaa", gpu_instance_id=1, compute_instance_id=0,
                    memory_total_bytes=71 * 2**30, memory_used_bytes=2**30),
        MigInstance(index=3, uuid="MIG-bbbb", gpu_instance_id=5, compute_instance_id=0,
                    memory_total_bytes=35 * 2**30, memory_used_bytes=0),
    )
    gpu = dataclasses.replace(recording.gpus[0], mig_enabled=True, mig_instances=migs)
    recording = dataclasses.replace(recording, gpus=(gpu,))
    snapshot = fake_monitor_from_recording(recording, clock=SteppingClock()).poll()
    assert snapshot.gpus[0].mig_enabled is True
    assert snapshot.gpus[0].mig_instances == migs  # empty slots (NOT_FOUND) are skipped


def test_animated_fake_moves_deterministically_within_bounds():
    recording = load_snapshot(FIXTURES / "h200x2.json")

    def series(gpu_position: int) -> list[tuple[int, int, int, int]]:
        clock = SteppingClock(0.0)
        fake = FakeNvml(recording, clock=clock, animate=True)
        fake.nvmlInit()
        handle = fake.nvmlDeviceGetHandleByIndex(gpu_position)
        out = []
        for second in range(0, 90, 3):
            clock.now = float(second)
            util = fake.nvmlDeviceGetUtilizationRates(handle)
            memory = fake.nvmlDeviceGetMemoryInfo(handle)
            out.append((util.gpu, memory.used, fake.nvmlDeviceGetPowerUsage(handle),
                        fake.nvmlDeviceGetTemperature(handle, fake.NVML_TEMPERATURE_GPU)))
        return out

    first = series(0)
    assert first == series(0)  # same clock, same values
    assert first != series(1)  # each GPU has its own waveform
    gpu = recording.gpus[0]
    assert len({u for u, _, _, _ in first}) >= 5
    assert len({m for _, m, _, _ in first}) >= 5
    assert all(0 <= u <= 100 for u, _, _, _ in first)
    assert all(gpu.memory_used_bytes <= m <= gpu.memory_total_bytes for _, m, _, _ in first)
    assert all(0 < p <= gpu.power_limit_w * 1000 for _, _, p, _ in first)


def _libnvidia_ml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_real_binding_reports_library_not_found_where_there_is_no_driver():
    backend = NvmlBackend(pynvml, RecordedProcessResolver({}))
    reading = backend.read()
    backend.close()
    if _libnvidia_ml_loads():  # a GPU box: the same code path must then give GPUs or another reason
        assert reading.gpus or (reading.error is not None and reading.error.reason != "library_not_found")
    else:  # CI and the dev box
        assert reading.error is not None and reading.error.reason == "library_not_found"
        assert reading.error.nvml_code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
        assert reading.gpus == ()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b"00000000:18:00.0", "00000000:18:00.0"), ("0000:2a:00.0", "00000000:2A:00.0"), (b"", None), (None, None)],
)
def test_bus_ids_are_normalised(raw, expected):
    assert normalize_bus_id(raw) == expected


def test_cuda_version_formatting():
    assert format_cuda_version(13000) == "13.0"
    assert format_cuda_version(12080) == "12.8"
    assert format_cuda_version(None) is None and format_cuda_version(0) is None


def test_a_gpu_lost_mid_session_is_marked_lost_not_read_as_unsupported_fields():
    """Fake GPUs: h200x2, GPU 1 answers NVML_ERROR_GPU_IS_LOST (an Xid 79) after the first poll. It read as a
    GPU whose every field is N/A and that runs no process; now it is ``lost``, and the other GPU reads on."""
    clock = SteppingClock()
    fake = fake_nvml_from_recording(FIXTURES / "h200x2.json", clock=clock)
    monitor = monitor_over(fake, clock)
    first = monitor.poll()
    assert [g.lost for g in first.gpus] == [False, False]
    fake.lost.add(1)
    clock.now += 1.0
    snapshot = monitor.poll()
    assert snapshot.nvml_error is None
    healthy, lost = snapshot.gpus
    assert not healthy.lost and healthy.processes and healthy.utilization_gpu_pct is not None
    assert lost.lost and lost.processes == () and lost.utilization_gpu_pct is None
    # its static facts stay: which GPU it is
    assert (lost.name, lost.uuid, lost.memory_total_bytes) == (first.gpus[1].name, first.gpus[1].uuid,
                                                               first.gpus[1].memory_total_bytes)
    data = snapshot.to_json()
    assert [g["lost"] for g in data["gpus"]] == [False, True]
    assert BoxSnapshot.from_json(data).gpus[1].lost  # a recording replays it as lost


def test_a_gpu_lost_before_nvml_starts_is_marked_lost():
    recording = load_snapshot(FIXTURES / "h200x2.json")
    lost = dataclasses.replace(recording.gpus[1], lost=True)
    recording = dataclasses.replace(recording, gpus=(recording.gpus[0], lost))
    snapshot = fake_monitor_from_recording(recording, clock=SteppingClock()).poll()
    assert [g.lost for g in snapshot.gpus] == [False, True]
    assert snapshot.gpus[0].name == "NVIDIA H200" and snapshot.topology is None  # one GPU left to link


def test_nvml_unavailable_is_tried_again_so_a_driver_that_comes_up_shows_its_gpus():
    """h200x1 replayed. NVML gone mid-session (a driver reloaded), or not there yet at the first read (a fresh
    box whose driver cloud-init is still installing): the error was kept for the app's whole life, so the GPU
    screen said "No GPU readings" until tunedeck was restarted. Now NVML is started again every
    RETRY_UNAVAILABLE_S while it is unavailable, and not more often."""
    from core.hardware.nvml_backend import RETRY_UNAVAILABLE_S

    clock = SteppingClock()
    fake = fake_nvml_from_recording(FIXTURES / "h200x1.json", clock=clock, fail="driver_not_loaded")
    recording = fake.recording
    resolver = RecordedProcessResolver({p.pid: p for g in recording.gpus for p in g.processes})
    monitor = HardwareMonitor(NvmlBackend(fake, resolver, clock=clock), RecordedHostSampler(recording.host),
                              clock=clock)
    assert monitor.poll().nvml_error.reason == "driver_not_loaded"
    fake.fail = None  # the driver is loaded now
    clock.now += RETRY_UNAVAILABLE_S / 2
    assert monitor.poll().nvml_error.reason == "driver_not_loaded"  # not retried at every poll
    assert fake.calls["nvmlInit"] == 1
    clock.now += RETRY_UNAVAILABLE_S / 2
    snapshot = monitor.poll()
    assert snapshot.nvml_error is None and len(snapshot.gpus) == 1 and snapshot.driver_version == "580.159.04"

    fake.initialized = False  # the driver goes away mid-session
    clock.now += 1.0
    assert monitor.poll().nvml_error.reason == "nvml_error"
    clock.now += RETRY_UNAVAILABLE_S
    snapshot = monitor.poll()  # and comes back
    assert snapshot.nvml_error is None and len(snapshot.gpus) == 1
    assert fake.calls["nvmlInit"] == 3


def test_processes_nvml_will_not_list_are_unknown_not_none():
    """h200x1 on a driver that will not list compute processes (NOT_SUPPORTED, or NO_PERMISSION on a MIG GPU for
    a user who is not root): the GPU read as running nothing, "0 proc" on its card and in `tunedeck gpus`."""
    from core.hardware.commands import render_snapshot

    snapshot = fake_monitor_from_recording(FIXTURES / "h200x1.json", clock=SteppingClock(),
                                           unsupported={"nvmlDeviceGetComputeRunningProcesses"}).poll()
    gpu = snapshot.gpus[0]
    assert gpu.processes == () and gpu.processes_known is False
    assert snapshot.to_json()["gpus"][0]["processes_known"] is False
    row = next(line for line in render_snapshot(snapshot) if line.startswith("  0  "))
    assert row.split()[-1] == "N/A"
    listed = fake_monitor_from_recording(FIXTURES / "h200x1.json", clock=SteppingClock()).poll().gpus[0]
    assert listed.processes_known is True and len(listed.processes) == 1


def test_a_backend_whose_first_call_was_identities_recovers_once_the_driver_loads():
    """identities() found no driver (before the driver loaded, as on a box just booted) and kept the error
    without when it was found: read() then never started NVML again, the GPUs stayed unavailable for
    good. Now read() retries ``retry_s`` after it. Hardware: the fake NVML of an H200 x2 box, failing
    nvmlInit with driver_not_loaded until the test clears it."""
    clock = SteppingClock()
    fake = fake_nvml_from_recording(FIXTURES / "h200x2.json", clock=clock, fail="driver_not_loaded")
    backend = NvmlBackend(fake, RecordedProcessResolver({}), clock=clock, retry_s=10.0)
    assert backend.identities().error.reason == "driver_not_loaded"
    fake.fail = None  # the driver is loaded now
    clock.now += 11.0
    reading = backend.read()
    assert reading.error is None and len(reading.gpus) == 2
