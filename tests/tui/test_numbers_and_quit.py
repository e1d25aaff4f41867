"""The same run reads the same in the CLI and the app (core.units), and quitting with a live run says so."""

from __future__ import annotations

import asyncio

import pytest

from core.cli import dispatch
from core.i18n import set_language
from core.paths import runs_dir
from core.runs.listing import summarize
from core.runs.run_dir import RunDirectory
from core.units import format_duration, format_rate
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tui import main as entry
from tui.app import make_app
from tui.screens.runs import RunsScreen

LIVE = "20261129-2300-live"


@pytest.fixture(autouse=True)
def english():
    set_language("en")
    yield
    set_language("en")


def test_cli_runs_status_and_the_app_show_the_same_numbers(capsys):
    path = build_run(runs_dir(), LIVE, status="running", steps=120, created="2026-11-29T23:00:00Z")
    with SupervisorStandIn(path):
        summary = summarize(RunDirectory(path))
        tps, eta = format_rate(summary.steady_tokens_per_s), format_duration(summary.eta_s)
        assert "," in tps and eta == "12:00"  # 12,4xx tok/s; 480 steps × 1.5 s left

        assert dispatch(["runs"]) == 0
        listing = capsys.readouterr().out
        assert dispatch(["status", LIVE]) == 0
        status = capsys.readouterr().out
        for text in (listing, status):
            assert tps in text and eta in text, text
            assert "0m" not in text and "12h" not in text

        async def scenario():
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
            async with app.run_test(size=(160, 50)) as pilot:
                await pilot.press("r")
                await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.listed)
                await pilot.pause()
                text = screen_text(app)
                assert tps in text and eta in text, text
                assert "1 run, 1 active" in text  # not "1 runs"

        asyncio.run(scenario())


def _quit_at_once(monkeypatch):
    import tui.app

    opened = []
    monkeypatch.setattr(tui.app, "run_app", lambda settings=None, open_run=None: opened.append(open_run) or 0)
    monkeypatch.setattr("core.cli._on_a_terminal", lambda: True)  # as from a terminal (pytest pipes stdout)
    return opened


def test_quitting_with_a_live_run_names_it_on_the_terminal(monkeypatch, capsys):
    opened = _quit_at_once(monkeypatch)
    path = build_run(runs_dir(), LIVE, status="running", steps=120)
    build_run(runs_dir(), "20261129-2200-done", status="finished", steps=600)
    with SupervisorStandIn(path):
        assert entry.main([]) == 0
    assert opened == [None]
    err = capsys.readouterr().err
    assert f"1 run still training ({LIVE}) — re-attach with `tunedeck`" in err
    assert "done" not in err


def test_quitting_with_two_live_runs_in_chinese(monkeypatch, capsys):
    _quit_at_once(monkeypatch)
    first = build_run(runs_dir(), "20261129-2300-one", status="running", steps=10)
    second = build_run(runs_dir(), "20261129-2301-two", status="running", steps=10)
    with SupervisorStandIn(first), SupervisorStandIn(second):
        assert entry.main(["--lang", "zh"]) == 0
    err = capsys.readouterr().err
    assert "2 个任务仍在训练" in err and "20261129-2300-one" in err and "20261129-2301-two" in err


def test_quitting_with_nothing_live_prints_nothing(monkeypatch, capsys):
    _quit_at_once(monkeypatch)
    build_run(runs_dir(), "20261129-2200-done", status="finished", steps=600)
    build_run(runs_dir(), "20261129-2100-dead", status="running", steps=80)  # no supervisor: crashed
    assert entry.main([]) == 0
    assert capsys.readouterr().err == ""
