"""Other trainers' folders in their writers' exact layouts: HF Trainer checkpoints, TensorBoard event files,
LLaMA-Factory ≤ 0.7 logs, Megatron-SWIFT logs, ms-swift 4 args; and whether their writer is still there.

Every folder is written here in the shape its writer leaves it (key names and layouts read from
transformers' TrainerState.save_to_json, LLaMA-Factory's LogCallback, ms-swift's and Megatron-SWIFT's
logging callbacks); old writes are os.utime'd into the past, nothing sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.watch.activity import FINISHED, IDLE, IDLE_FLOOR_S, RUNNING, WriterActivity, writer_state
from core.watch.adapters import normalize_llamafactory, normalize_swift, parse_lines
from core.watch.feed import METRICS_TAIL_BYTES, MetricsFeed, open_metrics_feed
from core.watch.series import RunSeries
from core.watch.source import HF_TRAINER, LLAMAFACTORY, SWIFT, TENSORBOARD, SourceNotFound, open_watch_source

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "watch"
MONTHS_AGO = time.time() - 90 * 86400


def age(folder: Path, when: float = MONTHS_AGO) -> None:
    """Every file under ``folder`` last written at ``when``."""
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (when, when))


# --- HF Trainer -------------------------------------------------------------------------------------

def hf_history(last_step: int, max_steps: int, eval_every: int = 20) -> list[dict]:
    history: list[dict] = []
    for step in range(1, last_step + 1):
        history.append({"epoch": round(step / 20, 4), "grad_norm": 1.5 - step / 100,
                        "learning_rate": 5e-05 * (1 - step / max_steps), "loss": round(2.5 - step / 40, 4),
                        "step": step})
        if step % eval_every == 0:
            history.append({"epoch": round(step / 20, 4), "eval_loss": round(2.4 - step / 40, 4),
                            "eval_runtime": 1.23, "eval_samples_per_second": 40.6,
                            "eval_steps_per_second": 5.07, "step": step})
    return history


def hf_state(global_step: int, max_steps: int, summary: bool = False) -> dict:
    """A trainer_state.json as transformers' TrainerState.save_to_json writes it (sorted keys, indent 2)."""
    history = hf_history(global_step, max_steps)
    if summary:
        history.append({"epoch": round(global_step / 20, 4), "step": global_step, "total_flos": 1.2e15,
                        "train_loss": 1.9, "train_runtime": 321.5, "train_samples_per_second": 9.95,
                        "train_steps_per_second": 0.124})
    return {"best_global_step": None, "best_metric": None, "best_model_checkpoint": None,
            "epoch": round(global_step / 20, 4), "eval_steps": 20, "global_step": global_step,
            "is_hyper_param_search": False, "is_local_process_zero": True, "is_world_process_zero": True,
            "log_history": history, "logging_steps": 1, "max_steps": max_steps, "num_input_tokens_seen": 0,
            "num_train_epochs": 2, "save_steps": 10,
            "stateful_callbacks": {"TrainerControl": {"args": {"should_epoch_stop": False,
                                                               "should_evaluate": False, "should_log": False,
                                                               "should_save": True,
                                                               "should_training_stop": global_step >= max_steps},
                                                      "attributes": {}}},
            "total_flos": 1.2e15, "train_batch_size": 8, "trial_name": None, "trial_params": None}


def write_checkpoint(out: Path, step: int, max_steps: int, when: float | None = None) -> Path:
    folder = out / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(json.dumps(hf_state(step, max_steps), indent=2, sort_keys=True) + "\n")
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-0.5B",
                                                            "peft_type": "LORA", "r": 8}, indent=2))
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
        (folder / name).write_bytes(b"\0")
    if when is not None:
        age(folder, when)
    return folder


def test_hf_trainer_folder_reads_the_newest_checkpoint(tmp_path):
    out = tmp_path / "hf_out"
    now = time.time()
    write_checkpoint(out, 10, 40, now - 60)
    write_checkpoint(out, 20, 40, now - 30)
    write_checkpoint(out, 9, 40, now - 90)  # checkpoint-9 sorts after checkpoint-20 as text: by step
    (out / "runs" / "Nov29_21-00-00_box").mkdir(parents=True)
    source = open_watch_source(out)
    assert source.kind == HF_TRAINER and source.read_only
    assert source.metrics_path == out / "checkpoint-20" / "trainer_state.json"
    assert source.facts == {"model": "Qwen/Qwen2.5-0.5B", "method": "lora"}
    feed = open_metrics_feed(source)
    records = feed.read_tail()
    trains = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in trains] == list(range(1, 21))
    assert trains[-1] == {"kind": "train", "loss": 2.0, "learning_rate": pytest.approx(2.5e-05),
                          "grad_norm": pytest.approx(1.3), "step": 20, "epoch": 1.0, "total_steps": 40}
    assert [(r["step"], r["eval_loss"]) for r in records if r["kind"] == "eval"] == [(20, 1.9)]
    assert feed.backfill() is None and feed.poll() == ([], False)
    series = RunSeries()
    series.extend(records)
    assert series.latest["step"] == 20 and series.latest["total_steps"] == 40 and series.nan_count == 0

    write_checkpoint(out, 30, 40)  # the trainer saves again: only what is new is handed on
    records, restarted = feed.poll()
    assert not restarted and [r["step"] for r in records if r["kind"] == "train"] == list(range(21, 31))
    assert writer_state(source, feed.activity).status == RUNNING

    # train() ends: save_state() writes the top-level state with the summary entry
    (out / "trainer_state.json").write_text(json.dumps(hf_state(40, 40, summary=True), indent=2, sort_keys=True))
    records, restarted = feed.poll()
    assert not restarted and records[-1] == {"kind": "end"} and records[-2]["step"] == 40
    assert writer_state(source, feed.activity).status == FINISHED


def test_hf_trainer_top_level_state_alone_and_a_new_run_restarts(tmp_path):
    out = tmp_path / "hf_out"
    out.mkdir()
    (out / "trainer_state.json").write_text(json.dumps(hf_state(40, 40, summary=True), indent=2, sort_keys=True))
    source = open_watch_source(out)
    assert source.kind == HF_TRAINER and source.metrics_path == out / "trainer_state.json"
    feed = open_metrics_feed(source)
    assert len([r for r in feed.read_tail() if r["kind"] == "train"]) == 40
    assert writer_state(source, feed.activity).status == FINISHED  # global_step == max_steps
    (out / "trainer_state.json").write_text(json.dumps(hf_state(5, 80), indent=2, sort_keys=True))
    records, restarted = feed.poll()  # not an extension of what was read: another run
    assert restarted and [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 5]


def test_hf_trainer_folder_left_months_ago_is_idle(tmp_path):
    out = tmp_path / "hf_out"
    write_checkpoint(out, 10, 40, MONTHS_AGO - 600)
    write_checkpoint(out, 20, 40, MONTHS_AGO)
    source = open_watch_source(out)
    feed = open_metrics_feed(source)
    feed.read_tail()
    state = writer_state(source, feed.activity)
    assert state.status == IDLE and state.since == pytest.approx(MONTHS_AGO, abs=1)
    assert state.label().startswith("idle since ") and time.strftime("%Y-%m-%d", time.localtime(MONTHS_AGO)) in state.label()
    # the gap between saves sets the patience: a writer that saves every 10 min is not gone after 5
    assert feed.activity.median_interval == pytest.approx(600, abs=1)
    assert writer_state(source, feed.activity, now=MONTHS_AGO + 300).status == RUNNING
    assert writer_state(source, feed.activity, now=MONTHS_AGO + 10 * 600 + 1).status == IDLE


def test_hf_trainer_run_again_into_a_used_output_folder_shows_the_new_run(tmp_path):
    """A run started again into the output folder of a finished one: the previous run's checkpoint-1000
    hid the new run's checkpoint-50 (the highest step was taken), and its train_results.json read
    "finished" over the new run's live steps; the new run is shown, running, with its own save interval."""
    out = tmp_path / "hf_out"
    write_checkpoint(out, 500, 1000, MONTHS_AGO - 3600)
    write_checkpoint(out, 1000, 1000, MONTHS_AGO)
    for name in ("train_results.json", "all_results.json"):
        (out / name).write_text(json.dumps({"epoch": 3.0, "train_loss": 1.2, "train_runtime": 7200.0}))
        os.utime(out / name, (MONTHS_AGO + 1, MONTHS_AGO + 1))
    assert state_of(out).status == FINISHED
    now = time.time()
    write_checkpoint(out, 25, 200, now - 600)  # the new run saves every 10 min
    write_checkpoint(out, 50, 200, now - 5)
    source = open_watch_source(out)
    assert source.metrics_path == out / "checkpoint-50" / "trainer_state.json"
    feed = open_metrics_feed(source)
    records = feed.read_tail()
    assert max(r["step"] for r in records if r["kind"] == "train") == 50
    assert records[-1]["total_steps"] == 200
    assert feed.activity.median_interval == pytest.approx(595, abs=1)  # not the months since the old run
    assert writer_state(source, feed.activity).status == RUNNING
    write_checkpoint(out, 200, 200)  # it ends: its own results
    feed.poll()
    for name in ("train_results.json", "all_results.json"):
        (out / name).write_text(json.dumps({"epoch": 1.0, "train_loss": 1.0, "train_runtime": 2400.0}))
    assert writer_state(source, feed.activity).status == FINISHED


def hf_events(folder: Path, created: float, text: bool, scalars: dict[str, float]) -> Path:
    """An event file as HF's TensorBoardCallback leaves it (through torch's SummaryWriter), named as created
    at ``created``: the arguments as text at on_train_begin (``text``), then one logging step's scalars."""
    summary_writer = pytest.importorskip("torch.utils.tensorboard", reason="torch is not installed")
    pytest.importorskip("tensorboard", reason="tensorboard is not installed: .venv/bin/pip install tensorboard")
    writer = summary_writer.SummaryWriter(log_dir=str(folder))
    if text:
        writer.add_text("args", json.dumps({"output_dir": "hf_out", "logging_steps": 50}))
    for tag, value in scalars.items():
        writer.add_scalar(tag, value, 1000)
    writer.close()
    (written,) = folder.glob("events.out.tfevents.*")
    _prefix, _sep, rest = written.name.partition("events.out.tfevents.")
    named = folder / f"events.out.tfevents.{int(created)}.{rest.partition('.')[2]}"
    written.rename(named)
    os.utime(named, (created, created))
    return named


def test_hf_trainer_run_again_into_a_finished_folder_is_running_before_its_first_checkpoint(tmp_path):
    """A run started again into the output folder of a finished one writes nothing there before its first
    checkpoint but its TensorBoard event file: the previous run's trainer_state.json (step 1000 of 1000) and
    results read "finished" (no ETA) until then, minutes or hours. An evaluate() after train() opens an event
    file of its own too, with eval scalars only: that run still reads finished."""
    out = tmp_path / "hf_out"
    write_checkpoint(out, 500, 1000, MONTHS_AGO - 3600)
    write_checkpoint(out, 1000, 1000, MONTHS_AGO)
    hf_events(out / "runs" / "Sep08_10-00-00_box", MONTHS_AGO - 7200, text=True, scalars={"train/loss": 1.2})
    (out / "trainer_state.json").write_text(json.dumps(hf_state(1000, 1000, summary=True), indent=2, sort_keys=True))
    for name in ("train_results.json", "all_results.json", "trainer_state.json"):
        if name != "trainer_state.json":
            (out / name).write_text(json.dumps({"epoch": 3.0, "train_loss": 1.2, "train_runtime": 7200.0}))
        os.utime(out / name, (MONTHS_AGO + 1, MONTHS_AGO + 1))
    hf_events(out / "runs" / "Sep08_12-00-05_box", MONTHS_AGO + 5, text=False, scalars={"eval/loss": 1.3})
    assert state_of(out).status == FINISHED
    now = time.time()
    hf_events(out / "runs" / "Dec07_16-00-00_box", now - 2, text=True, scalars={})  # started again
    source = open_watch_source(out)
    feed = open_metrics_feed(source)
    # the previous run's history is not this run's: no figures (they read step 1000 of 1000) until its first save
    assert feed.read_tail() == [] and feed.activity.last_step is None
    assert writer_state(source, feed.activity).status == RUNNING
    write_checkpoint(out, 50, 1000)  # its first save: the same as ever
    records, _restarted = feed.poll()
    assert max(r["step"] for r in records if r["kind"] == "train") == 50
    assert writer_state(source, feed.activity).status == RUNNING


def test_hf_trainer_run_started_again_while_watched_drops_the_previous_runs_figures(tmp_path):
    """A dashboard on a finished HF Trainer folder when a run is started again there: the new run's event file
    (on_train_begin) makes what was read the previous run's, dropped once (restarted), not kept as the new
    run's figures until its first checkpoint."""
    out = tmp_path / "hf_out"
    write_checkpoint(out, 1000, 1000, MONTHS_AGO)
    hf_events(out / "runs" / "Sep08_10-00-00_box", MONTHS_AGO - 7200, text=True, scalars={"train/loss": 1.2})
    source = open_watch_source(out)
    feed = open_metrics_feed(source)
    assert max(r["step"] for r in feed.read_tail() if r["kind"] == "train") == 1000
    assert feed.poll() == ([], False)
    hf_events(out / "runs" / "Dec07_16-00-00_box", time.time() - 2, text=True, scalars={})  # started again
    assert feed.poll() == ([], True)  # what was read is dropped, once
    assert feed.poll() == ([], False) and feed.activity.last_step is None
    write_checkpoint(out, 50, 1000)
    records, _restarted = feed.poll()
    assert max(r["step"] for r in records if r["kind"] == "train") == 50


def test_hf_trainer_run_resumed_into_its_folder_keeps_its_history_before_its_next_checkpoint(tmp_path):
    """A crashed HF Trainer run resumed from its checkpoint (HF's example scripts resume from the newest one
    in a used output folder unless told to overwrite it) opens a new event file: checkpoint-500's
    trainer_state.json (step 500 of 1000) is older, but its history is this run's, up to the checkpoint it
    resumes from. It stays shown until the next save, as before the resume; only a state at its total (a
    finished run, nothing to resume) is an earlier run's."""
    out = tmp_path / "hf_out"
    write_checkpoint(out, 500, 1000, time.time() - 7200)
    hf_events(out / "runs" / "Dec07_14-00-00_box", time.time() - 7300, text=True, scalars={"train/loss": 1.2})
    source = open_watch_source(out)
    feed = open_metrics_feed(source)
    assert max(r["step"] for r in feed.read_tail() if r["kind"] == "train") == 500
    hf_events(out / "runs" / "Dec07_16-00-00_box", time.time() - 2, text=True, scalars={})  # resumed
    assert feed.poll() == ([], False)  # nothing dropped
    assert feed.activity.last_step == 500
    fresh = open_metrics_feed(open_watch_source(out))  # a watch started after the resume
    assert max(r["step"] for r in fresh.read_tail() if r["kind"] == "train") == 500
    assert writer_state(source, fresh.activity).status == RUNNING


def test_hf_trainer_run_started_again_after_an_early_stop_drops_the_previous_runs_end(tmp_path):
    """A run that ended before its total (early stopping) left its summary trainer_state.json at the top, which
    save_state writes only as train() ends and a resume never reads (it reads a checkpoint's): a run started
    again there is not that run, its figures (step 600 of 1000, its loss) not shown as the new run's."""
    out = tmp_path / "hf_out"
    write_checkpoint(out, 600, 1000)
    (out / "trainer_state.json").write_text(json.dumps(hf_state(600, 1000, summary=True)))
    age(out, MONTHS_AGO)
    age(out / "checkpoint-600", MONTHS_AGO - 60)
    hf_events(out / "runs" / "Sep08_10-00-00_box", MONTHS_AGO - 7200, text=True, scalars={"train/loss": 1.2})
    hf_events(out / "runs" / "Dec07_16-00-00_box", time.time() - 2, text=True, scalars={})  # started again
    feed = open_metrics_feed(open_watch_source(out))
    assert feed.read_tail() == [] and feed.activity.last_step is None


# --- TensorBoard ------------------------------------------------------------------------------------

def tb_writer(folder: Path):
    """tensorboard's own event-file writer (torch's SummaryWriter writes through it)."""
    event_file_writer = pytest.importorskip(
        "tensorboard.summary.writer.event_file_writer",
        reason="tensorboard is not installed: .venv/bin/pip install tensorboard (install.sh does)")
    return event_file_writer.EventFileWriter(str(folder))


def add_scalars(writer, step: int, wall: float, values: dict[str, float]) -> None:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()])
    writer.add_event(Event(wall_time=wall, step=step, summary=summary))


def hf_tb_step(step: int) -> dict[str, float]:
    """What HF Trainer's TensorBoardCallback logs each logging step (logs keys under "train/")."""
    return {"train/loss": 2.5 - step / 40, "train/grad_norm": 1.2, "train/learning_rate": 5e-05 * (1 - step / 40),
            "train/epoch": step / 20}


def test_tensorboard_log_dir_through_event_accumulator(tmp_path):
    out = tmp_path / "tb_out"
    run_dir = out / "runs" / "Nov29_21-00-00_box"
    writer = tb_writer(run_dir)
    start = time.time() - 100
    for step in range(1, 11):
        add_scalars(writer, step, start + 5 * step, hf_tb_step(step))
    add_scalars(writer, 10, start + 51, {"eval/loss": 2.3, "eval/runtime": 1.2, "train/epoch": 0.5})
    writer.flush()
    source = open_watch_source(out)
    assert source.kind == TENSORBOARD and source.metrics_path == run_dir and source.read_only
    feed = open_metrics_feed(source)
    records = feed.read_tail()
    trains = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in trains] == list(range(1, 11))
    assert trains[0]["loss"] == pytest.approx(2.475) and trains[0]["learning_rate"] == pytest.approx(4.875e-05)
    assert trains[0]["grad_norm"] == pytest.approx(1.2) and trains[0]["epoch"] == pytest.approx(0.05)
    assert trains[0]["elapsed_s"] == 0 and trains[-1]["elapsed_s"] == pytest.approx(45)
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(evals) == 1 and evals[0]["step"] == 10 and evals[0]["eval_loss"] == pytest.approx(2.3)
    assert writer_state(source, feed.activity).status == RUNNING
    assert feed.poll() == ([], False)  # nothing written since: nothing read

    for step in range(11, 14):  # the writer goes on: the next poll hands on only the new steps
        add_scalars(writer, step, start + 5 * step, hf_tb_step(step))
    writer.flush()
    records, restarted = feed.poll()
    assert not restarted and [r["step"] for r in records] == [11, 12, 13]

    # the end of train(): HF logs its summary as train/train_runtime, train/train_loss …
    add_scalars(writer, 13, start + 70, {"train/train_runtime": 70.0, "train/train_loss": 2.2})
    writer.close()
    records, _restarted = feed.poll()
    assert records == [{"kind": "end"}] and writer_state(source, feed.activity).status == FINISHED


def test_tensorboard_folder_without_new_events_is_idle(tmp_path):
    out = tmp_path / "logs_out"
    writer = tb_writer(out / "logs")
    for step in range(1, 6):
        add_scalars(writer, step, MONTHS_AGO - 50 + 10 * step, {"loss": 3.0 - step / 10, "lr": 1e-4})
    writer.close()
    age(out)
    source = open_watch_source(out)
    assert source.kind == TENSORBOARD and source.metrics_path == out / "logs"
    feed = open_metrics_feed(source)
    records = feed.read_tail()
    assert [r["loss"] for r in records] == pytest.approx([2.9, 2.8, 2.7, 2.6, 2.5])
    assert records[0]["learning_rate"] == pytest.approx(1e-4)
    state = writer_state(source, feed.activity)
    assert state.status == IDLE and state.since == pytest.approx(MONTHS_AGO, abs=1)


def test_tensorboard_written_by_torch_summary_writer(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed: .venv/bin/pip install tensorboard")
    summary_writer = pytest.importorskip("torch.utils.tensorboard", reason="torch is not installed")
    out = tmp_path / "out"
    writer = summary_writer.SummaryWriter(log_dir=str(out / "runs" / "Nov29_21-00-00_box"))
    for step in range(1, 4):
        writer.add_scalar("train/loss", 2.0 / step, step)
        writer.add_scalar("train/learning_rate", 1e-5, step)
    writer.close()
    feed = open_metrics_feed(open_watch_source(out))
    assert [(r["step"], round(r["loss"], 3)) for r in feed.read_tail()] == [(1, 2.0), (2, 1.0), (3, 0.667)]


def test_tensorboard_missing_says_how_to_install_it(tmp_path, monkeypatch):
    import core.watch.source as source_module

    run_dir = tmp_path / "runs" / "x"
    run_dir.mkdir(parents=True)
    (run_dir / "events.out.tfevents.1764450000.box.1.0").write_bytes(b"")
    monkeypatch.setattr(source_module, "tensorboard_available", lambda: False)
    with pytest.raises(SourceNotFound, match=r"install tensorboard to read event files: \.venv/bin/pip install tensorboard"):
        open_watch_source(tmp_path)


def test_nothing_readable_names_every_layout(tmp_path):
    with pytest.raises(SourceNotFound, match=r"trainer_state\.json.*events\.out\.tfevents"):
        open_watch_source(tmp_path)


# --- LLaMA-Factory of every version -----------------------------------------------------------------

def lf_old_lines(total: int = 20) -> list[dict]:
    """LLaMA-Factory ≤ 0.7's LogCallback: every key on every line, the unset ones null."""
    lines = []
    for step in range(5, total + 1, 5):
        base = {"current_steps": step, "total_steps": total, "epoch": step / 10,
                "percentage": round(100 * step / total, 2), "elapsed_time": f"0:00:{2 * step:02d}",
                "remaining_time": f"0:00:{2 * (total - step):02d}"}
        lines.append({"current_steps": step, "total_steps": total, "loss": round(2.0 - step / 20, 4),
                      "eval_loss": None, "predict_loss": None, "reward": None, "accuracy": None,
                      "learning_rate": 5e-05 * (1 - step / total), **{k: v for k, v in base.items()
                                                                      if k not in ("current_steps", "total_steps")}})
        if step % 10 == 0:
            lines.append({**base, "loss": None, "eval_loss": round(2.1 - step / 20, 4), "predict_loss": None,
                          "reward": None, "accuracy": None, "learning_rate": None})
    return lines


def test_llamafactory_07_null_eval_loss_does_not_hide_the_loss(tmp_path):
    out = tmp_path / "saves" / "llama3-8b" / "lora" / "sft"
    out.mkdir(parents=True)
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lf_old_lines()))
    first = normalize_llamafactory(lf_old_lines()[0])
    assert first["kind"] == "train" and first["loss"] == 1.75 and first["learning_rate"] == pytest.approx(3.75e-05)
    assert first["step"] == 5 and first["total_steps"] == 20 and first["elapsed_s"] == 10 and first["eta_s"] == 30
    source = open_watch_source(out)
    assert source.kind == LLAMAFACTORY
    records = MetricsFeed(source.metrics_path, source.kind).read_tail()
    assert [r["kind"] for r in records] == ["train", "train", "eval", "train", "train", "eval"]
    series = RunSeries()
    series.extend(records)
    assert series.series("loss").points == 4 and series.nan_count == 0 and series.last_loss == 1.0
    assert series.series("eval_loss").points == 2
    # a line with neither (a predict line of those versions) is no record; a NaN loss is still one
    assert normalize_llamafactory({"current_steps": 5, "loss": None, "eval_loss": None}) is None
    assert normalize_llamafactory({"current_steps": 5, "loss": float("nan"), "eval_loss": None})["kind"] == "train"


def test_current_llamafactory_still_reads():
    lines = (FIXTURES / "llamafactory_output" / "trainer_log.jsonl").read_bytes().splitlines()
    records = parse_lines(lines, "llamafactory")
    assert sum(r["kind"] == "train" for r in records) == 20 and sum(r["kind"] == "eval" for r in records) == 2


# --- ms-swift: Megatron-SWIFT and ms-swift 4 --------------------------------------------------------

def megatron_lines(last: int, total: int = 176) -> list[dict]:
    """Megatron-SWIFT's PrintCallback: the trainer's logs plus "iteration": "N/total" and friends."""
    lines = []
    for step in range(5, last + 1, 5):
        lines.append({"loss": round(2.2 - step / 200, 4), "grad_norm": 0.93, "learning_rate": 9.8e-05,
                      "consumed_samples": step * 16, "global_batch_size": 16,
                      "iteration": f"{step}/{total}", "elapsed_time": f"{step * 3}s",
                      "remaining_time": f"{(total - step) * 3 // 60}m {(total - step) * 3 % 60}s",
                      "memory(GiB)": 35.66, "train_speed(s/it)": 3.0})
    return lines


def test_megatron_swift_iteration_gives_the_step(tmp_path):
    record = normalize_swift(megatron_lines(5)[0])
    assert record["step"] == 5 and record["total_steps"] == 176 and record["loss"] == 2.175
    assert record["steps_per_s"] == pytest.approx(1 / 3) and record["elapsed_s"] == 15 and record["eta_s"] == 513
    out = tmp_path / "megatron_output" / "Qwen2.5-7B"
    run = out / "v0-20261129-210000"
    run.mkdir(parents=True)
    (run / "args.json").write_text(json.dumps({"model": "Qwen/Qwen2.5-7B-Instruct", "train_type": "lora",
                                               "torch_dtype": "bfloat16", "micro_batch_size": 1}, indent=2))
    (run / "logging.jsonl").write_text("".join(json.dumps(line) + "\n" for line in megatron_lines(50)))
    source = open_watch_source(out)
    assert source.kind == SWIFT and source.path == run and source.facts["method"] == "lora"
    records = MetricsFeed(source.metrics_path, source.kind).read_tail()
    assert records[-1]["step"] == 50 and records[-1]["total_steps"] == 176


def test_ms_swift_4_tuner_type_names_the_method(tmp_path):
    run = tmp_path / "output" / "v0-20261129-210000"
    shutil.copytree(FIXTURES / "swift_output" / "v0-20261129-210000", run)
    args = json.loads((run / "args.json").read_text())
    args.pop("train_type")
    args["tuner_type"] = "lora"
    (run / "args.json").write_text(json.dumps(args, indent=2))
    assert open_watch_source(tmp_path / "output").facts["method"] == "lora"


def test_ms_swift_2_global_step_gives_the_step(tmp_path):
    """ms-swift ≤ 2.2.1 (and 2.x's printer callback, under disable_tqdm) logged a bare "global_step", 2.2.2
    "steps[global_step/max_steps]": neither was read, so the header said "step –, waiting for the first
    metrics" beside a drawn loss chart, and the charts counted records (1, 2, 3) instead of steps (1, 5, 10)."""
    line = {"loss": 1.8210969, "acc": 0.6236614, "grad_norm": 2.75, "learning_rate": 2e-05, "memory(GiB)": 16.79,
            "train_speed(iter/s)": 0.155172, "epoch": 0.01, "global_step": 1}
    assert normalize_swift(line)["step"] == 1
    v222 = {k: v for k, v in line.items() if k != "global_step"} | {"steps[global_step/max_steps]": "5/100"}
    assert (normalize_swift(v222)["step"], normalize_swift(v222)["total_steps"]) == (5, 100)
    run = tmp_path / "output" / "qwen2-7b-instruct" / "v2-20240607-101038"
    run.mkdir(parents=True)
    (run / "logging.jsonl").write_text("".join(json.dumps({**line, "epoch": step / 100, "global_step": step}) + "\n"
                                               for step in (1, 5, 10, 15)))
    source = open_watch_source(run.parent)
    series = RunSeries()
    series.extend(MetricsFeed(source.metrics_path, source.kind).read_tail())
    assert series.latest["step"] == 15 and series.series("loss").x_range() == (1.0, 15.0)


def test_ms_swift_2_sft_args_name_the_model_method_and_precision(tmp_path):
    """ms-swift 1.x/2.x saved its arguments as sft_args.json (sft_type, dtype): only args.json was read, so
    the header of such a folder named no model, method or precision."""
    run = tmp_path / "output" / "v2-20240607-101038"
    run.mkdir(parents=True)
    (run / "logging.jsonl").write_text(json.dumps({"loss": 1.8, "global_step": 1}) + "\n")
    (run / "sft_args.json").write_text(json.dumps({"model_type": "qwen2-7b-instruct", "model_id_or_path":
                                                   "Qwen/Qwen2-7B-Instruct", "sft_type": "lora", "dtype": "bf16"}))
    assert open_watch_source(run.parent).facts == {"model": "Qwen/Qwen2-7B-Instruct", "method": "lora",
                                                   "precision": "bf16"}
    (run / "sft_args.json").write_text(json.dumps({"model_type": "qwen2-7b-instruct", "sft_type": "full",
                                                   "dtype": "AUTO"}))
    assert open_watch_source(run.parent).facts == {"model": "qwen2-7b-instruct", "method": "full"}


# --- writer gone: idle since, finished --------------------------------------------------------------

def copy_swift(tmp_path: Path, keep_lines: int | None = None, extra: list[dict] | None = None) -> Path:
    run = tmp_path / "output" / "v0-20261129-210000"
    shutil.copytree(FIXTURES / "swift_output" / "v0-20261129-210000", run)
    lines = (run / "logging.jsonl").read_text().splitlines(keepends=True)
    if keep_lines is not None:
        lines = lines[:keep_lines]
    lines += [json.dumps(line) + "\n" for line in extra or []]
    (run / "logging.jsonl").write_text("".join(lines))
    return run


def state_of(path: Path, now: float | None = None):
    source = open_watch_source(path)
    feed = open_metrics_feed(source)
    feed.read_tail()
    return writer_state(source, feed.activity, now=now)


def test_swift_summary_line_means_finished(tmp_path):
    assert state_of(copy_swift(tmp_path)).status == FINISHED  # the summary line after step 100/100


def test_swift_final_state_line_before_the_total_is_idle_not_finished(tmp_path):
    # newer ms-swift writes its last_model_checkpoint line in a finally: also when train() raised
    run = copy_swift(tmp_path, keep_lines=40, extra=[{"last_model_checkpoint": None, "best_model_checkpoint": None,
                                                      "best_metric": None, "global_step": 39, "log_history": [],
                                                      "memory": {}}])
    assert state_of(run).status == IDLE


def test_swift_final_state_line_longer_than_the_tail_still_reads_finished(tmp_path):
    """ms-swift's last line carries the whole log_history: on a long run it is longer than the tail the
    feed reads first, which then began inside it and held no record: a finished run read "running" with
    no figures (dashboard header and `watch --json`) until the backfill, and its state never recovered."""
    history = [{"loss": 1.0, "grad_norm": 1.0, "learning_rate": 1e-05, "epoch": step / 4000, "step": step}
               for step in range(1, 4001)]
    run = copy_swift(tmp_path, extra=[{"last_model_checkpoint": "checkpoint-100", "best_model_checkpoint": None,
                                       "best_metric": None, "global_step": 100, "log_history": history,
                                       "memory": 15.46}])
    assert len(json.dumps({"log_history": history})) > METRICS_TAIL_BYTES
    source = open_watch_source(run)
    feed = open_metrics_feed(source)
    train = [r for r in feed.read_tail() if r["kind"] == "train"]
    assert train and train[-1]["step"] == 100 and train[-1]["total_steps"] == 100
    assert writer_state(source, feed.activity).status == FINISHED


def test_a_metric_file_that_cannot_be_opened_is_said_not_shown_as_a_run_yet_to_log(tmp_path, monkeypatch):
    """logging.jsonl without read permission (another user's run; this box runs as root, where chmod denies
    nothing, so the open is refused here as the kernel would): a long one ended `watch --json` and the
    dashboard's watcher with a PermissionError traceback, a short one read as a run with no figures yet."""
    import builtins

    import core.watch.follow

    history = [{"loss": 1.0, "step": step} for step in range(1, 12001)]
    run = copy_swift(tmp_path, extra=[{"last_model_checkpoint": "checkpoint-100", "log_history": history}])
    metrics = run / "logging.jsonl"
    assert metrics.stat().st_size > METRICS_TAIL_BYTES

    def denied(path, *args, **kwargs):
        if Path(path) == metrics:
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(core.watch.follow, "open", denied, raising=False)
    source = open_watch_source(run)
    feed = open_metrics_feed(source)
    assert feed.read_tail() == []
    unreadable = writer_state(source, feed.activity).to_json()["unreadable"]
    assert unreadable["file"] == "logging.jsonl" and unreadable["error"] == "Permission denied"
    assert "permissions" in unreadable["message"] and "whole write" not in unreadable["message"]
    monkeypatch.delattr(core.watch.follow, "open")  # made readable: the next poll reads it, the problem goes
    records, _restarted = feed.poll()
    assert records[-1] == {"kind": "end"} and writer_state(source, feed.activity).to_json()["unreadable"] is None


def test_a_log_written_months_ago_is_idle_and_a_fresh_one_runs(tmp_path):
    run = copy_swift(tmp_path, keep_lines=60)
    assert state_of(run).status == RUNNING
    age(run)
    state = state_of(run)
    assert state.status == IDLE and state.since == pytest.approx(MONTHS_AGO, abs=1)
    assert state.to_json()["status"] == "idle" and state.to_json()["last_write"].startswith(
        time.strftime("%Y-%m-%d", time.localtime(MONTHS_AGO)))


def test_patience_is_ten_record_intervals_with_a_floor(tmp_path):
    activity = WriterActivity()
    activity.observe([{"kind": "train", "step": s, "elapsed_s": 300.0 * s} for s in range(1, 6)])
    assert activity.median_interval == 300
    out = tmp_path / "lf"
    out.mkdir()
    (out / "trainer_log.jsonl").write_text("{}\n")
    source = open_watch_source(out)
    written = (out / "trainer_log.jsonl").stat().st_mtime
    assert writer_state(source, activity, now=written + 2000).status == RUNNING  # logs every 5 min
    assert writer_state(source, activity, now=written + 3001).status == IDLE
    quick = WriterActivity()
    quick.observe([{"kind": "train", "step": s, "elapsed_s": 1.0 * s} for s in range(1, 6)])
    assert writer_state(source, quick, now=written + IDLE_FLOOR_S - 1).status == RUNNING  # the floor
    assert writer_state(source, quick, now=written + IDLE_FLOOR_S + 1).status == IDLE


def test_llamafactory_results_file_means_finished(tmp_path):
    out = tmp_path / "lf"
    lines = lf_old_lines(40)[:3]  # stopped at step 10 of 40 as far as the log goes
    out.mkdir()
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert state_of(out).status == RUNNING
    (out / "train_results.json").write_text(json.dumps({"epoch": 4.0, "train_loss": 1.2, "train_runtime": 80.0}))
    assert state_of(out).status == FINISHED


def test_llamafactory_run_started_again_in_a_finished_folder_is_running_not_finished(tmp_path):
    """LLaMA-Factory run again into the folder of a finished run appends to trainer_log.jsonl and writes its
    results (train_results.json, all_results.json, the top trainer_state.json) only at its end: the
    previous run's read "finished" over the new run's live steps, with no ETA."""
    out = tmp_path / "lf"
    out.mkdir()
    log = out / "trainer_log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lf_old_lines(40)))
    (out / "train_results.json").write_text(json.dumps({"epoch": 4.0, "train_loss": 1.2, "train_runtime": 80.0}))
    (out / "all_results.json").write_text(json.dumps({"epoch": 4.0, "train_loss": 1.2, "train_runtime": 80.0}))
    (out / "trainer_state.json").write_text(json.dumps(hf_state(40, 40, summary=True)))
    age(out, MONTHS_AGO)
    assert state_of(out).status == FINISHED
    with open(log, "a") as handle:  # started again: steps from 5 of 40 anew
        handle.write("".join(json.dumps(line) + "\n" for line in lf_old_lines(40)[:3]))
    assert state_of(out).status == RUNNING
    for name in ("train_results.json", "all_results.json", "trainer_state.json"):  # it ends: its own results
        (out / name).write_text((out / name).read_text())
    assert state_of(out).status == FINISHED


def finished_llamafactory_run(tmp_path):
    """A LLaMA-Factory output folder of a finished run (its log, results and the HF trainer_state.json beside
    them): the folder and its trainer_log.jsonl."""
    out = tmp_path / "lf"
    out.mkdir()
    log = out / "trainer_log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lf_old_lines(40)))
    for name in ("train_results.json", "all_results.json"):
        (out / name).write_text(json.dumps({"epoch": 4.0, "train_loss": 1.2, "train_runtime": 80.0}))
    (out / "trainer_state.json").write_text(json.dumps(hf_state(40, 40, summary=True)))
    return out, log


def test_llamafactory_run_started_again_with_overwrite_output_dir_is_running_at_once(tmp_path):
    """LLaMA-Factory run again with overwrite_output_dir removes trainer_log.jsonl as it starts (LogCallback.
    on_init_end) and writes its first line minutes later (the model loads, the data is tokenised): until then a
    dashboard on the folder read "finished", with the previous run's figures as this run's. The removal starts
    the feed over (restarted, nothing kept) and the state is running from the removal; idle if nothing follows."""
    out, log = finished_llamafactory_run(tmp_path)
    age(out, MONTHS_AGO)
    source = open_watch_source(out)
    feed = open_metrics_feed(source)
    assert feed.read_tail() and writer_state(source, feed.activity).status == FINISHED
    log.unlink()  # started again with overwrite_output_dir
    records, restarted = feed.poll()
    assert records == [] and restarted and feed.backfill() is None
    state = writer_state(source, feed.activity)
    assert state.status == RUNNING and state.since > MONTHS_AGO + 86400, state  # since the removal
    assert writer_state(source, feed.activity, now=time.time() + 3600).status == IDLE  # nothing followed
    assert feed.poll() == ([], False)  # said once
    log.write_text(json.dumps(lf_old_lines(40)[0]) + "\n")  # its first line: read from the start
    records, restarted = feed.poll()
    assert [r["step"] for r in records if r.get("kind") == "train"] == [5] and not restarted
    assert writer_state(source, feed.activity).status == RUNNING


@pytest.mark.parametrize("mark", ["README.md", "training_args.yaml"])
def test_a_fresh_watch_on_a_llamafactory_folder_started_again_with_overwrite_waits_for_the_new_run(tmp_path, mark):
    """A ``watch`` started after LLaMA-Factory removed trainer_log.jsonl (a run started again with
    overwrite_output_dir, minutes before its first line) read the previous run's trainer_state.json as an HF
    Trainer dir: its figures and "finished" for the new run. What the run left there (the model card LLaMA-Factory
    tags, LLaMA-Board's saved arguments) says whose folder it is: watched as LLaMA-Factory's, running since the
    removal, the new run's first line read once it comes."""
    out, log = finished_llamafactory_run(tmp_path)
    (out / mark).write_text("---\ntags:\n- llama-factory\n- lora\n---\n" if mark == "README.md" else
                            "finetuning_type: lora\n")
    age(out, MONTHS_AGO)
    log.unlink()  # started again with overwrite_output_dir
    source = open_watch_source(out)
    assert source.kind == LLAMAFACTORY and source.metrics_path == log
    feed = open_metrics_feed(source)
    assert feed.read_tail() == [] and feed.backfill() is None  # none of the previous run's figures
    state = writer_state(source, feed.activity)
    assert state.status == RUNNING and state.since > MONTHS_AGO + 86400, state  # since the removal
    log.write_text(json.dumps(lf_old_lines(40)[0]) + "\n")  # its first line
    records, _restarted = feed.poll()
    assert [r["step"] for r in records if r.get("kind") == "train"] == [5]
    assert writer_state(source, feed.activity).status == RUNNING


def test_an_hf_trainer_folder_is_not_taken_for_a_llamafactory_one(tmp_path):
    """Without LLaMA-Factory's marks, a folder of trainer_state.json is an HF Trainer output dir, as before."""
    out = tmp_path / "hf"
    out.mkdir()
    (out / "trainer_state.json").write_text(json.dumps(hf_state(40, 40, summary=True)))
    (out / "README.md").write_text("---\ntags:\n- generated_from_trainer\n---\n")
    assert open_watch_source(out).kind == HF_TRAINER


def test_a_llamafactory_folder_deleted_while_watched_keeps_its_figures(tmp_path):
    """The removal of trainer_log.jsonl starts the feed over (a run started again with overwrite_output_dir), but
    a folder deleted whole (rm -r) also takes the file: the dashboard then dropped the run's charts and figures
    and said "directory deleted" over nothing, where an ms-swift or tunedeck folder keeps what was read. Only a
    removal from a folder still there starts over."""
    from core.watch.activity import GONE

    out = tmp_path / "lf"
    out.mkdir()
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lf_old_lines(40)))
    source = open_watch_source(out)
    feed = open_metrics_feed(source)
    assert [r["step"] for r in feed.read_tail() if r.get("kind") == "train"]
    shutil.rmtree(out)
    assert feed.poll() == ([], False)  # nothing new, and what was read stays
    assert writer_state(source, feed.activity).status == GONE


def test_watch_json_reports_the_writer_state(tmp_path):
    out = tmp_path / "hf_out"
    write_checkpoint(out, 10, 40, MONTHS_AGO)
    result = subprocess.run([sys.executable, "-m", "core", "watch", str(out), "--json"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120,
                            env={"TUNEDECK_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "hf_trainer" and data["facts"]["method"] == "lora"
    assert data["state"]["status"] == "idle" and data["state"]["last_write"]


def test_watch_json_gives_an_eta_only_while_the_writer_runs(tmp_path):
    """`watch --json` on a writer gone idle gave its last line's remaining time (5m 28s, months ago) where the
    dashboard's header shows no ETA (nor does `status` for a run not heading for its end)."""
    def latest(run: Path) -> dict:
        result = subprocess.run([sys.executable, "-m", "core", "watch", str(run), "--json"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120,
                                env={"TUNEDECK_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        return {"status": data["state"]["status"], **data["latest"]}

    run = copy_swift(tmp_path, keep_lines=60)
    now = latest(run)
    assert now["status"] == RUNNING and now["eta_s"] == 328 and now["step"] == 59
    age(run)
    then = latest(run)
    assert then["status"] == IDLE and "eta_s" not in then and then["step"] == 59 and then["elapsed_s"] == 472


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tear(path: Path, keep: int = 200, when: float | None = None) -> None:
    """``path`` cut to its first ``keep`` bytes, as a read in the middle of HF's in-place rewrite sees it."""
    path.write_bytes(path.read_bytes()[:keep])
    if when is not None:
        os.utime(path, (when, when))


def test_a_torn_trainer_state_is_said_only_once_it_stays_unreadable(tmp_path):
    from core.watch.trainer_state import UNREADABLE_AFTER_S, TrainerStateFeed

    out = tmp_path / "hf_out"
    state_file = write_checkpoint(out, 10, 40) / "trainer_state.json"
    whole = state_file.read_text()
    tear(state_file, when=time.time() + 3600)  # written "just now" however slow this box: the grace applies
    clock = FakeClock()
    feed = TrainerStateFeed(out, clock=clock)
    assert feed.read_tail() == [] and feed.activity.unreadable is None  # a torn read is normal for a moment
    clock.now += UNREADABLE_AFTER_S / 2
    assert feed.poll() == ([], False) and feed.activity.unreadable is None
    clock.now += UNREADABLE_AFTER_S  # the same bytes, still unreadable: no longer a write in progress
    assert feed.poll() == ([], False)
    file, error, _message_key = feed.activity.unreadable
    assert file == "checkpoint-10/trainer_state.json" and "column" in error  # json's own position (line, column)
    state = writer_state(open_watch_source(out), feed.activity)
    assert state.problem() == f"checkpoint-10/trainer_state.json cannot be read ({error}): waiting for a whole write"
    assert state.to_json()["unreadable"] == {"file": file, "error": error, "message": state.problem()}
    state_file.write_text(whole)  # the writer finishes its write: the history is read, the problem gone
    records, restarted = feed.poll()
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 11)) and not restarted
    assert feed.activity.unreadable is None
    assert writer_state(open_watch_source(out), feed.activity).to_json()["unreadable"] is None


def test_a_trainer_state_without_read_permission_is_said_at_once_with_what_to_check(tmp_path, monkeypatch):
    """A trainer_state.json that cannot be opened said "waiting for a whole write" after 5 s: no write will
    mend its permissions. This box runs as root (chmod denies nothing): the read is refused as the kernel would."""
    from core.watch.trainer_state import TrainerStateFeed

    out = tmp_path / "hf_out"
    state_file = write_checkpoint(out, 10, 40) / "trainer_state.json"
    real_read_text = Path.read_text

    def read_text(self, *args, **kwargs):
        if self == state_file:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    feed = TrainerStateFeed(out, clock=FakeClock())
    assert feed.read_tail() == []
    problem = writer_state(open_watch_source(out), feed.activity).problem()
    assert problem.startswith("checkpoint-10/trainer_state.json cannot be read (Permission denied)")
    assert "permissions" in problem and "whole write" not in problem


def test_a_trainer_state_torn_long_ago_is_said_at_once_and_in_watch_json(tmp_path):
    from core.watch.trainer_state import TrainerStateFeed

    out = tmp_path / "hf_out"
    state_file = write_checkpoint(out, 10, 40, MONTHS_AGO) / "trainer_state.json"
    tear(state_file, when=MONTHS_AGO)
    feed = TrainerStateFeed(out)
    assert feed.read_tail() == []
    assert feed.activity.unreadable[0] == "checkpoint-10/trainer_state.json"
    result = subprocess.run([sys.executable, "-m", "core", "watch", str(out), "--json"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120,
                            env={"TUNEDECK_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    unreadable = json.loads(result.stdout)["state"]["unreadable"]
    assert unreadable["file"] == "checkpoint-10/trainer_state.json" and "column" in unreadable["error"]
    assert "cannot be read" in unreadable["message"]


def test_tensorboard_is_imported_only_by_a_feed(tmp_path):
    """Opening the app or a source never loads tensorboard (nor torch): only the file worker's feed does."""
    pytest.importorskip("tensorboard", reason="tensorboard is not installed: .venv/bin/pip install tensorboard")
    run_dir = tmp_path / "runs" / "x"
    run_dir.mkdir(parents=True)
    (run_dir / "events.out.tfevents.1764450000.box.1.0").write_bytes(b"")
    probe = ("import sys, json\nimport core.watch.feed, core.watch.activity, core.watch.trainer_state,"
             " core.watch.tb_events, tui.screens.dashboard\nfrom core.watch.source import open_watch_source\n"
             f"print(open_watch_source({str(tmp_path)!r}).kind)\nprint(json.dumps(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    kind, modules = result.stdout.splitlines()
    assert kind == TENSORBOARD, result.stderr
    loaded = {name.split(".")[0] for name in json.loads(modules)}
    assert not {"tensorboard", "torch", "tensorflow"} & loaded
