"""Following a growing file by byte offset: complete lines only, truncation and replacement survived.

A writer appends whole lines (tunedeck's own files use one ``os.write`` per line, other tools may not), so
a read can end in the middle of a line: that unfinished tail is kept and completed by the next read. A
file that becomes shorter than what we already read was truncated (or replaced by a new one: a new inode)
and is read again from its start; the result says so, so that a caller can drop what it built.

Back-pressure: one read returns at most ``max_read`` bytes and, with ``max_lines``, at most that many
lines; what is left stays in the file (the offset points after the last line handed back) and ``more``
says to read again. A caller that reads only when it has dealt with the last batch (a generator printing
to a slow pipe, a poller at 2 Hz) therefore never holds more than one batch, however fast the file grows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

# One read never returns more than this; a caller polling at 2 Hz catches up on a huge file over a few
# polls instead of stalling on one.
DEFAULT_MAX_READ = 16 * 1024 * 1024


@dataclass
class FollowResult:
    """What one poll found: complete new lines (without their newline) and whether the file restarted."""

    lines: list[bytes] = field(default_factory=list)
    restarted: bool = False
    more: bool = False  # the read stopped at max_bytes: poll again at once
    vanished: bool = False  # the file read before is no longer there (removed or renamed away)


class FileFollower:
    """Reads what was appended to ``path`` since the last call; a missing file is simply empty."""

    def __init__(self, path: Path | str, offset: int = 0, max_read: int = DEFAULT_MAX_READ,
                 max_lines: int | None = None) -> None:
        self.path = Path(path)
        self.offset = offset
        self.max_read = max_read
        if max_lines is not None and max_lines < 1:
            raise ValueError("max_lines must be at least 1")
        self.max_lines = max_lines
        self._partial = b""
        self._inode: int | None = None
        # why the file could not be opened at the last call (permissions, a folder): a missing file is None
        self.error: OSError | None = None

    def read_new(self) -> FollowResult:
        """Complete lines appended since the last call (restarts from 0 after truncation/replacement)."""
        result = FollowResult()
        try:
            handle = open(self.path, "rb")
        except FileNotFoundError:
            self.error = None
            result.vanished = self._inode is not None
            return result
        except (PermissionError, IsADirectoryError) as error:
            self.error = error
            return result
        self.error = None
        with handle:
            stat = os.fstat(handle.fileno())
            if self._inode is not None and stat.st_ino != self._inode:
                self._restart(result)
            self._inode = stat.st_ino
            if stat.st_size < self.offset:
                self._restart(result)
            if stat.st_size == self.offset:
                return result
            handle.seek(self.offset)
            chunk = handle.read(min(self.max_read, stat.st_size - self.offset))
        self.offset += len(chunk)
        result.more = self.offset < stat.st_size
        data = self._partial + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            self._partial = data
            return result
        lines = data[:cut].split(b"\n")
        if self.max_lines is not None and len(lines) > self.max_lines:
            # Hand back the first max_lines; the rest is read again from the file next time.
            lines = lines[:self.max_lines]
            data_start = self.offset - len(data)  # the file offset of data[0] (the partial line's start)
            self.offset = data_start + sum(len(line) + 1 for line in lines)
            self._partial = b""
            result.more = True
        else:
            self._partial = data[cut + 1:]
        result.lines = lines
        return result

    def _restart(self, result: FollowResult) -> None:
        self.offset = 0
        self._partial = b""
        result.restarted = True


def tail_start(path: Path | str, max_bytes: int) -> int:
    """Byte offset where the last ``max_bytes`` of ``path`` begin, moved to the start of a line."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return 0
    if size <= max_bytes:
        return 0
    try:
        with open(path, "rb") as handle:
            handle.seek(size - max_bytes)
            handle.readline()  # skip the piece of a line we landed in
            return handle.tell()
    except OSError:  # cannot be read (permissions): from 0, where the follower's read says why
        return 0


def cut_tail_start(path: Path | str, max_bytes: int) -> tuple[int, bool]:
    """Byte offset where the last ``max_bytes`` of ``path`` begin, and whether a line is cut there.

    Unlike ``tail_start`` the line it lands in is kept (from the next whole character on): a log whose
    last line is longer than ``max_bytes`` shows that line's end rather than nothing of it."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return 0, False
    if size <= max_bytes:
        return 0, False
    start = size - max_bytes
    try:
        with open(path, "rb") as handle:
            handle.seek(start - 1)
            head = handle.read(4)
    except OSError:  # cannot be read (permissions): from 0, where the follower's read says why
        return 0, False
    if head[:1] == b"\n":
        return start, False
    skip = 0
    while skip < 3 and 1 + skip < len(head) and 0x80 <= head[1 + skip] < 0xC0:  # inside a UTF-8 character
        skip += 1
    return start + skip, True


def read_lines_between(path: Path | str, start: int, end: int, block: int = 8 * 1024 * 1024):
    """Complete lines of ``path`` in the byte range [start, end) (both on line starts), block by block."""
    with open(path, "rb") as handle:
        handle.seek(start)
        position = start
        rest = b""
        while position < end:
            chunk = handle.read(min(block, end - position))
            if not chunk:
                break
            position += len(chunk)
            data = rest + chunk
            cut = data.rfind(b"\n")
            if cut < 0:
                rest = data
                continue
            rest = data[cut + 1:]
            yield data[:cut].split(b"\n")
