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


def test_a_price_below_zero_or_not_a_number_is_refused_on_the_hardware_step(private_home):
    """A price of -5 was planned with a cost of -0.17, ``nan`` with a cost of "–", where ``plan
    --price-per-gpu-hour`` refuses both: the hardware step now says so, in the command's words, and stays
    (a CPU-only box, the bundled sample)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            await pilot.press("enter")  # dataset: the bundled sample
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            await pilot.press("enter")  # goal: fastest
            await wait_for(pilot, lambda: w.step == 3)
            said = {}
            for text in ("-5", "nan"):
                w.query_one("#price-input").value = text
                await pilot.press("enter")
                await wait_for(pilot, lambda: "Price" in str(w.query_one("#hardware-info").render()))
                said[text] = " ".join(str(w.query_one("#hardware-info").render()).split())
                w.query_one("#hardware-info").update("")
                assert w.step == 3 and w.recommendation is None, text
            w.query_one("#price-input").value = "2.5"
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 4)
            return said, w.request.hardware.price_per_gpu_hour

    said, price = run(scenario())
    assert said == {"-5": "Price per GPU-hour: got -5.0; must be at least 0",
                    "nan": "Price per GPU-hour: got 'nan'; expected a number"}
    assert price == 2.5
