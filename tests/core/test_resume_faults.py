"""Resume meets damaged checkpoints and changed data: real runs of the tiny model, real files, real processes.

One LoRA run is trained per module and dies for real at step 10 (an injected out-of-memory error) after
checkpoints at steps 3, 6 and 9 (save_total_limit 2 keeps 6 and 9); each test copies it and breaks the copy
the way a disk, a crash or a user would: a truncated safetensors file, a deleted optimizer.pt, a newer
checkpoint without its marker, a corrupt trainer_state.json, a dataset that shrank, one that is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from core.i18n import set_language
from core.runs.checkpoints import COMPLETE_MARKER, verify_checkpoint
from core.runs.control import RunControlError, prepare_resume
from core.runs.fingerprint import compare_fingerprint, record_fingerprint
from core.runs.run_dir import RunDirectory
from tests.core.test_runs_detached import ROOT, TINY, Cli, train_losses

ROWS = [("Name a colour.", "Blue."), ("What is 1 + 1?", "2."), ("Say yes.", "Yes."), ("Opposite of up?", "Down."),
        ("A pet?", "A dog."), ("Spell sun.", "S-U-N."), ("A fruit?", "A pear."), ("Say no.", "No."),
        ("Sky colour?", "Blue."), ("2 + 2?", "4."), ("Say hi.", "Hi!"), ("Cold or hot: ice?", "Cold.")]
LR = 0.005


def write_rows(path: Path, count: int) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for q, a in ROWS[:count]:
            handle.write(json.dumps({"messages": [{"role": "user", "content": q},
                                                  {"role": "assistant", "content": a}]}) + "\n")
    return path


@pytest.fixture(autouse=True)
def english():
    set_language("en")


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory):
    """(home, run id, dataset path) of a run that failed at step 10 with complete checkpoints 6 and 9."""
    base = tmp_path_factory.mktemp("resume-faults")
    data = write_rows(base / "data.jsonl", len(ROWS))
    cfg = {"model": str(TINY), "dataset": str(data), "method": "lora", "lora_rank": 8, "lora_alpha": 16,
           "lora_dropout": 0.0, "precision": "fp32", "max_seq_len": 64, "micro_batch_size": 4,
           "gradient_accumulation": 1, "max_steps": 12, "learning_rate": LR, "warmup_steps": 0,
           "lr_scheduler": "linear", "gradient_checkpointing": False, "save_steps": 3, "save_total_limit": 2,
           "logging_steps": 1, "seed": 7}
    (base / "run.yaml").write_text(yaml.safe_dump(cfg))
    cli = Cli(base / "home")
    run_id = cli("train", str(base / "run.yaml"), TUNEDECK_INJECT_OOM_AT_STEP="10").stdout.strip()
    status = cli.wait_status(run_id, {"finished", "failed", "crashed", "stopped"})
    assert status["status"] == "failed", status
    steps = sorted(int(p.name.split("-")[1]) for p in (cli.run_dir(run_id) / "checkpoints").iterdir())
    assert steps == [6, 9], steps
    return base, run_id, data


@pytest.fixture
def copy(failed_run, tmp_path):
    """A private copy of the failed run: (cli, run id, run directory, dataset path of the copy)."""
    base, run_id, data = failed_run
    home = tmp_path / "home"
    shutil.copytree(base / "home", home, symlinks=True)
    new_data = write_rows(tmp_path / "data.jsonl", len(ROWS))
    shutil.copystat(data, new_data)  # the same mtime: the copy's data is "unchanged"
    run_dir = home / "runs" / run_id
    # The copy's config and fingerprint name the copy's dataset (as if the run had been started here).
    for name in ("config.yaml", "fingerprint.json"):
        path = run_dir / name
        path.write_text(path.read_text().replace(str(data), str(new_data)))
    return Cli(home), run_id, run_dir, new_data


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def resumed_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "resumed"]


def test_complete_marker_lists_files_and_sizes_and_rotation_is_recorded(failed_run):
    base, run_id, _data = failed_run
    run_dir = base / "home" / "runs" / run_id
    ckpt = run_dir / "checkpoints" / "checkpoint-9"
    marker = json.loads((ckpt / COMPLETE_MARKER).read_text())
    assert marker["step"] == 9 and marker["format"] == 2
    for name in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"):
        assert marker["files"][name] == (ckpt / name).stat().st_size, name
    assert verify_checkpoint(ckpt).resumable
    removed = events(run_dir, "checkpoint_removed")
    assert [(Path(e["path"]).name, e["why"]) for e in removed] == [("checkpoint-3", "rotated")]
    assert removed[0]["bytes"] > 0


def test_truncated_safetensors_falls_back_to_the_previous_checkpoint_naming_the_file(copy):
    cli, run_id, run_dir, _data = copy
    tensors = run_dir / "checkpoints" / "checkpoint-9" / "adapter_model.safetensors"
    with open(tensors, "r+b") as handle:
        handle.truncate(tensors.stat().st_size // 2)
    out = cli("resume", run_id)
    assert "checkpoint-9 is damaged: adapter_model.safetensors" in out.stderr, out.stderr
    assert "resuming from checkpoint-6" in out.stderr
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    resumed = resumed_records(run_dir)
    assert resumed[-1]["step"] == 6 and resumed[-1]["checkpoint"].endswith("checkpoint-6")
    assert sorted(train_losses(run_dir)) == list(range(1, 13))
    rejected = events(run_dir, "checkpoint_rejected")
    assert rejected[-1]["file"] == "adapter_model.safetensors" and rejected[-1]["step"] == 9
    # Training passed step 9 again: the damaged folder was replaced by a sound one, and that is recorded.
    replaced = [e for e in events(run_dir, "checkpoint_removed") if e["why"] == "replaced"]
    assert [Path(e["path"]).name for e in replaced] == ["checkpoint-9"]
    assert verify_checkpoint(run_dir / "checkpoints" / "checkpoint-12").resumable


def test_missing_optimizer_is_refused_and_weights_only_restarts_the_schedule_on_record(copy):
    cli, run_id, run_dir, _data = copy
    (run_dir / "checkpoints" / "checkpoint-9" / "optimizer.pt").unlink()
    refused = cli("resume", run_id, "--checkpoint", "9", check=False)
    assert refused.returncode == 2, refused.stderr  # a request that cannot be (it was 1, as a resume that failed)
    assert "checkpoint-9 has no usable optimizer/scheduler state: optimizer.pt missing" in refused.stderr
    assert "--weights-only" in refused.stderr
    assert RunDirectory(run_dir).status().status == "failed"  # nothing started
    assert not (json.loads((run_dir / "run.json").read_text()).get("resumes"))
    out = cli("resume", run_id, "--checkpoint", "9", "--weights-only")
    assert "weights only: continuing from checkpoint-9" in out.stderr and "schedule" in out.stderr
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    assert events(run_dir, "resume_weights_only")[-1]["missing"] == ["optimizer.pt"]
    assert resumed_records(run_dir)[-1]["step"] == 9
    # A fresh linear schedule over 12 steps: the first step after the resume has the rate of step 1 again,
    # where the interrupted schedule had decayed it to a quarter and less.
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["learning_rate"] for r in records if r.get("kind") == "train"}
    assert lrs[10] == pytest.approx(lrs[1], rel=1e-6) and lrs[1] > 0.9 * LR, lrs
    assert lrs[9] < LR / 3


def test_default_resume_passes_over_a_checkpoint_without_optimizer_state(copy):
    _cli, _run_id, run_dir, _data = copy
    (run_dir / "checkpoints" / "checkpoint-9" / "scheduler.pt").unlink()
    plan = prepare_resume(RunDirectory(run_dir))
    assert plan.step == 6 and not plan.weights_only
    texts = [n.text() for n in plan.notices]
    assert any("checkpoint-9 has no usable optimizer/scheduler state: scheduler.pt missing" in x for x in texts)
    assert events(run_dir, "checkpoint_rejected")[-1]["file"] == "scheduler.pt"


def test_newer_incomplete_checkpoint_is_removed_only_with_an_event_and_a_message(copy):
    cli, run_id, run_dir, _data = copy
    ckpts = run_dir / "checkpoints"
    shutil.copytree(ckpts / "checkpoint-9", ckpts / "checkpoint-11")
    (ckpts / "checkpoint-11" / COMPLETE_MARKER).unlink()  # renamed, but the marker never written
    (ckpts / "checkpoint-12.tmp").mkdir()
    (ckpts / "checkpoint-12.tmp" / "optimizer.pt").write_bytes(b"\0" * 1000)
    size = sum(p.stat().st_size for p in (ckpts / "checkpoint-11").rglob("*") if p.is_file())
    out = cli("resume", run_id)
    assert "removed checkpoint-11" in out.stderr and "removed checkpoint-12.tmp" in out.stderr, out.stderr
    removed = {Path(e["path"]).name: e for e in events(run_dir, "checkpoint_removed") if e["why"] == "incomplete"}
    assert set(removed) == {"checkpoint-11", "checkpoint-12.tmp"} and removed["checkpoint-11"]["bytes"] == size
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    assert resumed_records(run_dir)[-1]["step"] == 9


def test_corrupt_trainer_state_and_choice_by_step(copy):
    cli, run_id, run_dir, _data = copy
    run = RunDirectory(run_dir)
    state = run_dir / "checkpoints" / "checkpoint-9" / "trainer_state.json"
    state.write_text(state.read_text()[:40])  # the same kind of damage a full disk leaves
    with pytest.raises(RunControlError, match=r"checkpoint-9 is damaged: trainer_state\.json"):
        prepare_resume(run, step=9)
    with pytest.raises(RunControlError, match=r"no complete checkpoint-7; complete ones: 6, 9"):
        prepare_resume(run, step=7)
    refused = cli("resume", run_id, "--checkpoint", "7", check=False)  # a request that cannot be: 2, not 1
    assert refused.returncode == 2 and "no complete checkpoint-7; complete ones: 6, 9" in refused.stderr, \
        (refused.returncode, refused.stderr)
    assert run.status().status == "failed"
    plan = prepare_resume(run)
    assert plan.step == 6
    assert any("trainer_state.json" in n.text() and "checkpoint-9" in n.text() for n in plan.notices)


def test_every_checkpoint_damaged_is_refused_with_each_problem(copy):
    cli, run_id, run_dir, _data = copy
    for step in (6, 9):
        (run_dir / "checkpoints" / f"checkpoint-{step}" / "optimizer.pt").unlink()
    (run_dir / "checkpoints" / "checkpoint-9" / "adapter_model.safetensors").write_bytes(b"\x08")
    with pytest.raises(RunControlError) as caught:
        prepare_resume(RunDirectory(run_dir))
    text = str(caught.value)
    assert "checkpoint-9 is damaged: adapter_model.safetensors" in text
    assert "checkpoint-6 has no usable optimizer/scheduler state: optimizer.pt" in text and "--weights-only" in text
    refused = cli("resume", run_id, check=False)  # no sound checkpoint to resume from: 2 (it was 1)
    assert refused.returncode == 2 and "checkpoint-9 is damaged: adapter_model.safetensors" in refused.stderr, \
        (refused.returncode, refused.stderr)


def test_legacy_ok_marker_is_read_as_unverified(copy):
    _cli, _run_id, run_dir, _data = copy
    (run_dir / "checkpoints" / "checkpoint-9" / COMPLETE_MARKER).write_text("ok\n")
    check = verify_checkpoint(run_dir / "checkpoints" / "checkpoint-9")
    assert check.legacy and check.resumable
    plan = prepare_resume(RunDirectory(run_dir))
    assert plan.step == 9
    assert any("older tunedeck" in n.text() for n in plan.notices)


def test_changed_dataset_warns_with_rows_old_to_new_and_trains_on(copy):
    cli, run_id, run_dir, data = copy
    write_rows(data, 5)
    out = cli("resume", run_id, "--json")
    assert f"dataset {data} changed since the run last started or resumed: records 12 → 5" in out.stderr, out.stderr
    started = json.loads(out.stdout)
    assert started["step"] == 9 and not started["weights_only"]
    assert any("records 12 → 5" in notice for notice in started["notices"])
    change = events(run_dir, "data_changed")[-1]
    assert change["path"] == str(data) and change["old"]["records"] == 12 and change["new"]["records"] == 5
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    # The fingerprint now holds the data the rest of the run trained on: no second warning for it.
    assert json.loads((run_dir / "fingerprint.json").read_text())["data"][0]["files"][0]["records"] == 5


def test_run_without_a_fingerprint_still_refuses_a_missing_dataset(copy):
    _cli, _run_id, run_dir, data = copy
    (run_dir / "fingerprint.json").unlink()  # a run started by an older tunedeck
    data.unlink()
    run = RunDirectory(run_dir)
    with pytest.raises(RunControlError, match=f"dataset {data} is gone; restore it, or resume with dataset="):
        prepare_resume(run)
    assert run.status().status == "failed" and not (run_dir / "fingerprint.json").exists()


def test_missing_dataset_is_refused_before_anything_starts_and_an_override_resumes(copy, tmp_path):
    cli, run_id, run_dir, data = copy
    moved = tmp_path / "moved" / "data.jsonl"
    moved.parent.mkdir()
    data.rename(moved)
    refused = cli("resume", run_id, check=False)
    assert refused.returncode == 2, refused.stderr  # a user error, as data that does not load (was 1)
    said = [line for line in refused.stderr.splitlines() if "is gone" in line]
    assert len(said) == 1 and "nothing was started" in said[0] and "dataset=NEW_PATH" in said[0], refused.stderr
    assert f"dataset {data} is gone (it held 12 records when the run last started or resumed)" in said[0]
    assert refused.stdout == ""  # no run id: nothing was started
    record = json.loads((run_dir / "run.json").read_text())
    assert not record.get("resumes") and len(record["attempts"]) == 1
    assert RunDirectory(run_dir).status().status == "failed"
    out = cli("resume", run_id, f"dataset={moved}")
    assert f"configuration key dataset changed: {data} → {moved}" in out.stderr, out.stderr
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["dataset"] == str(moved)
    assert events(run_dir, "config_changed")[-1]["key"] == "dataset"
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"


def test_a_model_folder_that_moved_resumes_with_an_override_and_the_run_shows_the_new_one(copy, tmp_path):
    """``resume RUN model=NEW`` after the model folder moved: runs, status and the app (run.json's
    config_summary) said the old folder, which is no longer there, for the rest of the run."""
    cli, run_id, run_dir, _data = copy
    moved = tmp_path / "moved-model"
    shutil.copytree(TINY, moved)
    out = cli("resume", run_id, f"model={moved}")
    assert f"configuration key model changed: {TINY} → {moved}" in out.stderr, out.stderr
    assert cli.status(run_id)["model"] == str(moved)
    assert [r for r in json.loads(cli("runs", "--json").stdout) if r["id"] == run_id][0]["model"] == str(moved)
    summary = json.loads((run_dir / "run.json").read_text())["config_summary"]
    assert summary["name"] and summary["method"] == "lora"
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"


def test_changed_config_key_is_named_old_to_new(copy):
    _cli, _run_id, run_dir, _data = copy
    path = run_dir / "config.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["learning_rate"] = 0.001
    path.write_text(yaml.safe_dump(cfg))
    plan = prepare_resume(RunDirectory(run_dir))
    assert "configuration key learning_rate changed: 0.005 → 0.001" in [n.text() for n in plan.notices]


def test_the_trainer_itself_refuses_a_checkpoint_damaged_after_resume_checked_it(copy):
    _cli, _run_id, run_dir, _data = copy
    ckpt = run_dir / "checkpoints" / "checkpoint-9"
    (ckpt / "scheduler.pt").unlink()
    out = subprocess.run([sys.executable, "-m", "core.train.worker", str(run_dir), "--resume", str(ckpt)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 1, out.stderr[-2000:]
    outcome = json.loads((run_dir / "outcome.json").read_text())
    assert outcome["status"] == "failed"
    assert outcome["reason"].startswith(f"checkpoint {ckpt} cannot be resumed from: scheduler.pt missing")
    assert outcome["reason_message"]["key"] == "checkpoints.unusable"


def test_dataset_folder_fingerprint_names_new_removed_and_changed_files(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_rows(folder / "a.jsonl", 6)
    write_rows(folder / "b.jsonl", 4)
    cfg = {"dataset": [str(folder), "someone/hub-dataset"], "learning_rate": LR, "name": "x"}
    recorded = record_fingerprint(tmp_path, cfg)
    assert [f["records"] for f in recorded["data"][0]["files"]] == [6, 4]
    assert recorded["data"][1]["kind"] == "hub" and len(recorded["config"]["hash"]) == 64
    assert not compare_fingerprint(tmp_path, {**cfg, "name": "renamed"}).warnings  # a label is not training
    (folder / "b.jsonl").unlink()
    write_rows(folder / "c.jsonl", 2)
    write_rows(folder / "a.jsonl", 3)
    report = compare_fingerprint(tmp_path, cfg)
    texts = [m.text() for m in report.warnings]
    assert f"dataset {folder / 'a.jsonl'} changed since the run last started or resumed: records 6 → 3; size" in texts[0]
    assert any(f"{folder / 'b.jsonl'} is no longer in {folder}" in x for x in texts)
    assert any(f"dataset file {folder / 'c.jsonl'} is new" in x for x in texts)
    assert not report.missing
    shutil.rmtree(folder)
    missing = compare_fingerprint(tmp_path, cfg).missing
    assert [m.text() for m in missing] == [f"dataset {folder} is gone (it held 10 records when the run last started or resumed); "
                                          "restore it, or resume with dataset=NEW_PATH if it moved"]


def test_a_folder_file_now_left_out_as_another_split_is_said_at_resume_and_an_ordinary_folder_says_nothing(tmp_path):
    """A run started before a folder's files were read split by name recorded its test.jsonl with its train.jsonl
    (it trained on both); resumed now, it trains on train.jsonl only, and the resume said nothing (the file not
    read, but still there, passed for unchanged). It is said now, as a file removed from the folder is; a folder
    without split names (the fingerprint the same as before) says nothing, a test file added to it neither."""
    from core.runs.fingerprint import file_fingerprint

    folder = tmp_path / "data"
    folder.mkdir()
    write_rows(folder / "train.jsonl", 6)
    write_rows(folder / "test.jsonl", 4)
    cfg = {"dataset": str(folder), "learning_rate": LR}
    recorded = record_fingerprint(tmp_path, cfg)
    assert [Path(f["path"]).name for f in recorded["data"][0]["files"]] == ["train.jsonl"]
    recorded["data"][0]["files"].append(file_fingerprint(folder / "test.jsonl"))  # as such a run recorded it
    (tmp_path / "fingerprint.json").write_text(json.dumps(recorded), encoding="utf-8")
    report = compare_fingerprint(tmp_path, cfg)
    assert [m.text() for m in report.warnings] == [
        f"dataset file {folder / 'test.jsonl'} is still in {folder} but no longer read: its name is that of another "
        "split than the one trained on (test.jsonl beside train.jsonl; FOLDER:SPLIT reads it); the rest of the run "
        "trains without it"]
    assert report.events == [("data_changed", {"path": str(folder / "test.jsonl"), "left_out": True})]
    plain = tmp_path / "plain"
    plain.mkdir()
    write_rows(plain / "a.jsonl", 3)
    write_rows(plain / "b.jsonl", 2)
    record_fingerprint(tmp_path, {**cfg, "dataset": str(plain)})
    write_rows(plain / "test.jsonl", 2)
    assert not compare_fingerprint(tmp_path, {**cfg, "dataset": str(plain)}).warnings


def test_a_resume_that_leaves_no_step_to_train_is_refused_and_the_run_stays_resumable(copy):
    """`resume RUN max_steps=100` of a run at step 1168 was accepted: the trainer finished at once, the run
    read "finished, step 1168/100" and could never be resumed again. A max_steps at or below the step it
    would resume from (or, without max_steps, epochs it has already reached) is refused with nothing
    changed; a max_steps above it resumes."""
    cli, run_id, run_dir, _data = copy
    config_before = (run_dir / "config.yaml").read_text()
    record_before = json.loads((run_dir / "run.json").read_text())
    for value in ("9", "5"):
        refused = cli("resume", run_id, f"max_steps={value}", check=False)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert refused.stderr.startswith(f"tunedeck: run {run_id} was not resumed, nothing was changed: it would "
                                         f"resume from checkpoint 9, and max_steps {value} leaves no step to train"), \
            refused.stderr
        assert f"give a max_steps above 9: tunedeck resume {run_id} max_steps=N" in refused.stderr
        assert "configuration key" not in refused.stderr and "started" not in refused.stderr
    refused = cli("resume", run_id, "--checkpoint", "6", "max_steps=6", check=False)  # the step it would take
    assert refused.returncode == 2 and "resume from checkpoint 6, and max_steps 6" in refused.stderr, refused.stderr
    assert (run_dir / "config.yaml").read_text() == config_before
    assert json.loads((run_dir / "run.json").read_text()) == record_before  # no resume, no attempt recorded
    assert RunDirectory(run_dir).status().status == "failed" and not events(run_dir, "config_overridden")

    # Without max_steps the epochs count: 12 rows at 4 a step, 3 steps an epoch; checkpoint 9 is epoch 3.
    cfg = yaml.safe_load(config_before)
    del cfg["max_steps"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**cfg, "epochs": 3}))
    with pytest.raises(RunControlError) as refused_epochs:
        prepare_resume(RunDirectory(run_dir))
    assert "checkpoint 9, which it would resume from, is at epoch 3, and epochs 3 leaves no step" in \
        str(refused_epochs.value) and refused_epochs.value.code == 2
    assert RunDirectory(run_dir).status().status == "failed"
    (run_dir / "config.yaml").write_text(config_before)

    out = cli("resume", run_id, "max_steps=11")
    assert "configuration key max_steps changed: 12 → 11" in out.stderr, out.stderr
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    status = cli.status(run_id)
    assert (status["step"], status["total_steps"]) == (11, 11), status


def test_resume_says_it_resumed_and_from_which_checkpoint(copy):
    """`tunedeck resume` printed "started run …", as `train` does: it says "resumed run … from checkpoint
    N" now (the id alone on stdout, as before)."""
    cli, run_id, _run_dir, _data = copy
    out = cli("resume", run_id)
    assert out.stdout.strip() == run_id
    assert f"resumed run {run_id} from checkpoint 9\n" in out.stderr and "started run" not in out.stderr, out.stderr
    assert f"tunedeck logs {run_id} -f" in out.stderr
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"


def test_a_new_learning_rate_on_resume_is_the_base_the_schedule_carries_on_from(copy):
    """`resume RUN learning_rate=…` was accepted and written to config.yaml, but the trainer restored the
    checkpoint's optimizer and schedule, old rate and all: the log went on at the old rate. The schedule
    keeps its step and shape (linear over 12 steps, no warmup: lr at step s is base × (13 - s) / 12) and
    takes the new base; a schedule changed with it (constant) gives the new rate flat. CPU only."""
    cli, run_id, run_dir, _data = copy
    out = cli("resume", run_id, "learning_rate=0.001")
    assert f"configuration key learning_rate changed: {LR} → 0.001" in out.stderr, out.stderr
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rates = {r["step"]: r["learning_rate"] for r in map(json.loads, lines) if r.get("kind") == "train"}
    assert rates[9] == pytest.approx(LR * 4 / 12)  # before the resume: the old base
    assert [rates[s] for s in (10, 11, 12)] == pytest.approx([0.001 * (13 - s) / 12 for s in (10, 11, 12)]), rates
    assert "lr 0.00025 " in (run_dir / "train.log").read_text()


def test_a_new_learning_rate_and_schedule_on_resume_give_the_new_rate(copy):
    cli, run_id, run_dir, _data = copy
    cli("resume", run_id, "learning_rate=0.001", "lr_scheduler=constant")
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rates = [r["learning_rate"] for r in map(json.loads, lines) if r.get("kind") == "train" and r["step"] > 9]
    assert rates == pytest.approx([0.001] * 3), rates


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_data_that_does_not_load_is_refused_by_resume_as_by_train_with_nothing_changed(copy, tmp_path):
    """`resume` took data `train --check` refuses (an unsupported suffix, a bad JSON line, the run's own file
    broken since it stopped), said "resumed", and the trainer failed seconds later; the bad `dataset=` stayed
    in config.yaml, so the next plain resume failed too. Now each is refused, exit 2, naming file and line,
    with nothing started and nothing in the run directory changed; a plain resume then trains. CPU only."""
    cli, run_id, run_dir, data = copy
    moved = tmp_path / "data.moved"
    shutil.copy(data, moved)
    bad = write_rows(tmp_path / "bad.jsonl", 3)
    with open(bad, "a", encoding="utf-8") as handle:
        handle.write("not json\n")
    before = snapshot(run_dir)
    for args, problem in (((f"dataset={moved}",), f"{moved}: unsupported file type '.moved'"),
                          ((f"dataset={bad}",), f"{bad}:4: invalid JSON")):
        refused = cli("resume", run_id, *args, check=False)
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert problem in refused.stderr and "resumed" not in refused.stderr, refused.stderr
        assert snapshot(run_dir) == before
    original = data.read_bytes()
    with open(data, "a", encoding="utf-8") as handle:
        handle.write("not json\n")
    refused = cli("resume", run_id, check=False)
    assert refused.returncode == 2 and f"{data}:13: invalid JSON" in refused.stderr, refused.stderr
    assert snapshot(run_dir) == before and RunDirectory(run_dir).status().status == "failed"
    data.write_bytes(original)
    cli("resume", run_id)
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"


@pytest.mark.parametrize("key", ["lora_rank", "max_seq_len"])
def test_a_hand_edited_config_yaml_is_checked_on_resume_as_train_checks_it(copy, key):
    """`lora_rank: banana` in the run's config.yaml was taken with a "changed" warning, `max_seq_len: banana`
    said "resumed" and the trainer died on int('banana'). Both are refused with the file, line and key."""
    cli, run_id, run_dir, _data = copy
    path = run_dir / "config.yaml"
    lines = path.read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if text.startswith(f"{key}:"))
    lines[line - 1] = f"{key}: banana"
    path.write_text("\n".join(lines) + "\n")
    before = snapshot(run_dir)
    refused = cli("resume", run_id, check=False)
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert f"{path}:{line}: {key}: got 'banana'; expected an integer" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr and "resumed" not in refused.stderr
    assert snapshot(run_dir) == before and RunDirectory(run_dir).status().status == "failed"


def test_a_dataset_change_is_told_against_the_last_start_or_resume_and_says_so(copy, tmp_path):
    """fingerprint.json is recorded again by a resume that meets a change (each change is told once), yet
    the warnings said "since the run started": back on its original file after a resume on another, the run
    was told that file was "new since the run started". They say what they compare with now."""
    from core.config import load_run_config

    _cli, _run_id, run_dir, data = copy
    other = write_rows(tmp_path / "other.jsonl", 5)
    run = RunDirectory(run_dir)
    first = prepare_resume(run, config=load_run_config(run.config_path, [f"dataset={other}"]))
    assert f"dataset file {other} is new since the run last started or resumed; the rest of the run trains on " \
           "it too" in [n.text() for n in first.notices]
    run.write_status("failed", "the attempt on other.jsonl failed")  # as if that attempt had run and failed
    back = prepare_resume(run, config=load_run_config(run.config_path, [f"dataset={data}"]))
    texts = [n.text() for n in back.notices]
    assert f"dataset file {data} is new since the run last started or resumed; the rest of the run trains on " \
           "it too" in texts, texts
    assert not any("since the run started" in text for text in texts)


def test_a_checkpoint_a_resume_went_back_past_is_not_the_newest_after_the_new_branch_fails(copy):
    """``resume --checkpoint 6`` of a run with checkpoint-9 (the user left that branch, say its loss diverged)
    keeps checkpoint-9 on disk; the new branch fails at step 8, before it saves. The run's newest state is
    then checkpoint-6 of the branch it trained on: a plain ``resume`` (and status, merge, export) took
    checkpoint-9, jumping back to the branch the user left, whose steps 7-9 the metrics no longer hold."""
    cli, run_id, run_dir, _data = copy
    out = cli("resume", run_id, "--checkpoint", "6", TUNEDECK_INJECT_OOM_AT_STEP="8")
    assert "checkpoint-9" in out.stderr  # kept, and said so
    assert cli.wait_status(run_id, {"finished", "failed", "crashed", "stopped"})["status"] == "failed"
    assert (run_dir / "checkpoints" / "checkpoint-9" / COMPLETE_MARKER).is_file()
    run = RunDirectory(run_dir)
    assert cli.status(run_id)["last_checkpoint_step"] == 6
    assert run.last_sound_checkpoint().step == 6
    plan = prepare_resume(run)
    assert plan.step == 6
    told = [n.text() for n in plan.notices]
    assert any("checkpoint-9 is passed over" in n and f"tunedeck resume {run_id} --checkpoint 9" in n
               for n in told), told
    assert not any("newer checkpoints stay" in n for n in told), told
    assert run.left_behind() == {9: 6}


def test_rotation_removes_a_left_behind_checkpoint_before_one_of_the_current_branch(copy):
    """Checkpoints 6, 9 and a checkpoint-10 of the same branch (save_total_limit 2; 10 stands for one saved
    on another schedule, copied from 9 with its marker and time), then ``resume --checkpoint 6``: 10 is left
    behind. The new branch's checkpoint-9 made three: rotation counted checkpoint-10 as the newest and removed
    checkpoint-6, the current branch's, keeping the abandoned 10. Now checkpoint-10 goes, with an event saying
    it was left behind (back to 6), and 6 and 9 stay."""
    cli, run_id, run_dir, _data = copy
    shutil.copytree(run_dir / "checkpoints" / "checkpoint-9", run_dir / "checkpoints" / "checkpoint-10")
    cli("resume", run_id, "--checkpoint", "6", TUNEDECK_INJECT_OOM_AT_STEP="11")
    assert cli.wait_status(run_id, {"finished", "failed", "crashed", "stopped"})["status"] == "failed"
    steps = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").iterdir())
    assert steps == [6, 9], steps
    removed = [(Path(e["path"]).name, e["why"], e.get("back")) for e in events(run_dir, "checkpoint_removed")]
    assert ("checkpoint-10", "left_behind", 6) in removed, removed
    assert not any(name == "checkpoint-6" for name, _why, _back in removed), removed
    assert RunDirectory(run_dir).last_sound_checkpoint().step == 9


def test_an_explicit_resume_of_a_left_behind_checkpoint_makes_it_current_again(copy):
    """After ``resume --checkpoint 6`` left checkpoint-9 behind, ``resume --checkpoint 9`` goes back to that
    branch: checkpoint-9 is the run's newest state again (status, rotation), not still "left behind"."""
    cli, run_id, run_dir, _data = copy
    cli("resume", run_id, "--checkpoint", "6", TUNEDECK_INJECT_OOM_AT_STEP="8")
    assert cli.wait_status(run_id, {"finished", "failed", "crashed", "stopped"})["status"] == "failed"
    run = RunDirectory(run_dir)
    assert run.left_behind() == {9: 6}
    plan = prepare_resume(run, step=9)
    assert plan.step == 9
    assert run.left_behind() == {}
    assert run.last_complete_checkpoint().step == 9


def test_left_behind_follows_the_branches_back_from_the_newest():
    """Branches by time: 3, 6, 9 written (t 1-3); resume to 6 (t 4), the new branch writes 7, 8 (t 5-6);
    resume --checkpoint 9 (t 7): 9 and what led to it are current, 7 and 8 are left behind by that resume.
    A resume whose checkpoint time is not recorded falls back to the branch just before it."""
    from core.runs.checkpoints import Checkpoint, left_behind_steps

    written = {3: 1.0, 6: 2.0, 9: 3.0, 7: 5.0, 8: 6.0, 10: 8.0}
    found = [Checkpoint(step, Path(f"checkpoint-{step}"), True) for step in sorted(written)]
    when = {c.path: written[c.step] for c in found}
    assert left_behind_steps(found[:-1], [(4.0, 6, 2.0)], when.get) == {9: 6}
    assert left_behind_steps(found, [(4.0, 6, 2.0), (7.0, 9, 3.0)], when.get) == {7: 9, 8: 9}
    assert left_behind_steps(found[:-1], [(4.0, 6, None)], when.get) == {9: 6}
    assert left_behind_steps(found, [], when.get) == {}


def test_a_resume_with_another_batch_is_refused_with_the_numbers_and_the_same_batch_resumes(copy):
    """`resume RUN micro_batch_size=8` of a run at step 9 with 4 × 1 a step was taken: the trainer places the
    data and the LR schedule by the step count, so step 9 read as 72 samples where 36 were seen (epoch 3 →
    6 of these 12 rows), half of what was left skipped, and the only word was "micro_batch_size changed".
    It is refused with the numbers and the ways out, nothing changed; the same samples a step with another
    micro-batch (2 × 2) resumes, and its first step trains on from the checkpoint."""
    cli, run_id, run_dir, _data = copy
    config_before = (run_dir / "config.yaml").read_text()
    record_before = json.loads((run_dir / "run.json").read_text())
    refused = cli("resume", run_id, "micro_batch_size=8", check=False)
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    text = " ".join(refused.stderr.split())
    assert text.startswith(f"tunedeck: run {run_id} was not resumed, nothing was changed: micro_batch_size × "
                           "gradient_accumulation goes from 4 × 1 = 4 to 8 × 1 = 8 samples a step"), text
    assert "checkpoint 9 has seen about 36 samples (4.5 steps of 8)" in text, text
    assert "jump from epoch 3 to epoch 6" in text, text
    assert f"tunedeck resume {run_id} micro_batch_size=4 gradient_accumulation=1" in text, text
    refused = cli("resume", run_id, "micro_batch_size=2", check=False)
    assert refused.returncode == 2 and "(or micro_batch_size=2 gradient_accumulation=2: the same samples a " \
        "step" in " ".join(refused.stderr.split()), refused.stderr
    assert (run_dir / "config.yaml").read_text() == config_before
    assert json.loads((run_dir / "run.json").read_text()) == record_before
    assert RunDirectory(run_dir).status().status == "failed" and not events(run_dir, "config_overridden")

    out = cli("resume", run_id, "micro_batch_size=2", "gradient_accumulation=2")
    assert "micro_batch_size changed: 4 → 2" in out.stderr, out.stderr
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    status = cli.status(run_id)
    assert (status["step"], status["total_steps"]) == (12, 12), status


def test_a_resume_that_changes_what_decides_the_total_shows_it_unknown_until_the_trainer_counts_it(copy):
    """The run (max_steps 12) resumed with epochs 5 and no max_steps: until the new trainer has loaded and
    counted the data, `status` and `runs` said "9/12", the given-up attempt's total, which no longer holds.
    Now "9/?" (--json: total_steps null); a max_steps given on resume is the total at once."""
    cli, run_id, run_dir, _data = copy
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    del cfg["max_steps"]
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**cfg, "epochs": 5}))
    run = RunDirectory(run_dir)
    assert prepare_resume(run).step == 9
    status = cli.status(run_id)
    assert (status["step"], status["total_steps"]) == (9, None), status
    assert "9/?" in cli("status", run_id).stdout
    assert "9/?" in cli("runs").stdout

    record = json.loads((run_dir / "run.json").read_text())
    record["resumes"][-1]["total_steps"] = 15  # as a resume with max_steps=15 records it
    (run_dir / "run.json").write_text(json.dumps(record))
    assert cli.status(run_id)["total_steps"] == 15


def test_a_resume_that_changes_the_chat_template_shows_the_total_unknown_until_the_trainer_counts_it(copy):
    """The run as if started with epochs (no max_steps), resumed with thinking changed: the chat template renders
    every sample again (longer or shorter: more or fewer past max_seq_len, cut or dropped), so the samples of an
    epoch and the step total may change, yet `status` kept "9/12", the given-up attempt's total, as for no
    change at all. Now "9/?" until the trainer has counted, as for the other keys that decide the total. CPU."""
    cli, run_id, run_dir, _data = copy
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    del cfg["max_steps"]
    cfg["epochs"] = 100
    fingerprint = json.loads((run_dir / "fingerprint.json").read_text())
    keys = fingerprint["config"]["keys"]
    keys.pop("max_steps", None)
    keys["epochs"] = 100  # the run was started so: only thinking differs from what it trained with
    (run_dir / "fingerprint.json").write_text(json.dumps(fingerprint))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**cfg, "thinking": not keys.get("thinking")}))
    plan = prepare_resume(RunDirectory(run_dir))
    assert plan.step == 9
    assert [n.params["key"] for n in plan.notices if n.key == "resume.config_changed"] == ["thinking"], plan.notices
    status = cli.status(run_id)
    assert (status["step"], status["total_steps"]) == (9, None), status
    assert "9/?" in cli("status", run_id).stdout


def test_a_new_save_and_logging_interval_on_resume_is_the_one_the_trainer_keeps(copy):
    """`resume RUN save_steps=2 logging_steps=2` was written to config.yaml, but the trainer took the
    intervals back from the checkpoint's trainer_state.json (save_steps 3, logging_steps 1): checkpoints
    went on landing every 3 steps and every step was logged. The run resumes at step 9 (max_steps 12): the
    new intervals save at 10 and 12 (12, the last step, is saved and logged whatever the interval) and log
    at 10 and 12, not 11. CPU only."""
    cli, run_id, run_dir, _data = copy
    out = cli("resume", run_id, "save_steps=2", "logging_steps=2")
    assert "configuration key save_steps changed: 3 → 2" in out.stderr, out.stderr
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    saved = [e["step"] for e in events(run_dir, "checkpoint_saved")]
    assert saved[-2:] == [10, 12] and 11 not in saved, saved
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    logged = [r["step"] for r in map(json.loads, lines) if r.get("kind") == "train" and r["step"] > 9]
    assert logged == [10, 12], logged
