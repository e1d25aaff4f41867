"""Full and read-only disks, for real: a 30 MB tmpfs holds TUNEDECK_HOME (filled with a ballast file, or
remounted read-only), the real CLI reads and starts runs on it, and a real trainer meets ENOSPC while it
saves. Readers must never fail for want of writing, ``train`` must refuse with figures and leave nothing
behind, and a disk that fills up mid-run must leave the trained weights and a truthful final status."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.runs.disk_space import (
    RESERVE_NAME,
    check_space,
    checkpoints_kept,
    estimate_checkpoint_size,
    is_disk_full,
)
from tests.core.test_runs_detached import ROOT, Cli, write_config, write_dataset
from tests.fixtures.disk import fill, free, read_only_bind, remount, tmpfs
from tests.fixtures.watch.run_builder import build_run

DEAD = "20261130-0900-dead-run-aaaa"  # status.json says running, no supervisor holds its lock
DONE = "20261130-0800-done-run-bbbb"


def _clean(out) -> None:
    assert "Traceback" not in out.stderr, out.stderr


def _status_file(home: Path, run_id: str) -> dict:
    return json.loads((home / "runs" / run_id / "status.json").read_text())


def _readers_work(cli: Cli, home: Path) -> None:
    """runs, runs --json, status, status --json, logs: exit 0 and say crashed, whatever the disk."""
    out = cli("runs", "--json")
    _clean(out)
    rows = {r["id"]: r for r in json.loads(out.stdout)}
    assert rows[DEAD]["status"] == "crashed" and "resume" in rows[DEAD]["reason"], rows[DEAD]
    assert rows[DONE]["status"] == "finished"
    human = cli("runs")
    _clean(human)
    assert "crashed" in human.stdout
    assert cli.status(DEAD)["status"] == "crashed"
    text = cli("status", DEAD)
    _clean(text)
    assert "crashed" in text.stdout
    assert len(cli("logs", DEAD, "-n", "2").stdout.splitlines()) == 2


def _build_runs(home: Path) -> None:
    runs = home / "runs"
    runs.mkdir(parents=True)
    build_run(runs, DEAD, status="running", steps=12, total=100)
    build_run(runs, DONE, status="finished", steps=100, total=100)


def _tiny_config(tmp_path: Path, **overrides) -> Path:
    values = {"method": "lora", "lora_rank": 8, "max_steps": 20, "save_steps": 10, **overrides}
    if values["method"] == "full":
        values.pop("lora_rank")
    return write_config(tmp_path / "run.yaml", write_dataset(tmp_path / "data.jsonl"), **values)


def test_readers_work_on_a_read_only_disk_and_record_nothing(tmp_path):
    home = tmp_path / "home"
    with tmpfs(home):
        _build_runs(home)
        remount(home, "ro")
        cli = Cli(home)
        _readers_work(cli, home)
        assert _status_file(home, DEAD)["status"] == "running"  # computed, not written
        # Commands that must write refuse cleanly: one message, no traceback, nothing created.
        resume = cli("resume", DEAD, check=False)
        assert resume.returncode != 0 and resume.stderr.strip()
        _clean(resume)
        train = cli("train", str(_tiny_config(tmp_path)), check=False)
        assert train.returncode != 0 and "tunedeck:" in train.stderr, train.stderr
        _clean(train)
        assert sorted(p.name for p in (home / "runs").iterdir()) == sorted([DEAD, DONE])
        remount(home, "rw")
        cli("runs")  # the first reader that can write records what it found
        assert _status_file(home, DEAD)["status"] == "crashed"


def test_readers_work_on_a_full_disk_and_train_refuses_leaving_nothing(tmp_path):
    home = tmp_path / "home"
    with tmpfs(home):
        _build_runs(home)
        # a checkpoint for resume to go on from (marked complete): else it is refused for want of one, first
        kept = home / "runs" / DEAD / "checkpoints" / "checkpoint-200"
        kept.mkdir(parents=True)
        (kept / "COMPLETE").write_text("")
        ballast = fill(home)
        assert free(home) == 0
        cli = Cli(home)
        _readers_work(cli, home)
        assert _status_file(home, DEAD)["status"] == "running"
        # 0 bytes free: the space check refuses before anything is written, with its figures.
        train = cli("train", str(_tiny_config(tmp_path)), check=False)
        assert train.returncode == 2, train.stderr
        _clean(train)
        assert "not enough disk space" in train.stderr and "0 B free on" in train.stderr, train.stderr
        resume = cli("resume", DEAD, check=False)  # a LoRA of a 7B: ~0.5 GB a checkpoint
        assert resume.returncode == 2 and "not enough disk space" in resume.stderr, resume.stderr
        _clean(resume)
        # A model the estimator cannot size skips that check; the run directory it starts is removed again.
        # (A local folder: a hub id that is not downloaded is refused offline before the space check.)
        unsized_model = tmp_path / "unsized-model"
        unsized_model.mkdir()
        (unsized_model / "config.json").write_text('{"model_type": "no-such-architecture"}')
        unsized = cli("train", str(_tiny_config(tmp_path, model=str(unsized_model))), check=False)
        assert unsized.returncode == 1, unsized.stderr
        _clean(unsized)
        assert "cannot write" in unsized.stderr and "No space left on device" in unsized.stderr, unsized.stderr
        assert sorted(p.name for p in (home / "runs").iterdir()) == sorted([DEAD, DONE])
        ballast.unlink()
        cli("runs")
        assert _status_file(home, DEAD)["status"] == "crashed"


def _kill_runs(home: Path) -> None:
    """Teardown: no supervisor or trainer of ours outlives its test (a failed assertion mid-run)."""
    import psutil

    for record in (home / "runs").glob("*/run.json") if (home / "runs").is_dir() else []:
        try:
            pids = [(json.loads(record.read_text()).get(k) or {}).get("pid") for k in ("trainer", "supervisor")]
        except (OSError, ValueError):
            continue
        for pid in filter(None, pids):
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def _event_kinds(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if x.strip()]


def _weights_len(path: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return len(list(handle.keys()))


def test_space_check_refuses_with_figures_and_a_full_disk_mid_save_keeps_the_weights(tmp_path):
    home = tmp_path / "home"
    with tmpfs(home, "28m"):
        try:
            _refuse_then_fill_mid_save(tmp_path, home)
        finally:
            _kill_runs(home)


def _refuse_then_fill_mid_save(tmp_path: Path, home: Path) -> None:
    if True:
        cli = Cli(home)
        # Full fine-tuning of the tiny model: ~12 MB a checkpoint, 3 of them at the peak with
        # save_total_limit 2 and three saves (steps 10, 20, 30) — more than 28 MiB.
        config = _tiny_config(tmp_path, method="full", save_total_limit=2, max_steps=30)
        refused = cli("train", str(config), check=False)
        assert refused.returncode == 2, refused.stderr
        _clean(refused)
        assert "for 2 checkpoints + the final save" in refused.stderr, refused.stderr
        assert "lower save_total_limit or free space" in refused.stderr
        assert not (home / "runs").exists() or not any((home / "runs").iterdir())
        # One kept checkpoint (two at the peak, as the second save is written) fits, barely: a warning,
        # and the run starts. It saves only when stopped (its first planned save is at step 2500).
        config = _tiny_config(tmp_path, method="full", save_total_limit=1, max_steps=5000, save_steps=2500)
        started = cli("train", str(config))
        assert "disk space is tight" in started.stderr, started.stderr
        run_id = started.stdout.strip()
        run_dir = cli.run_dir(run_id)
        cli.wait_step(run_id, 3)
        assert (run_dir / RESERVE_NAME).stat().st_size == 1024 * 1024
        # Leave room for the weights (3.7 MB) but not for the optimizer state (7.3 MB) after them.
        fill(home, leave=5_500_000)
        stop = cli("stop", run_id, "--wait", "--timeout", "180", check=False)
        _clean(stop)
        status = cli.wait_status(run_id, {"failed", "finished", "stopped", "crashed"})
        assert status["status"] == "failed", status
        assert status["reason"].startswith("disk full (needed 12.1 MB, "), status["reason"]
        assert f"free on {run_dir / 'checkpoints'}" in status["reason"]
        assert f"tunedeck resume {run_id}" in status["reason"] and "weights of step" in status["reason"]
        assert json.loads((run_dir / "status.json").read_text())["reason_message"]["key"] == "runs.reason_disk_full"
        events = _event_kinds(run_dir)
        full = [e for e in events if e["event"] == "disk_full"]
        assert len(full) == 1 and full[0]["needed_bytes"] > 0 and full[0]["free_bytes"] is not None
        assert events[-1]["event"] == "failed"
        tight = next(e for e in events if e["event"] == "disk_space_low")  # the warning, for the app too
        assert tight["verdict"] == "close" and tight["checkpoints"] == 1
        # The weights of the stop's step are kept, whole, in a complete weights-only checkpoint.
        kept = Path(full[0]["weights_kept"])
        marker = json.loads((kept / "COMPLETE").read_text())
        assert marker["weights_only"] is True and marker["step"] == full[0]["step"]
        assert not (kept / "optimizer.pt").exists() and (kept / "trainer_state.json").is_file()
        assert _weights_len(kept / "model.safetensors") > 10
        assert not list((run_dir / "checkpoints").glob("*.tmp"))
        # The trainer's last lines and the supervisor's verdict reached train.log; the reserve was used.
        log = (run_dir / "train.log").read_text()
        assert "disk full on rank 0" in log and "[supervisor] trainer exited with code 1: failed" in log
        assert not (run_dir / RESERVE_NAME).exists()
        _readers_after = cli("runs", "--json")  # the disk is still full: readers still read
        assert any(r["id"] == run_id and r["status"] == "failed" for r in json.loads(_readers_after.stdout))
        # Space freed, the kept weights carry the run on (the optimizer restarts, as resume says).
        (home / "ballast").unlink()
        plain = cli("resume", run_id, check=False)
        assert plain.returncode != 0 and "--weights-only" in plain.stderr, plain.stderr
        cli("resume", run_id, "--weights-only")
        cli.wait_step(run_id, full[0]["step"] + 2)
        cli("stop", run_id, "--wait", "--timeout", "180")
        assert cli.status(run_id)["status"] == "stopped"


def test_disk_full_between_saves_ends_failed_with_the_reason_and_the_last_log_lines(tmp_path):
    home = tmp_path / "home"
    with tmpfs(home, "30m"):
        try:
            _fill_between_saves(tmp_path, home)
        finally:
            _kill_runs(home)


def _fill_between_saves(tmp_path: Path, home: Path) -> None:
    if True:
        cli = Cli(home)
        config = _tiny_config(tmp_path, max_steps=5000, save_steps=5000)
        run_id = cli("train", str(config)).stdout.strip()
        run_dir = cli.run_dir(run_id)
        cli.wait_step(run_id, 3)
        fill(home)  # nothing left: the next metrics line or log line meets ENOSPC
        status = cli.wait_status(run_id, {"failed", "finished", "stopped", "crashed"})
        assert status["status"] == "failed", status
        assert status["reason"].startswith("disk full ("), status["reason"]
        assert "lower save_total_limit" in status["reason"]
        assert any(e["event"] == "disk_full" for e in _event_kinds(run_dir))
        log = (run_dir / "train.log").read_text()
        assert "[supervisor] trainer exited with code 1: failed — disk full" in log, log[-2000:]
        assert "[rank0] " in log.split("[supervisor] trainer exited")[0].splitlines()[-1]  # its last lines, kept
        assert "disk full on rank 0" in log, log[-3000:]
        record = json.loads((run_dir / "run.json").read_text())
        assert record["attempts"][-1]["status"] == "failed"


def test_a_run_folder_that_turns_read_only_mid_run_reads_crashed_saying_why(tmp_path):
    """The run folder turns read-only while the run trains (a disk remounted read-only after I/O errors):
    its processes can record nothing, not even how they ended. The run read "the supervisor process is
    gone (machine reboot, out of host memory, kill -9?)", sending the user after the wrong cause."""
    home = tmp_path / "home"
    with tmpfs(home):
        try:
            cli = Cli(home)
            run_id = cli("train", str(_tiny_config(tmp_path, max_steps=5000, save_steps=3))).stdout.strip()
            run_dir = cli.run_dir(run_id)
            cli.wait_step(run_id, 4)  # checkpoint-3 is complete
            with read_only_bind(run_dir):
                status = cli.wait_status(run_id, {"crashed", "failed", "stopped", "finished"})
                assert status["status"] == "crashed", status
                reason = status["reason"]
                assert f"run folder {run_dir} cannot be written (Read-only file system)" in reason, reason
                assert str(run_dir / "supervisor.log") in reason and f"tunedeck resume {run_id}" in reason
                assert "kill -9" not in reason
                assert _status_file(home, run_id)["status"] == "running"  # nothing could be recorded
                resume = cli("resume", run_id, check=False)
                assert resume.returncode != 0 and "Read-only file system" in resume.stderr, resume.stderr
                _clean(resume)
            cli("runs")  # writable again: the first reader records the crash
            assert _status_file(home, run_id)["status"] == "crashed"
        finally:
            _kill_runs(home)


def test_a_train_log_that_cannot_be_written_loses_its_lines_not_the_run(tmp_path):
    """train.log alone turns unwritable mid-run (a read-only bind mount over the file: EROFS for it, the run
    folder still writable): the supervisor exited on the write error and took the trainer with it, a healthy
    run dead of its log file. Now the trainer trains on, the event and supervisor.log say once why the log
    lost lines, and once the file takes writes again train.log says how many were lost. CPU, the tiny model;
    root, for the bind mount."""
    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory

    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root (CI runs these as root)")
    home = tmp_path / "home"
    try:
        cli = Cli(home)
        run_id = cli("train", str(_tiny_config(tmp_path, max_steps=100000, save_steps=100000))).stdout.strip()
        run_dir = cli.run_dir(run_id)
        run = RunDirectory(run_dir)
        cli.wait_step(run_id, 2)
        with read_only_bind(run_dir / "train.log"):
            deadline = time.monotonic() + 240
            while not (run_dir / "events.jsonl").exists() or \
                    not any(e.get("event") == "log_unwritable" for e in _event_kinds(run_dir)):
                assert effective_status(run).active, (run.status(), (run_dir / "supervisor.log").read_text())
                assert time.monotonic() < deadline, (run_dir / "supervisor.log").read_text()
                time.sleep(0.2)
            step = run.latest_metrics()["step"]
            cli.wait_step(run_id, step + 3)  # it trains on without its log
            assert effective_status(run).status == "running"
        (event,) = [e for e in _event_kinds(run_dir) if e.get("event") == "log_unwritable"]
        assert event["path"] == str(run_dir / "train.log") and event["error"] == "Read-only file system", event
        said = (run_dir / "supervisor.log").read_text()
        assert said.count(f"cannot write {run_dir / 'train.log'}: Read-only file system") == 1, said
        stop = cli("stop", run_id, "--wait", "--timeout", "240")
        _clean(stop)
        assert cli.status(run_id)["status"] == "stopped"
        assert "lines could not be written to" in (run_dir / "train.log").read_text()
    finally:
        _kill_runs(home)


def test_a_write_refused_by_a_file_size_limit_is_not_called_a_full_disk(tmp_path):
    """``ulimit -f`` (a quota alike) refuses the optimizer state mid-save on a disk with room: the run read
    "disk full (needed 12.1 MB, 90 MB free …): free space there", space that was there all along."""
    import resource
    import subprocess
    import sys

    from tests.core.test_runs_detached import ROOT

    home = tmp_path / "home"
    with tmpfs(home, "100m"):
        try:
            cli = Cli(home)
            config = _tiny_config(tmp_path, method="full", max_steps=5000, save_steps=3, save_total_limit=1)
            limit = 6_000_000  # the weights (3.7 MB) fit, the optimizer state (7.3 MB) does not
            started = subprocess.run(
                [sys.executable, "-m", "core", "train", str(config)], cwd=ROOT, env=cli.env, capture_output=True,
                text=True, timeout=120, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
            assert started.returncode == 0, started.stderr
            run_id = started.stdout.strip()
            status = cli.wait_status(run_id, {"failed", "finished", "stopped", "crashed"})
            assert status["status"] == "failed", status
            reason = status["reason"]
            assert reason.startswith(f"could not write to {cli.run_dir(run_id) / 'checkpoints'} though it has "), reason
            assert "(12.1 MB needed): this process may write files of at most 6.0 MB (ulimit -f)" in reason, reason
            assert "disk full" not in reason and "weights of step 3 are kept" in reason
        finally:
            _kill_runs(home)


# -- the pieces, without a trainer -----------------------------------------------------------------------
def test_checkpoint_sizes_follow_the_parameter_count_and_the_method():
    from core.estimate import count_parameters, load_model_config

    params = count_parameters(load_model_config("Qwen/Qwen2.5-7B").architecture()).total
    full = estimate_checkpoint_size({"model": "Qwen/Qwen2.5-7B", "method": "full"})
    assert full.weights == 4 * params and full.optimizer == 8 * params  # fp32 weights, two fp32 moments
    bf16 = estimate_checkpoint_size({"model": "Qwen/Qwen2.5-7B", "method": "full", "pure_bf16": True,
                                     "precision": "bf16", "optimizer": "adamw_8bit"})
    assert bf16.weights == 2 * params and bf16.optimizer == 2 * params
    # torch's AdamW on bf16 parameters keeps bf16 moments: a 7B pure-bf16 checkpoint wrote 45.69 GB on the
    # H200 (bench/results/engine-speed-full-b.json), weights 15.2 + optimizer 30.5
    adamw = estimate_checkpoint_size({"model": "Qwen/Qwen2.5-7B", "method": "full", "pure_bf16": True,
                                      "precision": "bf16", "optimizer": "auto"})
    assert adamw.optimizer == 4 * params and abs(adamw.total / 1e9 - 45.69) < 0.1
    lora = estimate_checkpoint_size({"model": "Qwen/Qwen2.5-7B", "method": "lora", "lora_rank": 16})
    assert lora.trainable < params / 100 and lora.total < full.total / 100  # adapters are small
    assert checkpoints_kept({"save_total_limit": 2}) == 3
    assert checkpoints_kept({"save_total_limit": 0, "max_steps": 100, "save_steps": 30}) == 4
    # a run shorter than save_steps saves once, at its end, whatever save_total_limit says
    assert checkpoints_kept({"save_total_limit": 1, "max_steps": 10, "save_steps": 100000}) == 1
    assert checkpoints_kept({"save_total_limit": 2, "max_steps": 100, "save_steps": 30}) == 3
    assert estimate_checkpoint_size({"model": "no-such-org/unsized-model", "method": "full"}) is None


def test_space_check_counts_checkpoints_already_on_disk(tmp_path):
    cfg = {"model": "Qwen/Qwen2.5-7B", "method": "lora", "save_total_limit": 2}
    fresh = check_space(cfg, tmp_path)
    resumed = check_space(cfg, tmp_path, existing_checkpoints=2)
    assert fresh.checkpoints == 2 and resumed.checkpoints == 0
    assert fresh.needed_bytes - resumed.needed_bytes == 2 * fresh.size.total


def test_the_space_message_counts_one_checkpoint_in_the_singular(tmp_path):
    """save_total_limit 1 read "the run needs 25.2 MB for 1 checkpoints + the final save"."""
    from dataclasses import replace

    one = check_space({"model": "Qwen/Qwen2.5-7B", "method": "lora", "save_total_limit": 1}, tmp_path)
    assert one.checkpoints == 1
    for verdict in ("short", "close"):
        assert " for 1 checkpoint + the final save (" in replace(one, verdict=verdict).message.english()
    two = check_space({"model": "Qwen/Qwen2.5-7B", "method": "lora", "save_total_limit": 2}, tmp_path)
    assert " for 2 checkpoints + the final save (" in replace(two, verdict="short").message.english()


def test_real_enospc_from_torch_save_and_os_write_is_recognised(tmp_path):
    import torch

    with tmpfs(tmp_path / "small", "2m") as small:
        with pytest.raises(Exception) as torch_error:
            torch.save(torch.zeros(1024 * 1024), small / "big.pt")  # 4 MB into 2 MB
        assert is_disk_full(torch_error.value), repr(torch_error.value)
        (small / "big.pt").unlink(missing_ok=True)
        fill(small)
        with pytest.raises(OSError) as os_error:
            fd = os.open(small / "x", os.O_WRONLY | os.O_CREAT)
            try:
                os.write(fd, b"x" * 65536)
            finally:
                os.close(fd)
        assert os_error.value.errno == errno.ENOSPC and is_disk_full(os_error.value)
    assert not is_disk_full(RuntimeError("CUDA error: an illegal memory access"))


def test_a_read_only_home_on_a_fresh_box_names_tunedeck_home_as_the_way_on(tmp_path):
    """A rented box whose home is read-only (data on another disk): `tunedeck demo --detach` said "cannot
    write ~/.local: Read-only file system; free space there (or make it writable)", neither of which a user
    can do there. Nothing of tunedeck's exists yet, so it names its folder and TUNEDECK_HOME; a disk that
    turns read-only under existing runs keeps the plain message (the runs are there)."""
    home = tmp_path / "home"
    with tmpfs(home, size="200m"):
        remount(home, "ro")
        env = {k: v for k, v in os.environ.items() if k not in ("TUNEDECK_HOME", "XDG_DATA_HOME")}
        out = subprocess.run([sys.executable, "-m", "core", "demo", "--detach"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env={**env, "HOME": str(home), "OMP_NUM_THREADS": "1"})
        _clean(out)
        assert out.returncode == 1, out.stderr
        said = out.stderr.strip()
        assert said.startswith(f"tunedeck: cannot write {home / '.local'}: Read-only file system;"), said
        assert f"keeps its runs and caches in {home / '.local' / 'share' / 'tunedeck'}" in said, said
        assert "set TUNEDECK_HOME to a folder on a writable disk" in said, said
        assert list(home.iterdir()) == []
