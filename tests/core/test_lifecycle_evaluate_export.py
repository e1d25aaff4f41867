"""Evaluation of a real tiny LoRA run (results saved in the run dir) and the export formats."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.lifecycle.finished_run import finished_run, tunedeck


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return tmp_path_factory.mktemp("lifecycle-eval")


@pytest.fixture()
def lora_run(shared, monkeypatch):
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    from core.runs.run_dir import RunDirectory

    return home, RunDirectory(home / "runs" / run_id)


def test_evaluate_cli_writes_loss_perplexity_and_prompts_into_the_run(lora_run):
    home, run = lora_run
    proc = tunedeck(home, "evaluate", run.id, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    saved = json.loads((run.path / "eval" / "latest.json").read_text())
    assert result["path"].startswith(str(run.path / "eval" / "eval-30-")) and saved["step"] == 30
    assert saved["split"] == "train_sample" and saved["examples"] == 6  # no held-out split: labelled so
    last_train = [json.loads(line) for line in run.metrics_path.read_text().splitlines()
                  if '"kind": "train"' in line][-1]
    # The rebuilt base + adapter is the model that trained: its loss is the last training loss.
    assert abs(saved["tuned"]["loss"] - last_train["loss"]) < 0.1, (saved["tuned"], last_train["loss"])
    assert saved["base"]["loss"] > saved["tuned"]["loss"] + 1.0
    assert saved["tuned"]["perplexity"] == pytest.approx(2.718281828 ** saved["tuned"]["loss"], rel=1e-6)
    first = saved["prompts"][0]
    assert first["prompt"] == "Name a colour." and first["tuned"].strip() == "Blue." and first["base"] != "Blue."
    assert run.last_event("evaluated")["path"] == result["path"]


def test_evaluate_on_a_held_out_split_uses_the_trainers_split(lora_run):
    from core.lifecycle.evaluate import evaluate_run

    _home, run = lora_run
    import yaml

    run.config_path.write_text(yaml.safe_dump({**run.config(), "eval_split": 0.34}))  # as if it had one
    result = evaluate_run(run, checkpoint=15, prompts=["Say yes."])
    assert result["split"] == "held_out" and result["examples"] == 2 and result["step"] == 15
    assert result["prompts"][0]["prompt"] == "Say yes."


def test_benchmarks_without_evalscope_or_lm_eval_say_so(lora_run):
    from core.lifecycle.evaluate import benchmark_tool

    if benchmark_tool() is not None:
        pytest.skip("a benchmark tool is installed here")
    home, run = lora_run
    proc = tunedeck(home, "evaluate", run.id, "--benchmarks", "gsm8k")
    assert proc.returncode == 1
    assert "EvalScope or lm-eval" in proc.stderr and "pip install" in proc.stderr
    assert not (run.path / "eval").exists()  # refused before any work


def test_export_quantized_on_cpu_is_refused_clearly_and_merged_works(lora_run, tmp_path):
    import torch

    from core.lifecycle.export import export_run
    from core.lifecycle.source import LifecycleError

    _home, run = lora_run
    if not torch.cuda.is_available():
        with pytest.raises(LifecycleError, match="needs an NVIDIA GPU"):
            export_run(run, "bnb-4bit")
    result = export_run(run, "merged", out=tmp_path / "exported")
    assert result["out"] == str(tmp_path / "exported") and result["bytes"] > 1_000_000
    assert (tmp_path / "exported" / "model.safetensors").is_file()
    with pytest.raises(LifecycleError, match="unknown export format"):
        export_run(run, "gguf")


def test_export_after_merge_reuses_the_whole_merge_and_refuses_a_foreign_folder_by_name(lora_run):
    """M then X in the TUI: the merged folder both write is the export, not "exists already" (the TUI has
    no --out / --force). A folder there that is no whole merge of this checkpoint is refused with its path
    (OutputExists), so that the TUI can ask to replace it; --force replaces it."""
    from core.lifecycle.export import export_run
    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import OutputExists

    home, run = lora_run
    merged = merge_run(run)
    files = {p.name: p.stat().st_mtime_ns for p in merged.out.iterdir()}
    result = export_run(run, "merged")
    assert result["reused"] and result["out"] == str(merged.out) and result["step"] == 30
    assert result["bytes"] > 1_000_000
    assert {p.name: p.stat().st_mtime_ns for p in merged.out.iterdir()} == files  # untouched, not rewritten
    proc = tunedeck(home, "export", run.id)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(merged.out) and "already holds the whole merge of checkpoint 30" in proc.stderr
    # an earlier checkpoint's merge is not this one's
    (merged.out / "tunedeck_merge.json").write_text(json.dumps({"checkpoint": "elsewhere", "step": 30}))
    with pytest.raises(OutputExists) as caught:
        export_run(run, "merged")
    assert caught.value.path == merged.out and "exists already" in str(caught.value)
    again = export_run(run, "merged", force=True)
    assert not again["reused"] and json.loads((merged.out / "tunedeck_merge.json").read_text())["step"] == 30
    assert export_run(run, "merged")["reused"]


def test_evaluate_a_full_fine_tune_gives_no_base_figure(shared, monkeypatch):
    """A full fine-tune has no adapter to switch off: its base is not at hand. The tuned loss used to be
    reported again as the "base" loss; now base is null in the JSON and the text says why there is none."""
    from core.lifecycle.evaluate import evaluate_run, evaluation_summary
    from core.runs.run_dir import RunDirectory

    home, run_id = finished_run(shared, method="full")
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    run = RunDirectory(home / "runs" / run_id)
    result = evaluate_run(run, prompts=["Say yes."])
    saved = json.loads((run.path / "eval" / "latest.json").read_text())
    assert saved["base"] is None and result["base"] is None
    assert saved["tuned"]["tokens"] > 0 and saved["prompts"][0]["base"] is None and saved["prompts"][0]["tuned"]
    text = evaluation_summary(result)
    assert "no base figure" in text and "base: loss" not in text and f"loss {saved['tuned']['loss']:.4f}" in text
    proc = tunedeck(home, "evaluate", run.id)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "no base figure" in proc.stderr and "base:" not in proc.stderr and "tuned:" in proc.stderr
