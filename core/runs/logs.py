"""``tunedeck logs``: the last lines of ``train.log`` from its tail only, then what is appended.

Following goes through the one file follower of ``core.watch.follow`` (byte offsets, complete lines,
truncation and replacement start over, bounded reads); the tail read never reads more than
``TAIL_MAX_BYTES`` from the end, however long the log or however many lines are asked for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from core.watch.follow import FileFollower

TAIL_BLOCK = 64 * 1024
TAIL_MAX_BYTES = 4 * 1024 * 1024  # ``-n`` reads at most this much: fewer lines than asked when they are longer
FOLLOW_MAX_READ = 1024 * 1024  # one read of ``-f`` ...
FOLLOW_MAX_LINES = 4096  # ... hands back at most this many lines before they are printed


def _decode(lines: Iterable[bytes]) -> list[str]:
    return [line.decode("utf-8", errors="replace").rstrip("\r") for line in lines]


def last_lines(path: Path, count: int, max_bytes: int = TAIL_MAX_BYTES) -> tuple[list[str], int]:
    """The last ``count`` complete lines of ``path`` within its last ``max_bytes``, and the byte offset
    just after them (where following goes on)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return [], 0
    with handle:
        size = handle.seek(0, os.SEEK_END)
        block = min(TAIL_BLOCK, max_bytes)
        while True:
            span = min(block, size, max_bytes)
            start = size - span
            # One byte more, when there is one, says whether ``start`` is a line start.
            handle.seek(max(0, start - 1))
            data = handle.read(size - max(0, start - 1))
            if start > 0:
                first = data.find(b"\n")
                data = data[first + 1:] if first >= 0 else b""
                start = size - len(data)
            end = data.rfind(b"\n")
            usable = data[: end + 1]
            lines = usable[:-1].split(b"\n") if usable else []
            if len(lines) >= count or span >= min(size, max_bytes):
                return (_decode(lines[-count:]) if count else []), start + len(usable)
            block *= 4


def follow(path: Path, done: Callable[[], bool], offset: int = 0, poll_s: float = 0.25) -> Iterator[str]:
    """Lines of ``path`` from ``offset`` until ``done()`` is true and nothing new remains.

    A batch is read only once the previous one was consumed, so a slow reader of the output holds the
    follower back instead of lines piling up in memory."""
    follower = FileFollower(path, offset, max_read=FOLLOW_MAX_READ, max_lines=FOLLOW_MAX_LINES)
    while True:
        finished = done()
        result = follower.read_new()
        yield from _decode(result.lines)
        if result.more:
            continue
        if finished and not result.lines:
            return
        if not result.lines:
            time.sleep(poll_s)
