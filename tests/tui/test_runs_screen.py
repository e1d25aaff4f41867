"""The Runs screen: listing (crashed detection, runs appearing later), sort, filter, Enter, delete; the
columns that fit the width (80 columns without horizontal scrolling, the rest back as it grows); and
what the app does at start (the active run's dashboard, runs that ended since the last visit)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from textual.widgets import DataTable

from core.i18n import t
from core.paths import runs_dir
from core.text_width import cell_len
from core.watch.last_seen import last_seen_path
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import (
    assert_snapshot,
    fake_monitor,
    post_burst,
    quiet_settings,
    screen_text,
    wait_for,
)
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.screens.runs import RunsScreen, fit_columns, fit_id
from tui.widgets.confirm import ConfirmScreen
from tui.widgets.keys_footer import KeysFooter


def run(coro):
    return asyncio.run(coro)


def three_runs():
    root = runs_dir()
    live = build_run(root, "20261129-2300-live", status="running", steps=120, created="2026-11-29T23:00:00Z")
    build_run(root, "20261129-2200-done", status="finished", steps=600, created="2026-11-29T22:00:00Z")
    build_run(root, "20261129-2100-dead", status="running", steps=80, created="2026-11-29T21:00:00Z")
    return live


async def open_runs(pilot, app) -> RunsScreen:
    await pilot.press("r")
    await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.listed)
    await pilot.pause()
    return app.screen


def footer_keys(app) -> list[str]:
    return [key for key, _ in app.screen.query_one(KeysFooter).shown()]


def ids(screen: RunsScreen) -> list[str]:
    return [s.id for s in screen.shown]


def columns_shown(screen: RunsScreen) -> list[str]:
    return [str(key.value) for key in screen.query_one("#runs-table", DataTable).columns]


def assert_no_horizontal_scroll(app, screen: RunsScreen, width: int) -> str:
    """The table's content is no wider than its viewport, and no screen row is wider than the terminal."""
    table = screen.query_one("#runs-table", DataTable)
    assert table.virtual_size.width <= table.scrollable_content_region.width, (
        table.virtual_size, table.scrollable_content_region)
    assert table.max_scroll_x == 0 and not table.show_horizontal_scrollbar
    text = screen_text(app)
    assert max(cell_len(row) for row in text.split("\n")) <= width
    return text


def test_list_sort_filter_and_snapshot_at_80_columns():
    live = three_runs()

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
            async with app.run_test(size=(80, 24)) as pilot:
                screen = await open_runs(pilot, app)
                assert ids(screen) == ["20261129-2300-live", "20261129-2200-done", "20261129-2100-dead"]
                status = {s.id: s.status for s in screen.runs}
                assert status["20261129-2100-dead"] == "crashed"  # no supervisor holds its lock
                assert status["20261129-2300-live"] == "running"
                text = assert_no_horizontal_scroll(app, screen, 80)
                assert columns_shown(screen) == ["status", "id", "method", "progress", "loss", "tokens", "eta"]
                assert "crashed" in text and "120/600 20%" in text and "finished" in text
                # the steady rate (18,000 tokens a 1.5 s step), not the last interval's 12,416
                assert "20261129-2300-live" in text and "12,000" in text and "12:00" in text
                # the footer at 80 columns: ? first, then Enter (the table's own hidden Enter took the key)
                await wait_for(pilot, lambda: footer_keys(app)[:2] == ["?", "Enter"])
                assert text.splitlines()[-1].lstrip().startswith("? Help  Enter Open")
                await assert_snapshot(pilot, app, "runs_three_80x24")
                await pilot.press("s", "s")  # started (hidden at 80 columns) -> ETA -> status
                await pilot.pause()
                assert "sorted by Status" in screen_text(app)
                assert ids(screen) == ["20261129-2300-live", "20261129-2200-done", "20261129-2100-dead"]  # desc
                await pilot.press("S")
                assert ids(screen)[0] == "20261129-2100-dead"  # crashed < finished < running
                await pilot.press("f", *"fini")
                await pilot.pause()
                assert ids(screen) == ["20261129-2200-done"]
                await pilot.press("enter")  # keeps the filter, back to the table
                await pilot.pause()
                assert "filter 'fini'" in screen_text(app)
                await pilot.press("escape")
                await pilot.pause()
                assert len(screen.shown) == 3
                screen.query_one("#runs-table", DataTable).move_cursor(row=ids(screen).index("20261129-2200-done"))
                await pilot.press("enter")
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
                assert app.screen.source.run_id == "20261129-2200-done"

    run(scenario())


def test_a_run_whose_run_json_does_not_read_is_marked_and_its_reason_shown_when_highlighted():
    """The Runs list showed such a run with "–" for its model and nothing else; at 80 columns, where the model
    column is not shown, not even that. Its model cell says "run.json unreadable" (as `tunedeck runs` does),
    and the status line leads with why while the run is highlighted, at any width."""
    three_runs()
    torn = runs_dir() / "20261129-2200-done" / "run.json"
    torn.write_text('{"id": "torn', encoding="utf-8")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(pilot, app)
            table = screen.query_one("#runs-table", DataTable)
            status = screen.query_one("#runs-status")
            assert ids(screen)[0] != "20261129-2200-done" and "run.json" not in str(status.render())
            table.move_cursor(row=ids(screen).index("20261129-2200-done"))
            await wait_for(pilot, lambda: str(status.render()).startswith("run.json cannot be read (Unterminated"))
            assert "model" not in columns_shown(screen)
            table.move_cursor(row=0)
            await wait_for(pilot, lambda: "run.json" not in str(status.render()))
            await pilot.resize_terminal(160, 30)
            await wait_for(pilot, lambda: "model" in columns_shown(screen))
            row = table.get_row("20261129-2200-done")
            assert str(row[columns_shown(screen).index("model")]) == "run.json unreadable", row

    run(scenario())


def test_columns_follow_the_width_through_resizes():
    live = three_runs()
    every = ["status", "id", "model", "method", "gpus", "progress", "loss", "tokens", "started", "eta"]

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
            async with app.run_test(size=(160, 50)) as pilot:
                screen = await open_runs(pilot, app)
                assert columns_shown(screen) == every
                text = assert_no_horizontal_scroll(app, screen, 160)
                assert "Qwen/Qwen2.5-7B-Instruct" in text and "11-29 23:00" in text
                assert "s sort, f filter, Enter open" in text  # the key hint fits the status line here
                await assert_snapshot(pilot, app, "runs_three_160x50")
                for size, shown in (((80, 24), ["status", "id", "method", "progress", "loss", "tokens", "eta"]),
                                    ((100, 30), ["status", "id", "model", "method", "progress", "loss", "tokens",
                                                 "eta"]),
                                    ((40, 20), ["status", "id", "progress"]),
                                    ((160, 50), every)):
                    await pilot.resize_terminal(*size)
                    await wait_for(pilot, lambda shown=shown: columns_shown(screen) == shown)
                    await pilot.pause()
                    text = assert_no_horizontal_scroll(app, screen, size[0])
                    assert len(screen.shown) == 3
                    if size == (100, 30):
                        assert "Qwen/Qwen2.5-7B-In…" in text  # the model cut with an ellipsis (the ETA keeps room for h:mm:ss)
                    if size == (40, 20):
                        assert "live" in text and "20261129-2300-live" not in text  # the id's name part

    run(scenario())


def test_fit_columns_and_ids_measure_cells():
    natural = {"status": 8, "id": 43, "model": 30, "method": 5, "gpus": 15, "progress": 12, "loss": 6,
               "tokens": 5, "started": 11, "eta": 7}
    at_80 = fit_columns(78, natural)
    assert list(at_80) == ["status", "id", "method", "progress", "loss", "tokens", "eta"]
    assert sum(w + 2 for w in at_80.values()) == 78 and at_80["id"] == 21  # the id takes what is left
    wide = fit_columns(200, natural)
    assert len(wide) == 10 and wide["id"] == 43 and wide["gpus"] == 9  # gpus capped: "0,1,2,3,…"
    assert list(fit_columns(5, natural)) == ["status"]  # the first column always stays
    long_id = "20261130-0105-qwen2-5-7b-instruct-lora-a1b2"
    assert fit_id(long_id, 43) == long_id
    assert fit_id(long_id, 30) == "qwen2-5-7b-instruct-lora-a1b2"  # the date-time stamp goes first
    assert fit_id(long_id, 20) == "qwen2-5-7b-instruct…" and cell_len(fit_id(long_id, 20)) == 20
    wide_name = "20261130-0105-通义千问-微调-ab12"
    assert cell_len(fit_id(wide_name, 9)) <= 9 and fit_id(wide_name, 9).endswith("…")


def test_a_narrow_table_keeps_the_run_id_before_the_progress():
    """Between a status-only table and the one with room for both, the id (which run) comes first."""
    natural = {"status": 8, "id": 43, "model": 30, "method": 5, "gpus": 15, "progress": 12, "loss": 6,
               "tokens": 5, "started": 11, "eta": 7}
    for width in range(21, 34):
        shown = fit_columns(width, natural)
        assert list(shown) == ["status", "id"] and shown["id"] >= 8, (width, shown)
    for width in range(34, 40):  # enough for a short id and the progress: both
        shown = fit_columns(width, natural)
        assert list(shown) == ["status", "id", "progress"] and shown["id"] >= 8, (width, shown)


def test_the_shown_ids_hold_still_while_live_runs_change_between_listings(monkeypatch):
    """A live run's ETA (and speed, progress) changes width from one listing to the next; the id column takes
    what the others leave, so at 80 columns ``20261206-1037-conc-91c6`` and ``conc-91c6`` took turns every
    two seconds. The same runs listed again keep the same text in the id column."""
    from dataclasses import replace

    import core.runs
    from core.runs.listing import RunSummary

    base = [
        RunSummary(id="20261206-1039-long-demo-8268", status="stopped", reason="", created="2026-12-06T10:39:00Z",
                   model="tiny", method="full", step=264, total_steps=3000, run_dir="x", loss=2.3443,
                   steady_tokens_per_s=8476.2),
        RunSummary(id="20261206-1037-conc-91c6", status="running", reason="", created="2026-12-06T10:37:00Z",
                   model="tiny", method="full", step=8, total_steps=40, run_dir="y", loss=6.7425,
                   steady_tokens_per_s=110.9),
    ]
    # The live run's ETA: unknown, then either side of an hour, then unknown again; its speed drops below 10.
    listings = [[base[0], replace(base[1], eta_s=eta, steady_tokens_per_s=rate, step=step)]
                for eta, rate, step in ((None, None, 8), (3603.0, 110.9, 9), (3598.0, 9.5, 10), (None, 112.0, 11),
                                        (3610.0, 110.0, 12), (59.0, 111.0, 13))]
    calls: list[int] = []

    def list_runs():
        calls.append(1)
        return listings[min(len(calls), len(listings)) - 1]

    monkeypatch.setattr(core.runs, "list_runs", list_runs)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(pilot, app)
            table = screen.query_one("#runs-table", DataTable)
            shown: list[tuple[list[str], list[str]]] = []
            for count in range(1, len(listings) + 1):
                if count > 1:
                    screen.refresh_now()
                await wait_for(pilot, lambda count=count: len(calls) >= count and screen.runs is listings[count - 1])
                await pilot.pause()
                id_cells = [str(table.get_row(s.id)[columns_shown(screen).index("id")]) for s in screen.shown]
                shown.append((columns_shown(screen), id_cells))
                if count == 2:
                    assert "1:00:03" in screen_text(app)  # the widest ETA is shown, the id beside it
            assert all(each == shown[0] for each in shown), shown

    run(scenario())


def test_probe_runs_are_hidden_until_p_shows_them_dimmed():
    """The wizard's probe runs (a few steps each, several a probe) filled the list like training runs. They
    are hidden, the status line counts them, and p (offered only where there are any, in the footer, ?
    and Ctrl+P) shows them dimmed, then hides them again; `tunedeck runs --json` still lists them."""
    from core.runs.listing import list_runs
    from tui.screens.help import HelpScreen

    live = three_runs()
    root = runs_dir()
    for run_id in ("20261129-2330-probe-full-1gpu-1554", "20261129-2331-probe-lora-1gpu-a6b2"):
        build_run(root, run_id, status="finished", steps=6, total=6, created=f"2026-11-29T23:{run_id[11:13]}:00Z",
                  command="probe")
    real = ["20261129-2300-live", "20261129-2200-done", "20261129-2100-dead"]

    async def scenario():
        with SupervisorStandIn(live):  # (listing without it would record the live run crashed)
            assert sorted(s.id for s in list_runs() if s.probe) == ["20261129-2330-probe-full-1gpu-1554",
                                                                   "20261129-2331-probe-lora-1gpu-a6b2"]
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
            async with app.run_test(size=(80, 24)) as pilot:
                screen = await open_runs(pilot, app)
                status = screen.query_one("#runs-status")
                assert ids(screen) == real
                assert str(status.render()).startswith("3 runs, 1 active · sorted by Started (descending) · "
                                                       "2 probe runs hidden (p)")
                assert "probe" not in screen_text(app).split("\n", 2)[2]  # in the status line only
                assert screen.check_action("probes", ())
                await pilot.press("question_mark")
                await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
                assert "Show/hide probe runs" in screen_text(app)
                await pilot.press("escape")
                await wait_for(pilot, lambda: app.screen is screen)
                await pilot.press("p")
                await wait_for(pilot, lambda: len(ids(screen)) == 5)
                assert ids(screen)[:2] == ["20261129-2331-probe-lora-1gpu-a6b2", "20261129-2330-probe-full-1gpu-1554"]
                assert str(status.render()).endswith(" · probe runs dimmed (p)")
                table = screen.query_one("#runs-table", DataTable)
                for run_id in ids(screen):
                    styles = {str(cell.style) for cell in table.get_row(run_id)}
                    assert all("dim" in style for style in styles) == ("probe" in run_id), (run_id, styles)
                await pilot.press("p")
                await wait_for(pilot, lambda: ids(screen) == real)
                assert "2 probe runs hidden (p)" in str(status.render())

            # No probe runs: p is not offered.
            for run_id in ("20261129-2330-probe-full-1gpu-1554", "20261129-2331-probe-lora-1gpu-a6b2"):
                import shutil

                shutil.rmtree(root / run_id)
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
            async with app.run_test(size=(80, 24)) as pilot:
                screen = await open_runs(pilot, app)
                assert not screen.check_action("probes", ())
                assert "probe" not in str(screen.query_one("#runs-status").render())

    run(scenario())


def test_delete_is_not_offered_without_a_run():
    """With no runs the footer offered d (delete run), which did nothing. It is offered once there is a run
    to delete. (Fake 2×H200 box.)"""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
        async with app.run_test(size=(120, 24)) as pilot:
            screen = await open_runs(pilot, app)
            assert screen.shown == [] and not screen.check_action("delete", ())
            assert "d" not in footer_keys(app), footer_keys(app)
            build_run(runs_dir(), "20261129-2200-done", status="finished", steps=600)
            screen.refresh_now()
            await wait_for(pilot, lambda: len(screen.shown) == 1)
            await wait_for(pilot, lambda: "d" in footer_keys(app))

    run(scenario())


def test_the_empty_list_offers_the_wizard_not_keys_that_do_nothing():
    """With no runs the footer offered Enter (open dashboard), s (sort) and f (filter), which had nothing to act
    on. The wizard (w) that starts a run is offered first instead; the list's keys come with the first run.
    (Fake CPU box, 80x24.)"""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(pilot, app)
            keys = footer_keys(app)
            assert screen.shown == [] and keys[:2] == ["?", "w"], keys
            assert not {"Enter", "s", "S", "f"} & set(keys), keys
            titles = {command.title for command in app.get_system_commands(screen)}
            assert not {t("runs_screen.key.open"), t("runs_screen.key.sort"), t("runs_screen.key.filter")} & titles
            build_run(runs_dir(), "20261129-2200-done", status="finished", steps=600)
            screen.refresh_now()
            await wait_for(pilot, lambda: len(screen.shown) == 1)
            await wait_for(pilot, lambda: {"Enter", "s", "f"} <= set(footer_keys(app)))
            assert footer_keys(app)[1] == "Enter"  # the run's keys first again

    run(scenario())


def test_enter_opens_dashboard_and_new_runs_appear():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(120, 30)) as pilot:
            screen = await open_runs(pilot, app)
            assert screen.runs == [] and "No runs yet" in screen_text(app)
            # a run started from another terminal shows up on the next listing
            build_run(runs_dir(), "20261129-2200-later", status="finished", steps=60, total=60)
            await wait_for(pilot, lambda: len(screen.runs) == 1)
            await pilot.pause()
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            assert app.screen.source.run_id == "20261129-2200-later"
            await pilot.press("escape")
            await pilot.pause()
            assert app.screen is screen

    run(scenario())


def test_enter_reads_the_run_in_a_worker_then_opens_its_dashboard_or_says_why_not(monkeypatch):
    """open_dashboard read the run's directory (open_watch_source) on the UI thread: a slow disk froze the
    app on Enter. A worker reads it now; the dashboard opens as before, a directory that is none of the
    layouts says so as before, an unreadable one says which and what to do, and of two quick requests
    only the last one opens."""
    import threading
    from pathlib import Path

    import core.watch.source as watch_source
    import tui.screens.runs as runs_screen
    from core.i18n import t
    from tui.screens.runs import open_dashboard

    done = build_run(runs_dir(), "20261129-2200-done", status="finished", steps=60, total=60)
    other = build_run(runs_dir(), "20261129-2100-other", status="finished", steps=60, total=60)
    missing = runs_dir() / "20261129-2000-gone"
    locked = runs_dir() / "20261129-1900-locked"
    reads: list[tuple[Path, bool]] = []  # (directory, on the UI thread)
    reading: dict[threading.Thread, Path] = {}
    answers: list[tuple[Path, bool]] = []  # (directory, its worker cancelled): the last look before posting
    held = threading.Event()  # holds the read of `other` until the test lets it go
    real_open, real_current_worker = watch_source.open_watch_source, runs_screen.get_current_worker

    def open_watch_source(path):
        reads.append((Path(path), threading.current_thread() is threading.main_thread()))
        reading[threading.current_thread()] = Path(path)
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(locked / "run.json"))
        if Path(path) == other:
            held.wait(60)
        return real_open(path)

    def get_current_worker():
        worker = real_current_worker()
        if worker.group == "open-dashboard":  # (the runs list's worker asks too)
            answers.append((reading[threading.current_thread()], worker.is_cancelled))
        return worker

    monkeypatch.setattr(watch_source, "open_watch_source", open_watch_source)
    monkeypatch.setattr(runs_screen, "get_current_worker", get_current_worker)

    def notes(app) -> list[str]:
        return [str(n.message) for n in app._notifications]

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(pilot, app)
            await wait_for(pilot, lambda: len(screen.runs) == 2)
            screen.query_one("#runs-table", DataTable).move_cursor(row=ids(screen).index(done.name))
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            assert app.screen.source.run_id == done.name
            assert reads == [(done, False)]
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is screen)

            reads.clear()
            open_dashboard(app, missing)
            await wait_for(pilot, lambda: t("watch.not_a_dir", path=str(missing)) in notes(app))
            open_dashboard(app, locked)
            await wait_for(pilot, lambda: any(n.startswith(f"Cannot read {locked} to open its dashboard: "
                                                           "PermissionError") for n in notes(app)))
            await pilot.pause()
            assert app.screen is screen
            assert reads == [(missing, False), (locked, False)]

            answers.clear()
            open_dashboard(app, other)  # held in its read ...
            await wait_for(pilot, lambda: len(reads) == 3)
            open_dashboard(app, done)  # ... when a second request comes: the last one asked for opens
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            held.set()
            await wait_for(pilot, lambda: len(answers) == 2)
            assert answers == [(done, False), (other, True)]  # the first one, cancelled, posts nothing
            await pilot.pause()
            assert app.screen.source.run_id == done.name
            assert sum(isinstance(s, DashboardScreen) for s in app.screen_stack) == 1
            assert reads[2:] == [(other, False), (done, False)]

    try:
        run(scenario())
    finally:
        held.set()


def dashboard_reads_handled(app, monkeypatch) -> list[str]:
    """One entry per open_dashboard read, added once the read ended and whatever it posted was handled:
    its worker's last act queues a callback behind its answer on the app's queue (handled in order)."""
    handled: list[str] = []
    real_run_worker = app.run_worker

    def run_worker(work, *args, **kwargs):
        if kwargs.get("group") != "open-dashboard":
            return real_run_worker(work, *args, **kwargs)

        def read():
            try:
                work()
            finally:
                app.call_later(handled.append, "read")

        return real_run_worker(read, *args, **kwargs)

    monkeypatch.setattr(app, "run_worker", run_worker)
    return handled


def test_a_section_key_while_a_dashboard_is_read_cancels_it(monkeypatch):
    """Enter on a run, then m before its folder was read: the dashboard's answer came and pulled the user
    from the Models section back to Runs. A section key now cancels a pending open, whether its worker is
    still reading or has just looked whether it was cancelled and is posting its answer."""
    import threading

    import core.watch.source as watch_source
    import tui.screens.runs as runs_screen
    from tui.screens.gpus import GpuScreen
    from tui.screens.models import ModelsScreen

    done = build_run(runs_dir(), "20261129-2200-done", status="finished", steps=60, total=60)
    reading = threading.Event()  # a read started ...
    release = threading.Event()  # ... and waits for this
    hold = {"read": False, "check": False}
    checked = threading.Event()
    real_open, real_current_worker = watch_source.open_watch_source, runs_screen.get_current_worker

    def open_watch_source(path):
        reading.set()
        if hold["read"]:
            release.wait(60)
        return real_open(path)

    def get_current_worker():
        worker = real_current_worker()
        if worker.group != "open-dashboard" or not hold["check"]:
            return worker
        looked = SimpleNamespace(is_cancelled=worker.is_cancelled)  # not cancelled yet: it will post ...
        checked.set()
        release.wait(60)  # ... after the user went elsewhere
        return looked

    monkeypatch.setattr(watch_source, "open_watch_source", open_watch_source)
    monkeypatch.setattr(runs_screen, "get_current_worker", get_current_worker)

    async def enter_held(pilot, app, screen, held: str) -> list[str]:
        await pilot.press("r")
        await wait_for(pilot, lambda: app.screen is screen)
        hold.update(read=held == "read", check=held == "check")
        for event in (reading, release, checked):
            event.clear()
        handled = dashboard_reads_handled(app, monkeypatch)
        await pilot.press("enter")
        await wait_for(pilot, (checked if held == "check" else reading).is_set)
        return handled

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(pilot, app)
            await wait_for(pilot, lambda: ids(screen) == [done.name])

            handled = await enter_held(pilot, app, screen, held="")  # nothing held: the dashboard opens
            await wait_for(pilot, lambda: handled == ["read"])
            assert isinstance(app.screen, DashboardScreen) and app.screen.source.run_id == done.name

            handled = await enter_held(pilot, app, screen, held="read")  # m while the folder is read
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
            release.set()
            await wait_for(pilot, lambda: handled == ["read"])
            await pilot.pause()
            assert app.current_mode == "models" and isinstance(app.screen, ModelsScreen)

            handled = await enter_held(pilot, app, screen, held="check")  # g while its answer is posted
            await pilot.press("g")
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            release.set()
            await wait_for(pilot, lambda: handled == ["read"])
            await pilot.pause()
            assert app.current_mode == "gpus" and isinstance(app.screen, GpuScreen)
            assert not any(isinstance(s, DashboardScreen) for s in app.screen_stack)

            await pilot.press("r")  # and the Runs list is the list, no dashboard pushed over it meanwhile
            await wait_for(pilot, lambda: app.screen is screen)

    try:
        run(scenario())
    finally:
        release.set()


def test_a_screen_opened_while_a_dashboard_is_read_stays_on_top(monkeypatch):
    """Enter on a run, then ? (or Ctrl+P) before its folder was read: the dashboard's answer came and was
    pushed over the help screen (or the palette). Any change of the screen stack since the request now drops
    it, like a section key: the screen the user opened stays on top, and closing it shows the Runs list."""
    import threading

    from textual.command import CommandPalette

    import core.watch.source as watch_source
    from tui.screens.help import HelpScreen

    done = build_run(runs_dir(), "20261129-2200-done", status="finished", steps=60, total=60)
    reading, release = threading.Event(), threading.Event()
    real_open = watch_source.open_watch_source

    def open_watch_source(path):
        reading.set()
        release.wait(60)
        return real_open(path)

    monkeypatch.setattr(watch_source, "open_watch_source", open_watch_source)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(pilot, app)
            await wait_for(pilot, lambda: ids(screen) == [done.name])
            for key, opened in (("question_mark", HelpScreen), ("ctrl+p", CommandPalette)):
                reading.clear()
                release.clear()
                handled = dashboard_reads_handled(app, monkeypatch)
                await pilot.press("enter")
                await wait_for(pilot, reading.is_set)
                await pilot.press(key)
                await wait_for(pilot, lambda opened=opened: isinstance(app.screen, opened))
                release.set()
                await wait_for(pilot, lambda handled=handled: handled == ["read"])
                await pilot.pause()
                assert isinstance(app.screen, opened), (key, app.screen_stack)
                assert not any(isinstance(s, DashboardScreen) for s in app.screen_stack)
                await pilot.press("escape")
                await wait_for(pilot, lambda: app.screen is screen)

            handled = dashboard_reads_handled(app, monkeypatch)  # and with nothing opened, it opens
            await pilot.press("enter")
            await wait_for(pilot, lambda: handled == ["read"])
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))

    try:
        run(scenario())
    finally:
        release.set()


def test_help_opened_before_the_start_found_the_active_run_stays_on_top(monkeypatch):
    """At start the app re-attaches to the active run (its dashboard over the Runs list); ? pressed while
    the runs were still being listed got the dashboard pushed over the help screen. Help stays now."""
    import threading

    import core.runs
    import tui.screens.runs as runs_screen
    from tui.screens.help import HelpScreen

    live = three_runs()
    listing, release = threading.Event(), threading.Event()
    real_list_runs = core.runs.list_runs

    def list_runs(*args, **kwargs):
        listing.set()
        release.wait(60)
        return real_list_runs(*args, **kwargs)

    monkeypatch.setattr(core.runs, "list_runs", list_runs)

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), announce_runs=True)
            async with app.run_test(size=(80, 24)) as pilot:
                starts: list[str] = []
                real_open_dashboard, real_after_start = runs_screen.open_dashboard, runs_screen._after_start
                monkeypatch.setattr(runs_screen, "open_dashboard",
                                    lambda *a, **k: (starts.append("open"), real_open_dashboard(*a, **k)))
                monkeypatch.setattr(runs_screen, "_after_start",
                                    lambda *a: (real_after_start(*a), starts.append("after start")))
                await wait_for(pilot, listing.is_set)
                await pilot.press("question_mark")
                await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
                release.set()
                await wait_for(pilot, lambda: "after start" in starts)
                await pilot.pause()
                assert starts == ["after start"] and isinstance(app.screen, HelpScreen), app.screen_stack
                assert not any(isinstance(s, DashboardScreen) for s in app.screen_stack)

    try:
        run(scenario())
    finally:
        release.set()


def test_a_section_key_before_the_start_found_the_active_run_keeps_the_user_there(monkeypatch):
    """At start the app opens the active run's dashboard from the GPU screen (see the test above); a user
    who pressed m while the runs were still being listed stays on Models; the announcements still show."""
    import threading

    import core.runs
    import tui.screens.runs as runs_screen
    from tui.screens.models import ModelsScreen

    live = three_runs()
    last_seen_path().parent.mkdir(parents=True, exist_ok=True)
    last_seen_path().write_text('{"runs": {"20261129-2100-dead": "running"}}')
    listing, release = threading.Event(), threading.Event()
    real_list_runs = core.runs.list_runs

    def list_runs(*args, **kwargs):
        listing.set()
        release.wait(60)
        return real_list_runs(*args, **kwargs)

    monkeypatch.setattr(core.runs, "list_runs", list_runs)

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), announce_runs=True)
            async with app.run_test(size=(80, 24)) as pilot:
                starts: list[str] = []
                real_open_dashboard = runs_screen.open_dashboard
                monkeypatch.setattr(runs_screen, "open_dashboard",
                                    lambda *a, **k: (starts.append("open"), real_open_dashboard(*a, **k)))
                await wait_for(pilot, listing.is_set)
                await pilot.press("m")
                await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
                release.set()
                await wait_for(pilot, lambda: any("20261129-2100-dead ended: crashed" in str(n.message)
                                                  for n in app._notifications))
                await pilot.pause()  # (the announcements and the dashboard's request come in one callback)
                assert starts == [] and app.current_mode == "models" and isinstance(app.screen, ModelsScreen)

    try:
        run(scenario())
    finally:
        release.set()


def test_delete_asks_shows_size_and_refuses_active_runs():
    live = three_runs()

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
            async with app.run_test(size=(120, 30)) as pilot:
                screen = await open_runs(pilot, app)
                table = screen.query_one("#runs-table", DataTable)
                table.move_cursor(row=0)  # the live run
                await pilot.press("d")
                await pilot.pause()
                assert not isinstance(app.screen, ConfirmScreen)
                assert any("stop it before deleting" in str(n.message) for n in app._notifications)
                table.move_cursor(row=1)  # finished
                await pilot.press("d")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                text = screen_text(app)
                assert "Delete run 20261129-2200-done?" in text and " kB" in text
                await pilot.press("n")
                await pilot.pause()
                assert (runs_dir() / "20261129-2200-done").is_dir()
                await pilot.press("d")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                await pilot.press("y")
                await wait_for(pilot, lambda: not (runs_dir() / "20261129-2200-done").exists())
                await wait_for(pilot, lambda: len(screen.runs) == 2)
                assert live.is_dir()

    run(scenario())


def test_app_start_opens_the_active_run_and_announces_ended_runs():
    live = three_runs()
    last_seen_path().parent.mkdir(parents=True, exist_ok=True)
    last_seen_path().write_text('{"runs": {"20261129-2100-dead": "running", "20261129-2200-done": "finished"}}')

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), announce_runs=True)
            async with app.run_test(size=(120, 30)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
                assert app.screen.source.run_id == "20261129-2300-live"
                await wait_for(pilot, lambda: any("20261129-2100-dead ended: crashed" in str(n.message)
                                                  for n in app._notifications))
                notes = [str(n.message) for n in app._notifications]
                assert not any("2200-done" in n for n in notes)  # seen finished last time

    run(scenario())
    assert '"20261129-2100-dead": "crashed"' in last_seen_path().read_text()


def test_app_start_on_a_disk_it_cannot_write_still_opens_the_active_run():
    """The start records which runs the user has seen end (``watch-last-seen.json``); on a read-only or full
    data root that write raised into the start's worker: an error modal ("OSError: Read-only file system")
    over a blank GPU screen, and the live run's dashboard never opened. The start goes on now. The file is
    a folder here, which fails the write as a read-only disk does (the tests may run as root)."""
    from tui.screens.error_modal import ErrorModal

    live = three_runs()
    last_seen_path().mkdir(parents=True)

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), announce_runs=True)
            async with app.run_test(size=(80, 24)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, (DashboardScreen, ErrorModal)))
                assert isinstance(app.screen, DashboardScreen), app.screen_stack
                assert app.screen.source.run_id == "20261129-2300-live"
                assert not any(isinstance(s, ErrorModal) for s in app.screen_stack)

    run(scenario())


def test_app_start_neither_opens_nor_announces_the_wizards_probe_runs():
    """A probe run (a few steps to measure a plan) is not the run a user came back to, nor news when it ends."""
    root = runs_dir()
    build_run(root, "20261129-2300-probe-full-1gpu-1554", status="running", steps=5, created="2026-11-29T23:00:00Z",
              command="probe")
    build_run(root, "20261129-2250-probe-lora-1gpu-a6b2", status="finished", steps=10,
              created="2026-11-29T22:50:00Z", command="probe")
    live = build_run(root, "20261129-2200-live", status="running", steps=120, created="2026-11-29T22:00:00Z")
    last_seen_path().parent.mkdir(parents=True, exist_ok=True)
    last_seen_path().write_text('{"runs": {"20261129-2250-probe-lora-1gpu-a6b2": "running"}}')

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), announce_runs=True)
            async with app.run_test(size=(120, 30)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
                assert app.screen.source.run_id == "20261129-2200-live"  # the newest live run is a probe
                assert not any("probe" in str(n.message) for n in app._notifications)

    run(scenario())


def test_a_run_the_runs_list_shows_finishing_is_not_announced_at_the_next_start():
    """The user watched a run finish in the app; the next start said "since your last visit, run X
    ended: finished". The runs list records a run it shows going from live to final as seen."""
    from core.runs import RunDirectory

    live = three_runs()
    last_seen_path().parent.mkdir(parents=True, exist_ok=True)
    last_seen_path().write_text('{"runs": {}}')

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
            async with app.run_test(size=(120, 30)) as pilot:
                screen = await open_runs(pilot, app)
                await wait_for(pilot, lambda: any(s.id == live.name and s.status == "running" for s in screen.runs))
                RunDirectory(live).write_status("finished")
                await wait_for(pilot, lambda: f'"{live.name}": "finished"' in last_seen_path().read_text(),
                               timeout=30)

    run(scenario())
    from core.watch.last_seen import load_last_seen

    assert load_last_seen()[live.name] == "finished"
    assert "20261129-2200-done" not in load_last_seen()  # shown final all along: not "seen ending"


def test_the_resume_question_says_cpu_for_a_cpu_run_and_gpus_for_a_gpu_run():
    """The resume question said "It continues … on the same GPUs." for a run that trains on the CPU; it
    says "on the CPU" there now, in the Runs screen and on the dashboard."""
    import json

    from tests.tui.test_dashboard_render import add_checkpoint

    root = runs_dir()
    cpu = build_run(root, "20261129-2200-oncpu", status="stopped", steps=30, gpus=(), created="2026-11-29T22:00:00Z")
    metrics = cpu / "metrics.jsonl"  # its trainer's header says where it trained
    lines = metrics.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "device": "cpu", "gpu_names": [], "world_size": 1})
    metrics.write_text("\n".join(lines) + "\n")
    gpu = build_run(root, "20261129-2100-ongpu", status="stopped", steps=30, created="2026-11-29T21:00:00Z")
    for each in (cpu, gpu):
        add_checkpoint(each, 30)  # what resume needs to be offered

    async def question(app, pilot) -> str:
        await pilot.press("u")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        text = " ".join(screen_text(app).replace("│", " ").split())  # the dialog's words, unwrapped
        await pilot.press("n")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))
        return text

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(120, 30)) as pilot:
            screen = await open_runs(pilot, app)
            table = screen.query_one("#runs-table", DataTable)
            assert ids(screen) == ["20261129-2200-oncpu", "20261129-2100-ongpu"]
            table.move_cursor(row=0)
            text = await question(app, pilot)
            assert "on the CPU." in text and "GPUs" not in text, text
            table.move_cursor(row=1)
            text = await question(app, pilot)
            assert "on the same GPUs." in text and "CPU" not in text, text
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=str(cpu))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.status == "stopped")
            text = await question(app, pilot)
            assert "on the CPU." in text and "GPUs" not in text, text

    run(scenario())


def test_home_and_end_go_to_the_first_and_last_run_and_a_delete_keeps_the_place():
    """Help listed "Home  Home" and "End  End" on the Runs screen, and neither key moved the row cursor
    (DataTable's own scroll a row table sideways). They go to the first and the last run now, and help says
    so. Deleting a run put the cursor back on the first row; it stays on the run that took its place."""
    root = runs_dir()
    for hour in (20, 21, 22, 23):
        build_run(root, f"20261129-{hour}00-run{hour}", status="finished", steps=30,
                  created=f"2026-11-29T{hour}:00:00Z")
    newest_first = [f"20261129-{hour}00-run{hour}" for hour in (23, 22, 21, 20)]

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(120, 30)) as pilot:
            screen = await open_runs(pilot, app)
            table = screen.query_one("#runs-table", DataTable)
            assert ids(screen) == newest_first and app.focused is table
            await pilot.press("end")
            await wait_for(pilot, lambda: table.cursor_row == 3)
            await pilot.press("home")
            await wait_for(pilot, lambda: table.cursor_row == 0)
            rows = dict(row for _, section in app.key_table(app.screen) for row in section)
            assert rows.get("Home") == "first run" and rows.get("End") == "last run", rows
            assert "Home" not in rows.values() and "End" not in rows.values(), rows

            table.move_cursor(row=1)  # run22
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: ids(screen) == [newest_first[0], *newest_first[2:]])
            await pilot.pause()
            assert table.cursor_row == 1 and ids(screen)[table.cursor_row] == newest_first[2]  # the next one
            table.move_cursor(row=2)  # the last run: the one before it takes the cursor
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: ids(screen) == newest_first[:1] + newest_first[2:3])
            await pilot.pause()
            assert table.cursor_row == 1

    run(scenario())


def test_keys_typed_in_one_burst_after_f_go_to_the_filter():
    """f then "long" sent in one write (tmux send-keys, a paste, keystrokes a slow SSH link bundles) left the app
    on the GPUs screen: the filter got the focus only after a refresh, and the g before that went to the app's
    "go to GPUs". Every key after f goes to the filter now, and f itself is not typed into it. No GPUs needed
    (the CPU recording); the keys are posted to the app at once, as a terminal read delivers them."""

    root = runs_dir()
    build_run(root, "20261129-2300-long", status="finished", steps=600, created="2026-11-29T23:00:00Z")
    build_run(root, "20261129-2200-short", status="finished", steps=600, created="2026-11-29T22:00:00Z")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(pilot, app)
            box = screen.query_one("#runs-filter")
            post_burst(app, "flong")
            await wait_for(pilot, lambda: box.value == "long")
            await pilot.pause()
            assert app.current_mode == "runs" and app.screen is screen and app.focused is box
            assert ids(screen) == ["20261129-2300-long"]
            await pilot.press("escape")  # the filter cleared, back to the table
            await wait_for(pilot, lambda: not box.display and len(screen.shown) == 2)
            post_burst(app, "fgr")
            await wait_for(pilot, lambda: box.value == "gr")
            await pilot.pause()
            assert app.current_mode == "runs" and box.value == "gr" and screen.shown == []

    run(scenario())


def test_deleting_a_served_run_looks_for_its_server_once_before_stopping_it(monkeypatch):
    """The delete looked for the run's server (``server_state``) and ``stop_server`` looked again at once,
    before the same stop. Once now before the stop (and once after the folder is gone, for a server started
    meanwhile). The server is a stand-in: a sleeping process in its own session filed as the run's; no GPU."""
    import json
    import subprocess

    from core.lifecycle import serve

    path = build_run(runs_dir(), "20261129-2200-served", status="finished", steps=20)
    server = subprocess.Popen(["sleep", "60"], start_new_session=True)
    url = "http://127.0.0.1:8123/v1"
    (serve.serve_dir(path.name) / "state.json").write_text(json.dumps(
        {"pid": server.pid, "url": url, "host": "127.0.0.1", "port": 8123, "backend": "vllm", "status": "ready",
         "run": str(path)}))
    looks: list[str] = []
    real_state = serve.server_state

    def server_state(run_id):
        looks.append(run_id)
        return real_state(run_id)

    monkeypatch.setattr(serve, "server_state", server_state)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(120, 30)) as pilot:
            screen = await open_runs(pilot, app)
            screen.query_one("#runs-table", DataTable).move_cursor(row=[s.id for s in screen.shown].index(path.name))
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert url in " ".join(screen_text(app).split())  # the dialog says it is served
            looks.clear()
            await pilot.press("y")
            await wait_for(pilot, lambda: any(f"its server at {url} was stopped" in str(n.message)
                                              for n in app._notifications))
            assert not path.exists() and looks == [path.name, path.name]

    try:
        run(scenario())
        assert server.wait(timeout=30) is not None  # stopped by the delete
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_the_palette_offers_clear_filter_only_while_a_filter_is_set():
    """QA: Ctrl+P on the Runs screen offered "Clear filter (Esc)" with no filter set. It is there while the
    filter box is open or a filter narrows the list, and gone again once Esc cleared it."""
    three_runs()
    clear = t("runs_screen.key.clear")

    def titles(app) -> set[str]:
        return {command.title for command in app.get_system_commands(app.screen)}

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(pilot, app)
            assert clear not in titles(app)
            await pilot.press("f")
            await pilot.pause()
            assert clear in titles(app)  # the box is open: Esc closes it
            await pilot.press(*"fini", "enter")
            await pilot.pause()
            assert ids(screen) == ["20261129-2200-done"] and clear in titles(app)
            await pilot.press("escape")
            await pilot.pause()
            assert len(screen.shown) == 3 and clear not in titles(app)

    run(scenario())
