"""``tunedeck runs | head``: output cut short by a reader that closes the pipe ends quietly, for every
command (``core.cli.dispatch``), with exit 141 as a program stopped by SIGPIPE, never a Python traceback.
Output that cannot be written otherwise (``> /dev/full``) is one line naming standard output, exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import EXIT_PIPE_CLOSED

ROOT = Path(__file__).resolve().parents[2]
MORE_THAN_A_PIPE_HOLDS = 4 * 1024 * 1024  # Linux pipes hold 64 KiB by default, 1 MiB at most unprivileged


@pytest.fixture
def home(tmp_path):
    """A tunedeck home with one run whose log, and a run list whose JSON, are each over 4 MiB."""
    runs = tmp_path / "home" / "runs"
    for index in range(100):
        run_id = f"run-{index:03d}"
        path = runs / run_id
        path.mkdir(parents=True)
        record = {"id": run_id, "created": f"2024-01-01T00:{index // 60:02d}:{index % 60:02d}",
                  "config_summary": {"model": f"org/model-{index}-" + "x" * 45_000, "method": "lora"}}
        (path / "run.json").write_text(json.dumps(record), encoding="utf-8")
    line = "step 1 loss 2.0 " + "." * 100 + "\n"
    (runs / "run-000" / "train.log").write_text(line * (MORE_THAN_A_PIPE_HOLDS // len(line) + 1), encoding="utf-8")
    return tmp_path / "home"


def _cut_short(command: list[str], home: Path, read: int) -> tuple[int, str]:
    """Run ``command`` with stdout a pipe whose reader takes ``read`` bytes and closes it (``| head -c``); with
    ``read`` 0 the reader is gone before the command starts, so its first write fails whatever its size.
    Returns (exit code, stderr)."""
    env = {**os.environ, "TUNEDECK_HOME": str(home), "LANG": "C", "PYTHONPATH": str(ROOT)}
    if not read:
        reader, writer = os.pipe()
        os.close(reader)
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=writer,
                                  stderr=subprocess.PIPE, timeout=120)
        finally:
            os.close(writer)
        return done.returncode, done.stderr.decode("utf-8", "replace")
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert len(proc.stdout.read(read)) == read  # it was writing when the reader left
        proc.stdout.close()  # the reader goes away: the writer's next write gets EPIPE
        stderr = proc.stderr.read().decode("utf-8", "replace")
        return proc.wait(timeout=120), stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args", [["runs", "--json"], ["logs", "run-000"]], ids=["runs-json", "logs"])
def test_output_over_a_pipe_cut_by_its_reader_ends_quietly(home, args):
    # Over 4 MiB to write and the reader stops after one line's worth: the writer is blocked on a full pipe
    # when the reader closes it, so the failed write is certain, not a race.
    code, stderr = _cut_short([sys.executable, "-m", "core", *args], home, read=100)
    assert "Traceback" not in stderr
    assert stderr == ""  # not "Exception ignored ... BrokenPipeError" at exit either
    assert code == EXIT_PIPE_CLOSED


@pytest.mark.parametrize("args", [["status", "run-000", "--json"], ["runs"]], ids=["status-json", "runs"])
def test_short_output_to_a_pipe_closed_before_it_is_written_ends_quietly(home, args):
    # A few KB (`runs`' table cuts the long model names), held in stdout's buffer until the end: the closed
    # pipe shows at the flush. (Read from a live reader, such output can fit the pipe whole and never fail.)
    code, stderr = _cut_short([sys.executable, "-m", "core", *args], home, read=0)
    assert "Traceback" not in stderr and stderr == ""
    assert code == EXIT_PIPE_CLOSED


def test_the_tunedeck_entry_point_ends_quietly_too(home):
    entry = [sys.executable, "-c", "import sys, tui.main; sys.exit(tui.main.main(sys.argv[1:]))"]
    code, stderr = _cut_short([*entry, "runs", "--json"], home, read=100)
    assert "Traceback" not in stderr and stderr == ""
    assert code == EXIT_PIPE_CLOSED


def _to_dev_full(command: list[str], home: Path, stderr_too: bool = False) -> tuple[int, str]:
    """Run ``command`` with stdout (and with ``stderr_too`` stderr) /dev/full, where every write fails with
    ENOSPC; (exit code, stderr)."""
    env = {**os.environ, "TUNEDECK_HOME": str(home), "LANG": "C", "PYTHONPATH": str(ROOT)}
    with open("/dev/full", "wb") as full:
        done = subprocess.run(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=full,
                              stderr=full if stderr_too else subprocess.PIPE, timeout=120)
    return done.returncode, (done.stderr or b"").decode("utf-8", "replace")


FULL = "tunedeck: cannot write standard output: No space left on device; where it goes (a file, a device, " \
       "a terminal) does not take it: send it elsewhere (or free space there) and try again\n"


@pytest.mark.parametrize("args", [["runs"], ["runs", "--json"], ["logs", "run-000"]],
                         ids=["runs", "runs-json", "logs"])
def test_output_to_a_full_device_names_standard_output(home, args):
    # `runs`: a few KB, failing at the flush after the command; the others MiBs, failing inside a print.
    # A failed write to stdout has no file name: the message said "cannot write ?: No space left ...".
    code, stderr = _to_dev_full([sys.executable, "-m", "core", *args], home)
    assert stderr == FULL  # one line, not "Exception ignored ..." at exit nor a traceback
    assert code == 1


def test_output_to_a_full_device_through_the_entry_point_and_in_chinese(home):
    entry = [sys.executable, "-c", "import sys, tui.main; sys.exit(tui.main.main(sys.argv[1:]))"]
    assert _to_dev_full([*entry, "runs", "--json"], home) == (1, FULL)
    code, stderr = _to_dev_full([sys.executable, "-m", "core", "--lang", "zh", "runs"], home)
    assert code == 1 and stderr.startswith("tunedeck: 无法写入标准输出：") and len(stderr.splitlines()) == 1


def test_standard_error_that_cannot_be_written_keeps_the_exit_code(home):
    # The message of a refusal (no such run: exit 2) cannot be written either: its print raised inside the
    # error handling and the command ended in a traceback (that no one saw) with exit 1.
    assert _to_dev_full([sys.executable, "-m", "core", "status", "no-such-run"], home, stderr_too=True)[0] == 2
    assert _to_dev_full([sys.executable, "-m", "core", "runs", "--json"], home, stderr_too=True)[0] == 1
