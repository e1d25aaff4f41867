"""One snapshot of the box per poll, shared by every consumer.

The TUI polls from one worker thread (``poll()``) while its UI thread reads the latest snapshot
(``snapshot()``); snapshots are immutable, so handing one out needs no copy. Polls closer together
than ``MIN_POLL_INTERVAL_S`` return the previous snapshot: several panels asking at once cost one
NVML round, and a mis-set interval cannot hammer the driver.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from core.hardware.host import HostSampler, LiveHostSampler
from core.hardware.nvml_backend import GpuReading, NvmlBackend
from core.hardware.snapshot import BoxSnapshot
from core.settings import MIN_POLL_INTERVAL_S

FAKE_GPUS_ENV = "TUNEDECK_FAKE_GPUS"


class GpuBackend(Protocol):
    def read(self) -> GpuReading: ...

    def close(self) -> None: ...


class HardwareMonitor:
    """Owns a GPU backend and a host sampler; ``poll()`` takes a snapshot, ``snapshot()`` shares it."""

    def __init__(
        self,
        backend: GpuBackend,
        host: HostSampler,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        synthetic: bool = False,
        source: Path | None = None,
    ) -> None:
        self._backend = backend
        self._host = host
        self._clock = clock
        self._wall_clock = wall_clock
        self._synthetic = synthetic
        # The recording fake GPUs replay, for screens to say so (None: this box's GPUs, or a recording
        # handed over in memory).
        self.source = source
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._latest: BoxSnapshot | None = None
        self._latest_at: float | None = None

    @property
    def interval_s(self) -> float:
        """Seconds between polls the caller should use; never below MIN_POLL_INTERVAL_S."""
        return self._interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        self._interval_s = max(MIN_POLL_INTERVAL_S, float(value))

    def poll(self) -> BoxSnapshot:
        """A fresh snapshot, or the latest one when it is younger than MIN_POLL_INTERVAL_S."""
        with self._lock:
            now = self._clock()
            if self._latest is not None and self._latest_at is not None:
                if now - self._latest_at < MIN_POLL_INTERVAL_S:
                    return self._latest
            reading = self._backend.read()
            snapshot = BoxSnapshot(
                taken_at=self._wall_clock(),
                host=self._host.sample(),
                gpus=reading.gpus,
                topology=reading.topology,
                driver_version=reading.driver_version,
                cuda_driver_version=reading.cuda_driver_version,
                nvml_error=reading.error,
                synthetic=self._synthetic,
            )
            self._latest, self._latest_at = snapshot, now
            return snapshot

    @property
    def latest(self) -> BoxSnapshot | None:
        """The latest snapshot, or None before the first poll; never blocks (for the UI thread)."""
        return self._latest

    def snapshot(self) -> BoxSnapshot:
        """The latest snapshot (taking the first one if none was taken yet)."""
        latest = self._latest
        return latest if latest is not None else self.poll()

    def close(self) -> None:
        with self._lock:
            self._backend.close()

    def __enter__(self) -> HardwareMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_monitor(interval_s: float | None = None) -> HardwareMonitor:
    """The monitor of this box, or of fake GPUs replaying ``$TUNEDECK_FAKE_GPUS`` (a recording).

    ``interval_s`` defaults to the user's ``gpu_poll_interval_s`` setting.
    """
    if interval_s is None:
        from core.settings import SettingsError, load_settings

        try:
            interval_s = load_settings().gpu_poll_interval_s
        except SettingsError:
            interval_s = 1.0
    recording = os.environ.get(FAKE_GPUS_ENV, "").strip()
    if recording:
        from core.hardware.fake_nvml import fake_monitor_from_recording
        from core.hardware.snapshot import SnapshotFormatError
        from core.i18n import t

        try:
            return fake_monitor_from_recording(Path(recording).expanduser(), animate=True, interval_s=interval_s)
        except SnapshotFormatError as exc:
            # Say where the path came from: a variable left set in a shell, not anything of tunedeck's own.
            raise SnapshotFormatError(t("hardware.bad_recording", env=FAKE_GPUS_ENV, error=str(exc))) from exc
    return HardwareMonitor(NvmlBackend(), LiveHostSampler(), interval_s=interval_s)
