"""Feeds of a watched directory for a poller thread: metrics tail first then backfill, log and events.

A dashboard must show a run with a million metric lines at once: ``MetricsFeed.read_tail()`` parses only
the last few hundred kilobytes (the newest records), ``backfill()`` then builds the whole series from the
rest, and ``poll()`` follows what is appended. All three run in a worker thread; none touches a widget.
Records a resume superseded (``core.watch.resumes``) never leave the feed: each step once, the latest
attempt's; a resume appended while it is followed makes ``poll`` start over (tail, then ``backfill``).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
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
    pending_resume,
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
                 max_read: int = DEFAULT_MAX_READ, record_path: Path | None = None) -> None:
        self.path = Path(path)
        self.kind = kind
        # A tunedeck run's run.json: a resume it records that its trainer has not logged yet (``pending_resume``)
        # is taken as a ``resumed`` record at the file's end, as ``tunedeck status`` takes it. The charts drew the
        # steps that resume gave up (and their loss) while its trainer loaded, and for good where that attempt
        # stopped or failed before its first step.
        self.record_path = None if record_path is None else Path(record_path)
        self._record_stamp: tuple[int, int] | None = None  # run.json's (mtime, size) when last read
        self._asked: dict[str, Any] | None = None  # the resume taken in, as run.json records it
        self._newest_time = ""  # the time of the newest train or resumed record handed on
        self.tail_bytes = tail_bytes
        self.max_read = max_read
        self.start = 0
        self.follower = FileFollower(self.path, max_read=max_read)
        self.header: dict[str, Any] | None = None
        self._tail_records: list[dict[str, Any]] = []
        self._tail_cutoff = math.inf  # the lowest resume step in the tail: what it supersedes before it
        self._newest_step = -math.inf  # the highest step handed on: a resume below it supersedes some
        # other trainers' files: the attempts read (a step not past the last is a restart, its elapsed time
        # put after the earlier attempt's: mark_restarts) and the tail's first train step and elapsed time as
        # logged (a restart may fall between the backfill and the tail)
        self._attempts = Attempts()
        self._tail_first_train: tuple[int, float | None] | None = None
        # the tail's records before its first train record (an evaluation logged after the step before it): where
        # the tail begins a new attempt, they are the earlier attempt's
        self._tail_lead: list[dict[str, Any]] = []
        self._tail_placed = False  # the tail's elapsed times are on the time axis of what is before it
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
            self._tail_first_train = _first_train(records)
            self._tail_lead = _lead(records)
            self._tail_placed = False
            self._attempts = Attempts()
            records = mark_restarts(records, self._attempts)
        if self.record_path is not None:
            self._newest_time = _newest_time(records, "")
            self._record_stamp = _stamp(self.record_path)
            self._asked = None  # read afresh: taken in again
            records += self._asked_resume()
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
        if result.vanished and self.kind == "llamafactory" and self.path.parent.is_dir():
            # LLaMA-Factory removes its trainer_log.jsonl as a run started again with overwrite_output_dir begins
            # (LogCallback.on_init_end): what was read is the previous run's, shown until the new run's first
            # line (minutes) as this run's figures. Start over now; the file it writes next is read from its start.
            # A folder deleted whole is no new run: what was read stays under "directory deleted", as elsewhere.
            self.follower = FileFollower(self.path, max_read=self.max_read)
            result.restarted = True
        records = parse_lines(result.lines, self.kind)
        if result.restarted:
            self.start = 0  # read from the start again: nothing left to backfill
            self.activity.reset()
            self._newest_step = -math.inf
            self._attempts = Attempts()
        if self.kind != "tunedeck":
            records = mark_restarts(records, self._attempts)
        newest = self._newest_step
        for record in records:
            step = resume_step(record)
            if step is not None and step < newest:
                # A resume went back before steps already handed on: start over, they are superseded.
                return self.read_tail(), True
            newest = _highest_step([record], newest)
        if self.record_path is not None:
            self._newest_time = _newest_time(records, self._newest_time)
            stamp = _stamp(self.record_path)
            if stamp != self._record_stamp:  # run.json changed: a resume asked for since?
                self._record_stamp = stamp
                asked = self._asked_resume()
                if asked and asked[0]["step"] < newest:  # it gave up steps handed on: start over without them
                    return self.read_tail(), True
                records += asked
        records = drop_superseded(records)
        self._newest_step = newest
        self.activity.observe(records)
        self._note_error()
        return records, result.restarted

    def _asked_resume(self) -> list[dict[str, Any]]:
        """A ``resumed`` record for the resume run.json records when its trainer has logged nothing since the
        newest record handed on (``pending_resume``) and it was not taken in before; else none."""
        from core.runs.run_dir import RunDirectory

        assert self.record_path is not None
        record, _unreadable = RunDirectory(self.record_path.parent).read_record()
        newest = {"time": self._newest_time} if self._newest_time else None
        asked = pending_resume(record.get("resumes"), newest)
        if asked is None or asked == self._asked:
            return []
        self._asked = asked
        resumed = {"kind": RESUMED, "step": asked["step"], "time": asked["time"], "asked": True}
        if isinstance(asked.get("total_steps"), int) and not isinstance(asked["total_steps"], bool):
            resumed["total_steps"] = asked["total_steps"]  # a resume's max_steps (unknown: the last attempt's)
        return [resumed]

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
        again without the records they superseded (a long file is never held as records). The tail's (and
        what ``poll`` reads next) elapsed times are then put after those of the attempts before it."""
        def blocks():
            for lines in read_lines_between(self.path, 0, self.start, block=BACKFILL_BLOCK):
                yield parse_lines(lines, self.kind)
                time.sleep(0)  # let the UI thread take the GIL between blocks

        series = RunSeries()
        restarts: list[tuple[int, int]] = []  # (records read before it, its step), in file order
        count = 0
        attempts = Attempts()
        for records in blocks():
            marked = mark_restarts(records, attempts)
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
        self._shift_tail(attempts)
        last = attempts.last
        cutoff = self._tail_cutoff
        first = self._tail_first_train
        if last is not None and first is not None and first[0] <= last:
            cutoff = min(cutoff, first[0] - 1)  # the tail begins a new attempt
        if not restarts and cutoff == math.inf:
            return series
        # lowest[i]: the lowest step of restarts[i:] and the tail's (what supersedes a record before restarts[i])
        lowest = [cutoff] * (len(restarts) + 1)
        for i in range(len(restarts) - 1, -1, -1):
            lowest[i] = min(lowest[i + 1], restarts[i][1])
        series = RunSeries()
        count, i = 0, 0
        attempts = Attempts()  # the same elapsed times again
        for records in blocks():
            kept = []
            for record in mark_restarts(records, attempts):
                if resume_step(record) is not None:
                    continue
                while i < len(restarts) and restarts[i][0] <= count:
                    i += 1  # a restart before this record: it does not supersede it
                count += 1
                if not superseded(record, lowest[i]):
                    kept.append(record)
            series.extend(kept)
        return series

    def _shift_tail(self, before: Attempts) -> None:
        """The tail's records and the attempt ``poll`` follows put on the time axis of the attempts before the
        tail (``before``: as ``mark_restarts`` left it at the tail's start): ``read_tail`` began it at 0."""
        if self._tail_placed:
            return
        self._tail_placed = True
        first = self._tail_first_train
        base = before.offset
        lead = {id(record) for record in self._tail_lead}
        if first is not None and before.last is not None and first[0] <= before.last:
            # the tail begins a new attempt after its lead (an evaluation of the attempt before it): the lead
            # ends that attempt (its time, what the restart supersedes), as read whole
            ended = Attempts(before.last, before.offset, before.elapsed)
            for record in self._tail_lead:
                if _is_number(record.get("elapsed_s")):
                    ended.elapsed = record["elapsed_s"]
            base = ended.next_offset(first[1])
            self._tail_records[:] = [r for r in self._tail_records
                                     if id(r) not in lead or not superseded(r, first[0] - 1)]
        if not base:  # (the lead's offset, before.offset, is not above it)
            return
        for record in self._tail_records:
            if record.get("kind") in ("train", "eval") and _is_number(record.get("elapsed_s")):
                record["elapsed_s"] += before.offset if id(record) in lead else base
        self._attempts.offset += base
        if self.activity.last_elapsed is not None:
            self.activity.last_elapsed += base

    def place_tail(self) -> None:
        """Put the tail's elapsed times after those of the attempts before it without building the series
        (``backfill`` does both): ``watch --json`` gives the elapsed time the dashboard's header shows. One pass
        over what is before the tail, where the tail is not the whole of another trainer's file."""
        if self.kind == "tunedeck" or self.start <= 0:
            return
        self._shift_tail(self._attempts_before_tail())

    def _attempts_before_tail(self) -> Attempts:
        """The ``Attempts`` that ``mark_restarts`` leaves after the records before the tail, from each line's
        step and kind only (``progress_of``): a line's metrics are not read, and its elapsed time is parsed
        only where a restart or the tail's start needs it (all of them took seconds on a 100 MB log)."""
        from core.watch.adapters import progress_of

        attempts = Attempts()
        pending: list[Any] = []  # elapsed times as logged since attempts.elapsed was last brought up to date

        def settle() -> None:  # attempts.elapsed as mark_restarts leaves it: the last of them that parses
            while pending:
                value = _elapsed(pending.pop())
                if value is not None:
                    attempts.elapsed = value
                    break
            pending.clear()

        for lines in read_lines_between(self.path, 0, self.start, block=BACKFILL_BLOCK):
            for raw in _objects(lines):
                progress = progress_of(raw, self.kind)
                if progress is None:
                    continue
                kind, step, elapsed = progress
                if kind == "train" and isinstance(step, int):
                    if attempts.last is not None and step <= attempts.last:
                        settle()
                        value = _elapsed(elapsed)
                        attempts.offset = attempts.next_offset(value)
                        attempts.elapsed = value
                        attempts.last = step
                        continue
                    attempts.last = step
                if elapsed is not None:
                    pending.append(elapsed)
                    if len(pending) > 4096:
                        settle()
            time.sleep(0)
        settle()
        return attempts


@dataclass
class Attempts:
    """What ``mark_restarts`` knows of another trainer's file so far: the last train step, and the time axis
    of the attempt it is in (``offset``: added to its ``elapsed_s``; ``elapsed``: its last one as logged)."""

    last: int | None = None
    offset: float = 0.0
    elapsed: float | None = None

    def next_offset(self, elapsed: float | None) -> float:
        """The offset of an attempt that begins (after a restart) with ``elapsed``: LLaMA-Factory and ms-swift
        count it from 0 again, and it goes after this attempt's end; one counted on goes where it is."""
        if elapsed is not None and self.elapsed is not None and elapsed < self.elapsed:
            return self.offset + self.elapsed
        return self.offset


def mark_restarts(records: list[dict[str, Any]], attempts: Attempts) -> list[dict[str, Any]]:
    """Another trainer's records with a ``resumed`` record (``core.watch.resumes``) before each train record
    whose step is not past the train step before it (``attempts.last`` for the first): LLaMA-Factory appends
    a run restarted or resumed into the same folder to the same ``trainer_log.jsonl``, its steps going back,
    and the charts drew both attempts over each other. Each step is then taken once, the latest attempt's, as
    for a tunedeck run's resume. The new attempt's ``elapsed_s`` (counted from 0 again) is put after the
    earlier attempt's (the records are changed in place): the time axis went back at each restart. Updates
    ``attempts``."""
    out: list[dict[str, Any]] = []
    for record in records:
        kind = record.get("kind")
        step = record.get("step")
        elapsed = record.get("elapsed_s")
        elapsed = float(elapsed) if _is_number(elapsed) else None
        if kind == "train" and isinstance(step, int) and not isinstance(step, bool):
            if attempts.last is not None and step <= attempts.last:
                out.append({"kind": RESUMED, "step": step - 1})
                attempts.offset = attempts.next_offset(elapsed)
                attempts.elapsed = None
            attempts.last = step
        if kind in ("train", "eval") and elapsed is not None:
            attempts.elapsed = elapsed
            if attempts.offset:
                record["elapsed_s"] = elapsed + attempts.offset
        out.append(record)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_DECODE = json.JSONDecoder().decode


def _objects(lines: list[bytes]) -> list[dict[str, Any]]:
    """The JSON objects of ``lines`` as ``parse_lines`` takes them (blank, broken and non-object lines
    skipped). What ``json.loads`` does with a line, less its checks of the type and its guess of the encoding
    (UTF-8 for a line that begins with "{" and not a NUL: one that does goes through ``json.loads``)."""
    values = []
    for line in lines:
        if not line or line[:1] != b"{":
            continue
        try:
            value = _DECODE(line.decode("utf-8", "surrogatepass")) if line[1:2] != b"\0" else json.loads(line)
        except ValueError:
            continue
        if type(value) is dict:
            values.append(value)
    return values


def _elapsed(logged: Any) -> float | None:
    """``elapsed_s`` as ``mark_restarts`` takes it from an elapsed time as logged (None: it is not taken)."""
    from core.watch.adapters import parse_duration

    value = parse_duration(logged)
    return float(value) if _is_number(value) else None


def _lead(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The eval records before the first train record among ``records``."""
    lead = []
    for record in records:
        if record.get("kind") == "train":
            break
        if record.get("kind") == "eval":
            lead.append(record)
    return lead


def _first_train(records: list[dict[str, Any]]) -> tuple[int, float | None] | None:
    """The step and ``elapsed_s`` of the first train record among ``records``."""
    record = next((r for r in records if r.get("kind") == "train"), None)
    step = None if record is None else record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    elapsed = record.get("elapsed_s")
    return step, float(elapsed) if _is_number(elapsed) else None


def _newest_time(records: list[dict[str, Any]], newest: str) -> str:
    """The ``time`` of the newest train or ``resumed`` record among ``records`` (file order), or ``newest``."""
    for record in reversed(records):
        if record.get("kind") in ("train", RESUMED) and record.get("time"):
            return str(record["time"])
    return newest


def _stamp(path: Path) -> tuple[int, int] | None:
    """(mtime in ns, size) of ``path``, None where it cannot be looked at: whether it changed since."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


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
    from core.watch.source import TUNEDECK

    record = source.path / "run.json" if source.kind == TUNEDECK and not source.read_only else None
    return MetricsFeed(source.metrics_path, source.kind, record_path=record)


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
