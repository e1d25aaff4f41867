"""bench/estimate_matrix.py without a GPU: its row list, the estimator's side and the report files."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("estimate_matrix", ROOT / "bench" / "estimate_matrix.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["estimate_matrix"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_rows_are_unique_and_cover_the_methods():
    bench = load_bench()
    rows = bench._rows()
    names = [row.name for row in rows]
    assert len(names) == len(set(names)) and 35 <= len(rows) <= 45
    assert {row.method for row in rows} == {"full", "lora", "dora", "qlora"}
    assert {row.fused_ce for row in rows} == {True, False}
    assert {row.gradient_checkpointing for row in rows} == {True, False}


def test_estimate_only_writes_the_comparison_table(tmp_path):
    bench = load_bench()
    assert bench.main(["--estimate-only", "--only", "Qwen2.5-0.5B", "--out", str(tmp_path), "--gpu", "H200"]) == 0
    data = json.loads((tmp_path / "estimate_matrix.json").read_text())
    rows = data["rows"]
    assert rows and all(row["measured"]["status"] == "not run" for row in rows)
    assert all(row["estimate"]["peak_gib"] > row["estimate"]["tensor_gib"] > 0 for row in rows)
    table = (tmp_path / "estimate_matrix.md").read_text()
    assert table.count("| Qwen2.5-0.5B ") == len(rows)


def test_report_marks_an_unpredicted_oom_and_computes_errors(tmp_path):
    bench = load_bench()
    rows = [
        {"name": "a", "config": {"method": "lora"},
         "measured": {"status": "ok", "nvml_peak_gib": 10.0, "torch_max_allocated_gib": 8.0, "tokens_per_s": 1000.0},
         "estimate": {"peak_gib": 11.0, "tensor_gib": 8.0, "tokens_per_s": 900.0, "fits": True}},
        {"name": "b", "config": {"method": "full"}, "measured": {"status": "oom"},
         "estimate": {"peak_gib": 50.0, "tokens_per_s": 1.0, "fits": True}},
    ]
    bench.write_report(rows, tmp_path, {"gpu": "H200", "steps": 3, "wall_s": 1.0})
    table = (tmp_path / "estimate_matrix.md").read_text()
    assert "| 10.0 |" in table and "| -10.0 |" in table  # memory +10 %, speed -10 %
    assert "oom, estimate said fits" in table


def load_calibrate():
    spec = importlib.util.spec_from_file_location("estimate_calibrate", ROOT / "bench" / "estimate_calibrate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["estimate_calibrate"] = module
    spec.loader.exec_module(module)
    return module


def _report_rows(text: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(source, configuration) -> (measured, estimate after) from the committed calibration report."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[0].isdigit():
            out[cells[1], cells[2]] = (float(cells[3].replace(",", "")), float(cells[6].replace(",", "")))
    return out


def test_calibration_constants_are_the_fit_of_the_committed_measurements():
    """calibration.py holds what bench/estimate_calibrate.py fits on the committed current-engine rows, and
    the committed report shows what those constants estimate: a constant, a row or a report that drifts
    from the others fails here (the fit itself takes a few seconds)."""
    calibrate = load_calibrate()
    rows = calibrate.load_rows()
    fitted = [row for row in rows if row.fitted]
    assert {row.kind for row in fitted} == {"short", "cal"} and len(fitted) >= 55
    # LoRA and QLoRA as the engine with the fused kernels ran them; the rows from before it are reported only
    before = [row for row in rows if row.kind == "before"]
    assert before and {row.plan.method for row in before} == {"lora", "qlora"}
    assert sum(row.source.startswith("calibration-kernels-") for row in fitted) >= 35
    assert {row.plan.method for row in fitted} == {"full", "lora", "dora", "qlora"}
    assert len({calibrate.model_of(row) for row in fitted}) >= 7  # 0.5B ... 32B and the 8B
    assert all(row.plan.num_gpus == 1 for row in fitted)
    current = calibrate.current_values()
    refit = calibrate.fit(fitted, {**current, **calibrate.PINNED})
    for key in calibrate.FREE:  # calibration.py holds what the script fits (rounded)
        assert refit[key] == pytest.approx(current[key], rel=0.01), key
    from core.estimate import DEFAULT_CALIBRATION

    report = (ROOT / "bench" / "results" / "estimate_calibration.md").read_text()
    committed = _report_rows(report)
    assert len(committed) == len(rows) == len({(row.source, row.name) for row in rows})
    for row in rows:  # every row of the report is what the committed constants estimate for it
        measured, after = committed[row.source, row.name]
        assert measured == pytest.approx(row.measured_tps, abs=0.5), row.key
        assert calibrate.predict(row, DEFAULT_CALIBRATION) == pytest.approx(after, rel=0.01, abs=1), row.key
    for row in fitted:  # the bound (#19: worst <= 25 %) on every fitted row the report does not flag;
        if row.name not in calibrate.UNEXPLAINED:  # the worst is +23 %; the 3B's flagged rows +29 to +38 %
            assert calibrate.predict(row, DEFAULT_CALIBRATION) == pytest.approx(row.measured_tps, rel=0.25), row.key
    for key in ("eff_full", *calibrate.FREE):  # the report's constants table is calibration.py's
        cells = next(line for line in report.splitlines() if line.startswith(f"| {key} |")).split("|")
        assert float(cells[3]) == pytest.approx(current[key], rel=0.002), key


def test_the_fit_reads_the_calibration_rows_as_they_ran():
    """The #19 matrix's finished rows are fitted as the engine reported it ran them, except the tiled ones and
    mixed-precision full fine-tuning (solved by matrix_terms_fit, reported here); a row measured again by a later
    engine (the garbage-collector fix, then the fused LoRA kernels) counts as then measured, the mean of those
    calls."""
    import statistics

    calibrate = load_calibrate()
    rows = [row for row in calibrate.load_rows() if row.source.startswith("calibration-")]
    fitted = [row for row in rows if row.kind == "cal"]
    assert len(fitted) >= 45 and {row.plan.method for row in fitted} == {"full", "lora", "dora", "qlora"}
    assert not any(row.plan.tiles_mlp for row in fitted)
    assert all(row.plan.precision == "pure-bf16" for row in fitted if row.plan.method == "full")
    excluded = {row.name for row in rows if row.kind == "excluded"}
    assert "1.5b-full-mixed-b4-s2048-ckpt" in excluded
    small = next(row for row in rows if row.name == "0.5b-full-bf16-b8-s2048-nockpt")  # a full row: not measured again
    assert small.source == "calibration-part1.json" and small.kind == "cal"
    dora = next(row for row in rows if row.name == "1.5b-dora-b4-s2048-ckpt")
    after_fix = []
    for name in ("calibration-gcfreeze-b.json",):
        results = json.loads((ROOT / "bench" / "results" / "estimate_matrix" / name).read_text())["results"]
        after_fix += [r["tokens_per_s"] for r in results if r["row"] == dora.name]
    assert dora.source == "calibration-gcfreeze-b.json"
    assert dora.measured_tps == pytest.approx(statistics.mean(after_fix), abs=0.1)  # not part 2's
    lora = next(row for row in rows if row.name == "0.5b-lora-b1-s1024-nockpt")
    assert lora.source == "calibration-kernels-b.json" and lora.measured_tps == pytest.approx(6100.4, abs=0.1)
    assert lora.plan.checkpointed_layers == 0 and lora.plan.micro_batch_size == 1
    assert lora.plan.lora_dropout_fused and lora.plan.rms_norm_rows  # the engine's defaults then
    older = [row for row in rows if row.kind == "before"]  # its earlier LoRA rows: reported, not fitted
    assert older and all(row.plan.method in ("lora", "qlora") and not row.plan.lora_dropout_fused for row in older)


def test_long_context_speed_counts_causal_attention():
    """The issue's case (#19): 7B QLoRA at 96k with offloaded activations ran 3,978 tok/s; the estimator
    said 1,235 when it counted the whole s x s matrix at the LoRA GEMM efficiency."""
    from core.estimate import estimate, find_gpu, plan_for_model

    plan = plan_for_model("Qwen2.5-7B", method="qlora", micro_batch_size=1, seq_len=98304, offload_activations=True)
    result = estimate(plan, find_gpu("H200"))
    assert result.tokens_per_s == pytest.approx(3978, rel=0.10)


def test_batches_keep_plain_loss_rows_before_fused_ones_and_parts_cover_every_row():
    bench = load_bench()
    rows = bench._rows()
    batches = bench.plan_batches(rows, steps=4)
    flat = [config for batch in batches for config in batch]
    assert sorted(c.name for c in flat) == sorted(c.name for c in rows)
    for batch in batches:
        assert len({c.model for c in batch}) == 1  # one model per worker process
        fused = [c.fused_ce for c in batch]
        assert fused == sorted(fused)  # Liger patches transformers process-wide: plain rows first
    parts = bench.split_parts(batches, 3, steps=4)
    assert sorted(c.name for part in parts for batch in part for c in batch) == sorted(c.name for c in rows)
    loads = [sum(8 + sum(bench.row_cost_s(c, 4) for c in batch) for batch in part) for part in parts]
    assert max(loads) < 1.5 * min(loads) and max(loads) < 400


def test_part_option_is_checked():
    bench = load_bench()
    assert bench._part("2/3") == (2, 3)
    import argparse

    for bad in ("0/3", "4/3", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench._part(bad)


def test_report_only_merges_parts_in_matrix_order(tmp_path):
    bench = load_bench()
    names = bench._rows()[:3]
    from dataclasses import asdict

    def part(folder, measured_index):
        rows = []
        for index, config in enumerate(names):
            status = {"status": "ok", "nvml_peak_gib": 3.0, "tokens_per_s": 1000.0 + index} if index == measured_index \
                else {"status": "skipped", "error": "time budget spent"}
            rows.append({"name": config.name, "config": asdict(config), "estimate": {}, "measured": status})
        (tmp_path / folder).mkdir()
        path = tmp_path / folder / "estimate_matrix.json"
        path.write_text(json.dumps({"meta": {"gpu": "H200", "wall_s": 100.0}, "rows": list(reversed(rows))}))
        return path

    first, second = part("p1", 0), part("p2", 2)
    assert bench.main(["--report-only", str(first), str(second), "--out", str(tmp_path / "merged")]) == 0
    data = json.loads((tmp_path / "merged" / "estimate_matrix.json").read_text())
    assert [row["name"] for row in data["rows"]] == [c.name for c in names]
    assert [row["measured"]["status"] for row in data["rows"]] == ["ok", "skipped", "ok"]
    assert data["meta"]["wall_s"] == 200.0
    assert all(row["estimate"]["tokens_per_s"] > 0 for row in data["rows"])  # re-estimated


def test_a_chunked_row_trains_with_the_engines_own_loss(monkeypatch):
    """Without Liger (here: on the CPU) a fused-CE row measures core.train.fused_loss, not a copy of it."""
    pytest.importorskip("peft")
    from core.train import fused_loss

    bench = load_bench()
    calls = []
    engine_loss = fused_loss.forward_chunked_loss

    def counted(*args, **kwargs):
        calls.append(kwargs.get("chunk_tokens"))
        return engine_loss(*args, **kwargs)

    monkeypatch.setattr(fused_loss, "forward_chunked_loss", counted)
    config = bench.BenchConfig("smoke", "lora", micro_batch_size=2, seq_len=32, fused_ce=True)
    result = bench.run_worker({"config": bench.asdict(config), "steps": 2, "device": "cpu",
                               "model_config": bench.SMOKE_CONFIG})
    assert result["status"] == "ok", result
    assert result["fused_ce_impl"] == "chunked"
    assert len(calls) == 2 and all(isinstance(c, int) and c > 0 for c in calls)
    assert not hasattr(bench, "_chunked_cross_entropy")
