"""The plan's words: "1 GPU" / "2 GPUs" (never "GPU(s)"), and a CPU plan that says it runs on the CPU."""

from __future__ import annotations

import pytest

from core.i18n import set_language
from core.plan import PlanRequest, parse_target, recommend
from core.plan.view import format_recommendation


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    set_language("en")
    yield
    set_language("en")


def _plan(model: str, hardware: str):
    return recommend(PlanRequest(model=model, hardware=parse_target(hardware, None, 512.0, 1000.0)))


def test_a_cpu_plan_runs_on_the_cpu_without_a_cuda_context():
    rec = _plan("tiny", "cpu")
    text = format_recommendation(rec)
    assert "GPU(s)" not in text and "of 1 GPU" not in text, text
    assert "fp32, on the CPU," in text and "trains on the CPU" in text, text
    assert "per GPU" not in text and "Memory (host RAM): " in text, text
    assert rec.best.estimate.breakdown["cuda_context"] == 0.0


def test_gpu_counts_are_pluralised():
    one = format_recommendation(_plan("Qwen2.5-7B", "1xA100-80GB"))
    assert "GPU(s)" not in one and ", 1 GPU," in one and "uses the one GPU this box has" in one, one
    two = format_recommendation(_plan("Qwen2.5-7B", "2xA100-80GB"))
    assert "GPU(s)" not in two and "GPUs" in two, two


def test_zh_keeps_its_measure_word():
    set_language("zh")
    text = format_recommendation(_plan("Qwen2.5-7B", "2xA100-80GB"))
    assert "张 GPU" in text and "GPU(s)" not in text


def test_a_memory_difference_that_rounds_to_nothing_is_said_as_the_same():
    """The tiny model at 128 tokens on a CPU box: its LoRA alternative needs within 0.05 GiB of the full
    plan, which read "0.0 GiB more memory"."""
    from core.plan.planner import trade_off

    request = PlanRequest(model="tiny", hardware=parse_target("cpu", None, 512.0, 1000.0), overrides={"seq_len": 128})
    rec = recommend(request)
    same = 0
    for other, _ in rec.alternatives:
        words = [f.text() for f in trade_off(other, rec.best, request)]
        assert not any(w.startswith("0.0 GiB") for w in words), words
        if round(other.peak_gib - rec.best.peak_gib, 1) == 0:
            assert "about the same memory" in words, words
            same += 1
    assert same  # the case is there to be said
