"""The box's hardware: GPUs through NVML, the host through psutil, as immutable snapshots.

Use ``open_monitor()`` for the box (or for fake GPUs when ``TUNEDECK_FAKE_GPUS`` names a recording),
``HardwareMonitor.poll()`` from a worker and ``.snapshot()`` from readers. The JSON form of a
snapshot is documented in SCHEMA.md. Importing this package loads no NVML binding.
"""

from __future__ import annotations

from typing import Any

from core.hardware.history import GpuHistory
from core.hardware.monitor import FAKE_GPUS_ENV, HardwareMonitor, open_monitor
from core.hardware.snapshot import (
    SCHEMA_VERSION,
    BoxSnapshot,
    GpuProcess,
    GpuSnapshot,
    HostSnapshot,
    MigInstance,
    NvmlUnavailable,
    SnapshotFormatError,
    Topology,
    load_snapshot,
)
from core.settings import MIN_POLL_INTERVAL_S

_LAZY = {"FakeNvml", "fake_monitor_from_recording", "fake_nvml_from_recording"}


def __getattr__(name: str) -> Any:
    # The fake imports the pynvml binding for its exception classes: only load it when asked for.
    if name in _LAZY:
        from core.hardware import fake_nvml

        return getattr(fake_nvml, name)
    raise AttributeError(f"module 'core.hardware' has no attribute '{name}'")


__all__ = [
    "FAKE_GPUS_ENV",
    "MIN_POLL_INTERVAL_S",
    "SCHEMA_VERSION",
    "BoxSnapshot",
    "FakeNvml",
    "GpuHistory",
    "GpuProcess",
    "GpuSnapshot",
    "HardwareMonitor",
    "HostSnapshot",
    "MigInstance",
    "NvmlUnavailable",
    "SnapshotFormatError",
    "Topology",
    "fake_monitor_from_recording",
    "fake_nvml_from_recording",
    "load_snapshot",
    "open_monitor",
]
