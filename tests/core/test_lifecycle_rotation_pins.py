"""A live run's checkpoint rotation (save_total_limit) and a merge of one of its older checkpoints.

Merging the oldest listed checkpoint of a live run failed 5 times in 6: rotation removed it while it was
read, and the message called it damaged. Now a reader pins the checkpoint (``pin_checkpoint``), rotation
passes a pinned one over (a pin whose process is gone is ignored), and a checkpoint that is gone anyway
is said to be rotated away, with the sound ones there now. A real tiny LoRA run (checkpoints 15 and 30),
real rotation, real processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.fixtures.lifecycle.finished_run import ROOT


def rotate(run, keep: int = 1) -> list[str]:
    """What the trainer does after each save: rotate, recording each removal as an event."""
    from core.runs.checkpoints import rotate_checkpoints

    def record(path, why) -> None:
        run.append_event("checkpoint_removed", path=str(path), why=why, bytes=None)

    return [p.name for p in rotate_checkpoints(run.checkpoints_dir, keep, on_remove=record)]


def test_rotation_passes_over_the_checkpoint_a_merge_is_reading(lora_run, tmp_path):
    from core.lifecycle.merge import merge_run

    _home, run = lora_run
    during: list[list[str]] = []

    def stage(name: str) -> None:
        if name == "load":  # the live run saves a checkpoint just as the merge starts loading checkpoint 15
            during.append(rotate(run))

    result = merge_run(run, checkpoint=15, out=tmp_path / "merged-15", progress=stage)
    assert during == [[]]  # checkpoint 15 was pinned: rotation left it
    assert result.step == 15 and (result.out / "model.safetensors").is_file()
    assert (run.checkpoints_dir / "checkpoint-15" / "COMPLETE").is_file()
    assert rotate(run) == ["checkpoint-15"]  # the merge over, the next rotation removes it
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == ["checkpoint-30"]  # no pin left behind


def test_a_checkpoint_rotated_away_is_said_so_not_missing_or_damaged(lora_run, tmp_path):
    """Before: "no complete checkpoint 15" when it had gone before the merge, "cannot be loaded (Can't find
    'adapter_config.json' …): the file is damaged" (or "Repo id must be in the form …") when it went while
    it was read. Now both say the rotation removed it and name the sound ones."""
    import shutil

    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import LifecycleError

    _home, run = lora_run

    def remove_unpinned(name: str) -> None:  # what a remover that knows nothing of pins (an older tunedeck's
        if name == "load":                   # rotation, a user's rm) does while the merge reads
            shutil.rmtree(run.checkpoints_dir / "checkpoint-15")

    with pytest.raises(LifecycleError) as info:
        merge_run(run, checkpoint=15, out=tmp_path / "a", progress=remove_unpinned)
    message = str(info.value)
    assert "checkpoint 15 of run" in message and "checkpoint rotation (save_total_limit" in message, message
    assert "not damaged" in message and "(sound ones: 30)" in message and "damaged or incomplete" not in message

    shutil.copytree(run.checkpoints_dir / "checkpoint-30", run.checkpoints_dir / "checkpoint-20")
    marker = json.loads((run.checkpoints_dir / "checkpoint-20" / "COMPLETE").read_text())
    (run.checkpoints_dir / "checkpoint-20" / "COMPLETE").write_text(json.dumps({**marker, "step": 20}))
    assert rotate(run) == ["checkpoint-20"]  # gone before the merge looks: the run's events say why
    with pytest.raises(LifecycleError) as info:
        merge_run(run, checkpoint=20, out=tmp_path / "b")
    message = str(info.value)
    assert "checkpoint 20 of run" in message and "rotation" in message and "(sound ones: 30)" in message
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_pin_holds_while_its_process_lives_and_is_ignored_once_it_died(lora_run):
    """A pin made by another process (a merge in another terminal) keeps the checkpoint; killed without
    removing its pin, the pin is stale: the next rotation removes the checkpoint and the pin."""
    _home, run = lora_run
    checkpoint = run.checkpoints_dir / "checkpoint-15"
    code = ("import sys, time; from pathlib import Path; from core.runs.checkpoints import pin_checkpoint\n"
            "with pin_checkpoint(Path(sys.argv[1])) as there:\n"
            "    print('pinned' if there else 'gone', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(checkpoint)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "pinned"
        assert rotate(run) == [] and (checkpoint / "COMPLETE").is_file()
        pins = list((run.checkpoints_dir / ".pins").iterdir())
        assert [p.name.split(".")[:2] for p in pins] == [["checkpoint-15", str(proc.pid)]]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{proc.pid}"):
        time.sleep(0.05)
    assert rotate(run) == ["checkpoint-15"] and not checkpoint.exists()
    assert not any((run.checkpoints_dir / ".pins").glob("*"))  # the stale pin went with it
