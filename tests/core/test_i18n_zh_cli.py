"""The CLI in Chinese: label columns padded in terminal cells (not characters), values shown in words of the language."""

from __future__ import annotations

import json
import re

import pytest

from core import i18n
from core.cli import main
from core.paths import runs_dir
from core.plan.request import GOALS
from core.text_width import cell_len
from tests.fixtures.watch.run_builder import build_run


@pytest.fixture
def zh_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    for name in ("LC_ALL", "LC_MESSAGES", "LANGUAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LANG", "C")
    yield tmp_path
    i18n.set_language("en")


def value_columns(lines: list[str], values: list[str]) -> set[int]:
    """The cell column each line's value starts at."""
    return {cell_len(line) - cell_len(line[line.index(value):]) for line, value in zip(lines, values, strict=True)}


def test_status_fields_line_up_in_chinese(zh_home, capsys):
    build_run(runs_dir(), "20250101-0000-qwen-lora-ab12", status="finished", steps=20, total=20)
    assert main(["--lang", "zh", "status", "qwen-lora"]) == 0
    lines = capsys.readouterr().out.splitlines()
    values = [re.split(r"\s{2,}", line, maxsplit=1)[1] for line in lines]
    assert lines[0].startswith("任务") and any(line.startswith("评估损失") for line in lines)
    assert len(value_columns(lines, values)) == 1, lines


def test_data_check_labels_line_up_in_chinese(zh_home, capsys):
    data = zh_home / "数据.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "你好"},
                                             {"role": "assistant", "content": "你好！"}]}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    assert main(["--lang", "zh", "data", "check", str(data)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if re.match(r"^  \S", line)]
    assert [line.split()[0] for line in lines] == ["格式", "记录", "token", "问题"]
    values = [re.split(r"\s{2,}", line.strip(), maxsplit=1)[1] for line in lines]
    assert len(value_columns(lines, values)) == 1, lines


def test_gpus_table_headers_are_whole_and_over_their_values_in_chinese(zh_home):
    """利用率 (6 cells) was cut to 利用… in the 5-cell Util column; fake GPUs: tests/fixtures/gpus/h200x2.json."""
    from core.hardware.commands import render_snapshot
    from core.hardware.snapshot import load_snapshot
    from tests.core.test_hardware_cli import FIXTURES

    i18n.set_language("zh")
    header, first = render_snapshot(load_snapshot(FIXTURES / "h200x2.json"))[:2]
    assert "…" not in header and header.split() == ["GPU", "名称", "显存", "利用率", "温度", "功耗", "进程"]
    # Each right-aligned column ends where its values end.
    for title, value in (("利用率", "%"), ("温度", "°C"), ("功耗", " W")):
        end = cell_len(header[:header.index(title) + len(title)])
        assert cell_len(first[:first.index(value) + len(value)]) == end, (header, first)


def test_estimate_names_its_parameter_count_in_chinese(zh_home, capsys):
    """The count's source was printed as the raw value: 参数量：…（统计方式：analytic）."""
    assert main(["--lang", "zh", "estimate", "--model", "Qwen2.5-7B", "--method", "lora"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("参数量"))
    assert line.endswith("（统计方式：按公式推算）"), line


def test_stop_names_a_runs_status_in_chinese(zh_home, capsys):
    build_run(runs_dir(), "20250101-0000-qwen-lora-ab12", status="finished", steps=20, total=20)
    assert main(["--lang", "zh", "stop", "qwen-lora"]) != 0
    assert "未在运行（状态：已完成）" in capsys.readouterr().err


def test_models_list_names_a_downloads_status_in_chinese(zh_home, monkeypatch, capsys):
    import dataclasses

    import core.hub.download
    from core.hub.download import DownloadStatus

    fields = {f.name: None for f in dataclasses.fields(DownloadStatus)}
    fields.update(job_dir=zh_home, hub="modelscope", model_id="Qwen/Qwen2.5-7B-Instruct", target_dir=str(zh_home),
                  status="interrupted", bytes_done=1024, bytes_total=4096, rate_bps=0.0, files_done=0,
                  files_total=2, updated=0.0)
    monkeypatch.setattr(core.hub.download, "list_downloads", lambda: [DownloadStatus(**fields)])
    monkeypatch.setenv("MODELSCOPE_CACHE", str(zh_home / "ms"))
    monkeypatch.setenv("HF_HOME", str(zh_home / "hf"))
    assert main(["--lang", "zh", "models", "list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "Qwen2.5-7B-Instruct" in line)
    assert "已中断" in row and "interrupted" not in row, row


@pytest.mark.parametrize("goal", GOALS)
def test_plan_names_its_goal_in_chinese(zh_home, capsys, goal):
    """plan printed its goal as typed (目标：fastest): the goal's name in Chinese, the value typed after it
    in parentheses. Hardware: --hardware cpu (the bundled tiny model)."""
    assert main(["--lang", "zh", "plan", "--model", "tiny", "--hardware", "cpu", "--goal", goal]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert re.search(rf"目标：[\u4e00-\u9fff]+（{goal}），", title), title
