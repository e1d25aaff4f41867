"""Forgetting a run's server (a run being deleted): the server is looked for once, stopped, its state folder
removed. The server is a stand-in: a sleeping process in its own session filed as the run's (``state.json``
as ``tunedeck serve`` writes it); no GPU, no model."""

from __future__ import annotations

import json
import subprocess

import pytest


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("run_left", [True, False])
def test_forget_server_looks_for_a_live_server_once_and_removes_its_folder(home, tmp_path, monkeypatch, run_left):
    """``forget_server`` looked (``server_state``) and then ``stop_server`` looked again before the same stop;
    with the run's folder gone, ``stop_server`` then called ``forget_server``, which looked a third time. One
    look now, whether the run is still there or already deleted (no call back into ``forget_server``)."""
    from core.lifecycle import serve

    run_dir = tmp_path / "20261129-2200-served"
    if run_left:
        run_dir.mkdir()
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (serve.serve_dir(run_dir.name) / "state.json").write_text(json.dumps(
            {"pid": server.pid, "url": "http://127.0.0.1:8123/v1", "host": "127.0.0.1", "port": 8123,
             "backend": "vllm", "status": "ready", "run": str(run_dir)}))
        looks: list[str] = []
        real_state = serve.server_state
        monkeypatch.setattr(serve, "server_state", lambda run_id: looks.append(run_id) or real_state(run_id))
        assert serve.forget_server(run_dir.name) is True
        assert looks == [run_dir.name]
        assert server.wait(timeout=30) is not None  # stopped
        assert not (home / "serve" / run_dir.name).exists()
        assert serve.forget_server(run_dir.name) is False  # nothing left to stop or remove
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
