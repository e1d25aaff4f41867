"""The log pane stays on the newest line while it follows, whatever rewraps or lays out its rows late."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult

from tests.tui.conftest import wait_for
from tui.widgets.log_pane import LogPane

LINES = [f"[rank 0] step {i:03d}/100 | loss 0.{i:03d}".ljust(40, ".") for i in range(1, 101)]


class _OnePane(App):
    CSS = "LogPane { width: 40; height: 10; }"

    def compose(self) -> ComposeResult:
        yield LogPane(id="log")


def test_a_following_pane_ends_on_the_newest_line_after_its_scrollbar_narrows_it():
    """40-cell lines fit the pane until its vertical scrollbar takes a column, then wrap into two rows each:
    the rows are rebuilt after the frame, and a following pane ends at the bottom of the new ones."""

    async def scenario():
        app = _OnePane()
        async with app.run_test(size=(60, 20)) as pilot:
            pane = app.query_one(LogPane)
            pane.append(LINES)
            await wait_for(pilot, lambda: 0 < pane._wrap_width < 40 and len(pane.rows) == 200)
            await wait_for(pilot, lambda: pane.at_newest and pane.max_scroll_y > 0)
            assert pane.following

    asyncio.run(scenario())


def test_keep_up_puts_a_following_pane_back_on_the_newest_line_and_leaves_a_scrolled_one():
    """The dashboard's tick calls ``keep_up`` (as the events table's): a following pane left short of the newest
    line by a layout that changed after its scroll (the CI's 80x24 dashboard snapshot once showed step 561 of
    600 so) goes back to it; a pane the user scrolled up stays where the user put it."""

    async def scenario():
        app = _OnePane()
        async with app.run_test(size=(60, 20)) as pilot:
            pane = app.query_one(LogPane)
            pane.append(LINES)
            await wait_for(pilot, lambda: pane.at_newest and pane.max_scroll_y > 0)
            pane.scroll_to(y=pane.max_scroll_y - 30, animate=False, immediate=True)  # the user scrolls up
            await pilot.pause()
            assert not pane.following and not pane.at_newest
            pane.keep_up()
            await pilot.pause()
            assert not pane.at_newest  # left where the user put it
            pane.following = True  # as if the rows had grown under a following pane after its scroll
            pane.keep_up()
            await wait_for(pilot, lambda: pane.at_newest)

    asyncio.run(scenario())
