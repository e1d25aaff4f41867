"""Dashboard noise (#18 item 9): few points drawn as a line, a Tokens/s spike clipped and marked, no box
GPUs beside a CPU run, one toast per throughput collapse, a metric another tool does not log said so,
and Esc from ``tunedeck watch DIR`` back to the shell rather than to tunedeck's Runs list."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from core.paths import runs_dir
from core.watch.alerts import REARM_S, AlertGate
from tests.fixtures.watch.run_builder import (
    SupervisorStandIn,
    build_run,
    header_record,
    train_record,
    write_jsonl,
)
from tests.tui.conftest import (
    StepClock,
    assert_snapshot,
    fake_monitor,
    quiet_settings,
    screen_text,
    wait_for,
    wait_screen_stable,
)
from tests.tui.test_dashboard_render import open_dashboard, settle
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.widgets.chart import GUTTER, LineChart

FIXTURES = Path(__file__).parents[1] / "fixtures" / "watch"


def run(coro):
    return asyncio.run(coro)


def plot_rows(chart: LineChart) -> list[str]:
    """The plot rows of a chart as drawn (title and x labels left out), from the gutter on."""
    return [strip.text[GUTTER:] for strip in chart._strips[1:-1]]


def painted_columns(chart: LineChart) -> list[bool]:
    rows = plot_rows(chart)
    return [any(0x2801 <= ord(row[cx]) <= 0x28FF for row in rows) for cx in range(len(rows[0]))]


def few_points_run(run_id: str = "20261129-2100-few") -> Path:
    return build_run(runs_dir(), run_id, status="running", steps=3, evals_every=0, log_lines=3)


def spike_run(run_id: str = "20261129-2100-spike") -> Path:
    """120 steps at a steady ~12k tokens/s but for the first, a warm-up step that read 52k."""
    path = build_run(runs_dir(), run_id, status="running", steps=120, evals_every=0)
    records = [header_record(600)] + [train_record(step, 600, **({"tokens_per_s": 52_000.0} if step == 1 else {}))
                                      for step in range(1, 121)]
    write_jsonl(path / "metrics.jsonl", records)
    return path


async def few_points_scenario(size, snapshot: str | None) -> None:
    path = few_points_run()
    with SupervisorStandIn(path):
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path), persist_settings=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await settle(pilot, app, screen)
            for chart_id in ("#chart-loss", "#chart-lr", "#chart-grad", "#chart-tokens"):
                columns = painted_columns(screen.query_one(chart_id, LineChart))
                # three points at the left edge, the middle and the right edge, and the line between them
                assert all(columns), f"{chart_id}: gaps in the line of 3 points {columns}"
            if snapshot:
                await assert_snapshot(pilot, app, snapshot)
            await pilot.press("x")  # the time axis joins the same three points
            await wait_for(pilot, lambda: screen.axis == "time")
            await wait_screen_stable(pilot, app)
            assert all(painted_columns(screen.query_one("#chart-loss", LineChart)))


def test_three_points_read_as_a_curve_at_80x24():
    run(few_points_scenario((80, 24), "dashboard_few_points_80x24"))


async def spike_scenario(size, snapshot: str | None) -> None:
    path = spike_run()
    with SupervisorStandIn(path):
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path), persist_settings=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await settle(pilot, app, screen)
            chart = screen.query_one("#chart-tokens", LineChart)
            assert chart.clipped_peak == 52_000.0
            title, top_row = chart._strips[0].text, chart._strips[1].text
            assert "↑52.0k" in title  # the spike's value is kept, in the title
            assert top_row.lstrip().startswith("12.6k ┤")  # the steady rate sets the top of the axis
            assert top_row[GUTTER] == "↑"  # the clipped column is marked where the spike goes on above
            rows = plot_rows(chart)
            # the steady rate fills the chart: it is drawn in the top row, not squeezed under a 52k top
            assert sum(0x2801 <= ord(ch) <= 0x28FF for ch in rows[0]) > len(rows[0]) // 2
            if snapshot:
                await assert_snapshot(pilot, app, snapshot)
            await pilot.press("x")
            await wait_for(pilot, lambda: screen.axis == "time")
            await wait_screen_stable(pilot, app)
            assert chart.clipped_peak == 52_000.0 and chart._strips[1].text[GUTTER] == "↑"


def test_a_tokens_spike_is_clipped_and_marked_at_80x24():
    run(spike_scenario((80, 24), "dashboard_spike_80x24"))


def test_the_axis_labels_share_one_format_at_160x50():
    path = spike_run("20261129-2100-spike-wide")
    with SupervisorStandIn(path):
        async def scenario():
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
            async with app.run_test(size=(160, 50)) as pilot:
                screen = await open_dashboard(pilot, app, "running")
                await settle(pilot, app, screen)
                labels = [strip.text[:GUTTER].strip(" ┤│") for strip in
                          screen.query_one("#chart-tokens", LineChart)._strips[1:-1]]
                assert [label for label in labels if label] == ["12.6k", "6.3k", "0"]

        run(scenario())


class CountingMonitor:
    """The fake monitor, counting its polls: a test can wait until the dashboard had a GPU reading."""

    def __init__(self, monitor) -> None:
        self.monitor = monitor
        self.polls = 0

    def __getattr__(self, name):
        return getattr(self.monitor, name)

    def poll(self):
        snapshot = self.monitor.poll()
        self.polls += 1
        return snapshot


def test_a_cpu_run_shows_no_gpu_charts_of_the_box():
    path = build_run(runs_dir(), "20261129-2100-cpu", status="running", steps=40, gpus=())
    header = {**header_record(600), "device": "cpu", "gpu_names": [], "world_size": 1, "precision": "fp32"}
    write_jsonl(path / "metrics.jsonl", [header] + [train_record(step, 600) for step in range(1, 41)])

    async def scenario():
        monitor = CountingMonitor(fake_monitor("h200x2"))  # the box has GPUs; this run uses none of them
        app = make_app(quiet_settings(), monitor=monitor, open_run=str(path))
        async with app.run_test(size=(120, 40)) as pilot:  # tall enough for the GPU charts of a GPU run
            screen = await open_dashboard(pilot, app, "running")
            await wait_for(pilot, lambda: monitor.polls > 0)
            await pilot.press("x")  # either axis: the GPU charts stay away
            await wait_for(pilot, lambda: screen.axis == "time")
            await wait_screen_stable(pilot, app)
            text = screen_text(app)
            assert "GPU util %" not in text and "GPU memory %" not in text and "no GPU readings" not in text
            assert not screen.gpu_util and not screen.gpu_mem
            assert "· CPU ·" in text and "GPUs" not in text.splitlines()[1]
            assert "Loss" in text and "Tokens/s" in text

    with SupervisorStandIn(path):
        run(scenario())


def test_another_hosts_run_is_said_to_be_there_and_charts_none_of_this_boxs_gpus():
    """A data root shared between nodes (NFS): a run whose run.json names another host trains on that
    host's GPUs 0 and 1, and its supervisor's pid is that host's. The dashboard charted this box's GPUs 0
    and 1 as the run's, and found no supervisor here, so called the run crashed. Now it says the run is on
    that host, charts none of this box's GPUs, and leaves its state as recorded. Box: the two H200s of
    h200x2.json (fake monitor); no supervisor of the run on this box."""
    path = build_run(runs_dir(), "20261129-2100-remote", status="running", steps=40, gpus=(0, 1))
    record = json.loads((path / "run.json").read_text())
    (path / "run.json").write_text(json.dumps({**record, "host": "node-b"}))

    async def scenario():
        monitor = CountingMonitor(fake_monitor("h200x2"))  # this box's GPUs: none of them the run's
        app = make_app(quiet_settings(), monitor=monitor, open_run=str(path))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            await wait_for(pilot, lambda: monitor.polls > 0)
            await wait_for(pilot, lambda: "on host node-b" in screen_text(app).splitlines()[1])
            screen._redraw()
            await wait_screen_stable(pilot, app)
            text = screen_text(app)
            assert "GPU util %" not in text and "GPU memory %" not in text, text
            assert not screen.gpu_util and not screen.gpu_mem
            assert "GPUs" not in text.splitlines()[1] and "running" in text.splitlines()[1]

    run(scenario())


def test_throughput_collapse_toasts_once_per_episode():
    path = build_run(runs_dir(), "20261129-2100-slow", status="running", steps=30, evals_every=0)
    clock = StepClock()

    def append(step: int, tokens: float) -> None:
        with open(path / "metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(train_record(step, 600, tokens_per_s=tokens)) + "\n")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        toasts: list[str] = []
        notify = app.notify

        def recording(message, *args, **kwargs):
            toasts.append(str(message))
            return notify(message, *args, **kwargs)

        app.notify = recording
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await open_dashboard(pilot, app, "running")
            screen.gate = AlertGate(clock)
            step = 30

            async def write(tokens: float, seconds: float = 0.5) -> None:
                nonlocal step
                step += 1
                clock.advance(seconds)
                append(step, tokens)
                await wait_for(pilot, lambda: screen.series.latest.get("step") == step)

            # 15 s of a rate at the threshold: collapsed, back, collapsed … every other poll
            for n in range(30):
                await write(1_000.0 if n % 2 == 0 else 12_000.0)
            collapsed = [m for m in toasts if m.startswith("Throughput collapsed")]
            assert len(collapsed) == 1, collapsed
            assert "1,000 tokens/s" in collapsed[0]
            # the rate recovers for longer than the gate waits, then collapses again: a second episode
            await write(12_000.0)
            await write(12_000.0, seconds=REARM_S + 1)
            await write(900.0)
            assert len([m for m in toasts if m.startswith("Throughput collapsed")]) == 2

    with SupervisorStandIn(path):
        run(scenario())


def test_an_ended_runs_history_toasts_no_throughput_collapse():
    """Opening a finished run whose last step read 500 tokens/s against ~12k toasted "Throughput collapsed"
    (and rang the bell where set), as if it were happening now. Alerts are for a live run. One fake H200."""
    path = build_run(runs_dir(), "20261129-2100-ended-slow", status="finished", steps=599, evals_every=0)
    with open(path / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(train_record(600, 600, tokens_per_s=500.0)) + "\n")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), open_run=str(path))
        toasts: list[str] = []
        notify = app.notify

        def recording(message, *args, **kwargs):
            toasts.append(str(message))
            return notify(message, *args, **kwargs)

        app.notify = recording
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_dashboard(pilot, app, "finished")
            await wait_for(pilot, lambda: screen.series.train_records == 600 and screen.status == "finished")
            await pilot.pause()
            assert screen.series.latest.get("tokens_per_s") == 500.0
            assert not [m for m in toasts if m.startswith("Throughput collapsed")], toasts

    run(scenario())


def test_a_watched_folder_says_which_metric_it_does_not_log_and_esc_quits():
    async def scenario(directory: str, missing: str, present: str, kind: str):
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(FIXTURES / directory))
        async with app.run_test(size=(80, 24)) as pilot:  # as `tunedeck watch DIR` opens it
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.backfilled and screen.series.train_records > 0)
            screen._redraw()
            await wait_screen_stable(pilot, app)
            text = screen_text(app)
            assert "waiting" not in text
            assert f"not in this source ({kind})" in screen.query_one(missing, LineChart)._strips[3].text
            assert screen.query_one(present, LineChart).clipped_peak is None
            # Esc quits, as q does: the footer says it once (q Quit), Esc is not offered as Back to runs
            assert "q Quit" in text and "Esc Quit" not in text and "Back to runs" not in text
            await pilot.press("escape")  # back to the shell it came from, not to tunedeck's Runs list
            await wait_for(pilot, lambda: app.return_code is not None)
            assert app.current_mode == "runs" and isinstance(app.screen, DashboardScreen)

    run(scenario("swift_output", "#chart-tokens", "#chart-grad", "ms-swift"))
    run(scenario("llamafactory_output", "#chart-grad", "#chart-tokens", "LLaMA-Factory"))


def test_a_copied_run_folder_quits_on_esc_and_a_run_of_tunedeck_home_goes_back_to_runs(tmp_path):
    copied = build_run(tmp_path / "elsewhere", "20261129-2100-copy", status="finished", steps=40)
    mine = build_run(runs_dir(), "20261129-2100-mine", status="finished", steps=40)

    async def scenario(path: Path, quits: bool):
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path))
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_dashboard(pilot, app, "finished")
            await pilot.press("f")  # the full log view first: Esc leaves it, it does not quit
            await wait_for(pilot, lambda: screen.has_class("-full"))
            await pilot.press("escape")
            await wait_for(pilot, lambda: not screen.has_class("-full"))
            assert app.return_code is None
            await pilot.press("escape")
            if quits:
                await wait_for(pilot, lambda: app.return_code is not None)
            else:
                await wait_for(pilot, lambda: not isinstance(app.screen, DashboardScreen))
                assert app.current_mode == "runs" and app.return_code is None

    run(scenario(copied, quits=True))
    run(scenario(mine, quits=False))
