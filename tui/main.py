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

    code = int(run_app(outcome.settings, open_run=outcome.open_run) or 0)
    note = live_runs_note()
    if note:
        print(note, file=sys.stderr)  # the app's screen is gone: this lands on the normal terminal
    return code


def live_runs_note() -> str | None:
    """"1 run still training (ID) — re-attach with `tunedeck`", or None when no run is live."""
    from core.i18n import t
    from core.runs import ACTIVE_STATES
    from core.runs.listing import list_runs
    from core.units import plural_key

    try:
        live = [run.id for run in list_runs() if run.status in ACTIVE_STATES]
    except OSError:  # an unreadable runs folder must not turn a clean quit into a traceback
        return None
    if not live:
        return None
    return t(plural_key("app.live_runs_on_quit", len(live)), count=len(live), ids=", ".join(live))


if __name__ == "__main__":
    sys.exit(main())
