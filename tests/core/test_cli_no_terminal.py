"""``tunedeck`` with no command where there is no terminal (a pipe, cron, CI) prints its usage and exits 2
instead of opening the full-screen app, which would paint escape codes into the pipe and wait forever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_command_without_a_terminal_prints_usage_and_exits_2(tmp_path):
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "LANG": "C"}
    # The real entry point (tui.main), stdin from /dev/null and stdout a pipe, as `tunedeck </dev/null >o`.
    done = subprocess.run([sys.executable, "-c", "import sys, tui.main; sys.exit(tui.main.main([]))"],
                          cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # no escape codes
    assert done.stderr.startswith("usage: tunedeck")
    assert "the full-screen app needs a terminal" in done.stderr and "tunedeck --help" in done.stderr


def test_the_app_still_opens_on_a_terminal(monkeypatch):
    from core.cli import OpenApp, dispatch

    monkeypatch.setenv("TUNEDECK_HOME", "/nonexistent-tunedeck-home")
    monkeypatch.setattr("core.cli._on_a_terminal", lambda: True)
    assert isinstance(dispatch([]), OpenApp)


def _entry_point_without_a_terminal(args, home):
    """``tunedeck ARGS`` through the real entry point (tui.main), stdin and stdout both pipes."""
    env = {**os.environ, "TUNEDECK_HOME": str(home), "LANG": "C"}
    return subprocess.run([sys.executable, "-c", "import sys, tui.main; sys.exit(tui.main.main(sys.argv[1:]))", *args],
                          cwd=ROOT, env=env, stdin=subprocess.PIPE, capture_output=True, text=True, timeout=120)


def test_demo_without_a_terminal_names_headless_and_starts_nothing(tmp_path):
    done = _entry_point_without_a_terminal(["demo"], tmp_path / "home")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""  # no escape codes
    assert done.stderr.startswith("tunedeck: the demo's dashboard needs a terminal")
    assert "tunedeck demo --headless" in done.stderr and "tunedeck demo --detach" in done.stderr
    runs = tmp_path / "home" / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []  # refused before a run was started for the app


def test_watch_without_a_terminal_names_json(tmp_path):
    source = ROOT / "tests" / "fixtures" / "watch" / "llamafactory_output"
    done = _entry_point_without_a_terminal(["watch", str(source)], tmp_path / "home")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("tunedeck: the dashboard needs a terminal")
    assert f"tunedeck watch {source} --json" in done.stderr


def test_watch_still_opens_the_app_on_a_terminal(monkeypatch, tmp_path):
    from core.cli import OpenApp, dispatch

    source = ROOT / "tests" / "fixtures" / "watch" / "llamafactory_output"
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("core.cli._on_a_terminal", lambda: True)
    outcome = dispatch(["watch", str(source)])
    assert isinstance(outcome, OpenApp) and outcome.open_run == str(source)
