"""The main screens in Simplified Chinese: SVG snapshots at 80×24 and larger, and layout checks.

Binding descriptions are read from the catalogue when the tui modules are imported, so this module sets
the language before importing any of them and runs in its own pytest process: it is not collected with
the others (no ``test_`` prefix) but started by ``tests/tui/test_i18n_zh_screens.py``. Run it alone with
``python -m pytest tests/tui/i18n_zh_scenarios.py``.
"""

from __future__ import annotations

from core.i18n import set_language

set_language("zh")

import asyncio  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from core.i18n import current_language  # noqa: E402
from core.paths import runs_dir  # noqa: E402
from core.text_width import cell_len  # noqa: E402
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run  # noqa: E402
from tests.tui.conftest import (  # noqa: E402
    StepClock,
    assert_snapshot,
    fake_monitor,
    quiet_settings,
    screen_text,
    wait_for,
)
from tests.tui.test_80x24_keys import assert_section_footers_fit  # noqa: E402
from tests.tui.test_dashboard_noise import few_points_scenario, spike_scenario  # noqa: E402
from tests.tui.test_dashboard_render import open_dashboard, settle  # noqa: E402
from tests.tui.test_gpu_screen import feed_history, open_gpus  # noqa: E402
from tests.tui.test_models_offline import message_box, region_text  # noqa: E402
from tests.tui.test_models_screen import hub_env, open_models  # noqa: E402,F401  (hub_env: a fixture)
from tests.tui.test_runs_screen import open_runs, three_runs  # noqa: E402
from tui.app import TunedeckApp, make_app  # noqa: E402
from tui.screens.dashboard import DashboardScreen  # noqa: E402
from tui.screens.help import HelpScreen  # noqa: E402


def run(coro):
    return asyncio.run(coro)


def has_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def assert_fits(app, size: tuple[int, int]) -> str:
    """Every row of the screen is at most as wide as the terminal, in cells; returns the screen text."""
    text = screen_text(app)
    rows = text.split("\n")
    assert len(rows) == size[1]
    too_wide = [row for row in rows if cell_len(row) > size[0]]
    assert too_wide == [], f"rows wider than {size[0]} cells: {too_wide}"
    return text


def test_language_is_set_before_the_bindings_are_built():
    assert current_language() == "zh"
    descriptions = {binding.description for binding in TunedeckApp.BINDINGS}
    assert {"GPU", "模型", "任务", "帮助", "退出"} <= descriptions


def test_ctrl_c_says_how_to_quit_in_chinese():
    """Textual's own Ctrl+C note ("Do you want to quit? Press ctrl+q to quit the app") was English here."""
    from tui.screens.gpus import GpuScreen

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen))
            await pilot.press("ctrl+c")
            await wait_for(pilot, lambda: app._notifications)
            [note] = list(app._notifications)
            assert note.title == "要退出吗？" and str(note.message).startswith("Ctrl+C 不会退出 tunedeck：按 q / Ctrl+Q 退出")

    run(scenario())


@pytest.mark.parametrize(("recording", "size"), [
    ("h200x2", (80, 24)), ("h200x2", (160, 50)), ("h200x8", (80, 24)), ("none", (80, 24)),
], ids=["h200x2-80x24", "h200x2-160x50", "h200x8-80x24", "none-80x24"])
def test_gpus(recording, size):
    async def scenario():
        clock = StepClock()
        options = {"fail": "library_not_found"} if recording == "none" else {"animate": True}
        monitor = fake_monitor("h200x1" if recording == "none" else recording, clock=clock, **options)
        app = make_app(quiet_settings(), monitor=monitor, persist_settings=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_gpus(pilot, app)
            if recording != "none":
                await feed_history(pilot, screen, monitor, clock, 40)
            text = assert_fits(app, size)
            if recording == "none":
                assert "没有 GPU 读数" in text and "m 模型，w 向导，r 训练任务" in text
            else:
                assert "驱动" in text and "退出" in text
            await assert_snapshot(pilot, app, f"zh_gpus_{recording}_{size[0]}x{size[1]}")

    run(scenario())


def test_gpus_process_selected_80x24(monkeypatch):
    """A run's trainer selected: its columns, the detail under the list and the footer, in Chinese."""
    import time

    from tests.tui.test_gpu_screen import open_showcase_selected, showcase_monitor, showcase_run

    monkeypatch.setenv("TZ", "UTC")  # the start time prints in local time
    time.tzset()

    async def scenario():
        showcase_run()
        app = make_app(quiet_settings(), monitor=showcase_monitor(), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_showcase_selected(pilot, app)
            text = assert_fits(app, (80, 24))
            assert "已用" in text and "内存" in text and "CPU%" in text
            assert "任务 20261129-2100-qwen7b-lora 的训练进程" in text and "结束" in text
            await assert_snapshot(pilot, app, "zh_gpus_process_selected_80x24")

    try:
        run(scenario())
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
def test_models(hub_env, size):  # noqa: F811
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("down", "down", "enter")
            await wait_for(pilot, lambda: screen.details is not None)
            await wait_for(pilot, lambda: "在本机一张" in screen_text(app))  # the details drawn
            text = assert_fits(app, size)
            assert "在本机一张" in text and ("够用" in text or "放不下" in text)
            await assert_snapshot(pilot, app, f"zh_models_details_{size[0]}x{size[1]}")

    run(scenario())


def unspaced(text: str) -> str:
    """Text without its white space: a Chinese line wraps between characters, where no space was."""
    return "".join(text.split())


def test_models_offline_80x24(monkeypatch):
    """The hub out of reach (conftest's closed port): what failed and what to do, whole, in Chinese."""
    from core.hub.problems import PROXY_ENV
    from core.i18n import t

    for name in PROXY_ENV:
        monkeypatch.delenv(name, raising=False)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("m")
            await wait_for(pilot, lambda: "无法连接" in region_text(app, message_box(app)))
            assert_fits(app, (80, 24))
            shown = unspaced(region_text(app, message_box(app)))
            for line in ("无法连接ModelScope（http://127.0.0.1:9）：连接被拒绝。", t("hub.advice.network"),
                         t("modelsscreen.problem_offline"), t("modelsscreen.problem_keys", other="Hugging Face")):
                assert unspaced(line) in shown, line
            await assert_snapshot(pilot, app, "zh_models_offline_80x24")

    run(scenario())


def test_models_empty_result_80x24(hub_env):  # noqa: F811
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("s", *"zzz", "enter")
            await wait_for(pilot, lambda: screen.message_kind == "empty")
            await pilot.pause()
            assert_fits(app, (80, 24))
            shown = unspaced(region_text(app, message_box(app)))
            assert "ModelScope上没有匹配“zzz”的模型。" in shown and "或按h改用HuggingFace。" in shown
            await assert_snapshot(pilot, app, "zh_models_empty_80x24")

    run(scenario())


@pytest.mark.parametrize("size", [(80, 24), (120, 30)], ids=["80x24", "120x30"])
def test_runs(size):
    live = three_runs()

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
            async with app.run_test(size=size) as pilot:
                await open_runs(pilot, app)
                text = assert_fits(app, size)
                assert "已崩溃" in text and "已完成" in text and "运行中" in text
                await assert_snapshot(pilot, app, f"zh_runs_three_{size[0]}x{size[1]}")

    run(scenario())


def test_the_command_palette_says_no_match_in_chinese():
    """Textual's palette wrote "No matches found" in English under a Chinese search prompt (h200x2 fake GPUs)."""
    from textual.command import CommandList, CommandPalette

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_gpus(pilot, app)
            await pilot.press("ctrl+p")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
            await pilot.press(*"zzzz")
            palette = app.screen
            await wait_for(pilot, lambda: palette.query_one(CommandList).option_count == 1
                           and palette.query_one(CommandList).get_option_at_index(0).id == palette._NO_MATCHES)
            await pilot.pause()
            text = assert_fits(app, (80, 24))
            assert "没有匹配的命令" in text and "No matches" not in text
            await pilot.press("backspace", "backspace", "backspace", "backspace", *"主题")
            await wait_for(pilot, lambda: "主题：浅色" in screen_text(app))  # typed Chinese finds commands

    run(scenario())


def test_runs_filter_takes_the_status_as_the_table_shows_it():
    """The filter box says it filters by status, but only the English value matched: 已完成, typed as the
    table shows it, listed nothing. Three runs (tests/tui/test_runs_screen.py three_runs); no GPU needed."""
    live = three_runs()

    async def scenario():
        with SupervisorStandIn(live):
            app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
            async with app.run_test(size=(80, 24)) as pilot:
                screen = await open_runs(pilot, app)
                await pilot.press("f")
                for text, shown in (("已完成", ["20261129-2200-done"]), ("崩溃", ["20261129-2100-dead"]),
                                    ("finished", ["20261129-2200-done"])):
                    screen.query_one("#runs-filter").value = text
                    await wait_for(pilot, lambda shown=shown: [s.id for s in screen.shown] == shown)

    run(scenario())


@pytest.mark.parametrize("size", [(80, 24), (160, 50)], ids=["80x24", "160x50"])
def test_dashboard(size):
    path = build_run(runs_dir(), "20261129-2100-healthy", status="running", steps=240)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path), persist_settings=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_dashboard(pilot, app, "running", events=len(list(open(path / "events.jsonl"))))
            if size[1] >= 50:  # the log pane shows the log's tail once its worker has read all of it (a state)
                await wait_for(pilot, lambda: "step 240/600 |" in screen_text(app))
            await settle(pilot, app, screen)
            text = assert_fits(app, size)
            assert "Qwen/Qwen2.5-7B-Instruct" in text and "步 240/600" in text
            assert "损失" in text
            if size[1] >= 50:  # the events table has room for its rows: event names are translated
                assert "检查点已保存" in text and "checkpoint_saved" not in text
            await assert_snapshot(pilot, app, f"zh_dashboard_healthy_{size[0]}x{size[1]}")

    with SupervisorStandIn(path):
        run(scenario())


@pytest.mark.parametrize("size", [(80, 24), (160, 50)], ids=["80x24", "160x50"])
def test_dashboard_failed_reason_written_by_the_trainer(size):
    """The trainer wrote the reason in English with its message record: the dashboard shows it in Chinese."""
    from core.i18n import Message
    from core.runs.run_dir import FAILED, RunDirectory

    path = build_run(runs_dir(), "20261129-2100-oom", status="failed", steps=310)
    tips = [Message("train.oom_tip_micro_batch", now=4, new=2, accum=8), Message("train.oom_tip_checkpointing")]
    RunDirectory(path).write_status(FAILED, Message("train.reason_oom", advice=tips))

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), open_run=str(path), persist_settings=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_dashboard(pilot, app, "failed")
            await settle(pilot, app, screen)
            text = assert_fits(app, size)
            assert "显存不足（OOM）" in text and "out of GPU memory" not in text
            if size[1] >= 50:
                assert "失败" in text
            await assert_snapshot(pilot, app, f"zh_dashboard_failed_{size[0]}x{size[1]}")

    run(scenario())


def test_dashboard_few_points_80x24():
    run(few_points_scenario((80, 24), "zh_dashboard_few_points_80x24"))


def test_dashboard_spike_80x24():
    run(spike_scenario((80, 24), "zh_dashboard_spike_80x24"))


def test_dashboard_metric_not_in_a_watched_source_80x24():
    source = Path(__file__).parents[1] / "fixtures" / "watch" / "swift_output"

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), open_run=str(source), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.backfilled and screen.series.train_records > 0)
            screen._redraw()
            await pilot.pause()
            text = assert_fits(app, (80, 24))
            assert "此来源中没有该指标（ms-swift）" in text and "正在等待" not in text
            assert "q 退出" in text and "Esc 退出" not in text  # Esc quits too, said once by q

    run(scenario())


@pytest.mark.parametrize("size", [(80, 24), (100, 50)], ids=["80x24", "100x50"])
def test_help(size):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=size) as pilot:
            await open_gpus(pilot, app)
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            text = assert_fits(app, size)
            assert "本界面" in text and "全局" in text
            if size[1] >= 50:
                for expected in ("紧凑", "进程", "变慢", "模型", "向导", "退出", "主题", "命令"):
                    assert expected in text, expected
            await assert_snapshot(pilot, app, f"zh_help_gpus_{size[0]}x{size[1]}")

    run(scenario())


def test_wizard_section(size=(80, 24)):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=size) as pilot:
            await open_gpus(pilot, app)
            await pilot.press("w")
            await pilot.pause()
            await pilot.pause()
            assert app.current_mode == "wizard"
            text = assert_fits(app, size)
            assert has_chinese(text)
            await assert_snapshot(pilot, app, f"zh_wizard_{size[0]}x{size[1]}")

    run(scenario())


def test_models_local_incomplete_80x24(hub_env, tmp_path):  # noqa: F811
    """An unfinished download in the Local tab: its id whole, 不完整 under 上次使用, every row in 80 cells."""
    from core.i18n import t
    from tests.tui.test_models_qa80 import local_tab, modelscope_folder

    model = "Qwen/Qwen2.5-7B-Instruct"

    async def scenario():
        modelscope_folder(tmp_path, model, {"config.json": b"{}", "model.safetensors.part": b"x" * 100})
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_models(pilot, app)
            local = await local_tab(pilot, screen)
            await pilot.pause()
            assert_fits(app, (80, 24))
            lines = region_text(app, local).splitlines()
            header, row = lines[0], next(line for line in lines if model in line)
            assert row.split()[0] == model and t("modelsscreen.incomplete") == "不完整", row
            at = cell_index(header, t("modelsscreen.col_used"))
            assert cell_slice(row, at).split()[0] == "不完整", (header, row)

    run(scenario())


def cell_index(text: str, part: str) -> int:
    """The cell ``part`` starts at in ``text`` (a Chinese character takes two)."""
    return cell_len(text[:text.index(part)])


def cell_slice(text: str, start: int) -> str:
    """``text`` from its cell ``start`` on."""
    for index in range(len(text) + 1):
        if cell_len(text[:index]) >= start:
            return text[index:]
    return ""


def test_zh_section_footers_fit_80_columns_with_help():
    """Two cells a character: each footer keeps ? and drops whole entries, never half a character."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await assert_section_footers_fit(pilot, app)

    run(scenario())


# --- a toast's Chinese over the edges of the widgets behind it (Textualize/textual#6357) ---------------
# Textual cut every line at every widget's edge, those behind a toast included, and a two-cell character
# across such a cut became two spaces: over the Models screen's divider 正在后台下载 read 正在后  下载.
# Fake GPUs: the h200x2 recording; the hub is conftest's closed port (the offline message beside the details).
import re  # noqa: E402

from textual._compositor import ChopsUpdate  # noqa: E402
from textual.geometry import Region  # noqa: E402

TOAST_MODEL = "Qwen/Qwen2.5-7B-Instruct"  # puts 台 of 正在后台下载 across the Models screen's divider at 80x24


async def toast_over_the_models_divider(pilot, app):
    """Show the download toast on the Models screen; the rows of the screen where a cut halves one of its
    wide characters (the test is void without one)."""
    from core.i18n import t

    await pilot.press("m")
    await wait_for(pilot, lambda: "无法连接" in region_text(app, message_box(app)))
    app.notify(t("modelsscreen.download_started", model=TOAST_MODEL), timeout=60)
    await wait_for(pilot, lambda: len(app.screen.query("Toast")) == 1
                   and app.screen.query_one("Toast").region.width > 0, timeout=10)
    await pilot.pause()
    toast = app.screen.query_one("Toast").region
    compositor = app.screen._compositor
    cells = screen_cells(app.screen.query_one("Toast").render_lines(Region(0, 0, *toast.size)))  # its own
    crossed = [(y, cut) for y in toast.line_range for cut in compositor.cuts[y]
               if toast.x < cut < toast.right and cells[y - toast.y][cut - toast.x] == ""]
    assert crossed, "no wide character of the toast lies across an edge behind it: the scenario tests nothing"
    return toast, crossed


def test_a_toast_over_the_models_divider_keeps_its_chinese_whole():
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            toast, _ = await toast_over_the_models_divider(pilot, app)
            strips = app.screen._compositor.render_strips()
            shown = "".join(unspaced(strip.crop(toast.x, toast.right).text.replace("▌", ""))
                            for strip in strips[toast.y:toast.bottom])
            assert f"正在后台下载{TOAST_MODEL}" in shown, shown  # the footer's row may follow it

    run(scenario())


_MOVE = re.compile(r"\x1b\[(\d+);(\d+)H")
_STYLE = re.compile(r"\x1b\[[0-9;]*m|\x1b\]8;[^\x1b]*\x1b\\")


def screen_cells(strips) -> list[list[str]]:
    """A screen's cells: a wide character in its first, "" in its second."""
    rows = []
    for strip in strips:
        row = []
        for char in strip.text:
            row += [char, ""] if cell_len(char) == 2 else [char]
        rows.append(row)
    return rows


def write_to(cells: list[list[str]], output: str) -> None:
    """What a terminal does with ``output`` (cursor moves and text; styles and links dropped)."""
    x = y = 0
    for move, text in re.findall(r"(\x1b\[\d+;\d+H)|([^\x1b]+)", _STYLE.sub("", output)):
        if move:
            row, column = _MOVE.match(move).groups()
            y, x = int(row) - 1, int(column) - 1
            continue
        for char in text.replace("\n", ""):
            cells[y][x] = char
            if cell_len(char) == 2:
                cells[y][x + 1] = ""
            x += cell_len(char)


def test_a_refresh_behind_a_toast_writes_its_chinese_whole():
    """Each widget behind the halved character refreshed alone: the partial update writes every cell of the
    changed spans, and the toast's character whole."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            toast, crossed = await toast_over_the_models_divider(pilot, app)
            compositor = app.screen._compositor
            updates = []
            render_update = compositor.render_update

            def recorded(*args, **kwargs):
                update = render_update(*args, **kwargs)
                updates.append(update)
                return update

            compositor.render_update = recorded
            y, cut = crossed[0]
            toast_and_above = app.screen.query_one("Toast").ancestors_with_self  # the screen: a full update
            behind = [widget for x in (cut - 1, cut) for widget, _ in compositor.get_widgets_at(x, y)
                      if widget not in toast_and_above]
            assert any(widget.region.right == cut for widget in behind), behind  # an edge at the cut refreshes
            for widget in dict.fromkeys(behind):
                updates.clear()
                widget.refresh()
                await wait_for(pilot, lambda: any(isinstance(update, ChopsUpdate) for update in updates))
                expected = screen_cells(compositor.render_strips())
                for update in (update for update in updates if isinstance(update, ChopsUpdate)):
                    cells = [list(row) for row in expected]
                    for row, x1, x2 in update.spans:
                        cells[row][x1:x2] = ["?"] * (x2 - x1)  # a cell the update leaves unwritten stays "?"
                    write_to(cells, update.render_segments(app.console))
                    for row, at in crossed:  # the toast's character across the cut: whole, its second cell ""
                        assert cell_len(cells[row][at - 1]) == 2 and cells[row][at] == "", (widget, cells[row])
                    assert cells == expected, (widget, [("".join(a), "".join(b)) for a, b
                                                        in zip(cells, expected, strict=True) if a != b])

    run(scenario())


# --- the Chinese cells of the #18 snapshot matrix that the scenarios above do not draw -----------------
from tests.tui.snapshot_matrix import ZH, draw  # noqa: E402


@pytest.mark.parametrize(("stem", "size"), ZH, ids=[f"{stem}-{w}x{h}" for stem, (w, h) in ZH])
def test_matrix_cell(stem, size, request):
    draw(stem, size, "zh", request)
