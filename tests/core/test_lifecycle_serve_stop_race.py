"""A stop that lands between a server's coming up and its "ready" record: the record says "stopped" for good
and whoever waits for the server says it was stopped, not that it started or failed to. Real processes
(the tiny LoRA run's own server, a stand-in vLLM) held at states (gate files), never raced by speed; CPU
only, no GPU assumed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path


def _wait_for(condition, what: str, ceiling: float = 120.0) -> None:
    """Poll ``condition`` until it holds; ``ceiling`` is a generous bound for a state to come, not a speed."""
    deadline = time.monotonic() + ceiling
    while not condition():
        assert time.monotonic() < deadline, f"never came: {what}"
        time.sleep(0.05)


def test_our_server_stopped_as_it_writes_ready_stays_stopped_and_its_starter_says_stopped(lora_run, monkeypatch,
                                                                                        tmp_path):
    """`serve --stop` (the app's k) wrote "stopped", then our server, its model loaded, wrote "ready" over it:
    for that moment `serve --status` and the app showed a ready server that was being stopped, and a
    starter could be told it started. Here the server is held just before its "ready" write until the stop
    has said "stopped", then writes, then is held again: the record still says stopped, no server is found,
    and the starter ends with ServeStopped."""
    from core.lifecycle import serve
    from tests.fixtures.lifecycle.serving import hold_server_around_ready, start_server_thread

    _home, run = lora_run
    gates = tmp_path / "gates"
    gates.mkdir()
    hold_server_around_ready(monkeypatch, gates)
    starter, outcome = start_server_thread(run, timeout=300)
    stopper = threading.Thread(target=serve.stop_server, args=(run.id,))
    starter.start()
    try:
        _wait_for(lambda: (gates / "held").exists() or bool(outcome), "the server at its ready write", 300)
        assert not outcome, outcome
        pid = serve.read_server_record(run.id)["pid"]
        stopper.start()
        _wait_for(lambda: serve.read_server_record(run.id).get("status") == "stopped", "the stop's record")
        (gates / "write").touch()
        # the stop's grace before SIGKILL (15 s) bounds this wait; the write itself is a moment
        _wait_for(lambda: (gates / "wrote").exists(), "the server's ready write", 15)
        record = serve.read_server_record(run.id)
        assert record["status"] == "stopped", record
        assert record.get("url"), record  # the rest of the server's write landed: only the status was kept
        assert serve.server_state(run.id) is None
        (gates / "go").touch()
        stopper.join(timeout=120)
        starter.join(timeout=120)
        assert len(outcome) == 1 and isinstance(outcome[0], serve.ServeStopped), outcome
        assert serve.read_server_record(run.id)["status"] == "stopped" and not serve._pid_alive(pid)
    finally:  # whatever failed, no server of this test outlives it
        for name in ("write", "go"):
            (gates / name).touch()
        serve.stop_server(run.id)
        if stopper.is_alive() or stopper.ident:
            stopper.join(timeout=120)
        starter.join(timeout=120)


STAND_IN = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from core.lifecycle.serve_record import update_state

state_dir, ready_file = Path(sys.argv[1]), Path(sys.argv[2])

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        # the stop lands between the waiter's look and its answer: "stopped" written as `serve --stop`
        # writes it before its signal, then the answer that the server is up, then the end the signal brings
        update_state(state_dir, status="stopped")
        body = json.dumps({"data": [{"id": "run"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.done = True

    def log_message(self, *args):
        pass

httpd = HTTPServer(("127.0.0.1", 0), Handler)
httpd.done = False
ready_file.write_text(str(httpd.server_address[1]))
while not httpd.done:
    httpd.handle_request()
"""


def test_a_waiter_that_sees_a_vllm_server_answer_as_it_is_stopped_says_stopped_not_started(tmp_path, monkeypatch):
    """A vLLM server has no "ready" of its own: whoever waits for it writes "ready" once /v1/models answers.
    A stop between that answer and that write was overwritten: the wait returned the server as started and
    the record said "ready" for a server that was gone. The stand-in vLLM here (a real process) writes the
    stop itself at the moment it answers, then ends."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    from core.lifecycle import serve
    from core.lifecycle.serve_record import write_fresh_state

    run_id = "20261207-0100-vllm"
    directory = serve.serve_dir(run_id)
    ready = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-c", STAND_IN, str(directory), str(ready)],
                            cwd=str(Path(__file__).resolve().parents[2]), start_new_session=True)
    try:
        _wait_for(lambda: ready.exists() and ready.read_text().strip() != "", "the stand-in's port")
        port = int(ready.read_text())
        write_fresh_state(directory, {"status": "loading", "backend": "vllm", "host": "127.0.0.1", "port": port,
                                      "pid": proc.pid, "url": f"http://127.0.0.1:{port}/v1"})
        try:
            state = serve.wait_until_ready(run_id, timeout=120)
        except serve.ServeStopped as exc:
            assert "was stopped before it was ready" in str(exc)
        else:
            raise AssertionError(f"a stopped server was reported started: {state}")
        record = json.loads((directory / "state.json").read_text(encoding="utf-8"))
        assert record["status"] == "stopped", record
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_new_start_waits_for_the_server_still_exiting_then_serves_on_its_own_record(lora_run, monkeypatch,
                                                                                     tmp_path):
    """A stop said "stopped" and signalled the server; before that server had ended (its lock still held), a
    new start (k then the panel again, `serve --stop` then `serve` in a script) launched a server that met
    the lock and the start failed ("another server holds …"), for a state that passes in seconds. Here the
    old server is held just before its last write, its lock held, while the new start is made: the start
    says it waits (its note) and writes no record yet; once the old server has ended it starts, its server
    is recorded ready with its own pid, the starter gets it and a stop stops it. Tiny LoRA run on CPU, no GPU
    assumed."""
    import os
    import signal

    from core.lifecycle import serve
    from tests.fixtures.lifecycle.serving import hold_stopped_server_at_exit, start_server_thread

    _home, run = lora_run
    gates = hold_stopped_server_at_exit(monkeypatch, tmp_path)
    old = serve.start_server(run, timeout=300)
    stopper = threading.Thread(target=serve.stop_server, args=(run.id,))
    done = threading.Event()
    notes: list[str] = []
    starter, outcome = start_server_thread(run, timeout=300, cancelled=done.is_set, note=notes.append)
    new_pid = 0
    try:
        stopper.start()
        _wait_for(lambda: (gates / "exiting").exists(), "the old server at its last write")
        starter.start()
        _wait_for(lambda: bool(notes) or bool(outcome), "the new start's note that it waits")
        assert not outcome, outcome
        assert len(notes) == 1 and f"(pid {old.pid}) is still stopping" in notes[0], notes
        record = serve.read_server_record(run.id)
        assert record["pid"] == old.pid and record["status"] == "stopped", record  # nothing started yet
        (gates / "exit").touch()
        stopper.join(timeout=700)
        assert not serve._pid_alive(old.pid)
        starter.join(timeout=300)
        assert len(outcome) == 1 and isinstance(outcome[0], serve.ServerState), outcome
        new_pid = outcome[0].pid
        record = serve.read_server_record(run.id)
        assert new_pid != old.pid and record["status"] == "ready" and record["pid"] == new_pid, record
        assert serve.stop_server(run.id) is True
        assert not serve._pid_alive(new_pid)
        assert serve.read_server_record(run.id)["status"] == "stopped"
    finally:  # whatever failed, no server of this test outlives it
        done.set()
        (gates / "exit").touch()
        serve.stop_server(run.id)
        for pid in (old.pid, new_pid):
            if pid and serve._pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
        if stopper.ident:
            stopper.join(timeout=700)
        if starter.ident:
            starter.join(timeout=300)


def test_two_starts_waiting_for_the_same_stopping_server_start_one_server_and_refuse_the_other(lora_run,
                                                                                               monkeypatch,
                                                                                               tmp_path):
    """Two starts of the run (the app's panel and a script's `serve`, two shells) both waiting for the server
    being stopped: once it let go of its lock, each wrote a fresh record and launched a server, and the second
    server met the first's lock (or the first's record was replaced under it): a failed start, or a server
    running unrecorded. Starting is now one at a time per run: the start that comes second sees the first's
    server starting and is refused as a second start of a running server is, before anything of its own is
    written or launched. The old server is held at its last write (its lock held) while both starts wait;
    the new servers are held before they start (no lock taken), so the second start finds the lock free
    whatever the box's speed. Tiny LoRA run on CPU, no GPU assumed."""
    import os
    import signal

    from core.lifecycle import serve
    from tests.fixtures.lifecycle.serving import (
        hold_server_before_start,
        hold_stopped_server_at_exit,
        start_server_thread,
    )

    _home, run = lora_run
    gates = hold_stopped_server_at_exit(monkeypatch, tmp_path)
    old = serve.start_server(run, timeout=300)
    hold_server_before_start(monkeypatch, gates / "start")  # the servers of the two starts below
    spawned: list[int] = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        spawned.append(proc.pid)
        return proc

    monkeypatch.setattr(serve.subprocess, "Popen", popen)
    stopper = threading.Thread(target=serve.stop_server, args=(run.id,))
    done = threading.Event()
    notes: list[list[str]] = [[], []]
    starts = [start_server_thread(run, timeout=300, cancelled=done.is_set, note=notes[index].append)
              for index in range(2)]
    try:
        stopper.start()
        _wait_for(lambda: (gates / "exiting").exists(), "the old server at its last write")
        for thread, _outcome in starts:
            thread.start()
        _wait_for(lambda: all(notes) or any(outcome for _thread, outcome in starts), "both starts' notes")
        assert not any(outcome for _thread, outcome in starts)  # both wait for the old server
        (gates / "exit").touch()
        stopper.join(timeout=700)
        assert not serve._pid_alive(old.pid)
        # one start refused while the other's server is still held before it starts: a state, not a speed
        _wait_for(lambda: sum(len(outcome) for _thread, outcome in starts) == 1 or len(spawned) > 1,
                  "one start's refusal (or a second server)", 300)
        assert len(spawned) == 1, f"both starts launched a server: {spawned}"
        refused = next(outcome[0] for _thread, outcome in starts if outcome)
        assert type(refused) is serve.LifecycleError, refused
        assert f"a server for {run.id} is already starting (pid {spawned[0]})" in str(refused), refused
        record = serve.read_server_record(run.id)
        assert record["pid"] == spawned[0] and record["status"] == "starting", record
        (gates / "start").touch()
        for thread, _outcome in starts:
            thread.join(timeout=300)
        ready = [outcome[0] for _thread, outcome in starts if outcome[0] is not refused]
        assert len(ready) == 1 and isinstance(ready[0], serve.ServerState), ready
        record = serve.read_server_record(run.id)
        assert ready[0].pid == spawned[0] == record["pid"] and record["status"] == "ready", record
        assert serve.stop_server(run.id) is True and not serve._pid_alive(spawned[0])
    finally:  # whatever failed, no server of this test outlives it
        done.set()
        (gates / "exit").touch()
        (gates / "start").touch()
        serve.stop_server(run.id)
        for pid in (old.pid, *spawned):
            if pid and serve._pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
        if stopper.ident:
            stopper.join(timeout=700)
        for thread, _outcome in starts:
            if thread.ident:
                thread.join(timeout=300)


def test_a_write_made_for_another_start_leaves_the_record_alone(tmp_path):
    """A server still exiting when a new start has begun writes its last "stopped" with its own start id:
    it lands on its own record only, never on the new start's ("stopped" being for good, the new server
    would have run unrecorded). The record's own guard, behind the start's wait for the old server."""
    from core.lifecycle.serve_record import read_state, update_state, write_fresh_state

    write_fresh_state(tmp_path, {"status": "starting", "pid": 2, "start_id": "new"})
    update_state(tmp_path, where={"start_id": "old"}, status="stopped", stopped_ts=1.0)
    assert read_state(tmp_path) == {"status": "starting", "pid": 2, "start_id": "new"}
    update_state(tmp_path, where={"start_id": "new"}, status="ready")
    assert read_state(tmp_path)["status"] == "ready"
