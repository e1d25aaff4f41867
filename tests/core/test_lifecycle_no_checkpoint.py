"""A run with no complete checkpoint: what merge, chat, evaluate, export, serve and resume advise fits the
run's state. Tiny model, CPU, real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from core.runs.liveness import effective_status
from core.runs.run_dir import RunDirectory
from tests.core.test_runs_detached import write_config, write_dataset

ROOT = Path(__file__).resolve().parents[2]


def _tunedeck(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, input="Hi\n\n", capture_output=True,
                          text=True, timeout=180,
                          env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})


def test_advice_for_a_run_without_checkpoint_fits_whether_it_is_live_or_ended(tmp_path):
    """A run stopped before its first checkpoint was told "wait until it saves one (save_steps) or resume
    it" by merge, chat, evaluate, export and serve; a resume then said there is no checkpoint to resume
    from. A live run is told to wait for save_steps; an ended one, that there is nothing to load nor to
    resume, and the command that starts it anew (its own config.yaml, which that command accepts). All of them
    exit 2, a request that cannot be, as resume did (the others exited 1, as for a merge that failed)."""
    home = tmp_path / "home"
    config = write_config(tmp_path / "run.yaml", write_dataset(tmp_path / "data.jsonl"), method="lora",
                          max_steps=3000, save_steps=1000)
    started = _tunedeck(home, "train", str(config))
    assert started.returncode == 0, started.stderr
    run = RunDirectory(home / "runs" / started.stdout.strip())
    deadline = time.monotonic() + 180
    while not run.latest_metrics():  # a step done: training, no checkpoint for ~1000 steps
        assert time.monotonic() < deadline and effective_status(run).active, run.log_path.read_text()[-2000:]
        time.sleep(0.2)
    live = _tunedeck(home, "merge", run.id)
    assert live.returncode == 2, live.stderr  # nothing to merge: a request that cannot be, as resume says
    assert live.stderr == f"tunedeck: run {run.id} has no complete checkpoint yet (it is running); wait until " \
                          "it saves one (save_steps)\n", live.stderr

    stopped = _tunedeck(home, "stop", run.id, "--force")
    assert stopped.returncode == 0 and run.status().status == "stopped", stopped.stderr
    ended = (f"tunedeck: run {run.id} ended (stopped) without a complete checkpoint, so there is nothing to load "
             f"and nothing to resume from; start it anew with 'tunedeck train {run.config_path}'\n")
    for command in ("merge", "chat", "evaluate", "export", "serve"):
        proc = _tunedeck(home, command, run.id)
        assert proc.returncode == 2 and proc.stderr == ended, (command, proc.returncode, proc.stderr[-2000:])
    resumed = _tunedeck(home, "resume", run.id)
    assert resumed.returncode == 2 and "no complete checkpoint" in resumed.stderr, resumed.stderr  # a user error
    assert resumed.stderr.rstrip().endswith(f"start it anew with 'tunedeck train {run.config_path}'"), resumed.stderr
    assert run.status().status == "stopped"  # nothing changed
    anew = _tunedeck(home, "train", str(run.config_path), "--check")  # the advice works as given
    assert anew.returncode == 0, anew.stderr


def test_resume_of_a_run_stopped_before_its_first_step_starts_it_again_from_step_0(tmp_path, monkeypatch):
    """A run stopped while it loaded (before its first optimizer step) has no checkpoint: `tunedeck resume`
    told the user to `train` its config again, a new run. Now it starts again from step 0 in the same run
    folder: the same id, config.yaml and event history, and trains to the end. CPU only
    (CUDA_VISIBLE_DEVICES empty), tiny model, real processes; the stop before the first step is written as
    the trainer writes it (a real one would race the tiny model's first step)."""
    from core.i18n import Message
    from core.runs.lifecycle import load_run_file, prepare_run
    from core.runs.run_dir import STOPPED
    from tests.core.test_runs_detached import Cli, train_losses

    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    config = write_config(tmp_path / "run.yaml", write_dataset(tmp_path / "data.jsonl"), max_steps=3, save_steps=10)
    run = prepare_run(load_run_file(config, warn=lambda _text: None).config, ["tunedeck", "train", str(config)],
                      warn=lambda _text: None)
    run.append_event("stopped", reason="signal")
    run.write_status(STOPPED, Message("train.stopped_before_start"))
    before = run.config_path.read_text()
    cli = Cli(home)
    resumed = cli("resume", run.id, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == run.id and f"started run {run.id} again from step 0" in resumed.stderr
    assert cli.wait_status(run.id, {"finished", "failed", "crashed"})["status"] == "finished", \
        run.log_path.read_text()[-2000:]
    assert sorted(train_losses(run.path)) == [1, 2, 3]
    assert run.config_path.read_text() == before
    from core.runs.jsonl import iter_records

    assert any(e.get("event") == "stopped" for e in iter_records(run.events_path))  # the history is kept
    assert [a.get("resume_from") for a in run.record()["attempts"]] == [None]
