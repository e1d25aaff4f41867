"""The shared finished-run fixture copies a run only once its supervisor is gone (no training here)."""

from __future__ import annotations

import fcntl
import os
import threading

from core.runs.disk_space import RESERVE_NAME, create_reserve
from core.runs.launch import create_run
from core.runs.run_dir import FINISHED
from tests.core.test_runs_unit import _Config
from tests.fixtures.lifecycle.finished_run import wait_until_over


def test_wait_until_over_waits_for_the_supervisor_not_just_the_final_status(tmp_path, monkeypatch):
    # A supervisor's last moments: status.json already says finished, it still holds the lock and has
    # yet to delete .reserve. A copy taken now raced that delete.
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    run = create_run(_Config(), ["tunedeck", "train", "x.yaml"], gpus=[])
    create_reserve(run.path)
    fd = os.open(run.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    run.write_status(FINISHED)
    seen: dict[str, bool] = {}

    def waiter() -> None:
        wait_until_over(run, timeout=60)
        seen["reserve"] = (run.path / RESERVE_NAME).exists()

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(timeout=2)  # it must not return while the lock is held; without the fix it returns at once
    (run.path / RESERVE_NAME).unlink()  # what the supervisor does last, then it exits (the lock goes)
    os.close(fd)
    thread.join(timeout=60)
    assert seen == {"reserve": False}
