"""The app sees a stalled run through the same core function as the CLI: the dashboard's state turns
``stalled`` with a warning alert when the trainer's heartbeat goes silent, and back when it beats again."""

from __future__ import annotations

import asyncio
import json
import os
import time

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
                writer.beat()  # the trainer moves again
                await wait_for(pilot, lambda: screen.status == "running")

    asyncio.run(scenario())
