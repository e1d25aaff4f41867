"""One error type for everything tunedeck refuses or fails to do, with the exit code the CLI gives it.

Every domain error (a config, data, plan, run, hub … problem) is a ``TunedeckError``: its ``message`` is
the text for the user (what ``str(exc)`` gives), its ``exit_code`` the status ``tunedeck`` exits with.
``core.cli.dispatch`` is the one place that turns one into ``tunedeck: <message>`` on stderr and that
exit code; the app shows them in the screen that asked, and anything else in its error modal.

Domain errors keep the built-in bases they had (``ValueError``, ``LookupError``, ``OSError`` …), so
whatever caught them before still does.

Exit codes (kept as the commands always gave them):

* ``0``   done.
* ``1``   ``EXIT_FAILED``: doing it failed (a run, a merge, a probe, a full disk), or the data has problems
  (``data check``'s verdict).
* ``2``   ``EXIT_USAGE``: the request itself is wrong: an option, a config, a dataset path, a plan the box
  cannot hold, a run or directory that is not there, the settings file, a run with nothing to load (no
  complete checkpoint: ``merge``, ``chat``, ``evaluate``, ``export``, ``serve`` and ``resume`` alike). Also
  argparse's own.
* ``3``   ``EXIT_HUB``: the hub did not answer, refused or failed a download (``plan`` also exits 3
  when no plan fits: a verdict, not an error).
* ``4``   ``EXIT_CANCELLED``: a download that was cancelled, a ``models rm`` answered no (a return value,
  not an error).
* ``130`` ``EXIT_INTERRUPTED``: Ctrl+C.
* ``141`` ``EXIT_PIPE_CLOSED``: the reader of the output went away (``tunedeck runs | head``), as a program
  stopped by SIGPIPE exits (128 + 13); quietly, without a message.
"""

from __future__ import annotations

from typing import Any

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_HUB = 3
EXIT_CANCELLED = 4
EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 141

# The training stack's top-level modules (pyproject.toml's ``ml`` extra), which ``install.sh --app-only`` leaves out.
TRAINING_STACK_MODULES = frozenset({"torch", "transformers", "peft", "accelerate", "datasets", "bitsandbytes",
                                    "deepspeed", "safetensors", "tokenizers"})


def training_stack_missing(missing: list[str]) -> str:
    """The one line for a command that needs the training stack where this install lacks ``missing``."""
    from core.i18n import t

    return t("runs.training_stack_missing", packages=", ".join(missing))


def missing_training_module(exc: BaseException) -> str | None:
    """The training-stack module whose absence ``exc`` is (``import transformers`` of an app-only install), else None."""
    if not isinstance(exc, ModuleNotFoundError):
        return None
    top = (exc.name or "").partition(".")[0]
    return top if top in TRAINING_STACK_MODULES else None


class TunedeckError(Exception):
    """A failure the user can act on: ``message`` says what and what to do, ``exit_code`` is the CLI's.

    Subclasses set a class-level ``exit_code`` for their domain; one instance may give its own.
    """

    exit_code: int = EXIT_FAILED

    def __init__(self, message: object = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    @property
    def message(self) -> str:
        """The text for the user: ``str(exc)``, or the translated text where the argument is a
        ``core.i18n.Message`` (errors raised in a trainer carry one, for its status file)."""
        if len(self.args) == 1 and callable(getattr(self.args[0], "text", None)):
            return str(self.args[0].text())
        return str(self)

    @property
    def stored_message(self) -> Any:
        """The ``core.i18n.Message`` this error was raised with (its key and parameters, for a reader that
        words it its own way with ``render_stored``), or None when it was raised with a plain text."""
        if len(self.args) == 1 and callable(getattr(self.args[0], "to_record", None)):
            return self.args[0]
        return None

    @property
    def code(self) -> int:
        """The older name of ``exit_code`` (``CliError.code``, ``RunError.code``)."""
        return self.exit_code

    @code.setter
    def code(self, value: int) -> None:
        self.exit_code = value


class CliError(TunedeckError):
    """A command's own refusal: printed as one message on stderr, exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message, code)
