"""``tunedeck plan`` as a subprocess: JSON on stdout, human text, exit codes, --save."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.hubserver import closed_port_url

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "core" / "data" / "samples" / "tiny_skills.jsonl"


def tunedeck(tmp_path, *args, fake_gpus=None):
    # a hub id found nowhere here is read from the hub: never the real ones from a test
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "MODELSCOPE_ENDPOINT": closed_port_url(),
           "HF_ENDPOINT": closed_port_url()}
    env.pop("TUNEDECK_FAKE_GPUS", None)
    if fake_gpus:
        env["TUNEDECK_FAKE_GPUS"] = str(ROOT / "tests" / "fixtures" / "gpus" / f"{fake_gpus}.json")
    return subprocess.run([sys.executable, "-m", "core", "plan", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_json_for_planned_hardware_with_data_and_save(tmp_path):
    out = tmp_path / "run.yaml"
    proc = tunedeck(tmp_path, "--model", "Qwen2.5-7B", "--dataset", str(SAMPLE), "--hardware", "2xA100-80GB",
                    "--goal", "lowest_cost", "--price-per-gpu-hour", "2.5", "--save", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["feasible"] is True and data["goal"] == "lowest_cost"
    assert data["hardware"]["gpu"] == "A100-80GB" and data["hardware"]["count"] == 2
    best = data["recommendation"]
    assert best["plan"]["precision"] == "bf16" and best["cost"] is not None
    assert best["peak_gib"] < best["capacity_gib"]
    assert {r["field"] for r in data["reasons"]} >= {"method", "precision", "zero", "batch", "seq_len"}
    assert 1 <= len(data["alternatives"]) <= 3 and all(a["trade_off"] for a in data["alternatives"])
    assert data["dataset_summary"]["records"] > 0 and data["dataset_summary"]["histogram"]
    saved = yaml.safe_load(out.read_text())
    assert data["saved"] == str(out)
    assert saved["method"] == best["plan"]["method"] and saved["gpus"] == best["plan"]["num_gpus"]


def test_this_box_detected_through_the_monitor(tmp_path):
    proc = tunedeck(tmp_path, "--model", "tiny", "--dataset", str(SAMPLE), "--gpus", "1", "--json",
                    fake_gpus="h200x2")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["hardware"]["detected"] is True and data["hardware"]["gpu_indices"] == [1]
    assert data["hardware"]["gpu"] == "H200"


def test_a_gpu_count_given_to_plan_is_answered_with_how_to_give_indices(tmp_path):
    """``estimate --gpus 2`` is a count; ``plan --gpus 2`` picks GPU 2 (indices, as before: ``--gpus 1`` above is
    GPU 1). On a box of GPUs 0 and 1 it said only that GPU 2 is not there: now one line says GPUs are chosen by
    index, with the list to write. Fake NVML: two H200s."""
    proc = tunedeck(tmp_path, "--model", "tiny", "--gpus", "2", fake_gpus="h200x2")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "tunedeck: no GPU with index 2 on this box (it has: 0, 1); GPUs are chosen by index, not by count: "
        "0,1 takes the first two"]


def test_gpu_indices_given_on_a_box_without_gpus_say_there_are_none(tmp_path):
    """On a box with no GPU, ``plan --gpus 0`` (and the wizard's GPU field) said "(it has: -); GPUs are chosen by
    index, not by count", which reads as a mistyped index. It says the box has no GPU, and the two ways on.
    Fake NVML: no GPU."""
    proc = tunedeck(tmp_path, "--model", "tiny", "--gpus", "0", fake_gpus="none")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "tunedeck: no GPU with index 0: this box has no NVIDIA GPU that NVML sees; leave the GPU indices out to "
        "plan its CPU, or plan hardware you do not have (like 1xH200)"]


def test_cpu_box_and_human_output(tmp_path):
    # A box without GPUs, stated (fake NVML with none): on a GPU box the real NVML would be detected.
    proc = tunedeck(tmp_path, "--model", "tiny", "--dataset", str(SAMPLE), fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    assert "Recommended: " in proc.stdout and "fp32" in proc.stdout
    assert "Why:" in proc.stdout


def test_a_plan_under_a_cent_says_so_not_zero(tmp_path):
    # The sample trains in about a minute: at 2.5 a GPU-hour that is under a cent, which printed "cost 0.00"
    # (and "costs 0.0 instead of 0.0" for the alternatives); two costs that read the same are not compared.
    proc = tunedeck(tmp_path, "--model", "Qwen2.5-7B", "--dataset", str(SAMPLE), "--hardware", "2xA100-80GB",
                    "--goal", "lowest_cost", "--price-per-gpu-hour", "2.5")
    assert proc.returncode == 0, proc.stderr
    assert ", cost < 0.01\n" in proc.stdout
    assert "Alternatives:" in proc.stdout and "instead of < 0.01" not in proc.stdout
    assert "cost 0.0" not in proc.stdout and "costs 0.0" not in proc.stdout
    priced = tunedeck(tmp_path, "--model", "Qwen2.5-7B", "--dataset", str(SAMPLE), "--hardware", "2xA100-80GB",
                      "--goal", "lowest_cost", "--price-per-gpu-hour", "250")
    assert priced.returncode == 0, priced.stderr
    assert re.search(r", cost \d+\.\d\d\n", priced.stdout)  # at 100 times the price: cents, the same format


def test_a_plan_under_a_cent_costs_more_than_zero_in_json(tmp_path):
    # --json rounded every cost to the cent: this plan (about 0.0015 at 2.5 a GPU-hour) said "cost": 0.0.
    proc = tunedeck(tmp_path, "--model", "Qwen2.5-7B", "--dataset", str(SAMPLE), "--hardware", "2xA100-80GB",
                    "--goal", "lowest_cost", "--price-per-gpu-hour", "2.5", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    costs = [data["recommendation"]["cost"]] + [alt["cost"] for alt in data["alternatives"]]
    assert all(0 < cost < 0.01 for cost in costs), costs


def test_lora_dropout_says_what_it_costs_on_a_gpu(tmp_path):
    """LoRA with dropout on one H200 (``--hardware``) says how much faster the plan would be without it,
    and that figure is the estimate of the same plan at dropout 0; without dropout, or on a CPU, no line."""
    base = ("--model", "Qwen2.5-7B", "--dataset", str(SAMPLE), "--hardware", "1xH200", "--set", "method=lora",
            "--set", "seq_len=2048", "--set", "micro_batch_size=4", "--set", "gradient_checkpointing=true",
            "--json")
    proc = tunedeck(tmp_path, *base)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    lines = [r["message"] for r in data["reasons"] if r["field"] == "lora_dropout"]
    assert len(lines) == 1 and "0.05" in lines[0], data["reasons"]
    pct = int(lines[0].split("about ")[1].split("%")[0])
    assert 1 <= pct <= 15  # measured on the H200 at this shape: 5.6% (bench/results/engine-speed-summary.md)
    plan = data["recommendation"]["plan"]
    assert plan["lora_dropout"] == 0.05 and plan["optimizer"] == "adamw_fused"
    said = float(lines[0].split("runs about ")[1].split(" tokens/s")[0].replace(",", ""))
    # the same plan at dropout 0, through `tunedeck estimate`
    same = subprocess.run(
        [sys.executable, "-m", "core", "estimate", "--model", "Qwen2.5-7B", "--method", "lora", "--batch-size",
         str(plan["micro_batch_size"]), "--seq-len", "2048", "--grad-accum", str(plan["grad_accum_steps"]),
         "--optimizer", "adamw_fused", "--gpu", "H200", "--lora-dropout", "0",
         "--target-share", str(plan["lm_head_share"]), "--json"],
        capture_output=True, text=True, env={**os.environ, "TUNEDECK_HOME": str(tmp_path / "home")}, cwd=ROOT,
        timeout=120)
    assert same.returncode == 0, same.stderr
    assert abs(said - json.loads(same.stdout)["tokens_per_s"]) <= 1.0
    cpu = json.loads(tunedeck(tmp_path, "--model", "tiny", "--dataset", str(SAMPLE), "--hardware", "cpu",
                              "--set", "method=lora", "--json").stdout)
    assert not [r for r in cpu["reasons"] if r["field"] == "lora_dropout"]


def test_infeasible_exits_3_with_ways_out(tmp_path):
    proc = tunedeck(tmp_path, "--model", "Qwen2.5-72B", "--hardware", "1xRTX-4090", "--host-ram-gib", "64",
                    "--json")
    assert proc.returncode == 3
    data = json.loads(proc.stdout)
    assert data["feasible"] is False and data["way_out"]
    assert data["recommendation"]["problems"]


def test_user_errors_exit_2_with_a_message(tmp_path):
    bad_gpu = tunedeck(tmp_path, "--model", "tiny", "--hardware", "3xTPU")
    assert bad_gpu.returncode == 2 and "TPU" in bad_gpu.stderr and bad_gpu.stdout == ""
    bad_set = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--set", "method=sft")
    assert bad_set.returncode == 2 and "qlora" in bad_set.stderr
    bad_model = tunedeck(tmp_path, "--model", "no/such-model", "--hardware", "cpu")
    assert bad_model.returncode == 2 and "config.json" in bad_model.stderr


def test_a_sequence_length_the_run_config_refuses_is_refused_up_front_and_a_plan_saves_as_shown(tmp_path):
    # hardware: --hardware 1xH200 (typed)
    common = ("--model", "Qwen2.5-7B", "--hardware", "1xH200", "--dataset", str(SAMPLE))
    for value, limit in (("8", "at least 16"), ("2000000", "at most 1048576")):
        out = tmp_path / f"s{value}.yaml"
        proc = tunedeck(tmp_path, *common, "--set", f"seq_len={value}", "--save", str(out))
        assert proc.returncode == 2 and proc.stdout == "" and not out.exists()
        assert limit in proc.stderr and "max_seq_len" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    out = tmp_path / "s16.yaml"
    proc = tunedeck(tmp_path, *common, "--set", "seq_len=16", "--save", str(out))
    assert proc.returncode == 0 and ", sequence 16," in proc.stdout
    assert yaml.safe_load(out.read_text())["max_seq_len"] == 16
    # too small is said in the config's words too, not "out of range (ZeRO 0-3, others at least 1)"
    from core.plan.overrides import OverrideError, parse_override_value

    for name, value, key in (("lora_rank", "-1", "lora_rank"), ("micro_batch_size", "0", "micro_batch_size")):
        with pytest.raises(OverrideError, match=f"must be at least 1 \\(the run config's {key}\\)"):
            parse_override_value(name, value)


def test_hardware_cpu_is_sized_against_this_box_ram(tmp_path):
    """``--hardware cpu`` is this box's CPU: its RAM (the recording's host: 251.8 GiB on the fake 2xH200
    box) is the capacity, not an assumed 16 GiB; --host-ram-gib still wins."""
    fake = json.loads((ROOT / "tests" / "fixtures" / "gpus" / "h200x2.json").read_text())
    ram_gib = round(fake["host"]["memory_total_bytes"] / 1024**3, 1)
    proc = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--json", fake_gpus="h200x2")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["hardware"]["gpu"] is None and data["hardware"]["host_ram_gib"] == ram_gib
    assert abs(data["recommendation"]["capacity_gib"] - ram_gib) < 0.5
    stated = json.loads(tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--host-ram-gib", "64",
                                 "--json", fake_gpus="h200x2").stdout)
    assert stated["hardware"]["host_ram_gib"] == 64.0


def test_save_refuses_to_overwrite_without_force_and_writes_absolute_paths(tmp_path):
    """A hand-edited file is never replaced silently; the saved YAML names the data by its absolute path,
    so `train` finds it from any directory; it is block YAML, one key a line."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.jsonl").write_text(SAMPLE.read_text())
    mine = work / "mine.yaml"
    mine.write_text("# my hand-edited\n")
    # a hub id found nowhere here is read from the hub: never the real ones from a test
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "MODELSCOPE_ENDPOINT": closed_port_url(),
           "HF_ENDPOINT": closed_port_url()}
    env.pop("TUNEDECK_FAKE_GPUS", None)

    def plan(*extra):
        return subprocess.run([sys.executable, "-m", "core", "plan", "--model", "tiny", "--hardware", "cpu",
                               "--dataset", "data.jsonl", "--save", "mine.yaml", *extra],
                              capture_output=True, text=True, env=env, cwd=work, timeout=120)

    refused = plan()
    assert refused.returncode == 2 and "mine.yaml exists already" in refused.stderr and "--force" in refused.stderr
    assert mine.read_text() == "# my hand-edited\n"
    forced = plan("--force")
    assert forced.returncode == 0, forced.stderr
    text = mine.read_text()
    saved = yaml.safe_load(text)
    assert saved["dataset"] == str((work / "data.jsonl").resolve()) and saved["model"] == "tiny"
    assert "\nmodel: tiny\n" in text and "{" not in text  # block style, not one flow mapping


def test_the_wizards_save_takes_the_next_free_name_beside_a_file_it_did_not_write(tmp_path):
    """The wizard's save (``save_run_config_keeping``) never replaces what it did not write: a name is taken when
    it is free, holds the same text, or holds what this caller wrote there (untouched since)."""
    from core.plan.run_config import free_config_path

    plans = tmp_path / "plans"
    plans.mkdir()
    path = plans / "tiny.yaml"
    assert free_config_path(path, "new") == path  # free
    path.write_text("new")
    assert free_config_path(path, "new") == path  # the same text already
    path.write_text("# my edits\n")
    assert free_config_path(path, "new") == plans / "tiny-2.yaml"
    (plans / "tiny-2.yaml").write_text("old plan")
    assert free_config_path(path, "new") == plans / "tiny-3.yaml"
    assert free_config_path(path, "new", {plans / "tiny-2.yaml": "old plan"}) == plans / "tiny-2.yaml"  # ours


def test_options_out_of_range_are_refused_by_the_parser(capsys):
    """--epochs -1 was planned and failed at --save; --effective-batch -3 was planned as 1; --hardware ""
    meant this box. Each is refused at once (exit 2) with the run config's own words."""
    import pytest

    from core.cli import build_parser
    from core.i18n import set_language

    set_language("en")
    cases = {("--epochs", "-1"): "argument --epochs: got -1.0; must be more than 0",
             ("--epochs", "0"): "argument --epochs: got 0.0; must be more than 0",
             # 1e308 epochs: no integer count of the tokens seen (an OverflowError's traceback)
             ("--epochs", "1e308"): "argument --epochs: got 1e+308; must be at most 1000000",
             ("--effective-batch", "-3"): "argument --effective-batch: got -3; must be at least 1",
             ("--hardware", ""): "argument --hardware: must not be empty",
             ("--price-per-gpu-hour", "-1"): "argument --price-per-gpu-hour: got -1.0; must be at least 0"}
    for (option, value), said in cases.items():
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["plan", "--model", "tiny", option, value])
        assert exited.value.code == 2
        assert capsys.readouterr().err.strip().endswith(said), option


def test_hardware_count_limit_and_capital_x(tmp_path):
    too_many = tunedeck(tmp_path, "--model", "tiny", "--hardware", "1000000xH200")
    assert too_many.returncode == 2 and "GPU count must be 1 to 1024 (got 1000000)" in too_many.stderr
    capital = tunedeck(tmp_path, "--model", "tiny", "--hardware", "2XH200", "--json")
    assert capital.returncode == 0, capital.stderr
    assert json.loads(capital.stdout)["hardware"]["count"] == 2


def test_broken_rows_are_listed_and_an_empty_file_is_refused(tmp_path):
    """The plan is made on the rows that load, and the others are listed as `data check` lists them."""
    broken = tmp_path / "broken.jsonl"
    broken.write_text(SAMPLE.read_text().splitlines()[0] + '\n{"messages": [\n{"foo": 1}\n')
    proc = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--dataset", str(broken), "--json")
    assert proc.returncode == 0, proc.stderr
    assert f"{broken}:2: invalid JSON" in proc.stderr and f"{broken}:3: missing key 'messages'" in proc.stderr
    assert "2 problem(s)" in proc.stderr
    assert len(json.loads(proc.stdout)["dataset_summary"]["problems"]) == 2
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--dataset", str(empty))
    assert proc.returncode == 2 and "has no usable record" in proc.stderr and "the file is empty" in proc.stderr


def test_save_to_a_folder_is_refused_and_a_plan_gets_the_umask_mode(tmp_path):
    """``--save FOLDER --force`` ended in an IsADirectoryError traceback after the planning; it is refused up
    front (exit 2), the folder untouched. A saved plan was 0600 whatever the umask, and --force made a 0644
    file 0600: a plan is no secret, so it gets the mode a plain write gives (CPU plan, the bundled sample)."""
    folder = tmp_path / "somefolder"
    folder.mkdir()
    (folder / "kept.txt").write_text("mine")
    proc = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--dataset", str(SAMPLE),
                    "--save", f"{folder}/", "--force")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith(f"{folder} is a folder; give a file path for --save, such as "
                                        f"{folder}/run.yaml"), proc.stderr
    assert [p.name for p in folder.iterdir()] == ["kept.txt"]

    def save(path, umask, *extra):
        env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home")}
        env.pop("TUNEDECK_FAKE_GPUS", None)
        done = subprocess.run([sys.executable, "-m", "core", "plan", "--model", "tiny", "--hardware", "cpu",
                               "--dataset", str(SAMPLE), "--save", str(path), *extra], capture_output=True,
                              text=True, env=env, cwd=ROOT, timeout=120, preexec_fn=lambda: os.umask(umask))
        assert done.returncode == 0, done.stderr
        return path.stat().st_mode & 0o777

    assert save(tmp_path / "open.yaml", 0o022) == 0o644
    assert save(tmp_path / "private.yaml", 0o077) == 0o600
    assert save(tmp_path / "open.yaml", 0o077, "--force") == 0o644  # a replaced file keeps its mode


def test_save_without_a_dataset_is_refused_before_any_planning(tmp_path):
    """``plan --save y.yaml`` without --dataset planned, then failed to save: "<plan>: dataset: is required".
    It is refused up front, exit 2, nothing written (the model is not even looked up: an unknown one)."""
    out = tmp_path / "y.yaml"
    proc = tunedeck(tmp_path, "--model", "no-such-model-anywhere", "--hardware", "cpu", "--save", str(out))
    assert proc.returncode == 2 and not out.exists()
    assert proc.stderr.strip() == ("tunedeck: --save writes a run configuration, and a run needs data: add "
                                   "--dataset FILE (or leave out --save to see the plan alone)"), proc.stderr


def test_plan_reads_a_folder_a_list_and_a_sample_and_plans_a_hub_id_without_statistics(tmp_path):
    """--dataset took one local file: a folder was "this is a folder", a hub id "file not found … (or a hub
    dataset id owner/name)", each under "cannot read the dataset X: The data has a problem:". A folder, a comma
    list and ``#N`` are read as train reads them; a hub id is planned without statistics, said in a note; a
    missing file is said in one line (CPU plan)."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_text(SAMPLE.read_text())
    out = tmp_path / "run.yaml"
    proc = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--dataset", f"{folder},{SAMPLE}#5",
                    "--save", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["dataset_summary"]["records"] == len(SAMPLE.read_text().splitlines()) + 5
    assert yaml.safe_load(out.read_text())["dataset"] == [str(folder), f"{SAMPLE}#5"]  # as train anchors it
    hub = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--dataset", "owner/name", "--json")
    assert hub.returncode == 0, hub.stderr
    assert json.loads(hub.stdout)["dataset_summary"]["on_hub"] == ["owner/name"]
    assert "note: owner/name is hub data, not downloaded to plan: the plan is made without data statistics" \
        in hub.stderr
    missing = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--dataset", "nosuch.jsonl")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        "tunedeck: nosuch.jsonl: file not found; give the path of a .jsonl, .json, .csv, .parquet or .txt file "
        "(or a hub dataset id owner/name)"]
    zero = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--dataset", f"{SAMPLE}#0")
    assert zero.returncode == 2
    assert zero.stderr.strip().splitlines() == [  # the entry once, then what is wrong (it was said twice)
        f"tunedeck: {SAMPLE}#0: the number after # is how many records to take and must be at least 1"]


def test_the_plan_says_how_many_records_its_sequence_length_cuts_and_leaves_out(tmp_path):
    """A 5M-character record at sequence 128 was planned without a word that it is cut (and, its answer past
    the cut, left out of training): the reasons now count the records cut and those left out (CPU plan)."""
    chat = lambda q, a: {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}  # noqa: E731
    rows = [chat("word " * 3000, "ok"), chat("hi", "x " * 400)] + [chat("q", "a")] * 30
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")

    def seq_reasons(seq: int) -> list[str]:
        proc = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--dataset", str(data),
                        "--set", f"seq_len={seq}", "--json")
        assert proc.returncode == 0, proc.stderr
        return [r["message"] for r in json.loads(proc.stdout)["reasons"] if r["field"] == "seq_len"]

    cut = seq_reasons(128)  # both long records cut; the first one's answer is past the cut
    assert len(cut) == 2 and cut[1].startswith("2 records are longer than 128 tokens (the longest ") \
        and "the cut leaves 1 of them without an answer" in cut[1], cut
    assert seq_reasons(1024)[1].startswith("1 record is longer than 1024 tokens") \
        and seq_reasons(1024)[1].endswith("which leaves it without an answer: left out of training")
    assert seq_reasons(16384) == ["seq_len = 16384: set by you"]  # nothing longer: nothing said


def test_a_sequence_length_that_cuts_every_answer_is_refused_with_the_length_that_keeps_one(tmp_path):
    """Chats whose prompts alone are past the plan's sequence length: every record cut before its answer, which
    the engine drops, so the run trains on nothing; the plan only counted the records cut and went on. Refused
    now as an empty dataset is (exit 2, one line), with the shortest length at which a record keeps its answer:
    at that length it plans, one below it is refused again (CPU plan, the tiny model's tokenizer)."""
    chat = lambda q, a: {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}  # noqa: E731
    rows = [chat("word " * 300, "ok"), chat("long question " * 200, "yes")]
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")

    def plan(seq: int) -> subprocess.CompletedProcess:
        return tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--dataset", str(data),
                        "--set", f"seq_len={seq}", "--json")

    refused = plan(128)
    assert refused.returncode == 2 and refused.stdout == ""
    line, = refused.stderr.strip().splitlines()
    assert line.startswith(f"tunedeck: every record of {data} (2) is cut at 128 tokens before its answer"), line
    need = int(re.search(r"raise seq_len to at least (\d+), or shorten the prompts$", line)[1])
    assert need > 128
    assert plan(need).returncode == 0
    assert plan(need - 1).returncode == 2
    # the length said is one the engine really trains at: its cut keeps a labelled token of a record there
    from core.data.loading import read_local_data
    from core.data.stats import load_tokenizer
    from core.data.tokenize import tokenize_dataset

    records = read_local_data(str(data), seed=0)[0].records
    assert tokenize_dataset(records, load_tokenizer("tiny"), need).input_ids
    assert not tokenize_dataset(records, load_tokenizer("tiny"), 128).input_ids


def test_a_plan_of_the_bundled_tiny_model_trains_at_the_demos_learning_rate(tmp_path):
    """The tiny model's weights start random: at the full fine-tuning default (1e-5) a wizard plan of it moved
    its loss from 6.8 to 6.6 in its 54 steps, a run that seems to learn nothing; the demo's rate takes it to
    about 2.7. A pretrained model's plan keeps the default. Planned for this box's CPU (fake NVML with none)."""
    from core.config.demo import TINY_LEARNING_RATE, default_demo_config

    out = tmp_path / "tiny.yaml"
    proc = tunedeck(tmp_path, "--model", "tiny", "--dataset", str(SAMPLE), "--save", str(out), fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(out.read_text())["learning_rate"] == TINY_LEARNING_RATE == default_demo_config().learning_rate
    other = tmp_path / "qwen.yaml"
    proc = tunedeck(tmp_path, "--model", "Qwen2.5-0.5B", "--dataset", str(SAMPLE), "--hardware", "H200",
                    "--save", str(other))
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(other.read_text())["learning_rate"] in (1e-5, 1e-4)


def test_a_set_value_that_cannot_be_read_names_the_override_why_and_a_right_one(tmp_path):
    """``--set`` refused a value as ``override seq_len=[0: a whole number is needed`` (or only the choices),
    unlike ``train key=value``'s ``override 'gpus=[0': the value '[0' is not valid YAML (...); write it as
    e.g. gpus=[0,1] or gpus=2``: plan's now says which override as written, why, and right ones, with the
    run config's own examples where the name is a run-config key. Hardware: --hardware cpu (typed)."""
    from core.config.checks import override_examples

    proc = tunedeck(tmp_path, "--model", "tiny", "--hardware", "cpu", "--set", "seq_len=[0")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert ("override 'seq_len=[0': the value '[0' is not a whole number; write it as e.g. seq_len=4096 or "
            "seq_len=auto") in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    from core.plan.overrides import OverrideError, parse_overrides

    for item, why, key in (("max_seq_len=abc", "the value 'abc' is not a whole number", "max_seq_len"),
                           ("lora_rank=x", "the value 'x' is not a whole number", "lora_rank"),
                           ("method=sft", "the value 'sft' is not one of full, lora, dora, qlora", "method"),
                           ("zero_stage=7", "got 7; ZeRO stages are 0 to 3", "zero_stage")):
        with pytest.raises(OverrideError) as info:
            parse_overrides([item])
        assert str(info.value) == f"override '{item}': {why}; write it as e.g. {override_examples(key)[0]} or {key}=auto"


def test_overlong_drop_counts_the_dropped_samples_out_of_the_plan_and_warns(tmp_path):
    """A run with overlong: drop leaves the samples longer than seq_len out; the plan counted them cut (their
    first seq_len tokens in the tokens, steps, time and cost) and said nothing of the loss. Now its figures
    leave them out, a warning says how many and the seq_len that keeps them all, and --save writes the key.
    Hardware: --hardware 1xH100 (typed, no GPU of this box)."""
    data = ROOT / "tests" / "fixtures" / "data" / "overlong.jsonl"  # 6 short chats, 2 of over 300 tokens
    args = ("--model", "tiny", "--dataset", str(data), "--hardware", "1xH100", "--set", "seq_len=64",
            "--effective-batch", "4", "--epochs", "1")
    cut = tunedeck(tmp_path, *args, "--json")
    saved = tmp_path / "drop.yaml"
    drop = tunedeck(tmp_path, *args, "--set", "overlong=drop", "--json", "--save", str(saved))
    assert cut.returncode == 0 and drop.returncode == 0, cut.stderr + drop.stderr
    cut, drop = json.loads(cut.stdout), json.loads(drop.stdout)
    assert (cut["data"]["samples"], cut["data"]["cut"], cut["data"]["overlong_dropped"]) == (8, 2, 0)
    assert (drop["data"]["samples"], drop["data"]["cut"], drop["data"]["overlong_dropped"]) == (6, 0, 2)
    assert (cut["data"]["steps_per_epoch"], drop["data"]["steps_per_epoch"]) == (2, 2)
    # the two long ones read 64 tokens each when cut, nothing when dropped
    assert cut["data"]["tokens_per_epoch"] - drop["data"]["tokens_per_epoch"] == 2 * 64
    assert drop["recommendation"]["hours"] < cut["recommendation"]["hours"]
    said = [w["message"] for w in drop["recommendation"]["warnings"]]
    assert any("2 of 8 samples are longer than 64 tokens and will be left out (overlong: drop)" in m
               and "seq_len 909 keeps them all" in m for m in said), said
    assert not any("left out (overlong: drop)" in w["message"] for w in cut["recommendation"]["warnings"])
    assert drop["overlong"] == "drop" and yaml.safe_load(saved.read_text())["overlong"] == "drop"
    text = tunedeck(tmp_path, *args, "--set", "overlong=drop")
    assert "2 of 8 samples are longer than 64 tokens and will be left out" in text.stdout, text.stderr


def test_plan_json_steps_per_epoch_follow_the_plans_effective_batch_not_the_one_asked(tmp_path):
    """`plan --json`'s data block divided the samples by the effective batch asked for; a pinned micro-batch and
    accumulation make the plan's own batch (3 here, 4 asked): its steps are the plan's. Hardware: --hardware
    1xH100 (typed, no GPU of this box)."""
    data = ROOT / "tests" / "fixtures" / "data" / "overlong.jsonl"  # 8 samples
    out = tunedeck(tmp_path, "--model", "tiny", "--dataset", str(data), "--hardware", "1xH100", "--set",
                   "seq_len=64", "--set", "micro_batch_size=3", "--set", "grad_accum_steps=1",
                   "--effective-batch", "4", "--epochs", "1", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    best = plan["recommendation"]
    assert best["effective_batch"] == 3, best
    assert plan["data"]["steps_per_epoch"] == 3  # ceil(8 / 3), not ceil(8 / 4)


def test_overlong_drop_on_hub_data_says_the_count_left_out_is_not_known(tmp_path):
    """Hub data is not downloaded to plan: with overlong=drop the plan said nothing of samples left out, which
    reads as "none". It now says one line: how many are longer and left out is not known until the data is
    measured; with cut (the default) nothing more is said. CPU plan (--hardware cpu)."""
    args = ("--model", "tiny", "--hardware", "cpu", "--dataset", "owner/name", "--json")
    drop = tunedeck(tmp_path, *args, "--set", "overlong=drop")
    cut = tunedeck(tmp_path, *args)
    assert drop.returncode == 0 and cut.returncode == 0, drop.stderr + cut.stderr
    warned = [w["message"] for w in json.loads(drop.stdout)["recommendation"]["warnings"] if "overlong" in w["message"]]
    seq = json.loads(drop.stdout)["recommendation"]["plan"]["seq_len"]
    assert warned == [f"overlong: drop: how many samples are longer than {seq} tokens, and left out, is not known "
                      "until the data is measured (a local copy gives it)"]
    assert not any("overlong" in w["message"] for w in json.loads(cut.stdout)["recommendation"]["warnings"])


# A Qwen3-style hybrid template: with enable_thinking false an empty think block comes before each answer.
QWEN3_STYLE_TEMPLATE = (
    "{%- set off = enable_thinking is defined and enable_thinking is false %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if off %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{{ m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if off %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def test_thinking_false_counts_the_empty_think_block_of_every_answer_and_is_saved(tmp_path):
    """`plan --set thinking=false` for a model whose template reads enable_thinking: the planner counted the
    data's tokens without it, a few tokens short per answer (the run renders an empty think block before each);
    now the tokens are counted with it, the JSON says it and --save writes the key. Hardware: --hardware 1xH100
    (typed, no GPU of this box)."""
    import shutil

    from transformers import AutoTokenizer

    from core.data import load_records
    from tests.fixtures.lifecycle.finished_run import TINY

    model = tmp_path / "qwen3ish"
    shutil.copytree(TINY, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    tokenizer.save_pretrained(model)
    args = ("--model", str(model), "--dataset", str(SAMPLE), "--hardware", "1xH100", "--epochs", "1", "--json")
    unset = tunedeck(tmp_path, *args)
    saved = tmp_path / "off.yaml"
    off = tunedeck(tmp_path, *args, "--set", "thinking=false", "--save", str(saved))
    assert unset.returncode == 0 and off.returncode == 0, unset.stderr + off.stderr
    unset, off = json.loads(unset.stdout), json.loads(off.stdout)
    assert unset["dataset_summary"]["exact"] and off["dataset_summary"]["exact"]
    answers = sum(1 for record in load_records(SAMPLE) for m in record.messages if m.role == "assistant")
    block = len(tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"])
    assert off["dataset_summary"]["total_tokens"] - unset["dataset_summary"]["total_tokens"] == answers * block
    assert off["thinking"] is False and unset["thinking"] is None
    assert yaml.safe_load(saved.read_text())["thinking"] is False
    bad = tunedeck(tmp_path, *args, "--set", "thinking=maybe")
    assert bad.returncode == 2 and "thinking=maybe" in bad.stderr, bad.stderr


LF_YAML = """\
### model
model_name_or_path: tiny
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 4
lora_target: all

### dataset
dataset: skills
dataset_dir: data
template: qwen
cutoff_len: 256

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 2.0e-3
num_train_epochs: 2.0
bf16: true
"""


def _llamafactory_folder(tmp_path):
    """A LLaMA-Factory YAML with its data folder (a dataset_info.json naming the sample), as its examples lay them."""
    folder = tmp_path / "lf"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "skills.jsonl").write_text(SAMPLE.read_text())
    (folder / "data" / "dataset_info.json").write_text(json.dumps({"skills": {
        "file_name": "skills.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    (folder / "lf_sft.yaml").write_text(LF_YAML)
    return folder


def test_config_replans_a_llamafactory_yaml_for_this_box_keeping_its_choices(tmp_path):
    """``plan --config`` did not exist: an imported LLaMA-Factory file could not be planned again for the box at hand
    keeping what it trains. Now its method, rank and cutoff_len are pinned (said with the file's lines), its data is
    found through its dataset_dir, its effective batch (1 x 8) and epochs are kept, the batch shape and precision are
    planned for the hardware, --set wins (overlong=drop here), and --save writes the file's keys with the plan's: a
    run file `train --check` takes. Hardware: a planned 1xA100-80GB (nothing detected)."""
    folder = _llamafactory_folder(tmp_path)
    out = tmp_path / "replanned.yaml"
    proc = tunedeck(tmp_path, "--config", str(folder / "lf_sft.yaml"), "--hardware", "cpu",
                    "--set", "overlong=drop", "--save", str(out), "--json", fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    plan = data["recommendation"]["plan"]
    assert plan["method"] == "lora" and plan["lora_rank"] == 4 and plan["seq_len"] == 256
    assert data["overlong"] == "drop" and data["epochs"] == 2.0
    assert data["dataset_summary"]["records"] > 0  # the dataset_info name was read through dataset_dir
    assert plan["micro_batch_size"] * plan["grad_accum_steps"] == 8
    source = str(folder / "lf_sft.yaml")
    assert data["config"]["pinned"] == {"method": {"value": "lora", "from": f"{source}:8"},
                                        "lora_rank": {"value": 4, "from": f"{source}:9"},
                                        "max_seq_len": {"value": 256, "from": f"{source}:16"}}
    assert data["config"]["planned_again"] == ["precision", "micro_batch_size", "gradient_accumulation"]
    assert f"kept method=lora ({source}:8); lora_rank=4 ({source}:9); max_seq_len=256 ({source}:16)" in proc.stderr
    saved = yaml.safe_load(out.read_text())
    assert saved["lora_rank"] == 4 and saved["lora_alpha"] == 8 and saved["max_seq_len"] == 256
    assert saved["overlong"] == "drop" and saved["learning_rate"] == 2e-3 and saved["epochs"] == 2.0
    assert saved["micro_batch_size"] == plan["micro_batch_size"] and saved["precision"] == "fp32"
    assert saved["dataset"] == "skills" and saved["dataset_dir"] == str(folder / "data")
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"),
           "TUNEDECK_FAKE_GPUS": str(ROOT / "tests" / "fixtures" / "gpus" / "none.json")}
    check = subprocess.run([sys.executable, "-m", "core", "train", str(out), "--check"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=120)
    assert check.returncode == 0, check.stderr


def test_config_set_wins_and_auto_frees_a_pinned_field(tmp_path):
    """A tunedeck YAML's method and rank are pinned; --set lora_rank=2 replaces the file's, --set method=auto lets the
    planner choose the method again; the command line's --epochs beats the file's. Hardware: planned 1xA100-80GB."""
    run = tmp_path / "run.yaml"
    run.write_text(f"model: tiny\ndataset: {SAMPLE}\nmethod: dora\nlora_rank: 4\nepochs: 5\n")
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "1xA100-80GB", "--set", "lora_rank=2",
                    "--epochs", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["recommendation"]["plan"]["method"] == "dora" and data["recommendation"]["plan"]["lora_rank"] == 2
    assert data["epochs"] == 1.0 and data["config"]["pinned"] == {"method": {"value": "dora", "from": f"{run}:3"}}
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "1xA100-80GB", "--set", "method=auto", "--json")
    data = json.loads(proc.stdout)
    assert "method" not in data["overrides"] and data["epochs"] == 5.0


def test_config_with_a_lora_rank_and_no_method_is_planned_as_the_lora_it_trains(tmp_path):
    """A file with ``lora_rank: 4`` and no method (which `train` runs as LoRA, the default method) said it kept
    lora_rank=4 while the planner picked a full fine-tune and --save wrote ``method: full``, its LoRA keys dropped.
    Its LoRA key now pins the LoRA method, said at that key's line. Hardware: planned 1xA100-80GB."""
    run = tmp_path / "run.yaml"
    run.write_text(f"model: tiny\ndataset: {SAMPLE}\nlora_rank: 4\n")
    out = tmp_path / "re.yaml"
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "1xA100-80GB", "--save", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    plan = data["recommendation"]["plan"]
    assert (plan["method"], plan["lora_rank"]) == ("lora", 4)
    assert data["config"]["pinned"] == {"method": {"value": "lora", "from": f"{run}:3"},
                                        "lora_rank": {"value": 4, "from": f"{run}:3"}}
    assert f"kept method=lora ({run}:3); lora_rank=4 ({run}:3)" in proc.stderr
    saved = yaml.safe_load(out.read_text())
    assert (saved["method"], saved["lora_rank"]) == ("lora", 4)


def test_config_errors_name_the_file_line_and_key(tmp_path):
    """A run file with a wrong value is refused before planning, naming file:line: key; a missing file says so; plan
    without --model or --config says what it needs."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"model: tiny\ndataset: {SAMPLE}\nlora_rank: zero\n")
    proc = tunedeck(tmp_path, "--config", str(bad), "--hardware", "1xA100-80GB")
    assert proc.returncode == 2 and f"{bad}:3: lora_rank: got 'zero'; expected an integer" in proc.stderr
    proc = tunedeck(tmp_path, "--config", str(tmp_path / "nope.yaml"), "--hardware", "1xA100-80GB")
    assert proc.returncode == 2 and f"{tmp_path / 'nope.yaml'}: no such file" in proc.stderr
    # a folder (an ms-swift output folder, which holds its args.json) is there: said as a folder, not 'no such file'
    (tmp_path / "out").mkdir()
    proc = tunedeck(tmp_path, "--config", str(tmp_path / "out"), "--hardware", "1xA100-80GB")
    assert proc.returncode == 2 and f"{tmp_path / 'out'} is a folder; --config takes a run file" in proc.stderr
    assert "no such file" not in proc.stderr
    proc = tunedeck(tmp_path, "--hardware", "1xA100-80GB")
    assert proc.returncode == 2 and "plan needs a model: --model ID" in proc.stderr


def test_config_save_names_a_bundled_model_by_its_hub_id_on_the_files_hub(tmp_path):
    """A run file naming a bundled config (``Qwen2.5-7B``: it plans offline but has no weights) was saved by ``plan
    --config --save`` as it was, which `train` cannot download; it is now the hub id on the file's hub, as ``plan
    --save`` writes it, and the file's hub is kept. Hardware: planned 1xA100-80GB."""
    run = tmp_path / "run.yaml"
    run.write_text(f"model: Qwen2.5-7B\nhub: huggingface\ndataset: {SAMPLE}\n")
    out = tmp_path / "re.yaml"
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "1xA100-80GB", "--save", str(out))
    assert proc.returncode == 0, proc.stderr
    saved = yaml.safe_load(out.read_text())
    assert saved["model"] == "Qwen/Qwen2.5-7B" and saved["hub"] == "huggingface"


def test_config_of_an_args_json_with_flash_attention_saves_a_cpu_plan(tmp_path):
    """An ms-swift args.json with ``attn_impl: flash_attn`` planned for this box's CPU: --save refused ("attn flash
    needs precision bf16 or fp16, not fp32"), as the plan is fp32; the saved re-plan now runs the default attention.
    Hardware: this box's CPU (fake NVML with no GPU)."""
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"model": "tiny", "train_type": "lora", "dataset": [f"{SAMPLE}#40"],
                                "torch_dtype": "bfloat16", "attn_impl": "flash_attn", "max_length": 512,
                                "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
                                "num_train_epochs": 1.0, "split_dataset_ratio": 0.0}))
    out = tmp_path / "re.yaml"
    proc = tunedeck(tmp_path, "--config", str(args), "--hardware", "cpu", "--save", str(out), fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    saved = yaml.safe_load(out.read_text())
    assert saved["precision"] == "fp32" and saved["attn"] == "auto" and saved["dataset"] == f"{SAMPLE}#40"
    assert saved["max_seq_len"] == 512 and "epochs 1;" in proc.stderr


def test_config_of_an_args_json_that_yaml_cannot_read_cites_its_json_lines(tmp_path):
    """An args.json is JSON, but its keys' lines (and its duplicate-key check) were read with a YAML reader: one
    indented with tabs (json.dump(indent="\\t")), or holding a C1 character in a value (ensure_ascii=False, as
    ms-swift writes it), ended `plan --config` and `tunedeck import` in a yaml ScannerError/ReaderError traceback.
    Now it is read as JSON: planned, and each kept key cited at its own line. Hardware: this box's CPU (fake NVML
    with no GPU)."""
    keys = {"model": "tiny", "train_type": "lora", "dataset": [f"{SAMPLE}#40"], "max_length": 512,
            "lora_rank": 4, "num_train_epochs": 1.0, "split_dataset_ratio": 0.0}
    for name, text in (("tabs.json", json.dumps(keys, indent="\t")),
                       ("c1.json", json.dumps({**keys, "system": "a\x9ab"}, indent=2, ensure_ascii=False))):
        args = tmp_path / name
        args.write_text(text, encoding="utf-8")
        proc = tunedeck(tmp_path, "--config", str(args), "--hardware", "cpu", fake_gpus="none")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (name, proc.stderr[-2000:])
        # {, model, train_type, dataset [, its item, ], max_length, lora_rank: the lines json.dump wrote
        assert f"method=lora ({args}:3); lora_rank=4 ({args}:8); max_seq_len=512 ({args}:7)" in proc.stderr, \
            proc.stderr


def test_config_takes_the_command_lines_model_where_the_file_has_a_shell_variable(tmp_path):
    """``swift sft --model $MODEL ...`` in a script: ``plan --config run.sh --model tiny`` was refused ("model: is
    required"), the command line's model not reaching the file's check; now the command line's model is planned and
    the file's $MODEL line is said. Hardware: this box's CPU (fake NVML with no GPU)."""
    script = tmp_path / "run.sh"
    script.write_text(f"swift sft --model $MODEL --train_type lora --dataset {SAMPLE} --lora_rank 4\n")
    proc = tunedeck(tmp_path, "--config", str(script), "--model", "tiny", "--hardware", "cpu", "--json",
                    fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["model"] == "tiny" and data["recommendation"]["plan"]["lora_rank"] == 4
    assert "model: $MODEL → needs you" in proc.stderr


def test_config_with_set_of_a_run_key_is_kept_in_the_plan_and_the_save(tmp_path):
    """``plan --config run.yaml --set learning_rate=2e-5`` was refused ("cannot read override ... field one of method,
    precision, ...") though the file and train take learning_rate: --set with --config takes a run key that is no
    planner field as ``train FILE key=value`` does (checked; said on the pins line; saved), and one the plan decides
    for the box (gpus) is refused saying what --set takes there. Hardware: this box's CPU (fake NVML with no GPU)."""
    run = tmp_path / "run.yaml"
    run.write_text(f"model: tiny\ndataset: {SAMPLE}\nlearning_rate: 1e-4\nmicro_batch_size: 2\n")
    out = tmp_path / "re.yaml"
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "cpu", "--set", "learning_rate=2e-5",
                    "--set", "eval_split=0.1", "--save", str(out), fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    assert "learning_rate=2e-05 (--set); eval_split=0.1 (--set)" in proc.stderr, proc.stderr
    saved = yaml.safe_load(out.read_text())
    assert (saved["learning_rate"], saved["eval_split"]) == (2e-5, 0.1)
    bad = tunedeck(tmp_path, "--config", str(run), "--hardware", "cpu", "--set", "learning_rate=abc",
                   fake_gpus="none")
    assert bad.returncode == 2 and "learning_rate=abc" in bad.stderr and "expected a number" in bad.stderr
    planned = tunedeck(tmp_path, "--config", str(run), "--hardware", "cpu", "--set", "gpus=2", fake_gpus="none")
    assert planned.returncode == 2
    assert "plan --config plans gpus for this box" in planned.stderr and "learning_rate=2e-5" in planned.stderr


def test_config_with_max_steps_is_planned_for_those_steps(tmp_path):
    """A run file that ends at ``max_steps: 10`` was planned (time, cost) for 3 epochs of its data; it is now planned
    for the epochs those steps read at its effective batch (10 x 4 of the sample's records), and the saved re-plan
    keeps max_steps, no epochs. Hardware: this box's CPU (fake NVML with no GPU)."""
    run = tmp_path / "run.yaml"
    run.write_text(f"model: tiny\ndataset: {SAMPLE}\nmax_steps: 10\nmicro_batch_size: 2\ngradient_accumulation: 2\n")
    out = tmp_path / "re.yaml"
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "cpu", "--save", str(out), "--json",
                    fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    records = data["dataset_summary"]["records"]
    assert data["epochs"] == pytest.approx(10 * 4 / records, rel=0.01)
    saved = yaml.safe_load(out.read_text())
    assert saved["max_steps"] == 10 and saved["epochs"] is None


def test_config_with_max_steps_counts_the_rows_its_trainer_trains_not_all_records(tmp_path):
    """``max_steps`` was turned into epochs over every record of the data: a run holding half of it out
    (``eval_split: 0.5``) or packing its samples into a few rows reads more epochs of its training rows in those
    steps than planned (time, cost). Now the rows are counted as the trainer makes them: the held-out records out,
    packed rows where it packs. Hardware: this box's CPU (fake NVML with no GPU)."""
    def epochs_of(extra):
        run = tmp_path / "run.yaml"
        run.write_text(f"model: tiny\ndataset: {SAMPLE}\nmax_steps: 10\nmicro_batch_size: 2\n"
                       f"gradient_accumulation: 2\n{extra}")
        proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "cpu", "--json", fake_gpus="none")
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        return data["epochs"], data["dataset_summary"]["records"]

    plain, records = epochs_of("")
    assert plain == pytest.approx(10 * 4 / records, rel=0.01)
    split, _ = epochs_of("eval_split: 0.5\n")
    assert split == pytest.approx(10 * 4 / (records - round(records * 0.5)), rel=0.01)
    packed, _ = epochs_of("packing: true\nmax_seq_len: 2048\n")
    assert packed > 3 * plain  # the sample's short chats: several to a 2048-token row


def test_config_with_max_steps_on_hub_data_says_max_steps_not_epochs(tmp_path):
    """A run file that ends at ``max_steps: 100`` on hub data (not downloaded, so not measured) was said as "epochs 3"
    on the pins line and ``"epochs": 3.0`` in --json's config: a run length it does not have. Now both say its
    max_steps; measured data says the epochs those steps read. The line then said "time and cost are for 3 epochs"
    where the plan gave no time or cost at all (no token counts): the time and cost are now those of the file's 100
    steps, each sample counted at the full sequence length, said as an upper bound. Hardware: planned 1xA100-80GB."""
    run = tmp_path / "run.yaml"
    run.write_text("model: tiny\ndataset: AI-ModelScope/alpaca-gpt4-data-en\nmax_steps: 100\n")
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "1xA100-80GB", "--price-per-gpu-hour", "2",
                    "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    config, best = data["config"], data["recommendation"]
    assert (config["max_steps"], config["epochs"], config["time_upper_bound"]) == (100, None, True)
    tokens = 100 * config["effective_batch"] * best["plan"]["seq_len"]
    assert best["hours"] == pytest.approx(tokens / best["tokens_per_s"] / 3600.0, rel=0.01)
    assert best["cost"] is not None
    assert ("max_steps 100 (the data is on a hub, not measured: time and cost are for 100 steps with every sample at "
            "the full sequence length, an upper bound)") in proc.stderr
    assert "epochs 3;" not in proc.stderr and "3 epochs" not in proc.stderr
    text = tunedeck(tmp_path, "--config", str(run), "--hardware", "1xA100-80GB")
    assert re.search(r"Time: .+ for 100 steps \(at most: each sample counted at the full \d+ tokens\)", text.stdout), \
        text.stdout
    run.write_text(f"model: tiny\ndataset: {SAMPLE}\nmax_steps: 1\nmicro_batch_size: 1\ngradient_accumulation: 1\n")
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "1xA100-80GB", "--json")
    config = json.loads(proc.stdout)["config"]
    assert config["max_steps"] == 1 and 0 < config["epochs"] < 1
    assert f"max_steps 1 (about {config['epochs']:.3g} epochs of the data)" in proc.stderr


def test_config_with_a_large_max_steps_on_small_data_says_its_epochs_as_a_plain_number(tmp_path):
    """``max_steps: 200000`` on the 274-record sample was said as "about 1.17e+04 epochs": now a plain number, as
    the plan's time line says epochs too. Hardware: planned 1xA100-80GB."""
    from core.plan.view import epochs_words

    run = tmp_path / "run.yaml"
    run.write_text(f"model: tiny\ndataset: {SAMPLE}\nmax_steps: 200000\n")
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "1xA100-80GB")
    assert proc.returncode == 0, proc.stderr
    said = re.search(r"max_steps 200000 \(about (\S+) epochs of the data\)", proc.stderr)
    assert said is not None and re.fullmatch(r"\d+", said.group(1)), proc.stderr
    assert epochs_words(1.17e6) == "1170000 epochs" and epochs_words(1.0) == "1 epoch"


def test_config_with_max_steps_and_the_command_lines_epochs_saves_those_epochs(tmp_path):
    """``plan --config run.yaml --epochs 2 --save`` of a file that ends at ``max_steps: 10`` planned (time, cost) for 2
    epochs yet saved the file's max_steps (and no epochs): the saved run trained 10 steps, not what was planned. The
    command line's epochs now replace the file's max_steps in the saved file. Hardware: this box's CPU (fake NVML
    with no GPU)."""
    run = tmp_path / "run.yaml"
    run.write_text(f"model: tiny\ndataset: {SAMPLE}\nmax_steps: 10\nmicro_batch_size: 2\ngradient_accumulation: 2\n")
    out = tmp_path / "re.yaml"
    proc = tunedeck(tmp_path, "--config", str(run), "--hardware", "cpu", "--epochs", "2", "--save", str(out),
                    "--json", fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["epochs"] == 2.0
    saved = yaml.safe_load(out.read_text())
    assert saved["epochs"] == 2.0 and saved["max_steps"] is None


def test_config_save_does_not_say_a_line_the_command_line_decided_needs_you(tmp_path):
    """``plan --config run.sh --model tiny --save re.yaml`` of ``swift sft --model $MODEL ...`` headed the saved file
    with '# model: $MODEL → needs you: ... write its value' right above its ``model: tiny``; the saved file's header
    now lists only what is still open there (an unknown flag here), while stderr still says how the file reads.
    Hardware: this box's CPU (fake NVML with no GPU)."""
    script = tmp_path / "run.sh"
    script.write_text(f"swift sft --model $MODEL --train_type lora --dataset {SAMPLE} --no_such_flag 3\n")
    out = tmp_path / "re.yaml"
    proc = tunedeck(tmp_path, "--config", str(script), "--model", "tiny", "--hardware", "cpu", "--save", str(out),
                    fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    assert "model: $MODEL → needs you" in proc.stderr
    header = [line for line in out.read_text().splitlines() if line.startswith("#")]
    assert not any("$MODEL" in line for line in header), header
    assert any(line.startswith("# no_such_flag: 3 → needs you") for line in header), header
    assert yaml.safe_load(out.read_text())["model"] == "tiny"


def test_config_dataset_option_names_a_dataset_of_the_files_dataset_info(tmp_path):
    """``plan --config lf_sft.yaml --dataset other`` (another name of the file's dataset_info.json, in its dataset_dir)
    was refused ('other: not a file or folder ... no dataset_info.json') though ``train lf_sft.yaml dataset=other``
    finds it there, as the saved re-plan (which keeps dataset_dir) does; --dataset's names are now looked up where the
    file's are. Hardware: this box's CPU (fake NVML with no GPU)."""
    folder = _llamafactory_folder(tmp_path)
    info = json.loads((folder / "data" / "dataset_info.json").read_text())
    info["other"] = {**info["skills"], "file_name": "other.jsonl"}
    (folder / "data" / "dataset_info.json").write_text(json.dumps(info))
    rows = SAMPLE.read_text().splitlines()[:40]
    (folder / "data" / "other.jsonl").write_text("\n".join(rows) + "\n")
    proc = tunedeck(tmp_path, "--config", str(folder / "lf_sft.yaml"), "--dataset", "other", "--hardware", "cpu",
                    "--json", fake_gpus="none")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["dataset_summary"]["records"] == 40


def test_config_of_a_peer_file_keeps_the_peers_default_lora_rank_unless_freed(tmp_path):
    """``swift sft`` without --lora_rank trains ms-swift's rank 8 (``tunedeck import`` fills it in), yet ``plan
    --config`` left the peer's defaults out of what it keeps: the planner picked rank 16 and the saved re-plan trained
    another adapter than the peer's. The peer's defaults are now kept as its keys are (said as its default), and
    ``--set lora_rank=auto`` frees one (a LLaMA-Factory alpha then follows the plan's rank, as there: twice it).
    Hardware: planned 1xA100-80GB."""
    script = tmp_path / "sw.sh"
    script.write_text(f"swift sft --model tiny --train_type lora --dataset {SAMPLE}\n")
    out = tmp_path / "re.yaml"
    proc = tunedeck(tmp_path, "--config", str(script), "--hardware", "1xA100-80GB", "--save", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["recommendation"]["plan"]["lora_rank"] == 8
    assert data["config"]["pinned"]["lora_rank"] == {"value": 8, "from": f"ms-swift's default, left out of {script}"}
    saved = yaml.safe_load(out.read_text())
    assert (saved["lora_rank"], saved["lora_alpha"]) == (8, 32)
    freed = tunedeck(tmp_path, "--config", str(script), "--hardware", "1xA100-80GB", "--set", "lora_rank=auto",
                     "--json")
    assert freed.returncode == 0, freed.stderr
    assert json.loads(freed.stdout)["recommendation"]["plan"]["lora_rank"] != 8
    lf = tmp_path / "lf.yaml"
    lf.write_text(f"model_name_or_path: tiny\nstage: sft\nfinetuning_type: lora\ndataset: {SAMPLE}\n")
    proc = tunedeck(tmp_path, "--config", str(lf), "--hardware", "1xA100-80GB", "--save", str(out), "--force",
                    "--json")
    assert proc.returncode == 0, proc.stderr
    saved = yaml.safe_load(out.read_text())
    assert (saved["lora_rank"], saved["lora_alpha"], saved["learning_rate"]) == (8, 16, 5e-5)
    proc = tunedeck(tmp_path, "--config", str(lf), "--hardware", "1xA100-80GB", "--set", "lora_rank=auto",
                    "--save", str(out), "--force", "--json")
    assert proc.returncode == 0, proc.stderr
    saved = yaml.safe_load(out.read_text())
    assert saved["lora_rank"] != 8 and saved["lora_alpha"] == 2 * saved["lora_rank"]
