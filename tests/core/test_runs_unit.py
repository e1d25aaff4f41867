"""Run directories, JSONL tails, checkpoints, liveness, lookup and log following — no training here."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.runs.checkpoints import COMPLETE_MARKER, finalize_checkpoint, list_checkpoints, rotate_checkpoints
from core.runs.control import RunControlError, prepare_resume, request_stop
from core.runs.jsonl import append_jsonl, iter_records, last_record
from core.runs.launch import create_run, new_run_id
from core.runs.listing import RunNotFound, list_runs, resolve_run
from core.runs.liveness import effective_status
from core.runs.logs import last_lines
from core.runs.run_dir import CRASHED, FAILED, RUNNING, STOPPED, STOPPING, RunDirectory
from core.runs.states import can_resume
from core.secrets import REDACTED, scrub_argv, scrub_env
from tests.users import as_nobody, skip_unless_root_can_drop

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


class _Config:
    """Stands in for RunConfig where only to_dict/save matter (RunConfig itself is tested elsewhere)."""

    def __init__(self, **values):
        self.values = {"name": "qwen-lora", "model": "Qwen/Qwen2.5-0.5B", "method": "lora", **values}

    def to_dict(self):
        return dict(self.values)

    def save(self, path):
        import yaml

        Path(path).write_text(yaml.safe_dump(self.values))


def _run(home: Path) -> RunDirectory:
    return create_run(_Config(), ["tunedeck", "train", "x.yaml", "hf_token=abc"], gpus=[])


def test_jsonl_tail_skips_torn_last_line_and_reads_backwards(tmp_path):
    path = tmp_path / "m.jsonl"
    append_jsonl(path, {"kind": "header", "schema": 1})
    for step in range(1, 20001):
        append_jsonl(path, {"kind": "train", "step": step, "loss": 1.0 / step})
    append_jsonl(path, {"kind": "eval", "step": 20000, "eval_loss": 0.5})
    with open(path, "ab") as handle:
        handle.write(b'{"kind": "train", "step": 20001, "lo')  # a writer caught mid-line
    assert last_record(path, lambda r: r["kind"] == "train")["step"] == 20000
    assert last_record(path)["kind"] == "eval"
    assert last_record(path, lambda r: r["kind"] == "header")["schema"] == 1  # far back: widened blocks
    assert sum(1 for _ in iter_records(path)) == 20002
    other = tmp_path / "nan.jsonl"
    append_jsonl(other, {"loss": float("nan")})  # NaN is not JSON: stored as null
    assert json.loads(other.read_text())["loss"] is None


def test_a_record_after_a_dead_writers_torn_line_is_kept_and_a_short_write_is_carried_on(home, monkeypatch):
    """A trainer killed (or a disk filled up) mid-line leaves metrics.jsonl ending in a torn record; the
    resume's ``resumed`` record appended after it was glued onto it and lost, so the dead attempt's steps
    past the checkpoint were taken as the run's figures."""
    run = _run(home)
    run.append_metrics({"kind": "header", "schema": 1, "total_steps": 100})
    for step in range(1, 13):
        run.append_metrics({"kind": "train", "step": step, "total_steps": 100, "loss": 1.0})
    with open(run.metrics_path, "ab") as handle:
        handle.write(b'{"kind": "train", "step": 13, "total_steps": 100, "lo')  # its writer killed here
    run.append_metrics({"kind": "resumed", "step": 10, "total_steps": 100, "checkpoint": "checkpoint-10"})
    kinds = [(r["kind"], r.get("step")) for r in iter_records(run.metrics_path)]
    assert kinds[-1] == ("resumed", 10), kinds[-3:]
    assert run.latest_metrics()["step"] == 10  # not the dead attempt's 12
    run.append_metrics({"kind": "train", "step": 11, "total_steps": 100, "loss": 0.5})
    assert run.latest_metrics()["step"] == 11 and run.latest_metrics()["loss"] == 0.5

    real_write = os.write  # a disk that takes 7 bytes a write: the rest is written, not dropped
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    run.append_event("checkpoint_saved", step=20)
    assert [r["event"] for r in iter_records(run.events_path)][-1] == "checkpoint_saved"


def test_checkpoint_finalize_rotate_and_incomplete_ones_ignored(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    for step in (10, 20, 30):
        final = _sound_checkpoint(root, step)
        assert (final / COMPLETE_MARKER).is_file() and not (root / f"checkpoint-{step}.tmp").exists()
    (root / "checkpoint-40.tmp").mkdir()  # being written when the machine died
    (root / "checkpoint-50").mkdir()  # renamed but no marker
    (root / "checkpoint-5").mkdir()  # an old leftover without marker
    found = list_checkpoints(root)
    assert [(c.step, c.complete) for c in found] == [(5, False), (10, True), (20, True), (30, True),
                                                     (40, False), (50, False)]
    removed = rotate_checkpoints(root, keep=2)
    assert sorted(p.name for p in removed) == ["checkpoint-10", "checkpoint-5"]
    complete = [c.step for c in list_checkpoints(root) if c.complete]
    assert complete == [20, 30]


def test_rotation_never_keeps_a_damaged_checkpoint_in_place_of_a_sound_one(home):
    """checkpoint-804 truncated, the resume fell back to 800 and saved 810: with a limit of 2 rotation
    removed the sound 800 and kept the damaged 804 (one usable checkpoint left). Now the damaged one
    does not count, is removed as superseded (with its reason), and status names the newest sound one."""
    run = _run(home)
    for step in (800, 804):
        _sound_checkpoint(run, step)
    damaged = run.checkpoints_dir / "checkpoint-804" / "model.safetensors"
    os.truncate(damaged, 10)
    assert run.last_complete_checkpoint().step == 804  # the marker alone vouches for it
    assert run.last_sound_checkpoint().step == 800
    assert [c.step for c in run.sound_checkpoints()] == [800]  # newest first, the damaged one left out
    told = []
    assert rotate_checkpoints(run.checkpoints_dir, keep=2, on_remove=lambda p, why: told.append(why)) == []
    assert [c.step for c in run.checkpoints()] == [800, 804]  # newer than every sound one: left alone
    _sound_checkpoint(run, 810)
    removed = rotate_checkpoints(run.checkpoints_dir, keep=2, on_remove=lambda p, why: told.append((p.name, why)))
    assert [p.name for p in removed] == ["checkpoint-804"] and told == [("checkpoint-804", "damaged")]
    assert [c.step for c in run.checkpoints()] == [800, 810]
    _sound_checkpoint(run, 820)
    rotate_checkpoints(run.checkpoints_dir, keep=2)
    assert [c.step for c in run.checkpoints()] == [810, 820]
    os.truncate(run.checkpoints_dir / "checkpoint-820" / "model.safetensors", 10)
    assert run.last_sound_checkpoint().step == 810
    env = {**os.environ, "TUNEDECK_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "core", "status", run.id, "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout)["last_checkpoint_step"] == 810, out.stderr


def test_create_run_is_private_and_scrubs_secrets(home, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    monkeypatch.setenv("MODELSCOPE_API_TOKEN", "ms_secret_value")
    run = _run(home)
    assert run.path.parent == home / "runs"
    assert (run.path.stat().st_mode & 0o777) == 0o700
    for name in ("config.yaml", "run.json", "status.json"):
        assert ((run.path / name).stat().st_mode & 0o777) == 0o600, name
    text = run.record_path.read_text()
    assert "hf_secret_value" not in text and "ms_secret_value" not in text and "abc" not in text
    record = run.record()
    assert record["env"]["HF_TOKEN"] == REDACTED
    assert record["argv"][-1] == f"hf_token={REDACTED}"
    assert record["config_summary"]["method"] == "lora"
    assert run.status().status == "queued"


def test_scrubbing_helpers():
    assert scrub_env({"HF_TOKEN": "x", "PATH": "/bin"}) == {"HF_TOKEN": REDACTED, "PATH": "/bin"}
    assert scrub_argv(["--hub-token", "s3cret", "lr=1", "api_key=k"]) == ["--hub-token", REDACTED, "lr=1",
                                                                           f"api_key={REDACTED}"]


def test_run_id_shape():
    run_id = new_run_id("Qwen2.5 0.5B / LoRA")
    date, hm, *rest = run_id.split("-")
    assert len(date) == 8 and len(hm) == 4 and rest[-1].isalnum() and len(rest[-1]) == 4
    assert "qwen2-5-0-5b-lora" in run_id


def test_a_chinese_run_name_stays_in_the_id_and_finds_the_run(home):
    """``name: 中文任务`` made the id ``…-run-4296``: ASCII letters only were kept, so every Chinese name read
    'run' in the Runs screen and 'tunedeck status 中文任务' found nothing. Letters of any script stay now; the
    readable part stops at 24 cells (a Chinese character is two)."""
    from core.paths import runs_dir
    from core.runs.listing import name_part
    from core.text_width import cell_len

    run_id = new_run_id("中文任务")
    assert name_part(run_id).startswith("中文任务-")
    long = new_run_id("客服 对话 微调 第二版 实验一二三四五六七八")
    assert cell_len(name_part(long)) <= 24 + 5 and name_part(long).startswith("客服-对话-微调-")
    (runs_dir() / run_id).mkdir(parents=True)
    (runs_dir() / run_id / "run.json").write_text(json.dumps({"id": run_id}), encoding="utf-8")
    assert resolve_run("中文任务").id == run_id
    assert new_run_id("___").split("-")[2] == "run"  # nothing readable: 'run', as before


def test_active_run_without_supervisor_is_crashed_and_persisted(home):
    run = _run(home)
    run.update_record(attempts=[{"number": 1, "started": "2026-01-01T00:00:00Z", "resume_from": None}])
    _sound_checkpoint(run, 5)
    run.write_status(RUNNING)
    status = effective_status(run)
    assert status.status == CRASHED and "tunedeck resume" in status.reason
    assert json.loads(run.status_path.read_text())["status"] == CRASHED  # persisted
    attempt = run.record()["attempts"][0]  # the attempt kill -9 left open is closed with it
    assert attempt["status"] == CRASHED and attempt["ended"] and attempt["number"] == 1
    assert not run.close_open_attempt("killed")  # closed once: a later end does not rewrite it
    assert list_runs()[0].status == CRASHED


def _hold_lock(run: RunDirectory) -> subprocess.Popen:
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(run.lock_path)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_lock_holder_keeps_run_alive_and_its_death_makes_it_crashed(home):
    import psutil

    run = _run(home)
    holder = _hold_lock(run)
    try:
        run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()})
        run.write_status(RUNNING)
        assert effective_status(run).status == RUNNING
        # A recorded pid whose start time differs is a recycled pid: not our supervisor.
        run.update_record(supervisor={"pid": holder.pid, "start_time": 12345.0})
        assert effective_status(run).status == CRASHED
        run.write_status(RUNNING)
        run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()})
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert effective_status(run).status == CRASHED


@pytest.mark.parametrize("trainer_said", [None, "stopped"])
def test_a_forced_stop_that_a_reader_looks_at_midway_is_stopped_and_its_attempt_killed(home, monkeypatch, trainer_said):
    """A reader (the app, `tunedeck runs`) that looked between the kill and the stop's own record found the
    supervisor gone and closed the attempt as crashed; the stop then wrote "stopped", and `status --json`
    said stopped at the top and crashed in its last attempt. Where the trainer had written its outcome.json
    and then hung (``trainer_said``), the reader recorded that verdict, its attempt and its event: the attempt
    read "stopped", not "killed", and the stop event was there twice. The user asked for the stop and it
    killed: the run is stopped, its attempt killed, one stop event, whoever looked in between (the reader
    leaves the run to the stop while it kills: it sees the status as it was). A real process holds the lock
    as the supervisor; the reader is a real `tunedeck status` run right after the kill. No GPU."""
    import psutil

    from core.runs import control

    run = _run(home)
    holder = _hold_lock(run)  # the supervisor: holds the lock, recorded as the run's
    run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()},
                      attempts=[{"number": 1, "started": "2026-01-01T00:00:00Z", "resume_from": None}])
    run.write_status(RUNNING)
    if trainer_said is not None:  # the trainer's verdict on attempt 1, written before it hung
        run.outcome_path.write_text(json.dumps({"status": trainer_said, "attempt": 1}), encoding="utf-8")
    seen = []
    real_kill = control._kill_trees

    def kill_then_a_reader_looks(run, pids):
        real_kill(run, pids)
        reader = subprocess.run([sys.executable, "-m", "core", "status", run.id, "--json"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60, env={**os.environ})
        seen.append(json.loads(reader.stdout)["status"])

    monkeypatch.setattr(control, "_kill_trees", kill_then_a_reader_looks)  # the reader comes in between
    try:
        result = request_stop(run, force=True)
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
    assert seen == [RUNNING]  # the reader did look in between, and left the run to the stop
    assert result.forced and result.status.status == STOPPED and effective_status(run).status == STOPPED
    [attempt] = run.record()["attempts"]
    assert attempt["status"] == "killed" and attempt["ended"] and attempt["exit_code"] is None, attempt
    ends = [r["event"] for r in iter_records(run.events_path) if r["event"] in ("stopped", "finished", "failed")]
    assert ends == ["stopped"], ends
    assert run.record()["killing"] is None  # the stop is over: readers judge the run again


@pytest.mark.parametrize("ending", ["finished", "killed"])
def test_a_stop_whose_supervisor_ends_before_the_signal_says_how_the_run_ended(home, monkeypatch, capsys, ending):
    """`tunedeck stop RUN` checks that the supervisor may be signalled, writes "stopping", then sends SIGTERM;
    a supervisor that ended in between (its run just finished, or it died) made os.kill raise
    ProcessLookupError: a traceback, and the run was left "stopping" for a stop that reached no one. Now the
    stop says how the run ended (exit 0, as for a supervisor found gone before it). The supervisor is a real
    process holding the run's lock; it is made to end at that exact point (after "stopping" is written, before
    the signal) by the test's hook on the run's status write. No GPU."""
    import psutil

    from core import cli
    from core.runs.run_dir import FINISHED, STOPPING

    run = _run(home)
    holder = _hold_lock(run)
    run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()},
                      attempts=[{"number": 1, "started": "2026-01-01T00:00:00Z", "resume_from": None}])
    run.write_status(RUNNING)
    real_transition = RunDirectory.transition
    ended = []

    def supervisor_ends_meanwhile(self, status, reason="", only_from=frozenset()):
        written = real_transition(self, status, reason, only_from=only_from)
        if status == STOPPING and not ended:  # between "stopping" and the SIGTERM
            if ending == "finished":  # its last step done: it records the end, as the supervisor does, and exits
                self.write_status(FINISHED)
            holder.kill()
            holder.wait()  # reaped: its pid names no process any more
            ended.append(status)
        return written

    monkeypatch.setattr(RunDirectory, "transition", supervisor_ends_meanwhile)
    try:
        code = cli.main(["stop", run.id])
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    err = capsys.readouterr().err
    assert ended == [STOPPING]  # the supervisor did end at that point
    assert code == 0 and "Traceback" not in err, err
    final = FINISHED if ending == "finished" else CRASHED
    assert err == f"run {run.id}: {final}\n", err  # as for a supervisor found gone before the stop
    assert run.status().status == final and run.last_event("stopped") is None


def test_status_and_runs_say_unknown_figures_with_the_apps_dash(home, capsys):
    """`status` printed `step -/-` and `checkpoint -` (ASCII hyphens) for a run stopped before its first
    step, where every other figure it does not know, and the rest of the app, show `–` (core.units.UNKNOWN)."""
    from core import cli
    from core.units import UNKNOWN

    run = _run(home)
    run.write_status(STOPPED, "stopped before a checkpoint could be saved")
    assert cli.main(["status", run.id]) == 0
    fields = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert fields["step"] == f"{UNKNOWN}/{UNKNOWN}" and fields["checkpoint"] == UNKNOWN, fields
    assert fields["loss"] == UNKNOWN and "-" not in fields["step"] + fields["checkpoint"]
    assert cli.main(["runs"]) == 0
    [header, row] = capsys.readouterr().out.splitlines()
    assert row.split()[3] == UNKNOWN, row  # the step column


def test_a_second_plain_stop_is_recorded_as_such_not_as_stop_force(home, capsys):
    """A second `tunedeck stop RUN` while the first was still stopping killed the run and recorded "killed
    by 'tunedeck stop --force'", though --force was never given. It says what happened now."""
    import psutil

    from core import cli

    run = _run(home)
    code = ("import fcntl, os, signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # a supervisor busy saving its checkpoint
            f"fd = os.open({str(run.lock_path)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()},
                          attempts=[{"number": 1, "started": "2026-01-01T00:00:00Z", "resume_from": None}])
        run.write_status(RUNNING)
        assert cli.main(["stop", run.id]) == 0 and run.status().status == "stopping"
        capsys.readouterr()
        assert cli.main(["stop", run.id, "--json"]) == 0  # again, while it is stopping: killed
        result = json.loads(capsys.readouterr().out)
        holder.wait(timeout=30)  # killed (and reaped by the stop: no exit status is left for this wait)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert result["forced"] and result["status"] == STOPPED, result
    assert result["reason"] == "killed by a second stop while it was still stopping (no checkpoint saved at the end)"
    assert "--force" not in run.status().reason and run.last_event()["reason"] == "second_stop"
    assert run.record()["attempts"][-1]["status"] == "killed"


def _deny_reading(monkeypatch, path: Path):
    """Reading ``path`` as text raises PermissionError, as for a run.json whose permissions changed (this box
    runs as root, where chmod denies nothing); the function returned makes it readable again."""
    real_read_text = Path.read_text

    def read_text(self, *args, **kwargs):
        if self == path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    return lambda: monkeypatch.setattr(Path, "read_text", real_read_text)


def test_read_record_says_why_run_json_cannot_be_read_and_the_list_still_lists_the_run(home, monkeypatch):
    """record() gave {} for bad JSON and raised PermissionError, which stopped the Runs list and the
    dashboard's watcher. read_record() says why (the dashboard shows it); the list's readers use it."""
    run = _run(home)
    assert run.read_record() == (run.record(), "") and run.record()["id"] == run.id
    run.record_path.write_text("[1, 2]", encoding="utf-8")
    assert run.read_record() == ({}, "not a JSON object")
    run.record_path.write_text("{not json", encoding="utf-8")
    assert run.read_record() == ({}, "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)")
    allow_reading = _deny_reading(monkeypatch, run.record_path)
    assert run.read_record() == ({}, "Permission denied")
    assert [summary.id for summary in list_runs()] == [run.id]  # listed, without its record's facts
    allow_reading()
    run.record_path.unlink()
    assert run.read_record() == ({}, "")  # not recorded yet: no problem to say


def test_status_of_a_run_whose_run_json_does_not_read_shows_what_it_can_and_says_why(home, monkeypatch, capsys):
    """`tunedeck status RUN` read run.json with record(): permission denied ended in a traceback. It shows
    the status and metrics, then one line naming the file, why and what to do, and exits 1; `runs` still
    lists the run (exit 0)."""
    from core import cli

    run = _run(home)
    run.write_status(STOPPED, "stopped at step 3")
    append_jsonl(run.metrics_path, {"schema": 1, "kind": "header", "total_steps": 9})
    append_jsonl(run.metrics_path, {"kind": "train", "step": 3, "total_steps": 9, "loss": 2.5})
    allow_reading = _deny_reading(monkeypatch, run.record_path)
    assert cli.main(["status", run.id]) == 1
    out = capsys.readouterr()
    assert "stopped at step 3" in out.out and "3/9" in out.out and "2.5000" in out.out
    assert "Traceback" not in out.err and len(out.err.splitlines()) == 1, out.err
    assert out.err.startswith(f"tunedeck: {run.record_path} cannot be read (Permission denied): ")
    assert "permissions" in out.err and "JSON" in out.err
    assert cli.main(["status", run.id, "--json"]) == 1
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["record_error"] == "Permission denied" and data["step"] == 3 and data["attempts"] == []
    assert str(run.record_path) in out.err
    assert cli.main(["runs"]) == 0
    out = capsys.readouterr()
    assert run.id in out.out and out.err == ""
    assert cli.main(["runs", "--json"]) == 0
    assert [row["id"] for row in json.loads(capsys.readouterr().out)] == [run.id]
    allow_reading()
    run.record_path.write_text("{not json", encoding="utf-8")
    assert cli.main(["status", run.id]) == 1
    assert "cannot be read (Expecting property name" in capsys.readouterr().err
    run.record_path.write_text(json.dumps({"id": run.id, "gpus": [0]}), encoding="utf-8")
    assert cli.main(["status", run.id, "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["record_error"] is None and out.err == ""


def test_a_crashed_run_without_a_checkpoint_is_not_offered_a_resume(home):
    """A run dir with a corrupt status.json read "crashed — … continue with 'tunedeck resume ID'", and that
    resume failed with "no complete checkpoint": without one (and steps trained: else a resume starts it
    again from step 0) the reason says to start it again."""
    run = _run(home)
    run.append_metrics({"kind": "train", "step": 3, "loss": 1.0})
    run.status_path.write_text("{not json")
    status = effective_status(run)
    assert status.status == CRASHED
    assert "tunedeck resume" not in status.reason and f"tunedeck train {run.config_path}" in status.reason
    with pytest.raises(RunControlError, match="no complete checkpoint") as caught:
        prepare_resume(run)
    assert caught.value.code == 2  # a user error (it was 1)


def test_a_resume_without_a_checkpoint_is_refused_before_anything_is_looked_at(home):
    """`tunedeck resume` of a stopped CPU run without a checkpoint, beside a live CPU run, first warned
    "run … is training on this box's CPU too: both share it and go slower", then refused for the missing
    checkpoint. The refusal comes first, with nothing before it."""
    from core.runs.control import refuse_unresumable

    run = _run(home)
    run.append_metrics({"kind": "train", "step": 3, "loss": 1.0})  # trained: else a resume starts it from step 0
    run.write_status(STOPPED)
    with pytest.raises(RunControlError, match="no complete checkpoint") as caught:
        refuse_unresumable(run)
    assert f"tunedeck train {run.config_path}" in str(caught.value)
    assert caught.value.code == 2  # a user error (it was 1)
    (run.checkpoints_dir / "checkpoint-7").mkdir(parents=True)  # no COMPLETE marker: not one either
    with pytest.raises(RunControlError, match="no complete checkpoint"):
        refuse_unresumable(run)


def test_a_second_resume_is_told_another_resume_is_starting_the_run(home):
    from core.i18n import Message
    from core.runs.run_dir import QUEUED, STARTING

    run = _run(home)
    run.write_status(QUEUED, Message("runs.reason_resuming", step=5))  # what the first resume wrote
    with pytest.raises(RunControlError, match="already being resumed by another command"):
        prepare_resume(run)
    holder = _hold_lock(run)  # the first resume's supervisor, starting its attempt
    try:
        import psutil

        run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()},
                          attempts=[{"number": 2, "started": "x", "resume_from": "/ckpt/checkpoint-5"}])
        run.write_status(STARTING)
        with pytest.raises(RunControlError, match="already being resumed"):
            prepare_resume(run)
        run.write_status(RUNNING)
        with pytest.raises(RunControlError, match="still active"):  # running: the usual refusal
            prepare_resume(run)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_a_second_resume_is_told_another_resume_is_restarting_the_run_from_step_0(home):
    """A run that ended before its first step is resumed from step 0 (no checkpoint: its attempt's
    ``resume_from`` is empty). While that attempt's supervisor starts, a second resume was told the generic
    "still active; stop it first" (only attempts resuming from a checkpoint counted) instead of "already
    being resumed". A first attempt starting is still "still active". No GPU, no trainer started."""
    from core.runs.run_dir import STARTING

    run = _run(home)
    holder = _hold_lock(run)  # the restart's supervisor, starting its attempt
    try:
        import psutil

        supervisor = {"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()}
        first = {"number": 1, "started": "x", "resume_from": None, "ended": "y", "status": "stopped"}
        run.update_record(supervisor=supervisor, attempts=[first, {"number": 2, "started": "z", "resume_from": None}])
        run.write_status(STARTING)
        with pytest.raises(RunControlError, match="already being resumed"):
            prepare_resume(run)
        run.update_record(attempts=[{"number": 1, "started": "x", "resume_from": None}])  # train's own start
        with pytest.raises(RunControlError, match="still active"):
            prepare_resume(run)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_logs_refuses_a_negative_line_count(home):
    run = _run(home)
    run.log_path.write_text("[rank0] one\n")
    env = {**os.environ, "TUNEDECK_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "core", "logs", run.id, "-n", "-5"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert "-n/--lines must be 0 or more, not -5" in out.stderr


def test_finished_run_is_never_relabelled(home):
    run = _run(home)
    run.write_status("finished")
    assert effective_status(run).status == "finished"


def test_resolve_by_id_prefix_path_and_errors(home):
    first = _run(home)
    second = _run(home)
    assert resolve_run(first.id).path == first.path
    assert resolve_run(str(second.path)).path == second.path.resolve()
    assert resolve_run(first.id[:-1]).path == first.path or first.id[:-1] == second.id[:-1]
    with pytest.raises(RunNotFound, match="matches 2 runs"):
        resolve_run(first.id[:8])
    with pytest.raises(RunNotFound, match="no run matches"):
        resolve_run("nothing-like-this")


def _bare_runs(home: Path, *ids: str) -> None:
    """Run directories with only a run.json: all the resolver looks at."""
    for run_id in ids:
        (home / "runs" / run_id).mkdir(parents=True)
        (home / "runs" / run_id / "run.json").write_text(json.dumps({"id": run_id}))


def test_resolve_by_the_name_the_runs_screen_shows(home):
    """The Runs screen shows ``long-demo-9be2`` for ``20261206-1021-long-demo-9be2``: every command takes it,
    its start and an end of the id from a dash; the whole id, then a whole name, win over partial matches."""
    _bare_runs(home, "20261206-1021-long-demo-9be2", "20261206-1105-long-demo-77aa", "20261207-0900-qwen-lora-ab12",
               "20261208-0900-qwen-lora-ab12-x-cd34")
    runs = home / "runs"
    assert resolve_run("long-demo-9be2").path == runs / "20261206-1021-long-demo-9be2"
    assert resolve_run("9be2").path == runs / "20261206-1021-long-demo-9be2"  # an end, from a dash
    assert resolve_run("demo-77aa").path == runs / "20261206-1105-long-demo-77aa"
    assert resolve_run("long-demo-7").path == runs / "20261206-1105-long-demo-77aa"  # the start of a name
    assert resolve_run("20261206-10").path == runs / "20261206-1021-long-demo-9be2"  # the start of an id, as before
    # A whole name wins over a longer one it starts: qwen-lora-ab12 is one run's name, another's start.
    assert resolve_run("qwen-lora-ab12").path == runs / "20261207-0900-qwen-lora-ab12"
    with pytest.raises(RunNotFound, match=r"'long-demo' matches 2 runs \(20261206-1105-long-demo-77aa, "
                                          r"20261206-1021-long-demo-9be2\); type more of the id or name"):
        resolve_run("long-demo")
    with pytest.raises(RunNotFound, match="no run matches 'be2'"):
        resolve_run("be2")  # an end only from a dash: not any tail of the id
    with pytest.raises(RunNotFound, match="no run matches"):
        resolve_run("-")


def test_an_ambiguous_reference_says_how_many_match_and_how_many_are_not_shown(home):
    ids = [f"20261206-10{minute:02d}-demo-{minute:04x}" for minute in range(12)]
    _bare_runs(home, *ids)
    with pytest.raises(RunNotFound) as caught:
        resolve_run("2026")
    message = str(caught.value)
    assert "'2026' matches 12 runs" in message and "and 7 more not shown" in message
    assert ", ".join(reversed(ids[-5:])) in message  # the newest five, newest first
    assert ids[0] not in message
    _bare_runs(home, "20261207-0000-other-aaaa")
    with pytest.raises(RunNotFound) as caught:
        resolve_run("20261206-100")  # ten match: five shown, five more
    assert "matches 10 runs" in str(caught.value) and "and 5 more not shown" in str(caught.value)


def test_stop_and_resume_refusals(home):
    run = _run(home)
    run.append_metrics({"kind": "train", "step": 3, "loss": 1.0})  # trained, no checkpoint: nothing to go on from
    run.write_status(STOPPED)
    with pytest.raises(RunControlError, match="not running"):
        request_stop(run)
    with pytest.raises(RunControlError, match="no complete checkpoint"):
        prepare_resume(run)
    marker_less = run.checkpoints_dir / "checkpoint-7"
    marker_less.mkdir(parents=True)
    with pytest.raises(RunControlError, match="no complete checkpoint"):
        prepare_resume(run)
    tmp = run.checkpoints_dir / "checkpoint-5.tmp"
    tmp.mkdir()
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (tmp / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    (tmp / "trainer_state.json").write_text('{"global_step": 5}')
    (tmp / "optimizer.pt").write_bytes(b"o")
    (tmp / "scheduler.pt").write_bytes(b"s")
    finalize_checkpoint(tmp, 5)
    assert prepare_resume(run).checkpoint.endswith("checkpoint-5")
    assert run.status().status == "queued"
    assert run.record()["resumes"][-1]["step"] == 5
    run.write_status("finished")
    with pytest.raises(RunControlError, match="finished"):
        prepare_resume(run)


def test_stop_and_resume_refusals_exit_2_through_the_cli(home):
    """`tunedeck stop` of a run that is not running and `tunedeck resume` of a finished or a running run
    exited 1, the code of a stop or a resume that failed: scripts retried a request that cannot be. Now
    they exit 2, as README says (a request that cannot be), with the same one line. No GPU, no trainer: the
    running run's supervisor is a process that holds the run's lock."""
    import psutil

    env = {**os.environ, "TUNEDECK_HOME": str(home)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)

    run = _run(home)
    run.append_metrics({"kind": "train", "step": 3, "loss": 1.0})
    run.write_status(STOPPED)
    out = cli("stop", run.id)
    assert out.returncode == 2 and out.stderr == f"tunedeck: run {run.id} is not running (status: stopped)\n", \
        (out.returncode, out.stderr)
    run.write_status("finished")
    out = cli("resume", run.id)
    assert out.returncode == 2 and out.stderr == f"tunedeck: run {run.id} has finished; start a new run to " \
                                                 "train further\n", (out.returncode, out.stderr)
    holder = _hold_lock(run)  # its live supervisor
    try:
        run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()})
        run.write_status(RUNNING)
        out = cli("resume", run.id)
        assert out.returncode == 2 and "is still active (status: running); stop it first" in out.stderr, \
            (out.returncode, out.stderr)
        assert effective_status(run).status == RUNNING and holder.poll() is None  # nothing was touched
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def _hold_lock_as_nobody(run: RunDirectory) -> subprocess.Popen:
    """A supervisor of another user: takes the run's lock as root, then becomes ``nobody`` (uid 65534)."""
    skip_unless_root_can_drop()
    code = (
        "import fcntl, os, time\n"
        f"fd = os.open({str(run.lock_path)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.setgid(65534)\n"
        "os.setuid(65534)\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _login_name(uid: int) -> str:
    """The name a stop's refusal gives ``uid``: its passwd entry's (``nobody``, ``nfsnobody`` on older RHEL), else
    the number (a box without an entry for 65534)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv(1)")
def test_a_stop_of_another_users_run_is_refused_with_its_owner_and_leaves_it_running(home):
    """`tunedeck stop RUN` of a run whose supervisor is another user's (a shared box, a run started with
    sudo): os.kill's PermissionError was a traceback, after the run had been written "stopping" (the app
    then offered a second stop that kills); --force's psutil AccessDenied was one too. Now both are refused
    (exit 2) saying which run, which process, whose it is and what to do, and the run stays running. Real
    processes, no GPU: the supervisor is a process holding the run's lock as ``nobody``; the stopping CLI is
    root without CAP_KILL (setpriv), for which the kernel refuses the signal as for any other user."""
    import psutil

    dropped = subprocess.run(["setpriv", "--bounding-set=-kill", "--inh-caps=-kill", "true"], capture_output=True,
                             text=True, timeout=60)
    if dropped.returncode != 0:  # a container's root without CAP_SETPCAP: setpriv cannot take CAP_KILL away
        pytest.skip(f"setpriv cannot drop CAP_KILL here: {dropped.stderr.strip()}")
    env = {**os.environ, "TUNEDECK_HOME": str(home)}
    run = _run(home)
    holder = _hold_lock_as_nobody(run)
    try:
        run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()})
        run.write_status(RUNNING)
        for extra in ([], ["--force"]):
            out = subprocess.run(["setpriv", "--bounding-set=-kill", "--inh-caps=-kill", sys.executable, "-m",
                                  "core", "stop", run.id, *extra], cwd=ROOT, env=env, capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 2 and "Traceback" not in out.stderr, (extra, out.returncode, out.stderr)
            owner = _login_name(65534)
            assert out.stderr == (f"tunedeck: run {run.id} cannot be stopped by root: its process {holder.pid} "
                                  f"belongs to user {owner} (Operation not permitted); nothing was sent and the run "
                                  f"goes on. Stop it as {owner} or as root (sudo tunedeck stop {run.path})\n"), out.stderr
            assert run.status().status == RUNNING and effective_status(run).status == RUNNING, (extra, run.status())
            assert holder.poll() is None and run.last_event("stopped") is None
        # The command said, run as sudo runs it: root with CAP_KILL (this test), its environment reset (no
        # TUNEDECK_HOME; root's own home, whose data root holds no such run). "sudo tunedeck stop ID" was not found.
        roots_home = home.parent / "roots-home"
        roots_home.mkdir()
        sudo_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(roots_home), "LANG": "C.UTF-8"}
        command = out.stderr.rsplit("(sudo tunedeck ", 1)[1].rstrip(")\n").split(" ")
        done = subprocess.run([sys.executable, "-m", "core", *command], cwd=ROOT, env=sudo_env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (command, done.stderr)
        assert run.status().status == "stopping"
        holder.wait(timeout=60)  # SIGTERM's default: it exits
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become nobody")
def test_a_stop_of_a_run_started_with_sudo_says_to_stop_it_as_root_once(tmp_path):
    """A user's stop of a run whose supervisor is root's (started with sudo), the case the refusal is mostly met
    in, read "… belongs to user root (…). Stop it as root or as root (sudo tunedeck stop ID)". It says root once.
    The stop's check (signal 0, as ``request_stop`` makes it) runs in a forked child that became ``nobody``
    (uid 65534); the supervisor is this test's process, root's. No GPU."""
    import psutil  # noqa: F401 - imported as root: the child, nobody, may not read the interpreter's folders

    from core.runs import control

    run = RunDirectory(tmp_path / "20261207-1700-sudo")
    supervisor = os.getpid()

    def job() -> dict:
        try:
            control._may_signal(run, supervisor)
        except RunControlError as exc:
            return {"said": str(exc), "code": exc.code}
        return {"said": None}

    result = as_nobody(job)
    assert "error" not in result, result["error"]
    user = _login_name(65534)
    assert result == {"said": f"run {run.id} cannot be stopped by {user}: its process {supervisor} belongs to root "
                              "(Operation not permitted); nothing was sent and the run goes on. Stop it as root "
                              f"(sudo tunedeck stop {run.path})", "code": 2}, result


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become nobody")
def test_a_forced_stop_refused_after_it_killed_some_processes_says_which(tmp_path):
    """`tunedeck stop --force` checks every process of the run (signal 0), then kills them one by one; one
    refused after the check (a security module, a process whose user changed meanwhile) was told as "nothing
    was sent and the run goes on", though the processes before it had been killed. Now it says which were
    killed and which not (exit 1: the stop failed partway). Real processes, no GPU: the stop runs in a forked
    child that became ``nobody``; the supervisor is ``nobody``'s, the trainer ``nobody``'s by its real and saved
    uid (so the check passes) and becomes root between the check and the kill (a gate on the check's hook)."""
    import threading

    import psutil  # noqa: F401 - imported as root: the child, nobody, may not read the interpreter's folders

    from core.runs import control

    skip_unless_root_can_drop()  # the processes below become nobody themselves
    run = RunDirectory(tmp_path / "20261207-1900-partly")
    supervisor = subprocess.Popen([sys.executable, "-c", "import os, time\nos.setgid(65534)\nos.setuid(65534)\n"
                                   "print('ready', flush=True)\ntime.sleep(120)\n"], stdout=subprocess.PIPE, text=True)
    trainer = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                                "os.setresuid(65534, 0, 65534)\n"  # nobody's to a signal; root still in effect
                                "print('ready', flush=True)\nsys.stdin.readline()\n"
                                "os.setresuid(0, 0, 0)\nprint('root', flush=True)\ntime.sleep(120)\n"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert supervisor.stdout.readline().strip() == "ready" and trainer.stdout.readline().strip() == "ready"
        threading.Thread(target=supervisor.wait, daemon=True).start()  # reaped once killed, as init reaps one
        real_check = control._may_signal

        def job() -> dict:
            def check_then_the_trainer_becomes_root(run, pid):
                real_check(run, pid)
                if pid == trainer.pid:  # the last check: between the checks and the kills
                    trainer.stdin.write("go\n")
                    trainer.stdin.flush()
                    assert trainer.stdout.readline().strip() == "root"

            control._may_signal = check_then_the_trainer_becomes_root  # the forked child's own module
            try:
                control._kill_trees(run, [supervisor.pid, trainer.pid])
            except RunControlError as exc:
                return {"said": str(exc), "code": exc.code}
            return {"said": None}

        result = as_nobody(job)
        assert "error" not in result, result["error"]
        assert trainer.poll() is None  # refused: it runs on
        assert supervisor.wait(timeout=30) == -signal.SIGKILL
        assert result == {"said": f"run {run.id} was only partly stopped: it killed process(es) {supervisor.pid}, "
                                  f"but signalling process(es) {trainer.pid} was refused (access denied), "
                                  "so those may run on and the run is not marked stopped. Kill the rest as the "
                                  f"user who started it or as root (sudo tunedeck stop --force {run.path})",
                          "code": 1}, result
    finally:
        for proc in (supervisor, trainer):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def test_a_run_that_ended_before_its_first_step_is_resumed_from_step_0_in_the_same_folder(home):
    """A run stopped (or crashed) while it loaded, before its first optimizer step, has no checkpoint: its
    resume said "start it anew with 'tunedeck train'", a new run. Now the resume starts it again from step 0
    (no checkpoint given to the trainer) in the same run directory; the crashed reason offers the resume. A
    run that trained steps without a checkpoint is still refused. No GPU, no trainer started."""
    from core.i18n import Message
    from core.runs.listing import summarize
    from core.runs.liveness import crashed_reason

    run = _run(home)
    config = run.config_path.read_text()
    run.append_metrics({"schema": 1, "kind": "header", "total_steps": 10})
    run.write_status(STOPPED, Message("train.stopped_before_start"))
    assert summarize(run).resumable and not summarize(run).has_checkpoint
    assert "tunedeck resume" in crashed_reason(run).english()
    plan = prepare_resume(run)
    assert plan.checkpoint is None and plan.step == 0
    assert run.status().status == "queued" and "step 0" in run.status().reason
    assert run.record()["resumes"][-1]["checkpoint"] is None and run.record()["resumes"][-1]["step"] == 0
    assert run.config_path.read_text() == config and run.metrics_header()["total_steps"] == 10
    with pytest.raises(RunControlError, match="already being resumed"):  # a second one at the same time
        prepare_resume(run)

    trained = _run(home)
    trained.append_metrics({"kind": "train", "step": 3, "loss": 1.0})
    trained.write_status(STOPPED)
    assert not summarize(trained).resumable
    with pytest.raises(RunControlError, match="no complete checkpoint"):
        prepare_resume(trained)


def test_a_run_of_another_host_is_neither_called_crashed_nor_signalled_from_here(home, capsys):
    """A data root shared between nodes (NFS): a run whose run.json names another host has a supervisor
    pid of that host. Here it was looked up as a local pid: gone, so the run was written crashed, and a stop
    would signal whatever local process had that pid. Now its status stays as recorded and says the host,
    and a stop (forced too) is refused, saying where to stop it. No GPU; no process of the run here."""
    from core import cli

    run = _run(home)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that names no process of this box
    run.update_record(host="node-b", supervisor={"pid": gone.pid, "start_time": 1.0})
    run.write_status(RUNNING)
    assert effective_status(run).status == RUNNING
    for args in (["stop", run.id], ["stop", run.id, "--force"]):
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert f"run {run.id} runs on host node-b" in err and f"ssh node-b tunedeck stop {run.id}" in err, err
    assert cli.main(["status", run.id]) == 0
    out = capsys.readouterr().out
    assert "on host node-b, not this one" in out and "running" in out, out
    assert run.status().status == RUNNING


def test_a_stopped_run_of_another_host_is_not_offered_nor_resumed_here(home, capsys):
    """A data root shared between nodes: a run that node-b stopped, with a checkpoint (or ended before its
    first step), was offered a resume here (the Runs list's and dashboard's u, ``resumable`` in runs --json),
    and the resume started a trainer on this box with node-b's GPU numbers from its run.json. Now it is not
    offered and ``tunedeck resume`` refuses (exit 2, nothing written), saying where to resume it. No GPU."""
    from core import cli
    from core.i18n import Message
    from core.runs.listing import summarize

    run = _run(home)
    run.update_record(host="node-b", supervisor={"pid": 2 ** 22 + 1, "start_time": 1.0})
    run.write_status(STOPPED, Message("train.stopped_before_start"))  # resumable from step 0 on its host
    assert not summarize(run).resumable
    before = (run.status().status, run.record().get("resumes"))
    assert cli.main(["resume", run.id]) == 2
    err = capsys.readouterr().err
    assert f"run {run.id} ran on host node-b" in err and f"ssh node-b tunedeck resume {run.id}" in err, err
    assert (run.status().status, run.record().get("resumes")) == before  # nothing changed
    run.update_record(host=None)
    assert summarize(run).resumable  # this host's own: offered, as before


def test_runs_and_status_json_say_the_host_a_run_runs_on(home, capsys):
    """A data root shared between nodes: ``status`` said a run is on host node-b, ``stop`` refused for it,
    but ``status --json`` and ``runs --json`` had no key for its host (only the supervisor's, in status, and
    none in runs), so a script could not tell which runs are this box's to stop. Now both carry ``host``
    (run.json's); null where run.json does not say. No GPU; no process of the run here."""
    from core import cli
    from core.runs.listing import summarize

    run = _run(home)
    run.update_record(host="node-b", supervisor={"pid": 2 ** 22 + 1, "start_time": 1.0})
    run.write_status(RUNNING)
    assert cli.main(["status", run.id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["host"] == "node-b"
    assert cli.main(["runs", "--json"]) == 0
    assert [r["host"] for r in json.loads(capsys.readouterr().out)] == ["node-b"]
    run.update_record(host=None)
    assert summarize(run).host is None


def test_a_run_of_another_host_gone_silent_with_no_lock_held_is_crashed(home, monkeypatch):
    """The same host check must not keep a dead run running for ever: a container replaced on a rented box
    gets a new host name, so its old run reads as another host's. No lock held anywhere and silent past the
    stall threshold and ``FOREIGN_DEAD_S`` (its last status dated back, a state not a speed): crashed, as any
    dead run; silent past the stall threshold only (a long load on its host), left as recorded. No GPU."""
    from core.runs.heartbeat import STALL_FLOOR_ENV
    from core.runs.liveness import FOREIGN_DEAD_S

    run = _run(home)
    run.update_record(host="container-before-restart", supervisor={"pid": 2 ** 22 + 1, "start_time": 1.0})
    run.write_status(RUNNING)
    assert effective_status(run).status == RUNNING  # beating as far as its files tell (just written)
    monkeypatch.setenv(STALL_FLOOR_ENV, "0.000001")
    assert effective_status(run).status == RUNNING  # stalled by the threshold, not silent long enough for dead
    recorded = json.loads(run.status_path.read_text())
    recorded["updated_ts"] -= FOREIGN_DEAD_S + 60
    run.status_path.write_text(json.dumps(recorded))
    assert effective_status(run).status == CRASHED
    assert run.status().status == CRASHED


def _sound_checkpoint(run: RunDirectory | Path, step: int) -> Path:
    """A checkpoint that passes ``verify_checkpoint`` (tiny files of the right shapes)."""
    root = run.checkpoints_dir if isinstance(run, RunDirectory) else run
    tmp = root / f"checkpoint-{step}.tmp"
    tmp.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (tmp / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    (tmp / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp / "optimizer.pt").write_bytes(b"o")
    (tmp / "scheduler.pt").write_bytes(b"s")
    return finalize_checkpoint(tmp, step)


def test_after_a_resume_the_lost_attempts_steps_are_dropped_and_the_last_known_figures_shown(home, capsys):
    """Killed at step 875, resumed from checkpoint-800: until the new attempt logs, status and runs show
    step 800 with the last known loss and rate (step 800's: the steps after the checkpoint are lost) and no
    ETA. They showed 875 and "ETA 22:14" once, then "loss –" while the dashboard showed the last known loss:
    one rule now, the dashboard's (``core.watch.resumes``). Then the new attempt's own figures. The whole
    history stays in metrics.jsonl."""
    from core.cli import dispatch
    from core.runs.listing import summarize

    run = _run(home)
    old = "2026-01-01T00:00:00Z"  # long before the resume
    append_jsonl(run.metrics_path, {"schema": 1, "kind": "header", "total_steps": 3000})
    for step, loss in ((800, 0.9265), (875, 0.8)):
        append_jsonl(run.metrics_path, {"kind": "train", "step": step, "total_steps": 3000, "loss": loss,
                                        "tokens_per_s": 100.0 + step, "eta_s": 80000.0, "time": old})
        append_jsonl(run.metrics_path, {"kind": "eval", "step": step, "eval_loss": loss + 1, "time": old})
    _sound_checkpoint(run, 800)
    run.write_status(RUNNING)
    assert summarize(run).step == 875 and summarize(run).status == CRASHED  # the supervisor is gone
    prepare_resume(run)
    summary = summarize(run)  # queued: the new supervisor has not started the trainer yet
    assert (summary.step, summary.total_steps, summary.loss, summary.eta_s, summary.tokens_per_s) == \
        (800, 3000, 0.9265, None, 900.0)
    later = "2999-01-01T00:00:00Z"
    append_jsonl(run.metrics_path, {"kind": "resumed", "step": 800, "total_steps": 3000, "time": later})
    run.write_status(FAILED, "failed before its first step")  # the attempt died before it logged
    summary = summarize(run)
    assert (summary.step, summary.loss, summary.eta_s, summary.tokens_per_s, summary.steady_tokens_per_s) == \
        (800, 0.9265, None, 900.0, 900.0)
    assert dispatch(["runs", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["step"], row["loss"], row["tokens_per_s"], row["eta_s"]) == (800, 0.9265, 900.0, None)
    assert dispatch(["status", run.id]) == 0
    assert "0.9265" in capsys.readouterr().out
    assert run.latest_eval()["eval_loss"] == pytest.approx(1.9265)  # step 875's eval was lost with its step
    append_jsonl(run.metrics_path, {"kind": "eval", "step": 800, "eval_loss": 1.5, "time": later})
    append_jsonl(run.metrics_path, {"kind": "train", "step": 804, "total_steps": 3000, "loss": 0.5,
                                    "tokens_per_s": 90.0, "eta_s": 9000.0, "time": later})
    run.write_status(RUNNING)
    with _supervisor_stand_in(run):
        summary = summarize(run)
        assert (summary.step, summary.loss, summary.eta_s) == (804, 0.5, 9000.0)
    assert [r["step"] for r in iter_records(run.metrics_path) if r.get("kind") == "train"] == [800, 875, 804]


def _supervisor_stand_in(run: RunDirectory):
    from tests.fixtures.watch.run_builder import SupervisorStandIn

    return SupervisorStandIn(run.path)


def test_log_tail_gives_the_last_complete_lines_and_where_following_goes_on(tmp_path):
    # Following itself (complete lines, truncation) is in test_runs_logs_follow.py and test_watch_follow.py.
    path = tmp_path / "train.log"
    path.write_bytes(b"".join(f"line {i}\n".encode() for i in range(100)) + b"partial")
    lines, offset = last_lines(path, 3)
    assert lines == ["line 97", "line 98", "line 99"]
    assert offset == os.path.getsize(path) - len(b"partial")


def test_runs_and_status_show_the_steady_tokens_per_s_not_the_last_intervals(home, capsys):
    """The list and ``tunedeck status`` showed the last logged interval's tokens/s: 3,100 for a run at
    10,000 whose last interval held a checkpoint save (and whose first, its warm-up, read 800). They show
    the rate since the first interval now (the save's time counts: it is the run's). --json gives it as
    ``steady_tokens_per_s`` beside ``tokens_per_s``, which keeps the last interval's rate as it always had
    (renaming that key broke users' scripts)."""
    from core.cli import dispatch
    from core.runs.listing import summarize

    run = _run(home)
    run.write_status(STOPPED, "stopped at step 6")
    append_jsonl(run.metrics_path, {"schema": 1, "kind": "header", "total_steps": 9})
    append_jsonl(run.metrics_path, {"kind": "train", "step": 1, "total_steps": 9, "loss": 2.5,
                                    "tokens_per_s": 800.0, "elapsed_s": 5.0, "tokens_seen": 4000})
    for step in range(2, 6):
        append_jsonl(run.metrics_path, {"kind": "train", "step": step, "total_steps": 9, "loss": 2.5,
                                        "tokens_per_s": 10000.0, "elapsed_s": 5.0 + (step - 1),
                                        "tokens_seen": 4000 + 10000 * (step - 1)})
    # the interval of the save: 2 s for 6,200 tokens; since step 1, 46,200 tokens in 6 s
    append_jsonl(run.metrics_path, {"kind": "train", "step": 6, "total_steps": 9, "loss": 2.5,
                                    "tokens_per_s": 3100.0, "elapsed_s": 11.0, "tokens_seen": 50200})
    assert summarize(run).steady_tokens_per_s == pytest.approx(7700.0)
    assert dispatch(["runs", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["steady_tokens_per_s"] == pytest.approx(7700.0) and row["tokens_per_s"] == 3100.0
    assert dispatch(["status", run.id, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["steady_tokens_per_s"] == pytest.approx(7700.0) and data["tokens_per_s"] == 3100.0
    assert dispatch(["runs"]) == 0
    listing = capsys.readouterr().out
    assert dispatch(["status", run.id]) == 0
    status = capsys.readouterr().out
    for text in (listing, status):
        assert "7,700" in text and "3,100" not in text, text


def test_an_ended_runs_eta_is_null_in_runs_and_status_json(home, capsys):
    """A stopped, crashed, failed or finished run has no ETA: --json gave the last record's (``stopped eta_s
    1495.9``, finished ``0.0``) while the table and the app showed '–'. An active run keeps its figure."""
    from core.cli import dispatch
    from core.runs.listing import summarize
    from core.runs.run_dir import FAILED, FINISHED, STARTING

    run = _run(home)
    append_jsonl(run.metrics_path, {"schema": 1, "kind": "header", "total_steps": 9})
    append_jsonl(run.metrics_path, {"kind": "train", "step": 3, "total_steps": 9, "loss": 2.5,
                                    "tokens_per_s": 100.0, "eta_s": 1495.9})
    for status in (STOPPED, FAILED, FINISHED, CRASHED):
        run.write_status(status, "")
        assert summarize(run).eta_s is None, status
        assert dispatch(["runs", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)[0]["eta_s"] is None, status
        assert dispatch(["status", run.id, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["eta_s"] is None, status
    from tests.fixtures.watch.run_builder import SupervisorStandIn

    run.write_status(STARTING, "")
    with SupervisorStandIn(run.path):  # a live supervisor: the run stays active
        assert summarize(run).eta_s == 1495.9


def test_the_rendezvous_port_is_picked_as_the_model_servers_are(home, monkeypatch):
    """The supervisor picked torchrun's master port with its own IPv4 socket, a third copy of the free-port
    pick: it goes through core.listen.free_port now (no SO_REUSEADDR, the bind the servers' looks use); a
    port given with --master-port is passed on as it is."""
    from core import listen
    from core.runs.launch import DistributedSettings
    from core.runs.supervisor import CPU_PROCESSES_ENV, trainer_command

    monkeypatch.setenv(CPU_PROCESSES_ENV, "2")  # two CPU processes: torchrun, and a port to give it
    calls, ports = [], []
    real = listen.bind_and_close

    def recorded(*args, **kwargs):
        calls.append((args, kwargs))
        ports.append(real(*args, **kwargs))
        return ports[-1]

    monkeypatch.setattr(listen, "bind_and_close", recorded)
    run = _run(home)
    cmd, nproc, offset = trainer_command(run, None, run.record())
    assert calls == [(("127.0.0.1", 0), {"reuse_address": False})]
    assert (nproc, offset) == (2, 0) and "--master_addr=127.0.0.1" in cmd and f"--master_port={ports[0]}" in cmd
    calls.clear()
    given = create_run(_Config(), ["tunedeck", "train", "x.yaml"], gpus=[],
                       distributed=DistributedSettings(master_port=29611))
    cmd, _, _ = trainer_command(given, None, given.record())
    assert "--master_port=29611" in cmd and calls == []


def test_runs_cli_json_lists_and_status_reports(home):
    run = _run(home)
    run.write_status(STOPPED, "stopped at step 3")
    append_jsonl(run.metrics_path, {"schema": 1, "kind": "header", "total_steps": 9})
    append_jsonl(run.metrics_path, {"kind": "train", "step": 3, "total_steps": 9, "loss": 2.5,
                                    "tokens_per_s": 100.0, "eta_s": 12.0})
    env = {**os.environ, "TUNEDECK_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "core", "runs", "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[0]["id"] == run.id and rows[0]["step"] == 3 and rows[0]["loss"] == 2.5
    for key in ("id", "status", "created", "model", "method", "step", "total_steps", "run_dir", "loss",
                "tokens_per_s", "steady_tokens_per_s", "eta_s", "gpus", "reason"):
        assert key in rows[0]
    out = subprocess.run([sys.executable, "-m", "core", "status", run.id[:-2], "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["status"] == STOPPED
    shown = run.id.split("-", 2)[2]  # the name the Runs screen shows: qwen-lora-ab12
    out = subprocess.run([sys.executable, "-m", "core", "status", shown, "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)["id"] == run.id, out.stderr
    out = subprocess.run([sys.executable, "-m", "core", "stop", run.id], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "not running" in out.stderr  # a request that cannot be (it was 1)
    out = subprocess.run([sys.executable, "-m", "core", "status", "zzz"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no run matches" in out.stderr


def test_logs_follow_of_a_finished_run_prints_everything_and_returns(home):
    run = _run(home)
    run.log_path.write_text("[rank0] one\n[rank0] two\n[supervisor] done\n[rank0] torn")
    run.write_status("finished")
    env = {**os.environ, "TUNEDECK_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "core", "logs", run.id, "-f"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.splitlines() == ["[rank0] one", "[rank0] two", "[supervisor] done"]


def test_demo_detach_then_forced_stop_kills_every_process(home):
    import psutil

    env = {**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)

    out = cli("demo", "--detach", "--json")
    assert out.returncode == 0, out.stderr
    started = json.loads(out.stdout)
    run = RunDirectory(started["run_dir"])
    deadline = time.monotonic() + 120
    while not run.latest_metrics():
        assert time.monotonic() < deadline and effective_status(run).active, run.log_path.read_text()[-2000:]
        time.sleep(0.2)
    record = run.record()
    pids = [record["supervisor"]["pid"], record["trainer"]["pid"]]
    out = cli("stop", run.id, "--force", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["forced"] and result["status"] == STOPPED and "--force" in result["reason"]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids)
    assert effective_status(run).status == STOPPED  # not relabelled crashed afterwards
    attempt = run.record()["attempts"][-1]  # closed, though its supervisor was killed before it could
    assert attempt["status"] == "killed" and attempt["ended"] and attempt["exit_code"] is None


def test_a_cpu_trainer_waits_passively_unless_told_otherwise(tmp_path):
    """Two CPU runs on one box's cores must share them, not spin against each other (OpenMP's default wait)."""
    from core.runs.supervisor import trainer_env

    cpu = trainer_env({"PATH": "/bin"}, tmp_path, 2, [])
    assert cpu["OMP_WAIT_POLICY"] == "PASSIVE" and cpu["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu["TUNEDECK_RUN_DIR"] == str(tmp_path) and cpu["TUNEDECK_ATTEMPT"] == "2" and cpu["PATH"] == "/bin"
    assert trainer_env({"OMP_WAIT_POLICY": "ACTIVE"}, tmp_path, 1, [])["OMP_WAIT_POLICY"] == "ACTIVE"  # the user's
    assert "OMP_WAIT_POLICY" not in trainer_env({}, tmp_path, 1, [0])  # a GPU run's as it was


def test_trainer_gpu_selection_respects_inherited_cuda_visible_devices():
    from core.runs.supervisor import visible_devices

    assert visible_devices([], "0,1") == ""
    assert visible_devices([0, 1], None) == "0,1"
    assert visible_devices([1], "2,3") == "3"
    assert visible_devices([0, 1], "GPU-aaa,GPU-bbb") == "GPU-aaa,GPU-bbb"


def test_supervisor_waits_out_a_brief_lock_holder_but_not_another_supervisor(home):
    from core.runs.supervisor import Supervisor

    run = _run(home)
    holder = _hold_lock(run)  # holds it for a minute: another supervisor
    try:
        assert Supervisor(run).acquire_lock(patience_s=0.3) is False
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    brief = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, time\n"
        f"fd = os.open({str(run.lock_path)!r}, os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(0.5)\n")], stdout=subprocess.PIPE, text=True)
    assert brief.stdout.readline().strip() == "locked"
    supervisor = Supervisor(run)
    try:
        assert supervisor.acquire_lock(patience_s=5.0) is True
    finally:
        brief.wait()
        os.close(supervisor.lock_fd)


def test_only_a_worker_killed_among_torchruns_first_failures_is_named_the_cause(tmp_path):
    """torchrun lists, after the first failures, the workers it stopped itself (SIGTERM, SIGKILL 30 s later):
    those did not cause the failure; a worker a signal killed in the first failures did."""
    from core.i18n import Message
    from core.runs.supervisor import Supervisor

    def summary(*blocks: tuple[int, str, str]) -> list[str]:
        lines = ["core.train.worker FAILED", "Failures:"]
        for rank, when, code in blocks:
            lines += [f"[{rank}]:", f"  time      : 2026-12-07_00:03:{when}", "  host      : box",
                      f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: 4{rank})  ",
                      "  error_file: <N/A>"]
        return lines

    rank0 = "training failed: RuntimeError: boom"
    cases = [
        (summary((1, "10", "-9"), (0, "10", "1")), "rank 1 was killed by SIGKILL"),  # the OOM killer
        (summary((0, "10", "1"), (1, "40", "-9")), None),  # rank 0 failed; torchrun killed rank 1 30 s later
        (summary((0, "10", "1"), (1, "10", "-15")), None),  # torchrun's own SIGTERM
        (summary((0, "10", "1")), None),
    ]
    def judged(lines: list[str], stops: int = 0):
        supervisor = Supervisor(RunDirectory(tmp_path))
        supervisor.stop_requests = stops
        for line in lines:
            supervisor._note_killed_rank(line)
        return supervisor._with_killed_rank("failed", rank0)

    for lines, expected in cases:
        reason = judged(lines)
        if expected is None:
            assert reason == rank0, (lines, reason)
        else:
            assert isinstance(reason, Message) and reason.english().startswith(expected), reason
            assert reason.english().endswith(f"the other ranks failed with it: {rank0}")
    assert judged(cases[0][0], stops=1) == rank0  # our own stop: whatever torchrun lists, the stop ended it


_WRITE_WHILE_STOPPED = """
import signal, sys
from pathlib import Path
from core.runs.run_dir import RunDirectory
from core.runs.supervisor import Supervisor
supervisor = Supervisor(RunDirectory(Path(sys.argv[1])))
signal.signal(signal.SIGTERM, supervisor._on_stop_signal)
supervisor.log("a line the stop comes in the middle of")
print("written", flush=True)
"""


def _signal_pending(pid: int, number: int) -> bool:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return any(int(fields[key], 16) >> (number - 1) & 1 for key in ("SigPnd", "ShdPnd"))


def test_a_stop_signal_in_the_middle_of_a_write_of_train_log_is_recorded_when_the_write_ends(home):
    """flock locks belong to the open file, not the process: the supervisor's stop handler, run between two
    bytecodes of a write that held train.log's lock, wrote its own log line through another open file and
    waited for that lock for ever. The run stayed "stopping", its trainer never told (CI saw a real run's
    stop time out so). Here train.log is a full FIFO: the write holds the lock and cannot end until the
    signal has been taken; then this test drains it, and the stop must be recorded after the line."""
    import contextlib
    import fcntl
    import select

    run = _run(home)
    run.write_status(RUNNING)
    run.log_path.unlink(missing_ok=True)
    os.mkfifo(run.log_path)
    reader = os.open(run.log_path, os.O_RDONLY | os.O_NONBLOCK)
    child = None
    try:
        fcntl.fcntl(reader, fcntl.F_SETPIPE_SZ, 4096)
        writer = os.open(run.log_path, os.O_WRONLY | os.O_NONBLOCK)
        filled = 0
        try:
            while True:
                filled += os.write(writer, b"x" * 4096)
        except BlockingIOError:
            os.close(writer)
        child = subprocess.Popen([sys.executable, "-c", _WRITE_WHILE_STOPPED, str(run.path)], cwd=ROOT,
                                 stdout=subprocess.PIPE, text=True)
        inode = f":{os.stat(run.log_path).st_ino} "
        deadline = time.monotonic() + 120
        while not any(line.split()[4] == str(child.pid) and inode in line for line in open("/proc/locks")):
            assert child.poll() is None and time.monotonic() < deadline, "the write never took train.log's lock"
            time.sleep(0.05)
        child.send_signal(signal.SIGTERM)  # the write holds the lock, blocked on the full FIFO
        while _signal_pending(child.pid, signal.SIGTERM):  # taken: its handler runs before the write goes on
            time.sleep(0.01)
        data = b""
        deadline = time.monotonic() + 120
        while child.poll() is None:
            assert time.monotonic() < deadline, "the supervisor waits for its own lock on train.log"
            if select.select([reader], [], [], 0.2)[0]:
                with contextlib.suppress(BlockingIOError):  # readable as no writer had it open, then one did
                    data += os.read(reader, 65536)
        while chunk := os.read(reader, 65536):
            data += chunk
    finally:
        os.close(reader)
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0 and child.stdout.read() == "written\n"
    assert data[filled:].decode().splitlines() == [
        "[supervisor] a line the stop comes in the middle of",
        "[supervisor] SIGTERM received: asking the trainer to save a checkpoint and stop",
    ]
    assert run.status().status == STOPPING
    assert run.last_event()["event"] == "stop_requested" and run.last_event()["signal"] == "SIGTERM"


def test_hostfile_gives_nodes_master_and_this_machines_rank(tmp_path):
    from core.runs.hostfile import HostfileError, node_rank_of, read_hostfile

    path = tmp_path / "hostfile"
    path.write_text("# two nodes\nnode-a slots=8\n\nnode-b.example.org slots=8  # second\n")
    hosts = read_hostfile(path)
    assert hosts == ["node-a", "node-b.example.org"]
    assert node_rank_of(hosts, {"node-b", "10.0.0.2"}) == 1
    assert node_rank_of(hosts, {"elsewhere"}) is None
    assert node_rank_of(["127.0.0.1"]) == 0  # this machine, found by address
    path.write_text("node-a\nnode-a\n")
    with pytest.raises(HostfileError, match=r"hostfile:2: host node-a is listed twice"):
        read_hostfile(path)


def _set_aside(run: RunDirectory) -> list[Path]:
    return sorted(run.path.glob("run.json.corrupt-*"))


def test_a_record_write_over_a_corrupt_run_json_keeps_the_corrupt_file_aside(home, monkeypatch):
    """update_record merged into record(), which is {} for a run.json that does not parse: the write
    replaced it with the new fields alone and its id, config, GPUs and attempts were gone for good."""
    run = _run(home)
    torn = run.record_path.read_bytes()[:150]  # a torn write: id, created, argv … but not JSON
    run.record_path.write_bytes(torn)
    assert run.close_open_attempt("crashed") is False and run.record_path.read_bytes() == torn  # writes nothing
    assert run.update_record(trainer={"pid": 7}) == {"trainer": {"pid": 7}}
    [kept] = _set_aside(run)
    assert kept.read_bytes() == torn and kept.stat().st_mode & 0o777 == 0o600
    assert json.loads(run.record_path.read_text()) == {"trainer": {"pid": 7}}
    event = run.last_event()
    assert event["event"] == "record_set_aside" and event["path"] == str(kept)
    assert str(run.record_path) in event["reason"] and str(kept) in event["reason"]
    assert event["reason_message"]["key"] == "runs.record_set_aside"
    run.update_record(attempts=[{"number": 1}])  # run.json reads again: nothing more is set aside
    assert _set_aside(run) == [kept] and run.record() == {"trainer": {"pid": 7}, "attempts": [{"number": 1}]}
    run.record_path.write_text("[1, 2]", encoding="utf-8")  # JSON, not a record: kept too, under its own name
    run.update_record(trainer=None)
    assert len(_set_aside(run)) == 2 and b"[1, 2]" in [p.read_bytes() for p in _set_aside(run)]
    assert run.last_event()["reason"].count("not a JSON object") == 1
    real_read_bytes = Path.read_bytes

    def read_bytes(self):
        if self == run.record_path:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    before = real_read_bytes(run.record_path)
    with pytest.raises(PermissionError):  # one that cannot be read at all is not written over either
        run.update_record(trainer={"pid": 8})
    assert real_read_bytes(run.record_path) == before and len(_set_aside(run)) == 2


def test_a_run_json_corrupted_mid_training_loses_nothing_and_the_supervisor_ends_the_run(home):
    """A real supervisor (in its own process) with a stand-in trainer that tears run.json once the
    supervisor has recorded it, then finishes: the attempt's end is recorded, the run ends finished, and
    the torn file is kept aside and said in the events."""
    run = _run(home)
    trainer = (
        "import json, pathlib, time\n"
        "record = pathlib.Path('run.json')\n"
        "deadline = time.monotonic() + 120\n"
        "while 'trainer' not in json.loads(record.read_text()) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "record.write_text('{\"id\": \"torn')\n"
        "pathlib.Path('outcome.json').write_text(json.dumps({'status': 'finished'}))\n"
        "print('trained', flush=True)\n")
    supervise = (
        "import sys\n"
        "from core.runs import supervisor\n"
        f"supervisor.trainer_command = lambda run, resume_from, record: ([sys.executable, '-c', {trainer!r}], 1, 0)\n"
        f"sys.exit(supervisor.main([{str(run.path)!r}]))\n")
    out = subprocess.run([sys.executable, "-c", supervise], cwd=ROOT, env={**os.environ, "TUNEDECK_HOME": str(home)},
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr + run.log_path.read_text()
    assert run.status().status == "finished"
    assert "[rank0] trained" in run.log_path.read_text()
    [kept] = _set_aside(run)
    assert kept.read_text() == '{"id": "torn'
    attempts = run.record()["attempts"]
    assert attempts[-1]["status"] == "finished" and attempts[-1]["exit_code"] == 0
    events = [e["event"] for e in iter_records(run.events_path)]
    assert events[-2:] == ["record_set_aside", "finished"], events


def test_a_run_json_that_stops_reading_mid_training_does_not_end_the_run(home):
    """The supervisor's record writes after the trainer started raised the PermissionError of a run.json
    that no longer reads: the supervisor died (taking its trainer with it) and a finished attempt was
    recorded as failed. It is said in train.log now and the run ends as the trainer says. (Root reads any
    file: the denial is patched into the supervisor's process, from the trainer's first line on.)"""
    run = _run(home)
    trainer = (
        "import json, pathlib\n"
        "pathlib.Path('deny').touch()\n"
        "pathlib.Path('outcome.json').write_text(json.dumps({'status': 'finished'}))\n"
        "print('trained', flush=True)\n")
    supervise = (
        "import pathlib, sys\n"
        "from core.runs import supervisor\n"
        "real = pathlib.Path.read_bytes\n"
        "def read_bytes(self):\n"
        "    if self.name == 'run.json' and (self.parent / 'deny').exists():\n"
        "        raise PermissionError(13, 'Permission denied', str(self))\n"
        "    return real(self)\n"
        "pathlib.Path.read_bytes = read_bytes\n"
        f"supervisor.trainer_command = lambda run, resume_from, record: ([sys.executable, '-c', {trainer!r}], 1, 0)\n"
        f"sys.exit(supervisor.main([{str(run.path)!r}]))\n")
    before = run.record_path.read_bytes()
    out = subprocess.run([sys.executable, "-c", supervise], cwd=ROOT, env={**os.environ, "TUNEDECK_HOME": str(home)},
                         capture_output=True, text=True, timeout=180)
    log = run.log_path.read_text()
    assert out.returncode == 0, out.stderr + log
    assert run.status().status == "finished" and "[rank0] trained" in log
    assert f"[supervisor] cannot record attempts in {run.record_path}: [Errno 13] Permission denied" in log, log
    assert [e["event"] for e in iter_records(run.events_path)][-1] == "finished"
    record = json.loads(run.record_path.read_bytes())
    assert json.loads(before)["id"] == record["id"] == run.id and record["attempts"][-1].get("ended") is None


_STAND_IN_SUPERVISOR = (
    "import pathlib, sys\n"
    "from core.runs import supervisor\n"
    "real = pathlib.Path.read_text\n"
    "def read_text(self, *args, **kwargs):\n"  # root reads any file: the denial is patched in, as asked
    "    if self.name == 'run.json' and (self.parent / 'deny').exists():\n"
    "        raise PermissionError(13, 'Permission denied', str(self))\n"
    "    return real(self, *args, **kwargs)\n"
    "pathlib.Path.read_text = read_text\n"
    "trainer = 'import os; print(\"trained on\", repr(os.environ[\"CUDA_VISIBLE_DEVICES\"]), flush=True)'\n"
    "supervisor.trainer_command = lambda run, resume_from, record: ([sys.executable, '-c', trainer], 1, 0)\n"
    "sys.exit(supervisor.main(sys.argv[1:]))\n")


def test_a_run_json_that_does_not_read_as_the_run_starts_fails_it_instead_of_training_on_the_cpu(home, monkeypatch):
    """The supervisor read run.json with record(): a corrupt one gave {}, so the run's GPUs were [] and
    CUDA_VISIBLE_DEVICES "": the run trained on the CPU without a word (and its record was set aside). It
    refuses now, before writing anything: the run fails with a reason naming the file and what to do, which
    the launch (tunedeck train / resume, the app) shows with the supervisor's log. Permission denied gave
    "supervisor error" and a traceback; it is the same refusal, for a resume with its own advice."""
    from core.runs import launch, lifecycle
    from core.runs.errors import SupervisorDidNotStart

    def stand_in(run, resume_from=None):
        return [sys.executable, "-c", _STAND_IN_SUPERVISOR, str(run.path),
                *([] if resume_from is None else ["--resume", str(resume_from)])]

    monkeypatch.setattr(launch, "supervisor_command", stand_in)
    monkeypatch.setattr(launch, "child_env", lambda: {**os.environ, "PYTHONPATH": str(ROOT)})
    run = create_run(_Config(), ["tunedeck", "train", "x.yaml"], gpus=[0, 1])
    torn = run.record_path.read_bytes()[:150]
    run.record_path.write_bytes(torn)
    with pytest.raises(SupervisorDidNotStart) as caught:
        lifecycle._start(run)
    says = f"{run.record_path} cannot be read (Unterminated string"
    assert says in str(caught.value) and "no trainer was started (it would have trained on the CPU)" in \
        str(caught.value) and "start the run again" in str(caught.value), str(caught.value)
    status = run.status()
    assert status.status == "failed" and status.reason.startswith(says), status
    assert status.reason_message["key"] == "runs.reason_record_unreadable"
    assert run.record_path.read_bytes() == torn and _set_aside(run) == []  # nothing written over it
    log = run.log_path.read_text()
    assert "[rank0]" not in log and f"[supervisor] {says}" in log, log
    assert run.last_event()["event"] == "failed" and run.last_event()["reason"] == status.reason

    run.record_path.write_text(json.dumps({"id": run.id, "gpus": [0, 1]}), encoding="utf-8")
    (run.path / "deny").touch()  # the supervisor cannot read it; in here too, for the launch's wait
    readable = _deny_reading(monkeypatch, run.record_path)
    run.write_status("queued")
    with pytest.raises(SupervisorDidNotStart) as caught:
        lifecycle._start(run, resume_from=str(run.checkpoints_dir / "checkpoint-5"))
    assert f"{run.record_path} cannot be read (Permission denied)" in str(caught.value)
    assert f"then 'tunedeck resume {run.id}'" in str(caught.value) and "Traceback" not in str(caught.value)
    assert run.status().reason_message["key"] == "runs.reason_record_unreadable_resume"
    assert "[rank0]" not in run.log_path.read_text()

    # JSON, but no "gpus" list (edited by hand, or written by something else): the same refusal, not the CPU.
    readable()
    (run.path / "deny").unlink()
    for record in ({"id": run.id}, {"id": run.id, "gpus": "0,1"}):
        run.record_path.write_text(json.dumps(record), encoding="utf-8")
        run.write_status("queued")
        with pytest.raises(SupervisorDidNotStart) as caught:
            lifecycle._start(run)
        assert f'{run.record_path} cannot be read (it has no "gpus" list of GPU indices' in str(caught.value), \
            str(caught.value)
        assert run.status().status == "failed" and "[rank0]" not in run.log_path.read_text()
        assert json.loads(run.record_path.read_text()) == record


def test_resume_refuses_a_run_whose_run_json_does_not_read_in_one_line(home, monkeypatch, capsys):
    """prepare_resume read run.json with record(): a corrupt one was set aside and replaced by the resume's
    fields alone, and the new attempt started with no GPUs, on the CPU; permission denied ended `tunedeck
    resume` in a traceback. Both are refused before anything is written, in one line naming the file."""
    from core import cli
    from core.runs import lifecycle

    started = []
    monkeypatch.setattr(lifecycle, "_start", lambda run, resume_from=None: started.append(resume_from))
    run = create_run(_Config(), ["tunedeck", "train", "x.yaml"], gpus=[0])
    _sound_checkpoint(run, 5)
    run.write_status(STOPPED, "stopped at step 5")
    run.record_path.write_text('{"id": "torn', encoding="utf-8")
    assert cli.main(["resume", run.id]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tunedeck: run {run.id} cannot be resumed: {run.record_path} cannot be read (") and \
        "fix its JSON" in err and len(err.splitlines()) == 1, err
    assert started == [] and run.record_path.read_text() == '{"id": "torn' and _set_aside(run) == []
    assert run.status().status == STOPPED
    readable = _deny_reading(monkeypatch, run.record_path)
    assert cli.main(["resume", run.id]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tunedeck: run {run.id} cannot be resumed: {run.record_path} cannot be read "
                          "(Permission denied)") and len(err.splitlines()) == 1, err
    assert started == [] and run.status().status == STOPPED
    readable()
    run.record_path.write_text(json.dumps({"id": run.id}), encoding="utf-8")  # JSON without its GPUs
    assert cli.main(["resume", run.id]) == 1
    err = capsys.readouterr().err
    assert 'cannot be read (it has no "gpus" list of GPU indices' in err and len(err.splitlines()) == 1, err
    assert started == [] and run.status().status == STOPPED


def test_stop_and_resume_of_a_live_run_whose_run_json_does_not_read(home, monkeypatch, capsys):
    """request_stop and _being_resumed read run.json with record(): permission denied ended `tunedeck stop`
    and `tunedeck resume` in a traceback, and the run was not stopped. The stop goes to the process that
    holds the run's lock (the supervisor, whose pid run.json would have given) and ends with one line
    naming the file and what to do; a resume is told the run is active; without a lock holder to be found,
    the stop is refused in one line."""
    from core import cli
    from core.runs import control
    from core.runs.liveness import lock_holder

    run = _run(home)
    _deny_reading(monkeypatch, run.record_path)
    says = f"tunedeck: {run.record_path} cannot be read (Permission denied): the stop went to the process"
    holder = _hold_lock(run)
    try:
        assert lock_holder(run) == holder.pid
        run.write_status("starting")
        assert cli.main(["resume", run.id]) == 2  # active: said, whatever run.json holds (a request that cannot be)
        assert capsys.readouterr().err == f"tunedeck: run {run.id} is still active (status: starting); stop it first\n"
        run.write_status(RUNNING)
        assert cli.main(["stop", run.id]) == 0
        err = capsys.readouterr().err.splitlines()
        assert err[0].startswith(f"asked run {run.id} to stop") and len(err) == 2, err
        assert err[1].startswith(says) and f"(pid {holder.pid})" in err[1] and "fix its JSON" in err[1], err
        assert holder.wait(timeout=30) == -signal.SIGTERM  # the stop reached it
        assert run.status().status == "stopping"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    holder = _hold_lock(run)  # stopping, and asked again: killed
    try:
        assert cli.main(["stop", run.id, "--json"]) == 0
        out = capsys.readouterr()
        result = json.loads(out.out)
        assert result["forced"] and result["status"] == STOPPED and len(result["notices"]) == 1
        assert str(run.record_path) in result["notices"][0] and out.err.startswith(says), out.err
        holder.wait(timeout=30)  # killed (and reaped by the stop: no exit status is left for this wait)
        assert lock_holder(run) is None and run.status().status == STOPPED
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    holder = _hold_lock(run)
    try:
        run.write_status(RUNNING)
        monkeypatch.setattr(control, "lock_holder", lambda run: None)  # a system that does not say (no /proc/locks)
        assert cli.main(["stop", run.id]) == 1
        err = capsys.readouterr().err
        assert err == f"tunedeck: run {run.id} cannot be stopped: {run.record_path} cannot be read (Permission " \
                      f"denied), and no process was found holding {run.lock_path}; make the file readable (its " \
                      "permissions) or fix its JSON, then run this again\n", err
        assert holder.poll() is None and run.status().status == RUNNING
    finally:
        holder.kill()
        holder.wait()


def test_runs_marks_a_run_whose_run_json_does_not_read_and_json_says_why(home, monkeypatch, capsys):
    """`tunedeck runs` listed such a run with an empty model and method and no word; the model column says
    "run.json unreadable" now and --json has record_error (as `status --json` has), None for the others."""
    from core import cli

    broken, sound = _run(home), _run(home)
    broken.record_path.write_text("[1, 2]", encoding="utf-8")
    assert cli.main(["runs"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines[broken.id].endswith("  run.json unreadable") and "Qwen" not in lines[broken.id], lines
    assert lines[sound.id].endswith("  Qwen/Qwen2.5-0.5B"), lines
    assert cli.main(["runs", "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[broken.id]["record_error"] == "not a JSON object" and rows[broken.id]["model"] == ""
    assert rows[sound.id]["record_error"] is None
    _deny_reading(monkeypatch, sound.record_path)
    assert cli.main(["runs", "--json"]) == 0
    assert {row["id"]: row["record_error"] for row in json.loads(capsys.readouterr().out)} == \
        {broken.id: "not a JSON object", sound.id: "Permission denied"}


def test_status_json_gives_the_trainers_latest_sign_of_life_which_moves_while_updated_does_not(home, capsys):
    """``updated`` changes with the status only: a hung run and a live one read alike. ``last_alive`` is the
    newest heartbeat or metrics write (``silent_s`` the seconds since): a live run's moves, a hung one's not."""
    from core.cli import dispatch
    from core.runs.heartbeat import heartbeat_path, last_sign_of_life
    from tests.fixtures.watch.run_builder import SupervisorStandIn

    run = _run(home)
    run.write_status(RUNNING)

    def status() -> dict:
        assert dispatch(["status", run.id, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    with SupervisorStandIn(run.path):  # a live supervisor: the run stays active
        before = status()
        assert before["last_alive"] is None and before["silent_s"] is None  # no trainer wrote anything yet
        now = time.time()
        beat = heartbeat_path(run.path, 0)
        beat.write_text(json.dumps({"pid": 1, "rank": 0, "ts": now - 100, "step": 3, "step_ts": now - 130,
                                    "interval_s": 2.0, "median_step_s": 1.0, "phase": "training"}))
        os.utime(beat, (now - 100, now - 100))
        append_jsonl(run.metrics_path, {"kind": "train", "step": 3, "loss": 2.0})
        os.utime(run.metrics_path, (now - 160, now - 160))
        assert last_sign_of_life(run.path) == pytest.approx(now - 100)
        hung = status()  # silent for 100 s: stalled
        assert hung["status"] == "stalled"
        assert hung["last_alive"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 100))
        assert 100 <= hung["silent_s"] < 100 + 60
        # The trainer beats again and logs a step: last_alive moves on, updated stays where the status put it.
        os.utime(beat, (now - 10, now - 10))
        os.utime(run.metrics_path, (now - 5, now - 5))
        live = status()
        assert live["status"] == RUNNING
        assert live["last_alive"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 5))
        assert live["silent_s"] < hung["silent_s"] and live["updated"] == hung["updated"] == before["updated"]
        assert dispatch(["runs", "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert row["last_alive"] == live["last_alive"]
        # A heartbeat that does not parse (caught mid-write) still counts by its mtime.
        beat.write_text("{torn")
        os.utime(beat, (now - 1, now - 1))
        assert last_sign_of_life(run.path) == pytest.approx(now - 1)


def test_a_runs_listing_reads_each_runs_heartbeats_once(home, monkeypatch):
    """``summarize`` read a live run's heartbeat files for its stall check and again for its last sign of
    life (a stalled one four times: the stalled step twice more). Once now, with the same figures."""
    from core.runs import heartbeat
    from core.runs.heartbeat import heartbeat_path
    from core.runs.listing import summarize
    from tests.fixtures.watch.run_builder import SupervisorStandIn

    run = _run(home)
    run.write_status(RUNNING)
    reads: list[Path] = []
    real_beats = heartbeat._beats

    def beats(run_path):
        reads.append(Path(run_path))
        return real_beats(run_path)

    monkeypatch.setattr(heartbeat, "_beats", beats)
    now = time.time()
    beat = heartbeat_path(run.path, 0)
    with SupervisorStandIn(run.path):
        for silent, status, step in ((1, RUNNING, None), (500, "stalled", 7)):
            beat.write_text(json.dumps({"pid": 1, "rank": 0, "ts": now - silent, "step": 7, "step_ts": now - silent,
                                        "interval_s": 2.0, "median_step_s": 1.0, "phase": "training"}))
            os.utime(beat, (now - silent, now - silent))
            reads.clear()
            summary = summarize(run)
            assert (summary.status, summary.step) == (status, step)
            assert summary.silent_s is not None and silent <= summary.silent_s < silent + 60
            assert reads == [run.path]


def test_runs_leaves_the_wizards_probe_runs_out_unless_asked_and_knows_the_older_ones(home, capsys):
    """`tunedeck runs` listed the wizard's probe runs (a few steps each to measure a plan) among the user's
    training, and probe runs made before run.json said ``command: probe`` were not known as probes anywhere.
    A run started on a run file the probe writes (``<data root>/probes/``) is one too; the table leaves them
    out and says how many, ``--probes`` lists them marked, ``--json`` lists every run as before."""
    from core import cli
    from core.paths import data_root

    mine = _run(home)
    marked = create_run(_Config(name="probe-a"), ["tunedeck", "probe"], command="probe", gpus=[])
    older = create_run(_Config(name="probe-b"),
                       ["tunedeck", "train", str(data_root() / "probes" / "tiny-lora-1764968400000.yaml")], gpus=[])
    elsewhere = create_run(_Config(name="mine-too"), ["tunedeck", "train", str(home / "plans" / "tiny.yaml")], gpus=[])
    assert {s.id: s.probe for s in list_runs()} == {mine.id: False, marked.id: True, older.id: True,
                                                     elsewhere.id: False}
    assert cli.main(["runs"]) == 0
    out = capsys.readouterr()
    assert mine.id in out.out and elsewhere.id in out.out
    assert marked.id not in out.out and older.id not in out.out and "(probe)" not in out.out
    assert out.err.strip() == "2 probe runs of the wizard not listed (--probes lists them)"
    assert cli.main(["runs", "--probes"]) == 0
    out = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.out.splitlines()[1:]}
    assert set(rows) == {mine.id, marked.id, older.id, elsewhere.id} and out.err == ""
    assert "lora (probe)" in rows[marked.id] and "lora (probe)" in rows[older.id]
    assert "(probe)" not in rows[mine.id]
    assert cli.main(["runs", "--json"]) == 0
    assert sorted(r["id"] for r in json.loads(capsys.readouterr().out) if r["probe"]) == sorted([marked.id, older.id])


def test_status_and_the_runs_screen_name_the_gpus_as_this_box_numbers_them(home, capsys):
    """A run launched under CUDA_VISIBLE_DEVICES=2,3 records gpus [0]: `status RUN` said "GPUs 0" while the
    trainer held GPU 2 (what nvidia-smi and the GPU screen call it). The listing maps them as the supervisor
    does; a run.json edited into a non-list still lists. (No GPU: the run is never started.)"""
    from core import cli

    run = _run(home)
    run.record_path.write_text(json.dumps({"id": run.id, "gpus": [0], "env": {"CUDA_VISIBLE_DEVICES": "2,3"}}))
    assert cli.main(["status", run.id]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("gpus"))
    assert line.split() == ["gpus", "2"], line
    assert cli.main(["runs", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["gpus"] == [0] and row["physical_gpus"] == ["2"]
    run.record_path.write_text(json.dumps({"id": run.id, "gpus": "0,1"}))
    assert cli.main(["runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["physical_gpus"] == []


def test_a_stop_while_the_run_is_starting_promises_no_checkpoint(home, capsys):
    """A run stopped while it loads its model and data ends before its first step, without a checkpoint
    ("stopped before a checkpoint could be saved", nothing to resume): `tunedeck stop` said "it saves a
    checkpoint and exits" all the same. Once it trains, the stop still says that it saves one."""
    import psutil

    from core import cli

    for status, says, not_said in (("starting", "this attempt saves no checkpoint (a resume continues from an earlier attempt's", "saves a checkpoint"),
                                   (RUNNING, "it saves a checkpoint and exits", "still starting")):
        run = _run(home)
        holder = _hold_lock(run)
        try:
            run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()})
            run.write_status(status)
            assert cli.main(["stop", run.id]) == 0
            err = capsys.readouterr().err
            assert says in err and not_said not in err, err
            assert holder.wait(timeout=30) == -signal.SIGTERM  # the stop reached the supervisor
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()


def test_a_stop_that_kills_the_trainer_before_its_handler_names_the_checkpoint_a_resume_takes(home):
    """A stop in the trainer's first moments after ``resume`` (before it installs its SIGTERM handler) kills
    it at once; the status said "stopped before a checkpoint could be saved" though the run had earlier
    complete checkpoints. Now it says the run stopped and which checkpoint 'tunedeck resume' continues from
    (the newest sound one: a damaged newer one is passed over, as resume passes it). A real process killed by
    a real SIGTERM stands in for the trainer; no GPU."""
    from core.runs.supervisor import Supervisor

    run = _run(home)
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    trainer.send_signal(signal.SIGTERM)  # no handler: it dies of it
    code = trainer.wait(timeout=60)
    assert code == -signal.SIGTERM
    supervisor = Supervisor(run, resume_from=None)
    supervisor.stop_requests = 1
    status, reason = supervisor.final_status(code)
    assert status == STOPPED and reason.english() == "stopped before a checkpoint could be saved"  # none yet

    _sound_checkpoint(run, 40)
    damaged = _sound_checkpoint(run, 80)
    (damaged / "model.safetensors").write_bytes(b"\0")  # complete marker, but its weights are cut short
    supervisor = Supervisor(run, resume_from=str(damaged))
    supervisor.stop_requests = 1
    status, reason = supervisor.final_status(code)
    assert status == STOPPED
    text = reason.english()
    assert f"tunedeck resume {run.id}" in text and "checkpoint-40" in text, text
    assert "before a checkpoint could be saved" not in text
    run.write_status(status, reason)
    assert can_resume(run.status().status) and prepare_resume(run).step == 40


def test_a_stopping_run_lists_no_eta(home, capsys):
    """A stopping run ends at its next checkpoint, not at the planned end: `runs` and `status` showed the
    ETA to the planned end. None while stopping (as while stalled); running, it has one."""
    from core.cli import dispatch
    from core.runs.listing import summarize
    from core.runs.run_dir import STOPPING

    run = _run(home)
    append_jsonl(run.metrics_path, {"schema": 1, "kind": "header", "total_steps": 3000})
    append_jsonl(run.metrics_path, {"kind": "train", "step": 800, "total_steps": 3000, "loss": 0.9,
                                    "tokens_per_s": 900.0, "eta_s": 9000.0, "time": "2999-01-01T00:00:00Z"})
    run.write_status(RUNNING)
    with _supervisor_stand_in(run):
        assert summarize(run).eta_s == 9000.0
        run.write_status(STOPPING)
        summary = summarize(run)
        assert summary.status == STOPPING and summary.eta_s is None
        assert dispatch(["runs", "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert row["status"] == "stopping" and row["eta_s"] is None


def _supervisor_with_stand_in_trainer(run: RunDirectory, home: Path, wait: bool = True) -> subprocess.Popen:
    """A real supervisor (its own process, as `tunedeck resume` starts it) whose trainer is a stand-in: it
    writes ``trained`` in the run folder, then (``wait``) waits, a trainer at work, until it is killed."""
    trainer = (
        "import pathlib, time\n"
        "pathlib.Path('trained').touch()\n"
        "print('training', flush=True)\n"
        f"time.sleep({120 if wait else 0})\n")
    supervise = (
        "import sys\n"
        "from core.runs import supervisor\n"
        f"supervisor.trainer_command = lambda run, resume_from, record: ([sys.executable, '-c', {trainer!r}], 1, 0)\n"
        f"sys.exit(supervisor.main([{str(run.path)!r}]))\n")
    return subprocess.Popen([sys.executable, "-c", supervise], cwd=ROOT,
                            env={**os.environ, "TUNEDECK_HOME": str(home)})


def _resumed_and_queued(run: RunDirectory) -> None:
    """A run stopped once (attempt 1 ended, its supervisor gone) that `tunedeck resume` has just queued again:
    run.json still names the old supervisor, a process that is no more."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run.update_record(supervisor={"pid": dead.pid, "start_time": 1.0},
                      attempts=[{"number": 1, "started": "2026-01-01T00:00:00Z", "ended": "2026-01-01T01:00:00Z",
                                 "status": "stopped", "exit_code": 0, "resume_from": None}])
    run.write_status("queued")


def test_a_forced_stop_before_a_resumed_runs_supervisor_started_keeps_it_stopped(home):
    """`stop --force` of a run just resumed, still queued (its new supervisor not yet there): nothing to kill,
    so it wrote "stopped"; the supervisor then came, its switch to "starting" was refused unseen, and it
    trained on under "stopped". It does not start the run now: the trainer never runs, the run stays stopped
    (exit 0, train.log says why). The stop is over before the supervisor starts: no timing. No GPU."""
    run = _run(home)
    _resumed_and_queued(run)
    result = request_stop(run, force=True)
    assert result.forced and result.status.status == STOPPED
    supervisor = _supervisor_with_stand_in_trainer(run, home, wait=False)
    try:
        code = supervisor.wait(timeout=120)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    assert code == 0 and not (run.path / "trained").exists()
    assert run.status().status == STOPPED and effective_status(run).status == STOPPED
    assert [a["number"] for a in run.record()["attempts"]] == [1]  # no attempt started
    assert "not started: the run is stopped" in run.log_path.read_text()


def test_a_forced_stop_kills_a_supervisor_that_starts_while_it_waits(home, monkeypatch):
    """`stop --force` of a run just resumed, still queued: nothing to kill, it waited up to 10 s for the run's
    lock, which the new supervisor had taken meanwhile, then wrote "stopped" while that supervisor and its
    trainer trained on. Now the stop kills a supervisor that records itself while it waits. The supervisor is
    started (a real one, stand-in trainer) once the stop has killed what it knew, and the stop goes on only once
    the trainer runs (the test's hook on the kill). No GPU."""
    import psutil

    from core.runs import control

    run = _run(home)
    _resumed_and_queued(run)
    started = []
    real_kill = control._kill_trees

    def kill_then_the_supervisor_starts(run, pids):
        real_kill(run, pids)
        if not started:
            started.append(_supervisor_with_stand_in_trainer(run, home))
            deadline = time.monotonic() + 120
            while not (run.path / "trained").exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    monkeypatch.setattr(control, "_kill_trees", kill_then_the_supervisor_starts)
    try:
        result = request_stop(run, force=True)
        [supervisor] = started
        assert (run.path / "trained").exists()  # it did start, and trained, while the stop waited
        trainer_pid = run.record()["trainer"]["pid"]
        assert supervisor.wait(timeout=30) is not None  # killed by the stop (and reaped)
        assert not psutil.pid_exists(trainer_pid) or psutil.Process(trainer_pid).status() == psutil.STATUS_ZOMBIE
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert result.forced and result.status.status == STOPPED and effective_status(run).status == STOPPED
    attempt = run.record()["attempts"][-1]
    assert attempt["number"] == 2 and attempt["status"] == "killed" and attempt["exit_code"] is None, attempt


def _stand_in_trainer(monkeypatch) -> None:
    """``train``/``resume`` start a real supervisor whose trainer is a stand-in that marks the run folder
    (``trained``) if it is ever started."""
    from core.runs import launch

    trainer = "import pathlib; pathlib.Path('trained').touch()"
    supervise = (
        "import sys\n"
        "from core.runs import supervisor\n"
        f"supervisor.trainer_command = lambda run, resume_from, record: ([sys.executable, '-c', {trainer!r}], 1, 0)\n"
        "sys.exit(supervisor.main(sys.argv[1:]))\n")
    monkeypatch.setattr(launch, "supervisor_command", lambda run, resume_from=None: [
        sys.executable, "-c", supervise, str(run.path), *([] if resume_from is None else ["--resume", str(resume_from)])])
    monkeypatch.setattr(launch, "child_env", lambda: {**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_train_whose_run_a_forced_stop_stopped_before_its_supervisor_started_says_so(home, monkeypatch):
    """`stop --force` of a run `tunedeck train` (fresh, not a resume) has just queued: its supervisor finds it
    stopped and exits 0 without starting it, and train said "the run's supervisor exited at once; see …" (a
    failure to look for in a log) for a stop someone asked for. It says the run was stopped before its
    supervisor started, nothing trained, and how to start it; the run stays stopped. A real supervisor (its
    trainer a stand-in that would mark the folder), started once the stop is over: no timing. No GPU."""
    from core.i18n import t
    from core.runs import lifecycle
    from core.runs.errors import SupervisorDidNotStart

    _stand_in_trainer(monkeypatch)
    run = create_run(_Config(), ["tunedeck", "train", "x.yaml"], gpus=[0])
    assert run.status().status == "queued"
    result = request_stop(run, force=True)
    assert result.forced and result.status.status == STOPPED
    with pytest.raises(SupervisorDidNotStart) as caught:
        lifecycle._start(run)
    said = str(caught.value)
    assert said == t("runs.stopped_before_start", id=run.id), said
    assert "exited at once" not in said and f"tunedeck resume {run.id}" in said
    assert caught.value.last_line.startswith("not started: the run is stopped"), caught.value.last_line
    assert run.status().status == STOPPED and run.status().reason_message["key"] == "runs.reason_forced"
    assert not (run.path / "trained").exists()


def test_a_resume_whose_run_a_forced_stop_stopped_before_its_supervisor_started_says_so(home, monkeypatch):
    """As above for `tunedeck resume`: its supervisor found the run stopped and exited 0 without starting it,
    but run.json still named the last attempt's supervisor, which the launch took for the new one: resume
    said "resumed run … from checkpoint …" (the app too) of a run that stayed stopped. It says now that the
    run was stopped before its supervisor started. A real supervisor, stand-in trainer, started once the stop
    is over: no timing. No GPU."""
    from core.i18n import t
    from core.runs import lifecycle
    from core.runs.errors import SupervisorDidNotStart

    _stand_in_trainer(monkeypatch)
    run = create_run(_Config(), ["tunedeck", "train", "x.yaml"], gpus=[0])
    _sound_checkpoint(run, 5)
    _resumed_and_queued(run)
    result = request_stop(run, force=True)
    assert result.forced and result.status.status == STOPPED
    with pytest.raises(SupervisorDidNotStart) as caught:
        lifecycle._start(run, resume_from=str(run.checkpoints_dir / "checkpoint-5"))
    assert str(caught.value) == t("runs.stopped_before_start", id=run.id), str(caught.value)
    assert run.status().status == STOPPED and not (run.path / "trained").exists()
    assert [a["number"] for a in run.record()["attempts"]] == [1]


@pytest.mark.parametrize("age_s, expected", [(0, RUNNING), (3600, CRASHED)])
def test_a_forced_stop_marker_left_by_a_live_process_does_not_keep_a_dead_run_active(home, age_s, expected):
    """run.json's ``killing`` keeps readers off a run while a forced stop kills it, as long as the process it
    names lives. One left behind by a process that lives on (the app's stop whose clearing of it failed on a
    full disk, a `stop --force` suspended with Ctrl-Z) kept a run whose supervisor is dead active for as long
    as that process lived, also a later attempt's crash. A marker of the stop at work (just written) still keeps
    readers off; one an hour old does not: the run reads crashed. This test process stands for the app (it is
    alive); the supervisor is a process that has ended. No GPU."""
    from core.runs.liveness import process_start_time

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = _run(home)
    me = os.getpid()
    run.update_record(supervisor={"pid": dead.pid, "start_time": 1.0},
                      attempts=[{"number": 1, "started": "2026-01-01T00:00:00Z", "resume_from": None}],
                      killing={"pid": me, "start_time": process_start_time(me), "since": time.time() - age_s})
    run.write_status(RUNNING)
    assert effective_status(run).status == expected


def test_a_resume_is_not_taken_for_started_while_its_supervisor_holds_the_lock_of_a_stopped_run(home, monkeypatch):
    """A resume whose supervisor takes the lock, finds the run stopped (a forced stop came first) and exits:
    the launch's wait, looking while it held the lock, took run.json's supervisor (the last attempt's) for it
    and `tunedeck resume` said "resumed". The supervisor is held at that point (a gate) until the wait has seen
    it hold the lock (a hook on the wait's look); the resume then says the run was stopped before its supervisor
    started. A real supervisor, stand-in trainer. No GPU."""
    from core.i18n import t
    from core.runs import launch, lifecycle, liveness
    from core.runs.errors import SupervisorDidNotStart

    trainer = "import pathlib; pathlib.Path('trained').touch()"
    supervise = (
        "import pathlib, sys, time\n"
        "from core.runs import supervisor\n"
        f"supervisor.trainer_command = lambda run, resume_from, record: ([sys.executable, '-c', {trainer!r}], 1, 0)\n"
        "real = supervisor.Supervisor._not_queued_any_more\n"
        "def held(self):\n"
        "    pathlib.Path('holding').touch()\n"
        "    deadline = time.monotonic() + 120\n"
        "    while not pathlib.Path('release').exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.02)\n"
        "    return real(self)\n"
        "supervisor.Supervisor._not_queued_any_more = held\n"
        "sys.exit(supervisor.main(sys.argv[1:]))\n")
    monkeypatch.setattr(launch, "supervisor_command", lambda run, resume_from=None: [
        sys.executable, "-c", supervise, str(run.path), *([] if resume_from is None else ["--resume", str(resume_from)])])
    monkeypatch.setattr(launch, "child_env", lambda: {**os.environ, "PYTHONPATH": str(ROOT)})
    real_alive = liveness.supervisor_alive

    def looked(run):
        alive = real_alive(run)
        if alive and (run.path / "holding").exists():  # the wait saw it hold the lock: it may go on now
            (run.path / "release").touch()
        return alive

    monkeypatch.setattr(liveness, "supervisor_alive", looked)
    run = create_run(_Config(), ["tunedeck", "train", "x.yaml"], gpus=[0])
    _sound_checkpoint(run, 5)
    _resumed_and_queued(run)
    assert request_stop(run, force=True).status.status == STOPPED
    try:
        with pytest.raises(SupervisorDidNotStart) as caught:
            lifecycle._start(run, resume_from=str(run.checkpoints_dir / "checkpoint-5"))
        assert (run.path / "release").exists()  # the wait did look while it held the lock
    finally:
        (run.path / "release").touch()  # (a supervisor still held goes on and ends)
    assert str(caught.value) == t("runs.stopped_before_start", id=run.id), str(caught.value)
    assert run.status().status == STOPPED and not (run.path / "trained").exists()
