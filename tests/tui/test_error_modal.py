"""The unexpected is never swallowed: an exception a screen did not expect opens the one error modal, with
its message and where the traceback was written; the traceback is in the app's log. Esc or Enter closes
it; it fits 80×24; errors that come while it is open join it instead of stacking up."""

from __future__ import annotations

import asyncio

from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.error_modal import ErrorModal, log_path
from tui.screens.models import ModelsScreen

SIZE = (80, 24)


def run(coro):
    return asyncio.run(coro)


def flat(text: str) -> str:
    return " ".join(text.split())


def squashed(text: str) -> str:
    """The box's characters without borders or white space: a path folded over two rows reads whole again (how
    it folds depends on how long the test's temporary home is)."""
    return "".join(text.replace("│", " ").split())


class SurprisingSource:
    """A hub source whose SDK raises what no hub error covers."""

    endpoint = "http://hub.invalid"

    def search(self, query):
        raise KeyError("'items' missing from the SDK's answer")

    def details(self, model_id):
        raise KeyError("'siblings'")


def test_an_sdk_surprise_in_the_search_opens_the_error_modal_and_logs_the_traceback(monkeypatch, private_home):
    import core.hub.source

    monkeypatch.setattr(core.hub.source, "open_hub", lambda hub: SurprisingSource())

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("m")  # the Models screen searches as it opens
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal))
            shown = flat(screen_text(app))
            assert "Something went wrong" in shown
            assert "KeyError: \"'items' missing from the SDK's answer\"" in shown
            log_line = app.screen.query_one("#error-log").content
            assert log_line == f"The traceback is written to {log_path()}"
            assert squashed(log_line) in squashed(screen_text(app))  # all of it, folded inside the box
            assert "Esc or Enter closes." in shown
            log = log_path().read_text(encoding="utf-8")
            assert "unexpected error in models.search" in log
            assert "Traceback (most recent call last):" in log and "in search" in log
            assert "KeyError: \"'items' missing from the SDK's answer\"" in log

            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
            screen = app.screen
            await wait_for(pilot, lambda: not screen.searching)  # the screen left "searching …" as well
            assert "KeyError" in flat(screen_text(app))  # and says what failed where it says hub problems

    run(scenario())


def test_the_modal_fits_80x24_and_enter_closes_it(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            from tui.screens.error_modal import report_unexpected

            try:
                raise RuntimeError("x" * 300)  # a long message wraps inside the box
            except RuntimeError as exc:
                report_unexpected(app, exc, "test")
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal))
            await pilot.pause()
            box = app.screen.query_one("Vertical")
            assert box.region.right <= SIZE[0] and box.region.bottom <= SIZE[1]
            shown = screen_text(app)
            assert "Something went wrong" in shown and "Esc or Enter closes." in shown
            await pilot.press("enter")
            await wait_for(pilot, lambda: not isinstance(app.screen, ErrorModal))

    run(scenario())


def test_a_worker_that_dies_is_reported_and_a_second_error_joins_the_open_modal(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            def first() -> None:
                raise ZeroDivisionError("first failure")

            app.run_worker(first, thread=True, group="test", exit_on_error=False)
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal))

            def second() -> None:
                raise ValueError("second failure")

            app.run_worker(second, thread=True, group="test", exit_on_error=False)
            await wait_for(pilot, lambda: "second failure" in flat(screen_text(app)))
            shown = flat(screen_text(app))
            assert "ZeroDivisionError: first failure" in shown and "ValueError: second failure" in shown
            assert sum(isinstance(s, ErrorModal) for s in app.screen_stack) == 1
            log = log_path().read_text(encoding="utf-8")
            assert "unexpected error in worker test/" in log and "ZeroDivisionError: first failure" in log
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, ErrorModal))

    run(scenario())
