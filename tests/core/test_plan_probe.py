"""Probe: real short runs of the tiny model on the CPU through the engine, measured and cached."""

from __future__ import annotations

import json

import pytest

from core.hardware.fake_nvml import fake_monitor_from_recording
from core.plan import PlanRequest, recommend, summarise_dataset, target_from_snapshot
from core.plan.hardware import parse_target
from core.plan.planner import plan_key
from core.plan.probe import (
    ProbeError,
    cache_path,
    cached_measurements,
    measurements_from_metrics,
    probe_candidates,
    probe_config_values,
)
from tests.tui.conftest import GPU_FIXTURES

SAMPLE = "core/data/samples/tiny_skills.jsonl"


@pytest.fixture
def cpu_request(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNEDECK_FAKE_GPUS", raising=False)
    monitor = fake_monitor_from_recording(GPU_FIXTURES / "none.json")
    summary = summarise_dataset(SAMPLE, "tiny")
    return PlanRequest("tiny", target_from_snapshot(monitor.snapshot()), dataset=SAMPLE).with_dataset(summary)


def test_probe_runs_real_steps_caches_them_and_reranks(cpu_request, capsys):
    rec = recommend(cpu_request)
    lines: list[str] = []
    measured = probe_candidates(rec, cpu_request, top=1, steps=2, progress=lines.append, timeout_s=300)
    key = plan_key(rec.best.plan)
    assert list(measured) == [key]
    result = measured[key]
    assert result["tokens_per_s"] > 0 and result["steps"] == 2
    assert result["peak_gib"] is None  # the CPU has no CUDA peak to measure
    assert any("step 2/2" in line for line in lines)
    cache = json.loads(cache_path().read_text())
    assert len(cache) == 1 and next(iter(cache.values()))["tokens_per_s"] == result["tokens_per_s"]
    assert cached_measurements(cpu_request) == {key: result}
    # Re-ranked with the measurement: the probed plan carries the measured speed, the others are scaled.
    again = recommend(cpu_request, measured=measured)
    assert again.best.tokens_per_s == pytest.approx(result["tokens_per_s"]) or all(
        c.measured and c.measured.get("scaled") for c, _ in again.alternatives)
    for candidate, _ in again.alternatives:
        assert candidate.measured is not None
    # A second probe of the same plan is answered from the cache, without a new run.
    from core.runs import list_runs

    runs_before = len(list_runs())
    # The probe's run is marked one (run.json "command": "probe"): the Runs screen keeps it aside, and
    # `tunedeck runs --json` lists it, saying so.
    assert [s.probe for s in list_runs()] == [True]
    from core.cli import main

    capsys.readouterr()
    assert main(["runs", "--json"]) == 0
    assert [r["probe"] for r in json.loads(capsys.readouterr().out)] == [True]
    assert probe_candidates(rec, cpu_request, top=1, steps=2) == {key: result}
    assert len(list_runs()) == runs_before


def test_a_probe_on_the_cpu_is_named_for_the_cpu_not_a_gpu(cpu_request):
    # hardware: this box with no GPU (fake none.json): the probe runs on the CPU; its run read "probe-full-1gpu"
    rec = recommend(cpu_request)
    assert probe_config_values(rec.best, cpu_request, 2)["name"] == f"probe-{rec.best.plan.method}-cpu"
    gpus = PlanRequest("tiny", parse_target("2xH200"))
    best = recommend(gpus).best
    assert probe_config_values(best, gpus, 2)["name"] == f"probe-{best.plan.method}-{best.plan.num_gpus}gpu"


def test_probe_refuses_planned_hardware(cpu_request):
    planned = PlanRequest("tiny", parse_target("2xH200"))
    with pytest.raises(ProbeError, match="this box"):
        probe_candidates(recommend(planned), planned)


def test_measurements_from_metrics_adds_the_context_and_skips_warmup(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"kind": "header"},
            {"kind": "train", "step": 1, "tokens_per_s": 10.0, "peak_reserved_gib": [30.0, 31.0]},
            {"kind": "train", "step": 2, "tokens_per_s": 100.0, "peak_reserved_gib": [30.5, 32.0]},
            {"kind": "train", "step": 3, "tokens_per_s": 120.0, "peak_reserved_gib": [30.5, 32.0]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = measurements_from_metrics(path, context_gib=0.5)
    assert result["tokens_per_s"] == 110.0 and result["peak_gib"] == 32.5
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ProbeError, match="no training steps"):
        measurements_from_metrics(empty)
