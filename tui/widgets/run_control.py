"""Stop and resume a run, asked first: one flow for the dashboard and the Runs list.

Each asks in a ``ConfirmScreen``, then calls ``core.runs`` (``stop_run``, ``resume_run``: the functions
``tunedeck stop`` and ``tunedeck resume`` call) in a thread worker of the asking screen. What comes of it
goes to ``say(text, severity)``, which must be safe to call from that thread (post a message), and
``after()`` runs there too once the run's state has changed (look at it again).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.i18n import t
from core.runs import can_resume, can_stop, state_label
from core.runs.states import BEFORE_TRAINING_STATES, still_stopping

Say = Callable[[str, str], None]


def ask_stop(screen: Any, run_dir: str | Path, run_id: str, status: str, say: Say,
             after: Callable[[], None] = lambda: None, reason_message: dict[str, Any] | None = None) -> None:
    """Stop a live run (a second stop while it is stopping, or stalled while stopping: ``reason_message``,
    forces it), once the user says y."""
    if not can_stop(status):
        screen.notify(t("dashboard.not_running", status=state_label(status)), severity="warning")
        return
    force = still_stopping(status, reason_message)
    starting = status in BEFORE_TRAINING_STATES  # no checkpoint to promise before the first step
    title = t("dashboard.force_title" if force else "dashboard.stop_title", id=run_id)
    body = t("dashboard.force_body" if force else "dashboard.stop_body_starting" if starting else "dashboard.stop_body")

    def job() -> None:
        from core.runs import RunDirectory, RunError, stop_run

        try:
            result = stop_run(RunDirectory(Path(run_dir)), force=force)
        except RunError as exc:
            say(str(exc), "error")
            return
        key = "dashboard.forced" if result.forced else "dashboard.stopping_starting" if starting else "dashboard.stopping"
        say(t(key, id=run_id, status=state_label(result.status.status)), "information")
        for notice in result.notices:  # a run.json that does not read: which file, what to do
            say(notice.text(), "warning")
        after()

    _confirm_then(screen, title, body, job)


def ask_resume(screen: Any, run_dir: str | Path, run_id: str, status: str, say: Say,
               after: Callable[[], None] = lambda: None, cpu: bool = False, from_start: bool = False) -> None:
    """Resume a stopped, failed or crashed run from its newest sound checkpoint, once the user says y.
    ``cpu``: the run trains on the CPU (the question says so, not "on the same GPUs"); ``from_start``: it
    has no checkpoint, having ended before its first step, and starts again from step 0 (the question says so)."""
    if not can_resume(status):
        screen.notify(t("dashboard.cannot_resume", status=state_label(status)), severity="warning")
        return

    def job(allow_shared_gpus: bool = False, allow_over_memory: bool = False) -> None:
        from core.runs import (
            GpuMemoryShort,
            GpusInUse,
            RunDirectory,
            RunError,
            SupervisorDidNotStart,
            resume_run,
        )

        run = RunDirectory(Path(run_dir))
        try:
            # Fallbacks, removals, changed data or keys, a disk that barely holds the checkpoints: said,
            # not buried.
            plan = resume_run(run, warn=lambda text: say(text, "warning"),
                              notice=lambda notice: say(notice.text(), "warning"),
                              allow_shared_gpus=allow_shared_gpus, allow_over_memory=allow_over_memory)
        except SupervisorDidNotStart as exc:  # the run is marked failed; its supervisor.log says why
            say(exc.summary(t("dashboard.resume_failed", path=str(exc.log_path))), "error")  # and why
        except GpusInUse as exc:  # asked, as the wizard asks: share them (y), or what else to do
            count = len(run.read_launch_record()[0].get("gpus") or [])
            screen.app.call_from_thread(ask_shared, exc.runs, count)
            return
        except GpuMemoryShort as exc:  # asked as the wizard asks: the figures, resume anyway (y) or not
            screen.app.call_from_thread(ask_over_memory, str(exc), allow_shared_gpus)
            return
        except RunError as exc:
            say(str(exc), "error")
            return
        else:
            say(t("dashboard.resumed", id=run.id, checkpoint=plan.checkpoint) if plan.checkpoint is not None
                else t("dashboard.restarted", id=run.id), "information")
        after()

    def ask_shared(in_use: list[tuple[str, str, list[int]]], count: int) -> None:
        """A live run holds the run's GPUs: y resumes it anyway on them (``--allow-shared-gpus``); else the
        refusal names the commands that resume it on other GPUs or shared."""
        from tui.widgets.confirm import ConfirmScreen

        other, other_status, gpus = in_use[0]
        shared = ",".join(map(str, gpus))

        def answered(ok: bool | None) -> None:
            if ok:
                _run_guarded(screen, lambda: job(allow_shared_gpus=True))
            else:
                say(t("dashboard.resume_gpus_in_use_kept", id=run_id, other=other, gpus=shared, count=count),
                    "warning")

        body = t("dashboard.resume_gpus_in_use_body", id=run_id, other=other, status=state_label(other_status),
                 gpus=shared, count=count)
        screen.app.push_screen(ConfirmScreen(t("wizard.gpus_in_use_title", gpus=shared), body), answered)

    def ask_over_memory(refusal: str, shared: bool) -> None:
        """The run's estimated peak is past its GPUs' free memory now (another process holds some): y resumes
        it anyway (``--allow-over-memory``); else the refusal is said, with its way out."""
        from tui.widgets.confirm import ConfirmScreen

        def answered(ok: bool | None) -> None:
            if ok:
                _run_guarded(screen, lambda: job(allow_shared_gpus=shared, allow_over_memory=True))
            else:
                say(refusal, "warning")

        screen.app.push_screen(ConfirmScreen(t("dashboard.resume_over_memory_title", id=run_id),
                                             t("wizard.over_memory_body", text=refusal)), answered)

    body = t("dashboard.resume_body_from_start" if from_start else
             "dashboard.resume_body_cpu" if cpu else "dashboard.resume_body")
    _confirm_then(screen, t("dashboard.resume_title", id=run_id), body, job)


def _confirm_then(screen: Any, title: str, body: str, job: Callable[[], None]) -> None:
    from tui.widgets.confirm import ConfirmScreen

    def answered(ok: bool | None) -> None:
        if ok:
            _run_guarded(screen, job)

    screen.app.push_screen(ConfirmScreen(title, body), answered)


def _run_guarded(screen: Any, job: Callable[[], None]) -> None:
    """``job`` in a thread worker of ``screen``; an exception that is not a RunError (those are said) opens
    the error modal, the traceback logged."""

    def guarded() -> None:
        try:
            job()
        except Exception as exc:
            from tui.screens.error_modal import report_unexpected

            report_unexpected(screen.app, exc, "run-control")

    screen.run_worker(guarded, thread=True, group="run-control", exit_on_error=False)
