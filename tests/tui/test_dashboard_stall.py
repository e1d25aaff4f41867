"""The app sees a stalled run through the same core function as the CLI: the dashboard's state turns
``stalled`` with a warning alert when the trainer's heartbeat goes silent, and back when it beats again."""

from __future__ import annotations

import asyncio
import json
import os
import time

from textual.widgets import Static

from core.i18n import t
from core.paths import runs_dir
from core.runs.heartbeat import HeartbeatWriter, heartbeat_path
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen


def _age(path, seconds: float) -> None:
    beat = heartbeat_path(path, 0)
    data = json.loads(beat.read_text())
    then = time.time() - seconds
    data.update(ts=then, step_ts=then)
    beat.write_text(json.dumps(data))
    for name in (beat, path / "metrics.jsonl"):
        os.utime(name, (then, then))


def test_dashboard_shows_a_silent_trainer_as_stalled_with_an_alert():
    path = build_run(runs_dir(), "20261129-2100-stall", status="running", steps=40)
    writer = HeartbeatWriter(path, 0, interval_s=2.0)
    writer.note_step(40)
    writer.beat()
    _age(path, 600)  # ten minutes without a step or a heartbeat: past the 60 s floor

    async def scenario():
        with SupervisorStandIn(path):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
            async with app.run_test(size=(120, 40)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
                screen = app.screen
                await wait_for(pilot, lambda: screen.status == "stalled")
                await wait_for(pilot, lambda: any("has stalled" in str(n.message) for n in app._notifications))
                assert "stalled" in screen_text(app)
                # The header says why and what to do once the toast is gone, and no speed: the Runs list and
                # `tunedeck status` leave a stalled run's out (it read "12,000 tok/s" beside "stalled").
                info = str(screen.query_one("#dash-info", Static).render())
                assert "no step and no heartbeat" in info and "--force" in info, info
                assert "tok/s" not in info, info
                writer.beat()  # the trainer moves again
                await wait_for(pilot, lambda: screen.status == "running")

    asyncio.run(scenario())


def test_k_on_a_run_stalled_while_stopping_asks_to_kill_it_not_to_save_a_checkpoint():
    """A trainer that hangs while stopping reads as stalled, and a second stop kills it (``request_stop``);
    the dashboard's k asked "stop it? it saves a checkpoint and exits" all the same. It asks to kill it now,
    as for a run still stopping. (Fake 2×H200 box; a stand-in supervisor; nothing is killed: n answers.)"""
    from tui.widgets.confirm import ConfirmScreen

    path = build_run(runs_dir(), "20261129-2100-stop-hang", status="stopping", steps=40)
    writer = HeartbeatWriter(path, 0, interval_s=2.0)
    writer.note_step(40)
    writer.beat()
    _age(path, 600)

    async def scenario():
        with SupervisorStandIn(path):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
            async with app.run_test(size=(80, 24)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
                screen = app.screen
                await wait_for(pilot, lambda: screen.status == "stalled")
                await pilot.press("k")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                text = " ".join(screen_text(app).split())
                assert "saves a checkpoint" not in text, text
                assert t("dashboard.force_title", id=path.name) in text, text
                await pilot.press("n")

    asyncio.run(scenario())
