"""bench/estimate_matrix.py without a GPU: its row list, the estimator's side and the report files."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

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
