"""A start meets the lock of a server of the same id it cannot wait for: one not being stopped is refused at
once, one being stopped that does not end in the wait's bound is refused then; both say which process and
what to do, and start nothing. A real process holds the lock (flock), as our server does; the tiny LoRA
run on CPU, no GPU assumed."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

HOLDER = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
open(sys.argv[2], "w").close()
while True:
    time.sleep(1)
"""


@pytest.fixture
def lock_holder(lora_run, tmp_path):
    """(run, holder process): a process that holds the run's server ``lock`` until killed."""
    from core.lifecycle import serve

    _home, run = lora_run
    directory = serve.serve_dir(run.id)
    ready = tmp_path / "holding"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory / "lock"), str(ready)])
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the holder never took the lock"
            time.sleep(0.05)
        yield run, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
        serve._remove_state_dir(run.id)


def _gone_pid() -> int:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait(timeout=60)
    return ended.pid


def test_a_lock_held_by_no_server_being_stopped_is_refused_at_once_naming_its_holder(lock_holder, monkeypatch):
    """The record names a server that is gone and was never stopped, yet a process holds the lock: nothing to
    wait for. Before, the start launched a server that met the lock and ended with its log's "another
    server holds …"; now the refusal comes before any start, with the holder's pid and what to do."""
    from core.lifecycle import serve
    from core.lifecycle.serve_record import read_state, write_fresh_state

    run, proc = lock_holder
    monkeypatch.setattr(serve, "STOPPING_WAIT_S", 600.0)  # were it waited for, the test would hang, not pass
    directory = serve.serve_dir(run.id)
    record = {"status": "ready", "backend": "transformers", "pid": _gone_pid(), "start_id": "earlier"}
    write_fresh_state(directory, record)
    notes: list[str] = []
    with pytest.raises(serve.LifecycleError) as caught:
        serve.start_server(run, timeout=300, note=notes.append)
    said = str(caught.value)
    assert f"another process (pid {proc.pid}) holds {directory / 'lock'}" in said and f"kill {proc.pid}" in said
    assert notes == [] and read_state(directory) == record  # nothing was started, nothing rewritten


def test_a_server_being_stopped_that_keeps_its_lock_past_the_wait_is_refused_with_what_to_do(lock_holder,
                                                                                          monkeypatch):
    """The record says "stopped" (a stop was said) and the lock is still held: the start says it waits, and
    when the holder has not let go by the wait's bound it refuses, naming the holder and the kill that ends
    it. The bound is made short here: it is a ceiling, the holder never lets go."""
    from core.lifecycle import serve
    from core.lifecycle.serve_record import read_state, write_fresh_state

    run, proc = lock_holder
    monkeypatch.setattr(serve, "STOPPING_WAIT_S", 0.5)
    directory = serve.serve_dir(run.id)
    record = {"status": "stopped", "backend": "transformers", "pid": proc.pid, "start_id": "earlier"}
    write_fresh_state(directory, record)
    notes: list[str] = []
    with pytest.raises(serve.LifecycleError) as caught:
        serve.start_server(run, timeout=300, note=notes.append)
    assert len(notes) == 1 and f"(pid {proc.pid}) is still stopping" in notes[0], notes
    said = str(caught.value)
    assert f"still holds {directory / 'lock'}" in said and f"kill -9 {proc.pid}" in said, said
    assert read_state(directory) == record
