"""Stalls, for real: a trainer frozen with SIGSTOP is ``stalled`` (CLI, JSON, the app's core function)
once no step and no heartbeat came for longer than its step time allows, runs again after SIGCONT, and
``stop --wait --timeout`` exits non-zero while it cannot stop. Thresholds come from the environment
(``TUNEDECK_STALL_FLOOR_S``), so the test waits for states, never for a speed."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil

from core.runs.heartbeat import HEARTBEAT_ENV, STALL_FLOOR_ENV, HeartbeatWriter, heartbeat_path
from core.runs.liveness import effective_status
from core.runs.run_dir import RunDirectory
from core.watch.alerts import stalled_alert
from tests.core.test_runs_detached import Cli, write_config, write_dataset
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run

FLOOR_S = "6"  # seconds of silence that make a stall here (the product's floor is 60)


def _wait(run: RunDirectory, wanted: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if effective_status(run).status == wanted:
            return
        time.sleep(0.2)
    raise AssertionError(f"never {wanted}: {effective_status(run)}\n{run.log_path.read_text()[-2000:]}")


def _release(trainer, run: RunDirectory, cli, run_id: str) -> None:
    """A test's end: the trainer it froze runs again, and a run still live is stopped."""
    if trainer is not None:
        try:
            trainer.send_signal(signal.SIGCONT)
        except psutil.Error:
            pass
    if effective_status(run).active:
        cli("stop", run_id, "--force", check=False)


def test_sigstop_makes_a_run_stalled_sigcont_revives_it_and_stop_wait_times_out(tmp_path, monkeypatch):
    monkeypatch.setenv(STALL_FLOOR_ENV, FLOOR_S)  # for the in-process reader below
    cli = Cli(tmp_path / "home")
    cli.env.update({STALL_FLOOR_ENV: FLOOR_S, HEARTBEAT_ENV: "0.5"})
    config = write_config(tmp_path / "run.yaml", write_dataset(tmp_path / "d.jsonl"), method="lora", lora_rank=8,
                          max_steps=100000, save_steps=100000)
    run_id = cli("train", str(config)).stdout.strip()
    run = RunDirectory(cli.run_dir(run_id))
    trainer = None
    try:
        cli.wait_step(run_id, 3)
        assert effective_status(run).status == "running"
        trainer = psutil.Process(run.record()["trainer"]["pid"])
        deadline = time.monotonic() + 60
        while True:  # the heartbeat is rewritten every 0.5 s: wait for one after step 3
            beat = json.loads(heartbeat_path(run.path, 0).read_text())
            if (beat.get("step") or 0) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert beat["pid"] == trainer.pid and beat["step"] >= 3 and beat["median_step_s"] > 0

        trainer.send_signal(signal.SIGSTOP)
        _wait(run, "stalled")
        status = cli.status(run_id)
        assert status["status"] == "stalled", status
        assert "no step and no heartbeat" in status["reason"]
        assert status["tokens_per_s"] is None and status["steady_tokens_per_s"] is None
        assert status["eta_s"] is None
        row = next(r for r in json.loads(cli("runs", "--json").stdout) if r["id"] == run_id)
        assert row["status"] == "stalled"
        assert "stalled" in cli("status", run_id).stdout
        assert json.loads(run.status_path.read_text())["status"] == "running"  # computed, never written
        alert = stalled_alert(status["status"], run_id, status["reason"])
        assert alert is not None and alert.severity == "warning"

        trainer.send_signal(signal.SIGCONT)
        _wait(run, "running")

        trainer.send_signal(signal.SIGSTOP)
        _wait(run, "stalled")
        stop = cli("stop", run_id, "--wait", "--timeout", "2", check=False)
        assert stop.returncode == 1, stop.stderr
        assert "still" in stop.stderr and "--force" in stop.stderr
        assert effective_status(run).active

        trainer.send_signal(signal.SIGCONT)  # the pending SIGTERM is handled now: checkpoint, then stop
        _wait(run, "stopped")
        assert cli.status(run_id)["last_checkpoint_step"] is not None
    finally:
        _release(trainer, run, cli, run_id)


def test_stall_threshold_follows_the_step_time_and_the_floor(tmp_path, monkeypatch):
    """No trainer: a stand-in supervisor holds the lock; the heartbeat file is aged by hand."""
    monkeypatch.delenv(STALL_FLOOR_ENV, raising=False)
    path = build_run(tmp_path, "20261130-1000-hb-cccc", status="running", steps=20, total=100)
    run = RunDirectory(path)
    with SupervisorStandIn(path):
        assert effective_status(run).status == "running"  # no heartbeat yet (an older trainer): no verdict
        writer = HeartbeatWriter(path, 0, interval_s=2.0)
        writer.note_step(20)
        writer.beat()

        def aged(seconds: float, **fields: object) -> str:
            data = json.loads(heartbeat_path(path, 0).read_text())
            then = time.time() - seconds
            data.update(ts=then, step_ts=then, **fields)
            heartbeat_path(path, 0).write_text(json.dumps(data))
            for name in (heartbeat_path(path, 0), run.metrics_path):
                os.utime(name, (then, then))
            return effective_status(run).status

        assert aged(0) == "running"
        assert aged(59) == "running"  # the 60 s floor
        assert aged(61) == "stalled"
        assert aged(140, median_step_s=30.0) == "running"  # slow steps: 5 x 30 s allowed
        assert aged(151, median_step_s=30.0) == "stalled"
        assert aged(300, median_step_s=1.0, phase="saving") == "running"  # a long checkpoint write
        monkeypatch.setenv(STALL_FLOOR_ENV, "5")
        assert aged(7, median_step_s=0.1, phase="training") == "stalled"
        reason = effective_status(run).reason
        assert "rank 0" in reason and "at step 20" in reason
    assert effective_status(run).status == "crashed"  # no supervisor: crashed wins over stalled


def test_a_stalled_runs_reason_and_step_column_quote_the_same_step(tmp_path, monkeypatch):
    """The heartbeat's step and the last metrics step differ by a few steps (the heartbeat is rewritten every
    few seconds; a record can be written a step late): the reason and the step column both say the newest
    (they said "216/20000" and "... at step 212"). No trainer: a stand-in supervisor holds the lock."""
    from core.runs.listing import summarize

    monkeypatch.setenv(STALL_FLOOR_ENV, "5")
    path = build_run(tmp_path, "20261130-1000-hb-dddd", status="running", steps=216, total=20000)
    run = RunDirectory(path)
    with SupervisorStandIn(path):
        for heartbeat_step, newest in ((212, 216), (219, 219)):  # behind the metrics, then ahead of them
            writer = HeartbeatWriter(path, 0, interval_s=0.5)
            writer.note_step(heartbeat_step)
            writer.beat()
            then = time.time() - 30
            data = json.loads(heartbeat_path(path, 0).read_text())
            data.update(ts=then, step_ts=then)
            heartbeat_path(path, 0).write_text(json.dumps(data))
            for name in (heartbeat_path(path, 0), run.metrics_path):
                os.utime(name, (then, then))
            summary = summarize(run)
            assert summary.status == "stalled"
            assert f"at step {newest}:" in summary.reason and summary.step == newest, (summary.reason, summary.step)


def test_a_trainer_frozen_while_it_starts_is_stalled_not_starting_forever(tmp_path, monkeypatch):
    """A real trainer SIGSTOPped during its setup (its heartbeat written, no step yet: status ``starting``)
    showed ``starting`` forever: the stall check ran only for ``running``. Now it is ``stalled`` with the
    alert and the ``stop --force`` hint, and starts again on SIGCONT. CPU only (the bundled tiny model)."""
    monkeypatch.setenv(STALL_FLOOR_ENV, "3")
    cli = Cli(tmp_path / "home")
    cli.env.update({STALL_FLOOR_ENV: "3", HEARTBEAT_ENV: "0.5"})
    config = write_config(tmp_path / "run.yaml", write_dataset(tmp_path / "d.jsonl"), max_steps=100000,
                          save_steps=100000)
    run_id = cli("train", str(config)).stdout.strip()
    run = RunDirectory(cli.run_dir(run_id))
    trainer = None
    try:
        deadline = time.monotonic() + 120
        while not heartbeat_path(run.path, 0).exists():  # written first thing, before torch is imported
            assert time.monotonic() < deadline, run.log_path.read_text()[-2000:]
            time.sleep(0.02)
        trainer = psutil.Process(json.loads(heartbeat_path(run.path, 0).read_text())["pid"])
        trainer.send_signal(signal.SIGSTOP)
        assert run.status().status == "starting"  # frozen in its setup, before its first step
        _wait(run, "stalled", timeout=60)
        status = cli.status(run_id)
        assert status["status"] == "stalled" and status["step"] is None, status
        assert "while it starts" in status["reason"] and f"tunedeck stop {run_id} --force" in status["reason"]
        assert json.loads(run.status_path.read_text())["status"] == "starting"  # computed, never written
        alert = stalled_alert(status["status"], run_id, status["reason"])
        assert alert is not None and alert.severity == "warning"
        trainer.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 120
        while effective_status(run).status not in ("starting", "running"):
            assert time.monotonic() < deadline, effective_status(run)
            time.sleep(0.2)
    finally:
        _release(trainer, run, cli, run_id)


def test_a_trainer_that_hangs_while_stopping_is_stalled_and_a_second_stop_kills_it(tmp_path, monkeypatch):
    """A real trainer frozen (SIGSTOP) and then asked to stop: the SIGTERM waits, the run said ``stopping``
    for ever (the stall check ran only for running and starting). Now it is ``stalled`` with a reason that
    says it hangs while stopping and that a second 'tunedeck stop' kills it; that second plain stop does
    (the supervisor and the trainer are gone, the run is stopped by a second stop). CPU only (the bundled
    tiny model); the floor comes from the environment."""
    monkeypatch.setenv(STALL_FLOOR_ENV, "3")
    cli = Cli(tmp_path / "home")
    cli.env.update({STALL_FLOOR_ENV: "3", HEARTBEAT_ENV: "0.5"})
    config = write_config(tmp_path / "run.yaml", write_dataset(tmp_path / "d.jsonl"), max_steps=100000,
                          save_steps=100000)
    run_id = cli("train", str(config)).stdout.strip()
    run = RunDirectory(cli.run_dir(run_id))
    trainer = supervisor = None
    try:
        deadline = time.monotonic() + 120
        while not heartbeat_path(run.path, 0).exists():  # written first thing, before torch is imported
            assert time.monotonic() < deadline, run.log_path.read_text()[-2000:]
            time.sleep(0.02)
        trainer = psutil.Process(json.loads(heartbeat_path(run.path, 0).read_text())["pid"])
        supervisor = psutil.Process(run.record()["supervisor"]["pid"])
        trainer.send_signal(signal.SIGSTOP)  # it can no longer act on the stop: it hangs while stopping
        cli("stop", run_id)
        assert run.status().status == "stopping"
        _wait(run, "stalled", timeout=60)
        status = cli.status(run_id)
        assert status["status"] == "stalled", status
        assert "asked to stop" in status["reason"] and f"'tunedeck stop {run_id}' again kills it" in status["reason"]
        assert json.loads(run.status_path.read_text())["status"] == "stopping"  # computed, never written
        assert stalled_alert(status["status"], run_id, status["reason"]) is not None

        second = cli("stop", run_id, "--json")
        result = json.loads(second.stdout)
        assert result["forced"] and result["status"] == "stopped", result
        assert "second stop" in cli.status(run_id)["reason"]
        for process in (supervisor, trainer):
            process.wait(timeout=30)  # killed (a stopped process dies of SIGKILL too)
        assert not supervisor.is_running() and not trainer.is_running()
    finally:
        _release(trainer, run, cli, run_id)


def test_before_its_first_heartbeat_a_starting_trainer_is_judged_from_its_start(tmp_path, monkeypatch):
    """A trainer frozen before it wrote any heartbeat (still importing): silence counts from its process's
    start, against twice the floor. Fixed times, no process."""
    from core.runs.heartbeat import find_stall

    monkeypatch.delenv(STALL_FLOOR_ENV, raising=False)
    assert find_stall(tmp_path, now=1000.0) is None  # nothing to judge by: no verdict
    assert find_stall(tmp_path, now=1000.0, started_at=1000.0 - 119) is None  # the 60 s floor, twice
    stall = find_stall(tmp_path, now=1000.0, started_at=1000.0 - 121)
    assert stall is not None and stall.step is None and stall.threshold_s == 120
