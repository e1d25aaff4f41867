"""The GPU screen over fake NVML replaying recordings: cards, processes (select, kill, command line, run
link), host, no-GPU states, layout."""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from core.hardware.fake_nvml import fake_monitor_from_recording
from core.hardware.snapshot import GpuProcess, load_snapshot
from core.i18n import t
from core.paths import runs_dir
from core.text_width import cell_len
from tests.fixtures.watch.run_builder import build_run
from tests.tui.conftest import (
    GPU_FIXTURES,
    StepClock,
    assert_snapshot,
    fake_monitor,
    quiet_settings,
    screen_text,
    wait_for,
    wait_screen_stable,
)
from tui.app import make_app
from tui.gpu_poll import GpuPolled
from tui.screens.gpus import PROC_COLUMNS, GpuCard, GpuScreen, fit_process_columns
from tui.screens.help import HelpScreen
from tui.widgets.confirm import ConfirmScreen
from tui.widgets.keys_footer import KeysFooter
from tui.widgets.text_modal import TextModal


def run(coro):
    return asyncio.run(coro)


async def open_gpus(pilot, app):
    await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen) and app.screen.snapshot is not None)
    # The footer draws its keys once the bindings are known: wait for them before a snapshot.
    await wait_for(pilot, lambda: bool(app.screen.query_one(KeysFooter).shown()))
    await wait_screen_stable(pilot, app)
    return app.screen


async def feed_history(pilot, screen, monitor, clock: StepClock, samples: int) -> None:
    """Post ``samples`` more polls, one second apart on the fake clock, to the app as its poll worker would
    (the app keeps the history and hands each new snapshot to the watching screens)."""
    for _ in range(samples):
        clock.advance(1.0)
        screen.app.post_message(GpuPolled(monitor.poll()))
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


@pytest.mark.parametrize("recording, options", [("none", {}), ("zero", {}), ("h200x1", {"fail": "library_not_found"})])
def test_without_gpus_the_gpu_keys_are_not_offered(recording, options):
    """No GPU (the none and zero recordings, or no NVML): compact, processes and the poll speed act on
    nothing, so neither the footer, nor the help, nor the palette offers them; the keys do nothing."""
    gpu_keys = ("compact", "processes", "interval_up", "interval_down")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor(recording, **options))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            await wait_for(pilot, lambda: screen.snapshot is not None)
            await pilot.pause()
            assert not screen.snapshot.gpus
            assert not {"c", "p", "+", "-"} & set(footer_keys(app))
            titles = {command.title for command in app.get_system_commands(screen)}
            assert not {t(f"gpuscreen.key.{key}") for key in gpu_keys} & titles
            before = app.gpu_interval_s
            await pilot.press("minus", "p")
            assert app.gpu_interval_s == before and not screen.selecting

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


def process_on_screen(app, pid: int) -> bool:
    """``pid``'s row of the process list and the line under the list that names it are both on screen."""
    rows = screen_text(app).splitlines()
    return any(row.split()[1:2] == [str(pid)] for row in rows) and any(f"PID {pid}" in row for row in rows)


def test_full_cards_never_hide_the_process_a_key_acts_on():
    """8 GPUs at 80x24: full cards would fill the screen (cards 0-2 of 8) and push the process list off it,
    where p, the arrows, k and Enter acted on a process no one could see. c says why the cards stay compact
    (as it does while a process is selected); on a terminal where they fit it still expands them."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x8"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            cards = list(screen.query(GpuCard))
            await pilot.press("c")
            await wait_for(pilot, lambda: any("Full cards need 66 lines" in n and "has 24" in n for n in notes(app)))
            assert all(c.has_class("-compact") for c in cards)
            row = await select_process(pilot, app)
            await wait_screen_stable(pilot, app)
            assert process_on_screen(app, row.process.pid)
            for _ in range(7):  # down to the last process, each one on screen as it is selected
                await pilot.press("down")
                await wait_for(pilot, lambda: "k" in footer_keys(app))
                await wait_screen_stable(pilot, app)
                assert process_on_screen(app, screen.selected().process.pid)
            assert screen.selected().process.pid == 62007
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, TextModal))
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is screen)
            await pilot.press("escape")
            await wait_for(pilot, lambda: screen.selected() is None)

            await pilot.resize_terminal(160, 50)  # room for full cards (2 columns) and the list: c toggles
            await wait_for(pilot, lambda: not any(c.has_class("-compact") for c in cards))
            await pilot.press("c")
            await wait_for(pilot, lambda: all(c.has_class("-compact") for c in cards))
            await pilot.press("c")
            await wait_for(pilot, lambda: not any(c.has_class("-compact") for c in cards))
            await pilot.resize_terminal(80, 24)  # full cards asked for, then a terminal too small for them
            await wait_for(pilot, lambda: all(c.has_class("-compact") for c in cards))
            await wait_screen_stable(pilot, app)
            assert process_on_screen(app, (await select_process(pilot, app)).process.pid)

    run(scenario())


def test_c_while_a_process_is_selected_keeps_it_in_view():
    """2 GPUs at 80x24: full cards fit, and fold while a process is selected; c then says why, and the
    full cards come back when Esc leaves the list."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            cards = list(screen.query(GpuCard))
            assert not any(c.has_class("-compact") for c in cards)
            row = await select_process(pilot, app)
            await wait_for(pilot, lambda: all(c.has_class("-compact") for c in cards))
            await pilot.press("c")
            await wait_for(pilot, lambda: any("selected process" in n and "Esc" in n for n in notes(app)))
            await wait_screen_stable(pilot, app)
            assert all(c.has_class("-compact") for c in cards)
            assert process_on_screen(app, row.process.pid)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not any(c.has_class("-compact") for c in cards))

    run(scenario())


def test_a_terminal_too_short_even_for_compact_lines_scrolls_to_the_selected_process():
    """8 GPUs at 80x12: compact lines leave the list no row; the screen scrolls to the selected process
    (and back to the cards when Esc leaves the list)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x8"))
        async with app.run_test(size=(80, 12)) as pilot:
            screen = await open_gpus(pilot, app)
            for index in range(8):
                if index == 0:
                    await select_process(pilot, app)
                else:
                    await pilot.press("down")
                await wait_for(pilot, lambda index=index: screen.selected().process.pid == 62000 + index)
                await wait_screen_stable(pilot, app)
                assert process_on_screen(app, 62000 + index), index
            await pilot.press("escape")
            await wait_for(pilot, lambda: screen.selected() is None)
            await wait_screen_stable(pilot, app)
            assert " 0 H200" in screen_text(app)

    run(scenario())


class LiveLooking:
    """A monitor whose snapshots are not marked synthetic, as this box's real GPUs are not."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def poll(self):
        return dataclasses.replace(self.inner.poll(), synthetic=False)


@pytest.mark.parametrize("recording", ["h200x8", "h200x2"])
def test_fake_gpus_say_so_on_the_summary_line_without_moving_a_card(recording):
    """TUNEDECK_FAKE_GPUS left set in a shell showed live-looking H200s: the summary line says they are
    replayed, and from which file, first (it is not cut at 80 columns), on the line it had: the topology gives
    way at 80 columns rather than the cards moving down; the real GPUs' line has no such words."""
    def layout(app):
        text = screen_text(app)
        cards = [(card.region.y, card.region.height) for card in app.screen.query(GpuCard)]
        return text, cards, app.screen.query_one("#gpu-procs").region

    async def scenario(monitor, size):
        app = make_app(quiet_settings(), monitor=monitor)
        async with app.run_test(size=size) as pilot:
            await open_gpus(pilot, app)
            return layout(app)

    for size in ((80, 24), (160, 50)):
        text, cards, procs = run(scenario(fake_monitor(recording), size))
        real_text, real_cards, real_procs = run(scenario(LiveLooking(fake_monitor(recording)), size))
        status = text.splitlines()[1]
        assert status.startswith(f" Fake GPUs replayed from {recording}.json · ") and "GPUs · driver" in status, size
        assert "replayed" not in real_text and "Fake" not in real_text
        assert (cards, procs) == (real_cards, real_procs), size  # not a line of the layout moves
        assert all(y + height <= size[1] - 1 for y, height in cards)  # every card on screen, above the footer
        assert ("GPU pairs linked by" in status) == (size[0] > 80)
        assert "GPU pairs linked by NV18" in real_text.splitlines()[1]


def test_fake_gpus_from_the_environment_name_their_file(tmp_path, monkeypatch):
    """The app opening its own monitor, as tunedeck does, with TUNEDECK_FAKE_GPUS set: the file it replays."""
    recording = tmp_path / "left-in-my-shell.json"
    recording.write_text((GPU_FIXTURES / "h200x1.json").read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setenv("TUNEDECK_FAKE_GPUS", str(recording))

    async def scenario():
        app = make_app(quiet_settings())
        async with app.run_test(size=(80, 24)) as pilot:
            await open_gpus(pilot, app)
            assert "Fake GPUs replayed from left-in-my-shell.json · 1 GPU · driver" in screen_text(app)

    run(scenario())


def test_no_readings_from_a_recording_say_it_is_one():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1", fail="library_not_found"))
        async with app.run_test(size=(80, 24)) as pilot:
            await open_gpus(pilot, app)
            assert "No GPU readings · Fake GPUs replayed from h200x1.json" in screen_text(app)

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
            # the notice says the interval as other durations are said: "0.5 s", "10 s" (it read "0.50 s",
            # "10.00 s")
            assert str(list(app._notifications)[-1].message) == t("gpuscreen.interval", seconds=0.5) \
                == "Polling every 0.5 s"
            for _ in range(6):
                await pilot.press("plus")
            assert screen.interval_s == 10.0
            assert str(list(app._notifications)[-1].message) == "Polling every 10 s"

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

        def __getattr__(self, name):  # snapshot(), close() (the wizard reads the latest snapshot)
            return getattr(self.inner, name)

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
            for key in ("m", "w", "escape", "r", "g"):  # Esc out of the wizard, whose first step takes letters
                await pilot.press(key)
                modes.append(app.current_mode)
            assert modes == ["models", "wizard", "models", "runs", "gpus"]
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
            await assert_snapshot(pilot, app, f"gpus_{recording}_{size[0]}x{size[1]}")

    run(scenario())


# --- GPU processes: select, kill, command line, run link, columns (issue #18 item 5) -------------------
SNAPSHOT_TAKEN_AT = 1795993337.0
SHOWCASE_RUN = "20261129-2100-qwen7b-lora"
SHOWCASE_TRAINER_PID = 62000
SHOWCASE_TRAINER_START = SNAPSHOT_TAKEN_AT - 3723.0
TRAINER_COMMAND = (f"/root/tunedeck/.venv/bin/python -m core.train.worker /root/.local/share/tunedeck/runs/"
                   f"{SHOWCASE_RUN} --config /root/.local/share/tunedeck/runs/{SHOWCASE_RUN}/config.yaml "
                   "--hub-token *** --attempt 1")


def monitor_with(processes: dict[int, tuple[GpuProcess, ...]], base: str = "h200x1",
                 taken_at: float | None = None):
    """Fake GPUs replaying ``base`` with these processes on these GPUs (as a recording of a box where they
    run): the recorded resolver shows them as recorded, and the kill reaches the real pid here. Each
    GPU's used memory is what its processes hold, plus half a GiB of context."""
    recording = load_snapshot(GPU_FIXTURES / f"{base}.json")
    gpus = tuple(dataclasses.replace(
        g, processes=processes.get(g.index, ()),
        memory_used_bytes=2**29 + sum(p.used_memory_bytes or 0 for p in processes.get(g.index, ())),
    ) for g in recording.gpus)
    recording = dataclasses.replace(recording, gpus=gpus)
    options = {} if taken_at is None else {"wall_clock": lambda: taken_at}
    return fake_monitor_from_recording(recording, clock=StepClock(), **options)


def live_process(proc: subprocess.Popen, command: str = "sleep 60", **fields) -> GpuProcess:
    """A real child of the test as a GPU process: its own pid, user and start time, as a poll reads them."""
    info = psutil.Process(proc.pid)
    fields.setdefault("started_at", info.create_time())
    return GpuProcess(proc.pid, 2 * 1024**3, visible=True, user=getpass.getuser(), command=command,
                      cpu_percent=0.0, host_memory_bytes=info.memory_info().rss, **fields)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def utc(monkeypatch):
    """Start times print in local time: pinned to UTC where a snapshot shows one."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def footer_keys(app) -> list[str]:
    return [key for key, _ in app.screen.query_one(KeysFooter).shown()]


def notes(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def select_process(pilot, app, key: str = "p"):
    screen = app.screen
    await pilot.press(key)
    await wait_for(pilot, lambda: screen.selected() is not None)
    await wait_for(pilot, lambda: "k" in footer_keys(app))
    return screen.selected()


def showcase_monitor():
    """Two H200s: a tunedeck run's trainer, another user's notebook, and a pid of another container."""
    trainer = GpuProcess(SHOWCASE_TRAINER_PID, 61 * 1024**3 + 2**29, visible=True, user="root",
                         command=TRAINER_COMMAND, started_at=SHOWCASE_TRAINER_START, cpu_percent=101.3,
                         host_memory_bytes=int(9.1 * 1024**3))
    notebook = GpuProcess(48211, 17 * 1024**3, visible=True, user="alice",
                          command="/usr/bin/python3 /home/alice/notebooks/eval_llama.py --model "
                                  "meta-llama/Llama-3.1-8B-Instruct --batch-size 16",
                          started_at=SNAPSHOT_TAKEN_AT - 2 * 86400 - 3 * 3600, cpu_percent=12.4,
                          host_memory_bytes=int(3.2 * 1024**3))
    hidden = GpuProcess(7301, 8 * 1024**3, visible=False, hidden_reason="not_in_namespace")
    return monitor_with({0: (trainer,), 1: (notebook, hidden)}, base="h200x2", taken_at=SNAPSHOT_TAKEN_AT)


def showcase_run() -> Path:
    """The run whose supervisor recorded the showcase's trainer (pid and start time) in run.json."""
    path = build_run(runs_dir(), SHOWCASE_RUN, status="running", gpus=(0,))
    record = json.loads((path / "run.json").read_text(encoding="utf-8"))
    record["trainer"] = {"pid": SHOWCASE_TRAINER_PID, "start_time": SHOWCASE_TRAINER_START}
    (path / "run.json").write_text(json.dumps(record), encoding="utf-8")
    return path


async def open_showcase_selected(pilot, app):
    """The showcase on screen with its trainer selected (linked to its run)."""
    screen = await open_gpus(pilot, app)
    await wait_for(pilot, lambda: SHOWCASE_TRAINER_PID in screen.links)
    await select_process(pilot, app)
    await wait_for(pilot, lambda: "o" in footer_keys(app))
    await wait_screen_stable(pilot, app)
    return screen


def test_k_then_y_sends_sigterm_and_the_real_process_ends(sleeper):
    async def scenario():
        app = make_app(quiet_settings(), monitor=monitor_with({0: (live_process(sleeper),)}))
        async with app.run_test(size=(80, 24)) as pilot:
            await open_gpus(pilot, app)
            assert "k" not in footer_keys(app)  # nothing selected: nothing to kill
            row = await select_process(pilot, app)
            assert row.process.pid == sleeper.pid
            await pilot.press("k")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            text = screen_text(app)
            assert f"Send SIGTERM to PID {sleeper.pid}?" in text and "sleep 60" in text
            await pilot.press("y")
            await wait_for(pilot, lambda: sleeper.poll() is not None)
            assert sleeper.returncode == -signal.SIGTERM
            await wait_for(pilot, lambda: f"SIGTERM sent to PID {sleeper.pid}." in notes(app))
            await wait_for(pilot, lambda: f"PID {sleeper.pid} has exited." in notes(app))

    run(scenario())


def test_enter_n_and_esc_in_the_dialog_do_not_kill_and_shift_k_sends_sigkill(sleeper):
    async def scenario():
        app = make_app(quiet_settings(), monitor=monitor_with({0: (live_process(sleeper),)}))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            await select_process(pilot, app)
            for no in ("enter", "n", "escape"):
                await pilot.press("k")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                await pilot.press(no)
                await wait_for(pilot, lambda: app.screen is screen)
                assert not [w for w in app.workers if w.group == "gpu-signal" and w.name == "_send_signal"]
                assert sleeper.poll() is None, no
            assert not any("sent to PID" in note for note in notes(app))
            await pilot.press("K")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert f"Send SIGKILL to PID {sleeper.pid}?" in screen_text(app)
            await pilot.press("y")
            await wait_for(pilot, lambda: sleeper.poll() is not None)
            assert sleeper.returncode == -signal.SIGKILL

    run(scenario())


def test_processes_that_cannot_be_signalled_are_refused_with_why(sleeper):
    """This app, a host pid of another container, a reused pid, a recording without start times."""
    me = psutil.Process()
    own = GpuProcess(me.pid, 2**30, visible=True, user="root", command="tunedeck", started_at=me.create_time())
    hidden = GpuProcess(7301, 2**30, visible=False, hidden_reason="not_in_namespace")
    reused = live_process(sleeper, started_at=psutil.Process(sleeper.pid).create_time() - 3600)

    async def scenario():
        app = make_app(quiet_settings(), monitor=monitor_with({0: (own, hidden), 1: (reused,)}, base="h200x2"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            await select_process(pilot, app)
            expected = {me.pid: "is tunedeck itself", 7301: "not visible in this container",
                        sleeper.pid: "now names another process"}
            for index in range(3):
                pid = screen.selected().process.pid
                await pilot.press("k")
                await wait_for(pilot, lambda pid=pid: any(f"PID {pid}" in n and expected[pid] in n for n in notes(app)))
                assert app.screen is screen  # no dialog for what cannot be sent
                if index < 2:
                    await pilot.press("down")
            assert sleeper.poll() is None

    run(scenario())

    async def recorded():  # a recording made before start times were recorded: never signalled
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            await select_process(pilot, app)
            await pilot.press("k")
            await wait_for(pilot, lambda: any("no known start time" in n for n in notes(app)))
            assert app.screen is screen

    run(recorded())


def test_the_selected_processs_full_command_line_is_shown(sleeper):
    command = "python -m trainer " + " ".join(f"--option-{i} value-{i}" for i in range(40)) + " --last END"

    async def scenario():
        app = make_app(quiet_settings(), monitor=monitor_with({0: (live_process(sleeper, command=command),)}))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            await select_process(pilot, app, key="down")  # an arrow key selects too
            detail = screen.query_one("#gpu-proc-detail")
            assert detail.display and detail.region.height >= 3
            text = screen_text(app)
            assert f"PID {sleeper.pid}" in text and "python -m trainer --option-0 value-0" in text
            assert "Enter shows all" in text  # too long for the lines under the list
            assert "Enter" in footer_keys(app)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, TextModal))
            await wait_screen_stable(pilot, app)
            shown = "".join(line.strip("│ ") for line in screen_text(app).splitlines())
            assert command.replace(" ", "") in shown.replace(" ", "")  # every character, wrapped at 80
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is screen)
            await pilot.press("escape")  # leaves the list: nothing selected, the usual footer again
            await wait_for(pilot, lambda: screen.selected() is None)
            assert not detail.display
            assert footer_keys(app)[:5] == ["?", "c", "p", "+", "-"]

    run(scenario())


def test_a_runs_trainer_shows_its_run_and_o_opens_the_dashboard(sleeper):
    from tui.screens.dashboard import DashboardScreen

    path = build_run(runs_dir(), "20261129-2100-live", status="running", gpus=(0,))
    record = json.loads((path / "run.json").read_text(encoding="utf-8"))
    record["trainer"] = {"pid": sleeper.pid, "start_time": psutil.Process(sleeper.pid).create_time()}
    (path / "run.json").write_text(json.dumps(record), encoding="utf-8")
    stranger = subprocess.Popen(["sleep", "60"])

    async def scenario():
        processes = {0: (live_process(sleeper, command="/root/tunedeck/.venv/bin/python -m core.train.worker"),),
                     1: (live_process(stranger),)}
        app = make_app(quiet_settings(), monitor=monitor_with(processes, base="h200x2"))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_gpus(pilot, app)
            await wait_for(pilot, lambda: sleeper.pid in screen.links)
            assert stranger.pid not in screen.links
            command = str(screen.query_one("#gpu-procs").get_cell(f"0:{sleeper.pid}", "command"))
            # the run's name before its command, the program by its name: the venv's path filled the cell at 80 columns
            assert command.startswith("live python -m core")
            assert "live python -m core" in screen_text(app)
            await select_process(pilot, app)
            assert "trainer of run 20261129-2100-live (o)" in screen_text(app)
            assert "/root/tunedeck/.venv/bin/python -m core.train.worker" in screen_text(app)  # in full under the list
            assert "o" in footer_keys(app)
            await pilot.press("down")  # not a run's process: o is not offered
            await wait_for(pilot, lambda: "o" not in footer_keys(app))
            await pilot.press("o")  # pressed all the same: it says why nothing opens
            await wait_for(pilot, lambda: any(f"PID {stranger.pid} is not a run" in n for n in notes(app)))
            assert isinstance(app.screen, type(screen)) and app.current_mode == "gpus"
            await pilot.press("up")
            await wait_for(pilot, lambda: "o" in footer_keys(app))
            await pilot.press("o")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            assert app.current_mode == "runs" and "20261129-2100-live" in screen_text(app)

    try:
        run(scenario())
    finally:
        stranger.kill()
        stranger.wait()


def test_process_columns_fit_80x24_dropping_the_least_needed_first(private_home):
    async def scenario():
        showcase_run()
        app = make_app(quiet_settings(), monitor=showcase_monitor())
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_showcase_selected(pilot, app)
            rows = screen_text(app).splitlines()
            assert all(cell_len(row) <= 80 for row in rows)
            header = next(row for row in rows if "PID" in row and "Command" in row)
            for label in ("GPU", "PID", "User", "GPU mem", "CPU%", "RAM", "Elapsed", "Command"):
                assert label in header, label
            text = screen_text(app)
            assert "101" in text and "9.1 GiB" in text and "1:02:03" in text and "2d 03h" in text
            assert screen.column_widths["command"] >= 20

    run(scenario())
    natural = {"gpu": 3, "pid": 7, "user": 10, "gpu_mem": 10, "cpu": 4, "host_mem": 9, "elapsed": 7, "command": 90}
    assert list(fit_process_columns(200, natural)) == [c.key for c in PROC_COLUMNS]
    narrow = fit_process_columns(78, natural)
    assert "user" not in narrow and {"cpu", "host_mem", "elapsed"} <= set(narrow)
    assert narrow["command"] >= 20
    assert sum(w + 2 for w in narrow.values()) <= 78
    assert list(fit_process_columns(40, natural)) == ["gpu", "pid", "command"]


def test_process_keys_in_help_and_palette_while_a_process_is_selected(private_home):
    """What applies is listed (check_action): nothing to kill before a process is selected."""
    async def scenario():
        showcase_run()
        app = make_app(quiet_settings(), monitor=showcase_monitor())
        async with app.run_test(size=(100, 50)) as pilot:
            screen = await open_gpus(pilot, app)
            keys = ("kill", "force_kill", "details", "open_run", "back")
            titles = {command.title for command in app.get_system_commands(screen)}
            assert not {t(f"gpuscreen.key.{key}") for key in keys} & titles
            assert t("gpuscreen.key.processes") in titles
            await open_showcase_selected(pilot, app)
            titles = {command.title for command in app.get_system_commands(screen)}
            for key in keys:
                assert t(f"gpuscreen.key.{key}") in titles, key
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
            text = screen_text(app)
            for key in keys:
                assert t(f"gpuscreen.key.{key}") in text, key
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is screen)
            await pilot.press("ctrl+p")  # the palette runs them by name: the details of the process
            await pilot.press(*"the selected process in full")
            await wait_for(pilot, lambda: t("gpuscreen.key.details") in screen_text(app))
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, TextModal) and "--attempt" in screen_text(app))

    run(scenario())


def test_host_disk_free_in_decimal_units():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x8"))
        async with app.run_test(size=(80, 24)) as pilot:
            await open_gpus(pilot, app)
            assert "disk free 23.1 TB" in screen_text(app)  # 23,085,449,216,000 bytes, as df -H says

    run(scenario())


def test_gpu_screen_process_selected_snapshot(utc):
    async def scenario():
        showcase_run()
        app = make_app(quiet_settings(), monitor=showcase_monitor())
        async with app.run_test(size=(80, 24)) as pilot:
            await open_showcase_selected(pilot, app)
            await assert_snapshot(pilot, app, "gpus_process_selected_80x24")

    run(scenario())


def test_one_pid_listed_twice_on_a_gpu_is_two_rows_as_tunedeck_gpus_lists_it():
    """Fake GPUs: the h200x1 recording with pid 48211 listed twice on GPU 0 (NVML lists a pid once per context:
    several contexts, MIG). The rows were keyed GPU:pid, so the second silently replaced the first while
    `tunedeck gpus` listed both; each is a row, and each can be selected."""
    first = GpuProcess(48211, 3 * 1024**3, visible=True, user="alice", command="python train.py")
    second = dataclasses.replace(first, used_memory_bytes=1024**3)

    async def scenario():
        monitor = monitor_with({0: (first, second)})
        app = make_app(quiet_settings(), monitor=monitor)
        async with app.run_test(size=(100, 30)) as pilot:
            from core.hardware.commands import render_snapshot

            cli = [line for line in render_snapshot(monitor.snapshot()) if "48211" in line]
            screen = await open_gpus(pilot, app)
            table = screen.query_one("#gpu-procs")
            assert table.row_count == len(cli) == 2
            await select_process(pilot, app)
            seen = {screen.selected().process.used_memory_bytes}
            await pilot.press("down")
            seen.add(screen.selected().process.used_memory_bytes)
            assert seen == {3 * 1024**3, 1024**3}  # both contexts, each its own row

    run(scenario())


def test_a_gpu_lost_mid_session_says_so_in_its_card_and_its_compact_line():
    """Fake GPUs: h200x8, GPU 3 answers NVML_ERROR_GPU_IS_LOST (Xid 79) from the second poll on. Its card read
    N/A everywhere and "0 proc", like a GPU that does not report those fields and runs nothing; now it says the
    GPU is lost and what brings it back, in full cards (100x70) and in the 8-GPU fold at 80x24."""
    from core.hardware.fake_nvml import fake_nvml_from_recording
    from core.hardware.host import RecordedHostSampler
    from core.hardware.monitor import HardwareMonitor
    from core.hardware.nvml_backend import NvmlBackend
    from core.hardware.processes import RecordedProcessResolver

    async def scenario(size):
        clock = StepClock()
        fake = fake_nvml_from_recording(GPU_FIXTURES / "h200x8.json", clock=clock)
        resolver = RecordedProcessResolver({p.pid: p for g in fake.recording.gpus for p in g.processes})
        monitor = HardwareMonitor(NvmlBackend(fake, resolver), RecordedHostSampler(fake.recording.host),
                                  clock=clock, synthetic=True)
        app = make_app(quiet_settings(), monitor=monitor)
        async with app.run_test(size=size) as pilot:
            screen = await open_gpus(pilot, app)
            card = screen.query_one("#gpu-3", GpuCard)
            assert t("gpuscreen.lost") not in screen_text(app)
            fake.lost.add(3)
            await feed_history(pilot, screen, monitor, clock, 1)
            await wait_for(pilot, lambda: card.gpu is not None and card.gpu.lost)
            await wait_screen_stable(pilot, app)
            text = screen_text(app)
            compact = card.has_class("-compact")
            assert t("gpuscreen.lost_compact" if compact else "gpuscreen.lost") in text
            assert "0 proc" not in text
            assert screen.query_one("#gpu-procs").row_count == 7  # the others' processes stay
            return compact

    assert run(scenario((80, 24))) is True
    assert run(scenario((130, 70))) is False


def test_processes_nvml_will_not_list_read_na_on_the_card_not_zero():
    """Fake GPU h200x1 on a driver that will not list compute processes: the card said "0 proc", as for a free
    GPU."""
    async def scenario():
        monitor = fake_monitor("h200x1", unsupported={"nvmlDeviceGetComputeRunningProcesses"})
        app = make_app(quiet_settings(), monitor=monitor)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_gpus(pilot, app)
            text = screen_text(app)
            assert t("gpuscreen.procs_count", count=t("gpuscreen.na")) in text
            assert t("gpuscreen.procs_count", count=0) not in text
            await pilot.press("p")  # and p does not say there are none
            await wait_for(pilot, lambda: any(n.message == t("gpuscreen.procs_unknown", gpus="0")
                                              for n in app._notifications))

    run(scenario())


@pytest.mark.parametrize("language", ["en", "zh"])
def test_a_hub_cache_on_another_disk_shows_its_free_space_beside_the_data_roots(language):
    """The host line's "disk free" was the data root's only, while downloads fill MODELSCOPE_CACHE / HF_HOME,
    maybe another mount. A cache on another disk is shown too, each labelled (data, the hub's cache); at 80
    columns the load gives way so that both fit. Fake GPUs: h200x2 recording, its host with an HF cache disk."""
    from core import i18n
    from core.hardware.snapshot import CacheDisk
    from core.units import format_disk

    recording = load_snapshot(GPU_FIXTURES / "h200x2.json")
    cache = CacheDisk(hubs=("hf",), path="/mnt/models", total_bytes=4 * 10**12, free_bytes=1_234 * 10**9)
    host = dataclasses.replace(recording.host, load_average=(12.5, 11.0, 10.25), cache_disks=(cache,))
    recording = dataclasses.replace(recording, host=host)

    async def scenario(size):
        app = make_app(quiet_settings(), monitor=fake_monitor_from_recording(recording, clock=StepClock()))
        async with app.run_test(size=size) as pilot:
            await open_gpus(pilot, app)
            return next(line for line in screen_text(app).splitlines() if t("gpuscreen.cpu") in line)

    try:
        i18n.set_language(language)
        disks = (f"{t('gpuscreen.disks')} {t('gpuscreen.disk_data', free=format_disk(host.disk_free_bytes))} · "
                 f"{t('gpuscreen.disk_cache_of', hub='HF', free=format_disk(cache.free_bytes))}")
        load = f"{t('gpuscreen.load')} 12.5 11.0 10.2"
        narrow, wide = run(scenario((80, 24))), run(scenario((160, 50)))
    finally:
        i18n.set_language("en")
    assert disks in narrow and cell_len(narrow.rstrip()) <= 80, narrow
    assert "12.5" not in narrow  # the load gave way at 80 columns
    assert disks in wide and load in wide, wide


@pytest.mark.parametrize("language", ["en", "zh"])
def test_two_hub_caches_on_two_other_disks_fit_the_host_line_at_80_columns(language):
    """Both hubs' caches on disks of their own (MODELSCOPE_CACHE and HF_HOME on two mounts): the host line ran
    past 80 columns even with the load given way, the HF cache's free space (and most of ModelScope's) cut off.
    Now the hubs go by their short names and the bars give way, every figure kept; at 160 columns all is shown
    in full. Fake GPUs: h200x2 recording, its host with a ModelScope and an HF cache disk."""
    from core import i18n
    from core.hardware.snapshot import CacheDisk
    from core.units import format_disk

    recording = load_snapshot(GPU_FIXTURES / "h200x2.json")
    ms = CacheDisk(hubs=("modelscope",), path="/mnt/ms", total_bytes=4 * 10**12, free_bytes=1_234 * 10**9)
    hf = CacheDisk(hubs=("hf",), path="/mnt/hf", total_bytes=4 * 10**12, free_bytes=987 * 10**9)
    host = dataclasses.replace(recording.host, load_average=(12.5, 11.0, 10.25), cache_disks=(ms, hf))
    recording = dataclasses.replace(recording, host=host)

    async def scenario(size):
        app = make_app(quiet_settings(), monitor=fake_monitor_from_recording(recording, clock=StepClock()))
        async with app.run_test(size=size) as pilot:
            await open_gpus(pilot, app)
            return next(line for line in screen_text(app).splitlines() if t("gpuscreen.cpu") in line)

    try:
        i18n.set_language(language)
        data = t("gpuscreen.disk_data", free=format_disk(host.disk_free_bytes))
        short = f"{data} · MS {format_disk(ms.free_bytes)} · HF {format_disk(hf.free_bytes)}"
        full = (f"{data} · {t('gpuscreen.disk_cache_of', hub='ModelScope', free=format_disk(ms.free_bytes))} · "
                f"{t('gpuscreen.disk_cache_of', hub='HF', free=format_disk(hf.free_bytes))}")
        ram = t("gpuscreen.ram")
        narrow, wide = run(scenario((80, 24))), run(scenario((160, 50)))
    finally:
        i18n.set_language("en")
    assert short in narrow and cell_len(narrow.rstrip()) <= 80, narrow
    assert f"{ram} {round(host.memory_used_bytes / 2**30, 1)}/" in narrow, narrow  # its figures kept
    assert full in wide and "12.5 11.0 10.2" in wide, wide


@pytest.mark.parametrize("language", ["en", "zh"])
def test_an_unreadable_data_root_is_said_on_the_host_line(language):
    """A data root that could not be read showed "disk free –", as if the disk were merely not measured (and
    before, every hub cache as "another disk"). The host line says the data root is unreadable, within 80
    columns. Fake GPUs: h200x2 recording, its host's data root unreadable."""
    from core import i18n

    recording = load_snapshot(GPU_FIXTURES / "h200x2.json")
    host = dataclasses.replace(recording.host, load_average=(12.5, 11.0, 10.25), disk_total_bytes=None,
                               disk_free_bytes=None, disk_error="Permission denied")
    recording = dataclasses.replace(recording, host=host)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor_from_recording(recording, clock=StepClock()))
        async with app.run_test(size=(80, 24)) as pilot:
            await open_gpus(pilot, app)
            return next(line for line in screen_text(app).splitlines() if t("gpuscreen.cpu") in line)

    try:
        i18n.set_language(language)
        line = run(scenario())
        said = t("gpuscreen.disk_unreadable")
    finally:
        i18n.set_language("en")
    assert said in line and cell_len(line.rstrip()) <= 80, line


def test_the_host_line_fits_again_after_the_terminal_is_resized():
    """The host line drops the load where the hub caches' disks would not fit beside it, but it was laid out at
    each poll only: a terminal narrowed to 80 columns kept the wide line, its cache disks cut off, until the
    next poll (none while polling is slow or paused). It is laid out again on resize. Fake GPUs: the h200x2
    recording, its host with an HF cache disk."""
    from core.hardware.snapshot import CacheDisk
    from core.units import format_disk

    recording = load_snapshot(GPU_FIXTURES / "h200x2.json")
    cache = CacheDisk(hubs=("hf",), path="/mnt/models", total_bytes=4 * 10**12, free_bytes=1_234 * 10**9)
    host = dataclasses.replace(recording.host, load_average=(12.5, 11.0, 10.25), cache_disks=(cache,))
    recording = dataclasses.replace(recording, host=host)
    cache_words = t("gpuscreen.disk_cache_of", hub="HF", free=format_disk(cache.free_bytes))

    def host_line(app) -> str:
        return next(line for line in screen_text(app).splitlines() if t("gpuscreen.cpu") in line)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor_from_recording(recording, clock=StepClock()))
        async with app.run_test(size=(160, 50)) as pilot:
            await open_gpus(pilot, app)
            assert "12.5" in host_line(app) and cache_words in host_line(app)
            await pilot.resize_terminal(80, 24)
            await wait_for(pilot, lambda: app.screen.size.width == 80)
            await pilot.pause()
            narrow = host_line(app)
            assert cache_words in narrow and "12.5" not in narrow, narrow

    run(scenario())
