"""Signalling a GPU process: refused, with the reason, where it cannot or must not be sent, and never
delivered to a pid that by now names another process.

A pid alone is not a process: the one NVML reported may have exited and its number been given to a new
one. A snapshot's ``GpuProcess.started_at`` says which process it was; ``check_signal`` compares it with
the process that holds the pid now, before the user is asked, and ``send_signal`` compares again just
before sending, through a pidfd where the kernel has them (Linux 5.3+): the pidfd pins the process, so
the one checked is the one signalled. Refusals are ``SignalRefused`` with a stable ``reason`` and a
message in the interface language.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.errors import TunedeckError
from core.hardware.processes import NOT_A_GPU_PROCESS, NOT_IN_NAMESPACE
from core.hardware.snapshot import GpuProcess
from core.i18n import t

# psutil derives a start time from the boot time and the start tick (10 ms): one process reads the same
# value every time; another process that got the pid later differs by at least a tick.
START_TIME_TOLERANCE_S = 0.005

# Every reason a signal is refused (the keys of hardware.signal.refused.* in the catalogue).
OWN_PROCESS = "own_process"
START_UNKNOWN = "start_unknown"
GONE = "gone"
REUSED = "reused"
OTHER_USER = "other_user"
NOT_PERMITTED = "not_permitted"
REASONS = (OWN_PROCESS, NOT_IN_NAMESPACE, NOT_A_GPU_PROCESS, START_UNKNOWN, GONE, REUSED, OTHER_USER,
           NOT_PERMITTED)


class SignalRefused(TunedeckError):
    """Nothing was sent; ``reason`` is one of ``REASONS``, the message says why and what to do."""

    def __init__(self, reason: str, pid: int, **details: object) -> None:
        super().__init__(t(f"hardware.signal.refused.{reason}", pid=pid, **details))
        self.reason = reason
        self.pid = pid


@dataclass(frozen=True)
class SignalTarget:
    """A process checked to be signallable: the pid and the start time that identify it."""

    pid: int
    started_at: float
    owner: str | None = None


def signal_name(force: bool) -> str:
    return "SIGKILL" if force else "SIGTERM"


def _same_process(pid: int, started_at: float) -> Any:
    """The psutil process that holds ``pid`` now, if it is the one that started at ``started_at``."""
    import psutil

    try:
        proc = psutil.Process(pid)
        created = proc.create_time()
    except (psutil.NoSuchProcess, ValueError) as exc:  # a zombie counts: it has exited already
        raise SignalRefused(GONE, pid) from exc
    except psutil.AccessDenied as exc:
        raise SignalRefused(NOT_PERMITTED, pid, error=str(exc) or "access denied") from exc
    if abs(created - started_at) > START_TIME_TOLERANCE_S:
        from datetime import datetime

        raise SignalRefused(REUSED, pid, started=datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M:%S"))
    return proc


def check_signal(process: GpuProcess, own_pid: int | None = None) -> SignalTarget:
    """Whether this app may signal ``process`` (from a snapshot); raises ``SignalRefused`` saying why not.

    Refused: this app's own process (``own_pid``, default ``os.getpid()``); a pid that is not visible
    here (another container's: NVML gives host pids); a process without a known start time (it cannot
    be told from a later one with its pid); one that has exited or whose pid now names another
    process; one of another user, unless we are root. Reads /proc: call it from a worker.
    """
    pid = process.pid
    if pid == (os.getpid() if own_pid is None else own_pid):
        raise SignalRefused(OWN_PROCESS, pid)
    if not process.visible:
        raise SignalRefused(process.hidden_reason or NOT_IN_NAMESPACE, pid)
    if process.started_at is None:
        raise SignalRefused(START_UNKNOWN, pid)
    proc = _same_process(pid, process.started_at)
    import psutil

    try:
        uids = proc.uids()
        owner = proc.username()
    except (psutil.Error, KeyError):
        uids, owner = None, process.user
    # kill(2): the sender's real or effective uid must be the target's real or saved uid (or root's).
    if uids is not None and os.geteuid() != 0 and not {os.getuid(), os.geteuid()} & {uids.real, uids.saved}:
        raise SignalRefused(OTHER_USER, pid, owner=owner or uids.real)
    return SignalTarget(pid, process.started_at, owner)


def send_signal(target: SignalTarget, force: bool = False) -> str:
    """Send SIGTERM (SIGKILL with ``force``) to ``target`` if its pid still names that process.

    Returns the signal's name; raises ``SignalRefused`` (gone, reused, not permitted) when nothing was
    sent. The start time is checked after a pidfd has pinned the process, so a pid reused between the
    check and the signal cannot be hit; without pidfds the window is the few microseconds between the
    check and ``kill``.
    """
    sig = signal.SIGKILL if force else signal.SIGTERM
    pidfd: int | None = None
    try:
        pidfd = os.pidfd_open(target.pid)
    except ProcessLookupError as exc:
        raise SignalRefused(GONE, target.pid) from exc
    except (AttributeError, OSError):
        pidfd = None  # no pidfds here (not Linux, an old kernel, a seccomp filter): plain kill
    try:
        _same_process(target.pid, target.started_at)
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(target.pid, sig)
    except ProcessLookupError as exc:
        raise SignalRefused(GONE, target.pid) from exc
    except PermissionError as exc:
        raise SignalRefused(NOT_PERMITTED, target.pid, error=exc.strerror or str(exc)) from exc
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return signal_name(force)


def has_ended(target: SignalTarget) -> bool:
    """True once ``target`` is gone: no process with its pid, a zombie (exited, not yet reaped by its
    parent), or its pid given to another process."""
    import psutil

    try:
        proc = psutil.Process(target.pid)
        if abs(proc.create_time() - target.started_at) > START_TIME_TOLERANCE_S:
            return True
        return proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ValueError):
        return True
    except psutil.AccessDenied:
        return False


def wait_until_ended(target: SignalTarget, timeout_s: float, poll_s: float = 0.1,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> bool:
    """Whether ``target`` ended within ``timeout_s`` (checked every ``poll_s``): after a signal, to say
    that it worked or that it did not."""
    deadline = clock() + timeout_s
    while not has_ended(target):
        if clock() >= deadline:
            return False
        sleep(poll_s)
    return True


__all__ = [
    "REASONS",
    "START_TIME_TOLERANCE_S",
    "SignalRefused",
    "SignalTarget",
    "check_signal",
    "has_ended",
    "send_signal",
    "signal_name",
    "wait_until_ended",
]
