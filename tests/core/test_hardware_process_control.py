"""Signalling GPU processes with real child processes: the pid-reuse check, the refusals and their reasons."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from core.hardware.process_control import (
    GONE,
    NOT_PERMITTED,
    OTHER_USER,
    OWN_PROCESS,
    REUSED,
    START_UNKNOWN,
    SignalRefused,
    SignalTarget,
    check_signal,
    has_ended,
    send_signal,
    wait_until_ended,
)
from core.hardware.processes import NOT_A_GPU_PROCESS, NOT_IN_NAMESPACE
from core.hardware.snapshot import GpuProcess
from tests.users import as_nobody

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics")


@pytest.fixture
def child():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def as_gpu_process(pid: int, **fields) -> GpuProcess:
    """The process as a snapshot shows it: visible, with the start time read when it was polled."""
    if "started_at" not in fields:
        fields["started_at"] = psutil.Process(pid).create_time()
    return GpuProcess(pid, 2**30, visible=True, user="someone", command="sleep 60", **fields)


def gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def refusal(process: GpuProcess, **options) -> SignalRefused:
    with pytest.raises(SignalRefused) as caught:
        check_signal(process, **options)
    return caught.value


def test_sigterm_reaches_the_same_process_and_it_ends(child):
    target = check_signal(as_gpu_process(child.pid))
    assert target == SignalTarget(child.pid, psutil.Process(child.pid).create_time(), target.owner)
    assert has_ended(target) is False
    assert send_signal(target) == "SIGTERM"
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_sigkill_with_force(child):
    target = check_signal(as_gpu_process(child.pid))
    assert send_signal(target, force=True) == "SIGKILL"
    assert child.wait(timeout=30) == -signal.SIGKILL


def test_a_pid_that_now_names_another_process_is_never_signalled(child):
    """The snapshot's start time differs from the process holding the pid now: a reused pid."""
    started = psutil.Process(child.pid).create_time()
    err = refusal(as_gpu_process(child.pid, started_at=started - 3600))
    assert err.reason == REUSED and str(child.pid) in str(err) and "nothing was sent" in str(err)
    # The same check happens again at sending time, for a pid reused after the dialog was opened.
    with pytest.raises(SignalRefused) as caught:
        send_signal(SignalTarget(child.pid, started - 3600))
    assert caught.value.reason == REUSED
    assert child.poll() is None  # untouched


def test_an_exited_process_is_gone():
    pid = gone_pid()
    assert refusal(as_gpu_process(pid, started_at=1.0)).reason == GONE
    with pytest.raises(SignalRefused) as caught:
        send_signal(SignalTarget(pid, 1.0))
    assert caught.value.reason == GONE
    assert has_ended(SignalTarget(pid, 1.0)) is True


def test_this_app_is_refused():
    err = refusal(as_gpu_process(os.getpid()))
    assert err.reason == OWN_PROCESS and "tunedeck itself" in str(err)


def test_own_pid_can_be_given(child):
    assert refusal(as_gpu_process(child.pid), own_pid=child.pid).reason == OWN_PROCESS


@pytest.mark.parametrize("hidden", [NOT_IN_NAMESPACE, NOT_A_GPU_PROCESS])
def test_a_pid_not_visible_here_is_refused_with_why(child, hidden):
    """Another container's process: NVML's host pid is absent here or names an unrelated process."""
    process = GpuProcess(child.pid, 2**30, visible=False, hidden_reason=hidden)
    err = refusal(process)
    assert err.reason == hidden
    assert ("not visible in this container" if hidden == NOT_IN_NAMESPACE else "another container") in str(err)
    assert child.poll() is None


def test_without_a_start_time_the_process_cannot_be_told_from_a_reused_pid(child):
    err = refusal(as_gpu_process(child.pid, started_at=None))
    assert err.reason == START_UNKNOWN
    assert child.poll() is None


def test_a_zombie_has_ended(child):
    target = check_signal(as_gpu_process(child.pid))
    os.kill(child.pid, signal.SIGKILL)
    # Not reaped yet (the test is its parent): a zombie, which has ended all the same.
    assert wait_until_ended(target, timeout_s=30) is True
    assert child.poll() == -signal.SIGKILL


def test_wait_until_ended_gives_up_on_a_live_process(child):
    target = check_signal(as_gpu_process(child.pid))
    clock = iter(range(100))
    assert wait_until_ended(target, timeout_s=3, sleep=lambda _s: None, clock=lambda: next(clock)) is False


def _check_as_nobody(process: GpuProcess) -> dict:
    """check_signal and send_signal run in a forked child that dropped root for ``nobody``."""

    def job() -> dict:
        result = {}
        try:
            check_signal(process)
            result["check"] = "allowed"
        except SignalRefused as err:
            result["check"], result["message"] = err.reason, str(err)
        try:
            send_signal(SignalTarget(process.pid, process.started_at or 0.0))
            result["send"] = "sent"
        except SignalRefused as err:
            result["send"] = err.reason
        return result

    return as_nobody(job)


def test_another_users_process_is_refused_with_its_owner(child):
    """kill(2) needs the same user (or root): said before asking, and refused again at sending time."""
    if os.geteuid() == 0:
        result = _check_as_nobody(as_gpu_process(child.pid))  # the child is root's, the checker nobody
        assert "error" not in result, result
        assert result["check"] == OTHER_USER and "belongs to root" in result["message"], result
        assert result["send"] == NOT_PERMITTED, result
    else:
        init = psutil.Process(1)
        if init.uids().real == os.getuid():
            pytest.skip("pid 1 is this user's")
        err = refusal(as_gpu_process(1))
        assert err.reason == OTHER_USER
    assert child.poll() is None
