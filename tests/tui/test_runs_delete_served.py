"""Deleting a run that is being served, on a real finished tiny LoRA run with a real detached server: the
Runs screen's dialog says so and deleting stops the server first; `serve --stop / --status` still find a
server by its id when its run is gone (deleted by hand, or by an older tunedeck)."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from textual.widgets import DataTable

from core.paths import runs_dir
from tests.fixtures.lifecycle.finished_run import finished_run, tunedeck
from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tests.tui.test_dashboard_after_training import kill_server, pid_alive
from tui.app import make_app
from tui.screens.runs import RunsScreen
from tui.widgets.confirm import ConfirmScreen


@pytest.fixture()
def served(shared, private_home, monkeypatch):
    """(home, run id, the server's state as `serve --json` printed it); no server outlives the test."""
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    proc = tunedeck(home, "serve", run_id, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout)
    try:
        yield home, run_id, state
    finally:
        kill_server(run_id, [state["pid"]])


def test_deleting_a_served_run_says_so_and_stops_its_server_first(served):
    """The dialog said nothing of the server, and the server went on serving the deleted run: `serve
    --stop RUN` then said `no run matches` (exit 2), only kill PID stopped it, and home/serve/RUN stayed."""
    home, run_id, state = served

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.listed)
            screen = app.screen
            table = screen.query_one("#runs-table", DataTable)
            table.move_cursor(row=[s.id for s in screen.shown].index(run_id))
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.pause()
            flat = " ".join(screen_text(app).split())
            assert f"Delete run {run_id}?" in flat
            assert f"It is being served at {state['url']} (pid {state['pid']})" in flat, flat
            assert "deleting it stops that server first" in flat, flat
            await pilot.press("y")
            await wait_for(pilot, lambda: not (runs_dir() / run_id).exists(), timeout=60)
            await wait_for(pilot, lambda: any(f"its server at {state['url']} was stopped" in str(n.message)
                                              for n in app._notifications), timeout=30)

    asyncio.run(scenario())
    assert not pid_alive(state["pid"])
    assert not (home / "serve" / run_id).exists()  # its state folder went with it
    status = tunedeck(home, "serve", run_id, "--status")
    assert status.returncode == 2 and "no run matches" in status.stderr, status.stderr  # nothing left of either


def test_serve_stop_and_status_find_a_server_whose_run_is_gone(served):
    home, run_id, state = served
    shutil.rmtree(home / "runs" / run_id)  # gone from under its server
    status = tunedeck(home, "serve", run_id, "--status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["pid"] == state["pid"] and json.loads(status.stdout)["healthy"] is True
    assert "no run matches" not in status.stderr
    stopped = tunedeck(home, "serve", "--stop", run_id)
    assert stopped.returncode == 0 and f"server of {run_id} stopped" in stopped.stderr, stopped.stderr
    assert not pid_alive(state["pid"])
    assert not (home / "serve" / run_id).exists()  # nothing left of a server of a run that is gone
    gone = tunedeck(home, "serve", "--stop", run_id)
    assert gone.returncode == 2 and "no run matches" in gone.stderr, gone.stderr  # now nothing is known of it
