"""Alert rules over a run's series and GPU readings: pure functions, plus a gate that fires each once.

Each rule returns an ``Alert`` (translated message, severity) or None. ``AlertGate`` turns a stream of
evaluations into notifications, one per episode: an alert fires when its condition appears and again only
after the condition stayed away for ``REARM_S`` and came back. So a run stuck at NaN does not notify twice
a second, and a throughput hovering at the threshold (low, normal, low again from one poll to the next)
is one collapse, not a toast every few seconds.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from core.i18n import t
from core.runs.states import RunState
from core.units import format_rate

SPIKE_FACTOR = 3.0
# A spike must also rise this many nats above the EMA. Near zero a ratio is noise: an overfitted run's
# 0.04 -> 0.13 is 3x but 0.09 nats, one odd batch. 0.5 nats is a perplexity 1.65x the average's (e^0.5),
# above the batch-to-batch swing of a converged run, while a real divergence (1.2 -> 4.0, 2.8 nats) passes.
SPIKE_MIN_RISE = 0.5
SPIKE_MIN_POINTS = 10
THROUGHPUT_COLLAPSE = 0.3
THROUGHPUT_MIN_POINTS = 10
GPU_IDLE_PCT = 5.0
GPU_IDLE_S = 60.0
DISK_MIN_FRACTION = 0.05
DISK_MIN_BYTES = 10 * 1024**3
REARM_S = 60.0  # a condition must stay clear this long before its next appearance is a new episode
EVENT_ALERTS = frozenset({"ended"})  # transitions, not conditions: each one is its own episode
ENDED = {RunState.FINISHED: "information", RunState.STOPPED: "information", RunState.FAILED: "error",
         RunState.CRASHED: "error"}


@dataclass(frozen=True)
class Alert:
    kind: str  # loss_nan, loss_spike, throughput, gpu_idle, disk, stalled, ended
    severity: str  # information, warning, error (Textual's notify severities)
    message: str


def loss_alert(last_loss: float | None, loss_is_nan: bool, ema_before: float | None, ema_points: int,
               step: int | None = None) -> Alert | None:
    """NaN loss, or a loss above ``SPIKE_FACTOR`` times its EMA and more than ``SPIKE_MIN_RISE`` nats over it
    (once the EMA has settled)."""
    if loss_is_nan:
        return Alert("loss_nan", "error", t("watch.alert_nan", step=step if step is not None else "?"))
    if last_loss is None or ema_before is None or ema_points <= SPIKE_MIN_POINTS or ema_before <= 0:
        return None
    if last_loss > SPIKE_FACTOR * ema_before and last_loss - ema_before > SPIKE_MIN_RISE:
        return Alert("loss_spike", "warning", t("watch.alert_spike", loss=f"{last_loss:.4g}", ema=f"{ema_before:.4g}",
                                                 step=step if step is not None else "?"))
    return None


def throughput_alert(recent: Sequence[float]) -> Alert | None:
    """The latest tokens/s below ``THROUGHPUT_COLLAPSE`` of the median of the recent window."""
    if len(recent) < THROUGHPUT_MIN_POINTS:
        return None
    median = statistics.median(recent)
    latest = recent[-1]
    if median > 0 and latest < THROUGHPUT_COLLAPSE * median:
        return Alert("throughput", "warning", t("watch.alert_throughput", now=format_rate(latest),
                                                 median=format_rate(median)))
    return None


def gpu_idle_alert(samples: Iterable[tuple[float, float | None]], status: str, now: float) -> Alert | None:
    """Every reading of the run's GPUs in the last ``GPU_IDLE_S`` seconds under ``GPU_IDLE_PCT`` while the
    run says it is running. ``samples`` are (monotonic time, mean utilisation %) oldest first."""
    if status != RunState.RUNNING:
        return None
    window = [(ts, util) for ts, util in samples if now - ts <= GPU_IDLE_S + 1e-9]
    if not window or now - window[0][0] < GPU_IDLE_S - 1.0:
        return None  # not watched for a whole window yet
    if all(util is not None and util < GPU_IDLE_PCT for _ts, util in window):
        return Alert("gpu_idle", "warning", t("watch.alert_gpu_idle", seconds=int(GPU_IDLE_S)))
    return None


def disk_alert(free_bytes: int | None, total_bytes: int | None, where: str) -> Alert | None:
    """Less than 5 % or less than 10 GiB free on the disk of ``where`` (the folder measured, named)."""
    if free_bytes is None or not total_bytes:
        return None
    if free_bytes < DISK_MIN_BYTES or free_bytes / total_bytes < DISK_MIN_FRACTION:
        return Alert("disk", "warning", t("watch.alert_disk", free=f"{free_bytes / 1024**3:.1f}", path=where))
    return None


def ended_alert(previous: str | None, current: str, run_id: str) -> Alert | None:
    """The run went from an active state to a final one while we watched."""
    if previous is None or previous == current or current not in ENDED:
        return None
    if previous in ENDED:
        return None
    return Alert("ended", ENDED[current], t(f"watch.alert_{current}", id=run_id))


def stalled_alert(status: str, run_id: str, reason: str = "") -> Alert | None:
    """The run is ``stalled``: its supervisor lives but the trainer made no step and no heartbeat for
    longer than its step time allows (``core.runs.heartbeat``); ``reason`` says for how long."""
    if status != RunState.STALLED:
        return None
    return Alert("stalled", "warning", t("watch.alert_stalled", id=run_id, reason=reason))


def is_finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class AlertGate:
    """Lets an alert kind through when it appears; silent while it persists, and while it flickers: it is
    re-armed only once its condition has stayed clear for ``rearm_s`` (``clock``: monotonic seconds).
    The kinds in ``EVENT_ALERTS`` re-arm at once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, rearm_s: float = REARM_S) -> None:
        self.clock = clock
        self.rearm_s = rearm_s
        self.active: set[str] = set()
        self.cleared_at: dict[str, float] = {}  # kinds that cleared during an episode, and when

    def filter(self, evaluated: dict[str, Alert | None]) -> list[Alert]:
        fired: list[Alert] = []
        now = self.clock()
        for kind, alert in evaluated.items():
            if alert is None:
                if kind in self.active:
                    self.active.discard(kind)
                    self.cleared_at[kind] = now
                continue
            if kind in self.active:
                continue
            self.active.add(kind)
            cleared = self.cleared_at.pop(kind, None)
            if cleared is not None and kind not in EVENT_ALERTS and now - cleared < self.rearm_s:
                continue  # back before it settled: the same episode
            fired.append(alert)
        return fired
