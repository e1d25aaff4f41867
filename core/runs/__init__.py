"""Detached training runs: run directories, the supervisor, liveness, stop/resume and listing.

Read API (cheap; used by the CLI and the dashboard)::

    RunDirectory(path).status() / .record() / .config() / .latest_metrics() / .latest_eval()
        / .metrics_header() / .checkpoints() / .last_complete_checkpoint() / .last_event(kind)
    effective_status(run) -> RunStatus            # liveness applied: dead active runs become crashed
    list_runs() -> list[RunSummary]               # newest first
    resolve_run("20261129-2301-qwen") -> RunDirectory   # id, unique prefix or path
    RunState, ACTIVE_STATES, TERMINAL_STATES      # the one set of run states (core.runs.states)
    can_stop(status) / can_resume(status)         # what a state allows

Nothing here imports torch; ``core.train`` is the code that runs inside the trainer process.
"""

from __future__ import annotations

from core.runs.listing import RunNotFound, RunSummary, list_runs, resolve_run
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
    "RESUMABLE_STATES",
    "TERMINAL_STATES",
    "RunDirectory",
    "RunNotFound",
    "RunState",
    "RunStatus",
    "RunSummary",
    "can_resume",
    "can_stop",
    "effective_status",
    "list_runs",
    "resolve_run",
    "state_label",
]
