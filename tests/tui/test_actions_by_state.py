"""Issue #18 items 4 and 7, keys only at 80×24: actions offered by state (stop only on a live run,
evaluate/export only on a finished one, panel hints that follow their state, a finished run's progress at
100%), and ``r`` always the Runs list, its sort coming back to Started, Enter never a yes in the delete
dialog, stop and resume from the list.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from core.i18n import t
from core.paths import runs_dir
from core.runs import RunDirectory
from core.runs.listing import summarize
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tests.tui.test_80x24_keys import footer_keys
from tests.tui.test_dashboard_render import FIXTURES, add_checkpoint, open_dashboard
from tests.tui.test_runs_screen import open_runs
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.screens.runs import RunsScreen
from tui.widgets.confirm import ConfirmScreen
from tui.widgets.keys_footer import KeysFooter, footer_entries
from tui.widgets.lifecycle_panels import MergePanel, ServePanel

SIZE = (80, 24)
ROOT = Path(__file__).parents[2]


def run(coro):
    return asyncio.run(coro)


def palette_titles(app) -> set[str]:
    return {command.title for command in app.get_system_commands(app.screen)}


def notes(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


# --- 4. actions that no longer apply are not offered ----------------------------------------------------
def test_stop_is_offered_only_on_a_live_run_and_evaluate_export_only_on_a_finished_one():
    live = build_run(runs_dir(), "20261129-2300-live", status="running", steps=120)
    done = build_run(runs_dir(), "20261129-2100-done", status="finished", steps=600)
    add_checkpoint(done, 600)

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(live))
            async with app.run_test(size=SIZE) as pilot:
                await open_dashboard(pilot, app, "running")
                await wait_for(pilot, lambda: "k" in footer_keys(app))
                assert t("dashboard.key.stop") in palette_titles(app)
                assert not {t("lifecycle.key.evaluate"), t("lifecycle.key.export")} & palette_titles(app)
                for key in ("E", "X"):
                    await pilot.press(key)
                    await pilot.pause()
                    assert isinstance(app.screen, DashboardScreen), key
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(done))
        async with app.run_test(size=SIZE) as pilot:
            await open_dashboard(pilot, app, "finished")
            await wait_for(pilot, lambda: footer_keys(app)[:4] == ["?", "M", "a", "v"])
            assert "k" not in footer_keys(app)
            titles = palette_titles(app)
            assert t("dashboard.key.stop") not in titles
            assert {t("lifecycle.key.evaluate"), t("lifecycle.key.export")} <= titles
            await pilot.press("k")  # not offered, and does nothing
            await pilot.pause()
            assert isinstance(app.screen, DashboardScreen)
            await pilot.press("question_mark")
            await pilot.pause()
            help_text = screen_text(app)
            assert t("lifecycle.key.evaluate") in help_text and t("dashboard.key.stop") not in help_text

    run(scenario())


def test_stop_is_not_offered_on_a_run_of_another_host():
    """A data root shared between nodes: a live run whose run.json names another host (node-b) cannot be
    stopped from this box (``tunedeck stop`` refuses: its pids are node-b's). The dashboard and the Runs list
    still offered k, whose press only showed that refusal. Now neither offers it (footer, help, palette), and
    a press does nothing. Box: the two H200s of h200x2.json (fake monitor); no process of the run here."""
    import json

    path = build_run(runs_dir(), "20261129-2100-remote", status="running", steps=40)
    record = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**record, "host": "node-b"}))

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await wait_for(pilot, lambda: "node-b" in screen_text(app).splitlines()[1])  # run.json read
            await pilot.pause()
            assert not any(keys & {"k"} for keys in offered(app).values()), offered(app)
            app.clear_notifications()
            await pilot.press("k")
            await pilot.pause()
            assert app.screen is screen and not notes(app)
            runs = await open_runs(pilot, app)
            await wait_for(pilot, lambda: runs.selected() is not None)
            assert runs.selected().host == "node-b" and runs.selected().status == "running"
            assert not runs.check_action("stop", ()) and "k" not in footer_keys(app)
            await pilot.press("k")
            await pilot.pause()
            assert app.screen is runs and not notes(app)

    run(scenario())


def test_resume_is_not_offered_on_a_stopped_run_of_another_host():
    """A data root shared between nodes: a run node-b stopped, with a checkpoint. The dashboard and the Runs
    list offered u, and its resume would train here on node-b's GPU numbers (``tunedeck resume`` now
    refuses it, saying to resume it on node-b). Now neither offers it (footer, help, palette) and a press
    does nothing; what runs here on its files (merge, chat …) stays offered. Box: the two H200s of
    h200x2.json (fake monitor); no process of the run here."""
    import json

    path = build_run(runs_dir(), "20261129-2100-remote", status="stopped", steps=40)
    add_checkpoint(path, 40)
    record = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**record, "host": "node-b"}))

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_dashboard(pilot, app, "stopped")
            # the run's status read: its checkpoint offers merge (the same read says whether resume is)
            await wait_for(pilot, lambda: "M" in offered(app)["footer"])
            assert not any(keys & {"u"} for keys in offered(app).values()), offered(app)
            app.clear_notifications()
            await pilot.press("u")
            await pilot.pause()
            assert app.screen is screen and not notes(app)
            runs = await open_runs(pilot, app)
            await wait_for(pilot, lambda: runs.selected() is not None)
            assert runs.selected().host == "node-b" and runs.selected().has_checkpoint
            assert not runs.check_action("resume", ()) and "u" not in footer_keys(app)
            await pilot.press("u")
            await pilot.pause()
            assert app.screen is runs and not notes(app)

    run(scenario())


RUN_KEYS = {"k": "dashboard.key.stop", "u": "dashboard.key.resume", "M": "lifecycle.key.merge",
            "a": "lifecycle.key.chat", "v": "lifecycle.key.serve", "E": "lifecycle.key.evaluate",
            "X": "lifecycle.key.export"}


def offered(app) -> dict[str, set[str]]:
    """The run's keys that the footer (every entry, not only those that fit 80 columns), the help (the
    rows ? shows) and the palette offer now, each found on its own."""
    footer = {key for key, _ in footer_entries(app.screen) if key in RUN_KEYS}
    rows = {row for _section, section_rows in app.key_table(app.screen) for row in section_rows}
    help_keys = {key for key, name in RUN_KEYS.items() if (key, t(name)) in rows}
    palette = {key for key, name in RUN_KEYS.items() if t(name) in palette_titles(app)}
    return {"footer": footer, "help": help_keys, "palette": palette}


def test_footer_help_and_palette_offer_the_same_run_keys_by_state():
    """One rule (the dashboard's check_action) for every key that acts on the run, and the footer, the
    help and the palette all follow it: on a running run stop only (Ctrl+P "merge" had found Merge while
    "eval" found nothing, and ? listed Resume); resume, merge, chat, serve, evaluate and export once the
    run ended with a checkpoint; nothing but stop-less browsing on one that ended with none. (Two H200s
    recorded; the runs are built on disk.)"""
    live = build_run(runs_dir(), "20261129-2300-live", status="running", steps=120)
    bare = build_run(runs_dir(), "20261129-2100-bare", status="stopped", steps=30)
    kept = build_run(runs_dir(), "20261129-2200-kept", status="stopped", steps=120)
    add_checkpoint(kept, 100)
    ended = {"u", "M", "a", "v", "E", "X"}

    async def look(path, status: str, pressed: str | None = None) -> dict[str, set[str]]:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=SIZE) as pilot:
            await open_dashboard(pilot, app, status)
            seen = offered(app)
            if pressed:  # a key not offered does nothing: no panel, no toast
                app.clear_notifications()
                for key in pressed:
                    await pilot.press(key)
                    await pilot.pause()
                    assert isinstance(app.screen, DashboardScreen) and not notes(app), key
            return seen

    with SupervisorStandIn(live):
        running = run(look(live, "running", pressed="uMavEX"))
    assert running == {"footer": {"k"}, "help": {"k"}, "palette": {"k"}}, running
    nothing = run(look(bare, "stopped", pressed="kuMavEX"))
    assert nothing == {"footer": set(), "help": set(), "palette": set()}, nothing
    resumable = run(look(kept, "stopped"))
    assert resumable == {"footer": ended, "help": ended, "palette": ended}, resumable


def test_a_read_only_source_offers_no_stop():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(FIXTURES / "swift_output"))
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.series.train_records > 0 and screen.status)
            assert "k" not in footer_keys(app) and t("dashboard.key.stop") not in palette_titles(app)
            assert not {t("lifecycle.key.evaluate"), t("lifecycle.key.export")} & palette_titles(app)
            await pilot.press("k")
            await pilot.pause()
            assert isinstance(app.screen, DashboardScreen)

    run(scenario())


def test_a_run_deleted_while_its_dashboard_is_open_says_so_and_offers_no_stop():
    """The run directory deleted under its dashboard read as "queued" (no status.json left), offered k, and
    k said the run "has not started yet; try again in a moment or use --force". Now: "directory deleted"."""
    import shutil

    live = build_run(runs_dir(), "20261129-2300-live", status="running", steps=120)

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(live))
            async with app.run_test(size=SIZE) as pilot:
                screen = await open_dashboard(pilot, app, "running")
                await wait_for(pilot, lambda: "k" in footer_keys(app))
                shutil.rmtree(live)
                await wait_for(pilot, lambda: screen.status == "gone")
                await pilot.pause()
                assert "k" not in footer_keys(app) and t("dashboard.key.stop") not in palette_titles(app)
                header = " ".join(screen_text(app).split())
                assert t("watch.state.gone") in header and "queued" not in header and "ETA" not in header

    run(scenario())


def test_an_outside_folder_says_quit_once_and_esc_still_quits():
    """``tunedeck watch DIR`` on another trainer's folder: Esc quits like q, and the footer says so once
    (q Quit), not as "Esc Quit" beside it; in the full view and the log search Esc is shown again, as what
    leaves them."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(FIXTURES / "swift_output"))
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.series.train_records > 0 and screen.status)
            assert screen.standalone
            shown = app.screen.query_one(KeysFooter).shown()
            assert ("q", t("app.key.quit")) in shown and "Esc" not in footer_keys(app)
            await pilot.press("f")
            await pilot.pause()
            assert ("Esc", t("dashboard.key.leave_full")) in app.screen.query_one(KeysFooter).shown()
            await pilot.press("escape")
            await pilot.pause()
            assert not screen.has_class("-full") and "Esc" not in footer_keys(app)
            await pilot.press("s")  # the log search: Esc closes it first, and the footer says so
            await wait_for(pilot, lambda: "Esc" in footer_keys(app))
            await pilot.press("escape")
            await wait_for(pilot, lambda: "Esc" not in footer_keys(app))
            assert app.is_running  # that Esc closed the search, not the app
            await pilot.press("escape")
            await pilot.pause()
        assert app.return_code == 0
        assert not app.is_running

    run(scenario())


def test_a_finished_run_short_of_max_steps_shows_its_last_step_as_done():
    """The epoch ended at step 50 of max_steps 54: 50/50 100% in the dashboard, the list and the CLI."""
    done = build_run(runs_dir(), "20261129-2100-short", status="finished", steps=50, total=54)
    live = build_run(runs_dir(), "20261129-2200-live", status="running", steps=50, total=54)
    with SupervisorStandIn(live):
        assert summarize(RunDirectory(done)).total_steps == 50
        assert summarize(RunDirectory(live)).total_steps == 54  # a live run still counts to max_steps
    status = subprocess.run([sys.executable, "-m", "core", "status", done.name], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert status.returncode == 0 and "50/50" in status.stdout + status.stderr, status

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(done))
        async with app.run_test(size=SIZE) as pilot:
            await open_dashboard(pilot, app, "finished")
            await wait_for(pilot, lambda: "step 50/50 100%" in screen_text(app))
            assert "step 50/54 93%" not in screen_text(app)  # (the log's own lines still say 50/54)
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.listed)
            await pilot.pause()
            assert "50/50 100%" in screen_text(app)

    run(scenario())


def test_a_finished_run_past_its_max_steps_shows_its_last_step_as_done_everywhere():
    """A run resumed with a max_steps below its step (resume refuses that now; runs made before remain)
    finished at step 60 of max_steps 40: the dashboard read 60/60 100%, the Runs screen 60/40 150% and
    status 60/40. All read 60/60 now."""
    done = build_run(runs_dir(), "20261129-2100-past", status="finished", steps=60, total=40)
    assert summarize(RunDirectory(done)).total_steps == 60
    status = subprocess.run([sys.executable, "-m", "core", "status", done.name], capture_output=True, text=True,
                            cwd=ROOT, timeout=60)
    assert status.returncode == 0 and "60/60" in status.stdout and "60/40" not in status.stdout, status

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(done))
        async with app.run_test(size=SIZE) as pilot:
            await open_dashboard(pilot, app, "finished")
            await wait_for(pilot, lambda: "step 60/60 100%" in screen_text(app))
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.listed)
            await pilot.pause()
            assert "60/60 100%" in screen_text(app) and "150%" not in screen_text(app)

    run(scenario())


def test_evaluate_and_export_run_core_in_a_worker_and_notify(monkeypatch):
    done = build_run(runs_dir(), "20261129-2100-done", status="finished", steps=600)
    add_checkpoint(done, 600)
    calls: list[str] = []

    def evaluate_run(run, checkpoint=None):
        calls.append("evaluate")
        stats = {"loss": 1.25, "perplexity": 3.49, "tokens": 640}
        return {"step": 600, "split": "held_out", "tuned": stats, "base": {**stats, "loss": 1.5, "perplexity": 4.48},
                "path": str(run.path / "eval" / "latest.json")}

    def export_run(run, fmt, checkpoint=None, out=None, force=False):
        calls.append(f"export:{fmt}")
        return {"format": fmt, "out": str(run.path / "export" / "merged-checkpoint-600"), "bytes": 2_000_000,
                "seconds": 1.0, "step": 600}

    monkeypatch.setattr("core.lifecycle.evaluate.evaluate_run", evaluate_run)
    monkeypatch.setattr("core.lifecycle.export.export_run", export_run)
    monkeypatch.setattr("tui.screens.chat._check_result", lambda run_dir: ("", True, ""))

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(done))
        async with app.run_test(size=SIZE) as pilot:
            await open_dashboard(pilot, app, "finished")
            await pilot.press("E")
            await wait_for(pilot, lambda: any("checkpoint 600, held-out split: loss 1.2500" in n for n in notes(app)))
            assert any("Evaluating 20261129-2100-done" in n for n in notes(app))
            await pilot.press("X")
            await wait_for(pilot, lambda: any("merged-checkpoint-600" in n for n in notes(app)))
            assert isinstance(app.screen, DashboardScreen)

    run(scenario())
    assert calls == ["evaluate", "export:merged"]


def test_merge_and_serve_hints_follow_their_state(monkeypatch):
    """A merge that ended no longer says it goes on; a server that failed or stopped no longer 'keeps running'."""
    from core.lifecycle.source import LifecycleError

    done = build_run(runs_dir(), "20261129-2100-done", status="finished", steps=600)
    add_checkpoint(done, 600)  # (no weights in it)
    monkeypatch.setattr("tui.screens.chat._check_result", lambda run_dir: ("", True, ""))

    def merge_run(run, **kwargs):
        raise LifecycleError("the checkpoint holds no adapter")

    def start_server(run, **kwargs):
        raise LifecycleError("no port free")

    monkeypatch.setattr("core.lifecycle.merge.merge_run", merge_run)
    monkeypatch.setattr("core.lifecycle.serve.start_server", start_server)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(done))
        async with app.run_test(size=(120, 40)) as pilot:
            await open_dashboard(pilot, app, "finished")
            await pilot.press("M")
            await wait_for(pilot, lambda: isinstance(app.screen, MergePanel))
            panel = app.screen
            await wait_for(pilot, lambda: panel.ended, timeout=60)  # the merge fails
            await pilot.pause()
            text = screen_text(app)
            assert "the merge goes on" not in text and t("lifecycle.merge_hint_done") in text
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            await pilot.press("v")
            await wait_for(pilot, lambda: isinstance(app.screen, ServePanel))
            serve = app.screen
            await wait_for(pilot, lambda: serve.phase() == "failed")
            await pilot.pause()
            text = screen_text(app)
            assert "keeps running" not in text and "not running" in text and "no port free" in text

    run(scenario())


def test_chat_and_merge_check_the_run_in_a_worker_then_open_or_say_why_not(monkeypatch):
    """The after-training keys read the run's status and checkpoints again before they open anything; that
    read ran on the UI thread (a slow disk froze the app). Now a worker reads it: on a finished run with a
    checkpoint a opens the chat (a full fine-tune here: one pane) and M the merge panel; on one whose
    checkpoint is gone (deleted since the dashboard looked) they say so and open nothing."""
    import threading

    import tui.screens.chat as chat
    from tui.screens.chat import ChatScreen

    done = build_run(runs_dir(), "20261129-2100-done", status="finished", steps=600)
    add_checkpoint(done, 600)  # a full model's weights: no adapter
    bare = build_run(runs_dir(), "20261129-2200-bare", status="finished", steps=600)
    checks: list[tuple[Path, bool]] = []  # (run, on the UI thread)
    real_check = chat._check_result

    def check_result(run_dir):
        checks.append((Path(run_dir), threading.current_thread() is threading.main_thread()))
        return real_check(run_dir)

    monkeypatch.setattr(chat, "_check_result", check_result)
    monkeypatch.setattr(ChatScreen, "_start_worker", lambda self: None)  # no model process: what opens is the point

    def merge_run(run, **kwargs):
        from core.lifecycle.source import LifecycleError

        raise LifecycleError("held back by the test")

    monkeypatch.setattr("core.lifecycle.merge.merge_run", merge_run)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(done))
        async with app.run_test(size=SIZE) as pilot:
            dashboard = await open_dashboard(pilot, app, "finished")
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
            assert app.screen.run_dir == done and app.screen.adapter_known is False and not app.screen.compare
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is dashboard)
            await pilot.press("M")
            await wait_for(pilot, lambda: isinstance(app.screen, MergePanel))
            panel = app.screen
            assert panel.run_dir == done and panel.adapter is False
            await wait_for(pilot, lambda: panel.ended)
        assert checks == [(done, False), (done, False)]

        checks.clear()
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(bare))
        async with app.run_test(size=SIZE) as pilot:
            dashboard = await open_dashboard(pilot, app, "finished")
            assert not dashboard.has_checkpoint  # not offered: called as if offered before it went
            warning = t("lifecycle.no_checkpoint_ended", run=bare.name, status=t("runs.state.finished"),
                        config=str(RunDirectory(bare).config_path))  # ended: none will come, start it anew
            for count, what in enumerate(("chat", "merge"), start=1):
                dashboard.action_after_training(what)
                await wait_for(pilot, lambda n=count: notes(app).count(warning) == n)
                await pilot.pause()
                assert app.screen is dashboard, what
        assert checks == [(bare, False), (bare, False)]

    run(scenario())


# --- 7. r is consistent ---------------------------------------------------------------------------------
def test_r_goes_to_the_runs_list_from_a_dashboard_and_from_other_sections():
    done = build_run(runs_dir(), "20261129-2100-done", status="finished", steps=600)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(done))
        async with app.run_test(size=SIZE) as pilot:
            await open_dashboard(pilot, app, "finished")
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            await pilot.press("g")
            await wait_for(pilot, lambda: app.current_mode == "gpus")
            await pilot.press("r")  # the list, not the dashboard last opened over it
            await wait_for(pilot, lambda: app.current_mode == "runs" and isinstance(app.screen, RunsScreen))
            await pilot.press("r")
            await pilot.pause()
            assert isinstance(app.screen, RunsScreen) and len(app.screen_stack) == 1

    run(scenario())


def test_runs_sort_cycles_back_to_started():
    live = build_run(runs_dir(), "20261129-2300-live", status="running", steps=120, created="2026-11-29T23:00:00Z")
    build_run(runs_dir(), "20261129-2200-done", status="finished", steps=600, created="2026-11-29T22:00:00Z")

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
            async with app.run_test(size=SIZE) as pilot:
                screen = await open_runs(pilot, app)
                assert "started" not in screen.column_widths  # hidden at 80 columns, yet the default order
                seen = []
                for _ in range(len(screen.column_widths) + 1):
                    await pilot.press("s")
                    await pilot.pause()
                    seen.append(screen.sort_column)
                assert seen[-1] == 8 and len(set(seen)) == len(seen)  # each order once, then Started again
                assert "sorted by Started" in screen_text(app)

    run(scenario())


def test_enter_in_the_delete_dialog_cancels():
    done = build_run(runs_dir(), "20261129-2200-done", status="finished", steps=600)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=SIZE) as pilot:
            await open_runs(pilot, app)
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert "y: yes" in screen_text(app)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
            await pilot.pause()
            assert done.is_dir()
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
            assert done.is_dir()

    run(scenario())


def test_stop_and_resume_from_the_runs_list(monkeypatch):
    """Stop on the live run; resume only on a stopped run with a checkpoint to go on from, or one stopped
    before its first step (resume starts it again from step 0, and the question says so), the dashboard's
    rule (the list offered ``u`` on one with none that had trained, where resume could only fail)."""
    never = build_run(runs_dir(), "20261129-1900-never", status="stopped", steps=0, created="2026-11-29T19:00:00Z")
    bare = build_run(runs_dir(), "20261129-2000-bare", status="stopped", steps=30, created="2026-11-29T20:00:00Z")
    stopped = build_run(runs_dir(), "20261129-2100-stopped", status="stopped", steps=30,
                        created="2026-11-29T21:00:00Z")
    add_checkpoint(stopped, 30)
    path = build_run(runs_dir(), "20261129-2300-live", status="running", steps=30, created="2026-11-29T23:00:00Z")
    resumed: list[str] = []

    def resume_run(run, **_kwargs):  # core's resume would start a real supervisor for this made-up run
        resumed.append(run.id)
        last = run.last_complete_checkpoint()
        return SimpleNamespace(checkpoint=str(last.path) if last else None)

    monkeypatch.setattr("core.runs.resume_run", resume_run)
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/fixtures/watch/fake_supervisor.py"), str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"

        async def scenario():
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
            async with app.run_test(size=SIZE) as pilot:
                screen = await open_runs(pilot, app)
                assert [s.id for s in screen.shown] == [path.name, stopped.name, bare.name, never.name]
                await wait_for(pilot, lambda: "k" in footer_keys(app) and "u" not in footer_keys(app))
                assert t("dashboard.key.stop") in palette_titles(app)
                await pilot.press("k")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                await pilot.press("y")
                assert proc.wait(timeout=10) == 0  # the supervisor got the stop
                await wait_for(pilot, lambda: any("20261129-2300-live" in n and "stop" in n for n in notes(app)))
                await pilot.press("down", "down")  # stopped with no checkpoint: neither stop nor resume
                await wait_for(pilot, lambda: screen.selected().id == bare.name)
                await pilot.pause()
                assert "u" not in footer_keys(app) and "k" not in footer_keys(app)
                assert t("dashboard.key.resume") not in palette_titles(app)
                app.clear_notifications()
                await pilot.press("u")  # not offered, and does nothing
                await pilot.pause()
                assert isinstance(app.screen, RunsScreen) and not notes(app)
                await pilot.press("up")  # stopped with a checkpoint: resume, not stop
                await wait_for(pilot, lambda: "u" in footer_keys(app) and "k" not in footer_keys(app))
                assert t("dashboard.key.resume") in palette_titles(app)
                await pilot.press("u")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                await pilot.press("y")
                await wait_for(pilot, lambda: any(n.startswith(f"Run {stopped.name} resumed from") for n in notes(app)))
                assert isinstance(app.screen, RunsScreen)
                await pilot.press("down", "down")  # stopped before its first step: resumed from step 0
                await wait_for(pilot, lambda: screen.selected().id == never.name and "u" in footer_keys(app))
                await pilot.press("u")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                assert "starts again from step 0" in screen_text(app)
                await pilot.press("y")
                await wait_for(pilot, lambda: f"Run {never.name} started again from step 0" in notes(app))

        run(scenario())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert resumed == [stopped.name, never.name]


def test_a_resume_refused_for_gpus_in_use_asks_to_share_them_and_says_the_commands_otherwise(monkeypatch):
    """The "GPU in use" refusal of a resume advised gpus=… or --allow-shared-gpus, neither of which the
    app's resume could take: the list said the refusal and that was all. Now the app asks, as the wizard's
    launch does: y resumes it sharing the GPUs (allow_shared_gpus), n says the exact commands (with the run's
    id) that resume it on other GPUs or shared. Hardware: the box's two H200s (fake monitor); core's resume
    stood in for (no supervisor started), the live run its refusal names is made up."""
    from core.runs import GpusInUse

    stopped = build_run(runs_dir(), "20261129-2100-stopped", status="stopped", steps=30, gpus=(0, 1))
    add_checkpoint(stopped, 30)
    calls: list[bool] = []

    def resume_run(run, allow_shared_gpus=False, **_kwargs):
        calls.append(allow_shared_gpus)
        if not allow_shared_gpus:
            raise GpusInUse("GPU 0,1 is in use by run other-run (running)", [("other-run", "running", [0, 1])])
        return SimpleNamespace(checkpoint=str(run.last_complete_checkpoint().path))

    monkeypatch.setattr("core.runs.resume_run", resume_run)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_runs(pilot, app)
            await wait_for(pilot, lambda: screen.selected() is not None and "u" in footer_keys(app))
            for answer in ("n", "y"):
                await pilot.press("u")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                await pilot.press("y")  # resume: yes
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen)
                               and "GPU 0,1 is in use" in screen_text(app))
                assert "other-run" in screen_text(app)
                await pilot.press(answer)
                await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
                if answer == "n":
                    await wait_for(pilot, lambda: any("not resumed" in n for n in notes(app)))
                    said = next(n for n in notes(app) if "not resumed" in n)
                    assert f"tunedeck resume {stopped.name} gpus=" in said, said
                    assert f"tunedeck resume {stopped.name} --allow-shared-gpus" in said, said
                else:
                    await wait_for(pilot, lambda: any(n.startswith(f"Run {stopped.name} resumed from")
                                                      for n in notes(app)))

    run(scenario())
    assert calls == [False, False, True]  # n: nothing more; y: resumed again, sharing the GPUs


def test_a_resume_past_the_gpus_free_memory_asks_with_the_refusal(monkeypatch):
    """A resume whose estimated peak is past its GPUs' free memory now (another process holds them) is refused
    by core with the figures; the app said it in a toast and nothing more. It asks now, as for shared GPUs:
    the refusal in the question, y resumes it with allow_over_memory, n says the refusal. Hardware: the
    box's two H200s (fake monitor); core's resume stood in for (no supervisor started)."""
    from core.runs import GpuMemoryShort

    stopped = build_run(runs_dir(), "20261129-2100-stopped", status="stopped", steps=30, gpus=(0, 1))
    add_checkpoint(stopped, 30)
    calls: list[bool] = []
    refusal = ("This run needs about 150.2 GiB per GPU by the estimate, and GPU 1 (NVIDIA H200) has 70.4 GiB free "
               "(140.4 GiB, 70.0 GiB of it in use by other processes): it would load the model, then run out of GPU "
               "memory. micro_batch_size=2 fits (about 60.1 GiB).")

    def resume_run(run, allow_over_memory=False, **_kwargs):
        calls.append(allow_over_memory)
        if not allow_over_memory:
            raise GpuMemoryShort(refusal, None)
        return SimpleNamespace(checkpoint=str(run.last_complete_checkpoint().path))

    monkeypatch.setattr("core.runs.resume_run", resume_run)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_runs(pilot, app)
            await wait_for(pilot, lambda: screen.selected() is not None and "u" in footer_keys(app))
            for answer in ("n", "y"):
                await pilot.press("u")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                await pilot.press("y")  # resume: yes
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen)
                               and "has 70.4 GiB free" in " ".join(screen_text(app).split()))
                assert "does not fit" in screen_text(app)
                await pilot.press(answer)
                await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen))
                if answer == "n":
                    await wait_for(pilot, lambda: any("micro_batch_size=2 fits" in n for n in notes(app)))
                else:
                    await wait_for(pilot, lambda: any(n.startswith(f"Run {stopped.name} resumed from")
                                                      for n in notes(app)))

    run(scenario())
    assert calls == [False, False, True]  # n: nothing more; y: resumed, past the estimate as asked
