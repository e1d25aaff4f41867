"""bench/calibration_matrix.py without a GPU (issue #19): the declared rows and their parts by the time model,
every row's estimator call, the report's pass/fail lines, and one tiny-model row end to end through the
engine runner on a CPU (the measured rows come from the H200, bench/results/estimate_matrix/calibration-part*)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import calibration_matrix as cm  # noqa: E402


def _run(*args: str, tmp_path: Path, timeout: int = 120, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TUNEDECK_HOME": str(tmp_path / "unused"), **(env_extra or {})}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "calibration_matrix.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_list_declares_enough_rows_in_parts_that_each_fit_one_call(tmp_path):
    done = _run("--list", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [r for r in cm.ROWS if not r.skip]
    assert len(rows) >= 64 and len({r.name for r in cm.ROWS}) == len(cm.ROWS)  # names are unique
    parts = cm.plan_parts(cm.ROWS)
    assert [r for p in parts for r, _ in p] == list(cm.ROWS)  # every row in one part, in order
    for part in parts:
        assert cm.part_seconds(part) <= cm.PART_LIMIT_S, [(r.name, s) for r, s in part]
    assert f"{len(parts)} parts" in done.stdout.splitlines()[-1]
    # the axes are all there
    methods = {(r.method, r.pure_bf16 if r.method == "full" else None) for r in rows}
    assert {("full", True), ("full", False), ("lora", None), ("dora", None), ("qlora", None)} <= methods
    assert {True, False} <= {r.ckpt for r in rows} and any(isinstance(r.ckpt, int) and r.ckpt is not True
                                                           and r.ckpt is not False for r in rows)
    assert {1, 16} <= {r.micro for r in rows} and min(r.seq for r in rows) == 512
    assert max(r.seq for r in rows if r.offload) == 131072 and any(r.seq >= 65536 and not r.offload for r in rows)
    assert {"Qwen2.5-0.5B", "Qwen2.5-72B", "Llama-3-8B"} <= {cm.MODELS[r.model][0] for r in rows}
    assert sum(r.expect == "oom" for r in rows) >= 5
    switched = {k for r in rows for k in r.overrides()}
    assert {"fused_ce", "lora_input_upcast", "lora_fused_add", "compile_layers", "qlora_upcast", "tiled_mlp",
            "offload_activations", "checkpoint_layers", "optimizer"} <= switched
    # QLoRA of 32B/72B (their bf16 random weights do not fit the disk) is declared and skipped
    assert {r.model for r in cm.ROWS if r.method == "qlora" and r.skip} == {"32b", "72b"}


def test_part_argument_must_match_the_plan():
    count = len(cm.plan_parts(cm.ROWS))
    assert cm._parse_part(f"2/{count}", count) == 2
    for bad in ("0/3", f"1/{count + 1}", "2", "a/b"):
        with pytest.raises(ValueError):
            cm._parse_part(bad, count)


def test_every_row_is_estimated_on_a_cpu(tmp_path):
    done = _run("--estimate-only", "--out", str(tmp_path), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "calibration-estimates.json").read_text())["results"]
    assert [r["row"] for r in results] == [r.name for r in cm.ROWS]
    for r in results:
        est = r["estimate"]
        assert "error" not in est and est["peak_gib"] > 0 and est["tokens_per_s"] > 0, r
        assert est["verdict"] in ("fits", "tight", "does_not_fit"), r
        if r["expect"] == "oom":
            assert est["verdict"] == "does_not_fit", r
    by = {r["row"]: r["estimate"] for r in results}
    assert by["7b-lora-b4-s2048-ckpt14"]["checkpointed_layers"] == 14
    assert by["7b-lora-b4-s2048-ckpt-fusedce-False"]["fused_ce"] == "none"


def _record(name: str, status: str, peak_err: float | None, speed_err: float | None, verdict: str) -> dict:
    return {"row": name, "axis": "x", "status": status, "peak_error": peak_err, "speed_error": speed_err,
            "estimate": {"verdict": verdict, "peak_gib": 10.0, "tokens_per_s": 1000.0}}


def test_report_passes_only_what_it_checked():
    good = [_record(f"r{i}", "finished", 0.01, 0.05, "fits") for i in range(59)]
    good.append(_record("oom", "oom", None, None, "does_not_fit"))
    lines, ok = cm.target_lines(good)
    assert ok and all(line.startswith("- PASS") for line in lines), lines
    # too few rows, a peak more than 5 % under, a slow speed estimate, a wrong verdict: each fails its line
    for bad, words in ((good[:-2] + good[-1:], "rows measured"),
                       (good[:-1] + [_record("under", "finished", -0.06, 0.05, "fits"), good[-1]], "under: under"),
                       (good[:-1] + [_record("slow", "finished", 0.01, 0.4, "fits"), good[-1]], "tokens/s worst"),
                       (good[:-1] + [_record("oom2", "oom", None, None, "fits")], "wrong: oom2")):
        lines, ok = cm.target_lines(bad)
        assert not ok and any(line.startswith("- FAIL") and words in line for line in lines), (words, lines)


def test_report_merges_parts(tmp_path):
    a = {"meta": {}, "results": [_record("r1", "failed", None, None, "fits"), _record("r2", "finished", 0.02, 0.1, "fits")]}
    b = {"meta": {}, "results": [_record("r1", "finished", -0.01, 0.02, "fits")]}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    out = tmp_path / "engine-matrix.md"
    assert cm.main(["--report-only", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--report", str(out)]) == 1
    text = out.read_text()
    assert "FAIL: 2 rows measured" in text and "| r1 |" in text and text.count("| r1 |") == 1
    assert "targets NOT met" in text


def test_report_lists_the_rows_measured_more_than_once_with_their_spread(tmp_path):
    """A row that finished in two calls (a part and a later profile call) counts once in the tables, and its
    own section shows both rates and how far apart they are: the device's noise on that row."""
    a = {"meta": {}, "results": [{**_record("r1", "finished", 0.0, 0.1, "fits"), "tokens_per_s": 2000.0},
                                 {**_record("r2", "finished", 0.0, 0.1, "fits"), "tokens_per_s": 500.0}]}
    b = {"meta": {}, "results": [{**_record("r1", "finished", 0.0, 0.1, "fits"), "tokens_per_s": 2300.0},
                                 {**_record("r2", "failed", None, None, "fits"), "tokens_per_s": None}]}
    (tmp_path / "part.json").write_text(json.dumps(a))
    (tmp_path / "profile.json").write_text(json.dumps(b))
    out = tmp_path / "engine-matrix.md"
    cm.main(["--report-only", str(tmp_path / "part.json"), str(tmp_path / "profile.json"), "--report", str(out)])
    text = out.read_text()
    repeats = text.split("## Rows measured more than once")[1]
    assert "| r1 | 2,000 (part.json), 2,300 (profile.json) | +15% |" in repeats
    assert "| r2 |" not in repeats  # its second call did not finish


def test_a_later_engines_calls_stand_for_the_row_and_are_averaged(tmp_path):
    """A row measured again after the engine changed (the garbage-collector fix: ``calibration-gcfreeze-*``) counts
    as then measured, whatever the earlier part says, and several such calls count as their mean; a call that ran
    the row differently (tiled against untiled) says so instead of a spread."""
    part = {"meta": {}, "results": [{**_record("r1", "finished", 0.0, 0.1, "fits"), "tokens_per_s": 1000.0,
                                     "tiled_mlp_run": "auto"}]}
    later = [{"meta": {}, "results": [{**_record("r1", "finished", 0.0, 0.1, "fits"), "tokens_per_s": rate,
                                       "tiled_mlp_run": "false"}]} for rate in (1500.0, 1700.0)]
    files = [tmp_path / "calibration-part1.json", tmp_path / "calibration-gcfreeze-a.json",
             tmp_path / "calibration-gcfreeze-b.json"]
    for path, data in zip(files, [part, *later], strict=True):
        path.write_text(json.dumps(data))
    (merged,) = cm.merged_records([str(f) for f in files])
    assert merged["tokens_per_s"] == 1600.0 and merged["file"] == "calibration-gcfreeze-a.json"
    assert [rate for _, rate in merged["rates"]] == [1500.0, 1700.0]
    out = tmp_path / "engine-matrix.md"
    cm.main(["--report-only", *map(str, files), "--report", str(out)])
    repeats = out.read_text().split("## Rows measured more than once")[1]
    assert "1,000 (calibration-part1.json, tiled_mlp auto)" in repeats and "| - (run differently) |" in repeats


def test_reestimate_makes_each_measured_row_s_estimate_again(tmp_path):
    """``--reestimate``: the recorded estimate (here a wrong one) is replaced by the estimator's for the settings
    the row ran, and the errors with it; a row measured before the launcher tiled by fit is estimated tiled."""
    measured = {"status": "finished", "peak_source": "nvml", "peak_gib": 4.0, "tokens_per_s": 12000.0,
                "fused_ce_run": "liger", "checkpoint_layers_run": 24, "peak_error": 9.0, "speed_error": 9.0,
                "estimate": {"verdict": "does_not_fit", "peak_gib": 40.0, "tokens_per_s": 1.0}}
    old = {"row": "0.5b-lora-b8-s4096-ckpt", "axis": "ckpt", "tiled_mlp_run": "auto", **measured}  # the engine's rule
    new = {**old, "tiled_mlp_run": "false"}  # the launcher resolved auto untiled by fit
    (tmp_path / "a.json").write_text(json.dumps({"meta": {"gpu_name": "NVIDIA H200"}, "results": [old]}))
    (tmp_path / "b.json").write_text(json.dumps({"meta": {"gpu_name": "NVIDIA H200"}, "results": [new]}))
    ran_tiled, by_fit = cm.reestimate(old, "NVIDIA H200"), cm.reestimate(new, "NVIDIA H200")
    assert ran_tiled["estimate"]["mlp_tiles"] == 37 and by_fit["estimate"]["mlp_tiles"] == 1
    for record in (ran_tiled, by_fit):
        est = record["estimate"]
        assert est["verdict"] == "fits" and 2 < est["peak_gib"] < 8  # measured 3.98 GiB tiled
        assert record["peak_error"] == pytest.approx((est["peak_gib"] - 4.0) / 4.0, abs=1e-4)
        assert record["speed_error"] == pytest.approx((est["tokens_per_s"] - 12000.0) / 12000.0, abs=1e-4)
    assert by_fit["estimate"]["tokens_per_s"] > 3 * ran_tiled["estimate"]["tokens_per_s"]
    out = tmp_path / "now.md"
    cm.main(["--report-only", str(tmp_path / "a.json"), "--reestimate", "--report", str(out)])
    text = out.read_text()
    assert "made again by the estimator" in text and "does_not_fit" not in text


def test_tiny_cpu_row_runs_through_the_engine_and_profiles_its_extra_step(tmp_path):
    """The tiny row end to end, with the host probe in its trainer (bench/hostprobe): besides the profile of the
    extra step, the probe's report of the worker says that the engine froze the setup's objects out of the
    garbage collector (unfrozen the trainer tracks over half a million of them, ~550k on the tiny model)."""
    probe = tmp_path / "probe"
    path = os.pathsep.join(p for p in (str(ROOT / "bench" / "hostprobe"), os.environ.get("PYTHONPATH", "")) if p)
    done = _run("--tiny", "--cpu", "--profile", "1", "--home", str(tmp_path / "home"), "--out", str(tmp_path),
                tmp_path=tmp_path, timeout=240, env_extra={"PYTHONPATH": path, "TUNEDECK_HOSTPROBE": str(probe)})
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads((tmp_path / "calibration-rows.json").read_text())["results"]
    assert row["status"] == "finished" and row["tokens_per_s"] > 0 and row["peak_gib"] > 0.05, row
    # the row's own 4 steps give the rate; the fifth ran under the profiler and is left out of it
    assert row["steps"] == 4 and row["wall_s"] > 0 and row["estimate"]["peak_gib"] > 0, row
    assert len(row["step_s"]) == 3 and all(s >= 0 for s in row["step_s"]), row["step_s"]
    (report,) = [f.read_text() for f in probe.glob("probe-*.txt")]  # the worker's; the other processes make none
    assert "core.train.worker" in report.splitlines()[0] and "## garbage collections" in report
    tracked = int(next(line for line in report.splitlines() if line.startswith("tracked objects at exit:")).split(":")[1])
    assert tracked < 100_000, report[:400]
    assert row["engine"] == "tunedeck" and row["config_run"]["micro_batch_size"] == 2
    assert "| tiny-lora-b2-s128-nockpt |" in (tmp_path / "calibration-rows.md").read_text()
    header = row["profile"].splitlines()[:2]  # the CPU's operators: what a GPU profile says of its kernels
    assert header[0].startswith("# 1 steps, self CPU time") and header[1].startswith("wall "), header
    assert "operators per step" in header[1] and "## by family" in row["profile"]
    assert "## tiny-lora-b2-s128-nockpt" in (tmp_path / "calibration-rows-profiles.md").read_text()


def test_rows_that_run_fit_the_disk_and_the_disk_skips_do_not():
    for row in cm.ROWS:
        if row.skip and "disk" in row.skip:
            assert cm.disk_gb(row) > cm.DISK_FREE_GB, row.name
        elif not row.skip:
            assert cm.disk_gb(row) <= cm.DISK_FREE_GB, (row.name, cm.disk_gb(row))


def test_gpu_rows_are_classified_and_compared_with_what_the_engine_ran(monkeypatch, tmp_path):
    """measure_row's GPU path with the engine runner stubbed: a finished row gets its errors from the
    NVML peak and the estimate for the loss and layers the engine reported; an OOM row its verdict only. Each
    row records the share of its data's tokens with a target (half for a row half prompt)."""
    calls = []

    def fake_run_engine(ctx, engine, spec, seq, timeout_s):
        calls.append((engine, spec, ctx["steps"], ctx["dataset"](seq)))
        if spec["method"] == "full":
            return {"status": "failed", "reason": "out of GPU memory", "oom": True, "peak_gib": [139.9],
                    "peak_source": "nvml", "steps": 0}
        return {"status": "finished", "tokens_per_s": 10000.0, "peak_gib": [21.0], "peak_source": "nvml",
                "torch_peak_allocated_gib": [19.0], "torch_peak_reserved_gib": [20.0], "steps": 6,
                "fused_ce": "chunked", "checkpoint_layers_run": 28, "config": {}, "rms_norm_rows_run": True,
                "lora_dropout_fused_run": False}

    monkeypatch.setattr(cm.es, "run_engine", fake_run_engine)
    made = []

    def datasets(seq, n, prompt_tokens):
        made.append((seq, n, prompt_tokens))
        return cm.es.make_long_dataset(tmp_path, seq, n, prompt_tokens)

    ctx = {"datasets": datasets}
    by = {r.name: r for r in cm.ROWS}
    done = cm.measure_row(ctx, by["7b-lora-b4-s2048-ckpt-lorainputupcast-True"], 100, "NVIDIA H200")
    assert calls[0][0] == "tunedeck+lora_input_upcast=true" and calls[0][1]["ckpt"] is True
    assert made[0] == (2048, 4 * calls[0][2] + 2, 0) and calls[0][3].name == f"long-2048-{made[0][1]}.jsonl"
    assert 0.9 < done["target_share"] < 1.0  # a 30-word question, the template's tokens
    assert done["status"] == "finished" and done["estimate"]["fused_ce"] == "chunked"
    assert done["peak_error"] == round((done["estimate"]["peak_gib"] - 21.0) / 21.0, 4)
    assert done["speed_error"] == round((done["estimate"]["tokens_per_s"] - 10000.0) / 10000.0, 4)
    # every switch the engine reported is kept (plan_as_run reads them); one it did not report is None
    assert done["rms_norm_rows_run"] is True and done["lora_dropout_fused_run"] is False
    assert done["recompute_keep_lora_a_run"] is None
    oom = cm.measure_row(ctx, by["7b-full-bf16-b8-s4096-nockpt"], 100, "NVIDIA H200")
    assert oom["status"] == "oom" and oom["peak_error"] is None and cm.verdict_right(oom) is True
    assert calls[1][1]["ckpt"] is False
    half = cm.measure_row(ctx, by["7b-lora-b4-s2048-ckpt-prompt50"], 100, "NVIDIA H200")
    assert made[-1][2] == 1024 and 0.4 < half["target_share"] < 0.6
    assert half["estimate"]["tokens_per_s"] > cm.estimate_row(by["7b-lora-b4-s2048-ckpt"], "H200", "chunked", 28,
                                                               done["target_share"])["tokens_per_s"]


def test_a_switch_a_record_does_not_report_ran_as_the_engine_of_its_file_ran_it():
    """Files from before the fused LoRA kernels ran none of the switches; the later ones (``calibration-kernels-*``,
    whose records kept three) ran the engine's defaults, and a reported value stands in either."""
    record = {"row": "7b-lora-b4-s2048-ckpt", "status": "finished", "lora_swiglu_down_run": True}
    _, old = cm.plan_as_run({**record, "file": "calibration-part4.json"})
    _, new = cm.plan_as_run({**record, "file": "calibration-kernels-a.json"})
    _, off = cm.plan_as_run({**record, "file": "calibration-kernels-a.json", "rms_norm_rows_run": False})
    assert not old.lora_dropout_fused and not old.rms_norm_rows and old.lora_swiglu_down
    assert new.lora_dropout_fused and new.rms_norm_rows and new.lora_swiglu_down
    assert off.lora_dropout_fused and not off.rms_norm_rows
    assert cm.engine_generation("calibration-kernels-a.json") > cm.engine_generation("calibration-gcfreeze-a.json")


def test_report_shows_the_context_and_the_allocator_slack_the_rows_measure():
    rows = [{"row": f"r{i}", "status": "finished", "peak_source": "nvml", "peak_gib": 4.0 + 0.74 + i,
             "torch_peak_reserved_gib": [4.0 + i], "torch_peak_allocated_gib": [3.5 + i],
             "estimate": {"peak_phase": "backward", "breakdown_gib": {"cuda_context": 0.6, "allocator_slack": 0.3}}}
            for i in range(3)]
    text = "\n".join(cm.memory_terms(rows))
    assert "median 0.74 GiB, 0.74-0.74 over 3 rows" in text and "cuda_context: 0.60 GiB" in text
    assert "| r1 | 0.50 | 0.3 | backward |" in text
    assert cm.memory_terms([_record("x", "finished", 0.0, 0.0, "fits")]) == []  # no torch figures: no section


def test_the_fused_ce_false_row_is_explained_by_the_models_own_norms_rotary_and_swiglu():
    """The H200's 7B LoRA row with ``fused_ce: false`` (calibration-kernels-c, 11,543 tok/s) runs transformers'
    RMSNorm and rotary embedding instead of Liger's: with their traffic counted from the ops
    (``speed.eager_kernel_bytes``) the estimate comes within 6% of it; without, it said 13,393 (+16%)."""
    from dataclasses import replace

    from core.estimate import DEFAULT_CALIBRATION, estimate, find_gpu

    data = json.loads((ROOT / "bench/results/estimate_matrix/calibration-kernels-c.json").read_text())
    record = next(r for r in data["results"] if r["row"] == "7b-lora-b4-s2048-ckpt-fusedce-False")
    plan = cm.plan_as_run({**record, "file": "calibration-kernels-c.json"})[1]
    assert not plan.liger_kernels
    none = {"forward": 0.0, "backward": 0.0}
    without = replace(DEFAULT_CALIBRATION, eager_norm_bytes_per_element=none, eager_rope_bytes_per_element=none)
    measured, h200 = record["tokens_per_s"], find_gpu("H200")
    assert abs(estimate(plan, h200, tiles_by_fit=False).tokens_per_s / measured - 1) < 0.06
    assert estimate(plan, h200, without, tiles_by_fit=False).tokens_per_s / measured - 1 > 0.12
