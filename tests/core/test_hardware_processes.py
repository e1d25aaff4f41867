"""GPU process owners against this machine's real pid namespace (containers report host pids)."""

from __future__ import annotations

import dataclasses
import getpass
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.hardware.fake_nvml import fake_monitor_from_recording
from core.hardware.processes import NOT_A_GPU_PROCESS, NOT_IN_NAMESPACE, LiveProcessResolver, redact_command
from core.hardware.snapshot import GpuProcess, load_snapshot

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpus"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/maps")


def wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"child never wrote {path}")
        time.sleep(0.02)


@pytest.fixture
def gpu_like_child(tmp_path):
    """A real process that maps a file called libcuda.so.1, as every CUDA process maps the driver."""
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\0" * 4096)
    ready = tmp_path / "ready"
    code = (
        "import mmap, sys, time\n"
        f"f = open({str(lib)!r}, 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, "--marker-arg", "--hub-token", "hf_abcdefghijklmnopqrstuvwxyz",
                              "--api_key=s3cr3t", "HF_TOKEN=zzzz"])
    try:
        wait_for(ready)
        yield child
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def plain_child():
    """A real process here that uses no GPU (what a host pid often collides with in a container)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def gone_pid() -> int:
    """A pid that no longer exists here: a child that exited and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_gpu_process_in_this_namespace_is_shown_with_user_and_command(gpu_like_child):
    proc = LiveProcessResolver().resolve(gpu_like_child.pid, 1024)
    assert proc.visible is True and proc.hidden_reason is None
    assert proc.user == getpass.getuser()
    assert proc.command is not None and "--marker-arg" in proc.command
    assert proc.used_memory_bytes == 1024
    # Secrets on a command line are never shown nor recorded.
    assert "hf_abc" not in proc.command and "s3cr3t" not in proc.command and "zzzz" not in proc.command
    assert "--hub-token ***" in proc.command and "--api_key=***" in proc.command and "HF_TOKEN=***" in proc.command


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["python", "train.py", "--token", "abc"], "python train.py --token ***"),
        (["python", "--hf-token=abc", "--lr", "1e-4"], "python --hf-token=*** --lr 1e-4"),
        (["sh", "-c", "MODELSCOPE_API_TOKEN=abc python x.py"], "sh -c MODELSCOPE_API_TOKEN=*** python x.py"),
        (["python", "push.py", "hf_0123456789abcdefghijXYZ"], "python push.py ***"),
        (["python", "-m", "core.engine.worker", "/runs/r1"], "python -m core.engine.worker /runs/r1"),
    ],
)
def test_command_lines_are_redacted(argv, shown):
    assert redact_command(argv) == shown


def test_a_pid_that_is_another_non_gpu_process_here_is_not_attributed(plain_child):
    proc = LiveProcessResolver().resolve(plain_child.pid, 1024)
    assert proc.visible is False and proc.hidden_reason == NOT_A_GPU_PROCESS
    assert proc.user is None and proc.command is None


def test_a_pid_absent_from_this_namespace_is_flagged():
    proc = LiveProcessResolver().resolve(gone_pid(), None)
    assert proc.visible is False and proc.hidden_reason == NOT_IN_NAMESPACE
    assert proc.user is None and proc.command is None


def test_snapshot_flags_pid_namespace_mismatch(gpu_like_child, plain_child):
    """The fake NVML reports three pids; the real resolver judges them against this machine."""
    recording = load_snapshot(FIXTURES / "h200x2.json")
    missing = gone_pid()
    gpu0 = dataclasses.replace(recording.gpus[0], processes=(GpuProcess(gpu_like_child.pid, 5 * 2**30),))
    gpu1 = dataclasses.replace(
        recording.gpus[1],
        processes=(GpuProcess(plain_child.pid, 6 * 2**30), GpuProcess(missing, 7 * 2**30)),
    )
    recording = dataclasses.replace(recording, gpus=(gpu0, gpu1))
    monitor = fake_monitor_from_recording(recording, processes=LiveProcessResolver())
    snapshot = monitor.poll()
    shown = snapshot.gpus[0].processes[0]
    assert shown.visible and shown.pid == gpu_like_child.pid and shown.used_memory_bytes == 5 * 2**30
    hidden = {p.pid: p for p in snapshot.gpus[1].processes}
    assert hidden[plain_child.pid].hidden_reason == NOT_A_GPU_PROCESS
    assert hidden[missing].hidden_reason == NOT_IN_NAMESPACE
    assert snapshot.pid_namespace_mismatch is True
    assert snapshot.to_json()["pid_namespace_mismatch"] is True


def test_no_mismatch_when_every_pid_is_a_gpu_process_here(gpu_like_child):
    recording = load_snapshot(FIXTURES / "h200x1.json")
    gpu = dataclasses.replace(recording.gpus[0], processes=(GpuProcess(gpu_like_child.pid, 2**30),))
    monitor = fake_monitor_from_recording(dataclasses.replace(recording, gpus=(gpu,)),
                                          processes=LiveProcessResolver())
    snapshot = monitor.poll()
    assert snapshot.pid_namespace_mismatch is False
    assert snapshot.gpus[0].processes[0].user == getpass.getuser()


def test_resolver_cache_follows_the_process_not_the_pid(plain_child):
    resolver = LiveProcessResolver()
    first = resolver.resolve(plain_child.pid, 1)
    assert resolver.resolve(plain_child.pid, 2).hidden_reason == first.hidden_reason
    resolver.forget_except(set())
    assert resolver._cache == {}


@pytest.fixture
def busy_gpu_like_child(tmp_path):
    """A GPU-like process (maps libcuda.so.1) that keeps one core busy."""
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"\0" * 4096)
    ready = tmp_path / "ready"
    code = (
        "import mmap, time\n"
        f"f = open({str(lib)!r}, 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "block = bytearray(32 * 1024 * 1024)\n"  # resident memory the reader must see
        f"open({str(ready)!r}, 'w').close()\n"
        "end = time.time() + 60\n"
        "while time.time() < end:\n"
        "    pass\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        wait_for(ready)
        yield child
    finally:
        child.kill()
        child.wait()


def test_live_readings_start_time_rss_and_cpu_from_proc(busy_gpu_like_child):
    """The start time is the process's own, RSS is what it holds, CPU % comes from the second poll on."""
    import psutil

    resolver = LiveProcessResolver()
    first = resolver.resolve(busy_gpu_like_child.pid, 1)
    assert first.started_at == psutil.Process(busy_gpu_like_child.pid).create_time()
    assert first.host_memory_bytes is not None and first.host_memory_bytes >= 32 * 1024 * 1024
    assert first.cpu_percent is None  # no interval to measure over yet
    deadline = time.monotonic() + 30
    while True:  # a state to reach (a busy core shows), not a speed: the box may be loaded
        again = resolver.resolve(busy_gpu_like_child.pid, 1)
        if again.cpu_percent is not None and again.cpu_percent > 20:
            break
        assert time.monotonic() < deadline, f"CPU % never showed the busy core: {again.cpu_percent}"
        time.sleep(0.1)
    assert again.started_at == first.started_at and again.user == first.user


def test_cpu_percent_is_the_share_of_a_core_between_two_polls(gpu_like_child):
    """An idle process: its CPU seconds barely move between two polls, whatever the wall time between."""
    now = [100.0]
    resolver = LiveProcessResolver(clock=lambda: now[0])
    assert resolver.resolve(gpu_like_child.pid, 1).cpu_percent is None
    now[0] += 10.0
    idle = resolver.resolve(gpu_like_child.pid, 1).cpu_percent
    assert idle is not None and 0.0 <= idle < 5.0
    resolver.forget_except(set())
    assert resolver._cpu_seen == {} and resolver._cache == {}


def test_hidden_processes_carry_no_readings_of_the_process_that_holds_the_pid(plain_child):
    proc = LiveProcessResolver().resolve(plain_child.pid, 1024)
    assert proc.visible is False
    assert proc.started_at is None and proc.cpu_percent is None and proc.host_memory_bytes is None


def test_a_recording_replays_its_readings_and_never_looks_the_pid_up_here():
    recorded = GpuProcess(os.getpid(), 5, visible=True, user="root", command="python -m x",
                          started_at=1795980000.0, cpu_percent=99.5, host_memory_bytes=7 * 2**30)
    from core.hardware.processes import RecordedProcessResolver

    shown = RecordedProcessResolver({recorded.pid: recorded}).resolve(recorded.pid, 2**30)
    assert shown == dataclasses.replace(recorded, used_memory_bytes=2**30)
