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


def test_tunedeck_variants_and_the_wizard_plan_row_run_side_by_side(tmp_path):
    """One call measures each switch as its own engine (``tunedeck+key=value``), profiles each tunedeck row,
    and runs the wizard's own plan for the box (``tunedeck plan --save`` then ``tunedeck train``).

    Hardware: NVML shows one H200 (a recording) while the bench runs ``--cpu``, as on the GPU machine; the
    plan must be made for the CPU the runs get, or its run cannot start."""
    out = tmp_path / "variants.md"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TUNEDECK_HOME": str(tmp_path / "unused"),
           "TUNEDECK_FAKE_GPUS": str(ROOT / "tests" / "fixtures" / "gpus" / "h200x1.json")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_speed.py"), "--tiny", "--cpu", "--rows",
                           "tiny-lora,plan-tiny-lora", "--engines",
                           "plain,tunedeck,tunedeck+lora_input_upcast=true+gradient_checkpointing=true",
                           "--steps", "6", "--warmup", "1", "--profile", "4:1",
                           "--home", str(tmp_path / "home"), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.with_suffix(".json").read_text())["results"]
    rows = {(r["row"], r["engine"]): r for r in results}
    variant = rows[("tiny-lora", "tunedeck+lora_input_upcast=true+gradient_checkpointing=true")]
    assert variant["status"] == "finished" and variant["tokens_per_s"] > 0
    assert variant["config"]["lora_input_upcast"] is True and variant["config"]["gradient_checkpointing"] is True
    assert rows[("tiny-lora", "tunedeck")]["config"]["lora_input_upcast"] is None  # the default, not set
    profile = rows[("tiny-lora", "tunedeck")]["profile"]
    assert profile and "## by family" in profile and "ms/step" in profile
    # the rate is taken before the profiled step; the loss after every step, as in the unprofiled rows
    assert rows[("tiny-lora", "tunedeck")]["steps"] == 3  # a CPU writes each step's log at once
    assert abs(rows[("tiny-lora", "tunedeck")]["loss"] - rows[("tiny-lora", "plain")]["loss"]) < 0.05
    assert variant["profile"] and "## by family" in variant["profile"]  # each switch row is profiled too
    # the plan row: tunedeck only (as planned, and with a switch changed), with the micro-batch the wizard
    # chose (not the bench's)
    assert {engine for row, engine in rows if row == "plan-tiny-lora"} == {
        "tunedeck", "tunedeck+lora_input_upcast=true+gradient_checkpointing=true"}
    assert rows[("plan-tiny-lora", "tunedeck+lora_input_upcast=true+gradient_checkpointing=true")]["config"][
        "lora_input_upcast"] is True
    plan = rows[("plan-tiny-lora", "tunedeck")]
    assert plan["status"] == "finished" and plan["micro"] >= 1 and plan["tokens_per_s"] > 0
    assert "plan-tiny-lora (tunedeck, the wizard's plan" in out.read_text()


def test_engine_specs_are_checked():
    sys.path.insert(0, str(ROOT / "bench"))
    from engine_speed import parse_engine, run_tag

    assert parse_engine("tunedeck+checkpoint_layers=4+compile_layers=true") == (
        "tunedeck", {"checkpoint_layers": 4, "compile_layers": True})
    assert parse_engine("swift-liger") == ("swift-liger", {})
    assert parse_engine("plain+qlora_upcast=false") == ("plain", {"qlora_upcast": False})
    # a run named after a tile file's path (bench/device/occupancy_call.sh) names a file, not a folder
    _, changes = parse_engine("tunedeck+lora_dropout=0+env.TUNEDECK_LORA_DROPOUT_TILES=/root/out/occ-dropout.json")
    assert run_tag(changes) == "lora_dropout-0-env.TUNEDECK_LORA_DROPOUT_TILES-occ-dropout.json"
    for bad in ("plain+fused_ce=false", "tunedeck+nokey"):
        try:
            parse_engine(bad)
        except ValueError as exc:
            assert bad in str(exc)
        else:
            raise AssertionError(bad)
