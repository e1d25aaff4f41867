"""Following an HF Trainer output dir through its ``trainer_state.json``.

HF Trainer writes no metric log of its own: each checkpoint (``checkpoint-N/``) holds a
``trainer_state.json`` whose ``log_history`` is every record so far, and ``save_state()`` writes one at the
top when training ends. The file is rewritten whole (not appended, not atomically), so this feed re-reads
the newest one when it changes, hands on the entries it has not handed on yet, and starts over when the
history is no longer an extension of what it read (a different run in the same dir).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.watch.activity import WriterActivity
from core.watch.adapters import normalize_hf_trainer
from core.watch.source import trainer_state_file


class TrainerStateFeed:
    """The same interface as ``core.watch.feed.MetricsFeed``: ``read_tail``, ``backfill``, ``poll``."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.activity = WriterActivity()
        self._key: tuple[Path, int, int] | None = None
        self._count = 0
        self._last_entry: Any = None

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
        try:
            stat = path.stat()
            key = (path, stat.st_mtime_ns, stat.st_size)
            if key == self._key:
                return [], False
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return [], False  # caught mid-write: the next poll reads it whole
        if not isinstance(state, dict):
            return [], False
        self._key = key
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

    def _note_save_intervals(self) -> None:
        """The records carry no time: the gaps between checkpoint saves say how often the writer writes."""
        times = []
        for folder in self.folder.glob("checkpoint-*"):
            try:
                times.append(((folder / "trainer_state.json").stat().st_mtime, folder.name))
            except OSError:
                continue
        times.sort()
        self.activity.intervals.clear()
        for (before, _a), (after, _b) in zip(times, times[1:], strict=False):
            self.activity.note_interval(after - before)
