"""Evaluation of a real tiny LoRA run (results saved in the run dir) and the export formats."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.lifecycle.finished_run import finished_run, tunedeck


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


def test_evaluate_on_data_changed_since_training_says_the_split_is_not_the_runs(lora_run, tmp_path):
    """Records added to the dataset after training moved the rebuilt split: evaluate reported "held-out split:
    loss …" on examples that were not the run's held-out ones (some of them trained on), saying nothing. The
    files changed since the run last trained (its fingerprint) are named in the result and its line."""
    import shutil

    import yaml

    from core.lifecycle.evaluate import evaluate_run, evaluation_summary
    from core.runs.fingerprint import record_fingerprint

    _home, run = lora_run
    data = tmp_path / "data.jsonl"  # the run's data, copied: the module's other tests keep the original
    shutil.copy2(run.config()["dataset"], data)
    cfg = {**run.config(), "dataset": str(data), "eval_split": 0.34}
    run.config_path.write_text(yaml.safe_dump(cfg))
    record_fingerprint(run.path, cfg)  # as if the run had trained on the copy
    same = evaluate_run(run, prompts=[])
    assert same["split"] == "held_out" and same["data_changed"] == []
    assert "data changed" not in evaluation_summary(same)
    with open(data, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"messages": [{"role": "user", "content": "Say no."},
                                              {"role": "assistant", "content": "No."}]}) + "\n")
    moved = evaluate_run(run, prompts=[])
    assert moved["data_changed"] == [str(data)]
    assert json.loads((run.path / "eval" / "latest.json").read_text())["data_changed"] == [str(data)]
    text = evaluation_summary(moved)
    assert f"the data changed since the run last trained on it ({data})" in text, text
    assert "not the split the run held out" in text


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


def test_the_runs_eval_loss_is_what_evaluate_measures_on_its_checkpoint(tmp_path, monkeypatch):
    """The dashboard's eval loss read 1.519 where ``tunedeck evaluate`` of the same checkpoint read 1.472: the
    Trainer took the mean of its eval batches' means (batches of 8 and 6 examples), which weighs a short
    example's tokens more; evaluate counts each held-out target once. The trainer's figure now does too: on
    held-out examples of uneven lengths in uneven batches, the two agree. (CPU, fp32, the bundled tiny model.)"""
    import time

    import yaml

    from core.lifecycle.evaluate import evaluate_run
    from core.runs.jsonl import iter_records
    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory
    from tests.fixtures.lifecycle.finished_run import TINY

    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    data = tmp_path / "data.jsonl"
    with open(data, "w", encoding="utf-8") as handle:
        for i in range(40):  # answers from two words to a few dozen: batches' means weigh them unevenly
            answer = " ".join(["word"] * (2 + (i * 7) % 31)) + "."
            handle.write(json.dumps({"messages": [{"role": "user", "content": f"Question {i}?"},
                                                  {"role": "assistant", "content": answer}]}) + "\n")
    cfg = {"model": str(TINY), "dataset": str(data), "method": "lora", "lora_rank": 8, "lora_alpha": 16,
           "lora_dropout": 0.0, "precision": "fp32", "max_seq_len": 64, "micro_batch_size": 8,
           "gradient_accumulation": 1, "max_steps": 3, "learning_rate": 0.005, "warmup_steps": 0,
           "gradient_checkpointing": False, "save_steps": 3, "logging_steps": 1, "seed": 7, "eval_split": 0.35}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    out = tunedeck(home, "train", str(tmp_path / "run.yaml"))
    assert out.returncode == 0, out.stderr
    run = RunDirectory(home / "runs" / out.stdout.strip())
    deadline = time.monotonic() + 240
    while effective_status(run).status not in ("finished", "failed", "crashed", "stopped"):
        assert time.monotonic() < deadline, run.log_path.read_text()[-3000:]
        time.sleep(0.3)
    assert run.status().status == "finished", run.log_path.read_text()[-3000:]
    logged = [r for r in iter_records(run.metrics_path) if r.get("kind") == "eval"]
    assert [r["step"] for r in logged] == [3]
    result = evaluate_run(run, checkpoint=3, prompts=[])
    assert result["split"] == "held_out" and result["examples"] == 14  # two eval batches: 8 and 6
    assert logged[0]["eval_loss"] == pytest.approx(result["tuned"]["loss"], rel=1e-5), (logged, result["tuned"])


def test_evaluate_checks_the_data_before_it_loads_the_model(lora_run, tmp_path, monkeypatch):
    """evaluate loaded the model (minutes for a large one) before it read the data, so a dataset with a bad
    line failed only after the load. The data is now read and checked first: the model is never loaded
    (a load here fails the test), and the CLI says the file and line (exit 1: the data has problems, as
    `data check` and `train` say it)."""
    import shutil

    import yaml

    from core.data import DataError
    from core.lifecycle.evaluate import evaluate_run

    home, run = lora_run
    data = tmp_path / "data.jsonl"
    shutil.copy2(run.config()["dataset"], data)
    with open(data, "a", encoding="utf-8") as handle:
        handle.write('{"messages": [{"role": "user", "content": "Hi"}\n')  # line 7: cut short
    original = run.config_path.read_text()
    run.config_path.write_text(yaml.safe_dump({**run.config(), "dataset": str(data)}))
    try:
        def no_load(*_args, **_kwargs):
            raise AssertionError("the model was loaded before the data was checked")

        with monkeypatch.context() as patched:
            patched.setattr("core.lifecycle.source.load_finetuned", no_load)
            with pytest.raises(DataError) as caught:
                evaluate_run(run, prompts=[])
        assert f"{data}:7" in str(caught.value), str(caught.value)
        proc = tunedeck(home, "evaluate", run.id)
        assert proc.returncode == 1 and f"{data}:7" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    finally:
        run.config_path.write_text(original)


def _events_unwritable(monkeypatch, run) -> None:
    """The run folder takes no more lines (read-only, or a full disk under it), as a run copied off a
    finished box onto a read-only mount is; everything else (the --out folder, the data root) is writable."""
    import errno

    from core.runs.run_dir import RunDirectory

    def refuse(self, event, **data):
        raise OSError(errno.EROFS, "Read-only file system", str(self.events_path))

    monkeypatch.setattr(RunDirectory, "append_event", refuse)


def test_a_run_folder_that_takes_no_event_loses_the_record_not_the_merge_export_or_server(lora_run, tmp_path,
                                                                                      monkeypatch, caplog):
    """Merging, exporting or serving a run whose folder cannot be written did the work, then failed writing
    its event: `merge --out DIR` and `export --out DIR` wrote the model and said "cannot write
    events.jsonl ... try again" (exit 1); `serve` started the server and said so too, leaving it running (a
    second try: "already running"; the app: its error modal). The event is a record: it is warned of, the
    work stands."""
    from core.lifecycle.export import export_run
    from core.lifecycle.merge import merge_run
    from core.lifecycle.serve import health, start_server, stop_server

    _home, run = lora_run
    _events_unwritable(monkeypatch, run)
    caplog.set_level("WARNING", logger="tunedeck.runs")
    merged = merge_run(run, out=tmp_path / "merged")
    assert (merged.out / "config.json").is_file() and (merged.out / "model.safetensors").is_file()
    exported = export_run(run, "merged", out=tmp_path / "exported")
    assert (tmp_path / "exported" / "model.safetensors").is_file() and exported["reused"] is False
    try:
        state = start_server(run, timeout=120)
        assert health(state.url)
    finally:
        stop_server(run.id)
    said = [r.getMessage() for r in caplog.records if "not recorded in the run's events" in r.getMessage()]
    assert len(said) == 3 and str(run.events_path) in said[0] and "Read-only file system" in said[0], said


def test_evaluate_of_a_run_folder_it_cannot_save_into_says_so_before_loading_the_model(lora_run, monkeypatch):
    """`evaluate` of a run whose folder is read-only loaded the model, measured the loss and generated every
    prompt (minutes on a large model), then failed saving the result into RUN/eval: the work lost, and the
    app's E showed its "something went wrong" modal. The folder is tried first; the CLI says it in one line."""
    import errno

    from core.lifecycle import evaluate, source

    home, run = lora_run

    def refuse(_run):
        raise OSError(errno.EROFS, "Read-only file system", str(run.path / "eval"))

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded for an evaluation that cannot be saved")

    monkeypatch.setattr(evaluate, "eval_dir", refuse)
    monkeypatch.setattr(source, "load_finetuned", never)
    with pytest.raises(OSError) as info:
        evaluate.evaluate_run(run, prompts=["Say yes."])
    assert info.value.filename == str(run.path / "eval") and info.value.errno == errno.EROFS


def test_export_help_names_the_folder_each_format_writes_by_default(tmp_path):
    """`export --help` said "--out ... (default: RUN_DIR/merged/checkpoint-N)" for every format, while
    bnb-4bit and bnb-8bit write RUN_DIR/export/FORMAT-checkpoint-N (default_export_dir)."""
    from pathlib import Path

    from core.lifecycle.export import default_export_dir
    from core.lifecycle.merge import default_merge_dir
    from core.runs.run_dir import RunDirectory

    proc = tunedeck(tmp_path, "export", "--help", COLUMNS="400")
    assert proc.returncode == 0, proc.stderr
    out_line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("--out"))
    run = RunDirectory(Path("RUN_DIR"))
    for default in (default_merge_dir(run, "N"), default_export_dir(run, "FORMAT", "N")):
        assert str(default) in out_line, out_line


@pytest.mark.parametrize("failure", [RuntimeError("CUDA out of memory"), KeyboardInterrupt()])
def test_a_quantized_export_that_fails_or_is_interrupted_leaves_no_full_precision_staging_copy(
        lora_run, monkeypatch, failure):
    """bnb-4bit/8bit write the merged model in full precision into RUN/export/staging-checkpoint-N, then load
    it quantized. Loading it failed (out of memory) or was interrupted (Ctrl+C): the staging copy (a whole
    model, tens of GB on a real one) stayed, nothing removing it. CUDA is faked (the merge runs on the CPU,
    the quantized load fails as the GPU's would); the tiny run's files stand for the model."""
    import peft  # noqa: F401 - imported (bitsandbytes with it) before CUDA is faked: it looks for CUDA kernels
    import torch
    from transformers import AutoModelForCausalLM

    from core.lifecycle import merge
    from core.lifecycle.export import default_export_dir, export_run

    _home, run = lora_run
    real_merged, real_load = merge.merged_model, AutoModelForCausalLM.from_pretrained
    staged = []

    def quantized_load(*args, **kwargs):
        if "quantization_config" not in kwargs:
            return real_load(*args, **kwargs)
        staged.append((default_export_dir(run, "staging", 30) / "model.safetensors").is_file())
        raise failure

    real_available = torch.cuda.is_available

    def merged_on_the_cpu(source, device="cpu", progress=None):
        monkeypatch.setattr(torch.cuda, "is_available", real_available)  # CUDA faked for export's check only
        return real_merged(source, "cpu")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(merge, "merged_model", merged_on_the_cpu)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", quantized_load)
    with pytest.raises(type(failure)):
        export_run(run, "bnb-4bit")
    assert staged == [True]  # it was written, then failed to load quantized
    assert not default_export_dir(run, "staging", 30).exists()
    assert not default_export_dir(run, "bnb-4bit", 30).exists()


def test_evaluate_prints_a_reply_of_several_lines_under_its_label(monkeypatch, capsys, tmp_path):
    """A reply's second and later lines went to the left margin, where they read as the next prompt's (the
    tiny base answers with 48 newlines; a real model, a list or code): they stay under the reply's first."""
    from core import cli
    from core.lifecycle import commands, evaluate

    result = {"prompts": [{"prompt": "Three tips?", "base": "1. a\n2. b", "tuned": "- x\n- y\n- z"},
                          {"prompt": "Say yes.", "base": "Yes.", "tuned": "Yes."}]}
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    monkeypatch.setattr(commands, "_resolve", lambda ref: None)
    monkeypatch.setattr(evaluate, "evaluate_run", lambda run, checkpoint=None: result)
    monkeypatch.setattr(evaluate, "evaluation_summary", lambda result: "summary")
    assert cli.main(["evaluate", "some-run"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "summary",
        "> Three tips?", "  base:  1. a", "         2. b", "  tuned: - x", "         - y", "         - z",
        "> Say yes.", "  base:  Yes.", "  tuned: Yes.",
    ]


def test_evaluate_labels_the_replies_in_the_interfaces_language(monkeypatch, capsys, tmp_path):
    """Under zh the replies were labelled "base:" and "tuned:" in English; the labels are the catalogue's now,
    padded to one width in cells (a wide character takes two) so that a reply's lines stay under its first.
    A full fine-tune's prompt (no base) has the tuned label alone."""
    from core import cli
    from core.i18n import current_language, set_language
    from core.lifecycle import commands, evaluate

    result = {"prompts": [{"prompt": "Three tips?", "base": "1. a\n2. b", "tuned": "- x"},
                          {"prompt": "Say yes.", "base": None, "tuned": "Yes."}]}
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    monkeypatch.setattr(commands, "_resolve", lambda ref: None)
    monkeypatch.setattr(evaluate, "evaluate_run", lambda run, checkpoint=None: result)
    monkeypatch.setattr(evaluate, "evaluation_summary", lambda result: "summary")
    language = current_language()
    try:
        assert cli.main(["--lang", "zh", "evaluate", "some-run"]) == 0
    finally:
        set_language(language)  # main's --lang holds for the process: the later tests' own
    assert capsys.readouterr().err.splitlines() == [
        "summary",
        "> Three tips?", "  基座：   1. a", "           2. b", "  微调后： - x",
        "> Say yes.", "  微调后： Yes.",
    ]


def test_an_export_is_recorded_as_exported_with_its_format_written_or_reused(lora_run):
    """A fresh ``export --format merged`` recorded a "merged" event and a reused one "exported", so the events
    panel said "merged" after the app's X; and ``export --json``'s seconds were not rounded as ``merge
    --json``'s are. Now both exports are one "exported" event with the format, seconds to 3 decimals."""
    from core.lifecycle.export import export_run

    home, run = lora_run

    def new_events(before: int) -> list[dict]:
        return [json.loads(line) for line in run.events_path.read_text().splitlines()[before:]]

    before = len(run.events_path.read_text().splitlines())
    written = export_run(run, "merged", force=True)  # merged again: a fresh export, whatever was there
    assert not written["reused"] and written["seconds"] == round(written["seconds"], 3)
    [event] = new_events(before)
    assert event["event"] == "exported" and event["format"] == "merged" and event["reused"] is False
    assert event["out"] == written["out"] and event["step"] == 30
    before = len(run.events_path.read_text().splitlines())
    proc = tunedeck(home, "export", run.id, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    reused = json.loads(proc.stdout)
    assert reused["reused"] and reused["seconds"] == round(reused["seconds"], 3)
    [event] = new_events(before)
    assert event["event"] == "exported" and event["format"] == "merged" and event["reused"] is True


@pytest.mark.parametrize(("language", "said"), [("en", "checkpoint 240, held-out split: loss 1.5000"),
                                                ("zh", "检查点 240，验证集")])
def test_the_evaluation_line_says_which_checkpoint_it_measured(language, said):
    """On a run still training or stopped mid-way, evaluate measures its newest sound checkpoint at the time;
    the line the CLI and the app's E say gave the figures without it (only the saved file's name had it)."""
    from core.i18n import current_language, set_language
    from core.lifecycle.evaluate import evaluation_summary

    result = {"step": 240, "split": "held_out", "tuned": {"loss": 1.5, "perplexity": 4.48, "tokens": 90},
              "base": {"loss": 2.0, "perplexity": 7.39, "tokens": 90}, "path": "/r/eval/eval-240.json"}
    before = current_language()
    set_language(language)
    try:
        assert evaluation_summary(result).startswith(said)
        assert said.split(",")[0].split("，")[0] in evaluation_summary({**result, "base": None})
    finally:
        set_language(before)


def test_benchmarks_run_on_a_merge_of_the_checkpoint_as_it_is_now(lora_run, tmp_path, monkeypatch):
    """``evaluate --benchmarks`` took any folder at merged/checkpoint-N as the model: a checkpoint-N saved again
    since (a resume that went back and trained on) was benchmarked through the merge of the one it replaced.
    Now the run's merge is reused only when whole and newer than the checkpoint, else merged again. A stand-in
    ``lm_eval`` module (records its arguments) is the benchmark tool; CPU only."""
    import os
    import time

    from core.lifecycle.evaluate import start_benchmarks
    from core.lifecycle.merge import merge_run

    _home, run = lora_run
    tools = tmp_path / "tools"
    (tools / "lm_eval").mkdir(parents=True)
    (tools / "lm_eval" / "__init__.py").write_text("")
    argv_file = tmp_path / "argv.json"
    (tools / "lm_eval" / "__main__.py").write_text(
        f"import json, sys\nopen({str(argv_file)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    monkeypatch.syspath_prepend(str(tools))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tools), os.environ.get("PYTHONPATH", "")]))
    merged = merge_run(run).out
    first = (merged / "model.safetensors").stat().st_ino
    later = time.time() + 60  # checkpoint-30 saved again after the merge
    for path in (run.path / "checkpoints" / "checkpoint-30").rglob("*"):
        os.utime(path, (later, later))
    bench = start_benchmarks(run, ["gsm8k"])
    os.waitpid(bench["pid"], 0)
    assert (merged / "model.safetensors").stat().st_ino != first  # merged again, not the stale folder
    assert f"pretrained={merged}" in json.loads(argv_file.read_text())


def test_a_second_quantized_export_of_the_checkpoint_is_refused_while_the_first_stages_it(lora_run, monkeypatch):
    """bnb-4bit and bnb-8bit exports of one checkpoint both staged the full-precision merge in
    RUN/export/staging-checkpoint-N, unlocked: the second rewrote (and at its end deleted) the folder the
    first was quantizing. Now the second is refused at once, saying another export is running, and the
    first's staging copy is left alone. CUDA is faked (the merge runs on the CPU); the first export is held
    in its quantized load by a gate, a real second export_run runs meanwhile."""
    import threading

    import peft  # noqa: F401 - imported (bitsandbytes with it) before CUDA is faked: it looks for CUDA kernels
    import torch
    from transformers import AutoModelForCausalLM

    from core.lifecycle import merge
    from core.lifecycle.export import default_export_dir, export_run
    from core.lifecycle.source import LifecycleError

    _home, run = lora_run
    staging = default_export_dir(run, "staging", 30)
    real_merged, real_available = merge.merged_model, torch.cuda.is_available
    inside, gate, ended = threading.Event(), threading.Event(), []

    def quantized_load(*args, **kwargs):
        inside.set()
        assert gate.wait(120)
        raise RuntimeError("CUDA out of memory")  # the first export ends here, once the second was tried

    def merged_on_the_cpu(source, device="cpu", progress=None):
        monkeypatch.setattr(torch.cuda, "is_available", real_available)  # CUDA faked for export's check only
        return real_merged(source, "cpu")

    def first() -> None:
        try:
            export_run(run, "bnb-4bit")
        except RuntimeError as exc:
            ended.append(str(exc))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(merge, "merged_model", merged_on_the_cpu)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", quantized_load)
    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(180)  # the first has staged the merge and is quantizing it
        staged = {p.name: p.stat().st_mtime_ns for p in staging.iterdir()}
        assert "model.safetensors" in staged
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        with pytest.raises(LifecycleError, match="another quantized export") as info:
            export_run(run, "bnb-8bit")
        assert str(staging) in str(info.value) and run.id in str(info.value)
        assert {p.name: p.stat().st_mtime_ns for p in staging.iterdir()} == staged  # untouched
        assert not default_export_dir(run, "bnb-8bit", 30).exists()
    finally:
        gate.set()
        thread.join(120)
    assert ended == ["CUDA out of memory"] and not staging.exists()
    assert not staging.with_name(staging.name + ".lock").exists()


def test_evaluate_with_every_record_left_out_says_why_in_the_users_language(lora_run):
    """Reachable: the run's data as it is now (or its config) leaves every record out once tokenized (here
    overlong: drop with max_seq_len 4). It said "RUN: no examples to evaluate on" in English alone, neither
    why nor what to do; now in words of the interface's language, with the data check that shows it."""
    import yaml

    home, run = lora_run
    run.config_path.write_text(yaml.safe_dump({**run.config(), "overlong": "drop", "max_seq_len": 4}))
    dataset = run.config()["dataset"]
    proc = tunedeck(home, "evaluate", run.id)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "max_seq_len 4 with overlong: drop" in proc.stderr, proc.stderr[-2000:]
    assert f"tunedeck data check {dataset} " in proc.stderr and "--max-seq-len 4 --overlong drop" in proc.stderr
    proc = tunedeck(home, "--lang", "zh", "evaluate", run.id)
    assert proc.returncode == 1 and "没有可用于评估的样本" in proc.stderr, proc.stderr[-2000:]
    assert "no examples" not in proc.stderr


def test_a_qlora_export_says_it_is_the_unquantised_base_plus_the_adapter_as_its_merge_does(lora_run, tmp_path):
    """``tunedeck merge`` of a QLoRA run says the adapter went into the unquantised base; ``tunedeck export``
    (the same merge, or a quantized copy of it) said nothing of it. Now it says it as the merge does (stderr,
    --json or not, written or reused); a LoRA export says nothing of the kind. CPU only: the tiny run's
    adapter stands for a QLoRA one (an export never loads the 4-bit base)."""
    import yaml

    home, run = lora_run
    proc = tunedeck(home, "export", run.id, "--out", str(tmp_path / "lora"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "QLoRA" not in proc.stderr and "4-bit" not in proc.stderr
    cfg = yaml.safe_load(run.config_path.read_text(encoding="utf-8"))
    run.config_path.write_text(yaml.safe_dump({**cfg, "method": "qlora"}), encoding="utf-8")
    for args in (("--json",), ()):  # written, then reused as it is
        proc = tunedeck(home, "export", run.id, *args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        note = [line for line in proc.stderr.splitlines() if line.startswith("QLoRA:")]
        assert len(note) == 1, proc.stderr[-2000:]
        assert "merged into the base in float32" in note[0] and "4-bit (NF4)" in note[0], note[0]
        assert "QLoRA" not in proc.stdout
    assert json.loads(tunedeck(home, "export", run.id, "--json").stdout)["method"] == "qlora"


def test_an_export_into_a_folder_another_export_writes_is_refused_in_an_exports_words(lora_run, tmp_path):
    """Two exports into one --out: the second was refused as "a merge into OUT is already running", a merge the
    user never started. Now it says another export (or a merge) writes there, in the CLI's words (--out) and
    the app's (X again). The first export's lock is held here by the real lock a merge or export takes."""
    from core.lifecycle.export import export_run
    from core.lifecycle.merge import merge_lock
    from core.lifecycle.source import LifecycleError
    from tui.widgets.lifecycle_panels import tui_words

    home, run = lora_run
    out = tmp_path / "exported"
    with merge_lock(out):
        proc = tunedeck(home, "export", run.id, "--out", str(out))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert f"another export or a merge into {out} is already running" in proc.stderr, proc.stderr[-2000:]
        assert "choose another folder with --out" in proc.stderr
        with pytest.raises(LifecycleError) as info:
            export_run(run, "merged", out=out)
        words = tui_words(info.value, "X")
        assert words.startswith(f"another export or a merge into {out}") and "press X again" in words, words
        assert "--out" not in words
    assert not out.exists()


def test_an_unknown_export_format_is_refused_in_the_interfaces_language(lora_run):
    """argparse refuses ``--format gguf`` in the CLI, but the app or a caller of ``export_run`` reached an
    English-only refusal under zh. Now it is the interface's language, a request that cannot be (exit 2)."""
    from core.i18n import current_language, set_language
    from core.lifecycle.export import export_run
    from core.lifecycle.source import LifecycleError

    _home, run = lora_run
    before = current_language()
    try:
        for language, said in (("en", 'unknown export format "gguf"; use one of merged, bnb-4bit, bnb-8bit'),
                               ("zh", "未知的导出格式“gguf”")):
            set_language(language)
            with pytest.raises(LifecycleError) as info:
                export_run(run, "gguf")
            assert said in str(info.value) and info.value.exit_code == 2, str(info.value)
    finally:
        set_language(before)
    assert not (run.path / "export").exists()


def test_two_evaluations_of_one_checkpoint_in_one_second_keep_both_results(lora_run, monkeypatch):
    """Results are named eval-<step>-<time to the second>.json: a second evaluation of the same checkpoint ending
    in the same second (the app's E and the CLI's) replaced the first's file. The clock is held at one second
    (``time.strftime`` as the module reads it); both files are kept, each whole. No GPU: the tiny LoRA run."""
    from core.lifecycle import evaluate

    _home, run = lora_run
    monkeypatch.setattr(evaluate.time, "strftime", lambda _format, *_rest: "20261207-170000")
    first = evaluate.evaluate_run(run, prompts=[])
    second = evaluate.evaluate_run(run, prompts=["Say yes."])
    assert first["path"] != second["path"]
    assert json.loads(open(first["path"], encoding="utf-8").read())["prompts"] == []
    assert [answer["prompt"] for answer in json.loads(open(second["path"], encoding="utf-8").read())["prompts"]] \
        == ["Say yes."]
