"""HardwareMonitor: one shared snapshot per poll, the poll floor, the open_monitor factory."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from core.hardware import FAKE_GPUS_ENV, HardwareMonitor, open_monitor
from core.hardware.fake_nvml import fake_nvml_from_recording
from core.hardware.host import RecordedHostSampler
from core.hardware.nvml_backend import NvmlBackend
from core.hardware.processes import RecordedProcessResolver
from core.hardware.snapshot import SnapshotFormatError
from core.settings import MIN_POLL_INTERVAL_S, Settings, save_settings

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpus"


class SteppingClock:
    def __init__(self, now: float = 50.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def build(clock: SteppingClock, name: str = "h200x2.json"):
    fake = fake_nvml_from_recording(FIXTURES / name, clock=clock)
    monitor = HardwareMonitor(
        NvmlBackend(fake, RecordedProcessResolver({})),
        RecordedHostSampler(fake.recording.host),
        clock=clock,
        wall_clock=lambda: 1234.5,
    )
    return fake, monitor


def test_polls_closer_than_the_floor_share_the_previous_snapshot():
    assert MIN_POLL_INTERVAL_S == 0.25
    clock = SteppingClock()
    fake, monitor = build(clock)
    first = monitor.poll()
    clock.now += MIN_POLL_INTERVAL_S / 2
    assert monitor.poll() is first
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 2  # one NVML round for 2 GPUs
    clock.now += MIN_POLL_INTERVAL_S
    second = monitor.poll()
    assert second is not first
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 4
    assert second.taken_at == 1234.5


def test_snapshot_returns_the_latest_without_polling_again():
    clock = SteppingClock()
    fake, monitor = build(clock)
    assert monitor.latest is None  # the UI thread's view before the worker's first poll
    first = monitor.snapshot()  # no snapshot yet: takes one
    assert monitor.latest is first
    clock.now += 10
    assert monitor.snapshot() is first
    assert monitor.snapshot() is first
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 2
    newer = monitor.poll()
    assert monitor.snapshot() is newer


def test_interval_is_never_below_the_floor():
    _, monitor = build(SteppingClock())
    monitor.interval_s = 0.01
    assert monitor.interval_s == MIN_POLL_INTERVAL_S
    monitor.interval_s = 2
    assert monitor.interval_s == 2.0


def test_constructor_clamps_the_interval():
    fake = fake_nvml_from_recording(FIXTURES / "h200x1.json")
    monitor = HardwareMonitor(NvmlBackend(fake, RecordedProcessResolver({})),
                              RecordedHostSampler(fake.recording.host), interval_s=0.0)
    assert monitor.interval_s == MIN_POLL_INTERVAL_S


def test_concurrent_polls_cost_one_nvml_round_and_get_the_same_snapshot():
    clock = SteppingClock()
    fake, monitor = build(clock, "h200x8.json")
    results = []
    barrier = threading.Barrier(6)

    def worker():
        barrier.wait()
        results.append(monitor.poll())

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 6 and all(r is results[0] for r in results)
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 8
    assert fake.calls["nvmlInit"] == 1


def test_open_monitor_replays_fake_gpus_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    monkeypatch.setenv(FAKE_GPUS_ENV, str(FIXTURES / "h200x8.json"))
    with open_monitor() as monitor:
        snapshot = monitor.poll()
    assert snapshot.synthetic is True
    assert monitor.source == FIXTURES / "h200x8.json"  # for screens to say which recording they replay
    assert len(snapshot.gpus) == 8 and snapshot.gpus[7].name == "NVIDIA H200"
    assert snapshot.nvml_error is None
    assert snapshot.host.cpu_count_logical == 224  # the recorded host of the 8-GPU box


def test_open_monitor_takes_the_interval_from_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    monkeypatch.setenv(FAKE_GPUS_ENV, str(FIXTURES / "h200x1.json"))
    save_settings(Settings(gpu_poll_interval_s=2.5))
    assert open_monitor().interval_s == 2.5
    assert open_monitor(interval_s=0.1).interval_s == MIN_POLL_INTERVAL_S


def test_open_monitor_with_a_bad_recording_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    missing = tmp_path / "nope.json"
    monkeypatch.setenv(FAKE_GPUS_ENV, str(missing))
    with pytest.raises(SnapshotFormatError, match="nope.json") as raised:
        open_monitor()
    # The GPU screen showed only the file: where its path came from (a variable left set in the shell) and
    # what to do were in `tunedeck gpus` alone.
    assert FAKE_GPUS_ENV in str(raised.value) and "unset" in str(raised.value)


def test_open_monitor_without_fake_uses_nvml_of_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "not-yet-created"))
    monkeypatch.delenv(FAKE_GPUS_ENV, raising=False)
    with open_monitor() as monitor:
        snapshot = monitor.poll()
    assert snapshot.synthetic is False and monitor.source is None
    assert snapshot.host.cpu_count_logical and snapshot.host.memory_total_bytes
    assert snapshot.host.disk_path == str(tmp_path)  # nearest existing parent of the data root
    if snapshot.nvml_error is not None:  # this dev box and CI: no driver
        assert snapshot.gpus == ()
    else:
        assert snapshot.gpus
