"""The README's picture of the app is the app: the GPU screen at 80×24, replaying the two-H200 recording.

The text block in README.md (the one just before "(The GPU screen at 80×24") must equal what the screen
shows today; ``TUNEDECK_UPDATE_SNAPSHOTS=1`` rewrites it after an intended change of the look, as it does
the SVG snapshots.
"""

from __future__ import annotations

import asyncio
import os
import re

from tests.tui.conftest import ROOT, StepClock, fake_monitor, quiet_settings, screen_text
from tests.tui.test_gpu_screen import feed_history, open_gpus
from tui.app import make_app

README = ROOT / "README.md"
CAPTION = "(The GPU screen at 80×24"
BLOCK = re.compile(r"```\n(?P<screen>.*?)\n```\n\n" + re.escape(CAPTION), re.DOTALL)


def current_screen() -> str:
    async def scenario() -> str:
        clock = StepClock()
        monitor = fake_monitor("h200x2", clock=clock, animate=True)
        app = make_app(quiet_settings(), monitor=monitor)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            await feed_history(pilot, screen, monitor, clock, 11)
            return screen_text(app)

    return asyncio.run(scenario())


def test_readme_screen_is_todays_gpu_screen():
    text = README.read_text(encoding="utf-8")
    found = BLOCK.search(text)
    assert found, f"README.md has no screen block before {CAPTION!r}"
    screen = current_screen()
    if os.environ.get("TUNEDECK_UPDATE_SNAPSHOTS") == "1":
        README.write_text(text[:found.start("screen")] + screen + text[found.end("screen"):], encoding="utf-8")
        return
    assert found.group("screen") == screen, "README.md's screen is outdated: TUNEDECK_UPDATE_SNAPSHOTS=1 rewrites it"
