"""The snapshot data model: JSON round trip, N/A as null, format errors that say where."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from core.hardware.snapshot import (
    SCHEMA_VERSION,
    BoxSnapshot,
    GpuProcess,
    GpuSnapshot,
    HostSnapshot,
    MigInstance,
    NvmlUnavailable,
    SnapshotFormatError,
    Topology,
    load_snapshot,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "gpus"
RECORDINGS = sorted(FIXTURES.glob("*.json"))


def test_fixture_folder_has_the_expected_recordings():
    names = {p.name for p in RECORDINGS}
    assert {"h200x1.json", "h200x2.json", "h200x8.json", "none.json", "zero.json"} <= names


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.name)
def test_every_recording_round_trips_through_json(path):
    raw = json.loads(path.read_text(encoding="utf-8"))
    snapshot = BoxSnapshot.from_json(raw, where=str(path))
    again = BoxSnapshot.from_json(json.loads(json.dumps(snapshot.to_json())))
    assert again == snapshot
    assert snapshot.to_json() == raw  # the files are exactly what to_json writes
    assert raw["schema"] == SCHEMA_VERSION


def test_h200x8_is_marked_synthetic_and_has_eight_h200():
    snapshot = load_snapshot(FIXTURES / "h200x8.json")
    assert snapshot.synthetic is True
    assert [g.index for g in snapshot.gpus] == list(range(8))
    assert {g.name for g in snapshot.gpus} == {"NVIDIA H200"}
    assert {g.memory_total_bytes for g in snapshot.gpus} == {143771 * 1024 * 1024}
    assert {g.power_limit_w for g in snapshot.gpus} == {700.0}


def test_none_values_serialise_as_null_and_come_back_as_none():
    snapshot = BoxSnapshot(
        taken_at=1.5,
        host=HostSnapshot(),
        gpus=(GpuSnapshot(index=0, name="NVIDIA H200", temperature_c=None, ecc_uncorrected_volatile=None),),
    )
    data = snapshot.to_json()
    gpu = data["gpus"][0]
    assert gpu["temperature_c"] is None and gpu["ecc_uncorrected_volatile"] is None
    assert "null" in json.dumps(data)
    back = BoxSnapshot.from_json(data)
    assert back.gpus[0].temperature_c is None
    assert back == snapshot


def test_full_model_round_trip_with_mig_processes_topology_and_error():
    snapshot = BoxSnapshot(
        taken_at=10.0,
        host=HostSnapshot(hostname="h", cpu_percent=3.0, load_average=(0.5, 0.25, 0.125)),
        gpus=(
            GpuSnapshot(
                index=0,
                mig_enabled=True,
                mig_instances=(MigInstance(index=2, uuid="MIG-1", gpu_instance_id=1, memory_total_bytes=10),),
                processes=(
                    GpuProcess(pid=7, used_memory_bytes=None, visible=False, hidden_reason="not_in_namespace"),
                ),
            ),
        ),
        topology=Topology(gpus=(0, 1), pcie=(("X", "SYS"), ("SYS", "X")),
                          nvlink_direct=((0, 2), (2, 0)), nvswitch_links=(0, 0)),
        nvml_error=NvmlUnavailable("nvml_error", "broken", 999),
    )
    data = snapshot.to_json()
    assert data["pid_namespace_mismatch"] is True
    assert data["topology"]["matrix"] == [["X", "NV2"], ["NV2", "X"]]
    assert BoxSnapshot.from_json(json.loads(json.dumps(data))) == snapshot


def test_topology_labels_like_nvidia_smi():
    topo = Topology(
        gpus=(0, 1, 2, 3),
        pcie=(("X", "PIX", "SYS", None), ("PIX", "X", "SYS", "SYS"), ("SYS", "SYS", "X", "NODE"),
              (None, "SYS", "NODE", "X")),
        nvlink_direct=((0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 4), (0, 0, 4, 0)),
        nvswitch_links=(12, 18, 0, 0),
    )
    assert topo.label(0, 0) == "X"
    assert topo.label(0, 1) == "NV12"  # through NVSwitches: the smaller side's link count
    assert topo.label(2, 3) == "NV4"  # direct
    assert topo.label(1, 2) == "SYS"
    assert topo.label(0, 3) == "N/A"
    assert topo.matrix()[3] == ("N/A", "SYS", "NV4", "X")


def test_memory_helpers_handle_na():
    gpu = GpuSnapshot(index=0, memory_total_bytes=100, memory_used_bytes=25)
    assert gpu.memory_free_bytes == 75 and gpu.memory_used_fraction == 0.25
    unknown = GpuSnapshot(index=0, memory_total_bytes=100)
    assert unknown.memory_free_bytes is None and unknown.memory_used_fraction is None


def test_newer_schema_is_refused_with_a_clear_message():
    data = load_snapshot(FIXTURES / "h200x1.json").to_json()
    data["schema"] = SCHEMA_VERSION + 1
    with pytest.raises(SnapshotFormatError, match="newer than this tunedeck reads"):
        BoxSnapshot.from_json(data, where="rec.json")


def test_format_errors_name_the_file_and_the_key(tmp_path):
    data = load_snapshot(FIXTURES / "h200x2.json").to_json()
    del data["gpus"][1]["index"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SnapshotFormatError) as err:
        load_snapshot(path)
    assert str(path) in str(err.value) and "gpus[1]" in str(err.value) and "'index'" in str(err.value)

    data = load_snapshot(FIXTURES / "h200x2.json").to_json()
    data["gpus"][0]["temperature_c"] = "hot"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SnapshotFormatError, match=r"gpus\[0\]\.temperature_c: expected int"):
        load_snapshot(path)

    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(SnapshotFormatError, match="not valid JSON"):
        load_snapshot(path)
    with pytest.raises(SnapshotFormatError, match="cannot read"):
        load_snapshot(tmp_path / "missing.json")


def test_unknown_keys_are_ignored_for_forward_compatibility():
    data = load_snapshot(FIXTURES / "h200x1.json").to_json()
    data["gpus"][0]["fan_speed_pct"] = 40
    data["future_thing"] = {"x": 1}
    snapshot = BoxSnapshot.from_json(data)
    assert snapshot.gpus[0].name == "NVIDIA H200"


def test_snapshots_are_frozen():
    snapshot = load_snapshot(FIXTURES / "h200x1.json")
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.gpus[0].temperature_c = 1  # type: ignore[misc]
