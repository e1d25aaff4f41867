"""Detached training runs: run directories, the supervisor, liveness, stop/resume and listing.

Read API (cheap; used by the CLI and the dashboard)::

    RunDirectory(path).status() / .record() / .config() / .latest_metrics() / .latest_eval()
        / .metrics_header() / .checkpoints() / .last_complete_checkpoint() / .last_event(kind)
    effective_status(run) -> RunStatus            # liveness applied: dead active runs become crashed
    list_runs() -> list[RunSummary]               # newest first
    ended_with_checkpoint(run, status) -> bool    # what resume and merge/chat/export need (the TUI's keys)
    resolve_run("qwen-lora-ab12") -> RunDirectory   # id, name part, a unique start of either, or path

A run's life (``core.runs.lifecycle``; every caller, the CLI and the app alike, goes through these)::

    start_run(path_or_config, overrides, distributed) -> RunDirectory
    resume_run(run, checkpoint=None, weights_only=False, overrides=()) -> ResumePlan
    stop_run(run, force=False) / stop_run_and_wait(run, force, timeout_s) -> StopResult
    can_stop(status) / can_resume(status)         # over RunState, the one set of run states
    RunError                                      # what they raise: a message to act on, an exit code

Nothing here imports torch; ``core.train`` is the code that runs inside the trainer process.
"""

from __future__ import annotations

from core.runs.errors import GpuMemoryShort, GpusInUse, RunError, SupervisorDidNotStart
from core.runs.lifecycle import (
    check_run_file,
    load_run_file,
    prepare_run,
    resume_run,
    start_run,
    stop_run,
    stop_run_and_wait,
)
from core.runs.listing import RunNotFound, RunSummary, ended_with_checkpoint, list_runs, resolve_run
from core.runs.liveness import effective_status
from core.runs.run_dir import RunDirectory, RunStatus
from core.runs.states import (
    ACTIVE_STATES,
    ALL_STATES,
    RESUMABLE_STATES,
    TERMINAL_STATES,
    RunState,
    can_resume,
    can_stop,
    state_label,
)

__all__ = [
    "ACTIVE_STATES",
    "ALL_STATES",
    "GpuMemoryShort",
    "GpusInUse",
    "RESUMABLE_STATES",
    "TERMINAL_STATES",
    "RunDirectory",
    "RunError",
    "RunNotFound",
    "RunState",
    "RunStatus",
    "RunSummary",
    "SupervisorDidNotStart",
    "can_resume",
    "can_stop",
    "check_run_file",
    "effective_status",
    "ended_with_checkpoint",
    "list_runs",
    "load_run_file",
    "prepare_run",
    "resolve_run",
    "resume_run",
    "start_run",
    "state_label",
    "stop_run",
    "stop_run_and_wait",
]
