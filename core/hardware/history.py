"""A bounded per-GPU history of readings, for sparklines and charts."""

from __future__ import annotations

from collections import deque

from core.hardware.snapshot import BoxSnapshot

# GpuSnapshot attributes (fields or properties) a history can chart.
METRICS = (
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "memory_used_bytes",
    "memory_used_fraction",
    "power_draw_w",
    "temperature_c",
    "clock_sm_mhz",
)


class GpuHistory:
    """The last ``capacity`` snapshots' values per GPU index; N/A readings stay ``None`` (gaps)."""

    def __init__(self, capacity: int = 300) -> None:
        if capacity < 1:
            raise ValueError("history capacity must be at least 1")
        self.capacity = capacity
        self._times: deque[float] = deque(maxlen=capacity)
        self._values: dict[tuple[int, str], deque[float | None]] = {}
        self._last_taken_at: float | None = None

    def add(self, snapshot: BoxSnapshot) -> bool:
        """Append ``snapshot``; False (nothing added) when it is the one added last (a shared poll)."""
        if snapshot.taken_at == self._last_taken_at:
            return False
        self._last_taken_at = snapshot.taken_at
        self._times.append(snapshot.taken_at)
        seen = set()
        for gpu in snapshot.gpus:
            for metric in METRICS:
                key = (gpu.index, metric)
                seen.add(key)
                self._series(key).append(getattr(gpu, metric))
        for key, values in self._values.items():
            if key not in seen:  # a GPU absent from this snapshot (NVML went away): a gap
                values.append(None)
        return True

    def _series(self, key: tuple[int, str]) -> deque[float | None]:
        values = self._values.get(key)
        if values is None:
            # A GPU first seen now: pad so every series lines up with the timestamps.
            values = deque([None] * (len(self._times) - 1), maxlen=self.capacity)
            self._values[key] = values
        return values

    def times(self) -> list[float]:
        return list(self._times)

    def series(self, gpu_index: int, metric: str) -> list[float | None]:
        """Values of ``metric`` for one GPU, oldest first, aligned with ``times()``."""
        if metric not in METRICS:
            raise ValueError(f"unknown GPU metric '{metric}'; one of: {', '.join(METRICS)}")
        values = self._values.get((gpu_index, metric))
        return list(values) if values is not None else [None] * len(self._times)
