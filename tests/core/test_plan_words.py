"""The plan's words: "1 GPU" / "2 GPUs" (never "GPU(s)"), and a CPU plan that says it runs on the CPU."""

from __future__ import annotations

import pytest

from core.estimate.calibration import MEMORY_ERROR as MEM
from core.estimate.calibration import SPEED_ERROR_CPU_BOUND as CPU
from core.estimate.calibration import SPEED_ERROR_GPU_BOUND as GPU
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
    assert "GPU(s)" not in one and ", 1 GPU," in one and "uses the one GPU there is" in one, one
    two = format_recommendation(_plan("Qwen2.5-7B", "2xA100-80GB"))
    assert "GPU(s)" not in two and "GPUs" in two, two


def test_zh_keeps_its_measure_word():
    set_language("zh")
    text = format_recommendation(_plan("Qwen2.5-7B", "2xA100-80GB"))
    assert "张 GPU" in text and "GPU(s)" not in text


def test_zh_says_the_offload_in_chinese_and_the_precision_field_lists_pure_bf16():
    """zh read "ZeRO-0 卸载 none" (the value untranslated); the precision override label left out pure-bf16,
    which it takes."""
    from core.i18n import t
    from core.plan.overrides import parse_override_value

    set_language("zh")
    text = format_recommendation(_plan("Qwen2.5-72B", "2xH200"))
    assert "卸载 none" not in text and "卸载 optimizer" not in text and "卸载 all" not in text, text
    assert "卸载 无" in text and "倍；" in text and "; " not in text, text  # the trade-offs joined in Chinese too
    for lang in ("zh", "en"):
        set_language(lang)
        assert "pure-bf16" in t("wizard.field.precision")
    assert parse_override_value("precision", "pure-bf16") == "pure-bf16"


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


def _figure_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("Per-GPU memory", "Memory (host", "Speed",
                                                                   "每张 GPU 显存", "内存（主机", "速度"))]


def test_the_figures_carry_the_measured_band_inside_the_domain():
    """7B LoRA on one H200 is what the estimator was fitted on: both figures say their worst error there."""
    rec = _plan("Qwen2.5-7B", "1xH200")
    memory, speed = _figure_lines(format_recommendation(rec))
    assert memory.endswith(f"(fits; ±{MEM.worst_pct:.0f}%, {MEM.rows} H200 runs)"), memory
    assert speed.endswith(f" tokens/s (±{GPU.worst_pct:.0f}%, {GPU.rows} H200 runs)"), speed
    domain = rec.to_json()["recommendation"]["domain"]
    assert domain["inside"] and domain["outside"] == []
    speed_band = domain["error_band"]["tokens_per_s"]
    assert speed_band["waits_on"] == "gpu" and speed_band["worst_pct"] == 25.0 == speed_band["gpu_bound"]["worst_pct"]
    assert domain["error_band"]["peak_memory"] == {"median_pct": MEM.median_pct, "worst_pct": MEM.worst_pct, "rows": MEM.rows}
    set_language("zh")
    memory, speed = _figure_lines(format_recommendation(rec))
    assert memory.endswith(f"（够用；±{MEM.worst_pct:.0f}%，{MEM.rows} 次 H200 实测）"), memory
    assert speed.endswith(f"（±{GPU.worst_pct:.0f}%，{GPU.rows} 次 H200 实测）"), speed


def test_a_step_that_waits_on_the_cpu_carries_that_kinds_wider_band():
    """0.5B at one 1024-token sequence a step: launching the kernels takes ~0.2 s on the H200 box's CPU,
    running them ~0.01 s. Such rows were the noisy ones (up to a third between calls), so the plan says
    which band it is in."""
    rec = recommend(PlanRequest(model="Qwen2.5-0.5B", hardware=parse_target("1xH200", None, 512.0, 1000.0),
                                overrides={"micro_batch_size": 1, "seq_len": 1024, "gradient_checkpointing": False}))
    best = rec.to_json()["recommendation"]
    assert best["plan"]["micro_batch_size"] == 1
    speed = _figure_lines(format_recommendation(rec))[1]
    assert speed.endswith(f" tokens/s (±{CPU.worst_pct:.0f}%, CPU-bound, {CPU.rows} H200 runs)"), speed
    band = best["domain"]["error_band"]["tokens_per_s"]
    assert band["waits_on"] == "cpu" and band["worst_pct"] == band["cpu_bound"]["worst_pct"] == CPU.worst_pct
    big = _plan("Qwen2.5-7B", "1xH200").to_json()["recommendation"]["domain"]["error_band"]["tokens_per_s"]
    assert big["waits_on"] == "gpu"
    set_language("zh")
    assert _figure_lines(format_recommendation(rec))[1].endswith(f"（±{CPU.worst_pct:.0f}%，受 CPU 限制，{CPU.rows} 次 H200 实测）")


def test_another_gpu_family_says_it_was_not_measured():
    rec = _plan("Qwen2.5-7B", "1xA100-80GB")
    memory, speed = _figure_lines(format_recommendation(rec))
    assert memory.endswith("GiB (fits)") and "±" not in memory, memory
    assert speed.endswith(" tokens/s (not measured: Ampere GPUs)"), speed
    domain = rec.to_json()["recommendation"]["domain"]
    assert not domain["inside"]
    assert [(g["field"], g["message"]) for g in domain["outside"]] == [
        ("gpu_family", "another GPU family (Ampere): not measured")]
    set_language("zh")
    assert _figure_lines(format_recommendation(rec))[1].endswith("（未实测：Ampere 架构）")


def test_a_cpu_plan_says_so_on_its_speed_line_only():
    rec = _plan("tiny", "cpu")
    text = format_recommendation(rec)
    memory, speed = _figure_lines(text)
    assert "±" not in text and memory.endswith("GiB (fits)"), memory
    assert speed.endswith(" tokens/s (not measured: CPU)"), speed
    assert [g["field"] for g in rec.to_json()["recommendation"]["domain"]["outside"]] == ["cpu"]
    set_language("zh")
    assert _figure_lines(format_recommendation(rec))[1].endswith("（未实测：CPU）")


def test_a_speed_the_probe_measured_is_not_said_to_be_unmeasured():
    """After a probe on a CPU box the wizard read "Speed: 5,424 tokens/s (not measured: CPU) (measured by probe)":
    a measured speed carries no not-measured note (the memory line says its own, the speed line no longer
    standing for both), and only a plan the probe ran is "measured"; one scaled by the probed plans' ratio
    is not (its tone says it is scaled)."""
    from core.plan.planner import plan_key
    from core.plan.view import probe_measured, recommendation_view, speed_tone

    first = _plan("tiny", "cpu")
    key = plan_key(first.best.plan)
    rec = recommend(first.request, measured={key: {"tokens_per_s": 2 * first.best.tokens_per_s, "peak_gib": None}})
    assert plan_key(rec.best.plan) == key and rec.best.measured and not rec.best.measured.get("scaled")
    memory, speed = _figure_lines(format_recommendation(rec))
    assert speed.endswith(" tokens/s") and "not measured" not in speed, speed
    assert memory.endswith("(fits; not measured: CPU)"), memory
    (line,) = [line for line in recommendation_view(rec) if line.kind == "speed"]
    assert line.tone == "measured" and line.note == ""
    scaled = next(c for c, _ in rec.alternatives if c.measured and c.measured.get("scaled"))
    assert not probe_measured({"measured": scaled.measured}, "tokens_per_s")
    assert speed_tone({"measured": scaled.measured}) == "scaled"


def test_each_figure_has_its_own_domain():
    """Speed was measured to 192k tokens a sequence (the long-context runs), peak memory to 128k (the calibration
    matrix): a 192k-token plan shows the speed band and says memory is not measured there. Both hold from the
    0.5B (hidden 896) to the 32B (5120)."""
    small = _plan("Qwen2.5-0.5B", "1xH200")
    memory, speed = _figure_lines(format_recommendation(small))
    assert f"±{MEM.worst_pct:.0f}%, {MEM.rows} H200 runs)" in memory and "H200 runs)" in speed, (memory, speed)
    domain = small.to_json()["recommendation"]["domain"]
    assert domain["inside"] and domain["memory"]["inside"]
    assert domain["memory"]["measured_on"]["hidden_sizes"] == domain["measured_on"]["hidden_sizes"] == [896, 5120]

    long = recommend(PlanRequest(model="Qwen2.5-7B", hardware=parse_target("1xH200", None, 512.0, 1000.0),
                                 overrides={"seq_len": 196608, "method": "qlora"}))
    memory, speed = _figure_lines(format_recommendation(long))
    domain = long.to_json()["recommendation"]["domain"]
    assert domain["inside"] and not domain["memory"]["inside"], domain
    assert "not measured: sequence 196608)" in memory and "±" not in memory, memory
    assert "±" in speed, speed
    set_language("zh")
    assert "未实测：" in _figure_lines(format_recommendation(long))[0]


def test_epochs_are_counted_in_words():
    """The plan's time line read "for 3.0 epoch(s)"."""
    from core.plan.view import epochs_words

    assert (epochs_words(3.0), epochs_words(1.0), epochs_words(1.5)) == ("3 epochs", "1 epoch", "1.5 epochs")



def test_a_plan_shorter_than_a_minute_does_not_read_as_one():
    """format_hours said "1 min" for any plan under a minute (a tiny model's epoch takes seconds)."""
    from core.plan.view import format_hours

    assert format_hours(10 / 3600) == "< 1 min" and format_hours(29 / 3600) == "< 1 min"
    assert format_hours(30 / 3600) == "< 1 min"  # not "0 min": 0.5 rounds to even
    assert format_hours(31 / 3600) == "1 min" and format_hours(12 / 60) == "12 min"
    assert format_hours(3.42) == "3.4 h"


def test_the_headline_names_zero_and_offload_only_where_they_say_something():
    """The CPU and one GPU without ZeRO said "ZeRO-0 offload none"; several GPUs without it are DDP; a ZeRO plan
    keeps its stage and offload, none included."""
    from core.plan.view import describe_plan

    set_language("en")
    base = {"method": "lora", "precision": "bf16", "micro_batch_size": 4, "grad_accum_steps": 1, "seq_len": 2048,
            "gradient_checkpointing": False, "lora_rank": 16, "num_gpus": 1, "zero_stage": 0, "offload": "none"}
    assert describe_plan(base, cpu_only=True)["parallel"] == ""
    assert describe_plan(base)["parallel"] == ""
    assert describe_plan({**base, "num_gpus": 2})["parallel"] == ", DDP"
    assert describe_plan({**base, "num_gpus": 2, "zero_stage": 3})["parallel"] == ", ZeRO-3 offload none"
    assert describe_plan({**base, "zero_stage": 2, "offload": "optimizer"})["parallel"] == ", ZeRO-2 offload optimizer"
    text = format_recommendation(_plan("tiny", "cpu"))
    assert "ZeRO" not in text and "offload" not in text, text
