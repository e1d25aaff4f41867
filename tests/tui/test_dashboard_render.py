"""Dashboard snapshots (healthy, finished, failed, crashed at 80×24 and 160×50) and external formats."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from core.paths import runs_dir
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import (
    assert_snapshot,
    fake_monitor,
    quiet_settings,
    screen_text,
    wait_for,
    wait_screen_stable,
)
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen, EventsTable
from tui.widgets.log_pane import LogPane

FIXTURES = Path(__file__).parents[1] / "fixtures" / "watch"


def run(coro):
    return asyncio.run(coro)


def add_checkpoint(path: Path, step: int) -> Path:
    """A sound checkpoint of the run at ``path`` (tiny files of the right shapes, which pass
    ``verify_checkpoint``): what resume and the after-training keys look for, as a finished run always
    ends with one."""
    import json

    from core.runs import RunDirectory
    from core.runs.checkpoints import finalize_checkpoint, tmp_path_for

    tmp = tmp_path_for(RunDirectory(path).checkpoints_dir, step)
    tmp.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (tmp / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    (tmp / "trainer_state.json").write_text(json.dumps({"global_step": step}), encoding="utf-8")
    (tmp / "optimizer.pt").write_bytes(b"o")
    (tmp / "scheduler.pt").write_bytes(b"s")
    return finalize_checkpoint(tmp, step)


async def open_dashboard(pilot, app, status: str, events: int | None = None) -> DashboardScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
    screen = app.screen
    await wait_for(pilot, lambda: screen.status == status and screen.series.train_records > 0
                   and screen.query_one("#dash-log", LogPane).lines
                   and (events is None or len(screen.events) == events))
    await pilot.pause()
    return screen


async def settle(pilot, app, screen: DashboardScreen, gpus: bool = True) -> None:
    if gpus:
        await wait_for(pilot, lambda: screen.gpu_version > 0)
    await wait_for(pilot, lambda: screen.query_one("#dash-events", EventsTable).at_newest)  # the newest in view
    await wait_for(pilot, lambda: screen.query_one("#dash-log", LogPane).at_newest)  # (the tick puts it right)
    screen._redraw()
    app.clear_notifications()
    await wait_screen_stable(pilot, app)


CASES = {
    # name: (status written, status shown, steps, reason, lock held)
    "healthy": ("running", "running", 240, "", True),
    "finished": ("finished", "finished", 600, "", False),
    "failed": ("failed", "failed", 310, "CUDA out of memory at step 311 (micro batch 4)", False),
    "crashed": ("running", "crashed", 180, "", False),
}


@pytest.mark.parametrize("size", [(80, 24), (160, 50)], ids=["80x24", "160x50"])
@pytest.mark.parametrize("case", list(CASES))
def test_dashboard_snapshots(case, size):
    written, shown, steps, reason, locked = CASES[case]

    path = build_run(runs_dir(), f"20261129-2100-{case}", status=written, steps=steps, reason=reason)
    if shown != "running":  # what it left to resume from or to merge, chat with …: its footer offers them
        add_checkpoint(path, steps // 50 * 50)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=size) as pilot:
            screen = await open_dashboard(pilot, app, shown, events=len(list(open(path / "events.jsonl"))))
            await settle(pilot, app, screen)
            text = screen_text(app)
            assert "Qwen/Qwen2.5-7B-Instruct" in text and shown in text
            assert f"step {steps}/600" in text
            await assert_snapshot(pilot, app, f"dashboard_{case}_{size[0]}x{size[1]}")

    if locked:
        with SupervisorStandIn(path):
            run(scenario())
    else:
        run(scenario())
    if shown == "crashed":
        # the dashboard's liveness check recorded the crash in the run directory
        assert '"crashed"' in (runs_dir() / f"20261129-2100-{case}" / "status.json").read_text()


def test_header_figures_of_a_healthy_run():
    async def scenario():
        path = build_run(runs_dir(), "20261129-2100-fig", status="running", steps=240)
        with SupervisorStandIn(path):
            app = make_app(quiet_settings(price_per_gpu_hour=3.0), monitor=fake_monitor("h200x2"),
                           open_run=str(path))
            async with app.run_test(size=(160, 50)) as pilot:
                screen = await open_dashboard(pilot, app, "running")
                await settle(pilot, app, screen)
                text = screen_text(app)
                assert "ZeRO 2" in text and "GPUs 0,1" in text and "bf16" in text and "lora" in text
                assert "elapsed 6:00" in text and "ETA 9:00" in text and "epoch 1.20" in text
                # the steady 12,000 tok/s (18,000 tokens a 1.5 s step), not the last interval's 12,600: that
                # one is the tokens chart's
                assert "12,000 tok/s" in _stats_line(screen) and "12,600" not in _stats_line(screen)
                assert "MFU 18%" in text  # 6·params·tokens/s over two H200s' dense BF16 peak
                assert "cost $0.60" in text  # 360 s × 2 GPUs × $3/GPU-hour
                assert "GPU util %" in text and "checkpoint_saved" in text

    run(scenario())


def test_header_cost_under_a_cent_is_not_zero():
    """Six minutes on two GPUs at 0.001 a GPU-hour is 0.0002: the header said "cost $0.00", as if free."""
    async def scenario():
        path = build_run(runs_dir(), "20261129-2100-cheap", status="running", steps=240)
        with SupervisorStandIn(path):
            app = make_app(quiet_settings(price_per_gpu_hour=0.001), monitor=fake_monitor("h200x2"),
                           open_run=str(path))
            async with app.run_test(size=(160, 50)) as pilot:
                screen = await open_dashboard(pilot, app, "running")
                await settle(pilot, app, screen)
                text = screen_text(app)
                assert "elapsed 6:00" in text and "cost < $0.01" in text and "$0.00" not in text

    run(scenario())


def test_header_names_zero_0_on_two_gpus_ddp_as_the_plan_does():
    """A two-GPU run without ZeRO: the plan's headline says "DDP", the dashboard said "ZeRO 0". Fake two H200s,
    a run directory whose header says zero_stage 0 and world size 2."""
    import json

    async def scenario():
        path = build_run(runs_dir(), "20261129-2100-ddp", status="running", steps=240)
        metrics = path / "metrics.jsonl"
        lines = metrics.read_text().splitlines()
        header = json.loads(lines[0])
        assert header["kind"] == "header" and header["world_size"] == 2
        metrics.write_text("\n".join([json.dumps({**header, "zero_stage": 0}), *lines[1:]]) + "\n")
        with SupervisorStandIn(path):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
            async with app.run_test(size=(120, 40)) as pilot:
                screen = await open_dashboard(pilot, app, "running")
                await settle(pilot, app, screen)
                first = screen_text(app).splitlines()[1]
                assert "DDP" in first and "ZeRO" not in first and "GPUs 0,1" in first

    run(scenario())


@pytest.mark.parametrize("directory, kind, model, last_step", [
    ("swift_output", "ms-swift", "Qwen/Qwen2.5-0.5B-Instruct", "100/100"),
    ("llamafactory_output", "LLaMA-Factory", "meta-llama/Llama-3.2-1B-Instruct", "100/100"),
])
def test_external_output_dirs_render(directory, kind, model, last_step):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(FIXTURES / directory))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.series.train_records > 0)
            screen._redraw()
            await pilot.pause()
            text = screen_text(app)
            assert model in text and f"read-only ({kind})" in text and f"step {last_step}" in text
            assert screen.series.series("eval_loss").points == 2
            assert "⠀" not in text and any(0x2801 <= ord(ch) <= 0x28FF for ch in text)  # braille drawn
            await pilot.press("k")  # stopping another tool's run is not ours to do: not offered at all
            await pilot.pause()
            assert isinstance(app.screen, DashboardScreen)
            assert "stop" not in {action for _key, action in
                                  ((k, a.binding.action) for k, a in app.screen.active_bindings.items())}

    run(scenario())


@pytest.mark.parametrize("recording, gpus", [("h200x2", (0, 1)), ("h200x8", tuple(range(8)))])
def test_gpu_charts_are_by_time_and_say_so(recording, gpus):
    """The GPU charts plot the monitor's readings (taken while the dashboard is open, not logged at a
    step): always by time, and their titles say it, while the run's charts follow x (steps, then time)."""
    path = build_run(runs_dir(), f"20261129-2100-{recording}", status="running", steps=240, gpus=gpus)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor(recording), open_run=str(path))
        async with app.run_test(size=(160, 50)) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await settle(pilot, app, screen)
            util, mem, loss = (screen.query_one(f"#chart-{name}") for name in ("gpu-util", "gpu-mem", "loss"))
            assert util.display and mem.display
            assert [spec.label for spec in util.series] == [str(i) for i in gpus]
            assert (util.axis, mem.axis, loss.axis) == ("time", "time", "step")
            text = screen_text(app)
            assert "GPU util % · x: time" in text and "GPU memory % · x: time" in text
            if recording == "h200x8":
                await assert_snapshot(pilot, app, "dashboard_h200x8_160x50")
            await pilot.press("x")  # the run's charts by time too; the GPU charts were already
            await wait_for(pilot, lambda: loss.axis == "time")
            assert (util.axis, mem.axis) == ("time", "time")

    with SupervisorStandIn(path):
        run(scenario())


def test_the_dashboard_reads_run_json_in_its_worker_and_charts_only_the_runs_gpus(monkeypatch):
    """Opening a run's dashboard read its run.json (RunDirectory.record, read_record now) in on_mount, on the UI thread: a
    slow disk froze the app. The file watcher reads it first now; the header still names the run's model
    and GPUs, and the GPU charts, which start once the run's GPUs are known, show GPU 1 alone though the
    GPU screen had readings of both before the dashboard opened."""
    import threading

    from core.runs import RunDirectory
    from tui.screens.runs import open_dashboard as open_run_dashboard

    path = build_run(runs_dir(), "20261129-2100-gpu1", status="running", steps=240, gpus=(1,))
    reads: list[bool] = []  # on the UI thread?
    real_read_record = RunDirectory.read_record

    def read_record(self):
        if Path(self.path) == path:
            reads.append(threading.current_thread() is threading.main_thread())
        return real_read_record(self)

    monkeypatch.setattr(RunDirectory, "read_record", read_record)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.gpu_snapshot is not None)  # the GPU screen's readings, of 0 and 1
            open_run_dashboard(app, path)
            screen = await open_dashboard(pilot, app, "running")
            await wait_for(pilot, lambda: screen.gpu_version > 0)
            assert reads and not any(reads), reads
            assert screen.gpu_indices == [1]
            assert sorted(screen.gpu_util) == [1] and sorted(screen.gpu_mem) == [1]
            screen._redraw()
            await pilot.pause()
            text = screen_text(app)
            assert "Qwen/Qwen2.5-7B-Instruct" in text and "GPUs 1" in text

    with SupervisorStandIn(path):
        run(scenario())


@pytest.mark.parametrize("visible", ["1", "GPU-7c60d23e"])
def test_a_run_launched_under_cuda_visible_devices_charts_the_physical_gpu_it_trains_on(visible):
    """A run launched under CUDA_VISIBLE_DEVICES=1 training on its GPU 0 (run.json ``gpus`` [0], its ``env``
    recording the variable) holds physical GPU 1; the dashboard charted NVML's GPU 0, another process's.
    Fake h200x2 box (GPUs 0 and 1, GPU 1's UUID starts GPU-7c60d23e: CUDA takes a UUID's start)."""
    import json

    path = build_run(runs_dir(), "20261129-2100-visible", status="running", steps=240, gpus=(0,))
    record = json.loads((path / "run.json").read_text(encoding="utf-8"))
    record["env"] = {"CUDA_VISIBLE_DEVICES": visible}
    (path / "run.json").write_text(json.dumps(record), encoding="utf-8")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await wait_for(pilot, lambda: screen.gpu_version > 0 and screen.gpu_indices)
            assert screen.gpu_indices == [1]
            assert sorted(screen.gpu_util) == [1] and sorted(screen.gpu_mem) == [1]
            screen._redraw()
            await pilot.pause()
            assert "GPUs 1" in screen_text(app)

    with SupervisorStandIn(path):
        run(scenario())


def test_events_scrolled_short_of_the_newest_come_back_on_the_next_tick():
    """A scroll made against a layout that changed after it (a busy box measures rows late) left the
    events short of the newest; the dashboard's tick puts a following table right, a moved cursor not."""
    path = build_run(runs_dir(), "20261129-2100-follow", status="finished", steps=600)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_dashboard(pilot, app, "finished", events=len(list(open(path / "events.jsonl"))))
            table = screen.query_one("#dash-events", EventsTable)
            await wait_for(pilot, lambda: table.at_newest and table.max_scroll_y > 0)
            table.scroll_home(animate=False, immediate=True)  # what a stale scroll leaves
            assert not table.at_newest
            await wait_for(pilot, lambda: table.at_newest)  # the next tick

    run(scenario())


def _stats_line(screen: DashboardScreen) -> str:
    from textual.widgets import Static

    return str(screen.query_one("#dash-info", Static).render()).splitlines()[1]


def test_a_stopping_run_shows_no_eta():
    """A stopping run ends at its next checkpoint, not at the planned end: the header showed "ETA 9:00" all
    the same. It shows none, as for a stalled run. (Two H200s recorded; a stand-in supervisor.)"""
    path = build_run(runs_dir(), "20261129-2100-stopping", status="stopping", steps=240)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await open_dashboard(pilot, app, "stopping")
            await settle(pilot, app, screen)
            line = _stats_line(screen)
            assert line.startswith("step 240/600 40%") and "elapsed 6:00" in line and "ETA" not in line, line

    with SupervisorStandIn(path):
        run(scenario())


def test_a_run_asked_to_resume_shows_its_checkpoints_step_and_no_eta_while_its_trainer_loads():
    """``resume --checkpoint 200`` of a run that had reached step 240: until the new trainer has loaded (minutes
    for a large model) its metrics file says nothing of the resume. The header showed "step 240/600 · elapsed
    6:00 · ETA 9:00", the given-up attempt's, while `tunedeck status` said step 200 and no ETA. Now it shows the
    figures at step 200, as status does. (Two H200s recorded; a stand-in supervisor.)"""
    import json

    from core.runs import RunDirectory

    path = build_run(runs_dir(), "20261129-2100-resuming", status="starting", steps=240)
    record = json.loads((path / "run.json").read_text(encoding="utf-8"))
    record["resumes"] = [{"time": "2026-11-29T22:00:00Z", "step": 200, "previous_status": "stopped"}]
    (path / "run.json").write_text(json.dumps(record), encoding="utf-8")
    figures = RunDirectory(path).latest_metrics()
    assert figures["step"] == 200 and figures["eta_s"] is None  # what `tunedeck status` says

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await open_dashboard(pilot, app, "starting")
            await wait_for(pilot, lambda: _stats_line(screen).startswith("step 200/600 33%"))
            line = _stats_line(screen)
            assert "ETA" not in line and "elapsed 5:00" in line, line  # the figures at step 200, not 240's 6:00

    with SupervisorStandIn(path):
        run(scenario())


def test_a_resume_that_changed_what_decides_the_total_shows_it_unknown_while_its_trainer_loads():
    """A resume with another epochs (or data) of a run at 240/600: while the new trainer loads, the header
    read "step 200/600 33%", a total the change made untrue. Now "step 200/?" until the trainer logs its
    count. (Two H200s recorded; a stand-in supervisor.)"""
    import json

    from core.runs import RunDirectory

    path = build_run(runs_dir(), "20261129-2100-recounting", status="starting", steps=240)
    record = json.loads((path / "run.json").read_text(encoding="utf-8"))
    record["resumes"] = [{"time": "2026-11-29T22:00:00Z", "step": 200, "previous_status": "stopped",
                          "total_steps": None}]  # what prepare_resume records when epochs or data changed
    (path / "run.json").write_text(json.dumps(record), encoding="utf-8")
    figures = RunDirectory(path).latest_metrics()
    assert figures["step"] == 200 and figures["total_steps"] is None and figures["total_unknown"]

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await open_dashboard(pilot, app, "starting")
            await wait_for(pilot, lambda: _stats_line(screen).startswith("step 200/?"))
            assert "600" not in _stats_line(screen), _stats_line(screen)

    with SupervisorStandIn(path):
        run(scenario())


def test_the_stats_line_fits_80_columns_dropping_the_least_important_figures_first():
    """At 80x24 the stats line wrapped ("… 4,681 tok/s · MFU" then " N/A" below), pushing every chart
    down a line: it keeps to one line now, the epoch going first. (Two H200s recorded.)"""
    from core.text_width import cell_len

    path = build_run(runs_dir(), "20261129-2100-narrow", status="running", steps=240)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await settle(pilot, app, screen)
            line = _stats_line(screen)
            assert cell_len(line) <= 78 and screen.query_one("#dash-info").size.height == 2, line
            assert line == "step 240/600 40% · elapsed 6:00 · ETA 9:00 · 12,000 tok/s · MFU 18%", line
            await pilot.resize_terminal(160, 50)  # room again: the epoch comes back
            await wait_for(pilot, lambda: "epoch 1.20" in _stats_line(screen))

    with SupervisorStandIn(path):
        run(scenario())


def test_fit_stats_drops_by_rank_and_keeps_the_step():
    from tui.screens.dashboard.header import STAT_KEPT, fit_stats

    parts = [("step 1/9", STAT_KEPT), ("epoch 0.10", 0), ("elapsed 0:01", 3), ("MFU 9%", 1)]
    assert fit_stats(parts, 80) == "step 1/9 · epoch 0.10 · elapsed 0:01 · MFU 9%"
    assert fit_stats(parts, 30) == "step 1/9 · elapsed 0:01"  # the epoch, then MFU, went first
    assert fit_stats(parts, 6) == "step …"  # the step alone, cut


def test_a_cpu_run_at_80x24_omits_mfu_and_its_numbers_read_alike_in_header_and_charts():
    """A CPU run (the bundled tiny model's kind) near 9,300 tok/s: no "MFU N/A"; the loss legend's EMA
    value whole, not "EMA 6.…"; the tokens chart's labels and legend with the header's thousands
    separator ("9,351", not "9351"); no "ZeRO 0" of its one process. (No GPU used by the run; the box's two H200s
    recorded.)"""
    from tests.fixtures.watch.run_builder import header_record, train_record, write_jsonl
    from tui.widgets.chart import LineChart

    path = build_run(runs_dir(), "20261129-2100-cpu", status="running", steps=40, gpus=())
    header = {**header_record(5400), "device": "cpu", "gpu_names": [], "world_size": 1, "precision": "fp32",
              "zero_stage": 0}
    # 9,340 tok/s over the steady steps (the header's figure), the last interval's too (the chart's legend)
    write_jsonl(path / "metrics.jsonl", [header] + [train_record(step, 5400, tokens_per_s=9300.0 + step,
                                                                 tokens_seen=round(step * 1.5 * 9340))
                                                    for step in range(1, 41)])

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await settle(pilot, app, screen, gpus=False)
            text = screen_text(app)
            assert "MFU" not in text and "N/A" not in text
            assert "· CPU ·" in text.splitlines()[1] and "ZeRO" not in text.splitlines()[1]  # no "ZeRO 0" on a CPU
            assert "9,340 tok/s" in _stats_line(screen)
            loss = screen.query_one("#chart-loss", LineChart)
            title = loss.render_line(0).text
            assert "…" not in title and "EMA " in title, title
            tokens = screen.query_one("#chart-tokens", LineChart)
            rows = [tokens.render_line(y).text for y in range(tokens.size.height)]
            assert "9,340" in rows[0], rows[0]  # the legend's last value
            assert any("9,3" in row and "┤" in row for row in rows[1:]), rows  # a y label
            assert not re.search(r"\b9\d{3}\b", "\n".join(rows)), rows  # never "9351" beside "9,340"

    with SupervisorStandIn(path):
        run(scenario())


def test_a_seven_character_y_label_keeps_a_blank_from_the_chart_on_its_left_at_80x24():
    """At 80 columns the charts stand two by two; the learning rate's top label ``1.6e-03`` (7 characters,
    ``format_axis``'s widest) ran into the loss line beside it when that line reached its chart's right edge on
    the same row: ``⠤⠤⣄⣀⣀⣀1.6e-03 ┤``. Every chart's gutter starts with a blank cell."""
    from tests.fixtures.watch.run_builder import header_record, train_record, write_jsonl
    from tui.widgets.chart import GUTTER, LineChart

    path = build_run(runs_dir(), "20261129-2100-warmup", status="running", steps=40)
    # The loss rises to its top row at the last step while the learning rate warms up to 1.6e-03 there.
    write_jsonl(path / "metrics.jsonl", [header_record(600)] + [
        train_record(step, 600, loss=round(1.0 + 0.05 * step, 4), learning_rate=round(1.6e-3 * step / 40, 8))
        for step in range(1, 41)])

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await settle(pilot, app, screen)
            loss = screen.query_one("#chart-loss", LineChart)
            lr = screen.query_one("#chart-lr", LineChart)
            assert lr.region.x == loss.region.right and lr.region.y == loss.region.y  # side by side, touching
            text = screen_text(app)
            row = next(line for line in text.splitlines() if "1.6e-03 ┤" in line)
            at = loss.region.right
            assert row[at - 1] != " " and row[at:at + GUTTER] == " 1.6e-03 ┤", row  # the loss line, a blank
            assert not re.search("[\u2801-\u28ff][0-9]", text), text  # no label glued to a line anywhere

    with SupervisorStandIn(path):
        run(scenario())


NO_DATA_REASON = ("The data has a problem:\n  /tmp/bad/vanish.jsonl: file not found; give the path of a .jsonl, "
                  ".json, .csv, .parquet or .txt file (or a hub dataset id owner/name)")


@pytest.mark.parametrize("gpus, config, first_line", [
    ((0, 1), "precision: bf16\nzero_stage: 2\n", "Qwen/Qwen2.5-7B-Instruct · lora · bf16 · ZeRO 2 · GPUs 0,1 · failed"),
    ((), "precision: fp32\nzero_stage: 0\n", "Qwen/Qwen2.5-7B-Instruct · lora · fp32 · CPU · failed"),
], ids=["gpus", "cpu"])
def test_a_run_that_failed_before_its_first_step_says_so_at_80x24(gpus, config, first_line):
    """Its dataset deleted right after 'tunedeck train': the run failed with no metrics.jsonl at all. The
    charts said "waiting for the first metrics…" for ever, the header "N/A" for the precision its
    config.yaml gives (the stats line "N/A" five times), and the reason was cut mid-sentence at 80×24. Now
    the charts and the stats line say no metric is coming, the header has what config.yaml says, and the
    reason is on screen to its last word."""
    from tui.widgets.chart import LineChart

    path = build_run(runs_dir(), "20261129-2100-vanish", status="failed", steps=0, reason=NO_DATA_REASON,
                     gpus=gpus)
    (path / "metrics.jsonl").unlink()  # the trainer never got as far as its header
    with open(path / "config.yaml", "a", encoding="utf-8") as handle:
        handle.write(config)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.status == "failed" and screen.backfilled and screen.query_one(
                "#chart-loss", LineChart).empty_text == "no metrics: ended before step 1")
            app.clear_notifications()
            await wait_screen_stable(pilot, app)
            text = screen_text(app)
            assert "waiting for the first metrics" not in text
            # each of the four charts, and the stats line, with no "N/A" for what no step gave
            assert text.count("no metrics: ended before step 1") == 5, text
            assert "step – · no metrics: ended before step 1" in text and "N/A" not in text, text
            assert text.splitlines()[1].strip() == first_line, text
            info = " ".join(screen.query_one("#dash-info").render().plain.split())
            assert " ".join(NO_DATA_REASON.split()) in info  # the whole reason, wrapped
            shown = " ".join(text.split())
            assert "(or a hub dataset id owner/name)" in shown, text  # its end on screen, not cut

    run(scenario())


def test_a_run_with_no_metrics_yet_still_waits_for_them():
    """The same empty run while it runs (loading its model): its first metrics are still to come."""
    from tui.widgets.chart import LineChart

    path = build_run(runs_dir(), "20261129-2100-loading", status="running", steps=0)
    (path / "metrics.jsonl").unlink()

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.status == "running" and screen.backfilled)
            screen._redraw()
            await pilot.pause()
            assert screen.query_one("#chart-loss", LineChart).empty_text == "waiting for the first metrics…"
            assert not screen.has_class("-ended")
            stats = screen.query_one("#dash-info").render().plain.splitlines()[1]
            assert stats == "step – · waiting for the first metrics…", stats

    with SupervisorStandIn(path):
        run(scenario())


def test_y_copies_train_on_the_runs_own_config_by_its_absolute_path(monkeypatch, tmp_path):
    """y copied the launch's own command ("tunedeck train home/plans/tiny.yaml method=lora …": a path
    relative to where the app was started, of a plan file later wizard launches overwrite). It copies
    ``tunedeck train <run dir>/config.yaml`` now, absolute, whatever the run's state and the app's
    directory. (Two H200s recorded; runs built on disk.)"""
    import shlex

    monkeypatch.chdir(tmp_path)  # the app started somewhere else than the runs
    done = build_run(runs_dir(), "20261129-2100-copy", status="stopped", steps=120)
    add_checkpoint(done, 100)  # resumable: still the command that reproduces it, u resumes

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=done.name)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_dashboard(pilot, app, "stopped")
            await pilot.press("y")
            await wait_for(pilot, lambda: app.clipboard != "")
            argv = shlex.split(app.clipboard)
            assert argv == ["tunedeck", "train", str((done / "config.yaml").resolve())], argv
            assert Path(argv[2]).is_absolute() and Path(argv[2]).is_file()
            assert screen.source.run_id in argv[2] and "configs/qwen7b-lora.yaml" not in app.clipboard

    run(scenario())


def test_a_demo_run_shows_the_bundled_model_as_tiny_in_the_dashboard_and_the_runs_list():
    """A demo run records the bundled model's folder ("/…/core/assets/tiny"), a wizard run its name: both
    are shown as "tiny" (core.assets.model_label), in the dashboard's header, the Runs list and
    ``tunedeck runs``' summary alike. (Two H200s recorded; runs built on disk.)"""
    import json

    from core.assets import model_label, tiny_model_dir
    from core.runs import RunDirectory
    from core.runs.listing import summarize
    from tests.fixtures.watch.run_builder import header_record, train_record, write_jsonl
    from tui.screens.runs import RunsScreen

    folder = str(tiny_model_dir())
    assert model_label(folder) == "tiny" and model_label("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"
    path = build_run(runs_dir(), "20261129-2100-demo", status="finished", steps=40)
    record = json.loads((path / "run.json").read_text(encoding="utf-8"))
    record["config_summary"]["model"] = folder
    (path / "run.json").write_text(json.dumps(record), encoding="utf-8")
    write_jsonl(path / "metrics.jsonl", [{**header_record(40), "model": folder}]
                + [train_record(step, 40) for step in range(1, 41)])
    assert summarize(RunDirectory(path)).model == "tiny"

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            await open_dashboard(pilot, app, "finished")
            text = screen_text(app)
            assert text.splitlines()[1].strip().startswith("tiny · lora"), text.splitlines()[1]
            assert "assets" not in text
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.listed)
            await pilot.pause()
            text = screen_text(app)
            assert "tiny" in text and "assets" not in text

    run(scenario())


def test_a_run_resumed_from_a_moved_model_folder_shows_the_new_folder_as_tunedeck_runs_does():
    """``resume RUN model=NEW`` (the model folder moved) updates run.json's summary, which ``tunedeck runs``
    shows; the dashboard showed the metrics header's model, the first attempt's folder, no longer there.
    (Two H200s recorded; runs built on disk.)"""
    import json

    from core.runs import RunDirectory
    from core.runs.listing import summarize
    from tests.fixtures.watch.run_builder import header_record, train_record, write_jsonl

    path = build_run(runs_dir(), "20261129-2100-moved", status="stopped", steps=40)
    add_checkpoint(path, 40)
    record = json.loads((path / "run.json").read_text(encoding="utf-8"))
    record["config_summary"]["model"] = "/data/models/moved-model"
    (path / "run.json").write_text(json.dumps(record), encoding="utf-8")
    write_jsonl(path / "metrics.jsonl", [{**header_record(80), "model": "/data/models/old-model"}]
                + [train_record(step, 80) for step in range(1, 41)])
    assert summarize(RunDirectory(path)).model == "/data/models/moved-model"

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            await open_dashboard(pilot, app, "stopped")
            await wait_for(pilot, lambda: "moved-model" in screen_text(app).splitlines()[1])
            assert "old-model" not in screen_text(app)

    run(scenario())


def test_a_stopped_runs_reason_names_u_on_the_dashboard_and_the_command_in_tunedeck_status(capsys):
    """The stored reason (a message record, as the trainer writes it) says "continue with tunedeck resume":
    `tunedeck status` shows that; the dashboard, where `u` resumes the run, words it for itself (header and
    the stopped event). Fake GPUs: h200x2."""
    import json

    from core import cli
    from core.i18n import Message, stored_reason

    path = build_run(runs_dir(), "20261129-2100-stopped", status="stopped", steps=240)
    add_checkpoint(path, 240)
    status = {"status": "stopped", **stored_reason(Message("train.stopped_at", step=240, id=path.name)),
              "updated": "2026-11-29T21:10:00Z", "updated_ts": 1.0}
    (path / "status.json").write_text(json.dumps(status), encoding="utf-8")
    with (path / "events.jsonl").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"time": "2026-11-29T21:10:00Z", "ts": 3.0, "event": "stopped", "step": 240,
                                 **stored_reason(Message("train.stopped_at", step=240, id=path.name))}) + "\n")

    assert cli.main(["status", path.name]) == 0
    assert f"stopped at step 240; checkpoint saved (continue with tunedeck resume {path.name})" in capsys.readouterr().out

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(160, 50)) as pilot:
            screen = await open_dashboard(pilot, app, "stopped")
            await wait_for(pilot, lambda: screen.events and screen.events[-1].get("event") == "stopped")
            await settle(pilot, app, screen)
            assert screen.reason == "stopped at step 240; checkpoint saved (u resumes it)"
            text = screen_text(app)
            assert "(u resumes it)" in text and "tunedeck resume" not in text

    run(scenario())


@pytest.mark.parametrize("directory, drop, first_line", [
    ("llamafactory_output", ("training_args.yaml",), "finished  read-only (LLaMA-Factory)"),
    ("llamafactory_output", (), "meta-llama/Llama-3.2-1B-Instruct · lora · bf16 · finished  read-only (LLaMA-Factory)"),
    ("swift_output", (), "Qwen/Qwen2.5-0.5B-Instruct · lora · bfloat16 · finished  read-only (ms-swift)"),
], ids=["llamafactory-no-args", "llamafactory", "swift"])
def test_an_external_dirs_first_line_leaves_out_what_is_not_known(tmp_path, directory, drop, first_line):
    """A LLaMA-Factory folder without its training_args.yaml read "N/A · N/A · N/A · ZeRO N/A · GPUs N/A",
    an ms-swift folder "… · ZeRO N/A · GPUs N/A": what is not known (no saved arguments, no DeepSpeed, a box
    without GPUs: fake_monitor("none")) is left out, at a width where nothing has to go for room."""
    import shutil

    folder = tmp_path / directory
    shutil.copytree(FIXTURES / directory, folder)
    for name in drop:
        (folder / name).unlink()

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(folder))
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.series.train_records > 0 and screen.status == "finished")
            screen._show_info()
            await pilot.pause()
            first = screen_text(app).splitlines()[1].strip()
            assert first == first_line and "N/A" not in screen_text(app), first

    run(scenario())


@pytest.mark.parametrize("directory, title, shows", [
    ("swift_output", "log", "no log file in this folder (looked for train.log, running_log.txt, log.txt, train.txt)"),
    ("hf_output", "log", "no log file in this folder (looked for train.log, running_log.txt, log.txt, train.txt)"),
    ("llamafactory_output", "running_log.txt", None),
], ids=["swift", "hf", "llamafactory"])
def test_the_log_panel_is_titled_for_its_file_or_says_there_is_none(tmp_path, directory, title, shows):
    """An ms-swift or HF Trainer folder without a log file showed an empty panel titled "train.log"; the
    panel is titled for the file it follows (LLaMA-Factory's running_log.txt) or says there is none and
    which names were looked for. No GPUs (fake_monitor("none"))."""
    from tests.tui.test_dashboard_watch_hf import write_checkpoint

    folder = FIXTURES / directory
    if directory == "hf_output":
        folder = tmp_path / "hf"
        write_checkpoint(folder, 10, 0.05)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(folder))
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.series.train_records > 0 and (
                shows or screen.query_one("#dash-log", LogPane).lines))
            await pilot.pause()
            pane = screen.query_one("#dash-log", LogPane)
            assert pane.border_title == title
            text = " ".join(screen_text(app).split())
            assert "train.log ─" not in screen_text(app)
            if shows:
                assert shows in text, text
            else:
                assert "no log file" not in text

    run(scenario())


@pytest.mark.parametrize("directory, shown", [
    ("swift_output", ("GPU mem 15.5 GiB (from ms-swift's log)", "8.0 s/it")),
    ("llamafactory_output", ("GPU mem 12.3 GiB (from LLaMA-Factory's log)", "1,950 tok/s")),
], ids=["swift", "llamafactory"])
def test_the_memory_and_step_rate_another_trainer_logs_are_on_the_stats_line(tmp_path, directory, shown):
    """ms-swift's memory(GiB) and train_speed(iter/s), LLaMA-Factory's vram_allocated: read by the adapters,
    shown nowhere (a watched ms-swift folder had no throughput and no memory on screen). The step rate
    stands where tokens/s is not logged (ms-swift); LLaMA-Factory's throughput is tokens/s. No GPUs
    (fake_monitor("none")): the memory is the log's, not NVML's."""
    import json
    import shutil

    folder = tmp_path / directory
    shutil.copytree(FIXTURES / directory, folder)
    if directory == "llamafactory_output":
        with (folder / "trainer_log.jsonl").open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"current_steps": 105, "total_steps": 200, "loss": 0.9, "lr": 1e-5, "epoch": 3.1,
                                     "elapsed_time": "0:08:50", "remaining_time": "0:08:00", "throughput": 1950.0,
                                     "vram_allocated": 12.34}) + "\n")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(folder))
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.backfilled and screen.series.train_records > 0)
            screen._show_info()
            await pilot.pause()
            line = _stats_line(screen)
            assert all(text in line for text in shown), line

    run(scenario())


@pytest.mark.parametrize("size", [(160, 50), (80, 24)])
def test_a_run_whose_gpu_is_lost_mid_training_says_so_in_its_gpu_panel(size):
    """Fake GPUs: h200x2, the run on GPU 1, which answers NVML_ERROR_GPU_IS_LOST (Xid 79) from the second poll
    on. Its GPU charts only stopped (gaps), as a quiet GPU's would; now their titles say the GPU is lost, the
    header marks it, and a toast says what happened and what to do (at 80x24, where the charts are not shown).
    The reading comes from the app's poll worker, as every reading does."""
    from core.hardware.fake_nvml import fake_nvml_from_recording
    from core.hardware.host import RecordedHostSampler
    from core.hardware.monitor import HardwareMonitor
    from core.hardware.nvml_backend import NvmlBackend
    from core.hardware.processes import RecordedProcessResolver
    from core.i18n import t
    from tests.tui.conftest import GPU_FIXTURES, StepClock

    path = build_run(runs_dir(), "20261129-2100-xid79", status="running", steps=240, gpus=(1,))

    async def scenario():
        clock = StepClock()
        fake = fake_nvml_from_recording(GPU_FIXTURES / "h200x2.json", clock=clock)
        resolver = RecordedProcessResolver({p.pid: p for g in fake.recording.gpus for p in g.processes})
        monitor = HardwareMonitor(NvmlBackend(fake, resolver), RecordedHostSampler(fake.recording.host),
                                  clock=clock, synthetic=True)
        app = make_app(quiet_settings(), monitor=monitor, open_run=str(path))
        async with app.run_test(size=size) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await settle(pilot, app, screen)
            assert screen.gpu_indices == [1] and screen.gpu_lost == ()
            assert "(1 lost)" not in screen_text(app) and "GPU 1 lost" not in screen_text(app)
            fake.lost.add(1)
            clock.advance(1.0)
            app.poll_gpus_now()
            await wait_for(pilot, lambda: screen.gpu_lost == (1,))
            screen._redraw()
            await wait_screen_stable(pilot, app)
            text = screen_text(app)
            assert "GPUs 1 (1 lost)" in text
            notes = [(str(n.message), n.severity) for n in app._notifications]
            assert (t("dashboard.gpu_lost_alert", gpus="1"), "error") in notes
            util = screen.query_one("#chart-gpu-util")
            if util.display:
                assert "GPU util % · x: time · GPU 1 lost" in text and "GPU memory % · x: time · GPU 1 lost" in text
            assert size == (80, 24) or util.display
            clock.advance(1.0)
            app.poll_gpus_now()  # still lost: said once, not at every reading
            await wait_for(pilot, lambda: len(screen.util_samples) >= 3)
            assert [m for m, _s in ((str(n.message), n.severity) for n in app._notifications)
                    ].count(t("dashboard.gpu_lost_alert", gpus="1")) == 1

    with SupervisorStandIn(path):
        run(scenario())
