"""Which runs the user has seen end: a small file under the data root, read and written at app start.

``runs_ended_since(summaries)`` names the runs that reached a final status since the last visit (a run
that was active then, or one that was never seen and is final now), and remembers the current statuses.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.atomic_file import write_json_atomic
from core.paths import data_root, ensure_private_dir
from core.runs.states import TERMINAL_STATES


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
    previous = load_last_seen(path)
    ended = []
    if previous is not None:
        for summary in summaries:
            before = previous.get(summary.id)
            ended_now = summary.status in TERMINAL_STATES and before != summary.status
            if ended_now and (before is None or before not in TERMINAL_STATES):
                ended.append(summary)
    ensure_private_dir(path.parent)
    write_json_atomic(path, {"runs": {s.id: s.status for s in summaries}})
    return ended
