"""tests/users.py: the tests that become ``nobody`` (uid 65534) skip, saying why, where root cannot drop to it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Tests that become nobody: in a forked child (as_nobody), and in processes they start (skip_unless_root_can_drop)
NOBODY_TESTS = ["tests/core/test_runs_unit.py::test_a_stop_of_a_run_started_with_sudo_says_to_stop_it_as_root_once",
                "tests/core/test_runs_unit.py::test_a_forced_stop_refused_after_it_killed_some_processes_says_which",
                "tests/core/test_hardware_process_control.py::test_another_users_process_is_refused_with_its_owner"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_tests_that_become_nobody_skip_where_root_cannot(tmp_path):
    """In a rootless container (a user namespace that maps root alone) setuid(65534) fails (EINVAL): the tests
    that drop root for nobody failed there with a traceback from the helper, not from what they test. Now they
    are skipped, saying why. Real: pytest runs them in such a namespace (unshare --user --map-root-user); as
    root here (this test's own condition) the same tests run, as the rest of this suite shows."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True, text=True,
                           timeout=60)
    if probe.returncode != 0:  # a container that allows no user namespace
        pytest.skip(f"unshare --user is refused here: {probe.stderr.strip()}")
    out = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-m", "pytest", "-q", "-rs",
                          "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'pt'}", *NOBODY_TESTS],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "3 skipped" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]
    assert "root cannot become uid 65534 here (Invalid argument): a rootless container or user namespace without " \
           "that uid" in out.stdout and "failed" not in out.stdout, out.stdout[-3000:]
