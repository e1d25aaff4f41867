"""GPU processes linked to tunedeck runs through the pids and start times the supervisor records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from core.hardware.run_links import TRAINER, WORKER, RunLink, RunLinker
from core.hardware.snapshot import GpuProcess

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process ancestry from /proc")


def write_run(root: Path, run_id: str, **record) -> Path:
    path = root / run_id
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"id": run_id, **record}), encoding="utf-8")
    return path


def started(pid: int) -> float:
    return psutil.Process(pid).create_time()


def seen(pid: int, start: float | None = None) -> GpuProcess:
    return GpuProcess(pid, 2**30, visible=True, started_at=started(pid) if start is None else start)


@pytest.fixture
def child():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def launcher_with_worker(tmp_path):
    """A stand-in for torchrun: a process whose child (the rank) holds the GPU."""
    ready = tmp_path / "worker.pid"
    code = (
        "import subprocess, time\n"
        "worker = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(ready)!r}, 'w').write(str(worker.pid))\n"
        "worker.wait()\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text()):
        assert time.monotonic() < deadline, "the launcher never started its worker"
        time.sleep(0.02)
    worker = int(ready.read_text())
    try:
        yield launcher, worker
    finally:
        try:
            psutil.Process(worker).kill()
        except psutil.NoSuchProcess:
            pass
        launcher.kill()
        launcher.wait()


def test_the_trainer_recorded_by_the_supervisor_is_linked(tmp_path, child):
    path = write_run(tmp_path, "20261129-2100-qwen", trainer={"pid": child.pid, "start_time": started(child.pid)})
    write_run(tmp_path, "20261128-0900-other", trainer={"pid": 1, "start_time": 0.0})
    links = RunLinker(root=lambda: tmp_path).link([seen(child.pid)])
    assert links == {child.pid: RunLink("20261129-2100-qwen", str(path), TRAINER)}


def test_a_reused_pid_is_not_the_runs(tmp_path, child):
    """run.json names the pid, but with another start time: an old trainer whose pid was given again."""
    write_run(tmp_path, "20261129-2100-old", trainer={"pid": child.pid, "start_time": started(child.pid) - 3600})
    assert RunLinker(root=lambda: tmp_path).link([seen(child.pid)]) == {}


def test_a_rank_under_the_recorded_launcher_is_a_worker_of_the_run(tmp_path, launcher_with_worker):
    launcher, worker = launcher_with_worker
    path = write_run(tmp_path, "20261129-2200-ddp", trainer={"pid": launcher.pid, "start_time": started(launcher.pid)})
    links = RunLinker(root=lambda: tmp_path).link([seen(worker)])
    assert links == {worker: RunLink("20261129-2200-ddp", str(path), WORKER)}


def test_a_child_of_the_supervisor_is_the_runs_too(tmp_path, child):
    """Between attempts run.json may still name the last trainer: the supervisor's own child is linked."""
    me = psutil.Process()
    write_run(tmp_path, "20261129-2300-sup", supervisor={"pid": me.pid, "start_time": me.create_time()})
    assert RunLinker(root=lambda: tmp_path).link([seen(child.pid)])[child.pid].role == WORKER


def test_a_replayed_pid_that_names_another_process_here_is_not_walked(tmp_path, child):
    """A recording's pid with its recorded start time: here the number is an unrelated process."""
    me = psutil.Process()
    write_run(tmp_path, "20261129-2300-sup", supervisor={"pid": me.pid, "start_time": me.create_time()})
    assert RunLinker(root=lambda: tmp_path).link([seen(child.pid, start=1795980000.0)]) == {}


def test_hidden_processes_and_processes_without_start_are_never_linked(tmp_path, child):
    write_run(tmp_path, "20261129-2100-qwen", trainer={"pid": child.pid, "start_time": started(child.pid)})
    linker = RunLinker(root=lambda: tmp_path)
    assert linker.link([GpuProcess(child.pid, visible=False, hidden_reason="not_in_namespace")]) == {}
    assert linker.link([GpuProcess(child.pid, visible=True)]) == {}


def test_records_are_read_again_only_when_they_change(tmp_path, child):
    linker = RunLinker(root=lambda: tmp_path)
    path = write_run(tmp_path, "20261129-2100-qwen", status="queued")
    assert linker.link([seen(child.pid)]) == {}
    # The supervisor records its trainer: the changed run.json is read again.
    record = path / "run.json"
    record.write_text(json.dumps({"trainer": {"pid": child.pid, "start_time": started(child.pid)}}), encoding="utf-8")
    os.utime(record, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert linker.link([seen(child.pid)])[child.pid].run_id == "20261129-2100-qwen"


def test_no_runs_directory_links_nothing(tmp_path, child):
    assert RunLinker(root=lambda: tmp_path / "absent").link([seen(child.pid)]) == {}
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{not json", encoding="utf-8")
    assert RunLinker(root=lambda: tmp_path).link([seen(child.pid)]) == {}
