"""A server's ``state.json``, written by three processes: the one that starts it (``start_server`` and the
wait for it to be ready), the server itself (``core.lifecycle.server``: loading, ready, stopped) and one that
stops it (``serve --stop``, the app's k). Every change goes through ``update_state``: a read-merge-write
under an exclusive ``flock`` on the sidecar ``state.lock`` (not ``lock``, which our server holds for its
whole life), so no writer's change is lost to another's read before it.

"stopped" is sticky: once a stop has said so, a later "loading" or "ready" (a server that finishes loading
as it is being stopped, a starter that sees it answer a moment before) leaves it "stopped"; only a fresh
start (``write_fresh_state``) writes the whole record anew. Before, such a late "ready" made a stopped
server read as ready, and its starter report a failed start instead of a stop.

A record belongs to one start: ``start_server`` writes a fresh ``start_id`` into it and hands the same id
to the server it starts (``--start-id``); the server's writes, and the starter's after it, are made
``where={"start_id": ...}``, so they change that start's record only. Before, a server still exiting when a
new start had begun (its stop said, its process not yet gone) wrote its last "stopped" over the new
record, and stopped being sticky made it permanent: the new server ran unrecorded, its starter never saw
it ready and k could not stop it.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
STATE_LOCK = "state.lock"


def read_state(directory: Path) -> dict[str, Any]:
    """The record as last written; {} when there is none (or it is no JSON object)."""
    try:
        value = json.loads((Path(directory) / STATE_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    fd = os.open(Path(directory) / STATE_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held for a read and a write: never long
        yield
    finally:
        os.close(fd)  # closing releases the lock


def update_state(directory: Path, where: dict[str, Any] | None = None, **values: Any) -> dict[str, Any]:
    """Merge ``values`` into the record, under the state lock; returns the record as written. A record that
    says "stopped" keeps saying so: a ``status`` other than "stopped" is not applied to it (the other values
    are). The caller tells from the returned status whether the server was stopped meanwhile.

    ``where``: the change is made only when the record holds each of these values (``{"start_id": id}``:
    only to that start's record); otherwise nothing is written and the record is returned as it is."""
    from core.atomic_file import write_json_atomic

    with _locked(directory):
        current = read_state(directory)
        if where and any(current.get(key) != value for key, value in where.items()):
            return current  # another start's record (or none): not ours to change
        if current.get("status") == "stopped" and values.get("status", "stopped") != "stopped":
            values = {key: value for key, value in values.items() if key != "status"}
        merged = {**current, **values}
        write_json_atomic(Path(directory) / STATE_FILE, merged)
        return merged


def write_fresh_state(directory: Path, record: dict[str, Any]) -> None:
    """Replace the record as a whole (a new start: whatever an earlier server left, "stopped" included, goes)."""
    from core.atomic_file import write_json_atomic

    with _locked(directory):
        write_json_atomic(Path(directory) / STATE_FILE, record)
