"""The ``tunedeck`` command: the headless commands of ``core.cli``, and the app when one is asked for.

The wall runs this way up: ``tui`` knows ``core``; ``core`` never imports ``tui``, Textual or Rich (the
import-linter contracts in pyproject.toml and tests/core/test_core_imports.py enforce it). A core command
that wants the app (``tunedeck`` alone, ``demo``, ``watch DIR``) returns an ``OpenApp`` request and this
entry point opens it.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from core.cli import OpenApp, dispatch

    outcome = dispatch(argv)
    if not isinstance(outcome, OpenApp):
        return outcome
    from tui.app import run_app  # Textual is imported only now: the headless commands never load it

    return int(run_app(outcome.settings, open_run=outcome.open_run) or 0)


if __name__ == "__main__":
    sys.exit(main())
