"""SIGTERM and SIGHUP raised where Ctrl+C raises ``KeyboardInterrupt``, for commands that run in the foreground.

``kill`` (SIGTERM: a job's time limit too) and a lost SSH connection (SIGHUP) ended such a command where it was:
a merge's or export's half-written folder stayed, a watched download said nothing of going on. Inside
``stop_signals_raise()`` they raise ``StopSignal`` (a ``KeyboardInterrupt``): the command's Ctrl+C handling runs,
and it exits ``128 + signum`` as a process killed by the signal would. A signal ignored when the block starts
(``nohup``) stays ignored; a second one (the first is being handled) ends the process at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised as Ctrl+C's ``KeyboardInterrupt`` so the same cleanup runs; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


def exit_code(exc: KeyboardInterrupt) -> int:
    """The exit code of a command interrupted by ``exc``: 128 + the signal's number, 130 for Ctrl+C."""
    return 128 + exc.signum if isinstance(exc, StopSignal) else 130


@contextmanager
def stop_signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``StopSignal`` in the block (main thread only: elsewhere signals cannot be
    handled, and the block runs as it is); their handlers of before come back when the block ends, and at the
    first of them already, so that a second one ends the process at once."""
    installed: dict[int, Any] = {}

    def restore() -> None:
        for number, handler in installed.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        installed.clear()

    def stop(signum: int, _frame: object) -> None:
        restore()
        raise StopSignal(signum)

    if threading.current_thread() is threading.main_thread():
        for number in STOP_SIGNALS:
            previous = signal.getsignal(number)
            if previous is not signal.SIG_IGN:
                installed[number] = previous
                signal.signal(number, stop)
    try:
        yield
    finally:
        restore()
