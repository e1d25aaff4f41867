"""The app's one GPU poll (issue #14 item 5): one backend read per interval for every screen, the interval
keys and a signal's re-poll act on it, one history feeds the GPU screen's cards and a dashboard's GPU
charts, it stops when no screen watches, and its failures are reported once, where they belong.

Hardware: the recorded two-H200 box (``h200x2``), replayed by fake NVML through the real wrapper."""

from __future__ import annotations

import asyncio
import time

from core.hardware.fake_nvml import fake_monitor_from_recording
from core.paths import runs_dir
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import GPU_FIXTURES, StepClock, fake_monitor, quiet_settings, screen_text, wait_for
from tests.tui.test_gpu_screen import feed_history, open_gpus
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.screens.error_modal import ErrorModal
from tui.screens.gpus import GpuCard, GpuScreen


def run(coro):
    return asyncio.run(coro)


class CountingBackend:
    """The fake GPUs' backend, counting its reads (one NVML round each)."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.reads = 0

    def read(self):
        self.reads += 1
        return self.backend.read()

    def close(self) -> None:
        self.backend.close()


def counted_monitor(clock=time.monotonic):
    """Two H200s on the real clock (the monitor's 0.25 s floor as in use), the backend's reads counted."""
    monitor = fake_monitor_from_recording(GPU_FIXTURES / "h200x2.json", clock=clock, animate=True)
    backend = CountingBackend(monitor._backend)
    monitor._backend = backend
    return monitor, backend


def gpu_poll_workers(app) -> list:
    return [w for w in app.workers if w.group == "gpu-poll" and not w.is_finished]


async def open_run_dashboard(pilot, app, path) -> DashboardScreen:
    from tui.screens.runs import open_dashboard

    open_dashboard(app, path)
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
    return app.screen


def test_one_poll_feeds_the_gpu_screen_and_a_dashboard():
    """Both screens mounted, both watching: one backend read per interval between them, not one each,
    and each snapshot reaches both."""
    path = build_run(runs_dir(), "20261129-2100-poll", status="running", steps=20, gpus=(0, 1))

    async def scenario():
        monitor, backend = counted_monitor()
        app = make_app(quiet_settings(gpu_poll_interval_s=0.5), monitor=monitor)
        async with app.run_test(size=(100, 40)) as pilot:
            gpus = await open_gpus(pilot, app)
            dashboard = await open_run_dashboard(pilot, app, path)
            assert gpus.is_mounted and app.current_mode == "runs"
            start_reads, started = backend.reads, time.monotonic()
            await wait_for(pilot, lambda: backend.reads >= start_reads + 6)
            elapsed = time.monotonic() - started
            # one poller: at most one read per 0.5 s (two pollers would read about twice as often)
            assert backend.reads - start_reads <= elapsed / 0.5 + 2
            assert len(gpu_poll_workers(app)) == 1
            await wait_for(pilot, lambda: gpus.snapshot is app.gpu_snapshot
                           and dashboard.util_samples[-1][0] == app.gpu_snapshot.taken_at)
            # every read is one point of the one history: a read made in the worker reaches the history
            # when the app handles its message, so wait for the two to meet (a double count or a lost read
            # never would) instead of comparing them at an instant a read may be in flight
            await wait_for(pilot, lambda: len(app.gpu_history.times()) == backend.reads)

    with SupervisorStandIn(path):
        run(scenario())


def test_an_interval_change_takes_effect_at_once_for_every_screen():
    async def scenario():
        monitor, backend = counted_monitor()
        app = make_app(quiet_settings(), monitor=monitor)  # an hour between polls
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            assert backend.reads == 1
            app.set_gpu_interval(0.5)  # the poll waiting out the hour is woken, then polls every 0.5 s
            await wait_for(pilot, lambda: backend.reads >= 4)
            assert screen.interval_s == app.gpu_interval_s == 0.5
            await pilot.press("minus")  # the GPU screen's keys set the app's one interval
            assert app.gpu_interval_s == 0.25
            await pilot.press("plus", "plus")
            assert app.gpu_interval_s == 1.0

    run(scenario())


def test_poll_now_reads_at_once_and_a_hidden_gpu_screen_polls_at_the_idle_interval():
    async def scenario():
        monitor, backend = counted_monitor()
        app = make_app(quiet_settings(), monitor=monitor)  # an hour between polls
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            assert backend.reads == 1
            await pilot.pause(0.3)  # past the monitor's floor, which would answer with the last snapshot
            app.poll_gpus_now()  # as after a signal: the process list is read again now, not in an hour
            await wait_for(pilot, lambda: backend.reads == 2 and len(app.gpu_history.times()) == 2)
            await wait_for(pilot, lambda: screen.snapshot is app.gpu_snapshot)
            app.set_gpu_interval(0.25)
            await wait_for(pilot, lambda: backend.reads >= 4)
            await pilot.press("m")  # the GPU screen is hidden: the poll slows to the idle interval
            await wait_for(pilot, lambda: app.current_mode == "models" and not app._gpu_shown)
            await pilot.pause(0.3)  # a poll under way when it was hidden ends
            reads = backend.reads
            await pilot.pause(1.0)
            assert backend.reads <= reads + 1 and len(gpu_poll_workers(app)) == 1
            await pilot.press("g")  # shown again: a reading at once, then every 0.25 s
            await wait_for(pilot, lambda: backend.reads >= reads + 3)

    run(scenario())


def test_the_history_is_shared_a_gpu_screen_reading_is_in_the_dashboards_chart():
    path = build_run(runs_dir(), "20261129-2100-shared", status="running", steps=20, gpus=(0, 1))

    async def scenario():
        clock = StepClock()
        monitor = fake_monitor("h200x2", clock=clock, animate=True)
        app = make_app(quiet_settings(), monitor=monitor)
        async with app.run_test(size=(100, 40)) as pilot:
            screen = await open_gpus(pilot, app)
            await feed_history(pilot, screen, monitor, clock, 5)
            card = screen.query_one(GpuCard)
            assert len(card.util_history) == 6
            seen = app.gpu_history.series(0, "utilization_gpu_pct")
            dashboard = await open_run_dashboard(pilot, app, path)
            # the six readings taken while only the GPU screen was open are in the dashboard's chart
            await wait_for(pilot, lambda: 0 in dashboard.gpu_util and dashboard.gpu_util[0].points == 6)
            assert dashboard.gpu_util[0].y_last == seen[-1]
            assert [at for at, _ in dashboard.util_samples] == app.gpu_history.times()
            await feed_history(pilot, dashboard, monitor, clock, 2)  # and the next go to both screens
            assert dashboard.gpu_util[0].points == 8 and len(card.util_history) == 8

    with SupervisorStandIn(path):
        run(scenario())


def test_the_poll_stops_when_no_screen_watches():
    path = build_run(runs_dir(), "20261129-2100-stop", status="finished", steps=20, gpus=(0,))

    async def scenario():
        monitor, backend = counted_monitor()
        app = make_app(quiet_settings(), monitor=monitor, open_run=str(path))  # no GPU screen: a dashboard
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            dashboard = app.screen
            await wait_for(pilot, lambda: dashboard.gpu_version > 0)
            assert len(gpu_poll_workers(app)) == 1
            await pilot.press("escape")  # back to the runs list: nothing watches the GPUs
            await wait_for(pilot, lambda: not isinstance(app.screen, DashboardScreen))
            await wait_for(pilot, lambda: not gpu_poll_workers(app))
            reads = backend.reads
            app.set_gpu_interval(0.25)
            await pilot.pause(0.6)
            assert backend.reads == reads  # stopped, not waiting
            await pilot.press("g")  # the GPU screen watches: the poll runs again
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen) and app.screen.snapshot is not None)
            await wait_for(pilot, lambda: backend.reads > reads)

    with SupervisorStandIn(path):
        run(scenario())


def test_without_nvml_the_poll_reports_no_error():
    async def scenario():
        app = make_app(quiet_settings(gpu_poll_interval_s=0.25),
                       monitor=fake_monitor("h200x1", clock=time.monotonic, fail="library_not_found"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            await wait_for(pilot, lambda: len(app.gpu_history.times()) >= 3)  # polled again and again
            assert "No GPU readings" in screen_text(app) and not list(screen.query(GpuCard))
            assert not app._notifications and not isinstance(app.screen, ErrorModal)

    run(scenario())


class FailingMonitor:
    """The fake monitor whose polls raise ``error`` after the first."""

    def __init__(self, inner, error: BaseException) -> None:
        self.inner = inner
        self.error = error
        self.polls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def poll(self):
        self.polls += 1
        if self.polls > 1:
            raise self.error
        return self.inner.poll()


def test_an_expected_poll_failure_is_shown_and_a_bug_opens_the_error_modal_once():
    async def expected():
        monitor = FailingMonitor(fake_monitor("h200x2"), OSError("/proc went away"))
        app = make_app(quiet_settings(gpu_poll_interval_s=0.25), monitor=monitor)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_gpus(pilot, app)
            await wait_for(pilot, lambda: "Reading the GPUs failed: OSError: /proc went away" in screen_text(app))
            await wait_for(pilot, lambda: monitor.polls >= 4)  # tried again at each interval
            assert not isinstance(app.screen, ErrorModal)

    async def bug():
        monitor = FailingMonitor(fake_monitor("h200x2"), KeyError("gpu"))
        app = make_app(quiet_settings(gpu_poll_interval_s=0.25), monitor=monitor)
        async with app.run_test(size=(80, 24)) as pilot:
            # the second poll (0.25 s after the first) may open the modal before the GPU screen's footer is
            # drawn on a loaded box: wait for the modal, over a GPU screen that had its first snapshot
            await wait_for(pilot, lambda: isinstance(app.screen, ErrorModal))
            assert any(isinstance(screen, GpuScreen) and screen.snapshot is not None for screen in app.screen_stack)
            await wait_for(pilot, lambda: not gpu_poll_workers(app))  # once, not every interval
            assert monitor.polls == 2 and app.screen.texts == ["KeyError: 'gpu'"]

    run(expected())
    run(bug())
