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


def new_swift_run(output: Path, name: str = "v1-20261130-090000", keep_lines: int = 10) -> Path:
    """ms-swift started again into the same output dir: its next vN-… folder, being written now."""
    run = output / name
    shutil.copytree(FIXTURES / "swift_output" / "v0-20261129-210000", run)
    lines = (run / "logging.jsonl").read_text().splitlines(keepends=True)[:keep_lines]
    (run / "logging.jsonl").write_text("".join(lines))
    return run


def test_a_new_run_in_the_folder_named_is_followed_once_the_one_shown_is_no_longer_written(tmp_path):
    """`tunedeck watch output/` showed its newest run for ever: a run started there later was never shown
    (the old one read "idle since …") while `watch --json` gave the new one. The dashboard now follows it
    by itself once the one shown has gone idle (or finished), and says so."""
    old = swift_run(tmp_path, keep_lines=60, old=True)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(old.parent))
        async with app.run_test(size=(80, 24)) as pilot:
            await header_when(pilot, app, "idle")
            assert app.screen.source.path == old and app.screen.source.root == old.parent
            new = new_swift_run(old.parent)
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.source.path == new)
            text = await header_when(pilot, app, "running")
            assert "running" in text and "ETA" in text
            await wait_for(pilot, lambda: any("now watching the newer run v1-20261130-090000" in n.message
                                              for n in app._notifications))
            assert len(app.screen_stack) == 2  # replaced, not stacked: Esc still quits

    asyncio.run(scenario())


def offers_newer(app) -> set[str]:
    """Where ``o`` (watch the newer run) is offered now: the footer, the help's rows, the palette."""
    from core.i18n import t
    from tui.widgets.keys_footer import footer_entries

    name = t("dashboard.key.newer")
    where = set()
    if any(key == "o" for key, _ in footer_entries(app.screen)):
        where.add("footer")
    if any(("o", name) in rows for _section, rows in app.key_table(app.screen)):
        where.add("help")
    if name in {command.title for command in app.get_system_commands(app.screen)}:
        where.add("palette")
    return where


def test_a_new_run_beside_one_still_running_is_offered_on_o_in_the_footer_help_and_palette(tmp_path):
    """Two runs written side by side: the one shown stays, the newer one is said once and `o` watches it."""
    old = swift_run(tmp_path, keep_lines=60)
    earlier = time.time() - 20  # written 20 s ago: still running
    os.utime(old / "logging.jsonl", (earlier, earlier))

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(old.parent))
        async with app.run_test(size=(80, 24)) as pilot:
            await header_when(pilot, app, "running")
            screen = app.screen
            assert not offers_newer(app)  # nothing newer: o is not offered
            new = new_swift_run(old.parent)
            await wait_for(pilot, lambda: any("A newer run started in this folder: v1-20261130-090000" in n.message
                                              for n in app._notifications))  # (the app posts it to itself)
            assert screen.source.path == old and screen.newer.path == new
            await pilot.pause()
            assert offers_newer(app) == {"footer", "help", "palette"}
            assert "Watch newer run" in screen_text(app)  # at 80 columns, the footer's first entry
            await pilot.press("o")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.source.path == new)
            await wait_for(pilot, lambda: any("Now watching the newer run v1-20261130-090000" in n.message
                                              for n in app._notifications))
            # the toast that offered o is gone (it stayed 15 s over the newer run's dashboard, where o does nothing)
            assert not any("o watches the newer one" in n.message for n in app._notifications)

    asyncio.run(scenario())


def test_a_second_newer_run_takes_the_first_ones_toast_away(tmp_path):
    """Two runs started in turn beside the one shown: the first one's toast ("… v1 …: o watches the newer one")
    stayed when the second was offered, and over the second's own dashboard once o had opened it, naming a run
    o no longer watched. Each offer now takes the one before it away. (No GPU: fake_monitor("none").)"""
    old = swift_run(tmp_path, keep_lines=60)
    earlier = time.time() - 20  # written 20 s ago: still running
    os.utime(old / "logging.jsonl", (earlier, earlier))

    def offered(app, name: str) -> bool:
        return any(f"A newer run started in this folder: {name}" in n.message for n in app._notifications)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(old.parent))
        async with app.run_test(size=(80, 24)) as pilot:
            await header_when(pilot, app, "running")
            screen = app.screen
            new_swift_run(old.parent)
            await wait_for(pilot, lambda: offered(app, "v1-20261130-090000"))
            second = new_swift_run(old.parent, name="v2-20261130-100000")
            await wait_for(pilot, lambda: offered(app, "v2-20261130-100000"))
            assert screen.newer.path == second
            assert not offered(app, "v1-20261130-090000")  # o no longer watches that one
            await pilot.press("o")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.source.path == second)
            await wait_for(pilot, lambda: any("Now watching the newer run v2-20261130-100000" in n.message
                                              for n in app._notifications))
            assert not any("o watches the newer one" in n.message for n in app._notifications)

    asyncio.run(scenario())
