"""Is a run's supervisor still alive? Whoever looks decides, and a dead one is recorded as ``crashed``.

A live supervisor holds an exclusive ``flock`` on ``RUN_DIR/lock`` for its whole life and records its
pid and process start time in run.json. A run whose status says queued/starting/running/stopping is
``crashed`` when that lock can be taken (the kernel released it: the supervisor is gone, however it
died), or when the recorded pid no longer names the same live process. The crashed status is written
while holding the lock, after re-reading the status, so a supervisor that just finished cleanly (final
status written, then lock released) is never mislabelled.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from core.i18n import Message
from core.runs.run_dir import ACTIVE_STATES, CRASHED, QUEUED, RunDirectory, RunStatus

# A run stays "queued" between `tunedeck train` writing it and the supervisor taking the lock.
QUEUED_GRACE_S = 30.0


def process_start_time(pid: int) -> float | None:
    """The process's start time (psutil create_time), or None if no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def same_process_alive(pid: int | None, start_time: float | None) -> bool:
    """True if ``pid`` is alive and started at ``start_time`` (not a recycled pid)."""
    import psutil

    if not pid:
        return False
    try:
        proc = psutil.Process(int(pid))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False
    return start_time is None or abs(created - float(start_time)) < 0.5


@contextmanager
def try_lock(run: RunDirectory) -> Iterator[bool]:
    """Try to take the run's supervisor lock without blocking; yields whether we hold it."""
    try:
        fd = os.open(run.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except FileNotFoundError:  # the run directory vanished
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                yield False
                return
            raise
        yield True
    finally:
        os.close(fd)


def supervisor_alive(run: RunDirectory) -> bool:
    """True while some process holds the run's lock (normally its supervisor)."""
    with try_lock(run) as got:
        return not got


def effective_status(run: RunDirectory, persist: bool = True) -> RunStatus:
    """The run's status with liveness applied; a dead active run becomes (and is saved as) crashed."""
    status = run.status()
    if status.status not in ACTIVE_STATES:
        return status
    with try_lock(run) as got:
        if got:
            current = run.status()  # re-read under the lock: the supervisor may have just finished
            if current.status not in ACTIVE_STATES:
                return current
            if current.status == QUEUED and time.time() - current.updated_ts < QUEUED_GRACE_S:
                return current  # the supervisor is still on its way to the lock
            reason = Message("runs.reason_crashed", id=run.id)
            if persist:
                return run.write_status(CRASHED, reason)
            return RunStatus(CRASHED, reason.english(), current.updated, current.updated_ts, reason.to_record())
    # Someone holds the lock. Cross-check the recorded supervisor: a pid that no longer names the
    # process that recorded it means the holder is not our supervisor (e.g. a stray inherited fd).
    sup = run.record().get("supervisor") or {}
    pid = sup.get("pid")
    if pid and not same_process_alive(pid, sup.get("start_time")):
        reason = Message("runs.reason_crashed", id=run.id)
        if persist and run.transition(CRASHED, reason, only_from=ACTIVE_STATES):
            return run.status()
        current = run.status()
        return current if current.status not in ACTIVE_STATES else RunStatus.new(CRASHED, reason)
    return status
