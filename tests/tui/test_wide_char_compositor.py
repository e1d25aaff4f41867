"""A toast's Chinese text stays whole where it crosses the edges of the widgets behind it.

Textual divided every widget's line at every widget's edge, and a two-cell character across such an edge
became two spaces (Textualize/textual#6357): over the Models screen's divider 正在后台下载 read 正在后  下载.
Fake GPUs: the h200x2 recording; the hub is a closed port (the Models screen shows its offline message,
with the list and the details side by side)."""

from __future__ import annotations

import asyncio

from rich.segment import Segment
from textual.strip import Strip

from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.models import ModelsScreen
from tui.wide_char_compositor import straddled

MESSAGE = "正在后台下载 已复制到剪贴板 界面语言已设为中文"


def test_a_toast_over_the_models_divider_keeps_its_chinese_whole():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
            divider = app.screen.query_one("#models-details").region.x  # the details pane's left edge
            toasts = []
            for shift in range(2):  # the toast's text at both parities, so that one character crosses the edge
                app.clear_notifications()
                app.notify(" " * shift + MESSAGE, timeout=60)
                await wait_for(pilot, lambda: len(app.screen.query("Toast")) == 1 and app.screen.query_one("Toast")
                               .region.width > 0, timeout=10)
                await pilot.pause()
                rack = app.screen.query_one("Toast")
                assert rack.region.x < divider < rack.region.right  # the toast does cross the divider
                toasts.append("".join(screen_text(app).split()))
            for text in toasts:
                assert "正在后台下载" in text and "已复制到剪贴板" in text and "界面语言已设为中文" in text, text

    asyncio.run(scenario())


def test_only_offsets_inside_a_wide_character_are_straddled():
    strip = Strip([Segment("ab"), Segment("中文x"), Segment("y")])  # cells: a b 中中 文文 x y
    assert straddled(strip, [1, 2, 3, 4, 5, 6, 7]) == {3, 5}
    assert straddled(Strip([Segment("abc")]), [1, 2]) == set()
