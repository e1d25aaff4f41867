"""The dashboard's after-training keys on a real finished tiny LoRA run (trained once per test process,
see tests/fixtures/lifecycle/finished_run.py): ``v`` starts a real detached server and shows its URL,
port and health turning healthy, with the app's test request answered, then stops it; ``M`` merges in a
worker, stage by stage, ending with the merged directory; ``a`` opens the chat on the run. On a run
that is still running, the keys are not offered."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading

import pytest

from core.paths import runs_dir
from tests.fixtures.lifecycle.finished_run import finished_run, tunedeck
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.chat import ChatScreen
from tui.screens.dashboard import DashboardScreen
from tui.widgets.confirm import ConfirmScreen
from tui.widgets.lifecycle_panels import MergePanel, ServePanel


@pytest.fixture()
def finished(shared, private_home, monkeypatch):
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    return home, run_id


# How long the app may take to exit while the server it started is held stopped: a ceiling for the exit
# to come at all (see wait_for), far above any box's exit, not a speed target.
EXIT_CEILING_S = 120.0


async def open_finished_dashboard(pilot, app) -> DashboardScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
    await wait_for(pilot, lambda: app.screen.status == "finished")
    return app.screen


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (our child, not reaped yet) is gone for our purposes
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_server(run_id: str, pids: list[int]) -> None:
    """Whatever happened in the test, no server of it outlives it."""
    from core.lifecycle.serve import read_server_record, stop_server

    stop_server(run_id)
    for pid in {*pids, int(read_server_record(run_id).get("pid") or 0)} - {0}:
        if pid_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_v_serves_the_run_with_url_port_health_and_a_test_reply_then_stops(finished, monkeypatch):
    import core.lifecycle.serve as lifecycle_serve
    from core.lifecycle.serve import probe_request, read_server_record, server_state

    home, run_id = finished
    pids: list[int] = []
    stopped: list[int] = []  # servers this test holds with SIGSTOP (let go whatever happens)
    watchdog: list[threading.Timer] = []
    let_go_before_exit = threading.Event()
    wait_ends: list[str] = []  # how the app's wait for the server (start_server in its worker) ended
    seen: list[tuple[str, bool | None]] = []

    async def quit_while_loading() -> None:
        """v, then quit the app as soon as the server has a pid: the app does not wait for the model to
        load, and the detached server lives on. The server is stopped (SIGSTOP) before the quit, so that
        it cannot finish loading while the app exits, whatever the box's speed."""
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("v")
            await wait_for(pilot, lambda: isinstance(app.screen, ServePanel))
            panel = app.screen
            # loading: the server's own record (start_server records the pid before, while it starts)
            await wait_for(pilot, lambda: read_server_record(run_id).get("status") == "loading", timeout=60)
            pids.append(int(read_server_record(run_id)["pid"]))
            os.killpg(pids[0], signal.SIGSTOP)
            stopped.append(pids[0])
            assert read_server_record(run_id).get("status") == "loading"  # stopped before its model loaded
            await wait_for(pilot, lambda: panel.alive and panel.state.get("pid") == pids[0], timeout=60)
            assert f"PID      {pids[0]}" in screen_text(app)
            # A ceiling for a state that must come (the app gone), not a speed: should the exit wait for
            # the server, the watchdog lets the server go on after it, and the test fails below.
            watchdog.append(threading.Timer(EXIT_CEILING_S, let_go))
            watchdog[0].start()

    def let_go() -> None:
        let_go_before_exit.set()
        os.killpg(pids[0], signal.SIGCONT)

    async def serve_and_stop() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("v")
            await wait_for(pilot, lambda: isinstance(app.screen, ServePanel))
            panel = app.screen

            def healthy() -> bool:
                seen.append((panel.phase(), panel.healthy))
                return panel.healthy is True

            await wait_for(pilot, healthy, timeout=90)
            assert seen[-1] == ("ready", True)
            await wait_for(pilot, lambda: panel.reply is not None or panel.test_error is not None, timeout=90)
            assert panel.test_error is None
            state = server_state(run_id)
            assert state is not None and state.pid == pids[0]  # the server found again, not a second one
            assert state.backend == "transformers" and state.host == "127.0.0.1"
            assert state.port > 0 and state.url == f"http://127.0.0.1:{state.port}/v1"
            await pilot.pause()
            text = screen_text(app)
            # the labels are padded to the widest one shown ("Checkpoint" once the server has a URL)
            assert state.url in text and re.search(rf"Port +{state.port}\b", text), text
            assert re.search(rf"PID +{state.pid}\b", text) and re.search(r"Checkpoint +30\b", text), text
            assert "ready" in text and "healthy" in text and "test request answered in" in text
            # the reply on screen is the server's own answer (greedy, so the same again)
            assert panel.reply == probe_request(state.url, run_id)[0]
            # The second t must arrive while the first one's request is under way, whatever the box's
            # speed: the server is stopped with SIGSTOP (its socket still accepts, nothing answers), so
            # the first request stays open until SIGCONT.
            os.kill(state.pid, signal.SIGSTOP)
            try:
                await pilot.press("t")
                await wait_for(pilot, lambda: panel.testing and "sending" in screen_text(app))
                await pilot.press("t")
                await pilot.pause()
                assert panel.testing  # no answer can have come: the server is stopped
                notes = [str(n.message) for n in app._notifications]
                assert any("a test request is already running" in n for n in notes), notes
                assert not any("no server is running" in n for n in notes), notes
            finally:
                os.kill(state.pid, signal.SIGCONT)
            await wait_for(pilot, lambda: not panel.testing, timeout=60)
            assert panel.test_error is None and panel.reply
            await pilot.press("y")
            assert app.clipboard == state.url
            await pilot.press("k")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: app.screen is panel and panel.stopped and not panel.alive
                           and panel.healthy is False, timeout=30)
            await pilot.pause()
            text = screen_text(app)
            assert "stopped" in text and "not answering" in text
            assert not pid_alive(state.pid)
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))

    real_start_server = lifecycle_serve.start_server

    def start_server(*args, **kwargs):
        try:
            state = real_start_server(*args, **kwargs)
        except lifecycle_serve.ServeWaitCancelled:
            wait_ends.append("cancelled")
            raise
        except BaseException:
            wait_ends.append("failed")
            raise
        wait_ends.append("ready")
        return state

    monkeypatch.setattr(lifecycle_serve, "start_server", start_server)
    try:
        asyncio.run(quit_while_loading())  # returns once the app and its worker threads are gone
        watchdog[0].cancel()
        # the app's exit did not wait for the server: it came while the server was still stopped, not
        # ready, and the app's wait for it ended because the quit cancelled it
        assert not let_go_before_exit.is_set(), "the app's exit waited for the server to load"
        assert wait_ends == ["cancelled"]
        assert read_server_record(run_id).get("status") == "loading"
        os.killpg(pids[0], signal.SIGCONT)
        stopped.clear()
        assert pid_alive(pids[0]) and server_state(run_id) is not None  # detached: it outlives the app
        asyncio.run(serve_and_stop())
        assert server_state(run_id) is None
        again = tunedeck(home, "serve", "--stop", run_id)
        assert again.returncode == 0 and "no server is running" in again.stderr  # nothing left running
        assert not any(pid_alive(pid) for pid in pids)
    finally:
        for timer in watchdog:
            timer.cancel()
        for pid in stopped:
            os.killpg(pid, signal.SIGCONT)
        kill_server(run_id, pids)


def _flat(app) -> str:
    """The screen's text with the panel's borders taken off and its wrapped lines joined."""
    return " ".join(" ".join(line.strip(" │") for line in screen_text(app).splitlines()).split())


def test_k_while_the_server_starts_stops_it_and_the_panel_says_stopped_not_failed(finished, monkeypatch, tmp_path):
    """k on the serve panel while the server started (before it took its lock: Python starting, its
    imports) said "no server is running" and the server went on to serve; k while it loaded stopped it, and
    the panel then said it had failed to start, with its log, in red and in an error note. The server here
    waits, before it starts (a slow import), for a file that never comes: still starting when k arrives,
    however slow the box (a state, not a speed). CPU only."""

    from core.lifecycle import serve
    from tests.fixtures.lifecycle.serving import hold_server_before_start

    _home, run_id = finished
    hold_server_before_start(monkeypatch, tmp_path / "never-created")

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_finished_dashboard(pilot, app)
            app.clear_notifications()
            await pilot.press("v")
            await wait_for(pilot, lambda: isinstance(app.screen, ServePanel))
            panel = app.screen
            await wait_for(pilot, lambda: panel.alive, timeout=60)
            assert not serve._lock_held(serve.serve_dir(run_id))  # still starting: found all the same
            pid = int(panel.state["pid"])
            await pilot.press("k")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            # no address yet: the confirm said "Clients using – lose their connection"
            assert "Clients using" not in _flat(app) and "It is still starting" in _flat(app), _flat(app)
            await pilot.press("y")
            await wait_for(pilot, lambda: panel.phase() == "stopped" and not panel.launching, timeout=60)
            await pilot.pause()
            notes = [(str(n.message), n.severity) for n in app._notifications]
            assert notes == [(f"server of {run_id} stopped", "information")], notes
            assert not pid_alive(pid) and panel.start_error is None
            assert "did not come up" not in screen_text(app)

    try:
        asyncio.run(scenario())
    finally:
        kill_server(run_id, [])


def test_v_while_the_previous_server_is_still_stopping_shows_the_wait_in_the_panel(finished, monkeypatch, tmp_path):
    """k, then v again at once: the new start waits for the stopped server, still exiting with its lock held.
    The panel said "starting" all along and only a passing note told of the wait; now its status says it
    waits for the previous server, then goes on to starting and ready once that server has ended. The old
    server is held at its last write (a state, not a speed) until the panel has shown the wait. CPU only."""
    import threading

    from core.lifecycle import serve
    from core.runs import RunDirectory
    from tests.fixtures.lifecycle.serving import hold_stopped_server_at_exit

    _home, run_id = finished
    gates = hold_stopped_server_at_exit(monkeypatch, tmp_path)
    old = serve.start_server(RunDirectory(runs_dir() / run_id), timeout=300)
    stopper = threading.Thread(target=serve.stop_server, args=(run_id,))
    pids = [old.pid]

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_finished_dashboard(pilot, app)
            stopper.start()
            await wait_for(pilot, lambda: (gates / "exiting").exists(), timeout=120)
            await pilot.press("v")
            await wait_for(pilot, lambda: isinstance(app.screen, ServePanel))
            panel = app.screen
            await wait_for(pilot, lambda: panel.phase() == "waiting", timeout=120)
            await pilot.pause()
            flat = _flat(app)
            assert "Status waiting for the previous server to end" in flat, flat
            assert panel.launching and serve.read_server_record(run_id)["pid"] == old.pid  # nothing started yet
            (gates / "exit").touch()
            await wait_for(pilot, lambda: panel.phase() != "waiting", timeout=120)
            assert panel.phase() in ("starting", "loading", "ready"), panel.phase()
            await wait_for(pilot, lambda: panel.started and panel.phase() == "ready", timeout=300)
            pids.append(int(panel.state["pid"]))
            assert pids[1] != old.pid and not pid_alive(old.pid)
            await pilot.pause()
            assert "waiting for the previous server" not in _flat(app)

    try:
        asyncio.run(scenario())
    finally:
        (gates / "exit").touch()
        if stopper.ident:
            stopper.join(timeout=700)
        kill_server(run_id, pids)


def test_v_on_a_server_that_wants_an_api_key_says_so_and_tests_with_the_apps_key(finished, monkeypatch):
    """Against a server started with --api-key the panel said "the test request failed: …: HTTP Error 401:
    Unauthorized" and never that the server needs a key. Now it shows the key is required, skips the test
    request while the app has no key (saying where the key comes from), and sends it with TUNEDECK_API_KEY
    once set: a wrong key is said to be refused, the right one gets the model's answer."""
    import json

    from core.lifecycle.serve import probe_request

    home, run_id = finished
    key = "td-panel-key-51c0"
    monkeypatch.delenv("TUNEDECK_API_KEY", raising=False)
    proc = tunedeck(home, "serve", run_id, "--api-key", key, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = json.loads(proc.stdout)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("v")
            await wait_for(pilot, lambda: isinstance(app.screen, ServePanel))
            panel = app.screen
            await wait_for(pilot, lambda: panel.started and panel.healthy is True, timeout=90)
            await wait_for(pilot, lambda: not panel.testing and (panel.test_note or panel.test_error or panel.reply))
            await pilot.pause()
            flat = _flat(app)
            assert "API key required (clients send Authorization: Bearer KEY)" in flat, flat
            assert "This server requires an API key" in flat and "TUNEDECK_API_KEY" in flat, flat
            assert "--api-key KEY" in flat and "the test request is skipped" in flat, flat
            # the refusal's words, not the digits: the panel's PID may hold them ("PID 4011")
            assert "Error 401" not in flat and "Unauthorized" not in flat and "failed" not in flat, flat
            assert panel.test_error is None and panel.reply is None
            await pilot.press("t")  # still no key: still skipped, nothing sent
            await pilot.pause()
            assert not panel.testing and panel.test_note and panel.reply is None
            monkeypatch.setenv("TUNEDECK_API_KEY", "not-the-key")
            await pilot.press("t")
            await wait_for(pilot, lambda: not panel.testing and panel.test_error is not None, timeout=90)
            assert "it refused the API key in TUNEDECK_API_KEY" in panel.test_error, panel.test_error
            monkeypatch.setenv("TUNEDECK_API_KEY", key)
            await pilot.press("t")
            await wait_for(pilot, lambda: not panel.testing and panel.reply is not None, timeout=90)
            assert panel.test_error is None
            assert panel.reply == probe_request(state["url"], run_id, api_key=key)[0]
            await pilot.pause()
            assert "test request answered in" in _flat(app)

    try:
        asyncio.run(scenario())
    finally:
        kill_server(run_id, [state["pid"]])


def test_M_merges_in_a_worker_stage_by_stage_and_shows_the_merged_directory(finished):
    home, run_id = finished
    merged = home / "runs" / run_id / "merged" / "checkpoint-30"

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("M")
            await wait_for(pilot, lambda: isinstance(app.screen, MergePanel))
            panel = app.screen
            # No "not ended yet" check here: with torch already imported by earlier tests a tiny merge can
            # end before the first look. The stages arriving one message each show the worker at work.
            await wait_for(pilot, lambda: panel.ended, timeout=90)
            assert panel.ok and panel.out == str(merged)
            assert panel.stages == ["load", "merge", "write", "done"]
            await pilot.pause()
            text = screen_text(app)
            assert "merged model written to" in text and "MB" in text
            assert text.count("✓") == 3 and "fold the adapter into the base weights" in text
            assert any("merged model written to" in str(n.message) for n in app._notifications)
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))

    asyncio.run(scenario())
    names = {p.name for p in merged.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not merged.with_name("checkpoint-30.tmp").exists()


def test_M_again_reuses_the_whole_merge_and_asks_before_replacing_another_folder(finished):
    """M always merged again (force), rewriting a whole merge of the same checkpoint and replacing any
    folder in the way unasked. Now, as X does: a whole merge is kept and said so; another folder there
    opens a dialog, n keeps it (and says how to merge later), y merges into it."""
    import json

    home, run_id = finished
    merged = home / "runs" / run_id / "merged" / "checkpoint-30"

    def files() -> dict[str, int]:
        return {p.name: p.stat().st_mtime_ns for p in merged.iterdir()}

    async def merge(pilot, app) -> MergePanel:
        await pilot.press("M")
        await wait_for(pilot, lambda: isinstance(app.screen, (MergePanel, ConfirmScreen)))
        panel = next(s for s in app.screen_stack if isinstance(s, MergePanel))
        await wait_for(pilot, lambda: panel.ended or isinstance(app.screen, ConfirmScreen), timeout=90)
        return panel

    async def close(pilot, app) -> None:
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await wait_for(pilot, lambda: not any(w.group == "lifecycle" and not w.is_finished for w in app.workers))

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_finished_dashboard(pilot, app)
            panel = await merge(pilot, app)
            assert panel.ok and panel.stages == ["load", "merge", "write", "done"]
            written = files()
            await close(pilot, app)

            panel = await merge(pilot, app)  # the same checkpoint, merged whole: kept, said so
            assert panel.ended and panel.ok and panel.out == str(merged) and panel.stages == []
            await pilot.pause()
            flat = " ".join(" ".join(line.strip(" │") for line in screen_text(app).splitlines()).split())
            assert "already holds the whole merge of checkpoint 30" in flat and "✓" not in flat, flat
            assert files() == written  # untouched, not rewritten
            await close(pilot, app)

            (merged / "tunedeck_merge.json").write_text(json.dumps({"checkpoint": "elsewhere", "step": 30}))
            kept = files()
            panel = await merge(pilot, app)  # not a whole merge of this checkpoint: asked first
            assert isinstance(app.screen, ConfirmScreen) and not panel.ended
            assert "Replace checkpoint-30?" in screen_text(app)
            await pilot.press("n")
            await wait_for(pilot, lambda: panel.ended and app.screen is panel)
            assert panel.ok and panel.out is None and panel.stages == []
            assert any("kept as it is; nothing was merged" in str(n.message) for n in app._notifications)
            assert files() == kept
            await close(pilot, app)

            panel = await merge(pilot, app)
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await wait_for(pilot, lambda: panel.ended, timeout=90)
            assert panel.ok and panel.out == str(merged) and panel.stages == ["load", "merge", "write", "done"]
            assert not any(n.severity == "error" for n in app._notifications)

    asyncio.run(scenario())
    assert json.loads((merged / "tunedeck_merge.json").read_text())["step"] == 30
    assert json.loads((merged / "tunedeck_merge.json").read_text())["checkpoint"] != "elsewhere"


def test_M_on_a_broken_checkpoint_ends_with_the_error_instead_of_hanging(finished):
    """A damaged adapter file (here garbage: safetensors' own error underneath) is the user's data, not a
    bug: the panel ends with the error naming the checkpoint and what to do, and notifies; no error modal."""
    home, run_id = finished
    adapters = sorted((home / "runs" / run_id).rglob("adapter_model.safetensors"))
    assert adapters
    for adapter in adapters:
        adapter.write_bytes(b"\x00" * 64)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("M")
            await wait_for(pilot, lambda: isinstance(app.screen, MergePanel))
            panel = app.screen
            await wait_for(pilot, lambda: panel.ended, timeout=90)
            assert not panel.ok and panel.out is None and panel.stages == ["load"]
            await pilot.pause()
            text = " ".join(screen_text(app).split())
            assert "✗" in text and "cannot be loaded" in text
            assert any(n.severity == "error" for n in app._notifications)

    asyncio.run(scenario())
    assert not (home / "runs" / run_id / "merged" / "checkpoint-30").exists()


def test_a_damaged_checkpoint_is_said_in_the_apps_words_on_M_E_and_in_the_chat(finished):
    """Every checkpoint's adapter garbage: M, E and the chat (a) said the CLI's "choose another checkpoint
    with --checkpoint N", which the app has no way to do. They now say the app's words (the app loads the
    newest sound checkpoint; u resumes), through LIFECYCLE_WORDING; the CLI keeps its own (test below)."""
    home, run_id = finished
    for adapter in (home / "runs" / run_id).rglob("adapter_model.safetensors"):
        adapter.write_bytes(b"\x00" * 64)
    cli_advice, app_advice = "choose another checkpoint with --checkpoint N", "The app loads a run's newest sound"

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("M")
            await wait_for(pilot, lambda: isinstance(app.screen, MergePanel))
            panel = app.screen
            await wait_for(pilot, lambda: panel.ended, timeout=90)
            await pilot.pause()
            text = " ".join(screen_text(app).split())
            assert "cannot be loaded" in text and app_advice in text and cli_advice not in text, text
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            app.clear_notifications()
            await pilot.press("E")
            await wait_for(pilot, lambda: any(n.severity == "error" for n in app._notifications), timeout=90)
            errors = [str(n.message) for n in app._notifications if n.severity == "error"]
            assert "cannot be loaded" in errors[0] and app_advice in errors[0] and cli_advice not in errors[0], errors
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
            chat = app.screen
            await wait_for(pilot, lambda: chat.load_error is not None, timeout=90)
            assert "cannot be loaded" in chat.load_error and app_advice in chat.load_error, chat.load_error
            assert cli_advice not in chat.load_error

    asyncio.run(scenario())
    proc = tunedeck(home, "merge", run_id)  # the CLI's words stay the CLI's
    assert proc.returncode == 1 and cli_advice in proc.stderr and app_advice not in proc.stderr, proc.stderr


def test_E_on_a_run_folder_it_cannot_write_says_so_in_a_notification_not_the_error_modal(finished, monkeypatch):
    """E on a run whose folder is read-only (or on a full disk) ended in the app's "Something went wrong"
    modal with an OSError traceback, after the whole evaluation had run. It says the CLI's one line
    (which folder, what to do) in a notification, as the CLI does, before loading anything."""
    import errno

    from core.lifecycle import evaluate
    from tui.screens.error_modal import ErrorModal

    home, run_id = finished
    folder = home / "runs" / run_id / "eval"

    def refuse(_run):
        raise OSError(errno.EROFS, "Read-only file system", str(folder))

    monkeypatch.setattr(evaluate, "eval_dir", refuse)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_finished_dashboard(pilot, app)
            app.clear_notifications()
            await pilot.press("E")
            await wait_for(pilot, lambda: any(n.severity == "error" for n in app._notifications)
                           or isinstance(app.screen, ErrorModal), timeout=90)
            assert not isinstance(app.screen, ErrorModal)
            errors = [str(n.message) for n in app._notifications if n.severity == "error"]
            assert f"cannot write {folder}: Read-only file system" in errors[0], errors

    asyncio.run(scenario())


def test_M_never_offers_to_replace_a_folder_of_the_users(finished):
    """The user's own folder where M merges to (RUN/merged/checkpoint-N): the dialog's y used to delete it.
    Now M goes through core's check: no dialog, the panel and a notification say what the folder holds and
    what to do in the app (no --out / --force), and the folder is kept."""
    home, run_id = finished
    merged = home / "runs" / run_id / "merged" / "checkpoint-30"
    (merged / "mine").mkdir(parents=True)
    (merged / "notes.txt").write_text("the user's own file")

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("M")
            await wait_for(pilot, lambda: isinstance(app.screen, (MergePanel, ConfirmScreen)))
            panel = next(s for s in app.screen_stack if isinstance(s, MergePanel))
            await wait_for(pilot, lambda: panel.ended or isinstance(app.screen, ConfirmScreen), timeout=90)
            assert app.screen is panel and panel.ended and not panel.ok and panel.stages == []
            errors = [str(n.message) for n in app._notifications if n.severity == "error"]
            assert len(errors) == 1 and "2 entries: mine/, notes.txt" in errors[0], errors
            assert "then press M again" in errors[0] and "--out" not in errors[0] and "--force" not in errors[0]

    asyncio.run(scenario())
    assert sorted(p.name for p in merged.iterdir()) == ["mine", "notes.txt"]
    assert not merged.with_name("checkpoint-30.tmp").exists()


def test_M_while_a_merge_into_the_folder_runs_says_to_wait_in_the_apps_words(finished):
    """A second M during a merge gave the CLI's advice ("… or choose another folder with --out"): the app
    has no --out. Now it says to wait for the running merge (here another tunedeck's: its lock is held)."""
    import fcntl

    home, run_id = finished
    merged = home / "runs" / run_id / "merged" / "checkpoint-30"
    lock = merged.with_name("checkpoint-30.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)  # the merge under way, holding the folder's lock
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("M")
            await wait_for(pilot, lambda: isinstance(app.screen, MergePanel))
            panel = app.screen
            await wait_for(pilot, lambda: panel.ended, timeout=90)
            assert not panel.ok and panel.stages == []
            errors = [str(n.message) for n in app._notifications if n.severity == "error"]
            assert len(errors) == 1 and f"a merge into {merged} is already running" in errors[0], errors
            assert "wait for it to end" in errors[0] and "--out" not in errors[0], errors

    try:
        asyncio.run(scenario())
    finally:
        os.close(fd)
    assert not merged.exists() and not merged.with_name("checkpoint-30.tmp").exists()


def test_a_opens_the_chat_on_the_run(finished):
    home, run_id = finished

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
            chat = app.screen
            assert chat.run_dir == home / "runs" / run_id and chat.compare
            assert chat.proc is not None  # its model process started (the chat itself: test_chat_screen.py)
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))

    asyncio.run(scenario())


def test_a_on_a_run_whose_newest_checkpoint_is_damaged_says_the_older_one_is_used(finished):
    """The CLI says "checkpoint-30 is damaged; using checkpoint-15, the newest sound checkpoint" on stderr; the
    app said nothing (the chat's model process drops its stderr; a merge, serve, evaluate or export in the
    app logged it nowhere to be seen) and went on with checkpoint 15. The check before each of the keys
    says it now, as a warning, and goes ahead."""
    home, run_id = finished
    newest = home / "runs" / run_id / "checkpoints" / "checkpoint-30"
    (newest / "adapter_model.safetensors").write_bytes(b"cut short")  # its COMPLETE marker vouches otherwise

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen))
            notes = [(str(n.message), n.severity) for n in app._notifications]
            assert ("checkpoint-30 is damaged; using checkpoint-15, the newest sound checkpoint", "warning") in notes
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))

    asyncio.run(scenario())


def test_a_running_run_offers_no_merge_chat_or_serve_and_the_keys_do_nothing():
    """Not offered while the run is live (the footer, ? and Ctrl+P follow the dashboard's check_action):
    the keys neither open a panel nor toast that the run is running."""
    live = build_run(runs_dir(), "20261129-2300-live", status="running", steps=120)

    async def scenario() -> None:
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=live.name,
                           persist_settings=False)
            async with app.run_test(size=(120, 40)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
                await wait_for(pilot, lambda: app.screen.status == "running")
                for key in ("M", "a", "v"):
                    await pilot.press(key)
                    await pilot.pause()
                    assert isinstance(app.screen, DashboardScreen), key
                notes = [str(n.message) for n in app._notifications]
                assert not any("need a run that has ended" in n for n in notes), notes

    asyncio.run(scenario())


def test_a_run_found_live_when_a_key_is_pressed_is_said_in_the_readers_language():
    """M, a, v, E or X on a run the dashboard saw ended but that is live again (resumed from the CLI since):
    the warning named its state as stored ("training", "running") under zh, and named only merge, chat and
    serve whichever of the five keys was pressed. Now the state in the language's words, the five named."""
    from core.i18n import current_language, set_language
    from tui.screens.chat import _check_result

    live = build_run(runs_dir(), "20261129-2300-live", status="running", steps=120)
    language = current_language()
    with SupervisorStandIn(live):
        set_language("zh")
        try:
            problem, adapter, notice = _check_result(live)
        finally:
            set_language(language)
        assert "运行中" in problem and "running" not in problem and "评估和导出" in problem, problem
        assert (adapter, notice) == (False, "")
        problem, _adapter, _notice = _check_result(live)
        assert problem == "the run is running: merge, chat, serve, evaluate and export need a run that has ended"


def test_an_event_is_labelled_when_the_catalogue_has_its_key(monkeypatch):
    """The catalogue alone decides which events have a label: a new one needs no second list."""
    from core import i18n
    from tui.screens.dashboard import event_label

    monkeypatch.setitem(i18n.catalogue("en"), "dashboard.event.quantized", "quantized")
    monkeypatch.setitem(i18n.catalogue("zh"), "dashboard.event.quantized", "已量化")
    try:
        i18n.set_language("zh")
        assert event_label("quantized") == "已量化" and event_label("merged") == i18n.t("dashboard.event.merged")
        assert event_label("other_tools_event") == "other_tools_event"
    finally:
        i18n.set_language("en")


def test_X_after_M_exports_the_merge_and_a_folder_in_the_way_is_replaced_only_after_y(finished):
    """The TUI cannot pass --out or --force: X after M reuses the merged folder (it is the export), and an
    earlier merge in the way that is not a whole merge of this checkpoint opens a dialog (n keeps it, y
    replaces it), never a dead end. A folder of the user's own there is never offered for replacing (y
    deleted it): the notification says what it holds and to move it, in the app's words."""
    import json

    home, run_id = finished
    merged = home / "runs" / run_id / "merged" / "checkpoint-30"
    merged.mkdir(parents=True)
    (merged / "notes.txt").write_text("the user's own file")

    def notes(app) -> list[str]:
        return [str(n.message) for n in app._notifications]

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("X")
            await wait_for(pilot, lambda: any("then press X again" in n for n in notes(app)), timeout=90)
            refusal = next(n for n in notes(app) if "then press X again" in n)
            assert "1 entry: notes.txt" in refusal and "--out" not in refusal and "--force" not in refusal
            assert isinstance(app.screen, DashboardScreen)  # no dialog: nothing to answer y to
            assert (merged / "notes.txt").read_text() == "the user's own file"
            await wait_for(pilot, lambda: not any(str(w.name).startswith("export:") and not w.is_finished
                                                  for w in app.workers))
            (merged / "notes.txt").unlink()  # an earlier merge there instead: asked first
            (merged / "tunedeck_merge.json").write_text(json.dumps({"checkpoint": "elsewhere", "step": 30}))
            await pilot.press("X")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=90)
            await pilot.pause()
            assert "Replace checkpoint-30?" in screen_text(app)
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            assert (merged / "tunedeck_merge.json").is_file()  # n kept it
            await wait_for(pilot, lambda: not any(str(w.name).startswith("export:") and not w.is_finished
                                                  for w in app.workers))
            await pilot.press("X")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=90)
            await pilot.press("y")
            await wait_for(pilot, lambda: any("exported merged model to" in n for n in notes(app)), timeout=120)
            assert (merged / "model.safetensors").is_file()
            assert json.loads((merged / "tunedeck_merge.json").read_text())["checkpoint"] != "elsewhere"
            # M then X: the merge is the export as it is
            await pilot.press("M")
            await wait_for(pilot, lambda: isinstance(app.screen, MergePanel))
            panel = app.screen
            await wait_for(pilot, lambda: panel.ended, timeout=90)
            assert panel.ok
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            await wait_for(pilot, lambda: not any(str(w.name).startswith("export:") and not w.is_finished
                                                  for w in app.workers))
            await pilot.press("X")
            await wait_for(pilot, lambda: any("already holds the whole merge" in n for n in notes(app)),
                           timeout=120)
            assert [n for n in app._notifications if n.severity == "error"] == [
                n for n in app._notifications if "then press X again" in str(n.message)], notes(app)
            assert isinstance(app.screen, DashboardScreen)

    asyncio.run(scenario())


@pytest.mark.parametrize("reply", ["\n" * 16, "line\n" * 40 + "x" * 400], ids=["blank", "long"])
def test_the_serve_panel_keeps_its_keys_on_80x24_whatever_the_test_reply(reply, tmp_path, monkeypatch):
    """A test reply of 16 newlines printed ~12 blank lines and pushed the panel's key hint off an 80x24
    screen. The reply is shown on one line (⏎ for line breaks, a blank one described), capped, and the hint
    stays. No server: start_server is held back, the reply is handed to the panel as the probe would."""
    import core.lifecycle.serve as lifecycle_serve
    from tui.widgets.lifecycle_panels import TestAnswered

    def no_server(*_args, **_kwargs):
        raise lifecycle_serve.ServeWaitCancelled("held back by the test")

    monkeypatch.setattr(lifecycle_serve, "start_server", no_server)
    run_dir = tmp_path / "20261205-0100-tiny"
    run_dir.mkdir()

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            panel = ServePanel(run_dir)
            await app.push_screen(panel)
            await pilot.pause()
            panel.post_message(TestAnswered(reply, 0.25))
            await wait_for(pilot, lambda: panel.reply == reply)
            await pilot.pause()
            text = screen_text(app)
            # the panel's text with its border taken off and its wrapped lines joined
            flat = " ".join(" ".join(line.strip(" │") for line in text.splitlines()).split())
            assert "t test request · y copy URL · k stop the server · Esc close" in flat, text
            assert "test request answered in 0.25 s" in flat, text
            if not reply.strip():
                assert "(a blank reply: 16 whitespace characters, 16 line breaks)" in flat, text
            else:
                assert "line⏎line⏎" in flat and "x" * 50 not in flat, text
            assert panel.query_one("#serve-test").region.height <= 5

    asyncio.run(scenario())


def test_the_serve_panel_says_starting_not_the_previous_servers_stopped_while_a_new_one_starts(
        tmp_path, monkeypatch):
    """v on a run whose previous server was stopped (or died) showed that server's record while the new one
    was being started (the checks, the backend's choice, the model's load): "Status stopped", its old URL
    and port, "Health not answering" and "the server is not running: v on the dashboard starts it again",
    which was untrue. The panel says "starting" until the start answers. No server: start_server is held
    until the test has looked."""
    import core.lifecycle.serve as lifecycle_serve
    from core.atomic_file import write_json_atomic
    from core.paths import data_root

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    run_dir = tmp_path / "20261205-0100-tiny"
    run_dir.mkdir()
    old = data_root() / "serve" / run_dir.name
    old.mkdir(parents=True)
    write_json_atomic(old / "state.json", {"status": "stopped", "pid": 999999999, "backend": "transformers",
                                           "url": "http://127.0.0.1:42081/v1", "port": 42081, "host": "127.0.0.1"})
    called, let_go = threading.Event(), threading.Event()

    def held_start(*_args, **_kwargs):
        called.set()
        let_go.wait(timeout=120)
        raise lifecycle_serve.ServeWaitCancelled("held back by the test")

    monkeypatch.setattr(lifecycle_serve, "start_server", held_start)
    reads = []
    real_read = lifecycle_serve.read_server_record

    def read_server_record(run_id):
        reads.append(run_id)
        return real_read(run_id)

    monkeypatch.setattr(lifecycle_serve, "read_server_record", read_server_record)

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            panel = ServePanel(run_dir)
            await app.push_screen(panel)
            await wait_for(pilot, called.is_set)
            # the health poller has read the old record and told the panel (its second look comes after)
            await wait_for(pilot, lambda: len(reads) >= 2)
            await pilot.pause()
            text = _flat(app)
            assert panel.phase() == "starting", text
            assert "Status starting" in text and "42081" not in text, text
            assert "the server is not running" not in text, text
            let_go.set()

    try:
        asyncio.run(scenario())
    finally:
        let_go.set()


def test_the_serve_panel_says_which_checkpoint_a_server_found_serves_and_that_it_is_not_the_newest(
        finished, monkeypatch):
    """v on a finished run found the server started while it trained, serving checkpoint 15 of 30, and the
    panel gave no checkpoint at all. It shows the step the server recorded, and the one v would serve
    beside it when that is another. The "server" is this test's own process in a record (pid alive, a
    backend without our lock), found and "ready" at once; its test request fails, as nothing listens."""
    import core.lifecycle.serve as lifecycle_serve
    from core.atomic_file import write_json_atomic
    from core.paths import data_root

    _home, run_id = finished
    run_dir = runs_dir() / run_id
    record = data_root() / "serve" / run_dir.name
    record.mkdir(parents=True)
    write_json_atomic(record / "state.json", {"status": "ready", "pid": os.getpid(), "backend": "vllm", "step": 15,
                                              "url": "http://127.0.0.1:9/v1", "port": 9, "host": "127.0.0.1"})
    monkeypatch.setattr(lifecycle_serve, "wait_until_ready",
                        lambda run_id, **_kwargs: lifecycle_serve.server_state(run_id))

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            panel = ServePanel(run_dir)
            await app.push_screen(panel)
            await wait_for(pilot, lambda: panel.started and panel.newest == 30 and panel.alive)
            await pilot.pause()
            text = _flat(app)
            assert "Checkpoint 15 (the run's newest is 30: k, then v, serves it)" in text, text
            assert "t test request · y copy URL · k stop the server · Esc close" in text, text

    asyncio.run(scenario())


def test_M_on_a_full_fine_tune_says_it_loads_the_fine_tuned_model_not_an_adapter(shared, private_home,
                                                                                   monkeypatch):
    """The merge panel of a method: full run said "✓ load the base model and the adapter" although there
    is none: the load step now says what it loads, and the adapter's fold is shown skipped."""
    home, run_id = finished_run(shared, method="full")
    monkeypatch.setenv("TUNEDECK_HOME", str(home))

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=run_id, persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_finished_dashboard(pilot, app)
            await pilot.press("M")
            await wait_for(pilot, lambda: isinstance(app.screen, MergePanel))
            panel = app.screen
            await wait_for(pilot, lambda: panel.ended, timeout=90)
            assert panel.ok and panel.stages == ["load", "write", "done"]
            await pilot.pause()
            text = screen_text(app)
            assert "✓ load the fine-tuned model (a full fine-tune: no adapter)" in text, text
            assert "base model and the adapter" not in text and "– fold the adapter" in text, text

    asyncio.run(scenario())


def test_the_apps_wording_of_each_refusal_takes_the_cli_messages_parameters_and_the_key():
    """Each LIFECYCLE_WORDING entry renders with the CLI message's parameters plus ``key`` (render_stored
    falls back to the CLI's text when one is missing), in both languages, and gives no --out / --force."""
    import string

    from core.i18n import catalogue
    from tui.widgets.lifecycle_panels import LIFECYCLE_WORDING

    for lang in ("en", "zh"):
        texts = catalogue(lang)
        for cli, app in LIFECYCLE_WORDING.items():
            names = {name for _, name, _, _ in string.Formatter().parse(texts[cli]) if name}
            app_names = {name for _, name, _, _ in string.Formatter().parse(texts[app]) if name}
            assert app_names <= names | {"key"}, (lang, app, app_names - names)
            assert "--out" not in texts[app] and "--force" not in texts[app], (lang, app)


def test_k_and_the_palettes_stop_server_before_the_server_has_a_process_say_it_is_still_starting(
        tmp_path, monkeypatch):
    """Right after v, before the new server had a process (the checks, the backend's choice), k said "no
    server is running" (and the palette's "stop server" did, or opened the confirm a moment later): untrue,
    the server came up and served. Both say it is still starting and to press k again, and ask nothing.
    No server: start_server is held back, so the panel stays before the process, whatever the box's speed."""
    import core.lifecycle.serve as lifecycle_serve
    from tests.tui.conftest import palette_search

    def no_server(*_args, **_kwargs):
        raise lifecycle_serve.ServeWaitCancelled("held back by the test")

    monkeypatch.setattr(lifecycle_serve, "start_server", no_server)
    run_dir = tmp_path / "20261205-0100-tiny"
    run_dir.mkdir()
    starting = f"the server of {run_dir.name} is still starting: press k again in a moment to stop it"

    async def scenario() -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            panel = ServePanel(run_dir)
            await app.push_screen(panel)
            await pilot.pause()
            assert panel.launching and not panel.alive
            await pilot.press("k")
            await wait_for(pilot, lambda: [n.message for n in app._notifications] == [starting])
            app.clear_notifications()
            await palette_search(pilot, app, "stop server", "stop server")
            await pilot.press("enter")
            await wait_for(pilot, lambda: [n.message for n in app._notifications] == [starting])
            assert app.screen is panel and not isinstance(app.screen, ConfirmScreen)

    asyncio.run(scenario())
