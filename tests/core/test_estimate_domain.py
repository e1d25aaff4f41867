"""The error band the plan shows and the domain it holds in (#19): the band's figures are the ones the
calibration report gives, and a plan outside the measured rows says so instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.estimate import find_gpu, plan_for_model
from core.estimate.calibration import SPEED_ERROR, SPEED_ERROR_LONG_CONTEXT, SPEED_ERROR_SHORT_CONTEXT
from core.estimate.domain import measured_domain
from core.i18n import set_language

REPORT = Path(__file__).resolve().parents[2] / "bench" / "results" / "estimate_calibration.md"


@pytest.fixture(autouse=True)
def english():
    set_language("en")
    yield
    set_language("en")


def _report_line(group: str) -> tuple[float, float]:
    text = REPORT.read_text(encoding="utf-8")
    line = re.search(rf"^- Current engine, {group} \(fitted\):(.*)$", text, re.M)
    assert line, f"no fit-quality line for {group} in {REPORT}"
    after = re.search(r"after median \|err\| (\d+(?:\.\d+)?) %, worst ([+-]?\d+(?:\.\d+)?) %", line.group(1))
    assert after, line.group(0)
    return float(after.group(1)), abs(float(after.group(2)))


def test_the_speed_band_is_what_the_calibration_report_says():
    for group, error in (("short context", SPEED_ERROR_SHORT_CONTEXT), ("long context", SPEED_ERROR_LONG_CONTEXT)):
        assert _report_line(group) == (error.median_pct, error.worst_pct), group
    rows = re.search(r"^Fitted rows: (\d+) .*?, (\d+) short-context and (\d+) long-context", REPORT.read_text(), re.M)
    assert rows, "no 'Fitted rows' line in the report"
    total, short, long = map(int, rows.groups())
    assert (short, long) == (SPEED_ERROR_SHORT_CONTEXT.rows, SPEED_ERROR_LONG_CONTEXT.rows)
    assert total == SPEED_ERROR.rows
    assert SPEED_ERROR.worst_pct == max(_report_line("short context")[1], _report_line("long context")[1])


def _plan(model: str, **changes):
    from dataclasses import replace

    return replace(plan_for_model(model, exact_count=False), **changes)


def test_the_measured_shapes_on_one_h200_are_inside():
    h200 = find_gpu("H200")
    assert measured_domain(_plan("Qwen2.5-7B"), h200) == []
    assert measured_domain(_plan("Qwen2.5-7B", method="qlora", seq_len=98304), h200) == []
    assert measured_domain(_plan("Qwen2.5-7B", method="full", precision="pure-bf16"), h200) == []


def test_outside_says_why():
    def why(plan, gpu):
        return [gap.message() for gap in measured_domain(plan, gpu)]

    assert why(_plan("Qwen2.5-7B"), find_gpu("A100-80GB")) == ["another GPU family (Ampere): not measured"]
    assert why(_plan("Qwen2.5-7B", num_gpus=8), find_gpu("H200")) == ["8 GPUs: multi-GPU not measured"]
    assert why(_plan("Qwen2.5-0.5B"), find_gpu("H200")) == ["hidden size 896: outside the 3584–4096 measured"]
    assert why(_plan("Qwen2.5-7B", method="dora"), find_gpu("H200")) == ["DoRA: not measured"]
    assert why(_plan("Qwen2.5-7B", method="full", precision="bf16"), find_gpu("H200")) == [
        "full in bf16: not measured (only pure-bf16)"]
    assert why(_plan("Qwen2.5-7B", seq_len=512), find_gpu("H200")) == ["sequence 512: outside the 2k–192k measured"]
    assert [g.field for g in measured_domain(_plan("Qwen2.5-0.5B"), None)] == ["cpu"]
