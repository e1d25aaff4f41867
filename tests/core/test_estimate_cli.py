"""`tunedeck estimate` as a real subprocess: JSON shape, human table, errors and exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from core.estimate import estimate, find_gpu, known_gpu_names, load_model_config, plan_for_model
from core.estimate.memory import BREAKDOWN_KEYS
from tests.hubserver import closed_port_url

ROOT = Path(__file__).parents[2]


def run_estimate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update({"TUNEDECK_HOME": str(tmp_path), "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
                "HF_HOME": str(tmp_path / "hf"), "MODELSCOPE_CACHE": str(tmp_path / "ms"),
                # a hub id found nowhere here is read from the hub: never the real ones from a test
                "MODELSCOPE_ENDPOINT": closed_port_url(), "HF_ENDPOINT": closed_port_url()})
    return subprocess.run(
        [sys.executable, "-m", "core", "--lang", "en", "estimate", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, encoding="utf-8", timeout=120,
    )


def test_json_output_is_the_estimate(tmp_path):
    result = run_estimate(tmp_path, "--model", "Qwen/Qwen2.5-7B-Instruct", "--method", "lora", "--batch-size", "4",
                          "--seq-len", "2048", "--gpu", "A100-80GB", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # nothing else on stdout
    assert set(data["breakdown"]) == set(BREAKDOWN_KEYS)
    assert data["fits"] is True and data["verdict"] == "fits"
    assert data["capacity_gib"] == 80.0
    expected = estimate(plan_for_model("Qwen2.5-7B", method="lora", micro_batch_size=4, seq_len=2048),
                        find_gpu("A100-80GB"))
    assert abs(data["peak_gib"] - expected.peak_gib) < 1e-3
    assert data["tokens_per_s"] > 0 and data["cpu_ram_gib"] > 0
    assert data["plan"]["lora_rank"] == 16 and data["plan"]["gradient_checkpointing"] is True


def test_json_flags_change_the_plan(tmp_path):
    result = run_estimate(
        tmp_path, "--model", "Qwen2.5-14B", "--method", "full", "--batch-size", "2", "--seq-len", "4096",
        "--no-gradient-checkpointing", "--no-fused-ce", "--optimizer", "adamw_8bit", "--gpus", "8", "--zero", "3",
        "--gpu", "H100", "--dataset-tokens", "1000000", "--price-per-gpu-hour", "3", "--precision", "pure-bf16",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    plan = data["plan"]
    assert (plan["method"], plan["num_gpus"], plan["zero_stage"], plan["optimizer"]) == ("full", 8, 3, "adamw_8bit")
    assert plan["gradient_checkpointing"] is False and plan["fused_ce"] is False
    assert data["breakdown"]["logits_and_loss"] > 10  # 8192 tokens x 152k vocab x 12 bytes
    assert data["epoch_cost"] is not None and data["epoch_hours"] > 0


def test_target_share_is_a_fraction_and_speeds_the_lm_head_up(tmp_path):
    base = ("--model", "Qwen2.5-0.5B", "--batch-size", "8", "--seq-len", "4096", "--no-gradient-checkpointing",
            "--json")
    every = json.loads(run_estimate(tmp_path, *base).stdout)
    half = json.loads(run_estimate(tmp_path, *base, "--target-share", "0.5").stdout)
    assert half["plan"]["lm_head_share"] == 0.5 and every["plan"]["lm_head_share"] == 1.0
    assert half["tokens_per_s"] > every["tokens_per_s"] and half["peak_gib"] == every["peak_gib"]
    for bad in ("0", "1.5", "half"):
        result = run_estimate(tmp_path, *base, "--target-share", bad)
        assert result.returncode == 2 and f"--target-share takes a fraction above 0 and at most 1, like 0.4, not {bad}" \
            in result.stderr


def test_does_not_fit_is_still_a_successful_estimate(tmp_path):
    result = run_estimate(tmp_path, "--model", "Qwen2.5-72B", "--method", "full", "--gpu", "RTX-4090", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["fits"] is False and data["verdict"] == "does_not_fit"


def test_human_output_has_the_breakdown_and_verdict(tmp_path):
    result = run_estimate(tmp_path, "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--method", "full", "--gpu", "H200",
                          "--no-fused-ce")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for label in ("CUDA context", "weights", "gradients", "optimizer", "activations", "logits and loss",
                  "allocator slack"):
        assert label in out
    assert "█" in out and "fits" in out and "tokens/s" in out
    assert "cross-entropy" in result.stderr  # the plain-CE note goes to stderr


def test_an_epoch_under_a_cent_says_so_not_zero(tmp_path):
    """A thousand tokens at 1 a GPU-hour printed "cost 0.00", as if free."""
    result = run_estimate(tmp_path, "--model", "Qwen2.5-0.5B", "--gpu", "H100", "--dataset-tokens", "1000",
                          "--price-per-gpu-hour", "1")
    assert result.returncode == 0, result.stderr
    assert "one epoch of 1,000 tokens: " in result.stdout and ", cost < 0.01\n" in result.stdout
    result = run_estimate(tmp_path, "--model", "Qwen2.5-0.5B", "--gpu", "H100", "--dataset-tokens", "1000",
                          "--price-per-gpu-hour", "1", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # --json said "epoch_cost": 0.0 (rounded to the cent)
    assert 0 < data["epoch_cost"] < 0.01


def test_the_epoch_reads_like_every_duration_in_the_app_not_zero_hours(tmp_path):
    """An epoch of a few seconds printed "0.00 h" ({hours:.2f} h); it reads like a clock now, as ETAs do."""
    result = run_estimate(tmp_path, "--model", "Qwen2.5-0.5B", "--gpu", "H100", "--dataset-tokens", "100000")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^one epoch of 100,000 tokens: 0:[0-5]\d$", result.stdout, re.M), result.stdout
    assert "0.00 h" not in result.stdout
    result = run_estimate(tmp_path, "--model", "Qwen2.5-0.5B", "--gpu", "H100", "--dataset-tokens", "10000000000",
                          "--price-per-gpu-hour", "1")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^one epoch of 10,000,000,000 tokens: \d+d \d\dh, cost [\d,]+\.\d\d$", result.stdout,
                     re.M), result.stdout


def test_the_peak_phase_says_checkpointed_only_with_checkpointing(tmp_path):
    """Without checkpointing the peak was still placed "at the checkpointed backward"."""
    args = ("--model", "Qwen2.5-7B", "--method", "lora", "--batch-size", "16", "--seq-len", "2048")
    plain = run_estimate(tmp_path, *args, "--no-gradient-checkpointing")
    checkpointed = run_estimate(tmp_path, *args)
    assert plain.returncode == 0 and checkpointed.returncode == 0, plain.stderr + checkpointed.stderr
    assert "(at the backward pass)" in plain.stdout and "checkpointed" not in plain.stdout
    assert "(at the checkpointed backward)" in checkpointed.stdout


def test_unknown_gpu_lists_the_known_ones(tmp_path):
    result = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--gpu", "TPUv9", "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    for name in known_gpu_names():
        assert name in result.stderr


def test_unknown_model_says_how_to_pass_a_config(tmp_path):
    result = run_estimate(tmp_path, "--model", "nobody/nothing-7B", "--json")
    assert result.returncode == 2
    assert "config.json" in result.stderr and "--model" in result.stderr
    result = run_estimate(tmp_path, "--model", "nothing-7B", "--json")  # no hub id: the hub is not asked
    assert result.returncode == 2 and "Bundled: " in result.stderr


def test_config_json_path_and_exact_count(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(load_model_config("Qwen2.5-0.5B").config))
    result = run_estimate(tmp_path, "--model", str(config), "--exact", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["param_count"] == "exact" and data["total_params"] == 494_032_768


def test_invalid_combination_exits_2_with_the_fix(tmp_path):
    result = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--offload", "optimizer", "--json")
    assert result.returncode == 2 and "--zero" in result.stderr
    v100 = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--gpu", "V100")
    assert v100.returncode == 2 and "fp16" in v100.stderr
    # QLoRA under ZeRO-3, which plan and the run refuse, was estimated as "fits"
    sharded = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--gpu", "2xH100", "--method", "qlora", "--zero", "3",
                           "--json")
    assert sharded.returncode == 2 and sharded.stdout == "" and "--zero 2" in sharded.stderr


def test_importing_the_estimator_loads_no_heavy_library():
    probe = ("import json, sys\nimport core.estimate, core.estimate.commands\n"
             "from core.estimate import estimate, plan_for_model, find_gpu\n"
             "estimate(plan_for_model('Qwen2.5-7B'), find_gpu('H200'))\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert "core" in loaded
    assert not {"torch", "transformers", "textual", "rich", "pynvml"} & loaded


def test_gpu_count_in_the_gpu_name(tmp_path):
    result = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--method", "full", "--gpu", "8xA100-80GB",
                          "--zero", "3", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["plan"]["num_gpus"] == 8 and data["gpu"] == "A100-80GB" and data["fits"] is True
    # plan's name for it: a user who ran plan --hardware 8xA100-80GB got "unrecognized arguments" here
    hardware = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--method", "full", "--hardware", "8xA100-80GB",
                            "--zero", "3", "--json")
    assert hardware.returncode == 0, hardware.stderr
    assert json.loads(hardware.stdout) == data


def test_estimate_takes_the_hardware_plan_takes_and_refuses_two_counts(tmp_path):
    # --hardware cpu: this box's CPU, as plan --hardware cpu sizes it (fp32, its RAM), where it was "unknown GPU"
    cpu = run_estimate(tmp_path, "--model", "tiny", "--hardware", "cpu", "--json")
    assert cpu.returncode == 0, cpu.stderr
    data = json.loads(cpu.stdout)
    assert data["gpu"] == "CPU" and data["plan"]["precision"] == "fp32" and data["plan"]["num_gpus"] == 1
    assert [gap["field"] for gap in data["domain"]["outside"]] == ["cpu"]  # as plan says it, not "cpu GPUs"
    # said of the CPU and its RAM: no "per GPU", MFU, CUDA context or NCCL rows (all 0 or untrue there)
    text = run_estimate(tmp_path, "--model", "tiny", "--hardware", "cpu")
    assert text.returncode == 0, text.stderr
    assert "on the CPU" in text.stdout and "peak in host RAM" in text.stdout and "(not measured: CPU)" in text.stdout
    for gpu_word in ("GPU", "CUDA", "NCCL", "MFU"):
        assert gpu_word not in text.stdout, text.stdout
    # QLoRA and ZeRO on the CPU: "needs an NVIDIA GPU", not "--precision fp32 does not apply"
    for args in (("--method", "qlora"), ("--method", "full", "--zero", "2")):
        refused = run_estimate(tmp_path, "--model", "tiny", "--hardware", "cpu", *args)
        assert refused.returncode == 2 and "needs" in refused.stderr and "NVIDIA GPU" in refused.stderr, refused.stderr
    # 8xH200 and --gpus 2: one count is asked twice, differently; it estimated 2 GPUs without a word
    both = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--hardware", "8xH200", "--gpus", "2")
    assert both.returncode == 2 and both.stdout == ""
    assert "8xH200" in both.stderr and "--gpus" in both.stderr and len(both.stderr.strip().splitlines()) == 1
    assert run_estimate(tmp_path, "--model", "tiny", "--hardware", "cpu", "--gpus", "2").returncode == 2
    # a GPU named without a count takes --gpus's; the same count twice is no conflict
    for args in (("--hardware", "H200", "--gpus", "2"), ("--hardware", "2xH200", "--gpus", "2")):
        same = run_estimate(tmp_path, "--model", "Qwen2.5-7B", *args, "--json")
        assert same.returncode == 0, same.stderr
        assert json.loads(same.stdout)["plan"]["num_gpus"] == 2


def test_every_dynamic_message_key_exists():
    from core.i18n import catalogue

    messages = catalogue("en")
    keys = [f"estimate.breakdown.{key}" for key in BREAKDOWN_KEYS]
    keys += [f"estimate.{kind}.{phase}" for kind in ("phase", "hint") for phase in ("loss", "backward", "optimizer_step")]
    keys += [f"estimate.verdict.{verdict}" for verdict in ("fits", "tight", "does_not_fit")]
    keys += [f"estimate.note.{note}" for note in ("unknown_family", "kbit_upcast", "paged_optimizer", "dora_dropout", "plain_ce")]
    assert [key for key in keys if key not in messages] == []


def test_human_output_for_a_plan_that_does_not_fit_gives_a_hint(tmp_path):
    result = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--method", "full", "--gpu", "A100-80GB")
    assert result.returncode == 0, result.stderr
    assert "does not fit" in result.stdout and "--optimizer" in result.stdout  # the optimizer step peaks


def test_each_figure_says_its_band_or_why_it_was_not_measured(tmp_path):
    """As the wizard does: inside the measured rows the peak and the speed carry their error band (the JSON has the
    domain the plan's has), outside them why not; a qlora_upcast plan's memory is one of the measured rows."""
    from core.estimate.calibration import MEMORY_ERROR

    inside = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--batch-size", "4", "--gpu", "H200")
    assert inside.returncode == 0, inside.stderr
    peak = next(line for line in inside.stdout.splitlines() if line.startswith("peak per GPU"))
    assert peak.endswith(f"(±{MEMORY_ERROR.worst_pct:.0f}%, {MEMORY_ERROR.rows} H200 runs)"), peak
    speed = next(line for line in inside.stdout.splitlines() if line.startswith("speed:"))
    assert speed.endswith("H200 runs)"), speed

    ampere = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--gpu", "A100-80GB")
    speed = next(line for line in ampere.stdout.splitlines() if line.startswith("speed:"))
    assert speed.endswith("(not measured: Ampere GPUs)"), speed

    upcast = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--method", "qlora", "--qlora-upcast", "--gpu", "H200",
                          "--batch-size", "4", "--seq-len", "2048", "--json")
    result = json.loads(upcast.stdout)
    assert result["domain"]["inside"] is True and result["domain"]["memory"]["inside"] is True
    # its row in the fit: the estimate within the fit's own error of the H200's NVML peak (15.85 GiB)
    fit = json.loads((ROOT / "bench" / "results" / "estimate_matrix" / "memory-fit.json").read_text())
    row = next(r for r in fit["rows"] if r["row"] == "7b-qlora-b4-s2048-ckpt-qloraupcast-True")
    assert abs(result["peak_gib"] / row["nvml_gib"] - 1) * 100 <= fit["quality"]["worst_pct"], (result["peak_gib"], row)


def _parse_error(capsys, *argv: str) -> str:
    """What the parser says (exit 2) about ``argv``, in English."""
    import pytest

    from core.cli import build_parser
    from core.i18n import set_language

    set_language("en")
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_out_of_range_numbers_are_refused_with_the_run_config_limits(capsys):
    """Nonsense was estimated with exit 0 (a cost of -0.04, one epoch of -5 tokens, a 24-million-GiB peak);
    the options now hold to the run config's own limits (max_seq_len 16..1048576, checkpoint_layers >= 0)."""
    from core.config.schema import KEY_SPECS

    cases = {
        ("--checkpoint-layers", "-1"): "argument --checkpoint-layers: got -1; must be at least 0",
        ("--dataset-tokens", "-5"): "argument --dataset-tokens: got -5; must be at least 1",
        ("--price-per-gpu-hour", "-1"): "argument --price-per-gpu-hour: got -1.0; must be at least 0",
        ("--seq-len", "99999999999"):
            f"argument --seq-len: got 99999999999; must be at most {int(KEY_SPECS['max_seq_len'].maximum)}",
        ("--gpus", "0"): "argument --gpus: got 0; must be at least 1",
        ("--lora-dropout", "1"): "argument --lora-dropout: got 1.0; must be less than 1",
        ("--batch-size", "x"): "argument --batch-size: got 'x'; expected an integer",
    }
    for (option, value), said in cases.items():
        assert _parse_error(capsys, "estimate", "--model", "tiny", option, value).endswith(said), option
    from core.cli import build_parser

    fine = build_parser().parse_args(["estimate", "--model", "tiny", "--seq-len", "1048576", "--checkpoint-layers",
                                      "0", "--price-per-gpu-hour", "0"])
    assert fine.seq_len == 1048576 and fine.checkpoint_layers == 0 and fine.price_per_gpu_hour == 0


def test_gpu_counts_are_case_insensitive_and_bounded():
    import pytest

    from core.estimate.gpus import MAX_GPU_COUNT, UnknownGpuError, parse_hardware

    assert parse_hardware("2XH200")[0] == 2 and parse_hardware("2 x h200")[0] == 2
    assert parse_hardware(f"{MAX_GPU_COUNT}xH200")[0] == MAX_GPU_COUNT
    for text in (f"{MAX_GPU_COUNT + 1}xH200", "0xH200", "", "  "):
        with pytest.raises(UnknownGpuError):
            parse_hardware(text)


def test_estimate_takes_the_lm_head_chunk_plan_writes_and_then_agrees_with_plan(tmp_path):
    """plan widens the LM head's chunks (run key ce_chunk_tokens) and estimate had no way to say so: the same shape
    read 25.6 GiB there and 27.1 in the plan. ``--ce-chunk-tokens`` gives it; ``auto`` is the loss's own rule.
    One H100 (typed)."""
    from core.plan import PlanRequest, parse_target, recommend

    best = recommend(PlanRequest("Qwen2.5-0.5B", parse_target("1xH100-80GB", None, 512.0, 1000.0))).best
    p = best.plan
    assert p.ce_chunk_tokens  # the plan widened them (else this compares nothing)
    shape = ("--model", "Qwen2.5-0.5B", "--hardware", "1xH100-80GB", "--method", p.method,
             "--batch-size", str(p.micro_batch_size), "--seq-len", str(p.seq_len), "--json",
             *(() if p.gradient_checkpointing else ("--no-gradient-checkpointing",)))
    same = run_estimate(tmp_path, *shape, "--ce-chunk-tokens", str(p.ce_chunk_tokens))
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["peak_gib"] == round(best.peak_gib, 3)
    auto = json.loads(run_estimate(tmp_path, *shape, "--ce-chunk-tokens", "auto").stdout)
    assert auto["peak_gib"] < json.loads(same.stdout)["peak_gib"]


def test_gpus_takes_a_count_or_the_indices_plan_takes(tmp_path, capsys):
    """``estimate --gpus`` was a count and ``plan --gpus`` a list of indices: ``estimate --gpus 0,1`` was refused as
    not an integer. Both forms are read now (``0,1``: 2 GPUs, as ``--gpus 2``); anything else is one line naming
    both forms. Typed hardware (H200), no GPU of this box."""
    as_count = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--hardware", "H200", "--gpus", "2", "--json")
    as_list = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--hardware", "H200", "--gpus", "0,1", "--json")
    assert as_count.returncode == as_list.returncode == 0, as_list.stderr
    assert json.loads(as_list.stdout)["plan"]["num_gpus"] == 2
    assert json.loads(as_list.stdout) == json.loads(as_count.stdout)
    for wrong in ("0,0", "a,b", "1,,x"):
        said = _parse_error(capsys, "estimate", "--model", "tiny", "--gpus", wrong)
        assert said.endswith(f"argument --gpus: '{wrong}' is neither a GPU count nor a list of distinct GPU indices: "
                             "write a count such as 2, or indices such as 0,1"), said


def test_a_count_after_the_gpu_name_is_read_as_rental_sites_write_it(tmp_path):
    """"H100x2" (and "A100-80GB x 8") were an unknown GPU 'H100x2'; a name that ends in a digit stays a name."""
    from core.estimate.gpus import parse_hardware

    assert [(c, g.name) for c, g in map(parse_hardware, ("H100x2", "A100-80GB x 8", "RTX4090"))] == [
        (2, "H100-80GB-SXM"), (8, "A100-80GB"), (1, "RTX-4090")]
    both = run_estimate(tmp_path, "--model", "Qwen2.5-7B", "--gpu", "H100x2", "--gpus", "4")
    assert both.returncode == 2 and "--gpus says 4" in both.stderr


def test_a_sequence_past_the_trained_positions_is_warned_of_as_plan_warns(tmp_path):
    """seq_len 65536 of Qwen2.5-0.5B (32,768 positions), for an H100 named (no GPU needed): plan warned, estimate
    said nothing; now the same message on stderr, and in the JSON's "warnings" as plan's recommendation has it."""
    from core.plan import PlanRequest, parse_target, recommend

    rec = recommend(PlanRequest(model="Qwen2.5-0.5B", hardware=parse_target("1xH100", None, 512.0, 1000.0),
                                overrides={"seq_len": 65536}))
    planned = [w.to_json() for w in rec.best.warnings if w.key == "plan.warn.past_positions"]
    assert planned and "65536" in planned[0]["message"]
    data = json.loads(run_estimate(tmp_path, "--model", "Qwen2.5-0.5B", "--seq-len", "65536", "--gpu", "H100",
                                   "--json").stdout)
    assert data["warnings"] == planned
    human = run_estimate(tmp_path, "--model", "Qwen2.5-0.5B", "--seq-len", "65536", "--gpu", "H100")
    assert human.returncode == 0 and planned[0]["message"] in human.stderr
    assert planned[0]["message"] not in human.stdout
    within = run_estimate(tmp_path, "--model", "Qwen2.5-0.5B", "--seq-len", "4096", "--gpu", "H100", "--json")
    assert json.loads(within.stdout)["warnings"] == []
    assert "trained positions" not in run_estimate(tmp_path, "--model", "Qwen2.5-0.5B", "--seq-len", "4096").stderr
