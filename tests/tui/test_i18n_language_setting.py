"""Choosing the interface language from the palette: saved in the settings, announced for the next start,
and honoured by ``tunedeck`` (its entry point, tui.main, has core.cli set the language before tui.app is
imported)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from core.paths import settings_path
from core.settings import load_settings
from tests.tui.conftest import fake_monitor, palette_search, quiet_settings, wait_for
from tui.app import make_app
from tui.screens.gpus import GpuScreen

ROOT = Path(__file__).resolve().parents[2]


def test_palette_language_entry_saves_the_setting(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            titles = {command.title for command in app.get_system_commands(app.screen)}
            assert {"Language: English", "Language: 中文"} <= titles
            await palette_search(pilot, app, "language: 中文", "Language: 中文")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.settings.language == "zh")
            await wait_for(pilot, lambda: settings_path().exists() and load_settings().language == "zh")
            # a notification reaches the app as a message of its own: wait for it
            await wait_for(pilot, lambda: any("next time tunedeck starts" in str(n.message)
                                              for n in app._notifications))

    asyncio.run(scenario())
    assert load_settings().language == "zh"


def test_a_setting_that_cannot_be_saved_says_the_file_and_what_to_do(private_home):
    """A settings file that cannot be written (a read-only config folder; here the file's name taken by a
    folder, which root cannot write over either) read "Could not save settings: [Errno 21] Is a directory:
    'settings.json.tmp…'": the temporary file's name and no way on. It names the settings file as the CLI names
    a write it cannot make, and the remedy; the app goes on in the language chosen."""
    settings_path().mkdir(parents=True)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            await palette_search(pilot, app, "language: 中文", "Language: 中文")
            await pilot.press("enter")
            await wait_for(pilot, lambda: any("Could not save settings" in str(n.message)
                                              for n in app._notifications))
            said = next(str(n.message) for n in app._notifications if "Could not save settings" in str(n.message))
            assert f"cannot write {settings_path()}" in said and "try again" in said, said
            # a folder is in the file's place: moving it is the way on, not free space or write rights
            assert "a folder is there" in said and "free space" not in said and "writable" not in said, said
            assert app.settings.language == "zh"

    asyncio.run(scenario())


def test_saved_language_is_applied_before_the_tui_is_imported(tmp_path):
    """What ``tunedeck`` with no command does: tui.main runs core.cli, which reads the settings and sets the
    language, and only then imports tui.app, whose bindings come out in Chinese. Checked in a fresh interpreter, as a user would start it."""
    home = tmp_path / "home"
    env = {**os.environ, "TUNEDECK_HOME": str(home), "LANG": "en_US.UTF-8", "LC_ALL": ""}
    probe = (
        "import sys, types, tui.main as entry\n"
        "fake = types.ModuleType('tui.app')\n"
        "def run_app(settings, open_run=None):\n"
        "    import importlib.util, sys as s\n"
        "    del s.modules['tui.app']\n"
        "    import tui.app as real\n"
        "    print('|'.join(b.description for b in real.TunedeckApp.BINDINGS))\n"
        "    return 0\n"
        "fake.run_app = run_app\n"
        "sys.modules['tui.app'] = fake\n"
        "import core.cli\n"
        "core.cli._on_a_terminal = lambda: True\n"  # as from a terminal: the probe's output is piped
        "sys.exit(entry.main([]))\n"
    )
    env_settings = subprocess.run(
        [sys.executable, "-c", "from core.paths import settings_path; print(settings_path())"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()
    settings = Path(env_settings)
    settings.parent.mkdir(parents=True, exist_ok=True)
    for language, expected in (("zh", "退出"), ("en", "Quit"), ("", "Quit")):
        settings.write_text(json.dumps({"language": language}), encoding="utf-8")
        done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout.split("|"), (language, done.stdout)
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "LANG": "zh_CN.UTF-8"},
                          capture_output=True, text=True, timeout=120)
    assert "退出" in done.stdout.split("|"), done.stdout  # "" = from the locale
