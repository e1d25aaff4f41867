"""`tunedeck gpus [--json]` as a real subprocess: output, exit codes, the fake-GPU switch."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.hardware.snapshot import BoxSnapshot, load_snapshot
from core.i18n import t

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gpus"


def run_gpus(tmp_path: Path, *args: str, fake: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TUNEDECK_FAKE_GPUS"}
    env["TUNEDECK_HOME"] = str(tmp_path)
    env["LANG"] = "C.UTF-8"
    env["PYTHONIOENCODING"] = "utf-8"
    if fake is not None:
        env["TUNEDECK_FAKE_GPUS"] = str(fake)
    return subprocess.run(
        [sys.executable, "-m", "core", "--lang", "en", "gpus", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, encoding="utf-8", timeout=60,
    )


def test_json_with_fake_gpus_is_a_valid_snapshot(tmp_path):
    result = run_gpus(tmp_path, "--json", fake=FIXTURES / "h200x8.json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # stdout holds the JSON and nothing else
    snapshot = BoxSnapshot.from_json(data)
    recording = load_snapshot(FIXTURES / "h200x8.json")
    assert data["schema"] == 1 and data["synthetic"] is True and data["nvml_error"] is None
    assert [g.uuid for g in snapshot.gpus] == [g.uuid for g in recording.gpus]
    assert [g.memory_total_bytes for g in snapshot.gpus] == [g.memory_total_bytes for g in recording.gpus]
    assert snapshot.topology == recording.topology
    assert data["topology"]["matrix"][0][1] == "NV18"
    assert all(0 <= g.utilization_gpu_pct <= 100 for g in snapshot.gpus)
    assert "fake" in result.stderr


def test_table_with_fake_gpus(tmp_path):
    recording = load_snapshot(FIXTURES / "h200x2.json")
    result = run_gpus(tmp_path, fake=FIXTURES / "h200x2.json")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines[0].split()
    assert header == ["GPU", "Name", "Memory", "Util", "Temp", "Power", "Procs"]
    gpu_rows = [line for line in lines if line.lstrip().startswith(("0 ", "1 "))]
    assert len(gpu_rows) == len(recording.gpus) == 2
    for row, gpu in zip(gpu_rows, recording.gpus, strict=True):
        assert row.split()[0] == str(gpu.index) and gpu.name in row
        assert f"/{gpu.memory_total_bytes // 2**20} MiB" in row
        assert f"/{gpu.power_limit_w:.0f} W" in row
        assert row.split()[-1] == str(len(gpu.processes))
    for gpu in recording.gpus:
        for proc in gpu.processes:
            assert any(f"GPU {gpu.index}  pid {proc.pid} " in line for line in lines)
    assert recording.topology is not None
    cell = recording.topology.matrix()[0][1]
    assert any(line.split()[:3] == ["GPU0", "X", cell] for line in lines)
    host = recording.host
    assert any(line.startswith(f"Host {host.hostname}") and f"{host.cpu_count_logical} cores" in line
               for line in lines)
    assert f"Driver {recording.driver_version}, CUDA {recording.cuda_driver_version}" in lines


def _libnvidia_ml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


needs_no_driver = pytest.mark.skipif(
    _libnvidia_ml_loads(), reason="checks the no-driver path; this machine has libnvidia-ml"
)


@pytest.mark.skipif(not _libnvidia_ml_loads(), reason="checks the real-GPU path; this machine has no driver")
def test_real_gpus_exit_0(tmp_path):
    result = run_gpus(tmp_path, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["gpus"]


@needs_no_driver
def test_no_nvml_library_exits_2_with_the_reason(tmp_path):
    result = run_gpus(tmp_path)
    assert result.returncode == 2
    assert t("hardware.unavailable.library_not_found") in result.stderr
    assert result.stdout.startswith("Host ")  # host information is still shown


@needs_no_driver
def test_no_nvml_library_with_json_still_prints_json(tmp_path):
    result = run_gpus(tmp_path, "--json")
    assert result.returncode == 2
    data = json.loads(result.stdout)
    assert data["gpus"] == [] and data["nvml_error"]["reason"] == "library_not_found"
    assert data["nvml_error"]["nvml_code"] == 12
    assert data["host"]["cpu_count_logical"] == os.cpu_count()
    assert "install the NVIDIA driver" in result.stderr


@pytest.mark.parametrize(("name", "reason"), [("none.json", "library_not_found"), ("zero.json", "no_gpus")])
def test_unavailable_recordings_exit_2(tmp_path, name, reason):
    result = run_gpus(tmp_path, "--json", fake=FIXTURES / name)
    assert result.returncode == 2
    assert json.loads(result.stdout)["nvml_error"]["reason"] == reason


def test_a_broken_recording_is_a_clear_error(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("[1, 2", encoding="utf-8")
    result = run_gpus(tmp_path, fake=broken)
    assert result.returncode == 2
    assert "TUNEDECK_FAKE_GPUS" in result.stderr and str(broken) in result.stderr
    assert "Traceback" not in result.stderr


def test_gpus_is_listed_in_help(tmp_path):
    env = dict(os.environ, TUNEDECK_HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "core", "--help"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "gpus" in result.stdout


def test_a_multi_line_command_is_one_line_of_the_table_and_unchanged_in_json(tmp_path):
    """A ``python -c`` script's newlines (and a hostile command's escape sequences) broke the table and reached
    the terminal raw: each process is one line, its command folded as the GPU screen shows it; --json keeps it."""
    recording = load_snapshot(FIXTURES / "h200x2.json")
    scripted = [p for g in recording.gpus for p in g.processes if "\n" in (p.command or "")]
    assert scripted  # the recording holds a multi-line command, as a real box's python -c
    hostile = "python3 train.py\t--name \x1b]0;owned\x07x\r\n--steps 5\x00"
    gpus = tuple(dataclasses.replace(g, processes=(*g.processes, dataclasses.replace(g.processes[0], pid=9000 + g.index,
                                                                                      command=hostile)))
                 if g.index == 1 else g for g in recording.gpus)
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(dataclasses.replace(recording, gpus=gpus).to_json()), encoding="utf-8")

    result = run_gpus(tmp_path, fake=path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    process_lines = [line for line in lines if line.startswith("  GPU ")]
    assert len(process_lines) == sum(len(g.processes) for g in gpus) == 3
    assert all(line.split()[:4] == ["GPU", str(g.index), "pid", str(p.pid)]
               for line, (g, p) in zip(process_lines, [(g, p) for g in gpus for p in g.processes], strict=True))
    first = scripted[0].command
    assert any(line.endswith("  " + " ".join(first.split())) for line in process_lines)
    assert any(line.endswith("  python3 train.py --name ]0;owned x --steps 5") for line in process_lines)
    assert not any(ch in result.stdout for ch in "\x1b\x07\x00\r\t")
    assert lines[len(recording.gpus) + 1 + 3].startswith("Topology")  # nothing of a command after the processes

    data = json.loads(run_gpus(tmp_path, "--json", fake=path).stdout)
    commands = [p["command"] for g in data["gpus"] for p in g["processes"]]
    assert first in commands and hostile in commands  # the real command lines, unchanged


def test_a_process_without_a_memory_reading_says_na_without_a_unit():
    """NVML gives no per-process memory under MIG or in some containers: the line read "N/A MiB"."""
    import dataclasses

    from core.hardware.commands import render_snapshot
    from core.hardware.snapshot import GpuProcess

    recording = load_snapshot(FIXTURES / "h200x2.json")
    gpu = recording.gpus[0]
    known = dataclasses.replace(gpu.processes[0], pid=101)
    unknown = GpuProcess(pid=102, used_memory_bytes=None, visible=True, user="root", command="python x.py")
    box = dataclasses.replace(recording, gpus=(dataclasses.replace(gpu, processes=(known, unknown)),))
    lines = render_snapshot(box)
    assert f"  GPU 0  pid 101  {known.used_memory_bytes // 2**20} MiB  root  " in "\n".join(lines)
    assert "  GPU 0  pid 102  N/A  root  python x.py" in lines


def test_a_lost_gpu_says_so_and_does_not_claim_zero_processes():
    """A GPU NVML calls lost (Xid 79) read as a row of N/A with 0 processes, as an idle GPU would."""
    import dataclasses

    from core.hardware.commands import render_snapshot

    recording = load_snapshot(FIXTURES / "h200x2.json")
    lost = dataclasses.replace(recording.gpus[1], memory_used_bytes=None, utilization_gpu_pct=None,
                               temperature_c=None, power_draw_w=None, processes=(), lost=True)
    lines = render_snapshot(dataclasses.replace(recording, gpus=(recording.gpus[0], lost)))
    row = next(line for line in lines if line.startswith("  1  "))
    assert "lost" in row and row.split()[-1] == "N/A"
    assert t("hardware.cli.lost", index=1) in lines
    healthy = next(line for line in lines if line.startswith("  0  "))
    assert "lost" not in healthy and healthy.split()[-1] == "1"


def test_mig_devices_are_listed_as_the_gpu_screen_counts_them():
    """h200x1 with MIG on (two MIG devices): the GPU screen's card said "MIG 2", `tunedeck gpus` said nothing of
    MIG (its Util N/A unexplained, the MIG UUIDs that CUDA_VISIBLE_DEVICES takes nowhere)."""
    import dataclasses

    from core.hardware.commands import render_snapshot
    from core.hardware.snapshot import MigInstance

    recording = load_snapshot(FIXTURES / "h200x1.json")
    migs = (MigInstance(index=0, uuid="MIG-aaaa", gpu_instance_id=1, compute_instance_id=0,
                        memory_total_bytes=71 * 2**30, memory_used_bytes=2**30),
            MigInstance(index=3, uuid=None, gpu_instance_id=5, compute_instance_id=0,
                        memory_total_bytes=35 * 2**30, memory_used_bytes=None))
    gpu = dataclasses.replace(recording.gpus[0], mig_enabled=True, mig_instances=migs)
    lines = render_snapshot(dataclasses.replace(recording, gpus=(gpu,)))
    assert "  GPU 0  MIG 0  GI 1 CI 0  1024/72704 MiB  MIG-aaaa" in lines
    assert "  GPU 0  MIG 3  GI 5 CI 0  N/A/35840 MiB  N/A" in lines
    assert not any("MIG" in line for line in render_snapshot(recording))  # MIG off: no MIG lines
