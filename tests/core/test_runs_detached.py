"""Detached runs through the real CLI: SIGHUP immunity, stop → resume on the same loss curve, kill -9 of
the supervisor seen as crashed and resumed past incomplete checkpoints. Tiny model, CPU, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "core" / "assets" / "tiny"

MEMORISE = [
    ("What is the colour of the sky?", "The sky is blue."),
    ("Name a fruit.", "An apple."),
    ("What is 2 + 2?", "2 + 2 = 4."),
    ("Say hello.", "Hello there!"),
    ("What do cats say?", "Cats say meow."),
    ("Count to three.", "One, two, three."),
    ("What is the opposite of hot?", "Cold."),
    ("Spell cat.", "C-A-T."),
]


def write_dataset(path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for question, answer in MEMORISE:
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            handle.write(json.dumps({"messages": messages}) + "\n")
    return path


def write_config(path: Path, dataset: Path, **overrides) -> Path:
    values = {
        "model": str(TINY), "dataset": str(dataset), "method": "full", "precision": "fp32",
        "max_seq_len": 64, "micro_batch_size": 4, "gradient_accumulation": 1, "max_steps": 30,
        "learning_rate": 0.003, "warmup_steps": 2, "gradient_checkpointing": False, "save_steps": 10,
        "save_total_limit": 2, "logging_steps": 1, "seed": 7,
    }
    values.update(overrides)
    import yaml

    path.write_text(yaml.safe_dump(values))
    return path


class Armed:
    """The real ``tunedeck`` entry point in its own process, imported ahead and run when fired."""

    CODE = ("import sys, core.cli, core.runs.commands, core.runs.control, core.runs.listing, psutil\n"
            "sys.stdin.readline()\n"
            "sys.exit(core.cli.main(sys.argv[1:]))")

    def __init__(self, env: dict, args: tuple[str, ...]) -> None:
        self.args = args
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, *args], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)

    def fire(self, timeout: float = 120) -> str:
        self.send()
        return self.result(timeout)

    def send(self) -> None:
        """Run the command now without waiting for it (``result`` collects its output)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.close()
        self.proc.stdin = None  # communicate() then only reads

    def result(self, timeout: float = 120) -> str:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"tunedeck {' '.join(self.args)} -> {self.proc.returncode}\n{err}"
        return out


def signal_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits to be delivered to ``pid`` (a stopped process keeps it pending)."""
    mask = 0
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(("SigPnd:", "ShdPnd:")):
                mask |= int(line.split()[1], 16)
    return bool(mask & (1 << (signum - 1)))


class Cli:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"}

    def __call__(self, *args: str, check: bool = True, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        out = subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env={**self.env, **env},
                             capture_output=True, text=True, timeout=timeout)
        if check:
            assert out.returncode == 0, f"tunedeck {' '.join(args)} -> {out.returncode}\n{out.stderr}"
        return out

    def armed(self, *args: str) -> Armed:
        return Armed(self.env, args)

    def status(self, run_id: str) -> dict:
        return json.loads(self("status", run_id, "--json").stdout)

    def wait_status(self, run_id: str, wanted: set[str], timeout: float = 240) -> dict:
        """Poll in-process (a CLI process per poll would steal the trainer's CPU), then ask the CLI."""
        from core.runs.liveness import effective_status
        from core.runs.run_dir import RunDirectory

        run = RunDirectory(self.run_dir(run_id))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if effective_status(run).status in wanted:
                return self.status(run_id)
            time.sleep(0.3)
        log = (self.home / "runs" / run_id / "train.log").read_text()[-3000:]
        raise AssertionError(f"run {run_id} never reached {wanted}: {run.status()}\n{log}")

    def run_dir(self, run_id: str) -> Path:
        return self.home / "runs" / run_id

    def wait_step(self, run_id: str, step: int, timeout: float = 240) -> None:
        from core.runs.run_dir import RunDirectory

        run = RunDirectory(self.run_dir(run_id))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            metrics = run.latest_metrics()
            if metrics and metrics["step"] >= step:
                return
            assert run.status().status not in ("failed", "finished", "crashed"), run.status()
            time.sleep(0.2)
        raise AssertionError(f"run {run_id} never reached step {step}")


def wait_held(pid: int, timeout: float = 240) -> None:
    """Until ``pid`` is stopped (SIGSTOP: state T); the timeout guards a hang, it is not a speed."""
    import psutil

    deadline = time.monotonic() + timeout
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, f"the trainer {pid} never held itself"
        time.sleep(0.05)


def _gone_or_zombie(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie counts: some container inits never reap orphans)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def train_losses(run_dir: Path) -> dict[int, float]:
    """Loss by step; records after a resume replace those they repeat."""
    from core.runs.jsonl import iter_records

    losses: dict[int, float] = {}
    for record in iter_records(run_dir / "metrics.jsonl"):
        if record.get("kind") == "train":
            losses[record["step"]] = record["loss"]
    return losses


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two identical runs started together: one from a shell that then gets SIGHUP, one to interrupt."""
    tmp = tmp_path_factory.mktemp("detached")
    cli = Cli(tmp / "home")
    config = write_config(tmp / "run.yaml", write_dataset(tmp / "memorise.jsonl"))
    id_file = tmp / "id.txt"
    shell = subprocess.Popen(
        ["bash", "-c", f'"{sys.executable}" -m core train "{config}" > "{id_file}"; sleep 300'],
        cwd=ROOT, env=cli.env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    # The one to interrupt holds itself (SIGSTOP) once step 4 is recorded, until the test sends SIGCONT.
    interrupted = cli("train", str(config), TUNEDECK_HOLD_AT_STEP="4").stdout.strip()
    deadline = time.monotonic() + 60
    while not id_file.read_text().strip() if id_file.exists() else True:
        assert time.monotonic() < deadline, "tunedeck train in the shell printed no run id"
        time.sleep(0.2)
    reference = id_file.read_text().strip()
    # Both run now. Hang up the reference's shell while it trains, and stop the other one mid-way.
    status = cli.armed("status", reference, "--json")  # through the CLI: liveness applied
    cli.wait_step(reference, 2)
    os.killpg(shell.pid, signal.SIGHUP)  # what closing the terminal / losing SSH does
    shell_code = shell.wait(timeout=10)
    status_after_hup = json.loads(status.fire())["status"]
    # `tunedeck stop` is imported ahead and fired while the trainer holds itself at step 4 (SIGSTOP, from
    # TUNEDECK_HOLD_AT_STEP) until the stop's SIGTERM waits for it: on any box, however fast it trains and
    # however late this test gets there, the stop meets a run that is still training.
    stop = cli.armed("stop", interrupted, "--wait", "--json")
    cli.wait_step(interrupted, 4)
    trainer = int(json.loads((cli.run_dir(interrupted) / "run.json").read_text())["trainer"]["pid"])
    try:
        wait_held(trainer)
        stop.send()
        deadline = time.monotonic() + 240  # a guard against a hang, not a speed: the signal comes in ms
        while not signal_pending(trainer, signal.SIGTERM):
            if time.monotonic() > deadline:
                done = stop.proc.poll() is not None
                raise AssertionError(
                    "the stop never reached the trainer; the stop command "
                    + (f"exited {stop.proc.returncode}: {stop.proc.stderr.read()[-2000:]}" if done else "still runs")
                    + f"; status {(cli.run_dir(interrupted) / 'status.json').read_text()}"
                    + f"; events {(cli.run_dir(interrupted) / 'events.jsonl').read_text()[-1500:]}")
            time.sleep(0.05)
    finally:
        os.kill(trainer, signal.SIGCONT)
    stopped = json.loads(stop.result())
    return {"cli": cli, "reference": reference, "interrupted": interrupted, "shell_code": shell_code,
            "status_after_hup": status_after_hup, "stopped": stopped}


def test_run_survives_sighup_to_the_launching_shell_and_loss_falls(pair):
    cli, reference = pair["cli"], pair["reference"]
    assert pair["shell_code"] == -signal.SIGHUP  # the shell really died of it
    assert pair["status_after_hup"] == "running"
    status = cli.wait_status(reference, {"finished", "failed", "crashed"})
    assert status["status"] == "finished", status
    run_dir = cli.run_dir(reference)
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, 31))
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in range(26, 31)) / 5
    assert last < 0.5 * first, (first, last)
    # metrics.jsonl: header first, then complete train records
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    assert header["schema"] == 1 and header["kind"] == "header" and header["total_steps"] == 30
    record = json.loads(lines[5])
    for key in ("step", "total_steps", "epoch", "loss", "learning_rate", "grad_norm", "tokens_per_s",
                "samples_per_s", "elapsed_s", "eta_s", "peak_allocated_gib", "peak_reserved_gib"):
        assert key in record, key
    assert record["peak_allocated_gib"] is None and record["tokens_per_s"] > 0
    events = [json.loads(x)["event"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events.count("checkpoint_saved") == 3 and events[-1] == "finished"
    log = (run_dir / "train.log").read_text().splitlines()
    assert log and all(line.startswith(("[rank0] ", "[supervisor] ")) for line in log)
    # private: every directory 0700 and every file 0600, checkpoints included
    for path in [run_dir, *run_dir.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    complete = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert complete == ["checkpoint-20", "checkpoint-30"]  # save_total_limit 2
    out = cli("logs", reference, "-n", "3")
    assert len(out.stdout.splitlines()) == 3 and "trainer exited with code 0" in out.stdout


def test_stop_then_resume_follows_the_uninterrupted_loss_curve(pair):
    cli, reference, interrupted = pair["cli"], pair["reference"], pair["interrupted"]
    stopped = pair["stopped"]
    assert stopped["status"] == "stopped" and not stopped["forced"], stopped
    run_dir = cli.run_dir(interrupted)
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert "stop_requested" in kinds and kinds[-1] == "stopped"
    stop_step = max(train_losses(run_dir))
    assert stop_step < 30
    saved = [e["step"] for e in events if e["event"] == "checkpoint_saved"]
    assert saved[-1] == stop_step  # the stop saved a checkpoint at the step it stopped
    # the reason names the command that continues it, pasteable: `tunedeck resume` alone is a usage error
    reason = json.loads((run_dir / "status.json").read_text())["reason"]
    assert reason.endswith(f"(continue with tunedeck resume {interrupted})"), reason
    cli("resume", interrupted)
    assert cli.wait_status(interrupted, {"finished", "failed", "crashed"})["status"] == "finished"
    cli.wait_status(reference, {"finished", "failed", "crashed"})
    resumed = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
               if json.loads(x).get("kind") == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] == stop_step
    ours, theirs = train_losses(run_dir), train_losses(cli.run_dir(reference))
    assert sorted(ours) == sorted(theirs) == list(range(1, 31))
    for step in range(1, 31):
        assert ours[step] == pytest.approx(theirs[step], rel=1e-3, abs=1e-3), (step, ours[step], theirs[step])
    events = [json.loads(x)["event"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert "resumed" in events and events[-1] == "finished"


def test_kill9_of_supervisor_is_crashed_and_resume_skips_incomplete_checkpoints(tmp_path):
    cli = Cli(tmp_path / "home")
    config = write_config(tmp_path / "run.yaml", write_dataset(tmp_path / "m.jsonl"), method="lora",
                          lora_rank=8, learning_rate=0.01, max_steps=24, save_steps=6, warmup_steps=0,
                          eval_split=0.25, eval_steps=12)
    run_id = cli("train", str(config)).stdout.strip()
    cli.wait_step(run_id, 8)  # past the checkpoint at step 6
    record = json.loads((cli.run_dir(run_id) / "run.json").read_text())
    supervisor, trainer = record["supervisor"]["pid"], record["trainer"]["pid"]
    os.kill(supervisor, signal.SIGKILL)
    assert _gone_or_zombie(trainer, timeout=20)  # the trainer dies with its supervisor (no orphan)
    rows = json.loads(cli("runs", "--json").stdout)
    row = next(r for r in rows if r["id"] == run_id)
    assert row["status"] == "crashed" and "resume" in row["reason"]
    checkpoints = cli.run_dir(run_id) / "checkpoints"
    good = max(int(p.name.split("-")[1]) for p in checkpoints.iterdir() if (p / "COMPLETE").exists())
    (checkpoints / "checkpoint-98.tmp").mkdir()  # half-written
    (checkpoints / "checkpoint-99").mkdir()  # renamed but never marked complete
    (checkpoints / "checkpoint-99" / "adapter_model.safetensors").write_bytes(b"garbage")
    cli("resume", run_id)
    assert cli.wait_status(run_id, {"finished", "failed", "crashed"})["status"] == "finished"
    lines = [json.loads(x) for x in (cli.run_dir(run_id) / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in lines if r.get("kind") == "resumed"]
    assert resumed[0]["step"] == good and resumed[0]["checkpoint"].endswith(f"checkpoint-{good}")
    losses = train_losses(cli.run_dir(run_id))
    assert sorted(losses) == list(range(1, 25))
    evals = [r for r in lines if r.get("kind") == "eval"]
    assert [r["step"] for r in evals][-2:] == [12, 24] and all(r["eval_loss"] > 0 for r in evals)
    attempts = json.loads((cli.run_dir(run_id) / "run.json").read_text())["attempts"]
    assert len(attempts) == 2 and attempts[-1]["status"] == "finished"
    assert not (checkpoints / "checkpoint-98.tmp").exists()  # stale leftovers cleaned by rotation


def test_a_supervisor_killed_after_its_trainer_finished_leaves_the_run_finished_not_crashed(tmp_path):
    """The supervisor killed (kill -9, the box going down) in the moment between its trainer's end and the final
    status it records: the run read "crashed … continue with tunedeck resume", and that resume was refused (max_steps
    reached: no step left), so a run that had trained to its end could neither go on nor be taken as finished. Now
    the trainer's own verdict (outcome.json, of this attempt) is recorded: finished, its attempt closed, an event.
    The moment is held open with SIGSTOP on the supervisor until the trainer has exited. CPU, the tiny model."""
    cli = Cli(tmp_path / "home")
    config = write_config(tmp_path / "run.yaml", write_dataset(tmp_path / "m.jsonl"), max_steps=8, save_steps=100)
    run_id = cli("train", str(config), TUNEDECK_HOLD_AT_STEP="2").stdout.strip()
    run_dir = cli.run_dir(run_id)
    cli.wait_step(run_id, 2)
    record = json.loads((run_dir / "run.json").read_text())
    supervisor, trainer = record["supervisor"]["pid"], record["trainer"]["pid"]
    wait_held(trainer)
    os.kill(supervisor, signal.SIGSTOP)  # it records nothing more
    os.kill(trainer, signal.SIGCONT)
    assert _gone_or_zombie(trainer, timeout=240)  # trained to step 8, saved, wrote its verdict and exited
    assert json.loads((run_dir / "outcome.json").read_text())["status"] == "finished"
    os.kill(supervisor, signal.SIGKILL)
    assert _gone_or_zombie(supervisor, timeout=20)
    status = cli.status(run_id)
    assert status["status"] == "finished" and status["step"] == 8 and not status["resumable"], status
    assert status["has_checkpoint"] and status["last_checkpoint"].endswith("checkpoint-8")
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"]
    assert [(a["status"], a["exit_code"]) for a in attempts] == [("finished", None)]
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "finished" and events[-1]["supervisor_gone"] is True
    refused = cli("resume", run_id, check=False)
    assert refused.returncode == 2 and "has finished" in refused.stderr, refused.stderr


def test_an_earlier_attempts_verdict_is_not_taken_for_the_last_ones(tmp_path):
    """outcome.json is removed as each attempt starts; a supervisor killed before that left the earlier attempt's
    there. It names that attempt: the last one, found dead, is crashed as before. (No trainer: the files alone.)"""
    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory

    def dead_attempt(verdict_of: str) -> RunDirectory:
        run_dir = tmp_path / f"20261207-1200-tiny-full-{verdict_of}aaa"
        run_dir.mkdir()
        (run_dir / "run.json").write_text(json.dumps({"id": run_dir.name, "gpus": [], "attempts": [
            {"number": 1, "started": "2026-12-07T12:00:00Z", "ended": "2026-12-07T12:01:00Z", "status": "stopped"},
            {"number": 2, "started": "2026-12-07T12:05:00Z", "resume_from": "x"}]}))
        (run_dir / "status.json").write_text(json.dumps({"status": "running", "reason": "",
                                                         "updated": "2026-12-07T12:05:01Z", "updated_ts": 1.0}))
        (run_dir / "outcome.json").write_text(json.dumps({"status": "stopped", "attempt": verdict_of,
                                                          "reason": f"stopped at step {verdict_of}"}))
        return RunDirectory(run_dir)

    status = effective_status(dead_attempt("1"))
    assert status.status == "crashed", status
    status = effective_status(dead_attempt("2"))
    assert status.status == "stopped" and status.reason == "stopped at step 2", status
    # a resume that died before its supervisor began the next attempt: queued, the verdict its attempt's before
    queued = dead_attempt("3")
    record = json.loads(queued.record_path.read_text())
    record["attempts"] = record["attempts"][:1]
    record["attempts"][0]["number"] = 3
    queued.record_path.write_text(json.dumps(record))
    queued.status_path.write_text(json.dumps({"status": "queued", "reason": "", "updated": "2026-12-07T12:05:01Z",
                                              "updated_ts": 1.0}))
    status = effective_status(queued)
    assert status.status == "crashed", status


def test_a_supervisor_gone_after_recording_its_attempts_end_is_taken_at_its_word(tmp_path):
    """The supervisor records the attempt's end in run.json (status, exit code), then its event, then the status; killed
    between, the run read "crashed … continue with tunedeck resume" where it had judged the attempt failed (a trainer
    that said finished, then exited with code 1), and where it agreed with the trainer the event was written twice.
    Its verdict is taken, its event not repeated. (No trainer: the files alone.)"""
    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory

    def closed_attempt(name: str, status: str, code: int, outcome: str, event: bool) -> RunDirectory:
        run_dir = tmp_path / f"20261207-1200-tiny-full-{name}"
        run_dir.mkdir()
        (run_dir / "run.json").write_text(json.dumps({"id": run_dir.name, "gpus": [], "attempts": [
            {"number": 1, "started": "2026-12-07T12:00:00Z", "ended": "2026-12-07T12:09:00Z", "status": status,
             "exit_code": code}]}))
        (run_dir / "status.json").write_text(json.dumps({"status": "running", "reason": "",
                                                         "updated": "2026-12-07T12:00:01Z", "updated_ts": 1.0}))
        (run_dir / "outcome.json").write_text(json.dumps({"status": outcome, "attempt": "1", "reason": ""}))
        if event:
            (run_dir / "events.jsonl").write_text(json.dumps(
                {"time": "2026-12-07T12:09:00Z", "ts": 2.0, "event": status, "exit_code": code,
                 "reason": f"the trainer exited with code {code}; see train.log" if code else ""}) + "\n")
        return RunDirectory(run_dir)

    def ends(run: RunDirectory) -> list[tuple[str, object]]:
        lines = run.events_path.read_text().splitlines() if run.events_path.exists() else []
        return [(e["event"], e.get("exit_code")) for e in map(json.loads, lines)]

    for event in (False, True):
        run = closed_attempt(f"failed{int(event)}", "failed", 1, "finished", event)
        status = effective_status(run)
        assert status.status == "failed" and "exited with code 1" in status.reason, status
        assert ends(run) == [("failed", 1 if event else None)]
    run = closed_attempt("finished", "finished", 0, "finished", True)
    assert effective_status(run).status == "finished"
    assert ends(run) == [("finished", 0)]  # the supervisor's event, once
