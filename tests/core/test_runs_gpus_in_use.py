"""A second run on the GPUs of a live one is refused (it would run both out of memory), unless asked for.

Hardware: a box of 2 GPUs as far as the run's start can tell (``visible_gpu_count`` made to say 2 on this
CPU box); the live run is a run directory whose lock a child process holds, as its supervisor would."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.runs.launch import create_run
from core.runs.run_dir import RUNNING, RunDirectory
from tests.core.test_runs_unit import _Config


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _live_run(gpus: list[int], host: str | None = None) -> tuple[RunDirectory, subprocess.Popen]:
    """A run recorded on ``gpus`` whose supervisor (a child holding its lock) is alive."""
    import psutil

    run = create_run(_Config(name="long", model="tiny"), ["tunedeck", "train", "long.yaml"], gpus=gpus)
    code = ("import fcntl, os, time\n"
            f"fd = os.open({str(run.lock_path)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()})
    if host is not None:
        run.update_record(host=host)
    run.write_status(RUNNING)
    return run, holder


def _end(holder: subprocess.Popen) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait()


def test_train_twice_on_the_same_gpus_is_refused_naming_the_live_run(home, tmp_path, monkeypatch, capsys):
    from core.cli import main
    from core.data.samples import sample_dataset_path
    from core.runs import gpus as run_gpus
    from core.runs.listing import iter_run_dirs

    monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 2)
    config = tmp_path / "long.yaml"
    config.write_text(f"model: tiny\ndataset: {sample_dataset_path()}\nprecision: fp32\ngpus: 1\n", encoding="utf-8")
    first, holder = _live_run([0, 1])
    try:
        assert main(["train", str(config)]) == 2
        said = capsys.readouterr()
        assert said.out == ""
        assert f"GPU 0 is in use by run {first.id} (running)" in said.err
        assert f"tunedeck stop {first.id}" in said.err and "--allow-shared-gpus" in said.err
        assert [r.id for r in iter_run_dirs()] == [first.id]  # nothing was created for the refused run
    finally:
        _end(holder)


def test_only_live_runs_of_this_host_on_those_gpus_count(home):
    from core.runs.lifecycle import live_runs_sharing

    first, holder = _live_run([1])
    elsewhere, other = _live_run([0], host="another-node")  # a node of a shared data root: its own GPUs
    try:
        assert live_runs_sharing([0]) == []
        assert live_runs_sharing([0, 1]) == [(first.id, "running", [1])]
    finally:
        _end(holder)
        _end(other)
    assert live_runs_sharing([0, 1]) == []  # its supervisor died: crashed, not live


def test_a_second_cpu_run_is_only_a_warning_and_shared_gpus_can_be_allowed(home):
    from core.runs.lifecycle import _check_gpus_free

    cpu, holder = _live_run([])
    said: list[str] = []
    try:
        _check_gpus_free([], False, said.append)
        assert len(said) == 1 and cpu.id in said[0] and "CPU" in said[0]
    finally:
        _end(holder)
    gpu, holder = _live_run([0])
    said.clear()
    try:
        _check_gpus_free([0], True, said.append)  # --allow-shared-gpus: started, with a warning
        assert len(said) == 1 and gpu.id in said[0]
    finally:
        _end(holder)


def test_resume_beside_a_live_run_on_its_gpus_is_refused_as_train_is(home, monkeypatch, capsys):
    """`resume` skipped the check `train` makes: a stopped run resumed beside a live one on its GPUs started
    without a word. Now it is refused the same way, nothing written; --allow-shared-gpus starts it anyway."""
    from core.cli import main
    from core.data.samples import sample_dataset_path
    from core.runs import gpus as run_gpus
    from core.runs.run_dir import STOPPED

    monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 2)
    stopped = create_run(_Config(name="long", model="tiny", dataset=str(sample_dataset_path()), precision="fp32", gpus=1),
                         ["tunedeck", "train", "long.yaml"], gpus=[0])
    stopped.write_status(STOPPED)
    before = sorted(p.name for p in stopped.path.iterdir())
    first, holder = _live_run([0])
    second, other = _live_run([1])
    try:
        assert main(["resume", stopped.id]) == 2
        said = capsys.readouterr().err
        assert f"GPU 0 is in use by run {first.id} (running)" in said and "--allow-shared-gpus" in said, said
        assert sorted(p.name for p in stopped.path.iterdir()) == before
        assert stopped.status().status == STOPPED
        # the message names every GPU the live runs hold, not the first run's alone
        from core.runs.errors import GpusInUse
        from core.runs.lifecycle import _check_gpus_free

        with pytest.raises(GpusInUse) as caught:
            _check_gpus_free([0, 1], False)
        assert str(caught.value).startswith("GPU 0,1 is in use by run") and "1 more" in str(caught.value)
    finally:
        _end(holder)
        _end(other)


def test_resume_checks_the_gpus_run_json_gives_the_resumed_trainer_not_config_yaml(home, monkeypatch, capsys):
    """The resumed supervisor trains on run.json's GPUs, but resume checked config.yaml's ``gpus`` resolved
    again (``gpus: 1`` → GPU 0): a run recorded on GPU 1 resumed beside a live run on GPU 1 without a word,
    and one on GPU 0 was refused for a GPU it would not use. Box: 2 GPUs (``visible_gpu_count`` says 2)."""
    from core.cli import main
    from core.data.samples import sample_dataset_path
    from core.runs import gpus as run_gpus
    from core.runs import lifecycle
    from core.runs.run_dir import STOPPED

    monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 2)
    stopped = create_run(_Config(name="long", model="tiny", dataset=str(sample_dataset_path()), precision="fp32", gpus=1),
                         ["tunedeck", "train", "long.yaml"], gpus=[1])  # config.yaml: a count; run.json: GPU 1
    stopped.write_status(STOPPED)
    before = sorted(p.name for p in stopped.path.iterdir())
    live, holder = _live_run([1])
    try:
        assert main(["resume", stopped.id]) == 2
        said = capsys.readouterr().err
        assert f"GPU 1 is in use by run {live.id} (running)" in said, said
        assert sorted(p.name for p in stopped.path.iterdir()) == before and stopped.status().status == STOPPED
    finally:
        _end(holder)
    checked: list[list[int]] = []

    class Checked(Exception):
        pass

    def check(gpus, *args, **kwargs):
        checked.append(list(gpus))
        raise Checked

    monkeypatch.setattr(lifecycle, "_check_gpus_free", check)
    with pytest.raises(Checked):
        lifecycle.resume_run(stopped)
    assert checked == [[1]]


def test_a_gpu_count_takes_gpus_no_live_run_holds_and_check_and_demo_say_so(home, tmp_path, monkeypatch, capsys):
    """`gpus: 1` beside a live run on GPU 0 of a 4-GPU box was refused (advising `gpus=...`), though GPU 1 was
    free; the demo (one GPU) was refused with advice it cannot take; `train --check` said nothing of it.
    Now a count takes the first GPUs no live run holds (config.yaml and run.json say which); a list is
    never moved; --check refuses as train does; the demo's refusal leaves `gpus=...` out."""
    from core.cli import main
    from core.data.samples import sample_dataset_path
    from core.runs import gpus as run_gpus
    from core.runs.errors import GpusInUse
    from core.runs.lifecycle import check_run_file, prepare_run

    monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 4)
    config = tmp_path / "long.yaml"
    config.write_text(f"model: tiny\ndataset: {sample_dataset_path()}\nprecision: fp32\ngpus: 2\n", encoding="utf-8")
    first, holder = _live_run([0, 2])
    try:
        said: list[str] = []
        check = check_run_file(config, warn=said.append)
        assert check.gpus == [1, 3] and any("this run takes GPU 1,3" in line for line in said), said
        run = prepare_run(check.config, ["tunedeck", "train", str(config)], warn=said.append)
        assert run.record()["gpus"] == [1, 3] and run.config()["gpus"] == [1, 3]
        with pytest.raises(GpusInUse):  # indices the user named are not moved
            check_run_file(config, ["gpus=[0,1]"], warn=said.append)
        assert main(["train", str(config), "--check", "gpus=[0]"]) == 2  # --check refuses as train would
        assert f"GPU 0 is in use by run {first.id}" in capsys.readouterr().err
        assert main(["train", str(config), "--check", "gpus=[0]", "--allow-shared-gpus"]) == 0
        capsys.readouterr()
    finally:
        _end(holder)
    busy, holder = _live_run([0, 1, 2, 3])
    try:
        assert main(["demo", "--detach"]) == 2
        err = capsys.readouterr().err
        assert f"GPU 0 is in use by run {busy.id}" in err and "gpus=" not in err and "--allow-shared-gpus" in err
    finally:
        _end(holder)


def test_the_gpu_look_and_the_queued_run_it_records_are_one_step_under_a_lock(home, tmp_path, monkeypatch):
    """Two launches at the same instant both found GPU 0 free and both started on it. The look at the live
    runs and the creation of the queued run (which the next look counts as live) now happen under one lock
    that a second launch waits for: checked here by trying that lock from inside both steps."""
    import fcntl
    import os

    from core.config import default_demo_config
    from core.paths import runs_dir
    from core.runs import launch, lifecycle

    def lock_is_held() -> bool:
        fd = os.open(runs_dir(), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    seen: list[tuple[str, bool]] = []
    real_sharing, real_create = lifecycle.live_runs_sharing, launch.create_run
    monkeypatch.setattr(lifecycle, "live_runs_sharing", lambda gpus, visible="ours": seen.append(("look", lock_is_held()))
                        or real_sharing(gpus))
    monkeypatch.setattr(launch, "create_run", lambda *a, **k: seen.append(("record", lock_is_held()))
                        or real_create(*a, **k))
    lifecycle.prepare_run(default_demo_config(), ["tunedeck", "demo"], "demo", warn=lambda _text: None)
    assert seen == [("look", True), ("record", True)]
    assert not lock_is_held()  # and let go once the run is recorded


def test_a_gpu_count_not_moved_is_checked_with_the_live_runs_already_looked_at(home, monkeypatch):
    """``_claim_gpus`` asked ``live_runs_sharing`` about a count's GPUs, and ``_check_gpus_free`` asked it
    again about the same GPUs when the count was not moved (a scan of every run directory, twice); then,
    with the count's GPUs held, it asked again about every GPU to find free ones. Now one look at every GPU
    serves all three. Box: 2 GPUs (``visible_gpu_count`` says 2); the live runs are stood in for by
    ``live_runs_sharing``."""
    from types import SimpleNamespace

    from core.runs import gpus as run_gpus
    from core.runs import lifecycle
    from core.runs.errors import GpusInUse

    monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 2)
    asked: list[list[int]] = []
    live: list[tuple[str, str, list[int]]] = []

    def sharing(gpus):
        asked.append(list(gpus))
        return [(run_id, status, [g for g in theirs if g in gpus]) for run_id, status, theirs in live
                if set(theirs) & set(gpus)]

    monkeypatch.setattr(lifecycle, "live_runs_sharing", sharing)
    assert lifecycle._claim_gpus(SimpleNamespace(gpus=1), [0], False) == [0]  # no live run: taken
    assert asked == [[0, 1]]
    asked.clear()
    live.append(("20261206-0000-long-abcd", "running", [0, 1]))
    with pytest.raises(GpusInUse) as refused:  # no GPU left to move to: refused, the runs looked at once
        lifecycle._claim_gpus(SimpleNamespace(gpus=1), [0], False)
    assert asked == [[0, 1]]  # every GPU once: the count's and the free ones both come of it
    assert refused.value.runs == [("20261206-0000-long-abcd", "running", [0])]  # as a look at GPU 0 alone says
    asked.clear()
    live[:] = [("20261206-0000-long-abcd", "running", [0])]
    assert lifecycle._claim_gpus(SimpleNamespace(gpus=1), [0], False) == [1]  # moved to the free GPU 1
    assert asked == [[0, 1]]


def test_gpus_of_runs_launched_under_different_cuda_visible_devices_are_compared_as_the_gpus_they_name(
        home, monkeypatch, capsys):
    """Run A launched under CUDA_VISIBLE_DEVICES=2,3 on its GPU 0 trains on physical GPU 2, but its "0" was
    compared as it is: a run on physical GPU 0 was refused for it, one on GPU 2 started beside it. run.json
    records the variable at launch (``env``); indices are mapped through it before they are compared, and a
    resume's supervisor runs under the recorded one again. Box: 4 GPUs (``visible_gpu_count`` says 4); the
    supervisor of the resume is not started (``subprocess.Popen`` records its environment)."""
    from core.cli import main
    from core.data.samples import sample_dataset_path
    from core.runs import gpus as run_gpus
    from core.runs import launch
    from core.runs.lifecycle import live_runs_sharing
    from core.runs.run_dir import STOPPED

    monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    first, holder = _live_run([0])  # physical GPU 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    stopped = create_run(_Config(name="long", model="tiny", dataset=str(sample_dataset_path()), precision="fp32",
                                 gpus=1), ["tunedeck", "train", "long.yaml"], gpus=[0])  # physical GPU 1
    stopped.write_status(STOPPED)
    assert first.record()["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    try:
        assert live_runs_sharing([0, 1]) == []  # physical 0 and 1: not A's
        assert live_runs_sharing([2]) == [(first.id, "running", [2])]
        assert live_runs_sharing([1], visible="3,2") == [(first.id, "running", [1])]  # within a visible set too
        assert live_runs_sharing([0], visible="GPU-aaaa") == []  # a UUID matches only itself (no NVML here)
        # The stopped run resumes on its physical GPU 1 (a resume from a shell without the variable): free.
        started: list[dict] = []

        class NoSupervisor(Exception):
            pass

        def popen(cmd, **kwargs):
            started.append(kwargs["env"])
            raise NoSupervisor

        monkeypatch.setattr("core.runs.control._choose_checkpoint",
                            lambda run, step, weights_only, notices: (_ for _ in ()).throw(NoSupervisor()))
        with pytest.raises(NoSupervisor):  # got past the GPU check (GPU 0 of this shell is not A's)
            main(["resume", stopped.id])
        with monkeypatch.context() as patched, pytest.raises(NoSupervisor):
            patched.setattr(launch.subprocess, "Popen", popen)
            launch.start_supervisor(stopped)
        assert started[-1]["CUDA_VISIBLE_DEVICES"] == "1"  # as recorded, not this shell's (unset)
        # ... and beside a live run on physical GPU 1 it is refused, though this shell's GPU 0 is free.
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        second, other = _live_run([0])
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
        try:
            assert main(["resume", stopped.id]) == 2
            assert f"is in use by run {second.id}" in capsys.readouterr().err
        finally:
            _end(other)
    finally:
        _end(holder)


def test_run_gpu_indices_are_the_physical_gpus_of_the_launch_visible_devices():
    """The one answer to "which of the box's GPUs does this run use" (the dashboard's charts, the GPU check):
    run.json's indices through the CUDA_VISIBLE_DEVICES its env recorded; a UUID entry through the box's
    GPUs (NVML's UUIDs, a unique start as CUDA takes it, a MIG device's parent); none recorded: as given."""
    from types import SimpleNamespace

    from core.runs.gpus import run_gpu_indices, run_physical_gpus

    box = [SimpleNamespace(index=0, uuid="GPU-aaa", mig_instances=()),
           SimpleNamespace(index=1, uuid="GPU-bbb", mig_instances=(SimpleNamespace(uuid="MIG-ccc"),))]
    assert run_gpu_indices({"gpus": [0, 1], "env": {"CUDA_VISIBLE_DEVICES": "2,3"}}) == [2, 3]
    assert run_gpu_indices({"gpus": [1], "env": {"CUDA_VISIBLE_DEVICES": "3,1"}}) == [1]
    assert run_gpu_indices({"gpus": [0], "env": {}}) == [0]  # unset at launch
    assert run_gpu_indices({"gpus": [0]}) == [0]  # an older run.json: as given
    assert run_physical_gpus({"gpus": [0]}, "2") == ["2"]  # ... or within what the caller takes it to be
    assert run_gpu_indices({"gpus": [0, 1], "env": {"CUDA_VISIBLE_DEVICES": "GPU-bb,MIG-ccc"}}, box) == [1]
    assert run_gpu_indices({"gpus": [0], "env": {"CUDA_VISIBLE_DEVICES": "GPU-zzz"}}, box) == []
    assert run_gpu_indices({"gpus": [], "env": {"CUDA_VISIBLE_DEVICES": "1"}}) == []


def test_a_uuid_start_two_gpus_share_names_none_of_them():
    """CUDA_VISIBLE_DEVICES takes a start of a GPU's UUID only when no other GPU's UUID starts so (CUDA
    names no device by an ambiguous one). ``nvml_index`` took the first GPU whose UUID started with it, so
    the dashboard charted, and the GPU check counted, a GPU the run may not be on. Box: two GPUs whose UUIDs
    share ``GPU-ab`` (given as snapshots, no NVML)."""
    from types import SimpleNamespace

    from core.runs.gpus import nvml_index, run_gpu_indices, uuid_indices

    box = [SimpleNamespace(index=0, uuid="GPU-ab12", mig_instances=()),
           SimpleNamespace(index=1, uuid="GPU-ab34", mig_instances=())]
    by_uuid = uuid_indices(box)
    assert nvml_index("GPU-ab", by_uuid) is None
    assert nvml_index("GPU-ab3", by_uuid) == 1 and nvml_index("GPU-ab12", by_uuid) == 0
    assert run_gpu_indices({"gpus": [0], "env": {"CUDA_VISIBLE_DEVICES": "GPU-ab"}}, box) == []


def _stopped_with_checkpoint(on: list[int], **config) -> RunDirectory:
    """A stopped run on ``on`` with one sound checkpoint (step 3 of 50: tiny files of the right shapes)."""
    import json

    from core.data.samples import sample_dataset_path
    from core.runs.checkpoints import finalize_checkpoint, tmp_path_for
    from core.runs.run_dir import STOPPED

    values = {"name": "long", "model": "tiny", "dataset": str(sample_dataset_path()), "precision": "fp32",
              "max_steps": 50, **config}
    run = create_run(_Config(**values), ["tunedeck", "train", "long.yaml"], gpus=on)
    tmp = tmp_path_for(run.checkpoints_dir, 3)
    tmp.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (tmp / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    (tmp / "trainer_state.json").write_text(json.dumps({"global_step": 3}), encoding="utf-8")
    (tmp / "optimizer.pt").write_bytes(b"o")
    (tmp / "scheduler.pt").write_bytes(b"s")
    finalize_checkpoint(tmp, 3)
    run.write_status(STOPPED)
    return run


def test_resume_with_a_gpus_override_moves_the_run_to_them_as_many_as_before(home, monkeypatch, capsys):
    """`resume RUN gpus=...` wrote the GPUs into config.yaml, but the supervisor trains on run.json's: the
    resume ran on the old GPUs, the ones a live run had taken (the refusal even advised gpus=...). The
    override moves the run now: checked against the live runs under the launch's claim lock, run.json's
    gpus and recorded CUDA_VISIBLE_DEVICES follow; another GPU count is refused with why (a ZeRO
    checkpoint is split over its processes). Box: 4 GPUs (``visible_gpu_count`` says 4); the supervisor
    is not started (``_start`` records the GPUs it would give)."""
    import fcntl
    import os

    import yaml

    from core.cli import main
    from core.paths import runs_dir
    from core.runs import gpus as run_gpus
    from core.runs import lifecycle
    from core.runs.gpus import run_gpu_indices
    from core.runs.run_dir import STOPPED

    monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    stopped = _stopped_with_checkpoint([0, 1], gpus=2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    started: list[tuple[list[int], str | None]] = []

    def start(run, resume_from=None):
        record = run.record()
        started.append((record["gpus"], record["env"].get("CUDA_VISIBLE_DEVICES")))

    def lock_is_held() -> bool:
        fd = os.open(runs_dir(), os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    looks: list[bool] = []
    real_sharing = lifecycle.live_runs_sharing
    monkeypatch.setattr(lifecycle, "_start", start)
    monkeypatch.setattr(lifecycle, "live_runs_sharing",
                        lambda gpus, visible="ours": looks.append(lock_is_held()) or real_sharing(gpus, visible))
    live, holder = _live_run([0, 1])
    try:
        assert main(["resume", stopped.id, "gpus=[2]"]) == 2  # one GPU for a two-GPU checkpoint
        said = capsys.readouterr().err
        assert f"gpus=2 gives run {stopped.id} 1 GPU(s), but its checkpoint was written on 2" in said, said
        assert "global batch" in said and stopped.status().status == STOPPED and not started
        assert main(["resume", stopped.id, "gpus=[1,2]"]) == 2  # GPU 1 is the live run's
        assert f"GPU 1 is in use by run {live.id}" in capsys.readouterr().err
        assert stopped.record()["gpus"] == [0, 1] and stopped.status().status == STOPPED
        assert main(["resume", stopped.id, "gpus=[2,3]"]) == 0
        assert started == [([2, 3], None)]  # the supervisor's GPUs, counted in this shell's (unset) variable
        assert yaml.safe_load(stopped.config_path.read_text())["gpus"] == [2, 3]  # config.yaml agrees
        assert run_gpu_indices(stopped.record()) == [2, 3] and looks and all(looks)
    finally:
        _end(holder)
    zero = _stopped_with_checkpoint([0, 1], gpus=2, zero_stage=2)
    assert main(["resume", zero.id, "gpus=4"]) == 2
    said = capsys.readouterr().err
    assert "a DeepSpeed ZeRO-2 checkpoint is split over the 2 training processes" in said, said
    assert zero.record()["gpus"] == [0, 1] and zero.status().status == STOPPED


def test_a_gpu_named_by_its_uuid_in_cuda_visible_devices_is_the_gpu_of_that_index(home, tmp_path, monkeypatch,
                                                                                     capsys):
    """A run launched under CUDA_VISIBLE_DEVICES=GPU-<uuid of GPU 1> trains on GPU 1, as the dashboard maps
    it, but the conflict check compared the UUID with "1" as strings: a second run under
    CUDA_VISIBLE_DEVICES=1 started beside it. UUID entries (or a start of one, as CUDA takes) now count as
    the NVML index of their GPU. Box: the two H200s of tests/fixtures/gpus/h200x2.json through the fake NVML
    (their UUIDs), ``visible_gpu_count`` saying 1 under the one-GPU variable."""
    import json

    from core.cli import main
    from core.data.samples import sample_dataset_path
    from core.hardware.fake_nvml import fake_nvml_from_recording
    from core.runs import gpus as run_gpus
    from core.runs.lifecycle import live_runs_sharing

    recording = Path(__file__).parents[1] / "fixtures" / "gpus" / "h200x2.json"
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml_from_recording(recording))
    uuid = json.loads(recording.read_text())["gpus"][1]["uuid"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid)
    first, holder = _live_run([0])  # GPU 1, by its UUID
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    try:
        assert live_runs_sharing([1]) == [(first.id, "running", [1])]
        assert live_runs_sharing([0], visible="1") == [(first.id, "running", [0])]
        assert live_runs_sharing([0], visible=uuid[:12]) == [(first.id, "running", [0])]  # a start of it
        assert live_runs_sharing([0]) == []  # GPU 0 is not its
        monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 1)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        config = tmp_path / "long.yaml"
        config.write_text(f"model: tiny\ndataset: {sample_dataset_path()}\nprecision: fp32\ngpus: [0]\n",
                          encoding="utf-8")
        assert main(["train", str(config)]) == 2
        assert f"GPU 0 is in use by run {first.id}" in capsys.readouterr().err
    finally:
        _end(holder)


def test_a_lost_gpu_is_left_out_of_all_or_a_count_and_refused_when_named(home, tmp_path, monkeypatch, capsys):
    """A GPU that fell off the bus (NVML GPU_IS_LOST, Xid 79) was counted as any other: `gpus: all` or a count
    started a trainer on it (it hangs, or fails with a CUDA error far from the cause), and a resume went back
    onto it. Now all or a count leaves it out (one line says so), naming it is refused with the planner's words
    (other GPUs, or a reboot), `train --check` says the same, and a resume onto it is refused with its way out.
    Box: the two H200s of tests/fixtures/gpus/h200x2.json through the fake NVML, GPU 1 lost (``FakeNvml.lost``);
    the supervisor is not started (``_start`` records the GPUs it would give)."""
    from core.cli import main
    from core.data.samples import sample_dataset_path
    from core.hardware.fake_nvml import fake_nvml_from_recording
    from core.runs import lifecycle
    from core.runs.lifecycle import check_run_file
    from core.runs.run_dir import STOPPED

    nvml = fake_nvml_from_recording(Path(__file__).parents[1] / "fixtures" / "gpus" / "h200x2.json",
                                    compute_capability=(9, 0))
    nvml.lost.add(1)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = tmp_path / "long.yaml"
    config.write_text(f"model: tiny\ndataset: {sample_dataset_path()}\nprecision: fp32\ngpus: all\n", encoding="utf-8")
    said: list[str] = []
    assert check_run_file(config, warn=said.append).gpus == [0]
    assert [line for line in said if "GPU 1 is lost" in line] == [
        "GPU 1 is lost (NVML cannot reach it: it fell off the bus): this run leaves it out and takes GPU 0; "
        "reboot the box to bring it back"]
    assert check_run_file(config, ["gpus=1"], warn=said.append).gpus == [0]  # GPU 0 is first: nothing left out
    refusal = ("GPU 1 is lost (NVML cannot reach it: it fell off the bus); choose other GPUs, or reboot the box "
               "to bring it back")
    assert main(["train", str(config), "--check", "gpus=[0,1]"]) == 2
    assert refusal in capsys.readouterr().err
    assert main(["train", str(config), "--check", "gpus=2"]) == 2
    assert f"gpus: 2 asked for, 1 usable on this machine: {refusal}" in capsys.readouterr().err
    assert main(["train", str(config), "--check", "gpus=[0]"]) == 0
    capsys.readouterr()

    nvml.lost = {0}  # the first GPU is lost: a count steps over it, and the bf16 check reads the other
    assert check_run_file(config, ["gpus=1"], warn=said.append).gpus == [1]
    assert said[-1].startswith("GPU 0 is lost") and "takes GPU 1;" in said[-1], said
    assert lifecycle._gpu_caps() == {"bf16": True, "name": "NVIDIA H200"}

    started: list[list[int]] = []
    monkeypatch.setattr(lifecycle, "_start", lambda run, resume_from=None: started.append(run.record()["gpus"]))
    stopped = _stopped_with_checkpoint([0], gpus=1)
    assert stopped.status().status == STOPPED
    assert main(["resume", stopped.id]) == 2
    err = capsys.readouterr().err
    assert f"run {stopped.id} trained on GPU 0: GPU 0 is lost" in err and f"tunedeck resume {stopped.id} gpus=" in err
    assert main(["resume", stopped.id, "gpus=[0]"]) == 2  # moved onto the lost GPU: refused as train refuses it
    assert "GPU 0 is lost" in capsys.readouterr().err
    assert not started and stopped.status().status == STOPPED
    assert main(["resume", stopped.id, "gpus=[1]"]) == 0
    assert started == [[1]]


def test_a_gpu_lost_before_its_uuid_was_read_is_found_for_a_run_that_named_it_by_uuid(home, monkeypatch, capsys):
    """A run launched under CUDA_VISIBLE_DEVICES=GPU-<uuid> (its GPUs recorded by UUID), then the GPU fell off the
    bus: NVML answers GPU_IS_LOST before its UUID is read, so the UUID matched no GPU and `resume` sent the trainer
    back onto it (it hangs, or fails in CUDA far from the cause). A UUID entry that names none of the GPUs NVML
    reaches, while a GPU lost before its UUID was read is there, counts as that lost GPU: the resume is refused
    with the way out, and a count under the same variable leaves it out. A UUID of a GPU that works is unaffected.
    Box: the two H200s of tests/fixtures/gpus/h200x2.json through the fake NVML (``FakeNvml.lost``)."""
    from core.cli import main
    from core.hardware.fake_nvml import fake_nvml_from_recording
    from core.hardware.snapshot import load_snapshot
    from core.runs import lifecycle
    from core.runs.gpus import lost_gpus
    from core.runs.run_dir import STOPPED

    recording = Path(__file__).parents[1] / "fixtures" / "gpus" / "h200x2.json"
    first, second = (g.uuid for g in load_snapshot(recording).gpus)
    nvml = fake_nvml_from_recording(recording, compute_capability=(9, 0))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", second)
    stopped = _stopped_with_checkpoint([0], gpus=1)  # GPU 1, named by its UUID
    assert stopped.record()["env"]["CUDA_VISIBLE_DEVICES"] == second
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    nvml.lost.add(1)  # it falls off the bus: NVML never reads its UUID
    assert lost_gpus(visible=second) == [0]
    assert lost_gpus(visible=f"{first},{second}") == [1]
    assert lost_gpus(visible=first) == []  # the GPU that works, by its UUID
    assert lost_gpus(visible="1") == [0] and lost_gpus(visible="0") == []

    started: list[list[int]] = []
    monkeypatch.setattr(lifecycle, "_start", lambda run, resume_from=None: started.append(run.record()["gpus"]))
    assert main(["resume", stopped.id]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"run {stopped.id} trained on GPU {second}: GPU {second} is lost" in err, err
    assert f"tunedeck resume {stopped.id} gpus=" in err
    assert not started and stopped.status().status == STOPPED

    nvml.lost.clear()  # none lost: a UUID no GPU here has is not taken for one
    assert lost_gpus(visible="GPU-00000000-0000-0000-0000-000000000000") == []



def test_the_second_of_two_resumes_at_once_is_told_the_first_is_resuming_it(home, monkeypatch, capsys):
    """Two `tunedeck resume` of one run at the same instant: the second waits for the first at the GPU look's
    lock, and the first leaves the run queued on its GPUs. The second then found "GPU 0 is in use by run <the
    same run> (queued)", pointing at --allow-shared-gpus (with which it then failed as already resuming). It is
    told the run is being resumed, nothing else. Here the test holds the lock, as the first resume does, until
    the second waits for it (/proc/locks), then queues the run as the first does."""
    import os
    import threading

    from core.cli import main
    from core.data.samples import sample_dataset_path
    from core.i18n import Message
    from core.paths import runs_dir
    from core.runs import gpus as run_gpus
    from core.runs.run_dir import QUEUED, STOPPED, held_lock

    monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 2)
    run = create_run(_Config(name="long", model="tiny", dataset=str(sample_dataset_path()), precision="fp32", gpus=1),
                     ["tunedeck", "train", "long.yaml"], gpus=[0])
    run.write_status(STOPPED)  # before its first step: a resume starts it again from step 0
    inode = os.stat(runs_dir()).st_ino

    def waiting() -> bool:  # a flock waiter on the runs folder: "1: -> FLOCK  ADVISORY  WRITE 123 fe:00:456 0 EOF"
        with open("/proc/locks", encoding="ascii") as handle:
            return any(f[1] == "->" and f[6].endswith(f":{inode}") for f in map(str.split, handle) if len(f) > 6)

    codes: list[int] = []
    with held_lock(runs_dir()):
        second = threading.Thread(target=lambda: codes.append(main(["resume", run.id])))
        second.start()
        deadline = time.monotonic() + 120
        while not waiting():
            assert second.is_alive() and time.monotonic() < deadline, capsys.readouterr().err
            time.sleep(0.05)
        run.write_status(QUEUED, Message("runs.reason_resuming", step=0))  # what the first resume leaves
    second.join(timeout=120)
    said = capsys.readouterr().err
    assert codes == [2], said
    assert f"run {run.id} is already being resumed by another command (status: queued)" in said, said
    assert "in use" not in said and "--allow-shared-gpus" not in said, said
