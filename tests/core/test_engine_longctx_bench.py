"""bench/engine_longctx.py end to end on the tiny model on a CPU (no GPU: the pipeline, the estimator's
column and the report; the measured long-context rows come from the H200, bench/results/engine-longctx-*)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))


def test_tiny_cpu_series_runs_each_length_with_the_estimate_and_the_longest_per_budget(tmp_path):
    out = tmp_path / "longctx.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TUNEDECK_HOME": str(tmp_path / "unused")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_longctx.py"), "--tiny", "--cpu",
                           "--steps", "2", "--home", str(tmp_path / "home"), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.with_suffix(".json").read_text())["results"]
    assert [r["seq"] for r in results] == [256, 512]
    for row in results:
        assert row["status"] == "finished", row
        assert row["tokens_per_s"] > 0 and row["peak_gib"][0] > 0.05, row
        assert row["estimate"]["peak_gib"] > 0 and row["estimate"]["tiles"] == 1, row  # short: not tiled
    assert "tiny lora (tunedeck), measured: 24 GiB: 512" in out.read_text()


def test_series_argument_names_what_is_wrong():
    import engine_longctx

    assert engine_longctx.parse_series("8b-lora:98304,196608") == ("8b", "lora", [98304, 196608])
    for bad in ("7b:32768", "9b-qlora:1024", "7b-full:1024", "7b-qlora"):
        with pytest.raises(ValueError, match="MODEL-METHOD:LENGTH"):
            engine_longctx.parse_series(bad)
