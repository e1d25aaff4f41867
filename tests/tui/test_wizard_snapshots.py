"""The recommendation screen at 80×24 and 160×50 (SVG snapshots)."""

from __future__ import annotations

import asyncio

from tests.tui.conftest import assert_snapshot, fake_monitor, quiet_settings
from tests.tui.test_wizard_flow import to_result
from tui.app import make_app


def test_recommendation_80x24_cpu_box():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await to_result(pilot, app)
            await assert_snapshot(pilot, app, "wizard_result_80x24")

    asyncio.run(scenario())


def test_recommendation_160x50_two_h200_with_overrides():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(160, 50)) as pilot:
            await to_result(pilot, app)
            await pilot.press("o")
            await assert_snapshot(pilot, app, "wizard_result_160x50")

    asyncio.run(scenario())
