"""Starting a run asks NVML how many GPUs there are and whether the first does bf16: through the
hardware backend (``read_gpu_identities``), run here against the fake NVML over recordings."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from core.hardware.fake_nvml import fake_nvml_from_recording
from core.hardware.nvml_backend import read_gpu_identities
from core.runs import gpus as run_gpus
from core.runs.gpus import visible_gpu_count
from core.runs.lifecycle import _gpu_caps

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gpus"


def fake(name: str, **options):
    return fake_nvml_from_recording(FIXTURES / f"{name}.json", **options)


def test_identities_name_each_gpu_and_shut_nvml_down_again():
    nvml = fake("h200x2", compute_capability=(9, 0))
    found = read_gpu_identities(nvml)
    assert found.error is None
    assert [(g.index, g.name, g.compute_capability) for g in found.gpus] == [
        (0, "NVIDIA H200", (9, 0)), (1, "NVIDIA H200", (9, 0))]
    assert nvml.calls["nvmlInit"] == 1 and nvml.calls["nvmlShutdown"] == 1 and not nvml.initialized
    # No per-poll readings: starting a run is not monitoring.
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 0
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses"] == 0


def test_zero_gpus_is_an_error_and_nvml_is_still_shut_down():
    nvml = fake("zero")
    found = read_gpu_identities(nvml)
    assert found.gpus == () and found.error is not None and found.error.reason == "no_gpus"
    assert nvml.calls["nvmlShutdown"] == 1 and not nvml.initialized


def test_visible_gpu_count_counts_and_narrows_by_cuda_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpu_count(fake("h200x8")) == 8
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")
    assert visible_gpu_count(fake("h200x8")) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    nvml = fake("h200x8")
    assert visible_gpu_count(nvml) == 0
    assert nvml.calls["nvmlInit"] == 0  # hidden by the environment: NVML is not even asked


@pytest.mark.parametrize("recording, fail", [("zero", None), ("h200x2", "driver_not_loaded"),
                                             ("h200x2", "no_permission"), ("none", None)])
def test_a_box_without_usable_nvml_has_no_gpus(monkeypatch, recording, fail):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpu_count(fake(recording, fail=fail)) == 0
    assert _gpu_caps(fake(recording, fail=fail, compute_capability=(9, 0))) is None


def test_without_the_binding_cuda_itself_is_asked(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    monkeypatch.setattr(run_gpus, "_torch_gpu_count", lambda: 3)
    assert read_gpu_identities().error.reason == "binding_missing"
    assert visible_gpu_count() == 3
    assert _gpu_caps() is None


def test_gpu_caps_say_bf16_from_the_compute_capability():
    assert _gpu_caps(fake("h200x2", compute_capability=(9, 0))) == {"bf16": True, "name": "NVIDIA H200"}
    assert _gpu_caps(fake("h200x2", compute_capability=(7, 5))) == {"bf16": False, "name": "NVIDIA H200"}
    # A driver that cannot say: no capabilities rather than a guess.
    assert _gpu_caps(fake("h200x2")) is None


def test_nvml_is_called_only_by_the_hardware_backend():
    """core.hardware wraps NVML (NvmlBackend, and the fake that stands in for it); nothing else in core
    or the app imports the binding."""
    binding = re.compile(r"^\s*(import|from)\s+pynvml\b", re.MULTILINE)
    files = sorted((ROOT / "core").rglob("*.py")) + sorted((ROOT / "tui").rglob("*.py"))
    offenders = [str(p.relative_to(ROOT)) for p in files
                 if p.parent.name != "hardware" and binding.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
