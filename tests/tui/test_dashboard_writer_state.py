"""The dashboard on another trainer's folder says what core.watch.activity says: idle since …, finished,
running or gone (deleted), and shows a live ETA only while running."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from pathlib import Path

from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen

FIXTURES = Path(__file__).parents[1] / "fixtures" / "watch"
MONTHS_AGO = time.time() - 90 * 86400


def swift_run(tmp_path: Path, keep_lines: int | None = None, old: bool = False) -> Path:
    run = tmp_path / "output" / "v0-20261129-210000"
    shutil.copytree(FIXTURES / "swift_output" / "v0-20261129-210000", run)
    if keep_lines is not None:
        lines = (run / "logging.jsonl").read_text().splitlines(keepends=True)[:keep_lines]
        (run / "logging.jsonl").write_text("".join(lines))
    if old:
        for path in run.iterdir():
            os.utime(path, (MONTHS_AGO, MONTHS_AGO))
    return run


async def header_when(pilot, app, status: str) -> str:
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
    screen = app.screen
    await wait_for(pilot, lambda: screen.status == status and screen.series.train_records > 0)
    screen._redraw()
    await pilot.pause()
    return screen_text(app)


def test_a_log_left_months_ago_shows_idle_since_and_no_eta(tmp_path):
    run = swift_run(tmp_path, keep_lines=60, old=True)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(run))
        async with app.run_test(size=(80, 24)) as pilot:
            text = " ".join((await header_when(pilot, app, "idle")).split())  # the header may wrap at 80
            day = time.strftime("%Y-%m-%d", time.localtime(MONTHS_AGO))
            assert f"idle since {day}" in text and "ETA" not in text and not re.search(r"\brunning\b", text)  # (running_log.txt is a file name)

    asyncio.run(scenario())


def test_a_finished_log_shows_finished_and_no_eta(tmp_path):
    run = swift_run(tmp_path)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(run))
        async with app.run_test(size=(80, 24)) as pilot:
            text = await header_when(pilot, app, "finished")
            assert "finished" in text and "ETA" not in text

    asyncio.run(scenario())


def test_a_log_being_written_shows_running_with_its_eta(tmp_path):
    run = swift_run(tmp_path, keep_lines=60)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(run))
        async with app.run_test(size=(80, 24)) as pilot:
            text = await header_when(pilot, app, "running")
            assert "running" in text and "ETA" in text

    asyncio.run(scenario())


def test_a_folder_deleted_while_watched_says_so_and_shows_no_eta(tmp_path):
    """It kept saying "running" with its ETA for ever once the folder was deleted."""
    from core.i18n import t

    run = swift_run(tmp_path, keep_lines=60)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(run))
        async with app.run_test(size=(80, 24)) as pilot:
            await header_when(pilot, app, "running")
            shutil.rmtree(run)
            text = " ".join((await header_when(pilot, app, "gone")).split())
            assert t("watch.state.gone") in text and "ETA" not in text and not re.search(r"\brunning\b", text)  # (running_log.txt is a file name)

    asyncio.run(scenario())
