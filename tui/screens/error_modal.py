"""The app's one place for the unexpected: the traceback goes to the app's log, the message to a modal.

What a screen expects to fail (a ``TunedeckError``: a dataset with problems, a hub that does not answer, a
merge that cannot be done) it shows itself, where it shows its other news. Anything else, a bug or a
library's surprise, comes here through ``report_unexpected``: logged with its traceback to ``log_path()``
and shown in ``ErrorModal`` (title, message, where the traceback is; Esc or Enter closes). It is safe to
call from a worker thread; nothing is ever swallowed silently.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Static

from core.i18n import t
from tui.widgets.modal import KeyedModal

LOG_NAME = "app.log"
logger = logging.getLogger("tunedeck.tui")
_handler_lock = threading.Lock()


def log_path() -> Path:
    """The app's own log: tracebacks of what went wrong unexpectedly (under ``TUNEDECK_HOME`` in tests)."""
    from core.paths import data_root

    return data_root() / LOG_NAME


def _file_handler() -> logging.Handler | None:
    """The handler writing to ``log_path()``, (re)opened when the path changed; None if it cannot be."""
    path = log_path()
    with _handler_lock:
        for handler in logger.handlers:
            if isinstance(handler, logging.FileHandler):
                if Path(handler.baseFilename) == path.resolve():
                    return handler
                logger.removeHandler(handler)
                handler.close()
        try:
            from core.paths import ensure_private_dir

            ensure_private_dir(path.parent)
            handler = logging.FileHandler(path, encoding="utf-8", delay=False)
        except OSError:
            return None  # an unwritable home: the modal still says what happened
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        return handler


def describe(error: BaseException) -> str:
    """``Type: message`` (the type alone when the message is empty)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class UnexpectedError(Message):
    """Posted to the app (from any thread) to open the error modal."""

    def __init__(self, text: str, log: str | None) -> None:
        super().__init__()
        self.text = text
        self.log_file = log


def report_unexpected(app: Any, error: BaseException, where: str = "") -> None:
    """Log ``error`` with its traceback and open the error modal on ``app``; from any thread.

    ``where`` names the code path in the log (``wizard.summarise``): the modal shows the error itself."""
    handler = _file_handler()
    # The log is for a bug report, in English like the traceback under it (the modal is translated).
    logger.log(logging.ERROR, "unexpected error in %s", where or "the app",
               exc_info=(type(error), error, error.__traceback__))
    if handler is not None:
        handler.flush()
    app.post_message(UnexpectedError(describe(error), str(log_path()) if handler is not None else None))


def report_failed_worker(app: Any, event: Any) -> bool:
    """For ``on_worker_state_changed``: a worker that ended in an exception nothing caught is reported as
    unexpected; True when it did."""
    from textual.worker import WorkerState

    if event.state != WorkerState.ERROR or event.worker.error is None:
        return False
    worker = event.worker
    report_unexpected(app, worker.error, f"worker {worker.group}/{worker.name}")
    return True


class ErrorModal(KeyedModal[None]):
    """What went wrong and where the traceback is; Esc or Enter closes. Errors that come while it is open
    are added to it, not stacked."""

    DEFAULT_CSS = """
    ErrorModal { align: center middle; background: $background 60%; }
    ErrorModal > Vertical { width: 72; max-width: 100%; height: auto; max-height: 90%;
                            border: round $error; background: $surface; padding: 0 1; }
    ErrorModal .error-title { text-style: bold; color: $error; }
    ErrorModal #error-scroll { height: auto; max-height: 12; margin-top: 1; }
    ErrorModal .error-log { margin-top: 1; color: $foreground-muted; }
    ErrorModal .error-keys { margin-top: 1; color: $foreground-muted; }
    """
    BINDINGS = [
        Binding("escape", "dismiss", t("app.error_close"), id="error.close"),
        Binding("enter", "dismiss", t("app.error_close"), show=False),
    ]

    def __init__(self, text: str, log: str | None) -> None:
        super().__init__()
        self.texts = [text]
        self.log_file = log

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(t("app.error_title"), classes="error-title", markup=False)
            with VerticalScroll(id="error-scroll"):
                yield Static("\n".join(self.texts), id="error-message", markup=False)
            yield Static(t("app.error_log", path=self.log_file) if self.log_file else "", id="error-log",
                         classes="error-log", markup=False)
            yield Static(t("app.error_keys"), classes="error-keys")

    def add(self, text: str, log: str | None) -> None:
        self.texts.append(text)
        self.log_file = log or self.log_file
        self.query_one("#error-message", Static).update("\n".join(self.texts))
        if self.log_file:
            self.query_one("#error-log", Static).update(t("app.error_log", path=self.log_file))


def show_error(app: Any, message: UnexpectedError) -> None:
    """The app's handler of ``UnexpectedError``: the modal, or one more line in the one open."""
    if isinstance(app.screen, ErrorModal):
        app.screen.add(message.text, message.log_file)
        return
    app.push_screen(ErrorModal(message.text, message.log_file))
