"""A checkpoint file that cannot be read is the user's data, not a bug: merge, chat and serve get a
LifecycleError naming the checkpoint and what to do (the dashboard shows it in the panel, not in the
error modal for unexpected failures; tests/tui/test_dashboard_after_training.py)."""

from __future__ import annotations

import pytest

from core.errors import TunedeckError
from core.lifecycle.source import LifecycleError, _checkpoint_read


def test_a_damaged_safetensors_file_becomes_a_lifecycle_error_naming_the_checkpoint(tmp_path):
    from safetensors.torch import load_file

    checkpoint = tmp_path / "checkpoint-30"
    checkpoint.mkdir()
    (checkpoint / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(LifecycleError) as caught, _checkpoint_read(checkpoint):
        load_file(str(checkpoint / "adapter_model.safetensors"))
    message = str(caught.value)
    assert f"{checkpoint} cannot be loaded" in message and "--checkpoint N" in message
    assert isinstance(caught.value, TunedeckError) and caught.value.exit_code == 1


def test_a_bug_inside_is_not_turned_into_a_user_error(tmp_path):
    with pytest.raises(KeyError), _checkpoint_read(tmp_path):
        raise KeyError("a bug, not a damaged file")


def test_a_damaged_newest_checkpoint_is_passed_over_as_resume_passes_it_over(tmp_path_factory, monkeypatch):
    """checkpoint-30 truncated: merge, export and chat used to take it anyway and fail with "cannot be
    loaded … (tunedeck runs shows them)", a command that lists no checkpoints. They now take the newest
    sound one (15); asked for 30 by name, the message itself lists the sound ones."""
    import os

    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import resolve_model_source
    from core.runs.run_dir import RunDirectory
    from tests.fixtures.lifecycle.finished_run import finished_run

    home, run_id = finished_run(tmp_path_factory.mktemp("lifecycle-damaged"))
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    run = RunDirectory(home / "runs" / run_id)
    newest = run.checkpoints_dir / "checkpoint-30" / "adapter_model.safetensors"
    os.truncate(newest, 1000)
    assert run.last_complete_checkpoint().step == 30  # still complete by its marker: damaged, not missing
    assert resolve_model_source(run).step == 15
    result = merge_run(run)
    assert result.step == 15 and result.out.name == "checkpoint-15"
    with pytest.raises(LifecycleError) as caught:
        merge_run(run, checkpoint=30)
    message = str(caught.value)
    assert "checkpoint-30 cannot be loaded" in message and "--checkpoint N (sound ones: 15)" in message
    assert "tunedeck runs" not in message
    os.truncate(run.checkpoints_dir / "checkpoint-15" / "adapter_model.safetensors", 1000)
    with pytest.raises(LifecycleError) as caught:
        merge_run(run, force=True)  # none sound: the newest is tried, and the message says so
    assert "checkpoint-30 cannot be loaded" in str(caught.value) and "(sound ones: none)" in str(caught.value)


def test_export_says_a_damaged_checkpoint_is_passed_over_once(tmp_path_factory):
    """merge_run chooses the newest checkpoint again after torch's import only when the one it chose is gone
    (a live run's rotation): choosing again every time said "checkpoint-30 is damaged; using checkpoint-15"
    twice. CPU only."""
    import os

    from tests.fixtures.lifecycle.finished_run import finished_run, tunedeck

    home, run_id = finished_run(tmp_path_factory.mktemp("lifecycle-damaged-once"))
    os.truncate(home / "runs" / run_id / "checkpoints" / "checkpoint-30" / "adapter_model.safetensors", 1000)
    proc = tunedeck(home, "export", run_id)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("checkpoint-30 is damaged; using checkpoint-15") == 1, proc.stderr[-2000:]
