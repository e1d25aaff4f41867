"""GpuHistory fed by the animated fake NVML through a real monitor."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.hardware.fake_nvml import fake_monitor_from_recording
from core.hardware.history import GpuHistory

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpus"


class SteppingClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_history_keeps_the_last_readings_per_gpu_and_skips_shared_polls():
    clock = SteppingClock()
    monitor = fake_monitor_from_recording(FIXTURES / "h200x2.json", clock=clock, wall_clock=clock, animate=True)
    history = GpuHistory(capacity=10)
    for step in range(15):
        clock.now = float(step)
        assert history.add(monitor.poll()) is True
        assert history.add(monitor.poll()) is False  # same poll again (under the floor): not twice
    assert history.times() == [float(s) for s in range(5, 15)]
    util = history.series(0, "utilization_gpu_pct")
    assert len(util) == 10 and len(set(util)) > 3 and all(0 <= u <= 100 for u in util)
    assert history.series(0, "utilization_gpu_pct") != history.series(1, "utilization_gpu_pct")
    fractions = history.series(1, "memory_used_fraction")
    assert all(0 < f <= 1 for f in fractions)
    assert history.series(5, "power_draw_w") == [None] * 10  # a GPU the box does not have
    with pytest.raises(ValueError, match="unknown GPU metric"):
        history.series(0, "fan")
    with pytest.raises(ValueError):
        GpuHistory(capacity=0)
