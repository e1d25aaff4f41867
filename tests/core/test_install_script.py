"""install.sh as a new user meets it: its --help."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_help_prints_the_header_comment_and_no_line_of_the_script():
    proc = subprocess.run(["bash", str(ROOT / "install.sh"), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("tunedeck's one set-up command"), proc.stdout
    assert "--app-only" in proc.stdout and "TUNEDECK_FORCE_CPU" in proc.stdout, proc.stdout
    assert not any(line.startswith(("set ", "#!")) for line in lines), proc.stdout  # it printed `set -euo pipefail`
