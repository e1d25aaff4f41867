"""Issue #18 item 6, the Models screen offline, keys only at 80×24: a hub error that says what failed and
what to do (the raw detail below it, scrolling), an empty result that says so, the bundled models in the
Local tab, keys offered by tab and state, and filter keys that neither re-ask an unreachable hub nor
block the screen.

Offline is the conftest's endpoint, a closed port on 127.0.0.1 (refused at once); the hub that answers is
the local fake hub (``tests.hubserver``), through the real SDK.
"""

from __future__ import annotations

import asyncio

import pytest

from core.hub.local import bundled_models
from core.hub.problems import PROXY_ENV
from core.i18n import t
from tests.tui.conftest import assert_snapshot, fake_monitor, quiet_settings, screen_text, wait_for
from tests.tui.test_models_screen import BUNDLED, hub_env, open_models, results  # noqa: F401  (hub_env: a fixture)
from tui.app import make_app
from tui.screens.models import ModelsScreen
from tui.widgets.keys_footer import KeysFooter

SIZE = (80, 24)
OFFLINE = "http://127.0.0.1:9"  # tests/tui/conftest.py points both hubs here


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for name in PROXY_ENV:  # a proxy would change the advice (and carry the requests elsewhere)
        monkeypatch.delenv(name, raising=False)


def run(coro):
    return asyncio.run(coro)


def region_text(app, widget) -> str:
    """The characters ``widget`` shows on screen now (its region of the screen, cropped by cells)."""
    region = widget.region
    strips = app.screen._compositor.render_strips()[region.y:region.bottom]
    return "\n".join(strip.crop(region.x, region.right).text.rstrip() for strip in strips)


def flat(text: str) -> str:
    return " ".join(text.split())


def message_box(app):
    return app.screen.query_one("#models-message")


def status_line(app) -> str:
    return flat(region_text(app, app.screen.query_one("#models-status")))


def footer_keys(app) -> list[str]:
    return [key for key, _ in app.screen.query_one(KeysFooter).shown()]


def offered(app) -> set[str]:
    """Every key of the screen's own that is offered now (``check_action`` let it through)."""
    screen = app.screen
    return {key for key, active in screen.active_bindings.items() if active.node is screen and active.enabled}


async def open_offline(pilot, app) -> ModelsScreen:
    await pilot.press("m")
    await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
    await wait_for(pilot, lambda: "not reachable" in region_text(app, message_box(app)))
    return app.screen


def test_offline_error_is_a_short_message_with_its_advice_in_view_and_the_detail_below(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_offline(pilot, app)
            shown = flat(region_text(app, message_box(app)))
            for line in (
                f"ModelScope is not reachable at {OFFLINE}: the connection was refused.",
                "• Check the network, or set HTTPS_PROXY if this box needs a proxy.",
                f"• MODELSCOPE_ENDPOINT is set to {OFFLINE}: check it, or unset it for https://modelscope.cn.",
                "• Offline: 2 opens the Local tab, with the models on disk and the bundled ones "
                "(tiny trains without a download).",
                "• h tries Hugging Face; F5 asks again.",
            ):
                assert line in shown, (line, shown)
            assert "Pool" not in status_line(app) and "Max retries" not in shown.split("Detail")[0]
            assert footer_keys(app)[:3] == ["?", "2", "F5"]  # the ways on, first
            assert screen.focused is message_box(app)
            # the message box lays out again once it knows its text overflows (a scrollbar takes a column,
            # the text re-wraps): a fresh-clone CI took the snapshot in between
            await assert_snapshot(pilot, app, "models_offline_80x24")
            # The raw text is there for whoever wants it: the message scrolls to it.
            await pilot.press("end")
            await wait_for(pilot, lambda: "Connection refused" in flat(region_text(app, message_box(app))))
            assert "HTTPConnectionPool" in screen.query_one("#models-message-text").render().plain

    run(scenario())


def test_an_empty_result_says_no_models_match_with_a_hint(hub_env):  # noqa: F811
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("s", *"zzz", "enter")
            await wait_for(pilot, lambda: screen.message_kind == "empty")
            shown = flat(region_text(app, message_box(app)))
            assert "No models match 'zzz' on ModelScope." in shown
            assert "• Filters in force: task text-generation; o, k and z change them." in shown
            assert "• Try other or fewer words (s), or h for Hugging Face." in shown
            assert not results(app).display and "d" not in offered(app)
            await assert_snapshot(pilot, app, "models_empty_80x24")
            await pilot.press("s", *["backspace"] * 3, "enter")  # the text cleared: the models come back
            await wait_for(pilot, lambda: results(app).display and results(app).row_count == 4)
            assert screen.message_kind is None

    run(scenario())


def test_the_local_tab_lists_the_bundled_models_and_p_hands_one_to_the_wizard(private_home):
    names = [model.name for model in bundled_models()]

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_offline(pilot, app)
            await pilot.press("2")
            local = screen.query_one("#local-models")
            await wait_for(pilot, lambda: local.row_count == BUNDLED)
            await wait_for(pilot, lambda: "built-in" in region_text(app, local))
            text = screen_text(app)
            assert "No models on disk yet." in text and "Bundled, no download: tiny trains offline" in text
            rows = [local.get_row_at(i) for i in range(local.row_count)]
            assert [row[0] for row in rows] == names and names[0] == "tiny"
            assert rows[0][1] == "built-in" and {row[1] for row in rows[1:]} == {"bundled"}  # (its use says "config only")
            assert "x" not in offered(app) and "p" in offered(app)  # a bundled model is not deleted
            await pilot.press("p")
            await wait_for(pilot, lambda: app.current_mode == "wizard")
            assert app.wizard_model == "tiny"
            wizard = app.screen
            assert wizard.query_one("#model-input").value == "tiny"
            await pilot.press("enter")  # the wizard takes it, with no hub
            await wait_for(pilot, lambda: wizard.step == 1)
            # A bundled config too: planned offline. Letters are text on the data step: Esc goes back a step, and
            # from the first step back to where p came from.
            await pilot.press("escape", "escape")
            await wait_for(pilot, lambda: app.screen is screen)
            await pilot.press(*["down"] * names.index("Qwen2.5-7B"), "p")
            await wait_for(pilot, lambda: app.current_mode == "wizard" and app.wizard_model == "Qwen2.5-7B")
            assert wizard.query_one("#model-input").value == "Qwen2.5-7B"
            await pilot.press("enter")
            await wait_for(pilot, lambda: wizard.step == 1)
            assert wizard.base.architecture.num_layers == 28  # from the bundled config

    run(scenario())


def test_keys_are_offered_by_tab_and_state_in_footer_and_palette(hub_env):  # noqa: F811
    def titles(app):
        return {command.title for command in app.get_system_commands(app.screen)}

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            keys = offered(app)
            assert {"s", "h", "o", "k", "z", "b", "2", "f5"} <= keys
            assert not keys & {"d", "f", "p", "x", "c", "1"}  # no model open, no download, not on Local
            assert t("modelsscreen.key.search") in titles(app)
            assert t("modelsscreen.key.download") not in titles(app)
            assert footer_keys(app)[:3] == ["?", "s", "h"]
            await pilot.press("2")
            await wait_for(pilot, lambda: screen.query_one("#local-models").row_count == BUNDLED)
            keys = offered(app)
            assert {"1", "p", "f5"} <= keys
            assert not keys & {"s", "h", "d", "f", "o", "k", "z", "b", "2", "x"}
            assert not {t("modelsscreen.key.search"), t("modelsscreen.key.hub"),
                        t("modelsscreen.key.download")} & titles(app)
            await pilot.press("s", "h")  # not offered on the Local tab: nothing happens
            assert screen.tab == "local" and screen.hub == "modelscope"
            assert app.focused is screen.query_one("#local-models")
            await pilot.press("1", "enter")  # back, and open the first model
            await wait_for(pilot, lambda: screen.details is not None)
            assert {"d", "f", "p", "s", "h"} <= offered(app)
            assert footer_keys(app)[:5] == ["?", "s", "h", "d", "p"]
            assert t("modelsscreen.key.download") in titles(app)

    run(scenario())


def test_filter_keys_do_not_ask_an_unreachable_hub_again_until_f5(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_offline(pilot, app)
            await wait_for(pilot, lambda: not screen.searching)
            asked = screen.queries_sent
            await pilot.press("b", "z", "o", "k")
            await wait_for(pilot, lambda: "Not asked again: ModelScope was out of reach"
                           in flat(region_text(app, message_box(app))))
            assert screen.queries_sent == asked  # four filter keys, no new request
            line = status_line(app)
            assert "org Qwen" in line and "task any" in line and "size small" in line and "sort likes" in line
            assert "not reachable" in flat(region_text(app, message_box(app)))  # the advice stays
            await pilot.press("f5")  # asked for: asked
            await wait_for(pilot, lambda: screen.queries_sent == asked + 1 and not screen.searching)
            await wait_for(pilot, lambda: "not reachable" in region_text(app, message_box(app)))
            assert "Not asked again" not in flat(region_text(app, message_box(app)))

    run(scenario())


def test_a_burst_of_filter_keys_searches_once(hub_env):  # noqa: F811
    def list_requests():
        return sum(1 for _, path, _ in hub_env.hub.requests if path == "/openapi/v1/models")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            asked, requests = screen.queries_sent, list_requests()
            await pilot.press("b", "b", "b", "z")  # likes, recent, downloads again; then small
            await wait_for(pilot, lambda: screen._search_timer is None and not screen.searching
                           and results(app).row_count == 1)
            assert screen.query_state.sort == "downloads" and screen.query_state.size_class == "small"
            # One search for the burst (two if the box stalled between keys), never one per key.
            assert 1 <= screen.queries_sent - asked <= 2
            assert list_requests() - requests == screen.queries_sent - asked

    run(scenario())


def test_a_slow_hub_never_blocks_the_screen(hub_env):  # noqa: F811
    async def scenario():
        hub_env.hub.slow_s = 5.0  # every answer waits: the search is in flight meanwhile
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
            screen = app.screen
            await wait_for(pilot, lambda: "Searching ModelScope" in status_line(app))
            await pilot.press("2")
            await wait_for(pilot, lambda: screen.query_one("#local-models").row_count == BUNDLED)
            assert screen.searching  # the Local tab came while the hub had not answered
            await pilot.press("1")
            await wait_for(pilot, lambda: results(app).row_count == 4)

    run(scenario())


def test_the_local_tab_at_80_columns_fits_its_notes_says_what_it_lists_and_enter_shows_facts(private_home):
    """Offline, 80×24, no model on disk: the bundled rows only."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_offline(pilot, app)
            search = screen.query_one("#models-search")
            assert t("modelsscreen.search_placeholder") in region_text(app, search)  # not cut at 80 columns
            assert "ModelScope" in status_line(app)
            await pilot.press("2")
            local = screen.query_one("#local-models")
            await wait_for(pilot, lambda: local.row_count == BUNDLED)
            await pilot.pause()
            # The status line says what the Local tab lists, not the hub's filters.
            assert "Local" in status_line(app) and "ModelScope" not in status_line(app)
            assert "org" not in status_line(app)
            # The last column fits the screen: a cut note ends with an ellipsis, never mid-word.
            assert local.virtual_size.width <= local.size.width
            notes = {t("modelsscreen.bundled_note.builtin"), t("modelsscreen.bundled_note.config")}
            shown = [str(local.get_row_at(i)[-1]) for i in range(local.row_count)]
            assert all(cell in notes or (cell.endswith("…") and any(n.startswith(cell[:-1]) for n in notes))
                       for cell in shown)
            assert "Path or use" in region_text(app, local)
            # Sizes by value (as text, 14B came before 3B).
            names = [str(local.get_row_at(i)[0]) for i in range(local.row_count)]
            assert names.index("Qwen2.5-0.5B") < names.index("Qwen2.5-3B") < names.index("Qwen2.5-7B") \
                < names.index("Qwen2.5-14B") < names.index("Qwen2.5-72B")
            # Enter (listed as Select) shows the highlighted model's facts, read from its config.json.
            details = screen.query_one("#local-details")
            assert not details.display
            await pilot.press("enter")
            await wait_for(pilot, lambda: "4 layers" in flat(region_text(app, details)), timeout=30)
            assert "tiny" in region_text(app, details)
            await pilot.press(*["down"] * names.index("Qwen2.5-7B"), "enter")
            await wait_for(pilot, lambda: "28 layers" in flat(region_text(app, details)), timeout=30)
            await pilot.press("1")
            assert "ModelScope" in status_line(app) and "Local" not in status_line(app)

    run(scenario())
