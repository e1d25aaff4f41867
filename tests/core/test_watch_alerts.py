"""Alert rules as pure functions, and the gate that fires each alert once per occurrence."""

from __future__ import annotations

from core.watch.alerts import (
    REARM_S,
    AlertGate,
    disk_alert,
    ended_alert,
    gpu_idle_alert,
    loss_alert,
    throughput_alert,
)
from core.watch.series import RunSeries

GIB = 1024**3


def test_nan_loss_alerts_at_once():
    alert = loss_alert(None, True, 2.0, 50, step=17)
    assert alert and alert.kind == "loss_nan" and alert.severity == "error" and "17" in alert.message


def test_spike_needs_three_times_a_settled_ema():
    assert loss_alert(7.0, False, 2.0, 50).kind == "loss_spike"
    assert loss_alert(5.9, False, 2.0, 50) is None
    assert loss_alert(7.0, False, 2.0, 5) is None  # too few points for a meaningful average
    assert loss_alert(None, False, None, 0) is None


def test_spike_from_a_real_series():
    series = RunSeries()
    series.extend([{"kind": "train", "step": s, "loss": 1.0} for s in range(1, 30)])
    series.extend([{"kind": "train", "step": 30, "loss": 4.0}])
    alert = loss_alert(series.last_loss, series.last_loss_nan, series.ema_before_last, series.ema_points, 30)
    assert alert is not None and alert.kind == "loss_spike"


def test_a_threefold_rise_near_zero_loss_is_noise_not_a_spike():
    # An overfitted run: 0.04 -> 0.13 is over 3x its average but 0.09 nats; a real divergence still alerts.
    assert loss_alert(0.13, False, 0.04, 50) is None
    assert loss_alert(0.45, False, 0.1, 50) is None  # 4.5x, 0.35 nats: still under the floor
    assert loss_alert(4.0, False, 1.2, 50).kind == "loss_spike"
    series = RunSeries()
    series.extend([{"kind": "train", "step": s, "loss": 0.04} for s in range(1, 30)])
    series.extend([{"kind": "train", "step": 30, "loss": 0.13}])
    assert loss_alert(series.last_loss, series.last_loss_nan, series.ema_before_last, series.ema_points, 30) is None


def test_throughput_collapse_against_the_median():
    steady = [10_000.0] * 20
    assert throughput_alert(steady) is None
    assert throughput_alert(steady + [2_500.0]).kind == "throughput"
    assert throughput_alert(steady + [3_500.0]) is None
    assert throughput_alert([10_000.0] * 5 + [10.0]) is None  # too little history


def test_gpu_idle_needs_a_full_minute_of_idle_while_running():
    idle = [(1000.0 + i, 1.0) for i in range(0, 61, 5)]
    assert gpu_idle_alert(idle, "running", now=1060.0).kind == "gpu_idle"
    assert gpu_idle_alert(idle, "finished", now=1060.0) is None
    assert gpu_idle_alert(idle[:6], "running", now=1025.0) is None  # watched for 25 s only
    busy_once = idle[:-1] + [(1060.0, 80.0)]
    assert gpu_idle_alert(busy_once, "running", now=1060.0) is None
    assert gpu_idle_alert(idle + [(1065.0, None)], "running", now=1065.0) is None  # unknown is not idle


def test_disk_below_five_percent_or_ten_gib():
    assert disk_alert(9 * GIB, 1000 * GIB, "/data").kind == "disk"
    assert disk_alert(40 * GIB, 1000 * GIB, "/data").kind == "disk"  # 4 %
    assert disk_alert(60 * GIB, 1000 * GIB, "/data") is None
    assert disk_alert(None, None, "/data") is None


def test_run_end_is_announced_once_on_the_transition():
    assert ended_alert("running", "finished", "r1").severity == "information"
    assert ended_alert("running", "crashed", "r1").severity == "error"
    assert ended_alert(None, "failed", "r1") is None  # opened on an already-ended run
    assert ended_alert("failed", "failed", "r1") is None
    assert ended_alert("starting", "running", "r1") is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_gate_fires_on_appearance_only():
    clock = Clock()
    gate = AlertGate(clock)
    alert = throughput_alert([10_000.0] * 20 + [100.0])
    assert gate.filter({"throughput": alert}) == [alert]
    assert gate.filter({"throughput": alert}) == []
    assert gate.filter({"throughput": None}) == []
    clock.now += REARM_S + 1
    assert gate.filter({"throughput": None}) == []
    assert gate.filter({"throughput": alert}) == [alert]  # cleared for long enough: a new episode


def test_gate_fires_once_per_episode_while_the_condition_flickers():
    """Throughput at the threshold: low, normal, low … from one poll to the next, for 15 s: one toast."""
    clock = Clock()
    gate = AlertGate(clock)
    low = throughput_alert([10_000.0] * 20 + [100.0])
    fired = []
    for poll in range(30):
        clock.now += 0.5
        fired += gate.filter({"throughput": low if poll % 3 != 1 else None})
    assert fired == [low]
    # it clears, stays clear, and comes back: the next episode toasts again
    for _ in range(int(REARM_S) + 1):
        clock.now += 1.0
        assert gate.filter({"throughput": None}) == []
    assert gate.filter({"throughput": low}) == [low]


def test_a_run_ending_twice_is_announced_twice():
    clock = Clock()
    gate = AlertGate(clock)
    ended = ended_alert("running", "failed", "r1")
    assert gate.filter({"ended": ended}) == [ended]
    assert gate.filter({"ended": None}) == []  # resumed
    clock.now += 5
    assert gate.filter({"ended": ended}) == [ended]  # a transition each time, not a flickering condition
