"""Append-only JSON-lines files that a tailing reader can follow safely.

Each record is one ``os.write`` of one complete line on a file opened with ``O_APPEND``, so concurrent
writers never interleave inside a line and a reader only ever sees a partial line at the very end; a line
left torn by a writer that died is ended before the next record (``append_line``).
Reading the latest record of a long file reads the tail only: listing a hundred runs must stay cheap even
when each has a million-line ``metrics.jsonl``.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PRIVATE_FILE_MODE = 0o600
_TAIL_BLOCK = 64 * 1024
_TAIL_MAX = 4 * 1024 * 1024


def _clean(value: Any) -> Any:
    """NaN and infinities are not JSON: they become null (the NaN event says what happened)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def append_line(path: Path, line: str) -> None:
    """Append one text line (a newline is added) with a single write.

    A file that ends in a torn line (its writer killed mid-write, a write cut short by a full disk, a
    power loss) first gets the newline it lacks: glued onto the torn line, this record would be lost
    with it (a resume's ``resumed`` record, and with it which steps the new attempt supersedes). Writers
    hold an flock for the look and the write, so a live writer's line is never taken for a torn one. A
    short write (the disk filled up mid-line) is carried on, so that it raises rather than passing as
    written."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, PRIVATE_FILE_MODE)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a filesystem without flock: the look below still mends a dead writer's line
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)  # releases the lock


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON record as one line."""
    append_line(path, json.dumps(_clean(record), ensure_ascii=False, sort_keys=False))


def iter_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete, parseable record of ``path`` from the start (a torn last line is skipped)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return
    with handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def _matching(raw: bytes, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The record on the line ``raw`` if it parses as an object and ``match`` takes it, else None."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) and match(record) else None


def first_record(
    path: Path, match: Callable[[dict[str, Any]], bool] = lambda r: True
) -> dict[str, Any] | None:
    """The first complete record for which ``match`` is true, reading at most the file's first 4 MiB
    (``last_record``'s bound): what is sought is near the start, and a long file must stay cheap to list."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return None
    read = 0
    with handle:
        for raw in handle:
            read += len(raw)
            if read > _TAIL_MAX or not raw.endswith(b"\n"):
                return None
            record = _matching(raw, match)
            if record is not None:
                return record
    return None


def last_record(
    path: Path, match: Callable[[dict[str, Any]], bool] = lambda r: True
) -> dict[str, Any] | None:
    """The last complete record for which ``match`` is true, reading the file backwards in blocks."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return None
    with handle:
        end = handle.seek(0, os.SEEK_END)
        block = _TAIL_BLOCK
        while True:
            start = max(0, end - block)
            handle.seek(start)
            chunk = handle.read(end - start)
            lines = chunk.split(b"\n")
            # lines[-1] is what follows the last newline: a torn record (or b"") — never complete.
            lines = lines[:-1]
            if start > 0:
                lines = lines[1:]  # the first piece may begin mid-line
            for raw in reversed(lines):
                record = _matching(raw, match)
                if record is not None:
                    return record
            if start == 0 or block >= _TAIL_MAX:
                return None
            block *= 4
