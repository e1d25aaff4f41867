"""Following an HF Trainer output dir through its ``trainer_state.json``.

HF Trainer writes no metric log of its own: each checkpoint (``checkpoint-N/``) holds a
``trainer_state.json`` whose ``log_history`` is every record so far, and ``save_state()`` writes one at the
top when training ends. The file is rewritten whole (not appended, not atomically), so this feed re-reads
the newest one when it changes, hands on the entries it has not handed on yet, and starts over when the
history is no longer an extension of what it read (a different run in the same dir).

Because the write is not atomic, a read can catch half a file: that is normal for a moment and not said.
The same bytes still unreadable ``UNREADABLE_AFTER_S`` later (or a file last written longer ago than that)
are a file that will not parse: ``activity.unreadable`` says which and why, for the dashboard's header and
``watch --json``, until a read succeeds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.watch.activity import UNREADABLE_DENIED, UNREADABLE_TORN, WriterActivity, trainer_state_finished
from core.watch.adapters import normalize_hf_trainer
from core.watch.source import current_checkpoints, trainer_state_file

# Seconds a trainer_state.json may stay unparseable before it is said: HF rewrites it in place, so a read
# can land in the middle of a write (the next poll, half a second later, reads it whole).
UNREADABLE_AFTER_S = 5.0


class TrainerStateFeed:
    """The same interface as ``core.watch.feed.MetricsFeed``: ``read_tail``, ``backfill``, ``poll``."""

    def __init__(self, folder: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = Path(folder)
        self.activity = WriterActivity()
        self.clock = clock
        self._key: tuple[Path, int, int] | None = None
        self._count = 0
        self._last_entry: Any = None
        self._failing: tuple[tuple[Path, int | None, int | None], float] | None = None  # (its key, first seen)

    def read_tail(self) -> list[dict[str, Any]]:
        return self._read()[0]

    def backfill(self) -> None:
        return None  # read_tail already read the whole history: it is one file

    def poll(self) -> tuple[list[dict[str, Any]], bool]:
        return self._read()

    def _read(self) -> tuple[list[dict[str, Any]], bool]:
        path = trainer_state_file(self.folder)
        if path is None:
            return [], False
        key: tuple[Path, int | None, int | None] = (path, None, None)
        try:
            stat = path.stat()
            key = (path, stat.st_mtime_ns, stat.st_size)
            if self._earlier_run(stat.st_mtime) and (path.parent == self.folder or trainer_state_finished(path)):
                return self._forget()
            if key == self._key:
                return [], False
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            self._unreadable(path, key, error)  # caught mid-write, most often: the next poll reads it whole
            return [], False
        if not isinstance(state, dict):
            self._unreadable(path, key, ValueError(f"a JSON {type(state).__name__}, not an object"))
            return [], False
        self._key = key
        self._failing = None
        self.activity.unreadable = None
        history = [entry for entry in state.get("log_history") or [] if isinstance(entry, dict)]
        restarted = False
        start = self._count
        if start and (len(history) < start or history[start - 1] != self._last_entry):
            restarted, start = True, 0
            self.activity.reset()
        self._count = len(history)
        self._last_entry = history[-1] if history else None
        total = state.get("max_steps")
        total = total if isinstance(total, int) and total > 0 else None
        records = []
        for entry in history[start:]:
            record = normalize_hf_trainer(entry)
            if record is None:
                continue
            if total is not None and record["kind"] in ("train", "eval"):
                record["total_steps"] = total
            records.append(record)
        self.activity.observe(records)
        step = state.get("global_step")
        if isinstance(step, int):
            self.activity.last_step = step  # the history may end before it (logging_steps)
        self.activity.total_steps = total
        self._note_save_intervals()
        return records, restarted

    def _earlier_run(self, written: float) -> bool:
        """The newest trainer_state.json was written before the newest training run in the folder began (its
        TensorBoard event file, ``training_started``): a run started again into a used output folder, before its
        first checkpoint. Where that state is at its total (``trainer_state_finished``), or is the top-level one
        save_state writes as train() ends (a run stopped early; a resume reads a checkpoint's), its history is
        the previous run's: shown as this run's figures (its step at the total, its loss) for the minutes or
        hours until the first save. A checkpoint's short of it is most often the one the new run resumes from
        (HF's example scripts resume from the newest one in a used folder): its history is this run's, kept."""
        from core.watch.activity import training_started

        started = training_started(self.folder)
        return started is not None and written < started

    def _forget(self) -> tuple[list[dict[str, Any]], bool]:
        """Nothing read (an earlier run's state): what was handed on is dropped, once (restarted)."""
        restarted = self._key is not None
        self._key, self._count, self._last_entry, self._failing = None, 0, None, None
        if restarted:
            self.activity.reset()
        return [], restarted

    def _unreadable(self, path: Path, key: tuple[Path, int | None, int | None], error: Exception) -> None:
        """A read that failed: said (``activity.unreadable``) once the same file has failed for
        ``UNREADABLE_AFTER_S``, or at once when it was last written longer ago than that."""
        now = self.clock()
        if self._failing is None or self._failing[0] != key:
            self._failing = (key, now)
        written = key[1]
        denied = isinstance(error, PermissionError)  # no write in progress explains it: said at once
        settled = denied or now - self._failing[1] >= UNREADABLE_AFTER_S or (
            written is not None and time.time() - written / 1e9 >= UNREADABLE_AFTER_S)
        if settled:
            try:
                shown = str(path.relative_to(self.folder))
            except ValueError:
                shown = str(path)
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            self.activity.unreadable = (shown, reason or type(error).__name__,
                                       UNREADABLE_DENIED if denied else UNREADABLE_TORN)

    def _note_save_intervals(self) -> None:
        """The records carry no time: the gaps between checkpoint saves say how often the writer writes (the
        current run's saves only: the gap since a previous run's checkpoints in the folder is no interval)."""
        times = [when for when, _state in current_checkpoints(self.folder)]
        self.activity.intervals.clear()
        for before, after in zip(times, times[1:], strict=False):
            self.activity.note_interval(after - before)
