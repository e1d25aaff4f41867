"""A modal (here the Runs screen's "Delete run?" question, a real one) answers ? and F1 as every other screen
does, and the palette over it keeps its question: nothing in it leaves the question behind or takes it away
unanswered. Fake GPUs (one H200 replayed), built runs, no GPU assumed."""

from __future__ import annotations

import asyncio

from textual.command import CommandPalette
from textual.widgets import DataTable

from core.paths import runs_dir
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import fake_monitor, palette_search, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.help import HelpScreen
from tui.screens.runs import RunsScreen
from tui.widgets.confirm import ConfirmScreen


async def _delete_question(pilot, app) -> RunsScreen:
    """The Runs list with the finished run's "Delete run?" question open over it."""
    await pilot.press("r")
    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.listed)
    screen = app.screen
    screen.query_one("#runs-table", DataTable).move_cursor(row=1)  # the finished run
    await pilot.press("d")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
    return screen


def _runs():
    root = runs_dir()
    live = build_run(root, "20261129-2300-live", status="running", steps=120, created="2026-11-29T23:00:00Z")
    done = build_run(root, "20261129-2200-done", status="finished", steps=600, created="2026-11-29T22:00:00Z")
    return live, done


def test_question_mark_and_f1_over_a_question_show_its_keys_and_keep_the_question():
    """? and F1 did nothing over a modal (the app's keys do not reach past one): the one screen that asks
    a question had no help. Each now opens the help with the question's keys (y, n); Esc comes back to the
    question, still waiting, and its y still deletes."""
    live, done = _runs()

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
            async with app.run_test(size=(80, 24)) as pilot:
                await _delete_question(pilot, app)
                question = app.screen
                for key in ("question_mark", "f1"):
                    await pilot.press(key)
                    await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
                    text = screen_text(app)
                    assert "Yes" in text and "Enter / n / Esc" in text and "? / F1" in text, text
                    await pilot.press("escape")
                    await wait_for(pilot, lambda: app.screen is question)
                assert done.is_dir()
                await pilot.press("y")
                await wait_for(pilot, lambda: not done.exists())

    asyncio.run(scenario())


def test_the_palette_over_a_question_keeps_it_pending_and_offers_its_answers_not_jumps_away():
    """Ctrl+P over the question opened the palette with the section jumps in it: "Go to Runs" took the
    question off the stack unanswered (the delete neither done nor refused: a lost answer), the others left
    it behind. Over a modal the palette now offers the question's own answers (and help, quit, themes),
    no jump, as the section keys do nothing there; Esc in it comes back to the question, and its "No"
    answers no."""
    live, done = _runs()

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
            async with app.run_test(size=(80, 24)) as pilot:
                runs = await _delete_question(pilot, app)
                question = app.screen
                titles = {command.title: command.help for command in app.get_system_commands(question)}
                assert not [title for title in titles if title.startswith("Go to ")], titles
                assert titles["Yes"] == "Key: y" and titles["No"] == "Key: Enter / n / Esc"
                assert titles["Help"].endswith("Key: ? / F1"), titles
                await pilot.press("ctrl+p")
                await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
                assert question in app.screen_stack
                await pilot.press("escape")
                await wait_for(pilot, lambda: app.screen is question)
                await palette_search(pilot, app, "no", "No")
                await pilot.press("enter")
                await wait_for(pilot, lambda: app.screen is runs)
                assert done.is_dir() and app.current_mode == "runs"

    asyncio.run(scenario())
