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
from tests.users import skip_unless_root_can_drop
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


def test_k_on_another_users_run_says_it_cannot_be_stopped_and_leaves_it_running(monkeypatch):
    """The dashboard's stop of a run whose supervisor is another user's: os.kill's PermissionError went up
    out of the stop's worker into the unexpected-error modal after the run had been written "stopping". It says
    which run and process, whose it is and what to do; the run stays running. The supervisor is a real
    process holding the run's lock as ``nobody``; the kernel's refusal (EPERM), which this root test process
    would not meet, is injected at the OS boundary: ``os.kill`` to that pid raises PermissionError.
    (Fake 2×H200 box.)"""
    import signal
    import subprocess
    import sys

    import psutil
    import pytest

    from core.runs import RunDirectory
    from tui.widgets.confirm import ConfirmScreen

    if os.geteuid() != 0:
        pytest.skip("needs root, to start the supervisor as nobody")
    skip_unless_root_can_drop()
    path = build_run(runs_dir(), "20261129-2100-others", status="running", steps=40)
    code = ("import fcntl, os, time\n"
            f"fd = os.open({str(path / 'lock')!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.setgid(65534)\n"
            "os.setuid(65534)\n"
            "print('locked', flush=True)\n"
            "time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    real_kill = os.kill

    def kill(pid, sig):
        if pid == holder.pid:
            raise PermissionError(1, "Operation not permitted")
        return real_kill(pid, sig)

    try:
        assert holder.stdout.readline().strip() == "locked"
        run = RunDirectory(path)
        run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()})
        writer = HeartbeatWriter(path, 0, interval_s=2.0)
        writer.note_step(40)
        writer.beat()
        monkeypatch.setattr(os, "kill", kill)
        import pwd

        try:  # uid 65534's name: nobody, nfsnobody (older RHEL), or the number where it has no passwd entry
            owner = pwd.getpwuid(65534).pw_name
        except KeyError:
            owner = "65534"
        said = t("runs.stop_other_user", id=path.name, pid=holder.pid, owner=owner, user="root",
                 error="Operation not permitted", path=str(path))

        async def scenario():
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
            async with app.run_test(size=(80, 24)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
                await wait_for(pilot, lambda: app.screen.status == "running")
                await pilot.press("k")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                await pilot.press("y")
                await wait_for(pilot, lambda: any(str(n.message) == said for n in app._notifications))
                assert app.is_running and run.status().status == "running", run.status()

        asyncio.run(scenario())
    finally:
        monkeypatch.setattr(os, "kill", real_kill)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert run.status().status == "running" and holder.returncode == -signal.SIGKILL  # it ran until the end
