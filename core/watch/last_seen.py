"""Which runs the user has seen end: a small file under the data root, read and written at app start.

``runs_ended_since(summaries)`` names the runs that reached a final status since the last visit (a run
that was active then, or one that was never seen and is final now), and remembers the current statuses.
``EndsSeen`` records the runs the app itself showed reaching a final status while it was open, so that
the next visit does not announce a run the user watched finish as news.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.atomic_file import write_json_atomic
from core.paths import data_root, ensure_private_dir
from core.runs.states import TERMINAL_STATES

_WRITING = threading.Lock()  # the app's start and its runs list write the file from different threads


def last_seen_path() -> Path:
    return data_root() / "watch-last-seen.json"


def load_last_seen(path: Path | None = None) -> dict[str, str] | None:
    """run id -> status at the last visit; None before the first visit."""
    try:
        raw = json.loads((path or last_seen_path()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    runs = raw.get("runs") if isinstance(raw, dict) else None
    return {str(k): str(v) for k, v in runs.items()} if isinstance(runs, dict) else None


def runs_ended_since(summaries: Iterable[Any], path: Path | None = None) -> list[Any]:
    """Summaries (anything with ``id`` and ``status``) that ended since the last visit; records this visit.

    On the very first visit nothing is announced: every final run would otherwise be "new"."""
    path = path or last_seen_path()
    summaries = list(summaries)
    with _WRITING:
        previous = load_last_seen(path)
        ended = []
        if previous is not None:
            for summary in summaries:
                before = previous.get(summary.id)
                ended_now = summary.status in TERMINAL_STATES and before != summary.status
                if ended_now and (before is None or before not in TERMINAL_STATES):
                    ended.append(summary)
        try:
            ensure_private_dir(path.parent)
            write_json_atomic(path, {"runs": {s.id: s.status for s in summaries}})
        except OSError:
            # a read-only or full disk: the app still starts and re-attaches (this raised into the start's
            # worker: an error modal, and no dashboard of the live run); the next start announces them again
            pass
    return ended


def mark_runs_seen(summaries: Iterable[Any], path: Path | None = None) -> None:
    """Record these runs' statuses as seen, the other runs' kept as they are. Before the first visit
    (no file) nothing is written: that visit announces nothing anyway."""
    path = path or last_seen_path()
    with _WRITING:
        previous = load_last_seen(path)
        if previous is None:
            return
        previous.update({str(s.id): str(s.status) for s in summaries})
        write_json_atomic(path, {"runs": previous})


class EndsSeen:
    """Follows the statuses the app shows (``shown(summaries)`` at each listing, from a worker: it writes
    a file); a run shown live and then final was seen ending: recorded at once (``mark_runs_seen``).

    A run the app never showed live is left alone: if it ended while nobody looked, the next start still
    announces it."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.live: set[str] = set()  # ids last shown in a live (not final) status
        self._lock = threading.Lock()  # a restarted list worker may overlap the one it replaces

    def shown(self, summaries: Iterable[Any]) -> list[Any]:
        """Note one listing; returns (and records) the runs it shows ending."""
        summaries = list(summaries)
        with self._lock:
            ended = [s for s in summaries if s.status in TERMINAL_STATES and s.id in self.live]
            self.live = {s.id for s in summaries if s.status not in TERMINAL_STATES}
        if ended:
            try:
                mark_runs_seen(ended, self.path)
            except OSError:
                pass  # a full or read-only disk: the next start announces it, no worse than before
        return ended
