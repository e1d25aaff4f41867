"""The wizard's fields are checked as ``tunedeck plan`` checks its options, and said on their own step."""

from __future__ import annotations

import asyncio

from tests.tui.conftest import fake_monitor, quiet_settings, wait_for
from tests.tui.test_wizard_flow import to_dataset_step
from tui.app import make_app


def run(coro):
    return asyncio.run(coro)


def test_epochs_without_a_count_of_tokens_are_refused_on_the_goal_step(private_home):
    """``inf`` and 1e400 epochs crashed to the error modal (no integer count of tokens), ``nan`` reached the
    hardware step as "cannot convert float NaN to integer". Each is refused on the goal step, where the
    field is, in the words of ``plan --epochs`` (a CPU-only box, the bundled sample)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            await pilot.press("enter")  # dataset: the bundled sample
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            said = {}
            for text in ("inf", "1e400", "nan", "1e308", "0"):
                w.query_one("#epochs-input").value = text
                await pilot.press("enter")
                await pilot.pause()
                assert w.step == 2, text
                said[text] = " ".join(str(w.query_one("#goal-info").render()).split())
            w.query_one("#epochs-input").value = "2"
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 3)
            return said

    said = run(scenario())
    assert said == {"inf": "Epochs: got 'inf'; expected a number",
                    "1e400": "Epochs: got '1e400'; expected a number",
                    "nan": "Epochs: got 'nan'; expected a number",
                    "1e308": "Epochs: got 1e+308; must be at most 1000000",
                    "0": "Epochs: got 0.0; must be more than 0"}
