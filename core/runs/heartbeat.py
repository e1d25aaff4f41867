"""The trainer's heartbeat, and the ``stalled`` state readers compute from it.

Every trainer process runs a small thread that rewrites ``RUN_DIR/heartbeat-rankN.json`` every few
seconds (``TUNEDECK_HEARTBEAT_S``, default 2) with the time, the last optimizer step, when it ended and
the median of the recent step times. The thread lives in the trainer's own process, so whatever freezes
the trainer (SIGSTOP, a swapped-out box, a hung driver call that holds the interpreter) freezes the
heartbeat too; on a full disk it falls back to touching the file (no blocks needed).

A run whose status says ``running`` or ``starting`` and whose supervisor is alive is ``stalled`` when no
step and no heartbeat came for N seconds, N = max(floor, 5 x the median step time, 3 x the heartbeat
interval); the floor is 60 s (``TUNEDECK_STALL_FLOOR_S`` changes it: tests). While a checkpoint is being
written N is ten times longer: writing tens of GB can hold the interpreter. The heartbeat starts before the
model loads (``phase`` "setup"), so a trainer that hangs while it starts is seen too; one that has written
no heartbeat yet (it is still importing Python modules) is judged from its process's start, allowed twice
the floor. ``stalled`` is never written to
status.json: it is what a reader sees, and it goes away by itself when the trainer moves again.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEARTBEAT_ENV = "TUNEDECK_HEARTBEAT_S"
STALL_FLOOR_ENV = "TUNEDECK_STALL_FLOOR_S"
DEFAULT_INTERVAL_S = 2.0
DEFAULT_STALL_FLOOR_S = 60.0
STEP_FACTOR = 5.0
INTERVAL_FACTOR = 3.0
SAVING_FACTOR = 10.0
STARTUP_FACTOR = 2.0  # before the trainer's first heartbeat: the floor times this, from its process's start
# The ETA's step time leaves out this share of the slowest recent intervals (rounded down): a pause or a save
# among ten or more; the rest is averaged, so that steps slowed now and then (a busy CPU) count as they cost.
ETA_TRIM_SHARE = 0.1
# From this many intervals on at least the slowest one is left out, ten or not: a checkpoint save among the
# first few logs counted in full, the ETA several times too long until the tenth.
ETA_TRIM_MIN_INTERVALS = 4
_PREFIX = "heartbeat-rank"


def heartbeat_path(run_path: Path, rank: int) -> Path:
    return Path(run_path) / f"{_PREFIX}{rank}.json"


def heartbeat_files(run_path: Path) -> list[Path]:
    try:
        return sorted(p for p in Path(run_path).iterdir() if p.name.startswith(_PREFIX) and p.suffix == ".json")
    except OSError:
        return []


def clear_heartbeats(run_path: Path) -> None:
    """Remove the heartbeats of an earlier attempt (the supervisor does, before it starts a trainer)."""
    for path in heartbeat_files(run_path):
        try:
            path.unlink()
        except OSError:
            pass


def _env_float(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, "") or default)
    except ValueError:
        return default
    return value if value > 0 else default


class RecentStepTimes:
    """The wall time of one optimizer step over the last ``window`` intervals told by ``note(step, at)``.
    ``median()`` is the steady step time, which one slow interval (a resume's data skip, a SIGSTOP pause, a
    checkpoint save) does not move: the heartbeat's stall threshold uses it. ``eta_step_s()`` (the mean less
    the slowest intervals) is what the trainer's ETA multiplies."""

    def __init__(self, window: int = 64) -> None:
        self.durations: deque[float] = deque(maxlen=window)
        self.step: int | None = None
        self.at: float | None = None

    def note(self, step: int, at: float) -> None:
        """Step ``step`` ended at ``at``; the interval since the previous note counts per step."""
        if self.at is not None and self.step is not None and step > self.step:
            self.durations.append((at - self.at) / (step - self.step))
        self.step, self.at = step, at

    def median(self) -> float | None:
        return statistics.median(self.durations) if self.durations else None

    def eta_step_s(self) -> float | None:
        """The step time an ETA multiplies: the mean of the recent intervals less the slowest ``ETA_TRIM_SHARE``
        of them. The median read half the time a busy CPU took: it is the fast steps' time where a third of the
        steps take several times as long; the mean counts them, the trim keeps a rare pause out. From
        ``ETA_TRIM_MIN_INTERVALS`` intervals on at least the slowest is left out (a save among the first logs)."""
        if not self.durations:
            return None
        count = len(self.durations)
        trim = max(int(count * ETA_TRIM_SHARE), 1 if count >= ETA_TRIM_MIN_INTERVALS else 0)
        kept = sorted(self.durations)[:count - trim]
        return statistics.fmean(kept)


class HeartbeatWriter:
    """The trainer side: ``start()`` once, ``note_step(step)`` at each optimizer step, ``phase("saving")``."""

    def __init__(self, run_path: Path, rank: int, interval_s: float | None = None) -> None:
        self.path = heartbeat_path(run_path, rank)
        self.rank = rank
        self.interval_s = interval_s or _env_float(HEARTBEAT_ENV, DEFAULT_INTERVAL_S)
        self.current_phase = "setup"
        self.step_times = RecentStepTimes()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HeartbeatWriter:
        self.beat()
        self._thread = threading.Thread(target=self._loop, name="tunedeck-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def step(self) -> int | None:
        return self.step_times.step

    @property
    def step_ts(self) -> float | None:
        return self.step_times.at

    def note_step(self, step: int) -> None:
        with self._lock:
            self.step_times.note(step, time.time())
            self.current_phase = "training"

    def median_step_s(self) -> float | None:
        """The median time of one optimizer step over the recent steps noted (``RecentStepTimes``)."""
        with self._lock:
            return self.step_times.median()

    def phase(self, name: str) -> None:
        """Say what the trainer does now; written at once (the thread may not get a turn while it lasts)."""
        with self._lock:
            self.current_phase = name
        self.beat()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def beat(self) -> None:
        with self._lock:
            median = self.step_times.median()
            payload = {"pid": os.getpid(), "rank": self.rank, "ts": round(time.time(), 3),
                       "interval_s": self.interval_s, "step": self.step, "step_ts": self.step_ts,
                       "median_step_s": round(median, 4) if median is not None else None,
                       "phase": self.current_phase}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps(payload) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            try:  # a full disk: a new mtime needs no blocks
                os.utime(self.path)
            except OSError:
                pass


_current: HeartbeatWriter | None = None


def start_heartbeat(run_path: Path, rank: int) -> HeartbeatWriter:
    """Start this process's heartbeat (the trainer does, first thing)."""
    global _current
    _current = HeartbeatWriter(run_path, rank).start()
    return _current


def current_heartbeat() -> HeartbeatWriter | None:
    """This process's heartbeat, if it started one (callbacks and the checkpoint writer use it)."""
    return _current


@dataclass(frozen=True)
class Stall:
    """No step and no heartbeat for ``silent_s`` seconds, more than the ``threshold_s`` allowed."""

    silent_s: float
    threshold_s: float
    step: int | None
    rank: int


def stall_floor_s() -> float:
    return _env_float(STALL_FLOOR_ENV, DEFAULT_STALL_FLOOR_S)


def _metrics_written(run_path: Path) -> float:
    """When metrics.jsonl was last written (0 before it exists): a step written is a sign of life."""
    try:
        return (Path(run_path) / "metrics.jsonl").stat().st_mtime
    except OSError:
        return 0.0


def _beats(run_path: Path) -> Iterator[tuple[dict[str, Any], float]]:
    """Each readable heartbeat's payload and its latest sign of life: the file's mtime, its ``ts``, its last
    step's ``step_ts`` (a value that is not a number counts as none)."""
    for path in heartbeat_files(run_path):
        try:
            mtime = path.stat().st_mtime
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        times = [mtime]
        for key in ("ts", "step_ts"):
            try:
                times.append(float(data.get(key) or 0.0))
            except (TypeError, ValueError):
                pass
        yield data, max(times)


Beats = list[tuple[dict[str, Any], float]]


def read_beats(run_path: Path) -> Beats:
    """Every readable heartbeat of the run (``_beats``), read once: what ``find_stall``, ``last_sign_of_life``
    and ``last_heartbeat_step`` take as ``beats`` when one caller asks all of them (the runs listing)."""
    return list(_beats(run_path))


def last_sign_of_life(run_path: Path, beats: Beats | None = None) -> float | None:
    """Unix time of the run's latest sign of life: its newest heartbeat (any rank, ``_beats``) or metrics.jsonl's
    last write, whichever is later; None before a trainer wrote either. What ``find_stall`` measures silence
    from; ``tunedeck status --json`` gives it as ``last_alive``, so that a script tells a hung run (it stops
    moving) from a live one."""
    beats = read_beats(run_path) if beats is None else beats
    latest = max([_metrics_written(run_path), *(alive for _, alive in beats)])
    return latest if latest > 0 else None


def last_heartbeat_step(run_path: Path, beats: Beats | None = None) -> int | None:
    """The newest optimizer step any rank's heartbeat has told of, or None."""
    steps = [data.get("step") for data, _ in (read_beats(run_path) if beats is None else beats)]
    steps = [s for s in steps if isinstance(s, int) and not isinstance(s, bool)]
    return max(steps) if steps else None


def find_stall(run_path: Path, now: float | None = None, started_at: float | None = None,
               beats: Beats | None = None) -> Stall | None:
    """The most silent rank of the run, if it has been silent too long (module docstring); None when
    every rank is alive. Before any heartbeat is written, silence counts from ``started_at`` (the trainer
    process's start time), against twice the floor; None without it (an older trainer wrote none)."""
    now = time.time() if now is None else now
    floor = stall_floor_s()
    metrics_ts = _metrics_written(run_path)
    worst: Stall | None = None
    beats = read_beats(run_path) if beats is None else beats
    if not beats and started_at is not None:
        silent, threshold = now - max(started_at, metrics_ts), STARTUP_FACTOR * floor
        return Stall(round(silent, 1), round(threshold, 1), None, 0) if silent > threshold else None
    for data, beat in beats:
        alive = max(beat, metrics_ts)
        threshold = max(floor, STEP_FACTOR * float(data.get("median_step_s") or 0.0),
                        INTERVAL_FACTOR * float(data.get("interval_s") or DEFAULT_INTERVAL_S))
        if data.get("phase") == "saving":
            threshold *= SAVING_FACTOR
        silent = now - alive
        step = data.get("step") if isinstance(data.get("step"), int) else None
        if silent > threshold and (worst is None or silent - threshold > worst.silent_s - worst.threshold_s):
            worst = Stall(round(silent, 1), round(threshold, 1), step, int(data.get("rank") or 0))
    return worst
