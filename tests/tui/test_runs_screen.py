"""The Runs screen: listing (crashed detection, runs appearing later), sort, filter, Enter, delete; and
what the app does at start (the active run's dashboard, runs that ended since the last visit)."""

from __future__ import annotations

import asyncio

from textual.widgets import DataTable

from core.paths import runs_dir
from core.watch.last_seen import last_seen_path
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import assert_snapshot, fake_monitor, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.screens.runs import RunsScreen
from tui.widgets.confirm import ConfirmScreen


def run(coro):
    return asyncio.run(coro)


def three_runs():
    root = runs_dir()
    live = build_run(root, "20261129-2300-live", status="running", steps=120, created="2026-11-29T23:00:00Z")
    build_run(root, "20261129-2200-done", status="finished", steps=600, created="2026-11-29T22:00:00Z")
    build_run(root, "20261129-2100-dead", status="running", steps=80, created="2026-11-29T21:00:00Z")
    return live


async def open_runs(pilot, app) -> RunsScreen:
    await pilot.press("r")
    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.listed)
    await pilot.pause()
    return app.screen


def ids(screen: RunsScreen) -> list[str]:
    return [s.id for s in screen.shown]


def test_list_sort_filter_and_snapshot():
    live = three_runs()

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
            async with app.run_test(size=(120, 30)) as pilot:
                screen = await open_runs(pilot, app)
                assert ids(screen) == ["20261129-2300-live", "20261129-2200-done", "20261129-2100-dead"]
                status = {s.id: s.status for s in screen.runs}
                assert status["20261129-2100-dead"] == "crashed"  # no supervisor holds its lock
                assert status["20261129-2300-live"] == "running"
                text = screen_text(app)
                assert "crashed" in text and "120/600 20%" in text and "finished" in text
                assert_snapshot(app, "runs_three_120x30")
                await pilot.press("s", "s")  # started -> ETA -> status
                await pilot.pause()
                assert "sorted by Status" in screen_text(app)
                assert ids(screen) == ["20261129-2300-live", "20261129-2200-done", "20261129-2100-dead"]  # desc
                await pilot.press("S")
                assert ids(screen)[0] == "20261129-2100-dead"  # crashed < finished < running
                await pilot.press("f", *"fini")
                await pilot.pause()
                assert ids(screen) == ["20261129-2200-done"]
                await pilot.press("enter")  # keeps the filter, back to the table
                await pilot.pause()
                assert "filter 'fini'" in screen_text(app)
                await pilot.press("escape")
                await pilot.pause()
                assert len(screen.shown) == 3

    run(scenario())


def test_enter_opens_dashboard_and_new_runs_appear():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(120, 30)) as pilot:
            screen = await open_runs(pilot, app)
            assert screen.runs == [] and "No runs yet" in screen_text(app)
            # a run started from another terminal shows up on the next listing
            build_run(runs_dir(), "20261129-2200-later", status="finished", steps=60, total=60)
            await wait_for(pilot, lambda: len(screen.runs) == 1, timeout=6)
            await pilot.pause()
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            assert app.screen.source.run_id == "20261129-2200-later"
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is screen

    run(scenario())


def test_delete_asks_shows_size_and_refuses_active_runs():
    live = three_runs()

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
            async with app.run_test(size=(120, 30)) as pilot:
                screen = await open_runs(pilot, app)
                table = screen.query_one("#runs-table", DataTable)
                table.move_cursor(row=0)  # the live run
                await pilot.press("d")
                await pilot.pause()
                assert not isinstance(app.screen, ConfirmScreen)
                assert any("stop it before deleting" in str(n.message) for n in app._notifications)
                table.move_cursor(row=1)  # finished
                await pilot.press("d")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                text = screen_text(app)
                assert "Delete run 20261129-2200-done?" in text and "KiB" in text
                await pilot.press("n")
                await pilot.pause()
                assert (runs_dir() / "20261129-2200-done").is_dir()
                await pilot.press("d")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                await pilot.press("y")
                await wait_for(pilot, lambda: not (runs_dir() / "20261129-2200-done").exists())
                await wait_for(pilot, lambda: len(screen.runs) == 2)
                assert live.is_dir()

    run(scenario())


def test_app_start_opens_the_active_run_and_announces_ended_runs():
    live = three_runs()
    last_seen_path().parent.mkdir(parents=True, exist_ok=True)
    last_seen_path().write_text('{"runs": {"20261129-2100-dead": "running", "20261129-2200-done": "finished"}}')

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), announce_runs=True)
            async with app.run_test(size=(120, 30)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
                assert app.screen.source.run_id == "20261129-2300-live"
                await wait_for(pilot, lambda: any("20261129-2100-dead ended: crashed" in str(n.message)
                                                  for n in app._notifications))
                notes = [str(n.message) for n in app._notifications]
                assert not any("2200-done" in n for n in notes)  # seen finished last time

    run(scenario())
    assert '"20261129-2100-dead": "crashed"' in last_seen_path().read_text()
