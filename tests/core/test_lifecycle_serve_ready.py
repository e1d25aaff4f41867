"""Readiness of a found server and the test request's answer, against real local HTTP servers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_found_vllm_server_still_marked_loading_is_ready_once_it_answers(tmp_path, monkeypatch):
    """The app that started a vLLM server quit while it loaded: state.json still says "loading" and only
    /v1/models can tell. The server here is a real process answering /v1/models (python -m http.server)."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    from core.atomic_file import write_json_atomic
    from core.lifecycle.serve import read_server_record, serve_dir, wait_until_ready

    www = tmp_path / "www"
    (www / "v1").mkdir(parents=True)
    (www / "v1" / "models").write_text('{"data": [{"id": "run"}]}')
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(www)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        run_id = "20261130-0100-vllm"
        url = f"http://127.0.0.1:{port}/v1"
        write_json_atomic(serve_dir(run_id) / "state.json",
                          {"status": "loading", "backend": "vllm", "host": "127.0.0.1", "port": port,
                           "pid": proc.pid, "url": url})
        state = wait_until_ready(run_id, timeout=20)
        assert state.url == url and state.pid == proc.pid and state.status == "ready"
        assert read_server_record(run_id)["status"] == "ready"  # recorded for the next reader
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def test_a_recorded_server_whose_process_is_gone_is_not_waited_for(tmp_path, monkeypatch):
    """state.json names a process that has ended: no 600 s wait, "no server is running" at once."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    from core.atomic_file import write_json_atomic
    from core.lifecycle.serve import serve_dir, wait_until_ready
    from core.lifecycle.source import LifecycleError

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_json_atomic(serve_dir("gone") / "state.json",
                      {"status": "loading", "backend": "vllm", "pid": dead.pid, "url": "http://127.0.0.1:9/v1"})
    with pytest.raises(LifecycleError, match="no server is running"):
        wait_until_ready("gone", timeout=5)


class _NotAChatServer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        # Recorded before the reply: the client may read it and the test look at the list at once.
        self.server.answered.append(self.path)  # type: ignore[attr-defined]
        body = json.dumps({"object": "error"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_reply_that_is_not_a_chat_completion_is_a_lifecycle_error():
    from core.lifecycle.serve import probe_request
    from core.lifecycle.source import LifecycleError

    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotAChatServer)
    server.answered = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        with pytest.raises(LifecycleError, match="not with an OpenAI chat completion") as info:
            probe_request(url, "run", timeout=10)
        # judged on the one answer that came, not on a timeout or a retry
        assert url in str(info.value) and server.answered == ["/v1/chat/completions"]
    finally:
        server.shutdown()
        server.server_close()


def test_status_and_stop_of_a_server_that_ended_unstopped_say_so_with_its_log(tmp_path):
    """A server killed (the OOM killer, kill -9) or crashed left its record "ready": `serve --status` and
    `--stop` said only "no server is running for RUN", as for one never started or stopped on purpose. They
    say it ended without a stop and where its log tells why; a server stopped on purpose is as before. The
    record here names a process that has ended (our own child, reaped)."""
    from core.atomic_file import write_json_atomic
    from tests.fixtures.lifecycle.finished_run import tunedeck

    home = tmp_path / "home"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run_id = "20261130-0100-tiny"
    state = home / "serve" / run_id
    state.mkdir(parents=True)
    write_json_atomic(state / "state.json", {"status": "ready", "pid": gone.pid, "backend": "transformers",
                                             "url": "http://127.0.0.1:9/v1", "port": 9, "host": "127.0.0.1"})
    log = state / "server.log"
    for args in (["--status"], ["--stop"]):
        proc = tunedeck(home, "serve", run_id, *args)
        assert proc.returncode == 1, proc.stderr
        assert f"its server (pid {gone.pid}) ended without being stopped" in proc.stderr, proc.stderr
        assert str(log) in proc.stderr and "Traceback" not in proc.stderr
    status = json.loads(tunedeck(home, "serve", run_id, "--status", "--json").stdout)
    assert status == {"run_id": run_id, "running": False, "ended_unstopped": True, "log": str(log)}
    write_json_atomic(state / "state.json", {"status": "stopped", "pid": gone.pid, "backend": "transformers"})
    proc = tunedeck(home, "serve", run_id, "--status")
    assert proc.returncode == 1 and proc.stderr.strip() == f"no server is running for {run_id}", proc.stderr
    # --stop with no server to stop is no failure (it exited 1): none runs after it, as asked
    proc = tunedeck(home, "serve", run_id, "--stop")
    assert proc.returncode == 0 and proc.stderr.strip() == f"no server is running for {run_id}", proc.stderr


def test_a_server_stopped_while_it_starts_is_stopped_and_its_starter_says_so(lora_run, monkeypatch, tmp_path):
    """`serve --stop` (or the app's k) while our server started, before it took its lock (Python starting,
    its imports), said "no server is running" and did nothing: the server went on to serve. Stopped later
    while it loaded, the `serve` (or the app's panel) waiting for it said it had failed to start, with its
    log. Now a starting server is found by the pid and start time start_server records, and the starter
    says it was stopped. The server here waits, before it starts (a slow import), for a file that never comes:
    it is still starting when the stop arrives, however slow the box (a state, not a speed)."""
    import time

    from core.lifecycle import serve
    from tests.fixtures.lifecycle.serving import hold_server_before_start, start_server_thread

    _home, run = lora_run
    hold_server_before_start(monkeypatch, tmp_path / "never-created")
    starter, outcome = start_server_thread(run, timeout=120)
    starter.start()
    try:
        directory = serve.serve_dir(run.id)
        deadline = time.monotonic() + 60  # a ceiling for the start to show at all, not a speed target
        while serve.server_state(run.id) is None and not outcome and time.monotonic() < deadline:
            time.sleep(0.05)
        state = serve.server_state(run.id)
        assert state is not None and not serve._lock_held(directory), (outcome, serve.read_server_record(run.id))
        assert serve.stop_server(run.id)
        starter.join(timeout=120)
        assert len(outcome) == 1 and isinstance(outcome[0], serve.ServeStopped), outcome
        assert "was stopped before it was ready" in str(outcome[0])
        assert serve.server_state(run.id) is None and not serve._pid_alive(state.pid)
    finally:  # whatever failed, no server of this test outlives it
        serve.stop_server(run.id)
        starter.join(timeout=120)


@pytest.mark.parametrize("status, said", [("starting", "starting"), ("loading", "loading the model")])
def test_serve_status_of_a_server_still_loading_says_so_not_not_answering(lora_run, monkeypatch, capsys, status, said):
    """`serve --status` while our server started or loaded its model (it has no URL until it is ready)
    printed "RUN checkpoint 30:  — not answering (pid …)": an empty address, and a server that is fine
    reported as down. It says what the server is doing, as the app's panel does."""
    from pathlib import Path

    from core import cli
    from core.lifecycle import serve

    _home, run = lora_run
    loading = serve.ServerState(run.id, 4321, "", "127.0.0.1", 0, "transformers", status, Path("server.log"), step=30)
    monkeypatch.setattr(serve, "server_state", lambda key: loading if key == run.id else None)
    assert cli.main(["serve", "--status", run.id]) == 0
    err = capsys.readouterr().err.strip()
    assert err == f"{run.id} checkpoint 30: – — {said} (pid 4321, backend transformers)", err
