"""Is another trainer's writer still there? ``running``, ``idle`` (since when), ``finished``, or ``gone``.

tunedeck's own runs have a supervisor and a status file; an ms-swift, LLaMA-Factory, HF Trainer or
TensorBoard folder has only its files. A folder is ``finished`` when its writer left a finished marker
(ms-swift's summary line, HF's summary entry or a ``trainer_state.json`` with ``global_step`` at
``max_steps``, the ``train_results.json``/``all_results.json`` that ``Trainer.save_metrics`` writes at the
end, or a last step at the total), and ``idle`` when nothing was written for longer than
``max(IDLE_FLOOR_S, IDLE_INTERVALS × the median time between its records)``: a run that logs every 5
minutes is not idle after 2. A folder deleted while it is watched is ``gone`` (a tunedeck run's
dashboard says the same of its run directory). The dashboard and ``tunedeck watch --json`` both ask
``writer_state``.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from core.runs.states import RunState, state_label

# A watched writer is running or finished as a run is (the dashboard reads both alike), or idle.
RUNNING = RunState.RUNNING
IDLE = "idle"
FINISHED = RunState.FINISHED
GONE = "gone"  # the watched folder (or a tunedeck run's directory) was deleted: nothing more will come

# what WriterState.problem says of an unreadable file: caught mid-write, or not to be opened at all
UNREADABLE_TORN = "watch.unreadable"
UNREADABLE_DENIED = "watch.unreadable_denied"

IDLE_FLOOR_S = 120.0
IDLE_INTERVALS = 10
_INTERVAL_WINDOW = 64
# Written by transformers' Trainer.save_metrics("train") after the last step (LLaMA-Factory, HF scripts).
FINISHED_FILES = ("train_results.json", "all_results.json")


class WriterActivity:
    """What the records of a watched file say about its writer: their spacing, the last step, an end."""

    def __init__(self) -> None:
        self.intervals: deque[float] = deque(maxlen=_INTERVAL_WINDOW)
        self.last_elapsed: float | None = None
        self.last_step: int | None = None
        self.total_steps: int | None = None
        self.ended = False
        # (file, error, message key): the writer's file has not parsed for a while (core.watch.trainer_state:
        # UNREADABLE_TORN) or cannot be opened (UNREADABLE_DENIED), else None
        self.unreadable: tuple[str, str, str] | None = None

    def reset(self) -> None:
        self.__init__()

    def observe(self, records: Iterable[dict[str, Any]]) -> None:
        """Take normalised records (``core.watch.adapters``) in file order."""
        for record in records:
            kind = record.get("kind")
            if kind == "end":
                self.ended = True
            elif kind == "train":
                self.ended = False  # a resumed run logs again after an earlier end
                step = record.get("step")
                if isinstance(step, int):
                    self.last_step = step
                total = record.get("total_steps")
                if isinstance(total, (int, float)) and total > 0:
                    self.total_steps = int(total)
                elapsed = record.get("elapsed_s")
                if isinstance(elapsed, (int, float)):
                    if self.last_elapsed is not None and elapsed > self.last_elapsed:
                        self.intervals.append(float(elapsed) - self.last_elapsed)
                    self.last_elapsed = float(elapsed)

    def note_interval(self, seconds: float) -> None:
        """A gap between writes known otherwise (HF checkpoints carry no time in their records)."""
        if seconds > 0:
            self.intervals.append(seconds)

    @property
    def median_interval(self) -> float | None:
        return statistics.median(self.intervals) if self.intervals else None

    @property
    def at_total(self) -> bool:
        return self.last_step is not None and self.total_steps is not None and self.last_step >= self.total_steps

    @property
    def finished(self) -> bool:
        """An end marker after the last step (a marker before the total is a run that stopped early: idle),
        or the last step at the total."""
        return self.at_total or (self.ended and self.total_steps is None)


@dataclass(frozen=True)
class WriterState:
    """``status`` (running | idle | finished), ``since``: the last write (epoch seconds) or None."""

    status: str
    since: float | None = None
    unreadable: tuple[str, str, str] | None = None  # (file, error, message key): see WriterActivity.unreadable

    def label(self, now: float | None = None) -> str:
        """"running", "finished" or "idle since 14:02" in the interface language."""
        from core.i18n import t

        if self.status == IDLE and self.since is not None:
            return t("watch.state.idle_since", time=format_since(self.since, now))
        if self.status == IDLE:
            return t("watch.state.idle")
        if self.status == GONE:
            return t("watch.state.gone")
        return state_label(self.status)

    def problem(self) -> str:
        """"trainer_state.json cannot be read (…): waiting for a whole write", or "" when all reads."""
        from core.i18n import t

        if self.unreadable is None:
            return ""
        file, error, key = self.unreadable
        return t(key, file=file, error=error)

    def to_json(self) -> dict[str, Any]:
        since = None
        if self.since is not None:
            since = datetime.fromtimestamp(self.since).astimezone().isoformat(timespec="seconds")
        unreadable = None
        if self.unreadable is not None:
            unreadable = {"file": self.unreadable[0], "error": self.unreadable[1], "message": self.problem()}
        return {"status": self.status, "last_write": since, "unreadable": unreadable}


def format_since(when: float, now: float | None = None) -> str:
    """Local time of ``when``: "14:02" today, the date ("2026-08-01") another day (short: it goes in
    the dashboard's header line; ``--json`` gives the full time)."""
    moment = datetime.fromtimestamp(when)
    today = datetime.fromtimestamp(time.time() if now is None else now).date()
    return moment.strftime("%H:%M" if moment.date() == today else "%Y-%m-%d")


def idle_after(activity: WriterActivity) -> float:
    """Seconds without a write after which the writer counts as gone."""
    interval = activity.median_interval
    return max(IDLE_FLOOR_S, IDLE_INTERVALS * interval) if interval else IDLE_FLOOR_S


def follows_newer(status: str) -> bool:
    """Whether a dashboard on the newest run of a folder named moves by itself to a newer run started there
    (``core.watch.source.newer_run``): once the run it shows is no longer written (idle, finished, deleted),
    the newer one is what goes on there (``watch --json`` on the folder gives it too). While it still runs,
    two runs go side by side: the user is told, and the dashboard's ``o`` moves."""
    return status != RUNNING


def activity_paths(source: Any) -> list[Path]:
    """The files whose writes show that the writer of ``source`` (a ``WatchSource``) is alive."""
    from core.watch.source import EVENT_GLOB, HF_TRAINER, TENSORBOARD, event_files

    paths = [] if source.log_path is None else [source.log_path]
    if source.kind == HF_TRAINER:
        paths.extend(source.path.glob("checkpoint-*/trainer_state.json"))
        paths.append(source.path / "trainer_state.json")
        paths.extend(event_files(source.path))  # HF's TensorBoardCallback logs every logging step
    elif source.kind == TENSORBOARD:
        paths.extend(source.metrics_path.glob(EVENT_GLOB))  # metrics_path is the events folder here
    else:
        paths.append(source.metrics_path)
    return paths


def last_write(paths: Iterable[Path]) -> float | None:
    """The newest modification time among ``paths`` (missing ones skipped); None if none exists."""
    newest = None
    for path in paths:
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if newest is None or mtime > newest:
            newest = mtime
    return newest


def finished_marker(folder: Path, log: Path | Iterable[Path] | None = None, started: float | None = None) -> bool:
    """A file that only a finished run leaves: ``train_results.json``/``all_results.json``, or a
    top-level ``trainer_state.json`` with ``global_step`` at ``max_steps``. With ``log`` (what a run writes
    while it trains: LLaMA-Factory's or ms-swift's appended metric file, an HF Trainer run's checkpoints)
    such a file older than its last write is an earlier run's: a run started again in the same folder
    writes them only at its end. So is one written before ``started`` (``training_started``: a run that has
    not saved or logged yet)."""
    logged = last_write([log] if isinstance(log, Path) else log) if log is not None else None

    def current(path: Path) -> bool:
        written = last_write([path])
        return (written is not None and (logged is None or written >= logged)
                and (started is None or written >= started))

    if any(current(folder / name) for name in FINISHED_FILES):
        return True
    state = folder / "trainer_state.json"
    return current(state) and trainer_state_finished(state)


# What HF's TensorBoardCallback writes into a new event file as training begins (``on_train_begin``: the
# arguments as text) and at each logging step ("train/…" scalars); an evaluate() after train() opens a file
# of its own too, with "eval/…" scalars only.
_TRAINING_TAGS = (b"args/text_summary", b"train/")
_EVENT_HEAD_BYTES = 64 * 1024
_EVENT_CACHE: dict[Path, tuple[int, bool]] = {}  # event file: (size read, whether a training run wrote it)


def training_started(folder: Path) -> float | None:
    """When the newest training run in ``folder`` began, by its TensorBoard event files (in ``runs/<date>_<host>/``
    by default): the time in the name of the newest event file (``events.out.tfevents.<time>.<host>…``, its
    creation) that holds what a training run writes at once. None without one.

    A run started again into a used output folder writes its event file first, long before its first
    checkpoint or metric line: the previous run's ``trainer_state.json`` and results then read "finished"
    over it. Only the newest files' first ``_EVENT_HEAD_BYTES`` are read, each once it says."""
    from core.watch.source import event_files

    dated = []
    for path in event_files(folder):
        try:
            dated.append((int(path.name.split(".")[3]), path))
        except (IndexError, ValueError):
            continue
    for when, path in sorted(dated, reverse=True):
        if _written_by_training(path):
            return float(when)
    return None


def _written_by_training(path: Path) -> bool:
    try:
        size = path.stat().st_size
    except OSError:
        return False
    cached = _EVENT_CACHE.get(path)
    if cached is not None and (cached[1] or cached[0] == size or cached[0] >= _EVENT_HEAD_BYTES):
        return cached[1]
    try:
        with open(path, "rb") as handle:
            head = handle.read(_EVENT_HEAD_BYTES)
    except OSError:
        return False
    found = any(tag in head for tag in _TRAINING_TAGS)
    _EVENT_CACHE[path] = (len(head), found)
    return found


_STATE_CACHE: dict[Path, tuple[int, bool]] = {}


def trainer_state_finished(path: Path) -> bool:
    """``global_step`` at ``max_steps`` in an HF ``trainer_state.json`` (re-read only when it changes)."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return False
    cached = _STATE_CACHE.get(path)
    if cached is not None and cached[0] == mtime:
        return cached[1]
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        state = None
    finished = False
    if isinstance(state, dict):
        step, total = state.get("global_step"), state.get("max_steps")
        finished = isinstance(step, int) and isinstance(total, int) and total > 0 and step >= total
    _STATE_CACHE[path] = (mtime, finished)
    return finished


def writer_state(source: Any, activity: WriterActivity, now: float | None = None) -> WriterState:
    """running / idle since … / finished / gone for a read-only source, from its records and its files'
    times (a folder deleted while it is watched kept "running", with an ETA, for ever)."""
    now = time.time() if now is None else now
    since = last_write(activity_paths(source))
    unreadable = activity.unreadable
    if not source.path.is_dir():
        return WriterState(GONE, since, unreadable)
    from core.watch.source import HF_TRAINER, LLAMAFACTORY, SWIFT, current_checkpoints, trainer_state_file

    if source.kind == LLAMAFACTORY and not source.metrics_path.exists():
        # LLaMA-Factory removes its trainer_log.jsonl as a run started again with overwrite_output_dir begins
        # (LogCallback.on_init_end), minutes before its first line: the results and the trainer_state.json at
        # its total beside it are the previous run's, and they read "finished". The removal is the new run's
        # first write (the folder's time).
        since = max((when for when in (since, last_write([source.path])) if when is not None), default=None)
        if since is not None and now - since > idle_after(activity):
            return WriterState(IDLE, since, unreadable)
        return WriterState(RUNNING, since, unreadable)
    log: Path | list[Path] | None = None
    read: Path | None = None  # the file the feed read the records of
    if source.kind in (LLAMAFACTORY, SWIFT):
        log = read = source.metrics_path
    elif source.kind == HF_TRAINER:  # its checkpoints come before its results (its events may not: an
        log = [state for _when, state in current_checkpoints(source.path)]  # evaluate() after train())
        read = trainer_state_file(source.path)
    started = training_started(source.path) if read is not None else None  # a run started again, not saved yet
    # the end the feed read (its last step at the total, its summary) is an earlier run's where its file is older
    earlier = started is not None and (last_write([read]) or 0.0) < started
    if activity.finished and not earlier or finished_marker(source.path, log, started):
        return WriterState(FINISHED, since, unreadable)
    if activity.ended and not earlier or since is not None and now - since > idle_after(activity):
        return WriterState(IDLE, since, unreadable)  # an end marker before the total: the run stopped early
    return WriterState(RUNNING, since, unreadable)
