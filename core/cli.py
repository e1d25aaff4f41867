"""``tunedeck``'s headless commands: the twins of the app's screens.

This module only builds the parser and dispatches; each area registers its commands from its own
``commands`` module (``core/<area>/commands.py``) with a ``register(subparsers)`` function. Nothing heavy
is imported here: each handler imports what it needs when it runs.

The app itself lives in ``tui``, which core never imports: a handler that wants it (no command, ``demo``,
``watch DIR``) returns an ``OpenApp`` request, and the ``tunedeck`` entry point (``tui.main``) opens it.
``python -m core`` is the headless half alone: such a command refuses there (``require_app``) before it
starts anything.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core import __version__
from core.errors import (
    EXIT_INTERRUPTED,
    EXIT_PIPE_CLOSED,
    EXIT_USAGE,
    CliError,
    TunedeckError,
    missing_training_module,
    training_stack_missing,
)
from core.i18n import set_language, t
from core.i18n.argparse_words import CatalogueArgumentParser

# Areas that contribute subcommands, in the order they appear in --help.
COMMAND_MODULES: list[str] = [
    "core.hardware.commands",
    "core.data.commands",
    "core.runs.commands",
    "core.config.commands",
    "core.estimate.commands",
    "core.watch.commands",
    "core.hub.commands",
    "core.lifecycle.commands",
    "core.plan.commands",
]


@dataclass(frozen=True)
class OpenApp:
    """What a command returns to have the full-screen app opened (by ``tui.main``) once it is done."""

    settings: Any = None
    open_run: str | None = None


__all__ = ["CliError", "OpenApp", "TunedeckError", "build_parser", "dispatch", "main", "report_error",
           "require_app"]


def build_parser() -> argparse.ArgumentParser:
    # argparse's own words (usage:, options:, its errors) come from the catalogue too: see argparse_words.
    parser = CatalogueArgumentParser(prog="tunedeck", description=t("cli.description"))
    parser.add_argument("--version", action="version", version=f"tunedeck {__version__}",
                        help=t("argparse.version_help"))
    parser.add_argument("--lang", default=None, help=t("cli.lang_help"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _requested_language(argv: Sequence[str]) -> str | None:
    """The value of ``--lang`` in ``argv``, read ahead of argparse (None when not given)."""
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--lang" and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith("--lang="):
            return arg.split("=", 1)[1]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m core``: the headless commands; where the app is asked for, say how to open it (the
    commands that want it have said so already, before doing anything: ``require_app``)."""
    outcome = dispatch(argv, opens_app=False)
    if isinstance(outcome, OpenApp):
        print(f"tunedeck: {t('cli.app_needs_entry')}", file=sys.stderr)
        return EXIT_USAGE
    return outcome


def dispatch(argv: Sequence[str] | None = None, opens_app: bool = True) -> int | OpenApp:
    """Parse ``argv`` and run its command: an exit code, or ``OpenApp`` when the app should open.
    ``opens_app``: the caller can open the app (``tui.main``; not ``python -m core``).

    Output cut short by its reader (``tunedeck runs | head``: the pipe closed) ends quietly here, for every
    command: no traceback, exit ``EXIT_PIPE_CLOSED``. Output that cannot be written otherwise (``> /dev/full``,
    a full disk, a terminal gone: ENOSPC, EIO) is said as such: ``_NamedOutput`` marks its error."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _NamedOutput.around(sys.stdout, "stdout"), _NamedOutput.around(sys.stderr, "stderr")
    try:
        try:
            return _dispatch(argv, opens_app)
        except SystemExit:  # argparse's --help, --version and usage errors: their text may still be buffered
            _flush_stdout()
            raise
    except BrokenPipeError:
        return _stdout_closed()
    finally:
        sys.stdout, sys.stderr = streams


class _NamedOutput:
    """``sys.stdout`` / ``sys.stderr`` while a command runs: everything goes through to the stream, and an
    ``OSError`` of a write or flush leaves marked with the stream's name (``disk_space.OUTPUT_STREAM``).
    A failed write of the output has no file name: the message said "cannot write ?" without it."""

    def __init__(self, stream: Any, name: str) -> None:
        self._stream = stream
        self._name = name

    @classmethod
    def around(cls, stream: Any, name: str) -> Any:
        return stream if stream is None or isinstance(stream, cls) else cls(stream, name)

    def __getattr__(self, attr: str) -> Any:  # fileno, isatty, encoding, buffer …: the stream's own
        return getattr(self._stream, attr)

    def _marked(self, method: str, *args: Any) -> Any:
        from core.runs.disk_space import OUTPUT_STREAM

        try:
            return getattr(self._stream, method)(*args)
        except OSError as exc:  # under redirect_stdout(sys.stderr) the stream written is stderr: so named
            setattr(exc, OUTPUT_STREAM, self._name)
            raise

    def write(self, text: str) -> int:
        return int(self._marked("write", text))

    def writelines(self, lines: Any) -> None:
        self._marked("writelines", lines)

    def flush(self) -> None:
        self._marked("flush")


def _flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


def _stdout_closed() -> int:
    """The reader of standard output went away. Point stdout at /dev/null so that what is still buffered
    does not fail again at interpreter exit ("Exception ignored ... BrokenPipeError"), and exit as a
    program stopped by SIGPIPE does (Python docs, "Note on SIGPIPE")."""
    _drop_stdout()
    return EXIT_PIPE_CLOSED


def _drop_stdout() -> None:
    """Point standard output at /dev/null: what its buffer still holds goes nowhere at interpreter exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no stdout, or one without a file descriptor
        pass


def _dispatch(argv: Sequence[str] | None, opens_app: bool) -> int | OpenApp:
    argv = list(sys.argv[1:] if argv is None else argv)
    from core.settings import SettingsError, load_settings

    set_language("")  # the locale's language until the settings and --lang are read: a settings error uses it
    try:
        settings = load_settings()
    except SettingsError as exc:  # a TunedeckError: never None
        return report_error(exc) or EXIT_USAGE
    try:  # before the parser is built: its help texts come out in the chosen language
        set_language(_requested_language(argv) or settings.language)
    except ValueError:
        pass  # an unknown --lang is reported by the parser below
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse stops filling positionals at the first option: `resume RUN --weights-only key=value`
        # leaves key=value over. Overrides may come anywhere after the command; anything else is an error.
        if isinstance(getattr(args, "overrides", None), list) and \
                all("=" in e and not e.startswith("-") for e in extra):
            args.overrides += extra
        else:
            parser.parse_args(argv)  # reports the unrecognized arguments as argparse does, and exits
    try:
        set_language(args.lang if args.lang is not None else settings.language)
    except ValueError as exc:
        parser.error(str(exc))
    handler = getattr(args, "handler", None)
    args.opens_app = opens_app  # for require_app
    try:
        if handler is None:
            if not _on_a_terminal():  # piped, cron, CI: the app would paint escape codes and wait forever
                parser.print_usage(sys.stderr)
                print(f"tunedeck: {t('cli.no_terminal')}", file=sys.stderr)
                return EXIT_USAGE
            return OpenApp(settings)
        outcome = handler(args)
        _flush_stdout()  # what is still buffered meets a closed pipe or a full disk here, not at interpreter exit
        return outcome if isinstance(outcome, OpenApp) else int(outcome or 0)
    except (TunedeckError, OSError, ModuleNotFoundError) as exc:
        code = report_error(exc)
        if code is None:
            raise
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _on_a_terminal() -> bool:
    """Whether standard input and output are both a terminal: what the full-screen app needs."""
    try:
        return sys.stdin is not None and sys.stdout is not None and sys.stdin.isatty() and sys.stdout.isatty()
    except (ValueError, OSError):  # a closed stream
        return False


def require_app(args: argparse.Namespace, no_terminal: str, no_app: str) -> None:
    """Refuse to ask for the full-screen app where it cannot be shown, as a usage error (exit 2). Called by
    the commands that return ``OpenApp``, before they do anything (the demo starts a run for the app):
    under ``python -m core``, which has no app (``args.opens_app`` False, set by ``dispatch``), the message
    says so and then ``no_app``, the command's way there; where there is no terminal (a pipe, cron, CI: the
    app would paint escape codes into the pipe and wait forever) it is ``no_terminal``, the headless way."""
    if not getattr(args, "opens_app", True):
        raise CliError(t("cli.app_needs_entry_instead", instead=no_app), EXIT_USAGE)
    if not _on_a_terminal():
        raise CliError(no_terminal, EXIT_USAGE)


def report_error(exc: BaseException) -> int | None:
    """The one place a failure becomes ``tunedeck: <message>`` on stderr: returns the exit code, or None
    for an exception that is not the user's to act on (the caller re-raises it: a traceback)."""
    if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):  # EPIPE: quietly, in dispatch
        # A full or read-only disk under a command that writes, or output that cannot be written (stdout
        # to /dev/full, a terminal gone): say which file or stream and what to do, not a traceback.
        from core.runs.disk_space import cannot_write_message, is_unwritable, output_stream

        stream = output_stream(exc)
        if is_unwritable(exc) or stream is not None:
            _say(f"tunedeck: {cannot_write_message(exc)}")
            if stream == "stdout":
                _drop_stdout()  # its buffer would fail again at interpreter exit
            return 1
    if isinstance(exc, TunedeckError):
        _say(f"tunedeck: {exc.message}")
        return exc.exit_code
    missing = missing_training_module(exc)
    if missing is not None:  # merge, chat, data check --model … in an install without the training stack
        _say(f"tunedeck: {training_stack_missing([missing])}")
        return EXIT_USAGE
    return None


def _say(text: str) -> None:
    """A line on standard error; where that cannot be written (``2> /dev/full``) there is no one to tell,
    and the exit code still says what happened."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
