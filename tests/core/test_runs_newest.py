"""``tunedeck status`` and ``tunedeck logs`` without a run: the newest run (not a wizard's probe), said on stderr,
as ``tunedeck logs -f`` right after ``tunedeck train --detach`` wants it; none at all says how to start one. No GPU:
runs are folders with their run.json and log, no process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(home: Path, run_id: str, created: str, log: str, **record) -> None:
    path = home / "runs" / run_id
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"id": run_id, "created": created, "config_summary": {
        "model": "tiny", "method": "lora"}, **record}), encoding="utf-8")
    (path / "train.log").write_text(log, encoding="utf-8")


def _tunedeck(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TUNEDECK_HOME": str(home), "TUNEDECK_LANG": "en", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_status_and_logs_without_a_run_take_the_newest_and_say_which(tmp_path):
    home = tmp_path / "home"
    _run(home, "20261207-1000-older", "2026-12-07T10:00:00", "older's line\n")
    _run(home, "20261207-1100-newer", "2026-12-07T11:00:00", "newer's line\n")
    _run(home, "20261207-1200-probe-lora-cpu", "2026-12-07T12:00:00", "probe's line\n", command="probe")
    status = _tunedeck(home, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["id"] == "20261207-1100-newer"
    assert "(the newest run: 20261207-1100-newer)" in status.stderr, status.stderr
    logs = _tunedeck(home, "logs")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == "newer's line\n" and "20261207-1100-newer" in logs.stderr
    named = _tunedeck(home, "logs", "older")  # a run named is that run, nothing said
    assert named.stdout == "older's line\n" and "newest" not in named.stderr


def test_status_without_a_run_and_none_yet_says_how_to_start_one(tmp_path):
    (tmp_path / "home").mkdir()
    done = _tunedeck(tmp_path / "home", "status")
    assert done.returncode == 2
    assert "no runs yet: start one with 'tunedeck train RUN.yaml'" in done.stderr, done.stderr
