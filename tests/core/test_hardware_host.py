"""Host readings through psutil on this machine."""

from __future__ import annotations

import os
import shutil

import pytest

from core.hardware.host import CPU_SAMPLE_MIN_S, LiveHostSampler
from core.paths import nearest_existing_dir
from core.units import format_disk


def test_nearest_existing_dir_walks_up_to_an_existing_parent(tmp_path):
    assert nearest_existing_dir(tmp_path / "a" / "b" / "c") == tmp_path
    assert nearest_existing_dir(tmp_path) == tmp_path


def test_live_sample_describes_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home-not-created-yet"))
    sampler = LiveHostSampler()
    host = sampler.sample()
    assert host.cpu_count_logical == os.cpu_count()
    assert len(host.cpu_per_core_percent) == os.cpu_count()
    assert 0.0 <= host.cpu_percent <= 100.0
    assert 0 < host.memory_used_bytes < host.memory_total_bytes
    assert host.memory_available_bytes <= host.memory_total_bytes
    assert len(host.load_average) == 3
    assert host.disk_path == str(tmp_path)
    usage = shutil.disk_usage(tmp_path)
    assert host.disk_total_bytes == usage.total
    assert abs(host.disk_free_bytes - usage.free) < 256 * 2**20  # other writers may move it a little


def test_first_sample_waits_for_a_cpu_baseline_and_later_ones_do_not():
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    sampler = LiveHostSampler(sleep=sleep, clock=lambda: now[0])
    now[0] += 0.05
    sampler.sample()
    assert len(slept) == 1 and abs(slept[0] - (CPU_SAMPLE_MIN_S - 0.05)) < 1e-9
    sampler.sample()
    assert len(slept) == 1


def test_no_wait_when_the_baseline_is_old_enough():
    now = [0.0]
    slept: list[float] = []
    sampler = LiveHostSampler(sleep=slept.append, clock=lambda: now[0])
    now[0] += 1.0
    sampler.sample()
    assert slept == []


def _other_disk() -> str:
    """A folder on another file system than the tests' temporary one (/dev/shm, a tmpfs on Linux boxes)."""
    import tempfile

    other = "/dev/shm"
    if not os.path.isdir(other) or os.stat(other).st_dev == os.stat(tempfile.gettempdir()).st_dev:
        pytest.skip("needs /dev/shm on another file system than the temporary folder")
    return other


def test_a_hub_cache_on_another_disk_is_sampled_with_its_own_free_space(tmp_path, monkeypatch):
    """The host's disk was the data root's only, while downloads go to MODELSCOPE_CACHE / HF_HOME, maybe on
    another mount: a full cache disk showed as plenty free. A cache on another file system (st_dev) is read
    with its hubs; one on the data root's is not repeated. Box: Linux with /dev/shm a tmpfs."""
    other = _other_disk()
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", f"{other}/tunedeck-test-not-created/ms")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    host = LiveHostSampler().sample()
    (disk,) = host.cache_disks
    assert disk.hubs == ("modelscope",) and disk.path == other
    assert disk.total_bytes == shutil.disk_usage(other).total != host.disk_total_bytes
    from core.hardware.commands import host_line

    line = host_line(host)
    assert f"; ModelScope hub cache: {format_disk(disk.free_bytes)} free of {format_disk(disk.total_bytes)} " \
           f"at {other} (another disk)" in line, line

    monkeypatch.setenv("HF_HOME", f"{other}/tunedeck-test-not-created/hf")  # both there: one disk, two hubs
    (disk,) = LiveHostSampler().sample().cache_disks
    assert disk.hubs == ("modelscope", "hf")
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    host = LiveHostSampler().sample()
    assert host.cache_disks == () and "hub cache" not in host_line(host)
