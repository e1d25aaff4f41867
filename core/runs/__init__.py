"""Detached training runs: run directories, the supervisor, liveness, stop/resume and listing.

Read API (cheap; used by the CLI and the dashboard)::

    RunDirectory(path).status() / .record() / .config() / .latest_metrics() / .latest_eval()
        / .metrics_header() / .checkpoints() / .last_complete_checkpoint() / .last_event(kind)
    effective_status(run) -> RunStatus            # liveness applied: dead active runs become crashed
    list_runs() -> list[RunSummary]               # newest first
    resolve_run("20261129-2301-qwen") -> RunDirectory   # id, unique prefix or path

Nothing here imports torch; ``core.train`` is the code that runs inside the trainer process.
"""

from __future__ import annotations

from core.runs.listing import RunNotFound, RunSummary, list_runs, resolve_run
from core.runs.liveness import effective_status
from core.runs.run_dir import ACTIVE_STATES, ALL_STATES, TERMINAL_STATES, RunDirectory, RunStatus

__all__ = [
    "ACTIVE_STATES",
    "ALL_STATES",
    "TERMINAL_STATES",
    "RunDirectory",
    "RunNotFound",
    "RunStatus",
    "RunSummary",
    "effective_status",
    "list_runs",
    "resolve_run",
]
