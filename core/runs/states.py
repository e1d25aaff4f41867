"""The states of a run: the values of ``status.json``'s ``status``, and what each state allows.

``RunState`` is a ``str`` enum whose values are the strings status.json has always held, so files written
before it (or by an older tunedeck) read the same, a member equals its string (``RunState.RUNNING ==
"running"``), and a plain string read from a file is found in the sets below. Every place that asks "is
this run live, may it be stopped, may it be resumed" asks here.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any


class RunState(str, Enum):
    QUEUED = "queued"  # written, the supervisor not yet holding the lock
    STARTING = "starting"
    RUNNING = "running"
    # Computed by readers, never written: running, supervisor alive, trainer silent (core.runs.heartbeat).
    STALLED = "stalled"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FINISHED = "finished"
    FAILED = "failed"
    CRASHED = "crashed"

    # The value, not ``RunState.RUNNING``: states go into messages, catalogue keys and JSON.
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


ALL_STATES: tuple[RunState, ...] = tuple(RunState)
# A supervisor should be alive in these states; if it is not, the run crashed.
ACTIVE_STATES: frozenset[RunState] = frozenset(
    {RunState.QUEUED, RunState.STARTING, RunState.RUNNING, RunState.STALLED, RunState.STOPPING})
# Final: nothing runs any more, whatever the reason.
TERMINAL_STATES: frozenset[RunState] = frozenset(RunState) - ACTIVE_STATES
# Not training yet (loading the model and data): a stop now ends the run before its first step, without a
# checkpoint, so the stop's words must not promise one.
BEFORE_TRAINING_STATES: frozenset[RunState] = frozenset({RunState.QUEUED, RunState.STARTING})
# Ended before the end (stopped, failed, crashed): what ``tunedeck resume`` continues.
RESUMABLE_STATES: frozenset[RunState] = TERMINAL_STATES - {RunState.FINISHED}


# Heading for the planned end, so an ETA is true: not stalled (no step comes) nor stopping (it ends at its
# next checkpoint, not at the planned end), and not ended.
ETA_STATES: frozenset[RunState] = frozenset({RunState.QUEUED, RunState.STARTING, RunState.RUNNING})


def shows_eta(status: str) -> bool:
    """Whether a run in ``status`` has an ETA to show (``ETA_STATES``); ``""`` is a folder of another tool
    (no status known), whose own figure stands."""
    return status in ETA_STATES or status == ""


def can_stop(status: str) -> bool:
    """Whether a run in ``status`` can be stopped (a second stop while it is stopping forces it)."""
    return status in ACTIVE_STATES


def still_stopping(status: str, reason_message: Mapping[str, Any] | None = None) -> bool:
    """Whether a run in ``status`` (with its reason as a message record) is still stopping: stopping, or
    stalled while stopping (``runs.reason_stalled_stopping``). A stop then kills it, and says so."""
    if status == RunState.STOPPING:
        return True
    return status == RunState.STALLED and (reason_message or {}).get("key") == "runs.reason_stalled_stopping"


def can_resume(status: str) -> bool:
    """Whether a run in ``status`` can be resumed from a checkpoint: it ended without finishing."""
    return status in RESUMABLE_STATES


def state_label(status: str) -> str:
    """A run status in the interface language (an unknown one, from another tool, as it is)."""
    from core.i18n import t

    return t(f"runs.state.{status}") if status in ALL_STATES else status
