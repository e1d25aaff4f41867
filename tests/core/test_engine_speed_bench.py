"""bench/engine_speed.py end to end on the tiny model on a CPU: the plain recipe and tunedeck side by side."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_cpu_matrix_has_both_engines_with_speed_and_loss(tmp_path):
    out = tmp_path / "speed.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TUNEDECK_HOME": str(tmp_path / "unused")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_speed.py"), "--tiny", "--cpu", "--rows",
                           "tiny-lora", "--engines", "plain,tunedeck", "--steps", "5", "--warmup", "2",
                           "--home", str(tmp_path / "home"), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.with_suffix(".json").read_text())["results"]
    by_engine = {r["engine"]: r for r in results}
    assert set(by_engine) == {"plain", "tunedeck"}
    for row in by_engine.values():
        assert row["status"] == "finished", row
        assert row["tokens_per_s"] > 0, row
        assert math.isfinite(row["loss"]), row
        assert row["peak_gib"] and row["peak_gib"][0] > 0.05, row  # the engine's processes were seen
    assert by_engine["tunedeck"]["fused_ce"] == "chunked"
    # Same base weights, same token ids and labels, same steps: the same loss within noise.
    assert abs(by_engine["tunedeck"]["loss"] - by_engine["plain"]["loss"]) < 0.05
    table = out.read_text()
    assert "| tiny-lora | plain |" in table and "| tiny-lora | tunedeck |" in table and "## Analysis" in table
