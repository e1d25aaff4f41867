"""Issue #18 at 80×24, keys only: a way back in the wizard, a readable log and events, footers that fit.

Hardware: the CPU-only recording (``none``) for the wizard (one H200, ``h200x1``, where its plan must
scroll), two H200s (``h200x2``) for the GPU screen and the dashboard; runs are built on disk by
``tests.fixtures.watch.run_builder``.
"""

from __future__ import annotations

import asyncio
import json

from core.i18n import t
from core.paths import runs_dir
from core.text_width import cell_len
from tests.fixtures.watch.run_builder import build_run
from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for, wait_screen_stable
from tests.tui.test_dashboard_render import add_checkpoint, open_dashboard, settle
from tests.tui.test_gpu_screen import open_gpus
from tests.tui.test_wizard_flow import to_result, wizard
from tui.app import make_app
from tui.screens.help import HelpScreen
from tui.widgets.keys_footer import KeysFooter, fit
from tui.widgets.log_pane import LogPane, wrap_points

SIZE = (80, 24)
ERROR = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
         "total capacity of 139.81 GiB of which 1.2 GiB is free. Process 4242 has 138.6 GiB in use. END")


def run(coro):
    return asyncio.run(coro)


def footer_keys(app) -> list[str]:
    return [key for key, _ in app.screen.query_one(KeysFooter).shown()]


def footer_line(app) -> str:
    return screen_text(app).splitlines()[-1]


async def open_wizard(pilot, app):
    await pilot.press("w")
    await wait_for(pilot, lambda: app.current_mode == "wizard")
    return wizard(app)


# --- 1. a dependable way back in the wizard -------------------------------------------------------------
def test_wizard_esc_leaves_the_field_then_goes_back_and_letters_are_keys_again_off_the_text_steps(private_home):
    """Esc leaves the field, then goes back a step, then out of the wizard, where letters are the app's keys
    again. On the model, data and hardware steps letters are text even out of the field (model ids start with
    the app's keys): the footer says so by offering none. CPU box (fake), 80x24."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            w = await open_wizard(pilot, app)
            await pilot.press("f7")
            assert app.focused.id == "model-input"
            model = w.query_one("#model-input")
            await wait_for(pilot, lambda: "g" not in footer_keys(app))  # letters are text now
            assert "F1" in footer_keys(app) and "Esc" in footer_keys(app)
            await pilot.press("escape")  # out of the field, still on step 1
            assert app.focused.id == "step-model" and w.step == 0
            assert "g" not in footer_keys(app) and "F1" in footer_keys(app)  # still text: a new model id
            before = model.value
            await pilot.press("escape")  # on the first step: out of the wizard, to where we came from
            await wait_for(pilot, lambda: app.current_mode != "wizard")
            await pilot.press("r")  # an app key again
            await wait_for(pilot, lambda: app.current_mode == "runs")
            assert model.value == before
            await pilot.press("w")
            await wait_for(pilot, lambda: app.current_mode == "wizard")
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 1)
            await pilot.press("escape")  # no field focused: back a step
            assert w.step == 0
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.current_mode == "runs")

    run(scenario())


def test_wizard_page_keys_work_from_every_widget_and_show_in_footer_and_help(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            w = await open_wizard(pilot, app)
            await wait_for(pilot, lambda: {"PgDn", "PgUp", "F1"} <= set(footer_keys(app)))  # ? is text here
            await pilot.press("pagedown")
            await wait_for(pilot, lambda: w.step == 1)
            w.query_one("#dataset-files").focus()  # a list with page keys of its own
            await pilot.press("pagedown")
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            assert app.focused.id == "goal-list"  # the goal list used to swallow PageUp
            await pilot.press("pageup")
            assert w.step == 1
            await pilot.press("pagedown")
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            assert (f"e {t('wizard.key.edit_goal')}") in footer_line(app)  # the footer says what e edits here
            await pilot.press("e")  # into Epochs; PageUp still goes back from a text field
            assert app.focused.id == "epochs-input"
            await pilot.press("pageup")
            assert w.step == 1
            await pilot.press("f1")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
            text = " ".join(screen_text(app).split())
            assert f"PgDn {t('wizard.key.next')}" in text and f"PgUp {t('wizard.key.back')}" in text
            assert t("help.scroll_hint") in text  # the help says that it scrolls

    run(scenario())


def test_wizard_page_up_leaves_the_scrolling_plan_at_80x24(private_home):
    # One H200 (``h200x1``): its plan (more reasons, alternatives) is longer than 80x24 shows; the
    # CPU box's plan for the tiny model fits the screen and would not scroll.
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            w = await to_result(pilot, app)
            body = w.query_one("#result-body")
            await wait_for(pilot, lambda: body.max_scroll_y > 0)  # the plan scrolls at this size (once laid out)
            assert app.focused is body
            assert footer_keys(app)[:2] == ["?", "PgUp"]
            await pilot.press("pageup")
            assert w.step == 3
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 4)
            await pilot.press("o")  # into the overrides; Esc comes out to the plan, Esc again goes back
            assert app.focused.id == "ov-method"
            await pilot.press("escape")
            assert app.focused is body and w.step == 4
            await pilot.press("escape")
            assert w.step == 3

    run(scenario())


# --- 2. the dashboard's log and events ------------------------------------------------------------------
def test_wrap_points_split_by_cells():
    assert wrap_points("abcdefgh", 3) == [0, 3, 6]
    assert wrap_points("ab", 3) == [0]
    assert wrap_points("中文字符", 5) == [0, 2]  # two cells a character


def test_dashboard_error_line_is_read_in_full_and_f_shows_log_and_events_full_screen(private_home):
    path = build_run(runs_dir(), "20261129-2100-oom", status="failed", steps=310,
                     reason="CUDA out of memory at step 311 (micro batch 4)")
    with open(path / "train.log", "a", encoding="utf-8") as log:
        log.write(ERROR + "\n")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_dashboard(pilot, app, "failed", events=len(list(open(path / "events.jsonl"))))
            pane = screen.query_one("#dash-log", LogPane)
            await wait_for(pilot, lambda: pane.lines and pane.lines[-1] == ERROR)
            await settle(pilot, app, screen)
            # wrapped in the small pane (46 columns): every character of the error is on screen
            region = pane.content_region
            rows = screen_text(app).splitlines()[region.y:region.bottom]
            shown = "".join(row.ljust(80)[region.x:region.right] for row in rows)
            assert "".join(ERROR.split()) in "".join(shown.split())
            assert "f" in footer_keys(app)
            await pilot.press("f")
            await wait_for(pilot, lambda: screen.has_class("-full"))
            await pilot.pause()
            text = screen_text(app)
            assert "Loss" not in text  # the charts make room
            events = screen.query_one("#dash-events")
            detail = list(events.columns.values())[2]
            assert detail.width >= 40  # Detail takes the width Time and Event leave
            assert "step=250" in text
            assert footer_keys(app)[:2] == ["?", "Esc"]
            await pilot.press("e")  # the events, from the newest, then Enter: the highlighted event in full
            await pilot.press("enter")
            await wait_for(pilot, lambda: "step: 310" in screen_text(app))
            await pilot.press("escape")  # closes the event
            await wait_for(pilot, lambda: app.screen is screen)
            await pilot.press("escape")  # leaves the full view, stays on the dashboard
            await wait_for(pilot, lambda: not screen.has_class("-full"))
            assert app.screen is screen

    run(scenario())


def test_dashboard_event_detail_is_read_at_80x24_without_enlarging(private_home):
    """The events table at 80 columns has no room for Detail: the line under it shows the newest event's
    detail in full (wrapped), and the highlighted one's once e gave the table its cursor."""
    reason = "CUDA out of memory at step 311 (micro batch 4); try a smaller micro batch"
    path = build_run(runs_dir(), "20261129-2100-oomev", status="failed", steps=310, reason=reason)
    with open(path / "events.jsonl", "a", encoding="utf-8") as events:
        events.write(json.dumps({"time": "2026-11-29T21:30:01Z", "ts": 3.0, "event": "supervisor_exit",
                                 "reason": reason}) + "\n")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_dashboard(pilot, app, "failed", events=len(list(open(path / "events.jsonl"))))
            line = screen.query_one("#dash-event-detail")
            await wait_for(pilot, lambda: line.display and line.region.height >= 2)
            await wait_screen_stable(pilot, app)

            def under_table() -> str:
                region = line.content_region
                rows = screen_text(app).splitlines()[region.y:region.bottom]
                return " ".join(row.ljust(80)[region.x:region.right].strip() for row in rows)

            assert not screen.has_class("-full")
            assert "".join(f"reason={reason}".split()) in "".join(under_table().split())
            await pilot.press("e")
            await pilot.press("up")  # the failed event before it
            await wait_for(pilot, lambda: "step=310" in under_table())

    run(scenario())


# --- 3. footers that fit, ? always there ---------------------------------------------------------------
def test_fit_drops_the_lowest_priority_first_and_keeps_the_first():
    entries = [("?", "Help"), ("c", "Compact"), ("p", "Processes"), ("q", "Quit")]
    assert fit(entries, 26) == [("?", "Help"), ("c", "Compact"), ("q", "Quit")]
    assert fit(entries, 3) == [("?", "Help")]


async def assert_section_footers_fit(pilot, app) -> None:
    """On each section at 80 columns: ``?`` first (F1 where letters are text: the wizard's first step), and the
    last entry shown whole (nothing cut). Also run in Chinese by ``tests/tui/i18n_zh_scenarios.py`` (two cells a
    character)."""
    await open_gpus(pilot, app)
    for key, mode in (("g", "gpus"), ("m", "models"), ("w", "wizard"), ("r", "runs")):
        if app.current_mode == "wizard":
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.current_mode != "wizard")
        await pilot.press(key)
        await wait_for(pilot, lambda mode=mode: app.current_mode == mode)
        help_key = "F1" if mode == "wizard" else "?"
        await wait_for(pilot, lambda help_key=help_key: footer_line(app).lstrip().startswith(help_key))
        line = footer_line(app).rstrip()
        footer = app.screen.query_one(KeysFooter)
        shown = footer.shown()
        assert len(shown) >= 4
        assert sum(cell_len(k) + 1 + cell_len(d) for k, d in shown) + 2 * (len(shown) - 1) \
            <= footer.content_region.width
        last_key, last_text = shown[-1]
        assert line.endswith(f"{last_key} {last_text}"), line


def test_every_section_footer_fits_80_columns_with_help(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            await assert_section_footers_fit(pilot, app)

    run(scenario())


def test_gpu_footer_lists_its_own_keys(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            await open_gpus(pilot, app)
            assert footer_keys(app)[:5] == ["?", "c", "p", "+", "-"]

    run(scenario())


def test_dashboard_offers_merge_chat_serve_when_finished_in_footer_and_palette(private_home):
    path = build_run(runs_dir(), "20261129-2100-done", status="finished", steps=600)
    add_checkpoint(path, 600)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_dashboard(pilot, app, "finished")
            await wait_for(pilot, lambda: footer_keys(app)[:4] == ["?", "M", "a", "v"])
            assert "k" not in footer_keys(app)  # stop is for a live run
            # The run's five actions filled the 80 columns and Esc, the way out, was dropped: it stays now.
            assert footer_keys(app) == ["?", "M", "a", "v", "E", "X", "Esc"], footer_line(app)
            assert f"Esc {t('dashboard.key.back')}" in footer_line(app)
            titles = {command.title for command in app.get_system_commands(screen)}
            assert {t("lifecycle.key.merge"), t("lifecycle.key.chat"), t("lifecycle.key.serve")} <= titles
            await pilot.press("ctrl+p")
            for key in "merge":
                await pilot.press(key)
            await wait_for(pilot, lambda: t("lifecycle.key.merge") in screen_text(app))

    run(scenario())
