"""The run states: one enum whose values are status.json's strings, and what each state allows."""

from __future__ import annotations

import json

import pytest

from core.runs import (
    ACTIVE_STATES,
    ALL_STATES,
    RESUMABLE_STATES,
    TERMINAL_STATES,
    RunDirectory,
    RunState,
    can_resume,
    can_stop,
    state_label,
)

# What each state allows, written out once here: the sets in core.runs.states must agree with it.
STOPPABLE = {"queued", "starting", "running", "stalled", "stopping"}
RESUMABLE = {"stopped", "failed", "crashed"}


def test_the_values_are_the_strings_status_json_has_always_held():
    assert [s.value for s in RunState] == ["queued", "starting", "running", "stalled", "stopping", "stopped",
                                           "finished", "failed", "crashed"]
    assert ALL_STATES == tuple(RunState)
    assert RunState("running") is RunState.RUNNING and RunState.RUNNING == "running"
    # In text, catalogue keys and JSON a state is its value, never "RunState.RUNNING".
    assert str(RunState.STOPPED) == "stopped" and f"{RunState.STOPPED}" == "stopped"
    assert f"runs.state.{RunState.CRASHED}" == "runs.state.crashed"
    assert json.dumps({"status": RunState.FAILED}) == '{"status": "failed"}'


def test_active_and_terminal_split_every_state():
    assert ACTIVE_STATES | TERMINAL_STATES == set(RunState)
    assert not ACTIVE_STATES & TERMINAL_STATES
    assert RESUMABLE_STATES == TERMINAL_STATES - {RunState.FINISHED}


@pytest.mark.parametrize("state", list(RunState))
def test_can_stop_and_can_resume_over_every_state(state):
    assert can_stop(state) is (state.value in STOPPABLE)
    assert can_resume(state) is (state.value in RESUMABLE)
    # A plain string, as read from status.json or a run summary, is answered the same.
    assert can_stop(state.value) is can_stop(state) and can_resume(state.value) is can_resume(state)
    assert not (can_stop(state) and can_resume(state))  # never both: one key or the other is offered


@pytest.mark.parametrize("status", ["", "idle", "RUNNING", "done", "interrupted"])
def test_a_status_that_is_not_a_run_state_allows_nothing(status):
    # A watched trainer's "idle", or another tool's word: neither stop nor resume.
    assert not can_stop(status) and not can_resume(status)
    assert state_label(status) == status


def test_a_state_written_by_the_enum_reads_back_as_the_plain_string(tmp_path):
    run = RunDirectory(tmp_path)
    run.write_status(RunState.STOPPED, "stopped at step 3")
    assert json.loads(run.status_path.read_text(encoding="utf-8"))["status"] == "stopped"
    status = run.status()
    assert status.status == RunState.STOPPED and type(status.status) is str
    assert can_resume(status.status) and not status.active
    with pytest.raises(ValueError, match="unknown run status"):
        run.write_status("paused")


@pytest.mark.parametrize("broken", ["{\"status\": \"fini", "[]", "{\"status\": \"finished\", \"updated_ts\": [1]}"])
def test_a_status_json_broken_by_hand_reads_as_the_end_events_jsonl_recorded(tmp_path, broken):
    """A finished run whose status.json was broken (a hand edit, a torn copy): `[]` took `tunedeck runs` down
    with a traceback, and bad JSON read as queued, then crashed ("the supervisor process is gone … kill -9?"),
    and that verdict replaced the file. The supervisor's end event says how it ended: that is what it reads as,
    and status.json is written again with it. (No supervisor: nothing holds the run's lock.)"""
    from core.i18n import Message
    from core.runs import effective_status

    run = RunDirectory(tmp_path)
    run.update_record(id="r", resumes=[{"time": "2026-01-01T00:00:00Z", "step": 3}])  # long before the end
    reason = Message("train.stopped_at", id="r", step=9)
    run.append_event("stopped", exit_code=0, reason=reason.english(), reason_message=reason.to_record())
    run.status_path.write_text(broken, encoding="utf-8")
    status = effective_status(run)
    assert status.status == RunState.STOPPED and status.reason == reason.english(), status
    assert run.status().status == RunState.STOPPED  # written again


def test_a_broken_status_json_after_a_resume_is_not_the_earlier_attempts_end(tmp_path):
    """A resume asked for after the recorded end: that attempt's end is unknown, so no supervisor means crashed."""
    import time

    from core.runs import effective_status

    run = RunDirectory(tmp_path)
    run.append_event("stopped", exit_code=0, reason="stopped at step 9")
    run.update_record(id="r", resumes=[{"time": "2099-01-01T00:00:00Z", "ts": time.time() + 1, "step": 9}])
    run.status_path.write_text("{", encoding="utf-8")
    assert effective_status(run).status == RunState.CRASHED
