"""The Chinese screens run in a pytest process of their own (see tests/tui/i18n_zh_scenarios.py): the
language must be chosen before the tui modules are imported, as ``tunedeck`` itself does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_chinese_screens_in_their_own_process(tmp_path):
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/tui/i18n_zh_scenarios.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, f"the Chinese screen tests failed:\n{done.stdout[-8000:]}\n{done.stderr[-2000:]}"
    assert " passed" in done.stdout and "skipped" not in done.stdout
