"""The dashboard's ``u`` is ``tunedeck resume``: the same ``core.runs.resume_run``. On a real stopped run
of the tiny model (CPU, real supervisor and trainer): a supervisor that cannot start leaves the run failed
with the reason, as the CLI does, not queued until liveness calls it crashed; then ``u`` again, with a
working Python, resumes it from the checkpoint the stop saved."""

from __future__ import annotations

import asyncio
import time

from core.i18n import t
from core.runs import (
    RunDirectory,
    RunState,
    can_resume,
    can_stop,
    effective_status,
    start_run,
    stop_run,
    stop_run_and_wait,
)
from tests.core.test_runs_detached import write_config, write_dataset
from tests.tui.conftest import fake_monitor, quiet_settings, wait_for
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.widgets.confirm import ConfirmScreen


def stopped_run(tmp_path, monkeypatch) -> RunDirectory:
    """A real LoRA run of the tiny model, stopped once its trainer has made a step (the stop saves a
    checkpoint at that step). It cannot finish first: max_steps is far away."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = write_config(tmp_path / "run.yaml", write_dataset(tmp_path / "data.jsonl"), method="lora",
                          lora_rank=8, max_steps=100_000, save_steps=100_000, warmup_steps=0)
    run = start_run(config, warn=lambda _text: None)
    try:
        deadline = time.monotonic() + 240
        while not (run.latest_metrics() or {}).get("step"):
            assert can_stop(effective_status(run).status), run.status()
            assert time.monotonic() < deadline, "the trainer made no step"
            time.sleep(0.2)
        result = stop_run_and_wait(run, timeout_s=240)
    finally:
        if can_stop(effective_status(run).status):
            stop_run(run, force=True)
    assert result.status.status == RunState.STOPPED and not result.timed_out, result
    assert run.last_complete_checkpoint() is not None
    return run


def notes(app, severity: str) -> list[str]:
    return [str(n.message) for n in app._notifications if n.severity == severity]


def test_u_marks_the_run_failed_when_its_supervisor_cannot_start_then_resumes_it(tmp_path, monkeypatch):
    run = stopped_run(tmp_path, monkeypatch)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=run.id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.is_mounted)
            dashboard = app.screen
            await wait_for(pilot, lambda: dashboard.status == RunState.STOPPED)

            # A Python that cannot start: the supervisor dies before it records anything.
            monkeypatch.setenv("PYTHONHOME", str(tmp_path / "no-python-here"))
            await pilot.press("u")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            failed = t("dashboard.resume_failed", path=str(run.supervisor_log_path))
            await wait_for(pilot, lambda: any(n.startswith(failed) for n in notes(app, "error")), timeout=60)
            # and why, as the supervisor's log ends (here Python's own words on the missing home)
            last = [line for line in run.supervisor_log_path.read_text().splitlines() if line.strip()][-1]
            assert [n for n in notes(app, "error") if n.startswith(failed)] == [f"{failed}\n{last.strip()}"]
            status = run.status()
            assert status.status == RunState.FAILED, status  # the CLI's mark-failed step, not left queued
            assert str(run.supervisor_log_path) in status.reason
            assert run.record()["resumes"][-1]["previous_status"] == RunState.STOPPED
            await wait_for(pilot, lambda: dashboard.status == RunState.FAILED)
            assert can_resume(dashboard.status) and dashboard.check_action("stop", ()) is False

            # Failed is resumable: with a working Python the same key resumes it from the stop's checkpoint.
            monkeypatch.delenv("PYTHONHOME")
            await pilot.press("u")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            checkpoint = str(run.last_complete_checkpoint().path)
            resumed = t("dashboard.resumed", id=run.id, checkpoint=checkpoint)
            await wait_for(pilot, lambda: resumed in notes(app, "information"), timeout=60)
            await wait_for(pilot, lambda: can_stop(dashboard.status))
            assert run.record()["resumes"][-1]["previous_status"] == RunState.FAILED

    try:
        asyncio.run(scenario())
    finally:
        if can_stop(effective_status(run).status):
            stop_run(run, force=True)
        deadline = time.monotonic() + 60
        while can_stop(effective_status(run).status) and time.monotonic() < deadline:
            time.sleep(0.2)
