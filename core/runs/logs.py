"""Following ``train.log`` by byte offset: complete lines only, and a truncated file starts over."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


class LogFollower:
    """Yields complete lines appended to a file since the last read (``poll()``)."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self._inode: int | None = None

    def poll(self) -> list[str]:
        try:
            handle = open(self.path, "rb")
        except FileNotFoundError:
            return []
        with handle:
            stat = os.fstat(handle.fileno())
            if stat.st_size < self.offset or (self._inode is not None and stat.st_ino != self._inode):
                self.offset = 0  # truncated or replaced: start over
            self._inode = stat.st_ino
            handle.seek(self.offset)
            data = handle.read()
        end = data.rfind(b"\n")
        if end < 0:
            return []
        complete = data[: end + 1]
        self.offset += len(complete)
        return [line.decode("utf-8", errors="replace") for line in complete.splitlines()]


def last_lines(path: Path, count: int) -> tuple[list[str], int]:
    """The last ``count`` complete lines of ``path`` and the byte offset just after them."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            block = 64 * 1024
            while True:
                start = max(0, size - block)
                handle.seek(start)
                data = handle.read(size - start)
                end = data.rfind(b"\n")
                usable = data[: end + 1] if end >= 0 else b""
                lines = usable.splitlines()
                if start > 0:
                    lines = lines[1:]
                if len(lines) >= count or start == 0:
                    return ([ln.decode("utf-8", errors="replace") for ln in lines[-count:]] if count else [],
                            start + len(usable))
                block *= 4
    except FileNotFoundError:
        return [], 0


def follow(path: Path, done: Callable[[], bool], offset: int = 0, poll_s: float = 0.25) -> Iterator[str]:
    """Lines of ``path`` from ``offset`` until ``done()`` is true and nothing new remains."""
    follower = LogFollower(path, offset)
    while True:
        finished = done()
        lines = follower.poll()
        yield from lines
        if finished and not lines:
            return
        if not lines:
            time.sleep(poll_s)
