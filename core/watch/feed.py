"""Feeds of a watched directory for a poller thread: metrics tail first then backfill, log and events.

A dashboard must show a run with a million metric lines at once: ``MetricsFeed.read_tail()`` parses only
the last few hundred kilobytes (the newest records), ``backfill()`` then builds the whole series from the
rest, and ``poll()`` follows what is appended. All three run in a worker thread; none touches a widget.
Records a resume superseded (``core.watch.resumes``) never leave the feed: each step once, the latest
attempt's; a resume appended while it is followed makes ``poll`` start over (tail, then ``backfill``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from core.text_width import as_shown
from core.watch.activity import UNREADABLE_DENIED, WriterActivity
from core.watch.adapters import parse_lines
from core.watch.follow import DEFAULT_MAX_READ, FileFollower, cut_tail_start, read_lines_between, tail_start
from core.watch.resumes import (
    RESUMED,
    drop_superseded,
    lowest_resume,
    resume_points,
    resume_step,
    segments,
    superseded,
)
from core.watch.series import RunSeries

METRICS_TAIL_BYTES = 256 * 1024
LOG_TAIL_BYTES = 128 * 1024
BACKFILL_BLOCK = 1024 * 1024


class MetricsFeed:
    """Normalised metric records of one file: the tail, the backfill, then appended records."""

    def __init__(self, path: Path, kind: str, tail_bytes: int = METRICS_TAIL_BYTES,
                 max_read: int = DEFAULT_MAX_READ) -> None:
        self.path = Path(path)
        self.kind = kind
        self.tail_bytes = tail_bytes
        self.max_read = max_read
        self.start = 0
        self.follower = FileFollower(self.path, max_read=max_read)
        self.header: dict[str, Any] | None = None
        self._tail_records: list[dict[str, Any]] = []
        self._tail_cutoff = math.inf  # the lowest resume step in the tail: what it supersedes before it
        self._newest_step = -math.inf  # the highest step handed on: a resume below it supersedes some
        # other trainers' files: the last train step read (a step not past it is a restart: mark_restarts)
        # and the tail's first train step (a restart may fall between the backfill and the tail)
        self._last_train: int | None = None
        self._tail_first_train: int | None = None
        self.activity = WriterActivity()  # read-only sources: is the writer still there (core.watch.activity)

    def read_tail(self) -> list[dict[str, Any]]:
        """The newest records (and the header record, read from the first line when we skip ahead).

        The tail is widened (doubled, up to ``max_read``) until it holds a train or eval record: ms-swift's
        last line carries the whole ``log_history`` (megabytes on a long run), and a tail that began inside
        it held nothing, so a finished run read as running, with no figures, in the header and ``--json``."""
        tail_bytes = self.tail_bytes
        while True:
            self.start = tail_start(self.path, tail_bytes)
            self.follower = FileFollower(self.path, offset=self.start, max_read=self.max_read)
            records = parse_lines(self.follower.read_new().lines, self.kind)
            if self.start <= 0 or tail_bytes >= self.max_read or any(
                    r.get("kind") in ("train", "eval") for r in records):
                break
            tail_bytes = min(2 * tail_bytes, self.max_read)
        if self.start > 0:
            first = next(iter(read_lines_between(self.path, 0, self.start, block=64 * 1024)), [])[:1]
            header = [r for r in parse_lines(first, self.kind) if r.get("kind") == "header"]
            records = header + records
        if self.kind != "tunedeck":
            self._tail_first_train = _first_train_step(records)
            records, self._last_train = mark_restarts(records, None)
        self._tail_cutoff = lowest_resume(records)
        records = drop_superseded(records)
        self._newest_step = _highest_step(records, -math.inf)
        self._tail_records = records
        self.activity.reset()
        self.activity.observe(records)
        self._note_error()
        return records

    def backfill(self) -> RunSeries | None:
        """The whole series (everything before the tail, then the tail); None if the tail was everything."""
        if self.start <= 0:
            return None
        # Cut at each resume: a record is kept unless a resume after it (here or in the tail) went back
        # before its step. tunedeck's own files record their resumes; another trainer's steps go back.
        if self.kind == "tunedeck":
            series = RunSeries()
            points = resume_points(self.path, self.start)
            for start, end, cutoff in segments(0, self.start, points, self._tail_cutoff):
                for lines in read_lines_between(self.path, start, end, block=BACKFILL_BLOCK):
                    series.extend_tunedeck_lines(lines, max_step=cutoff)
                    time.sleep(0)  # let the UI thread take the GIL between blocks
        else:
            series = self._backfill_other()
        series.extend([r for r in self._tail_records if r.get("kind") != "header"])
        self._tail_records = []
        return series

    def poll(self) -> tuple[list[dict[str, Any]], bool]:
        """(new records, restarted): ``restarted`` means the file was truncated or replaced.

        One bounded read (``max_read`` bytes): a file that grew by more, or was replaced by a long one, is
        caught up over the next polls instead of being parsed into memory in one go."""
        result = self.follower.read_new()
        records = parse_lines(result.lines, self.kind)
        if result.restarted:
            self.start = 0  # read from the start again: nothing left to backfill
            self.activity.reset()
            self._newest_step = -math.inf
            self._last_train = None
        if self.kind != "tunedeck":
            records, self._last_train = mark_restarts(records, self._last_train)
        newest = self._newest_step
        for record in records:
            step = resume_step(record)
            if step is not None and step < newest:
                # A resume went back before steps already handed on: start over, they are superseded.
                return self.read_tail(), True
            newest = _highest_step([record], newest)
        records = drop_superseded(records)
        self._newest_step = newest
        self.activity.observe(records)
        self._note_error()
        return records, result.restarted

    def _note_error(self) -> None:
        """A metric file that cannot be opened (its permissions) is said (``activity.unreadable``): it read as
        a run that had not logged yet, and a long one ended the dashboard's watcher and ``watch --json``
        with a traceback."""
        error = self.follower.error
        self.activity.unreadable = None if error is None else (
            self.path.name, error.strerror or type(error).__name__, UNREADABLE_DENIED)

    def _backfill_other(self) -> RunSeries:
        """Another trainer's records before the tail, each step once. One pass over the bytes builds the
        series and finds the restarts (``mark_restarts``); only where it found one, a second pass builds it
        again without the records they superseded (a long file is never held as records)."""
        def blocks():
            for lines in read_lines_between(self.path, 0, self.start, block=BACKFILL_BLOCK):
                yield parse_lines(lines, self.kind)
                time.sleep(0)  # let the UI thread take the GIL between blocks

        series = RunSeries()
        restarts: list[tuple[int, int]] = []  # (records read before it, its step), in file order
        count, last = 0, None
        for records in blocks():
            marked, last = mark_restarts(records, last)
            if len(marked) > len(records):
                for record in marked:
                    step = resume_step(record)
                    if step is None:
                        count += 1
                    else:
                        restarts.append((count, step))
            else:
                count += len(records)
            if not restarts:
                series.extend(records)
        cutoff = self._tail_cutoff
        if last is not None and self._tail_first_train is not None and self._tail_first_train <= last:
            cutoff = min(cutoff, self._tail_first_train - 1)  # the tail begins a new attempt
        if not restarts and cutoff == math.inf:
            return series
        # lowest[i]: the lowest step of restarts[i:] and the tail's (what supersedes a record before restarts[i])
        lowest = [cutoff] * (len(restarts) + 1)
        for i in range(len(restarts) - 1, -1, -1):
            lowest[i] = min(lowest[i + 1], restarts[i][1])
        series = RunSeries()
        count, i = 0, 0
        for records in blocks():
            kept = []
            for record in records:
                while i < len(restarts) and restarts[i][0] <= count:
                    i += 1  # a restart before this record: it does not supersede it
                count += 1
                if not superseded(record, lowest[i]):
                    kept.append(record)
            series.extend(kept)
        return series


def mark_restarts(records: list[dict[str, Any]], last: int | None) -> tuple[list[dict[str, Any]], int | None]:
    """Another trainer's records with a ``resumed`` record (``core.watch.resumes``) before each train record
    whose step is not past the train step before it (``last`` for the first): LLaMA-Factory appends a run
    restarted or resumed into the same folder to the same ``trainer_log.jsonl``, its steps going back, and
    the charts drew both attempts over each other. Each step is then taken once, the latest attempt's, as
    for a tunedeck run's resume. Returns the records and the last train step."""
    out: list[dict[str, Any]] = []
    for record in records:
        step = record.get("step")
        if record.get("kind") == "train" and isinstance(step, int) and not isinstance(step, bool):
            if last is not None and step <= last:
                out.append({"kind": RESUMED, "step": step - 1})
            last = step
        out.append(record)
    return out, last


def _first_train_step(records: list[dict[str, Any]]) -> int | None:
    step = next((r.get("step") for r in records if r.get("kind") == "train"), None)
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _highest_step(records: list[dict[str, Any]], newest: float) -> float:
    """The highest step of the train and eval records among ``records``, or ``newest`` if higher."""
    for record in records:
        step = record.get("step")
        if record.get("kind") in ("train", "eval") and isinstance(step, (int, float)) and step > newest:
            newest = step
    return newest


def open_metrics_feed(source: Any) -> Any:
    """The metrics feed of a ``WatchSource``: a ``MetricsFeed`` on its JSONL file, or for an HF Trainer dir
    or a TensorBoard log dir a feed with the same methods (``read_tail``, ``backfill``, ``poll``) and
    ``activity``. Call it in a worker: the TensorBoard one imports tensorboard."""
    from core.watch.source import HF_TRAINER, TENSORBOARD

    if source.kind == HF_TRAINER:
        from core.watch.trainer_state import TrainerStateFeed

        return TrainerStateFeed(source.path)
    if source.kind == TENSORBOARD:
        from core.watch.tb_events import TensorBoardFeed

        return TensorBoardFeed(source.metrics_path)
    return MetricsFeed(source.metrics_path, source.kind)


CUT_MARK = "\u2026"  # before the first line shown when the tail began inside it


class LinesFeed:
    """Text lines of a log, from its tail on; undecodable bytes are replaced, not fatal. A line the tail
    begins inside is kept, its end shown after ``CUT_MARK``. ``start``: the byte offset the lines shown
    begin at (0: the whole file is read; more: older lines were not)."""

    def __init__(self, path: Path | None, tail_bytes: int = LOG_TAIL_BYTES) -> None:
        self.path = path
        self.start, self._cut = cut_tail_start(path, tail_bytes) if path is not None else (0, False)
        self.follower = FileFollower(path, offset=self.start) if path is not None else None

    def poll(self) -> tuple[list[str], bool]:
        if self.follower is None:
            return [], False
        result = self.follower.read_new()
        if result.restarted:  # read again from its start: nothing is cut, nothing left unread
            self.start, self._cut = 0, False
        lines = [as_shown(line.decode("utf-8", "replace")) for line in result.lines]
        if lines and self._cut:
            lines[0] = CUT_MARK + lines[0]
            self._cut = False
        return lines, result.restarted


class EventsFeed:
    """Records of ``events.jsonl`` (checkpoints, evals, warnings), from the start."""

    def __init__(self, path: Path | None) -> None:
        self.follower = FileFollower(path) if path is not None else None

    def poll(self) -> tuple[list[dict[str, Any]], bool]:
        if self.follower is None:
            return [], False
        result = self.follower.read_new()
        return parse_lines(result.lines, "tunedeck"), result.restarted
