"""Fixtures of the core tests."""

from __future__ import annotations

import pytest

from tests.fixtures.lifecycle.finished_run import finished_run


@pytest.fixture()
def lora_run(shared, monkeypatch):
    """(data root, RunDirectory) of the module's finished tiny LoRA run, with ``TUNEDECK_HOME`` set to it."""
    from core.runs.run_dir import RunDirectory

    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    return home, RunDirectory(home / "runs" / run_id)
