"""Stop and resume a run, asked first: one flow for the dashboard and the Runs list.

Each asks in a ``ConfirmScreen``, then calls core (``request_stop``; ``prepare_resume`` and
``start_supervisor``, as ``tunedeck resume`` does) in a thread worker of the asking screen. What comes of
it goes to ``say(text, severity)``, which must be safe to call from that thread (post a message), and
``after()`` runs there too once the run's state has changed (look at it again).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.i18n import t
from core.runs import RunState, can_resume, can_stop, state_label

Say = Callable[[str, str], None]


def ask_stop(screen: Any, run_dir: str | Path, run_id: str, status: str, say: Say,
             after: Callable[[], None] = lambda: None) -> None:
    """Stop a live run (a second stop while it is stopping forces it), once the user says y."""
    if not can_stop(status):
        screen.notify(t("dashboard.not_running", status=state_label(status)), severity="warning")
        return
    force = status == RunState.STOPPING
    title = t("dashboard.force_title" if force else "dashboard.stop_title", id=run_id)
    body = t("dashboard.force_body" if force else "dashboard.stop_body")

    def job() -> None:
        from core.runs import RunDirectory
        from core.runs.control import RunControlError, request_stop

        try:
            result = request_stop(RunDirectory(Path(run_dir)), force=force)
        except RunControlError as exc:
            say(str(exc), "error")
            return
        key = "dashboard.forced" if result.forced else "dashboard.stopping"
        say(t(key, id=run_id, status=state_label(result.status.status)), "information")
        after()

    _confirm_then(screen, title, body, job)


def ask_resume(screen: Any, run_dir: str | Path, run_id: str, status: str, say: Say,
               after: Callable[[], None] = lambda: None) -> None:
    """Resume a stopped, failed or crashed run from its newest sound checkpoint, once the user says y."""
    if not can_resume(status):
        screen.notify(t("dashboard.cannot_resume", status=state_label(status)), severity="warning")
        return

    def job() -> None:
        from core.runs import RunDirectory
        from core.runs.control import RunControlError, prepare_resume
        from core.runs.launch import start_supervisor, wait_until_started

        run = RunDirectory(Path(run_dir))
        try:
            plan = prepare_resume(run)
        except RunControlError as exc:
            say(str(exc), "error")
            return
        for notice in plan.notices:  # fallbacks, removals, changed data or keys: said, not buried
            say(notice.text(), "warning")
        proc = start_supervisor(run, resume_from=Path(plan.checkpoint))
        if wait_until_started(run, proc):
            say(t("dashboard.resumed", id=run.id, checkpoint=plan.checkpoint), "information")
        else:
            say(t("dashboard.resume_failed", path=str(run.supervisor_log_path)), "error")
        after()

    _confirm_then(screen, t("dashboard.resume_title", id=run_id), t("dashboard.resume_body"), job)


def _confirm_then(screen: Any, title: str, body: str, job: Callable[[], None]) -> None:
    from tui.widgets.confirm import ConfirmScreen

    def answered(ok: bool | None) -> None:
        if ok:
            screen.run_worker(job, thread=True, group="run-control", exit_on_error=False)

    screen.app.push_screen(ConfirmScreen(title, body), answered)
