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


def _python_m_core_on_a_terminal(args, home):
    """``python -m core ARGS`` with standard input and output a terminal (a pty): what the user typed.
    Returns (exit code, stderr, what reached the terminal)."""
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "TUNEDECK_HOME": str(home), "LANG": "C", "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=env, stdin=slave, stdout=slave,
                              stderr=subprocess.PIPE, text=True, timeout=120)
        os.close(slave)
        slave = -1
        shown = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    return done.returncode, done.stderr, shown


def test_python_m_core_demo_on_a_terminal_says_it_has_no_app_before_starting_anything(tmp_path):
    """``python -m core demo`` started a detached run and only then said the app needs the ``tunedeck``
    command, leaving a run nobody watches. It now refuses first, naming the ways that work there."""
    home = tmp_path / "home"
    runs = home / "runs"
    try:
        code, stderr, shown = _python_m_core_on_a_terminal(["demo"], home)
        assert code == 2, stderr
        assert stderr.startswith("tunedeck: the full-screen app opens through the 'tunedeck' command"), stderr
        assert "nothing was started" in stderr and "python -m core demo --headless" in stderr
        assert "python -m core demo --detach" in stderr and "started run" not in stderr
        assert shown == b""
        assert not runs.exists() or list(runs.iterdir()) == []
    finally:  # should one have been started after all: it does not outlive the test
        for run in runs.iterdir() if runs.exists() else ():
            subprocess.run([sys.executable, "-m", "core", "stop", run.name, "--force"], cwd=ROOT, timeout=120,
                           env={**os.environ, "TUNEDECK_HOME": str(home), "PYTHONPATH": str(ROOT)},
                           capture_output=True)


def test_python_m_core_watch_on_a_terminal_names_json(tmp_path):
    source = ROOT / "tests" / "fixtures" / "watch" / "llamafactory_output"
    code, stderr, _shown = _python_m_core_on_a_terminal(["watch", str(source)], tmp_path / "home")
    assert code == 2, stderr
    assert stderr.startswith("tunedeck: the full-screen app opens through the 'tunedeck' command"), stderr
    assert f"python -m core watch {source} --json" in stderr


def test_python_m_core_demo_headless_and_detach_still_start_on_a_terminal(monkeypatch, tmp_path):
    """The refusal is for the dashboard only: ``--detach`` and ``--headless`` start the run as before under
    ``python -m core`` (``core.cli.main``), on a terminal too (the run itself is stood in for)."""
    import core.runs.commands as run_commands
    from core.cli import main

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("core.cli._on_a_terminal", lambda: True)
    started: list[tuple[str, list[str]]] = []

    def start_run(config, argv=(), command="train", warn=None, **kwargs):
        started.append(("detached", list(argv)))
        return SimpleRun()

    def prepare_run(config, argv, command="train", warn=None, **kwargs):
        started.append(("headless", list(argv)))
        return SimpleRun()

    class SimpleRun:
        id = "20261205-0000-tiny-demo"
        path = tmp_path / "home" / "runs" / id

        def status(self):
            return type("Status", (), {"status": "queued"})()

    monkeypatch.setattr("core.runs.lifecycle.start_run", start_run)
    monkeypatch.setattr("core.runs.lifecycle.prepare_run", prepare_run)
    monkeypatch.setattr(run_commands, "_run_headless", lambda run, as_json: 0)
    assert main(["demo", "--detach", "--json"]) == 0
    assert main(["demo", "--headless"]) == 0
    assert started == [("detached", ["tunedeck", "demo", "--detach"]), ("headless", ["tunedeck", "demo", "--headless"])]
    assert main(["demo"]) == 2 and len(started) == 2  # the dashboard: refused, nothing more started
