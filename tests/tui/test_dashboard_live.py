"""The dashboard on a run being written: a background writer with torn lines, truncation, the log search,
stop with confirmation (a real process gets a real SIGTERM), copy, config, axis toggle, alerts."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from textual.widgets._toast import Toast

from core.atomic_file import write_json_atomic
from core.i18n import t
from core.paths import runs_dir
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run, train_record
from tests.tui.conftest import fake_monitor, post_burst, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.widgets.confirm import ConfirmScreen
from tui.widgets.log_pane import LogPane
from tui.widgets.text_modal import TextModal

ROOT = Path(__file__).parents[2]


def run(coro):
    return asyncio.run(coro)


async def dashboard(pilot, app, status="running") -> DashboardScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
    screen = app.screen
    await wait_for(pilot, lambda: screen.status == status and screen.series.train_records > 0)
    return screen


def messages(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


def test_follows_a_writer_with_torn_lines_then_a_truncation():
    path = build_run(runs_dir(), "20261129-2100-live", status="running", steps=20, total=400)
    stop = threading.Event()
    written = {"step": 20}

    def writer() -> None:
        with open(path / "metrics.jsonl", "ab", buffering=0) as metrics, open(path / "train.log", "ab", buffering=0) as log:
            for step in range(21, 121):
                line = (json.dumps(train_record(step, 400)) + "\n").encode()
                half = len(line) // 2
                metrics.write(line[:half])  # a reader may see half a record here
                time.sleep(0.002)
                metrics.write(line[half:])
                log.write(b"[rank 0] step %d/400\n" % step)
                written["step"] = step
                time.sleep(0.005)
        stop.set()

    async def scenario():
        with SupervisorStandIn(path):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
            async with app.run_test(size=(120, 40)) as pilot:
                screen = await dashboard(pilot, app)
                thread = threading.Thread(target=writer)
                thread.start()
                await wait_for(pilot, lambda: screen.series.latest.get("step") == 120)
                thread.join()
                assert screen.series.train_records == 120  # each record once, none torn
                assert screen.series.series("loss").points == 120
                pane = screen.query_one("#dash-log", LogPane)
                await wait_for(pilot, lambda: pane.lines and pane.lines[-1] == "[rank 0] step 120/400")
                screen._redraw()
                await pilot.pause()
                assert "step 120/400" in screen_text(app)
                # The file is truncated and rewritten (a restarted run): the dashboard starts over.
                with open(path / "metrics.jsonl", "w") as handle:
                    handle.write(json.dumps(train_record(1, 50)) + "\n" + json.dumps(train_record(2, 50)) + "\n")
                await wait_for(pilot, lambda: screen.series.train_records == 2)
                assert screen.series.latest["total_steps"] == 50

    run(scenario())


def test_search_toggle_axis_config_and_copy(monkeypatch):
    path = build_run(runs_dir(), "20261129-2100-keys", status="finished", steps=600, log_lines=300)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=str(path))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await dashboard(pilot, app, "finished")
            pane = screen.query_one("#dash-log", LogPane)
            await wait_for(pilot, lambda: len(pane.lines) == 300)
            await pilot.press("s")
            await pilot.pause()
            assert screen.focused.id == "dash-search"
            await pilot.press(*"step 59", "enter")
            await pilot.pause()
            # "step 59" matches steps 590-599 (step 59 itself is not in the log tail)
            assert len(pane.matches) == 10 and pane.lines[pane.matches[pane.current]].startswith("[rank 0] step 599/")
            await pilot.press("n")
            assert pane.lines[pane.matches[pane.current]].startswith("[rank 0] step 590/")  # wrapped around
            await pilot.press("N", "N")
            assert pane.lines[pane.matches[pane.current]].startswith("[rank 0] step 598/")
            await pilot.press("x")
            await pilot.pause()
            assert screen.axis == "time" and "x: time" in screen_text(app)
            assert "15:00" in screen_text(app)  # the time axis ends at the elapsed time
            readers = []
            real_read_text = Path.read_text

            def read_text(self, *args, **kwargs):
                if self.name == "config.yaml":
                    readers.append(threading.current_thread() is threading.main_thread())
                return real_read_text(self, *args, **kwargs)

            monkeypatch.setattr(Path, "read_text", read_text)
            await pilot.press("c")  # the file is read in a worker: the modal comes once it is read
            await wait_for(pilot, lambda: isinstance(app.screen, TextModal))
            await pilot.pause()
            assert "learning_rate: 0.0002" in screen_text(app)
            assert readers == [False]  # read once, not on the UI thread
            await pilot.press("escape")
            await pilot.pause()
            await pilot.press("y")
            await pilot.pause()
            # the run's own config by its absolute path, not the launch's relative plan file
            command = f"tunedeck train {(path / 'config.yaml').resolve()}"
            assert app.clipboard == command
            assert any(command in m for m in messages(app))
            await pilot.press("escape")
            await pilot.pause()
            assert app.current_mode == "runs" and not isinstance(app.screen, DashboardScreen)

    run(scenario())


def test_stop_asks_then_signals_the_supervisor():
    path = build_run(runs_dir(), "20261129-2100-stop", status="running", steps=30)
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/fixtures/watch/fake_supervisor.py"), str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"

        async def scenario():
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
            async with app.run_test(size=(120, 40)) as pilot:
                screen = await dashboard(pilot, app)
                await pilot.press("k")
                await pilot.pause()
                assert isinstance(app.screen, ConfirmScreen) and "Stop run" in screen_text(app)
                await pilot.press("n")  # cancelled: nothing happens
                await pilot.pause()
                assert proc.poll() is None
                await pilot.press("k")
                await pilot.pause()
                await pilot.press("y")
                await wait_for(pilot, lambda: screen.status == "stopped")
                assert proc.wait(timeout=60) == 0
                await wait_for(pilot, lambda: any("stopped" in m for m in messages(app)))
                await pilot.press("y")  # a stopped run too copies the command that reproduces it (u resumes)
                assert app.clipboard == f"tunedeck train {(path / 'config.yaml').resolve()}"

        run(scenario())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_the_stop_of_a_run_still_starting_promises_no_checkpoint():
    """Stopped while it loads its model and data, a run ends before its first step without a checkpoint, and
    nothing resumes it: the question said "It saves a checkpoint and exits; resume it later with u"."""
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = build_run(runs_dir(), "20261129-2100-starting", status="starting", steps=0, created=now)
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/fixtures/watch/fake_supervisor.py"), str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"

        async def scenario():
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
            async with app.run_test(size=(80, 24)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
                screen = app.screen
                await wait_for(pilot, lambda: screen.status == "starting")
                await pilot.press("k")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                text = " ".join(screen_text(app).split())
                assert "still starting" in text and "saves a checkpoint" not in text, text
                # true of a resumed run too: its earlier attempts' checkpoints stay
                assert "earlier attempt saved one" in text, text
                await pilot.press("y")
                await wait_for(pilot, lambda: any("still starting" in m for m in messages(app)))

        run(scenario())
        assert proc.wait(timeout=60) == 0  # the stop reached the supervisor
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_alerts_nan_and_bell():
    path = build_run(runs_dir(), "20261129-2100-nan", status="running", steps=40, nan_at=40)

    async def scenario():
        with SupervisorStandIn(path):
            app = make_app(quiet_settings(bell=True), monitor=fake_monitor("h200x2"), open_run=str(path))
            bells = []
            app.bell = lambda: bells.append(1)
            async with app.run_test(size=(120, 40)) as pilot:
                await dashboard(pilot, app)
                await wait_for(pilot, lambda: any("NaN" in m for m in messages(app)))
                assert bells

    run(scenario())


def test_run_finishing_while_watched_is_announced():
    path = build_run(runs_dir(), "20261129-2100-end", status="running", steps=40)

    async def scenario():
        stand_in = SupervisorStandIn(path).__enter__()
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await dashboard(pilot, app)
            # atomically, as the supervisor writes it: a reader must never see half a status file
            write_json_atomic(path / "status.json", {"status": "finished", "reason": "", "updated": "",
                                                     "updated_ts": 2.0})
            stand_in.__exit__()
            await wait_for(pilot, lambda: screen.status == "finished", timeout=30)
            # the screen's notification reaches the app as a message of its own: wait for it too
            await wait_for(pilot, lambda: any("20261129-2100-end finished" in m for m in messages(app)))

    run(scenario())


def test_an_unreadable_run_json_is_said_in_the_header_and_the_rest_still_shows(monkeypatch):
    """A run.json that does not read (permission denied, bad JSON) stopped the file watcher: "Watching the
    run failed", no metrics, no logs, no GPU charts. It is a state now: a notification says which file,
    why and what to do, the header keeps saying it; metrics, logs and the GPU charts still come; once the
    file reads, the header clears and the charts keep the run's GPUs."""
    from core.i18n import t

    path = build_run(runs_dir(), "20261129-2100-live", status="running", steps=20, total=400, gpus=(1,))
    record = path / "run.json"
    denied = {"on": False}
    real_read_text = Path.read_text

    def read_text(self, *args, **kwargs):
        if denied["on"] and self == record:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)

    def info(screen) -> str:
        return " ".join(str(screen.query_one("#dash-info").render()).split())

    async def scenario(reason: str) -> None:
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await dashboard(pilot, app)
            await wait_for(pilot, lambda: screen.record_unreadable == reason)
            await wait_for(pilot, lambda: screen.query_one("#dash-log", LogPane).lines
                           and screen.gpu_charts and screen.gpu_util)
            assert sorted(screen.gpu_util) == [0, 1]  # the run's GPUs unknown: the box's
            said = t("dashboard.record_unreadable", dir=str(path), reason=reason)
            assert said.startswith(f"run.json in {path} cannot be read: {reason}. ") and said in messages(app)
            assert not any("failed" in m for m in messages(app)), messages(app)
            assert t("dashboard.record_unreadable_short", reason=reason) in info(screen), info(screen)
            screen._redraw()
            await pilot.pause()
            text = screen_text(app)
            assert "run.json cannot be read" in text and "step 20/400" in text, text

            denied["on"] = False  # the user fixed the file: the header clears, the run's GPU stays
            record.write_text(good, encoding="utf-8")
            await wait_for(pilot, lambda: screen.record_unreadable == "" and screen.gpu_indices == [1])
            assert sorted(screen.gpu_util) == [1]
            assert "run.json" not in info(screen)
            assert messages(app).count(said) == 1  # said once, not at every read

    with SupervisorStandIn(path):  # a live run: its status reads run.json's supervisor too
        good = record.read_text(encoding="utf-8")
        denied["on"] = True
        run(scenario("Permission denied"))
        record.write_text("{not json", encoding="utf-8")
        run(scenario("Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"))


def test_keys_typed_in_one_burst_after_s_go_to_the_search():
    """s then "gpu" in one write (tmux, a paste, a slow SSH link) went on as keys before the search had the focus
    (g: the GPUs screen). They go to the search now, s not typed into it. A finished run's folder; the keys are
    posted to the app at once, as a terminal read delivers them."""

    path = build_run(runs_dir(), "20261129-2100-burst", status="finished", steps=600, log_lines=30)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await dashboard(pilot, app, "finished")
            post_burst(app, "sgpu")
            box = screen.query_one("#dash-search")
            await wait_for(pilot, lambda: box.value == "gpu")
            await pilot.pause()
            assert app.screen is screen and screen.focused is box and box.value == "gpu"

    run(scenario())


def test_a_search_that_finds_nothing_in_a_long_logs_tail_says_older_lines_are_not_loaded():
    """The log panel holds the last LOG_TAIL_BYTES of the log; a search that found nothing there said
    "0 lines match" though the file may hold the line further up. It says what it searched and where the
    whole log is. A finished run's folder, a log of ~300 KB; GPUs are not needed (h200x1 fake)."""
    from core.watch.feed import LOG_TAIL_BYTES

    path = build_run(runs_dir(), "20261129-2100-long-log", status="finished", steps=600, log_lines=30)
    filler = "x" * 90
    lines = ["needle in the first lines"] + [f"line {i} {filler}" for i in range(3000)]
    (path / "train.log").write_text("\n".join(lines) + "\n")
    assert (path / "train.log").stat().st_size > 2 * LOG_TAIL_BYTES

    async def search(pilot, screen, text: str) -> None:
        await pilot.press("s")
        await wait_for(pilot, lambda: screen.focused is not None and screen.focused.id == "dash-search")
        await pilot.press(*text, "enter")
        await pilot.pause()

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=str(path))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await dashboard(pilot, app, "finished")
            pane = screen.query_one("#dash-log", LogPane)
            await wait_for(pilot, lambda: pane.lines and pane.lines[-1].startswith("line 2999 "))
            await search(pilot, screen, "needle")
            said = messages(app)[-1]
            assert "older lines are not loaded" in said and f"tunedeck logs {path.name}" in said, said
            assert f"last {len(pane.lines)} loaded" in said and not pane.holds_all
            await search(pilot, screen, "line 2999 ")  # one in the tail: found, as before
            assert messages(app)[-1] == "1 line matches 'line 2999'"  # not "1 lines match … (n next, N previous)"
            await search(pilot, screen, "line 29")
            assert messages(app)[-1].endswith(" lines match 'line 29' (n next, N previous)")

    run(scenario())


def test_a_log_search_for_bracketed_text_says_it_as_typed():
    """Log lines begin with "[rank0]": a search for it said "19 lines match ' 02'" (the brackets read as
    markup), and one for "[/x]" ended the app with a MarkupError traceback. A finished run at 80×24."""
    path = build_run(runs_dir(), "20261129-2100-brackets", status="finished", steps=600, log_lines=30)
    with open(path / "train.log", "a") as log:
        log.write("[rank0] [/x] closing tag\n")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=str(path))
        async with app.run_test(size=(80, 24), notifications=True) as pilot:  # the toasts drawn, as in use
            screen = await dashboard(pilot, app, "finished")
            pane = screen.query_one("#dash-log", LogPane)
            await wait_for(pilot, lambda: pane.lines and pane.lines[-1].endswith("closing tag"))
            for text in ("[rank0]", "[/x]"):
                await pilot.press("s")
                await wait_for(pilot, lambda: screen.focused is not None and screen.focused.id == "dash-search")
                await pilot.press(*text, "enter")
                said = f"'{text}'"
                await wait_for(pilot, lambda said=said: any(said in str(toast.render()) for toast in app.screen.query(Toast)))
                await pilot.pause()
                assert app.is_running

    run(scenario())


def test_next_and_previous_match_are_offered_only_once_a_log_search_was_made():
    """QA: the dashboard's help (and palette) listed n/N, next and previous match, before any search, where
    they go nowhere. They come with the first search and stay for the next ones. A finished run at 80×24."""
    path = build_run(runs_dir(), "20261129-2100-find", status="finished", steps=600, log_lines=300)
    match_keys = {t("dashboard.key.next"), t("dashboard.key.prev")}

    def offered(app) -> set[str]:
        help_rows = {name for _, rows in app.key_table(app.screen) for _, name in rows}
        palette = {command.title for command in app.get_system_commands(app.screen)}
        return (help_rows | palette) & match_keys

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await dashboard(pilot, app, "finished")
            pane = screen.query_one("#dash-log", LogPane)
            await wait_for(pilot, lambda: len(pane.lines) == 300)
            assert offered(app) == set()
            await pilot.press("n")  # not offered, and does nothing
            await pilot.pause()
            assert not any(t("dashboard.search_none") in m for m in messages(app))
            await pilot.press("s")
            await wait_for(pilot, lambda: screen.focused is not None and screen.focused.id == "dash-search")
            await pilot.press(*"step 59", "enter")
            await wait_for(pilot, lambda: offered(app) == match_keys)
            await pilot.press("question_mark")
            await pilot.pause()
            assert t("dashboard.key.next") in screen_text(app)

    run(scenario())


def test_the_disk_alert_names_the_folder_whose_disk_it_measured(tmp_path, monkeypatch):
    """The dashboard measures the free space of the run's own folder, and its alert named the data root
    ("0.4 GiB free under ~/.local/share/tunedeck") whatever the folder: a run on another disk (watch DIR, a
    copied run on a mount) sent the user to clean a disk that had room. It names the folder measured."""
    import shutil
    from collections import namedtuple

    from core.paths import data_root
    from tui.screens.dashboard import feed

    path = build_run(tmp_path / "other-disk", "20261129-2100-elsewhere", status="finished", steps=60)
    usage = namedtuple("usage", "total used free")
    real = shutil.disk_usage

    def disk_usage(where):  # the run's disk nearly full; every other disk (the data root's) as it is
        if Path(where) == path:
            return usage(100 * 1024**3, 99 * 1024**3, 1024**3)
        return real(where)

    monkeypatch.setattr(feed.shutil, "disk_usage", disk_usage)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            await dashboard(pilot, app, "finished")
            await wait_for(pilot, lambda: any("Disk nearly full" in m for m in messages(app)))
            alert = next(m for m in messages(app) if "Disk nearly full" in m)
            assert alert == f"Disk nearly full: 1.0 GiB free under {path}", (alert, str(data_root()))

    run(scenario())
