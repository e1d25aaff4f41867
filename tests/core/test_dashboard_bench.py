"""bench/dashboard.py --gpu's method on a CPU: one run, a headless dashboard following it in every other
window, each window's rate from its own steps. Hardware: a CPU and NVML's absence (the app shows no GPU);
the tiny LoRA row of bench/engine_speed.py. The ratio itself is the GPU's to measure: this checks that
both kinds of window get steps and that the ratio is what the windows say."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_run_is_measured_in_alternating_windows_with_and_without_the_dashboard(tmp_path):
    out = tmp_path / "dash.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TUNEDECK_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "dashboard.py"), "--gpu", "--row", "tiny-lora",
                           "--steps", "2000", "--windows", "2", "--window-s", "5", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    gpu = json.loads(out.read_text())["gpu"]
    windows = gpu["windows"]
    assert [w["attached"] for w in windows] == [False, True]
    assert all(w["steps"] >= 2 and w["seconds"] > 0 and w["tokens_per_s"] > 0 for w in windows), windows
    assert gpu["alone_tokens_per_s"] == windows[0]["tokens_per_s"]
    assert gpu["attached_over_alone"] == round(windows[1]["tokens_per_s"] / windows[0]["tokens_per_s"], 4)
    assert gpu["median_attached_over_alone"] == gpu["attached_over_alone"]  # one window each: the same
    # the run was stopped after the windows, not trained to its 2,000 steps
    status = subprocess.run([sys.executable, "-m", "core", "status", gpu["run"], "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert json.loads(status.stdout)["status"] == "stopped", status.stdout
