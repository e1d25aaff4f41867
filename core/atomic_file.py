"""Atomic replacement of small state files (a reader sees the old file or the new one, never half), and
the fsyncs that make a renamed directory (a checkpoint, a merged model) durable."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and ``os.replace``."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def umask_modes(directory: Path) -> tuple[int, int]:
    """(folder mode, file mode) that a plain ``mkdir`` / ``open`` gives in ``directory``: the process's
    umask, seen on a probe rather than read with os.umask (which sets it, for every thread at once)."""
    probe = directory / f".tunedeck-mode-probe-{os.getpid()}"
    os.mkdir(probe, 0o777)
    try:
        folder = os.stat(probe).st_mode & 0o777
    finally:
        os.rmdir(probe)
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        file = os.fstat(fd).st_mode & 0o777
    finally:
        os.close(fd)
        os.unlink(probe)
    return folder, file


def shared_file_mode(path: Path) -> int:
    """The mode for a file at ``path`` that is no secret (a run YAML the user shares, copies, commits):
    the one a file there has now when it is replaced, else the one a plain ``open`` gives there (the umask),
    not ``write_atomic``'s private 0600."""
    try:
        return os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        return umask_modes(Path(path).parent)[1]


def write_json_atomic(path: Path, value: Any, mode: int = 0o600) -> None:
    write_atomic(path, json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n", mode)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename into it, a new file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` to disk before the tree is renamed into place."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))
