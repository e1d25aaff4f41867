"""Host readings through psutil on this machine."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from core.hardware.host import CPU_SAMPLE_MIN_S, LiveHostSampler
from core.paths import nearest_existing_dir
from core.units import format_disk
from tests.users import as_nobody


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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to become nobody")
def test_an_unreadable_data_root_is_said_and_no_hub_cache_is_called_another_disk(tmp_path):
    """A data root that cannot be read (a folder on its way that may not be searched: another user's home)
    made the host sample fail (PermissionError out of the GPU screen's poll and `tunedeck gpus`), and
    ``cache_disks`` call every hub cache "another disk", the data root's disk being unknown. Now the sample
    says the data root cannot be read (why, what to do), with no disk figures and no cache called another
    disk. No GPU: the host only; the reader is ``nobody``, the data root under the tests' folder (0700, root's)."""
    from core.hardware.commands import host_line
    from core.hardware.host import cache_disks
    from core.hardware.snapshot import HostSnapshot

    assert os.stat(tmp_path.parent).st_mode & 0o077 == 0  # pytest's folders: root's alone
    data = tmp_path / "home"
    data.mkdir()
    # The HF cache on the data root's own disk, readable by all (under the deepest folder on the data root's way
    # that every user may search: the temporary folder, or wherever --basetemp put the tests' folders); the
    # ModelScope one unreadable as well.
    searchable = Path("/")
    for folder in reversed(data.parents):
        if not os.stat(folder).st_mode & 0o001:
            break
        searchable = folder
    if os.stat(searchable).st_dev != os.stat(data).st_dev:
        pytest.skip(f"no folder every user may search on the data root's disk ({searchable} is on another)")
    readable = [("hf", searchable / "tunedeck-test-not-created" / "hf")]
    caches = [("modelscope", tmp_path / "ms"), *readable]
    sampler = LiveHostSampler(disk_path=lambda: data, caches=lambda: caches)

    def job():
        disks = len(cache_disks(data, readable))
        host = sampler.sample()
        return {"disks": disks, "line": host_line(host),
                "host": [host.disk_path, host.disk_error, host.disk_free_bytes, len(host.cache_disks)]}

    result = as_nobody(job)
    assert "error" not in result, result["error"]
    assert result["disks"] == 0  # was 1: the HF cache "on another disk", the data root's own
    assert result["host"] == [str(data), "Permission denied", None, 0], result
    assert f"disk not known: the data root {data} cannot be read (Permission denied); make it readable, or set " \
           "TUNEDECK_HOME to a folder you can write" in result["line"], result["line"]
    assert HostSnapshot().disk_error is None  # recordings made before it read as a data root that read
