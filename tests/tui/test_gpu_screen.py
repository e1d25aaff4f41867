"""The GPU screen over fake NVML replaying recordings: cards, processes, host, no-GPU states, layout."""

from __future__ import annotations

import asyncio

import pytest

from tests.tui.conftest import (
    StepClock,
    assert_snapshot,
    fake_monitor,
    quiet_settings,
    screen_text,
    wait_for,
    wait_screen_stable,
)
from tui.app import make_app
from tui.screens.gpus import GpuCard, GpuScreen, SnapshotReady
from tui.widgets.keys_footer import KeysFooter


def run(coro):
    return asyncio.run(coro)


async def open_gpus(pilot, app):
    await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen) and app.screen.snapshot is not None)
    # The footer draws its keys once the bindings are known: wait for them before a snapshot.
    await wait_for(pilot, lambda: bool(app.screen.query_one(KeysFooter).shown()))
    await wait_screen_stable(pilot, app)
    return app.screen


async def feed_history(pilot, screen, monitor, clock: StepClock, samples: int) -> None:
    """Post ``samples`` more polls, one second apart on the fake clock, as the worker would."""
    for _ in range(samples):
        clock.advance(1.0)
        screen.post_message(SnapshotReady(monitor.poll()))
        await pilot.pause()
    await pilot.pause()


def test_cards_processes_and_host_from_recording():
    async def scenario():
        monitor = fake_monitor("h200x2")
        app = make_app(quiet_settings(), monitor=monitor)
        async with app.run_test(size=(100, 40)) as pilot:
            screen = await open_gpus(pilot, app)
            cards = list(screen.query(GpuCard))
            assert [c.index for c in cards] == [0, 1]
            recorded = monitor.snapshot()
            table = screen.query_one("#gpu-procs")
            assert table.row_count == sum(len(g.processes) for g in recorded.gpus) > 0
            text = screen_text(app)
            assert "0 · NVIDIA H200" in text and "1 · NVIDIA H200" in text
            assert f"driver {recorded.driver_version}" in text
            assert "CPU" in text and "RAM" in text and "disk free" in text
            # memory figures come from the recording
            used = recorded.gpus[0].memory_used_bytes / 1024**3
            assert (f"{used:.0f}/" if used >= 100 else f"{used:.1f}/") in text

    run(scenario())


@pytest.mark.parametrize("failure, expected", [
    ("library_not_found", "install the NVIDIA driver"),
    ("driver_not_loaded", "driver"),
])
def test_no_nvml_says_why_and_other_screens_work(failure, expected):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1", fail=failure))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            assert screen.snapshot.nvml_error is not None
            text = screen_text(app)
            assert "No GPU readings" in text and expected in text
            assert "m models, w wizard, r runs" in text
            assert not list(screen.query(GpuCard))
            assert "CPU" in text  # the host is still shown
            await pilot.press("m")
            await pilot.pause()
            assert app.current_mode == "models"

    run(scenario())


def test_zero_gpus_is_a_normal_state():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("zero"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            assert not list(screen.query(GpuCard))
            assert screen.snapshot.nvml_error is not None and screen.snapshot.nvml_error.reason == "no_gpus"
            assert "No GPU readings" in screen_text(app)

    run(scenario())


def test_eight_gpus_compact_at_80x24_and_grid_when_large():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x8"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            cards = list(screen.query(GpuCard))
            assert len(cards) == 8 and all(c.has_class("-compact") for c in cards)
            text = screen_text(app)
            for index in range(8):
                assert f"{index:>2} H200" in text  # every GPU readable on one screen
            await pilot.resize_terminal(160, 50)
            await pilot.pause()
            assert not any(c.has_class("-compact") for c in cards)
            assert screen.query_one("#gpu-cards").styles.grid_size_columns == 2
            await pilot.press("c")  # force compact on a large terminal
            await pilot.pause()
            assert all(c.has_class("-compact") for c in cards)

    run(scenario())


def test_history_grows_with_polls_and_interval_keys_respect_floor():
    async def scenario():
        clock = StepClock()
        monitor = fake_monitor("h200x1", clock=clock, animate=True)
        app = make_app(quiet_settings(), monitor=monitor)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            card = screen.query_one(GpuCard)
            assert len(card.util_history) == 1
            await pilot.resize_terminal(100, 30)  # a new layout is not a new reading
            await pilot.pause()
            assert len(card.util_history) == 1
            await feed_history(pilot, screen, monitor, clock, 5)
            assert len(card.util_history) == 6
            assert len(set(card.util_history)) > 1  # the animated fake moves
            screen.interval_s = 1.0
            for _ in range(6):
                await pilot.press("minus")
            assert screen.interval_s == 0.25
            await pilot.press("plus")
            assert screen.interval_s == 0.5

    run(scenario())


def test_poll_worker_keeps_input_responsive():
    """While NVML hangs inside a poll, keys still work: polls run in a worker thread."""
    import threading

    class StuckMonitor:
        def __init__(self, inner):
            self.inner = inner
            self.release = threading.Event()
            self.entered = threading.Event()
            self.polls = 0

        def poll(self):
            self.polls += 1
            if self.polls == 2:  # the second poll hangs until the test lets it go
                self.entered.set()
                self.release.wait(10)
            return self.inner.poll()

    async def scenario():
        monitor = StuckMonitor(fake_monitor("h200x1"))
        app = make_app(quiet_settings(gpu_poll_interval_s=0.25), monitor=monitor)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_gpus(pilot, app)
            await wait_for(pilot, monitor.entered.is_set)
            modes = []
            for key in "mwrg":
                await pilot.press(key)
                modes.append(app.current_mode)
            assert modes == ["models", "wizard", "runs", "gpus"]
            assert monitor.entered.is_set() and not monitor.release.is_set()  # still stuck in NVML
            monitor.release.set()
            await wait_for(pilot, lambda: monitor.polls >= 3)

    run(scenario())


@pytest.mark.parametrize("recording", ["h200x1", "h200x2", "h200x8", "none"])
@pytest.mark.parametrize("size", [(80, 24), (160, 50)])
def test_gpu_screen_snapshots(recording, size):
    async def scenario():
        clock = StepClock()
        options = {"fail": "library_not_found"} if recording == "none" else {"animate": True}
        monitor = fake_monitor("h200x1" if recording == "none" else recording, clock=clock, **options)
        app = make_app(quiet_settings(), monitor=monitor)
        async with app.run_test(size=size) as pilot:
            screen = await open_gpus(pilot, app)
            if recording != "none":
                await feed_history(pilot, screen, monitor, clock, 40)
            assert_snapshot(app, f"gpus_{recording}_{size[0]}x{size[1]}")

    run(scenario())
