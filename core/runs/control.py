"""Stopping and resuming runs (``tunedeck stop`` / ``tunedeck resume``)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass

from core.i18n import Message, t
from core.runs.liveness import effective_status, same_process_alive, try_lock
from core.runs.run_dir import (
    ACTIVE_STATES,
    FINISHED,
    QUEUED,
    STOPPED,
    STOPPING,
    TERMINAL_STATES,
    RunDirectory,
    RunStatus,
    utc_now_iso,
)


class RunControlError(Exception):
    """A stop/resume that cannot be done; the message says why and what to do."""


@dataclass
class StopResult:
    forced: bool
    status: RunStatus


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants (torchrun workers live in sessions of their own)."""
    import psutil

    try:
        root = psutil.Process(pid)
        victims = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for proc in victims:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=10)


def request_stop(run: RunDirectory, force: bool = False) -> StopResult:
    """Graceful stop (SIGTERM: checkpoint, then exit); ``force`` or a second stop kills the processes."""
    status = effective_status(run)
    if status.status not in ACTIVE_STATES:
        raise RunControlError(t("runs.stop_not_running", id=run.id, status=status.status))
    record = run.record()
    sup = record.get("supervisor") or {}
    pid = sup.get("pid")
    alive = bool(pid) and same_process_alive(pid, sup.get("start_time"))
    if force or status.status == STOPPING:
        if alive:
            _kill_tree(int(pid))
        trainer = record.get("trainer") or {}
        if trainer.get("pid") and same_process_alive(trainer["pid"], trainer.get("start_time")):
            _kill_tree(int(trainer["pid"]))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with try_lock(run) as got:
                if got:
                    break
            time.sleep(0.1)
        run.append_event("stopped", reason="force", forced=True)
        return StopResult(True, run.write_status(STOPPED, Message("runs.reason_forced")))
    if not alive:
        if status.status == QUEUED:
            raise RunControlError(t("runs.stop_not_started", id=run.id))
        return StopResult(False, effective_status(run))
    run.transition(STOPPING, Message("runs.reason_stop_requested"), only_from=ACTIVE_STATES)
    os.kill(int(pid), signal.SIGTERM)
    return StopResult(False, run.status())


def wait_for_end(run: RunDirectory, timeout_s: float | None = None, poll_s: float = 0.25) -> RunStatus:
    """Block until the run reaches a final status (or ``timeout_s`` passes); returns the last status."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        status = effective_status(run)
        if status.status in TERMINAL_STATES:
            return status
        if deadline is not None and time.monotonic() > deadline:
            return status
        time.sleep(poll_s)


def prepare_resume(run: RunDirectory) -> str:
    """Check that ``run`` can resume and mark it queued; returns the checkpoint path to resume from."""
    status = effective_status(run)
    if status.status in ACTIVE_STATES:
        raise RunControlError(t("runs.resume_running", id=run.id, status=status.status))
    if status.status == FINISHED:
        raise RunControlError(t("runs.resume_finished", id=run.id))
    checkpoint = run.last_complete_checkpoint()
    if checkpoint is None:
        raise RunControlError(t("runs.resume_no_checkpoint", id=run.id, path=str(run.checkpoints_dir)))
    # Leftovers of the dead attempt (half-written, or renamed but never marked) must not linger.
    for leftover in run.checkpoints(complete_only=False):
        if not leftover.complete:
            shutil.rmtree(leftover.path, ignore_errors=True)
    record = run.record()
    resumes = list(record.get("resumes") or [])
    resumes.append({"time": utc_now_iso(), "checkpoint": str(checkpoint.path), "step": checkpoint.step,
                    "previous_status": status.status})
    # Forget the old supervisor: its pid must not be mistaken for the new one's.
    run.update_record(resumes=resumes, supervisor=None, trainer=None)
    run.write_status(QUEUED, Message("runs.reason_resuming", step=checkpoint.step))
    return str(checkpoint.path)


__all__ = ["RunControlError", "StopResult", "prepare_resume", "request_stop", "wait_for_end", "STOPPED"]
