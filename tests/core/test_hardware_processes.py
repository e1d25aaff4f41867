"""GPU process owners against this machine's real pid namespace (containers report host pids)."""

from __future__ import annotations

import dataclasses
import getpass
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
