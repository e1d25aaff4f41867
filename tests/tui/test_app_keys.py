"""Every app-level key, with keys only: sections, help, palette, theme, quit."""

from __future__ import annotations

import asyncio
import json
import re

from core.settings import load_settings
from tests.tui.conftest import fake_monitor, palette_search, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.gpus import GpuScreen
from tui.screens.help import HelpScreen
from tui.screens.models import ModelsScreen
from tui.screens.runs import RunsScreen
from tui.widgets.keys_footer import KeysFooter


def run(coro):
    return asyncio.run(coro)


def test_section_keys_switch_modes():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            seen = {}
            for key in ("m", "w", "escape", "r", "g"):  # the wizard's first step takes letters as text: Esc leaves
                await pilot.press(key)
                await pilot.pause()
                seen[key] = (app.current_mode, type(app.screen))
            assert seen["m"] == ("models", ModelsScreen)
            assert seen["w"][0] == "wizard"
            assert seen["escape"] == ("models", ModelsScreen)  # back to where the wizard was opened from
            assert seen["r"] == ("runs", RunsScreen)
            assert seen["g"] == ("gpus", GpuScreen)

    run(scenario())


def test_help_lists_screen_and_app_keys_and_closes():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(100, 50)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            for open_key in ("question_mark", "f1"):
                await pilot.press(open_key)
                await pilot.pause()
                assert isinstance(app.screen, HelpScreen)
                text = screen_text(app)
                # generated from the bindings: the GPU screen's own keys and the app's
                for expected in ("Compact", "Processes", "Slower", "GPUs", "Models", "Wizard", "Runs", "Quit",
                                 "Theme", "Commands", "Ctrl+P"):
                    assert expected in text, expected
                await pilot.press("escape")
                await pilot.pause()
                assert isinstance(app.screen, GpuScreen)

    run(scenario())


def test_palette_lists_every_action():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            titles = {command.title for command in app.get_system_commands(app.screen)}
            descriptions = {a.binding.description for a in app.screen.active_bindings.values()
                            if a.binding.id and a.node in (app, app.screen)}
            assert {"Go to GPUs", "Go to Models", "Go to Wizard", "Go to Runs", "Help", "Quit",
                    "Theme: Dark", "Theme: Light", "Theme: High contrast"} <= titles
            # every screen binding is reachable by name too
            assert {"Compact", "Processes", "Slower", "Faster"} <= titles
            assert descriptions - {"GPUs", "Models", "Wizard", "Runs", "Help", "Theme", "Quit"} <= titles
            await palette_search(pilot, app, "go to runs", "Go to Runs")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.current_mode == "runs")

    run(scenario())


def test_the_apps_palette_entries_name_their_keys_where_those_keys_work():
    """The screen's entries said "Key: c"; the app's (Go to GPUs, Help, Quit, Next theme) named no key, so
    the palette never taught g, ?, q or t. Where letters are text (the wizard's model step) only the keys
    that still work are named."""

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            helps = {command.title: command.help for command in app.get_system_commands(app.screen)}
            assert helps["Go to GPUs"].endswith("Key: g") and helps["Go to Runs"].endswith("Key: r"), helps
            assert helps["Help"].endswith("Key: ? / F1") and helps["Next theme"].endswith("Key: t"), helps
            assert helps["Quit"].endswith("Key: Ctrl+Q / q"), helps
            await pilot.press("w")
            await wait_for(pilot, lambda: app.current_mode == "wizard")
            helps = {command.title: command.help for command in app.get_system_commands(app.screen)}
            assert "Key:" not in helps["Go to GPUs"] and "Key:" not in helps["Next theme"], helps
            assert helps["Help"].endswith("Key: F1") and helps["Quit"].endswith("Key: Ctrl+Q"), helps

    run(scenario())


def test_help_and_footer_name_keys_in_one_style_and_only_keys_that_survive_ssh():
    """Help rows and footer keys on every section: Esc, Tab, Shift+Tab, F1, Ctrl+P, PgUp, Enter, never
    Textual's lower-case 'esc', 'tab', 'f1', '^p', '⏎', nor 'super+c' (the Cmd key: SSH never sends it)."""

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            seen: set[str] = set()
            for section_key, mode in (("m", "models"), ("w", "wizard"), ("r", "runs"), ("g", "gpus")):
                if app.current_mode == "wizard":  # its first step takes letters as text
                    await pilot.press("escape")
                    await wait_for(pilot, lambda: app.current_mode != "wizard")
                await pilot.press(section_key)
                await wait_for(pilot, lambda mode=mode: app.current_mode == mode)
                await wait_for(pilot, lambda: bool(app.screen.query_one(KeysFooter).shown()))
                footer = app.screen.query_one(KeysFooter)
                rows = [key for _, section in app.key_table(app.screen) for key, _ in section]
                keys = [name for row in rows for name in row.split(" / ")]
                keys += [key for key, _ in footer.shown()]
                seen.update(keys)
                for name in keys:
                    assert "super" not in name.lower() and "^" not in name and "⏎" not in name, name
                    # a named key is capitalised (Esc, Tab, PgUp, F7, Ctrl+Home); a typed one is as typed
                    if len(name) > 1 and name not in ("↑", "↓", "←", "→"):
                        assert re.fullmatch(r"((Ctrl|Shift|Alt)\+)*([A-Z][A-Za-z0-9]*|F\d+|[a-zA-Z0-9])", name), name
            # the copy entry stays, with its SSH-safe key only; the other keys named as keyboards print them
            assert {"Ctrl+C", "Ctrl+P", "Ctrl+Q", "Esc", "Tab", "Shift+Tab", "F1", "PgUp", "PgDn", "Enter"} <= seen
            copy_rows = [key for _, section in app.key_table(app.screen) for key, text in section
                         if "copy" in text.lower()]
            assert copy_rows == ["Ctrl+C"]

    run(scenario())


def test_help_in_a_text_field_names_the_field_and_offers_no_alt_key(private_home):
    """Help with the Models search field focused listed its keys under "In the focused list or table", and
    "Ctrl+Backspace / Alt+Backspace": Alt reaches the box over SSH only where the terminal sends Option as Meta.
    Its keys are "In the text field" now, with the Ctrl twins only. CPU box (fake)."""

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
            await pilot.press("s")
            await wait_for(pilot, lambda: type(app.screen.focused).__name__ == "Input")
            table = dict(app.key_table(app.screen))
            assert "field" in table and "widget" not in table
            keys = [name for rows in table.values() for key, _ in rows for name in key.split(" / ")]
            assert "Ctrl+Backspace" in keys and not [name for name in keys if "Alt" in name], keys
            await pilot.press("f1")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
            await wait_for(pilot, lambda: "In the text field" in screen_text(app))

    run(scenario())


def test_theme_key_cycles_and_is_remembered(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            assert app.theme == "tunedeck-dark"
            await pilot.press("t")
            await pilot.pause()
            assert app.theme == "tunedeck-light"
            settings_file = private_home / "settings.json"
            await wait_for(pilot, lambda: settings_file.exists()
                           and json.loads(settings_file.read_text())["theme"] == "tunedeck-light")
            assert settings_file.stat().st_mode & 0o777 == 0o600
        # a new app starts with the remembered theme
        again = make_app(load_settings(), monitor=fake_monitor("h200x1"))
        async with again.run_test(size=(80, 24)) as pilot:
            assert again.theme == "tunedeck-light"
            await pilot.press("t")
            await pilot.pause()
            assert again.theme == "tunedeck-high-contrast"

    run(scenario())


def test_quit_key_exits():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            await pilot.press("q")
            await pilot.pause()
        assert app.return_code == 0
        assert not app.is_running

    run(scenario())


def test_ctrl_c_says_how_to_quit_in_the_apps_key_style(private_home):
    """Ctrl+C, the reflex of a user who wants out: Textual's own note said "Press ctrl+q to quit the app" (in
    English under zh too: tests/tui/i18n_zh_scenarios.py). It names q and Ctrl+Q as help and footer do, Ctrl+Q
    alone where letters are text (the wizard's model field), and that training runs go on."""

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            await pilot.press("ctrl+c")
            await wait_for(pilot, lambda: app._notifications)
            [note] = list(app._notifications)
            assert (note.title, str(note.message)) == (
                "Quit?", "Ctrl+C does not quit tunedeck: q / Ctrl+Q quits (training runs go on)")
            await pilot.press("w")
            await wait_for(pilot, lambda: app.current_mode == "wizard" and app.focused is not None)
            app.clear_notifications()
            await pilot.press("ctrl+c")
            await wait_for(pilot, lambda: app._notifications)
            assert [str(n.message) for n in app._notifications] == [
                "Ctrl+C does not quit tunedeck: Ctrl+Q quits (training runs go on)"]
            assert app.is_running

    run(scenario())


def test_no_color_still_renders(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: getattr(app.screen, "snapshot", None) is not None)
            await pilot.pause()
            assert app.no_color
            text = screen_text(app)
            assert "0 · NVIDIA H200" in text and "1 · NVIDIA H200" in text, text

    run(scenario())


def palette_vs_keys(app) -> list[str]:
    """What is wrong between the palette and the keys of the screen as it stands: an enabled screen action
    with no palette entry, an entry for an action the screen refuses now, an entry naming a key that does not
    work now (a letter where letters are text; not the keys the footer and the help give)."""
    screen = app.screen
    commands = {command.title: command.help for command in app.get_system_commands(screen)}
    working = {name for _, rows in app.key_table(screen) for keys, _ in rows for name in keys.split(" / ")}
    problems = []
    for key, active in screen.active_bindings.items():
        binding = active.binding
        if active.node is not screen or not (binding.show or binding.id):
            continue
        title = binding.description
        if binding.id and hasattr(screen, "footer_label"):
            title = screen.footer_label(binding.id, title) or title
        if active.enabled and title not in commands:
            problems.append(f"{key}: {title!r} has no palette entry")
        if not active.enabled and title in commands:
            problems.append(f"{key}: {title!r} is in the palette but does nothing now")
    for title, text in commands.items():
        named = text.rpartition("Key: ")[2] if "Key: " in text else ""
        for name in filter(None, named.split(" / ")):
            if name not in working:
                problems.append(f"{title!r} names {name!r}, a key that does not work here now")
    return problems


def test_every_sections_palette_matches_its_working_keys_at_80x24(private_home):
    """Each section, the wizard's steps and its plan: every action the screen offers now is in the palette,
    none it refuses, and each entry names only keys that work now. The wizard's model step takes letters as
    text: its "Edit model" entry said "Key: e" (e typed an e into the model id; F7 is the key there), and on
    the plan the palette offered "Edit field" and "Next", which the screen refuses there (choosing them did
    nothing). CPU box (fake)."""

    async def scenario():
        from tests.tui.test_wizard_flow import to_result

        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            for key, mode in (("m", "models"), ("r", "runs"), ("g", "gpus"), ("w", "wizard")):
                await pilot.press(key)
                await wait_for(pilot, lambda mode=mode: app.current_mode == mode)
                await pilot.pause()
                assert palette_vs_keys(app) == [], mode
            helps = {command.title: command.help for command in app.get_system_commands(app.screen)}
            assert helps["Edit model"] == "Key: F7", helps  # letters are text on the model step
            w = await to_result(pilot, app)
            await pilot.pause()
            assert palette_vs_keys(app) == []
            titles = {command.title for command in app.get_system_commands(w)}
            assert "Edit field" not in titles and "Next" not in titles, titles
            assert {"Save YAML", "Launch"} <= titles

    run(scenario())


def test_help_lists_only_the_keys_that_act_now(private_home):
    """On the wizard's plan the help listed "PgDn Next" and "e / F7 Edit field": the screen refuses both there
    (the plan is the last step, its fields are the overrides, o), so pressing them did nothing. The help
    leaves them out now, as the footer does; the plan's own keys stay. CPU box (fake)."""

    async def scenario():
        from tests.tui.test_wizard_flow import to_result

        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            rows = {text: keys for _, section in app.key_table(w) for keys, text in section}
            assert "Next" not in rows and "Edit field" not in rows, rows
            assert rows["Back"] == "PgUp" and rows["Save YAML"] == "s / F2", rows
            await pilot.press("f1")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
            text = " ".join(screen_text(app).split())
            assert "PgUp Back" in text and "PgDn Next" not in text and "Edit field" not in text, text

    run(scenario())
