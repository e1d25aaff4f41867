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
