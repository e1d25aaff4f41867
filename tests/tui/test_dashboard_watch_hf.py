"""``tunedeck watch`` of an HF Trainer output dir whose files change under it: a real watch (the dashboard's
file worker) of a temp dir that the test rewrites, checked through what the charts draw.

Hardware assumed: none (no GPU: the fake monitor has none); the waits are for states, with generous
ceilings for a loaded 2-core box."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from tests.tui.conftest import fake_monitor, quiet_settings, wait_for
from tui.app import make_app
from tui.screens.dashboard import DashboardScreen
from tui.widgets.chart import LineChart


def write_checkpoint(folder: Path, steps: int, slope: float, max_steps: int = 40) -> None:
    """checkpoint-<steps>/trainer_state.json with log_history steps 1..steps, loss = 2.0 - slope * step."""
    history = [{"step": i, "loss": round(2.0 - slope * i, 4), "learning_rate": 5e-5, "epoch": i / max_steps}
               for i in range(1, steps + 1)]
    state = {"global_step": steps, "max_steps": max_steps, "log_history": history}
    checkpoint = folder / f"checkpoint-{steps}"
    checkpoint.mkdir(parents=True, exist_ok=True)
    path = checkpoint / "trainer_state.json"
    path.write_text(json.dumps(state), encoding="utf-8")
    now = time.time()
    os.utime(path, (now, now))


def chart_text(screen: DashboardScreen, chart_id: str) -> list[str]:
    """The rows the chart last drew (title first, x range last)."""
    return [strip.text for strip in screen.query_one(chart_id, LineChart)._strips]


def x_axis_ends_at(screen: DashboardScreen, last: str) -> bool:
    rows = chart_text(screen, "#chart-loss")
    return len(rows) > 2 and rows[-1].rstrip().endswith(" " + last)


def settled(screen: DashboardScreen) -> bool:
    """The whole history read (the backfill done), and the loss chart has drawn what it was last given."""
    chart = screen.query_one("#chart-loss", LineChart)
    given = (chart.data_version, chart.axis, chart.note, chart.empty_text)
    return screen.backfilled and not screen._dirty and chart._key is not None and chart._key[0] == given


def test_a_checkpoint_with_a_different_history_redraws_the_charts_from_it(tmp_path):
    folder = tmp_path / "hf"
    write_checkpoint(folder, 10, 0.05)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(folder))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: x_axis_ends_at(screen, "10") and settled(screen))
            assert "1.5" in chart_text(screen, "#chart-loss")[0]  # raw loss at step 10: 2.0 - 0.05 * 10
            # A new checkpoint whose history is not the old one continued (another run in the same dir):
            # the feed starts over, and the charts must draw the new history, not keep the old drawing.
            write_checkpoint(folder, 20, 0.03)
            await wait_for(pilot, lambda: x_axis_ends_at(screen, "20"))
            title = chart_text(screen, "#chart-loss")[0]
            assert "1.4" in title and "1.5" not in title  # raw loss at step 20: 2.0 - 0.03 * 20
            assert screen.series.train_records == 20  # the new history only, not both
            # and a consistent extension of the new history is followed as before
            write_checkpoint(folder, 30, 0.03)
            await wait_for(pilot, lambda: x_axis_ends_at(screen, "30"))
            assert "1.1" in chart_text(screen, "#chart-loss")[0]

    asyncio.run(scenario())


def test_a_trainer_state_that_does_not_parse_is_said_in_the_header(tmp_path):
    folder = tmp_path / "hf"
    write_checkpoint(folder, 10, 0.05)
    path = folder / "checkpoint-10" / "trainer_state.json"
    path.write_bytes(path.read_bytes()[:200])  # a torn write that stays torn
    long_ago = time.time() - 3600
    os.utime(path, (long_ago, long_ago))

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(folder))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: "cannot be read" in str(screen.query_one("#dash-info").render()))
            assert screen.source_problem.startswith("checkpoint-10/trainer_state.json cannot be read (")
            assert screen.source_problem.endswith("): waiting for a whole write")

    asyncio.run(scenario())


def test_at_80x24_the_first_info_line_and_each_chart_title_keep_to_their_room(tmp_path):
    """The first info line wrapped ("… running  read-only (HF" / "Trainer)") under a long model name, and
    the Loss and Learning-rate titles ran together ("━ EMA 1.776 Learning rate"). Now the line drops the
    unknown figures and shortens the model, and each title leaves blank cells at its chart's right edge."""
    from core.text_width import cell_len
    from tui.widgets.chart import TITLE_GAP

    folder = tmp_path / "hf"
    write_checkpoint(folder, 10, 0.05)
    model = "meta-llama/Meta-Llama-3.1-70B-Instruct-abliterated-long-name"
    (folder / "checkpoint-10" / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": model, "peft_type": "LORA", "r": 8}), encoding="utf-8")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(folder))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: x_axis_ends_at(screen, "10") and settled(screen) and screen.status)
            screen._show_info()
            await pilot.pause()
            info = screen.query_one("#dash-info")
            lines = [strip.text.rstrip() for strip in info.render_lines(info.region.reset_offset)]
            first = lines[0].strip()
            assert info.size.height == 2, lines  # the first line and the stats line, nothing wrapped
            assert cell_len(first) <= 78 and first.endswith("running  read-only (HF Trainer)"), first
            assert first.startswith("meta-llama/Meta-Llama-3.1") and "…" in first  # shortened, not dropped
            assert "ZeRO N/A" not in first  # an unknown figure went first
            loss, lr = chart_text(screen, "#chart-loss")[0], chart_text(screen, "#chart-lr")[0]
            assert loss.endswith(" " * TITLE_GAP) and lr.endswith(" " * TITLE_GAP), (loss, lr)
            assert "EMA 1.776" in loss  # the legends still whole: the axis note went instead

    asyncio.run(scenario())


def test_fit_first_line_shortens_the_model_then_drops_by_rank_and_keeps_the_state():
    from tui.screens.dashboard.header import MODEL_RANK, SEPARATOR, STAT_KEPT, fit_first_line

    parts = [("org/a-very-long-model-name", MODEL_RANK, "", "b"), ("lora", 4, SEPARATOR, ""),
             ("ZeRO 2", 1, SEPARATOR, ""), ("running", STAT_KEPT, SEPARATOR, "$success"),
             ("read-only (HF Trainer)", 5, "  ", "$foreground-muted")]
    assert fit_first_line(parts, 200) == ("[b]org/a-very-long-model-name[/] · lora · ZeRO 2 · [$success]running[/]"
                                          "  [$foreground-muted]read-only (HF Trainer)[/]")
    assert fit_first_line(parts, 70) == ("[b]org/a-very-long-mod…[/] · lora · ZeRO 2 · [$success]running[/]"
                                         "  [$foreground-muted]read-only (HF Trainer)[/]")  # the model first
    assert fit_first_line(parts, 60) == ("[b]org/a-very-…[/] · lora · [$success]running[/]"
                                         "  [$foreground-muted]read-only (HF Trainer)[/]")  # then the lowest rank
    assert fit_first_line(parts, 50) == ("[b]org/a-very-…[/] · [$success]running[/]"
                                         "  [$foreground-muted]read-only (HF Trainer)[/]")
    assert fit_first_line(parts, 20) == "[$success]running[/]"  # the state stays, alone at the least
