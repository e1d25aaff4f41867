"""``tunedeck logs`` and the headless progress lines read through the one file follower
(``core.watch.follow``): only appended bytes, each line once, truncation starts over, bounded reads.

Nothing here waits on time: the writer moves when the follower asks ``done()`` (follow's own hook), and the
headless test waits for the lines to have been printed."""

from __future__ import annotations

import builtins
import threading
import time
from pathlib import Path

import pytest

from core.runs import commands
from core.runs import logs as run_logs
from core.runs.jsonl import append_jsonl
from core.runs.launch import create_run
from core.runs.logs import FOLLOW_MAX_LINES, FOLLOW_MAX_READ, follow, last_lines
from core.watch import follow as watch_follow
from core.watch.follow import FileFollower
from tests.core.test_runs_unit import _Config


class CountingOpen:
    """``open`` for one module, counting the bytes its files hand back through ``read``."""

    def __init__(self) -> None:
        self.bytes_read = 0

    def __call__(self, *args, **kwargs):
        handle = builtins.open(*args, **kwargs)
        counter = self
        read = handle.read

        class Reader:
            def __getattr__(self, name):
                return getattr(handle, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                handle.close()

            def read(self, *a):
                data = read(*a)
                counter.bytes_read += len(data)
                return data

        return Reader()


def scripted(steps):
    """A ``done`` for follow(): each call runs the writer's next step; true once the script is over."""
    pending = list(steps)

    def done() -> bool:
        if pending:
            pending.pop(0)()
            return False
        return True

    return done


def append(path: Path, data: bytes):
    def step() -> None:
        with open(path, "ab") as handle:
            handle.write(data)

    return step


def test_appended_lines_are_seen_once_torn_ones_when_complete(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"[rank0] one\n")
    done = scripted([append(path, b"[rank0] two\n[rank0] th"), lambda: None, append(path, b"ree\r\n"),
                     lambda: None, append(path, b"[rank0] four\n")])
    assert list(follow(path, done, poll_s=0)) == ["[rank0] one", "[rank0] two", "[rank0] three", "[rank0] four"]


def test_a_log_truncated_mid_follow_is_read_again_from_its_start(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"old 1\nold 2\nold 3\n")

    def truncate() -> None:
        path.write_bytes(b"new 1\n")  # shorter than what was read: truncated and rewritten

    done = scripted([lambda: None, truncate, append(path, b"new 2\n")])
    assert list(follow(path, done, poll_s=0)) == ["old 1", "old 2", "old 3", "new 1", "new 2"]


def test_follow_starts_at_the_tail_offset_and_a_missing_log_is_empty(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(100)) + b"torn")
    lines, offset = last_lines(path, 2)
    assert lines == ["line 98", "line 99"]
    done = scripted([append(path, b" now whole\nline 101\n")])
    assert list(follow(path, done, offset, poll_s=0)) == ["torn now whole", "line 101"]
    assert list(follow(tmp_path / "nope.log", lambda: True)) == []
    assert last_lines(tmp_path / "nope.log", 5) == ([], 0)


def test_a_line_cap_hands_back_batches_and_keeps_a_torn_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"".join(b"%d\n" % i for i in range(10)) + b"to")
    follower = FileFollower(path, max_lines=3)
    batches = []
    while True:
        result = follower.read_new()
        batches.append(result.lines)
        if not result.more:
            break
    assert batches == [[b"0", b"1", b"2"], [b"3", b"4", b"5"], [b"6", b"7", b"8"], [b"9"]]
    with open(path, "ab") as handle:
        handle.write(b"rn\n")
    assert follower.read_new().lines == [b"torn"]
    with pytest.raises(ValueError):
        FileFollower(path, max_lines=0)


def test_a_slow_reader_holds_the_follower_back(tmp_path, monkeypatch):
    """Back-pressure: the generator reads the next batch only when the last one was taken."""
    path = tmp_path / "train.log"
    line = b"x" * 99 + b"\n"
    path.write_bytes(line * (3 * FOLLOW_MAX_LINES))
    counting = CountingOpen()
    monkeypatch.setattr(watch_follow, "open", counting, raising=False)
    lines = follow(path, lambda: True, poll_s=0)
    assert next(lines) == "x" * 99
    assert counting.bytes_read <= FOLLOW_MAX_READ < path.stat().st_size
    assert len(list(lines)) == 3 * FOLLOW_MAX_LINES - 1  # and every line still arrives, once


def test_the_tail_of_a_huge_log_reads_bounded_bytes(tmp_path, monkeypatch):
    path = tmp_path / "train.log"
    line = b"y" * 63 + b"\n"
    with open(path, "wb") as handle:
        for _ in range(64):
            handle.write(line * 2048)  # 8 MiB
    size = path.stat().st_size
    counting = CountingOpen()
    monkeypatch.setattr(run_logs, "open", counting, raising=False)

    lines, offset = last_lines(path, 10)
    assert lines == ["y" * 63] * 10 and offset == size
    assert counting.bytes_read <= run_logs.TAIL_BLOCK + 1

    counting.bytes_read = 0
    limit = 512 * 1024
    lines, offset = last_lines(path, 10**9, max_bytes=limit)  # far more lines than the limit holds
    assert offset == size and len(lines) == limit // len(line)
    assert counting.bytes_read <= 2 * limit < size


def test_headless_progress_prints_each_record_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))


    run = create_run(_Config(name="demo", model="tiny"), ["tunedeck", "demo", "--headless"], gpus=[])
    printed: list[str] = []
    lock = threading.Lock()

    def err(text: str) -> None:
        with lock:
            printed.append(text)

    def printed_steps() -> list[str]:
        with lock:
            return [p for p in printed if p.startswith("step ")]

    def wait_for(count: int) -> None:
        deadline = time.monotonic() + 30
        while len(printed_steps()) < count:
            assert time.monotonic() < deadline, printed_steps()
            time.sleep(0.01)

    def supervise(path) -> int:
        append_jsonl(run.metrics_path, {"kind": "header", "schema": 1, "total_steps": 6})
        for step in (1, 2, 3):
            append_jsonl(run.metrics_path, {"kind": "train", "step": step, "total_steps": 6, "loss": 1.0 / step})
        wait_for(3)  # the printer has read these: the next ones are appended behind its offset
        append_jsonl(run.metrics_path, {"kind": "eval", "step": 3, "eval_loss": 0.5})
        for step in (4, 5, 6):
            append_jsonl(run.metrics_path, {"kind": "train", "step": step, "total_steps": 6, "loss": 1.0 / step})
        run.write_status("finished")
        return 0

    monkeypatch.setattr(commands, "_err", err)
    monkeypatch.setattr("core.runs.supervisor.supervise", supervise)
    counting = CountingOpen()
    monkeypatch.setattr(watch_follow, "open", counting, raising=False)
    assert commands._run_headless(run, as_json=False) == 0
    assert counting.bytes_read == run.metrics_path.stat().st_size  # each byte read once, never the whole again
    steps = printed_steps()
    assert [s.split()[1] for s in steps] == ["1/6", "2/6", "3/6", "3", "4/6", "5/6", "6/6"]
    assert "eval loss 0.5000" in steps[3]


def test_headless_demo_exits_non_zero_unless_the_run_finished(tmp_path, monkeypatch):
    """Ctrl-C stopped the demo (checkpoint saved) and it exited 0; now 130 (SIGINT's convention), 143 for a
    SIGTERM stop, 1 for a failure; 0 only when it finished, and that line has no empty "(-)"."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))


    printed: list[str] = []
    monkeypatch.setattr(commands, "_err", printed.append)
    for signal_name, status, reason, expected in (("SIGINT", "stopped", "stopped at step 1", 130),
                                                  ("SIGTERM", "stopped", "stopped at step 1", 143),
                                                  (None, "failed", "exit code 1", 1),
                                                  (None, "finished", "", 0)):
        run = create_run(_Config(name="demo", model="tiny"), ["tunedeck", "demo", "--headless"], gpus=[])

        def supervise(path, run=run, signal_name=signal_name, status=status, reason=reason) -> int:
            if signal_name:
                run.append_event("stop_requested", signal=signal_name)
            run.write_status(status, reason)
            return 0 if status != "failed" else 1

        monkeypatch.setattr("core.runs.supervisor.supervise", supervise)
        printed.clear()
        assert commands._run_headless(run, as_json=False) == expected, status
        assert printed[-1] == (f"demo run ended: {status} — {reason}" if reason else f"demo run ended: {status}")


@pytest.mark.parametrize("language", ["en", "zh"])
def test_headless_demos_last_line_after_ctrl_c_has_no_parentheses_in_parentheses(tmp_path, monkeypatch, language):
    """QA: Ctrl-C on 'demo --headless' ended with "demo run ended: stopped (stopped at step 79; checkpoint saved
    (continue with tunedeck resume ID))": the reason, which has its own parentheses, was put in parentheses.
    It follows the status after a dash now, as 'tunedeck status' shows it, in English and in Chinese."""
    from core.i18n import Message, set_language

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    printed: list[str] = []
    monkeypatch.setattr(commands, "_err", printed.append)
    run = create_run(_Config(name="demo", model="tiny"), ["tunedeck", "demo", "--headless"], gpus=[])

    def supervise(path) -> int:  # what the trainer writes on a SIGINT stop
        run.append_event("stop_requested", signal="SIGINT")
        run.write_status("stopped", Message("train.stopped_at", step=79, id=run.id))
        return 0

    monkeypatch.setattr("core.runs.supervisor.supervise", supervise)
    set_language(language)
    try:
        assert commands._run_headless(run, as_json=False) == 130
    finally:
        set_language("en")
    last, depth, deepest = printed[-1], 0, 0
    for char in last:
        depth += char in "(（"
        deepest = max(deepest, depth)
        depth -= char in ")）"
    assert deepest <= 1 and depth == 0, last
    assert f"tunedeck resume {run.id}" in last and "79" in last, last


def test_logs_follow_ends_with_an_error_when_the_run_directory_is_deleted(tmp_path, monkeypatch, capsys):
    """`logs -f` of a live run whose directory was deleted followed for ever: with no status.json left the
    run reads as queued, which is active. It now ends, exit 1, saying the directory was deleted."""
    import shutil

    from core.cli import dispatch
    from core.runs import RunStatus, liveness

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))


    run = create_run(_Config(name="demo", model="tiny"), ["tunedeck", "demo"], gpus=[])
    run.log_path.write_text("[rank0] step 1\n")
    real = liveness.effective_status
    calls = []

    def live_then_deleted(target, persist=True):
        calls.append(target)
        if len(calls) <= 2:  # the supervisor is alive; after the first read the directory is deleted under it
            if len(calls) == 2:
                shutil.rmtree(target.path)
            return RunStatus("running", "", "", 0.0)
        if len(calls) > 20:  # (without the fix: end the test instead of following for ever)
            return RunStatus("finished", "", "", 0.0)
        return real(target, persist)

    monkeypatch.setattr(liveness, "effective_status", live_then_deleted)
    code = dispatch(["logs", run.id, "-f"], opens_app=False)
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["[rank0] step 1"]
    assert code == 1
    assert f"directory {run.path} was deleted" in captured.err and "Traceback" not in captured.err
