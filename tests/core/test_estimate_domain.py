"""The error band the plan shows and the domain it holds in (#19): the band's figures are the ones the
calibration report gives, and a plan outside the measured rows says so instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.estimate import find_gpu, plan_for_model
from core.estimate.calibration import SPEED_ERROR, SPEED_ERROR_CPU_BOUND, SPEED_ERROR_GPU_BOUND
from core.estimate.domain import measured_domain
from core.i18n import set_language

REPORT = Path(__file__).resolve().parents[2] / "bench" / "results" / "estimate_calibration.md"


@pytest.fixture(autouse=True)
def english():
    set_language("en")
    yield
    set_language("en")


def _band_line(kind: str) -> tuple[int, float, float]:
    """(rows, median, worst) of the report's leave-one-model-out line for steps that wait on ``kind``."""
    text = REPORT.read_text(encoding="utf-8")
    line = re.search(rf"^- Steps that wait on the {kind} \(fitted\): (\d+) rows; .*; leave one model out "
                     r"median \|err\| (\d+(?:\.\d+)?) %, worst ([+-]?\d+(?:\.\d+)?) %$", text, re.M)
    assert line, f"no band line for the {kind} in {REPORT}"
    return int(line.group(1)), float(line.group(2)), abs(float(line.group(3)))


def test_the_speed_bands_are_what_the_calibration_report_says():
    """The band a plan shows is the leave-one-model-out error of the rows of its kind in the committed report;
    every fitted row is in one of the two kinds."""
    for kind, error in (("GPU", SPEED_ERROR_GPU_BOUND), ("CPU", SPEED_ERROR_CPU_BOUND)):
        assert _band_line(kind) == (error.rows, error.median_pct, error.worst_pct), kind
    fitted = re.search(r"^Fitted rows: (\d+) ", REPORT.read_text(), re.M)
    assert fitted and int(fitted.group(1)) == SPEED_ERROR.rows == SPEED_ERROR_GPU_BOUND.rows + SPEED_ERROR_CPU_BOUND.rows
    assert SPEED_ERROR.worst_pct == max(SPEED_ERROR_GPU_BOUND.worst_pct, SPEED_ERROR_CPU_BOUND.worst_pct)
    assert SPEED_ERROR_CPU_BOUND.worst_pct > SPEED_ERROR_GPU_BOUND.worst_pct  # why a plan shows its own kind's


def _plan(model: str, **changes):
    from dataclasses import replace

    return replace(plan_for_model(model, exact_count=False), **changes)


def test_the_measured_shapes_on_one_h200_are_inside():
    h200 = find_gpu("H200")
    assert measured_domain(_plan("Qwen2.5-7B"), h200) == []
    assert measured_domain(_plan("Qwen2.5-7B", method="qlora", seq_len=98304), h200) == []
    assert measured_domain(_plan("Qwen2.5-7B", method="full", precision="pure-bf16"), h200) == []
    assert measured_domain(_plan("Qwen2.5-0.5B", seq_len=512), h200) == []  # the calibration matrix's smallest
    assert measured_domain(_plan("Qwen2.5-14B", method="dora"), h200) == []


def test_outside_says_why():
    def why(plan, gpu):
        return [gap.message() for gap in measured_domain(plan, gpu)]

    assert why(_plan("Qwen2.5-7B"), find_gpu("A100-80GB")) == ["another GPU family (Ampere): not measured"]
    assert why(_plan("Qwen2.5-7B", num_gpus=8), find_gpu("H200")) == ["8 GPUs: multi-GPU not measured"]
    assert why(_plan("Qwen2.5-72B"), find_gpu("H200")) == ["hidden size 8192: outside the 896–5120 measured"]
    assert why(_plan("Qwen2.5-7B", precision="fp16"), find_gpu("H200")) == ["LoRA in fp16: not measured (only bf16)"]
    assert why(_plan("Qwen2.5-7B", seq_len=256), find_gpu("H200")) == ["sequence 256: outside the 512–192k measured"]
    assert [g.field for g in measured_domain(_plan("Qwen2.5-0.5B"), None)] == ["cpu"]


def test_a_qlora_upcast_plan_is_inside_the_memory_fit():
    """``qlora_upcast: true``: its fp32 MLP tensors and input gradients are counted (``activations``), so the memory
    fit takes its row on the fused-kernels engine like any other, within the fit's own error of NVML's peak, and
    neither domain says anything of it; an offloaded plan, also in the fit, says nothing either."""
    import json
    from dataclasses import replace

    from core.estimate.calibration import MEMORY_DOMAIN

    h200 = find_gpu("H200")
    plan = _plan("Qwen2.5-7B", method="qlora", kbit_upcast=True)
    assert measured_domain(plan, h200, MEMORY_DOMAIN) == [] and measured_domain(plan, h200) == []
    offloaded = replace(_plan("Qwen2.5-7B", method="qlora", seq_len=32768), gradient_checkpointing=True,
                        offload_activations=True)
    assert offloaded.offloads_activations and measured_domain(offloaded, h200, MEMORY_DOMAIN) == []
    fit = json.loads((REPORT.parent / "estimate_matrix" / "memory-fit.json").read_text(encoding="utf-8"))
    assert not fit["unmodelled"]
    rows = [r for r in fit["rows"] if r["row"].startswith("7b-qlora") and "qloraupcast-True" in r["row"]]
    assert rows and all(abs(r["error_pct"]) <= fit["quality"]["worst_pct"] for r in rows), rows
