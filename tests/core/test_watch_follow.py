"""Following files by byte offset: complete lines, partial writes, truncation, replacement, tail reads."""

from __future__ import annotations

import os
import threading
import time

from core.watch.feed import LinesFeed, MetricsFeed
from core.watch.follow import FileFollower, read_lines_between, tail_start


def test_missing_file_is_empty_until_it_appears(tmp_path):
    path = tmp_path / "m.jsonl"
    follower = FileFollower(path)
    assert follower.read_new().lines == []
    path.write_bytes(b"a\nb\n")
    assert follower.read_new().lines == [b"a", b"b"]
    assert follower.read_new().lines == []


def test_partial_line_is_kept_until_completed(tmp_path):
    path = tmp_path / "log"
    follower = FileFollower(path)
    with open(path, "ab") as handle:
        handle.write(b"first\nsec")
        handle.flush()
        assert follower.read_new().lines == [b"first"]
        assert follower.read_new().lines == []
        handle.write(b"ond half")
        handle.flush()
        assert follower.read_new().lines == []
        handle.write(b"\nthird\n")
        handle.flush()
        assert follower.read_new().lines == [b"second half", b"third"]


def test_truncation_restarts_from_the_beginning(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"one\ntwo\nthree\n")
    follower = FileFollower(path)
    assert len(follower.read_new().lines) == 3
    path.write_bytes(b"new\n")  # shorter than what we had read
    result = follower.read_new()
    assert result.restarted and result.lines == [b"new"]


def test_replaced_file_restarts_even_when_longer(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"a\n")
    follower = FileFollower(path)
    follower.read_new()
    other = tmp_path / "log.new"
    other.write_bytes(b"x\ny\nz\n")
    os.replace(other, path)
    result = follower.read_new()
    assert result.restarted and result.lines == [b"x", b"y", b"z"]


def test_reads_are_capped_and_resume(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)))
    follower = FileFollower(path, max_read=1000)
    lines, polls = [], 0
    while True:
        result = follower.read_new()
        lines.extend(result.lines)
        polls += 1
        if not result.more:
            break
    assert polls > 5
    assert lines == [b"line %d" % i for i in range(1000)]


def test_tail_start_lands_on_a_line_start(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"".join(b"%05d\n" % i for i in range(100)))
    start = tail_start(path, 50)
    assert start % 6 == 0 and 0 < start <= 600 - 50 + 6
    assert tail_start(path, 10_000) == 0
    chunks = list(read_lines_between(path, 0, start, block=7))
    assert [line for chunk in chunks for line in chunk] == [b"%05d" % i for i in range(start // 6)]


def test_concurrent_writer_with_torn_writes_loses_nothing(tmp_path):
    """A writer appends records in arbitrary pieces while a follower polls: every record arrives once."""
    path = tmp_path / "metrics.jsonl"
    path.touch()
    done = threading.Event()

    def writer() -> None:
        with open(path, "ab", buffering=0) as handle:
            for i in range(400):
                line = b'{"kind": "train", "step": %d, "loss": 1.0}\n' % i
                cut = i % len(line)
                handle.write(line[:cut])
                if i % 7 == 0:
                    time.sleep(0.001)
                handle.write(line[cut:])
        done.set()

    feed = MetricsFeed(path, "tunedeck")
    got = feed.read_tail()
    thread = threading.Thread(target=writer)
    thread.start()
    while not done.is_set():
        records, restarted = feed.poll()
        assert not restarted
        got.extend(records)
        time.sleep(0.002)
    thread.join()
    got.extend(feed.poll()[0])
    assert [r["step"] for r in got] == list(range(400))


def test_lines_feed_starts_at_the_tail(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("".join(f"line {i}\n" for i in range(10_000)))
    feed = LinesFeed(path, tail_bytes=1000)
    lines, _ = feed.poll()
    assert lines[-1] == "line 9999" and 50 < len(lines) < 200
    with open(path, "a") as handle:
        handle.write("caf\u00e9 \xff\n")
    assert feed.poll()[0] == ["caf\u00e9 \xff"]
    assert LinesFeed(None).poll() == ([], False)


def test_metrics_poll_reads_a_bounded_batch_and_the_rest_at_the_next_polls(tmp_path):
    """Back-pressure for the dashboard's poller: a file that grew a lot is caught up poll by poll."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"")
    feed = MetricsFeed(path, "tunedeck", max_read=1000)
    assert feed.read_tail() == []
    with open(path, "ab") as handle:
        for step in range(200):
            handle.write(b'{"kind": "train", "step": %d, "loss": 1.0}\n' % step)
    batches = []
    while True:
        records, restarted = feed.poll()
        assert not restarted
        if not records:
            break
        batches.append([r["step"] for r in records])
    assert len(batches) > 5 and max(len(b) for b in batches) <= 1000 // 40
    assert [step for batch in batches for step in batch] == list(range(200))


def test_lines_feed_shows_the_end_of_a_line_longer_than_its_tail_marked_as_cut(tmp_path):
    """A last line longer than the tail the dashboard loads (LOG_TAIL_BYTES) showed nothing of it: the tail
    skipped to the next line start, which was the file's end. Its end shows now, after a cut mark."""
    from core.watch.feed import CUT_MARK, LOG_TAIL_BYTES

    path = tmp_path / "train.log"
    long_line = "start " + "\u00e9" * LOG_TAIL_BYTES + " the end"  # 2 bytes a character: cut inside one
    path.write_text("first\n" + long_line + "\n", encoding="utf-8")
    lines, _ = LinesFeed(path).poll()
    assert len(lines) == 1 and lines[0].startswith(CUT_MARK) and lines[0].endswith("\u00e9 the end")
    assert "\ufffd" not in lines[0] and len(lines[0]) < len(long_line)
    # ... and the lines after such a line follow it, as before.
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("after\n")
    lines, _ = LinesFeed(path).poll()
    assert lines[0].startswith(CUT_MARK) and lines[1:] == ["after"]
    # A tail that begins on a line start cuts nothing.
    path.write_text("".join(f"line {i}\n" for i in range(10)))
    assert LinesFeed(path, tail_bytes=len("line 9\n")).poll()[0] == ["line 9"]


def test_lines_feed_hands_on_lines_as_a_terminal_shows_them(tmp_path):
    """A trainer's log holds what its libraries wrote to a terminal: tqdm bars redrawn after carriage returns,
    colour escapes, tabs. The dashboard drew them raw: a ``\\r`` sent the cursor to column 0, mid-screen, and
    the bar's earlier frames overwrote the log pane's border and the events panel beside it."""
    path = tmp_path / "train.log"
    path.write_bytes("Map:  10%|█         | 1/10 [00:01<00:09]\rMap: 100%|██████████| 10/10 [00:02<00:00]\n"
                     "\x1b[31mERROR\x1b[0m disk\tfull\x07\r\n"
                     "中文\t文 \x1b]0;title\x07done\n".encode())
    lines, _ = LinesFeed(path).poll()
    assert lines == ["Map: 100%|██████████| 10/10 [00:02<00:00]", "ERROR disk      full", "中文    文 done"]
