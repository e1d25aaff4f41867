"""Config keys that do what they say: ``output`` receives the finished model, and a precision the box
cannot run is recorded as what really runs (fp32), not left saying bf16.

The hardware assumed is stated, not found: ``CUDA_VISIBLE_DEVICES=""`` makes this a box without GPUs
for the launcher and for torch alike, on any machine.
"""

from __future__ import annotations

import filecmp
import json
import time

import yaml

from tests.fixtures.lifecycle.finished_run import PAIRS, TINY, tunedeck

NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def _config(work, **values):
    data = work / "data.jsonl"
    with open(data, "w", encoding="utf-8") as handle:
        for q, a in PAIRS:
            handle.write(json.dumps({"messages": [{"role": "user", "content": q},
                                                  {"role": "assistant", "content": a}]}) + "\n")
    cfg = {"model": str(TINY), "dataset": str(data), "method": "lora", "lora_rank": 4, "max_seq_len": 64,
           "micro_batch_size": 6, "gradient_accumulation": 1, "max_steps": 3, "save_steps": 2,
           "logging_steps": 1, "gradient_checkpointing": False, "seed": 3, **values}
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _wait_finished(home, run_id):
    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory

    run = RunDirectory(home / "runs" / run_id)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and effective_status(run).status not in ("finished", "failed", "crashed",
                                                                                 "stopped"):
        time.sleep(0.3)
    assert run.status().status == "finished", run.log_path.read_text()[-3000:]
    return run


def _events(run):
    return [json.loads(line) for line in run.events_path.read_text().splitlines() if line.strip()]


def test_bf16_on_a_box_without_gpus_is_recorded_as_fp32_and_output_gets_the_adapter(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    yaml_path = _config(tmp_path, precision="bf16", output=str(tmp_path / "models" / "my-adapter"))
    started = tunedeck(home, "train", str(yaml_path), **NO_GPU)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "precision bf16 needs a GPU; this run trains in fp32" in started.stderr
    out = tmp_path / "models" / "my-adapter"
    assert out.is_dir() and not any(out.iterdir())  # created at start: a bad path fails before training
    run = _wait_finished(home, started.stdout.strip())
    resolved = yaml.safe_load(run.config_path.read_text())
    assert resolved["precision"] == "fp32" and resolved["output"] == str(out)
    assert run.metrics_header()["precision"] == "fp32"
    fallback = [e for e in _events(run) if e["event"] == "precision_fallback"]
    assert [(e["requested"], e["used"]) for e in fallback] == [("bf16", "fp32")]
    log = run.log_path.read_text()
    assert "trained model copied to " + str(out) in log
    # The folder holds the adapter of the last checkpoint, its tokenizer and where it came from; the
    # resumable state stays with the checkpoints.
    last = run.last_complete_checkpoint()
    names = sorted(p.name for p in out.iterdir())
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "tokenizer_config.json",
            "tunedeck_output.json"} <= set(names), names
    assert not {"optimizer.pt", "scheduler.pt", "trainer_state.json", "COMPLETE"} & set(names), names
    assert not any(n.startswith("rng_state") for n in names)
    assert filecmp.cmp(out / "adapter_model.safetensors", last.path / "adapter_model.safetensors", shallow=False)
    info = json.loads((out / "tunedeck_output.json").read_text())
    assert info["run_id"] == run.id and info["step"] == last.step == 3 and info["precision"] == "fp32"
    saved = [e for e in _events(run) if e["event"] == "output_saved"]
    assert len(saved) == 1 and saved[0]["path"] == str(out) and saved[0]["bytes"] > 0
    assert not list(out.parent.glob(".*partial*"))
    # The adapter in the folder loads onto the base and is the trained one.
    import torch
    from peft import PeftModel

    from core.lifecycle.source import load_base_model, load_finetuned, resolve_model_source

    source = resolve_model_source(run)
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        expected = load_finetuned(source, "cpu").model(input_ids=ids).logits
        from_out = PeftModel.from_pretrained(load_base_model(source, "cpu"), str(out)).eval()(input_ids=ids).logits
    assert torch.equal(expected, from_out)
    # The same folder again: refused before anything starts, naming the folder; nothing is overwritten.
    again = tunedeck(home, "train", str(yaml_path), "output=" + str(out), **NO_GPU)
    assert again.returncode == 2
    assert f"output: {out} already holds" in again.stderr and "never overwrites" in again.stderr
    assert filecmp.cmp(out / "adapter_model.safetensors", last.path / "adapter_model.safetensors", shallow=False)


def test_output_that_cannot_be_a_folder_is_refused_before_the_run_exists(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    yaml_path = _config(tmp_path, precision="fp32")
    a_file = tmp_path / "taken"
    a_file.write_text("not a folder")
    refused = tunedeck(home, "train", str(yaml_path), f"output={a_file}", **NO_GPU)
    assert refused.returncode == 2 and f"output: {a_file} is a file, not a folder" in refused.stderr
    under_a_file = a_file / "sub"
    refused = tunedeck(home, "train", str(yaml_path), f"output={under_a_file}", **NO_GPU)
    assert refused.returncode == 2 and f"output: cannot create or write the folder {under_a_file}" in refused.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())  # no run was created
    # fp32 asked for: no warning, no event.
    started = tunedeck(home, "train", str(yaml_path), **NO_GPU)
    assert started.returncode == 0, started.stderr[-2000:]
    assert "needs a GPU" not in started.stderr
    run = _wait_finished(home, started.stdout.strip())
    assert not [e for e in _events(run) if e["event"] in ("precision_fallback", "output_saved")]


def test_the_trainer_itself_records_fp32_when_torch_has_no_gpu_for_a_bf16_config(tmp_path, monkeypatch):
    # A run whose config still says bf16 reaches a trainer without CUDA (a CPU build of torch on a GPU
    # box, a config written by another launcher): the trainer warns, records the event, and its metrics
    # header says fp32.
    from core.config import load_run_config
    from core.runs.launch import create_run, start_supervisor

    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = load_run_config(_config(tmp_path, precision="bf16", max_steps=2))
    run = create_run(config, ["test"], gpus=[], root=home / "runs")
    assert yaml.safe_load(run.config_path.read_text())["precision"] == "bf16"
    proc = start_supervisor(run)
    run = _wait_finished(home, run.id)
    proc.wait(timeout=60)
    assert run.metrics_header()["precision"] == "fp32"
    assert [(e["requested"], e["used"]) for e in _events(run) if e["event"] == "precision_fallback"] == [("bf16", "fp32")]
    assert "precision bf16 needs a GPU; this run trains in fp32" in run.log_path.read_text()


def test_a_copy_that_cannot_be_made_is_an_event_and_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    from core.runs.output import publish_run_output
    from tests.fixtures.lifecycle.finished_run import finished_run

    home, run_id = finished_run(tmp_path)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    from core.runs.run_dir import RunDirectory

    run = RunDirectory(home / "runs" / run_id)
    cfg = run.config()
    # Someone put a file into the folder while the run trained: it is not overwritten.
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "theirs.bin").write_bytes(b"keep me")
    assert publish_run_output(run, {**cfg, "output": str(busy)}) is None
    assert sorted(p.name for p in busy.iterdir()) == ["theirs.bin"]
    failed = [e for e in _events(run) if e["event"] == "output_failed"]
    assert failed[-1]["path"] == str(busy) and "holds files by now" in failed[-1]["reason"]
    assert "checkpoint-30" in failed[-1]["reason"]  # where the model is instead
    # A folder whose parent is gone: an event, no exception, nothing half-written anywhere.
    gone = tmp_path / "no-such-parent" / "deeper" / "out"
    (tmp_path / "no-such-parent").mkdir()
    (tmp_path / "no-such-parent" / "deeper").write_text("a file where a folder should be")
    assert publish_run_output(run, {**cfg, "output": str(gone)}) is None
    assert [e["path"] for e in _events(run) if e["event"] == "output_failed"][-1] == str(gone)
    # And a folder that is free: the copy, with the event.
    free = tmp_path / "free"
    assert publish_run_output(run, {**cfg, "output": str(free)}) == free
    assert (free / "adapter_model.safetensors").is_file() and (free / "tunedeck_output.json").is_file()
    assert [e["path"] for e in _events(run) if e["event"] == "output_saved"] == [str(free)]


def test_attn_flash_on_a_box_without_gpus_runs_sdpa_and_check_says_so(tmp_path, monkeypatch):
    """``attn: flash`` (an imported ms-swift file's ``attn_impl flash_attn``) on a box without a GPU: `train --check`
    said "all checks passed" and the run then failed at once (flash-attn is CUDA-only). Now --check and train say it
    runs sdpa there, and the run finishes with attn: sdpa in its config.yaml. Hardware: no GPU (NO_GPU)."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    yaml_path = _config(tmp_path, precision="bf16", attn="flash")
    checked = tunedeck(home, "train", str(yaml_path), "--check", **NO_GPU)
    assert checked.returncode == 0 and "attn: flash needs a GPU" in checked.stderr, checked.stderr[-3000:]
    started = tunedeck(home, "train", str(yaml_path), **NO_GPU)
    assert started.returncode == 0 and "attn: flash needs a GPU" in started.stderr, started.stderr[-3000:]
    run = _wait_finished(home, started.stdout.strip())
    assert yaml.safe_load(run.config_path.read_text())["attn"] == "sdpa"
