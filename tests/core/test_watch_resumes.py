"""A resumed run's metrics.jsonl holds the steps after its checkpoint twice (or three times): the first
attempt's, then the new one's after a ``resumed`` record. Every reader of the charts' series (the tail, the
backfill, following the file) takes each step once, the latest attempt's, and the file stays as written."""

from __future__ import annotations

import json
from datetime import timedelta

from core.watch.feed import MetricsFeed
from core.watch.series import RunSeries

# attempt A logs 1..30, crashes; B resumes from 20, logs 21..35, crashes; C resumes from 25, logs 26..40
ATTEMPTS = (("A", 1, 30, None), ("B", 21, 35, 20), ("C", 26, 40, 25))
LOSS = {"A": 1.0, "B": 2.0, "C": 3.0}
WANTED = {**{s: "A" for s in range(1, 21)}, **{s: "B" for s in range(21, 26)}, **{s: "C" for s in range(26, 41)}}


def _lines(attempts=ATTEMPTS) -> list[str]:
    lines = [json.dumps({"schema": 1, "kind": "header", "total_steps": 100})]
    for name, first, last, resumed in attempts:
        if resumed is not None:
            lines.append(json.dumps({"kind": "resumed", "step": resumed, "total_steps": 100,
                                     "checkpoint": f"checkpoint-{resumed}"}))
        for step in range(first, last + 1):
            lines.append(json.dumps({"kind": "train", "step": step, "total_steps": 100,
                                     "loss": LOSS[name] + step / 1000, "tokens_per_s": 100.0,
                                     "elapsed_s": float(step), "eta_s": 5.0, "tokens_seen": step * 100,
                                     "padding": "x" * 200}))  # a few lines take a few kilobytes
            if step == 30:
                lines.append(json.dumps({"kind": "eval", "step": 30, "eval_loss": LOSS[name],
                                         "elapsed_s": 30.0}))
    return lines


def _points(series: RunSeries, name: str = "loss", axis: str = "step") -> list[tuple[int, float]]:
    """(x, y) of each bucket: one point a bucket while the run is this short (span 1)."""
    buckets = series.series(name, axis)
    assert buckets.span == 1.0
    return [(int(buckets.origin + i), round(last, 4)) for i, (count, last)
            in enumerate(zip(buckets.counts, buckets.lasts, strict=True)) if count]


def _drawn(feed: MetricsFeed, tail: list) -> RunSeries:
    """The series the dashboard draws after ``tail``: the backfill's, or the tail's where it held the whole file."""
    series = feed.backfill()
    if series is None:
        series = RunSeries()
        series.extend(tail)
    return series


def _check(series: RunSeries) -> None:
    loss = _points(series)
    assert loss == [(s, round(LOSS[WANTED[s]] + s / 1000, 4)) for s in range(1, 41)]
    assert sum(series.series("loss").counts) == 40  # each step once (the file holds 61 train records)
    assert sum(series.series("loss", "time").counts) == 40  # elapsed_s went back at each resume
    assert _points(series, "eval_loss") == [(30, 3.0)]  # attempt A's eval at 30 was superseded too
    assert series.latest["step"] == 40 and series.last_loss == 3.04


def test_tail_backfill_and_a_whole_read_take_each_step_once_the_latest_attempts(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(_lines()) + "\n")
    before = path.read_bytes()
    for tail_bytes in (10**9, 6_000, 2_000):  # all in the tail; resumes in the backfill; only one in it
        feed = MetricsFeed(path, "tunedeck", tail_bytes=tail_bytes)
        tail = feed.read_tail()
        steps = [r["step"] for r in tail if r.get("kind") == "train"]
        assert len(steps) == len(set(steps)), tail_bytes
        assert all(r["loss"] >= LOSS[WANTED[r["step"]]] for r in tail if r.get("kind") == "train")
        series = feed.backfill()
        if series is None:
            series = RunSeries()
            series.extend(tail)
        else:
            assert feed.start > 0
        _check(series)
    assert path.read_bytes() == before  # append-only: nothing is rewritten


def test_a_resume_appended_while_followed_starts_the_series_over_without_the_lost_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = _lines()
    cut = lines.index(json.dumps({"kind": "resumed", "step": 25, "total_steps": 100, "checkpoint": "checkpoint-25"}))
    path.write_text("\n".join(lines[:cut]) + "\n")
    feed = MetricsFeed(path, "tunedeck", tail_bytes=4_000)
    series = RunSeries()
    series.extend(feed.read_tail())
    series = feed.backfill() or series
    assert series.latest["step"] == 35
    with open(path, "a") as handle:  # attempt C: back to step 25, then on to 40
        handle.write("\n".join(lines[cut:]) + "\n")
    records, restarted = feed.poll()
    assert restarted  # steps 26..35 on screen were superseded: the reader starts over
    series = RunSeries()
    series.extend(records)
    series = feed.backfill() or series
    _check(series)
    with open(path, "a") as handle:  # and goes on following
        handle.write(json.dumps({"kind": "train", "step": 41, "loss": 3.041, "elapsed_s": 41.0}) + "\n")
    records, restarted = feed.poll()
    assert not restarted and [r["step"] for r in records] == [41]


def test_a_resume_whose_attempt_logged_nothing_yet_ends_the_series_at_its_checkpoint(tmp_path):
    """The new attempt failed before its first step: the dead attempt's steps after the checkpoint are lost,
    the header's step is the checkpoint's, with the last known loss and no ETA (as status and runs say)."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(_lines(ATTEMPTS[:1]) + [json.dumps({"kind": "resumed", "step": 20,
                                                                     "total_steps": 100})]) + "\n")
    feed = MetricsFeed(path, "tunedeck")
    series = RunSeries()
    series.extend(feed.read_tail())
    assert sum(series.series("loss").counts) == 20 and series.last_loss == 1.02
    assert series.latest["step"] == 20 and series.latest["loss"] == 1.02 and series.latest["eta_s"] is None


def _llamafactory_lines(attempts=ATTEMPTS) -> list[str]:
    """The same attempts as LLaMA-Factory's LogCallback appends them to one trainer_log.jsonl (a run resumed
    or restarted into the same folder, without overwrite_output_dir): no resumed record, the steps go back."""
    lines = []
    for name, first, last, _resumed in attempts:
        for step in range(first, last + 1):
            lines.append(json.dumps({"current_steps": step, "total_steps": 100, "loss": LOSS[name] + step / 1000,
                                     "lr": 1e-05, "epoch": step / 100, "percentage": float(step),
                                     "elapsed_time": str(timedelta(seconds=step)), "remaining_time": "0:00:05",
                                     "throughput": 100.0, "total_tokens": step * 100, "padding": "x" * 200}))
            if step == 30:
                lines.append(json.dumps({"current_steps": 30, "total_steps": 100, "eval_loss": LOSS[name],
                                         "epoch": 0.3, "percentage": 30.0, "elapsed_time": "0:00:30",
                                         "remaining_time": "0:00:05"}))
    return lines


def test_llamafactory_restarted_into_its_folder_takes_each_step_once_the_latest_attempts(tmp_path):
    """LLaMA-Factory appends a resumed (or restarted) run to the folder's trainer_log.jsonl with its steps going
    back: the charts drew every attempt over the others (the loss zigzagging between them); a step going back
    now counts as a resume, in the tail, the backfill and across the two."""
    path = tmp_path / "trainer_log.jsonl"
    lines = _llamafactory_lines()
    path.write_text("\n".join(lines) + "\n")
    attempt_c = 31 + 16  # C's first line: after A (30 steps, an eval) and B (21..35, an eval)
    edge = len("\n".join(lines[attempt_c:]) + "\n") + 1  # the tail begins with attempt C
    for tail_bytes in (10**9, 6_000, 2_000, 300, edge):  # all in the tail; restarts in the backfill; at its edge
        feed = MetricsFeed(path, "llamafactory", tail_bytes=tail_bytes)
        tail = feed.read_tail()
        steps = [r["step"] for r in tail if r.get("kind") == "train"]
        assert len(steps) == len(set(steps)), tail_bytes
        _check(_drawn(feed, tail))


def test_llamafactory_restart_appended_while_followed_starts_the_series_over(tmp_path):
    path = tmp_path / "trainer_log.jsonl"
    lines = _llamafactory_lines()
    cut = 31 + 15 + 1  # attempt A (30 steps and its eval) and B (21..35 and its eval at 30)
    path.write_text("\n".join(lines[:cut]) + "\n")
    feed = MetricsFeed(path, "llamafactory", tail_bytes=4_000)
    series = RunSeries()
    series.extend(feed.read_tail())
    series = feed.backfill() or series
    assert series.latest["step"] == 35 and sum(series.series("loss").counts) == 35
    with open(path, "a") as handle:  # attempt C: back to step 26, then on to 40
        handle.write("\n".join(lines[cut:]) + "\n")
    records, restarted = feed.poll()
    assert restarted
    series = RunSeries()
    series.extend(records)
    series = feed.backfill() or series
    _check(series)


def _llamafactory_restarted_lines() -> list[str]:
    """The attempts of ``_llamafactory_lines`` as LLaMA-Factory and ms-swift log them: each attempt's
    elapsed_time counts from 0 again (A runs 30 s, B 15 s, C 15 s)."""
    lines = []
    for name, first, last, _resumed in ATTEMPTS:
        for step in range(first, last + 1):
            lines.append(json.dumps({"current_steps": step, "total_steps": 100, "loss": LOSS[name] + step / 1000,
                                     "lr": 1e-05, "epoch": step / 100, "percentage": float(step),
                                     "elapsed_time": str(timedelta(seconds=step - first + 1)),
                                     "remaining_time": "0:00:05", "padding": "x" * 200}))
    return lines


def test_a_restarted_llamafactory_run_goes_on_along_the_time_axis(tmp_path):
    """A run restarted into its folder counts its elapsed time from 0 again: the dashboard's time-axis
    chart went back at each restart (the kept steps of B drawn before A's). Each attempt now goes after the
    earlier one's end: A's steps 1-20 at 1-20 s, B's 21-25 after A's 30 s, C's 26-40 after B's 15 s; the
    same read whole, through a backfill, with the restart at the tail's edge, and followed."""
    path = tmp_path / "trainer_log.jsonl"
    lines = _llamafactory_restarted_lines()
    path.write_text("\n".join(lines) + "\n")
    wanted = ([(s, s) for s in range(1, 21)] + [(30 + s - 20, s) for s in range(21, 26)]
              + [(45 + s - 25, s) for s in range(26, 41)])  # (elapsed on the axis, step)
    edge = len("\n".join(lines[30 + 15:]) + "\n") + 1  # the tail begins with attempt C
    for tail_bytes in (10**9, 6_000, 2_000, 300, edge):
        feed = MetricsFeed(path, "llamafactory", tail_bytes=tail_bytes)
        tail = feed.read_tail()
        series = _drawn(feed, tail)
        time_points = _points(series, "loss", "time")
        assert time_points == [(x, round(LOSS[WANTED[s]] + s / 1000, 4)) for x, s in wanted], tail_bytes
        assert series.latest["elapsed_s"] == 60.0
        placed = MetricsFeed(path, "llamafactory", tail_bytes=tail_bytes)  # watch --json: no series built
        tail = placed.read_tail()
        placed.place_tail()
        assert [r for r in tail if r.get("kind") == "train"][-1]["elapsed_s"] == 60.0, tail_bytes

    path.write_text("\n".join(lines[:30 + 15]) + "\n")  # A and B, then C appended while followed
    feed = MetricsFeed(path, "llamafactory", tail_bytes=2_000)
    feed.read_tail()
    feed.backfill()
    with open(path, "a") as handle:
        handle.write("\n".join(lines[30 + 15:30 + 20]) + "\n")
    records, restarted = feed.poll()
    series = RunSeries()
    series.extend(records)
    series = feed.backfill() or series
    assert restarted and _points(series, "loss", "time")[-1][0] == 45 + 5  # C's 30th step, 5 s after B's end
    with open(path, "a") as handle:
        handle.write("\n".join(lines[30 + 20:]) + "\n")
    records, restarted = feed.poll()
    assert not restarted and [r["elapsed_s"] for r in records if r["kind"] == "train"] == [
        45.0 + s - 25 for s in range(31, 41)]


def test_watch_json_gives_the_elapsed_time_the_dashboard_shows_after_a_restart_before_the_tail(tmp_path):
    """``watch --json`` reads only the file's tail: a restart before it gave the new attempt's elapsed time
    from 0 where the dashboard's header (the whole series) gives it after the earlier attempt's end."""
    import subprocess
    import sys
    from pathlib import Path

    from core.watch.feed import METRICS_TAIL_BYTES

    out = tmp_path / "lf"
    out.mkdir()
    lines = []
    for first, last in ((1, 1000), (501, 1500)):  # restarted from step 500: elapsed from 0 again
        lines += [json.dumps({"current_steps": step, "total_steps": 2000, "loss": 1.0, "epoch": step / 1000,
                              "percentage": step / 20, "elapsed_time": str(timedelta(seconds=step - first + 1)),
                              "remaining_time": "0:10:00", "padding": "x" * 300}) for step in range(first, last + 1)]
    (out / "trainer_log.jsonl").write_text("\n".join(lines) + "\n")
    assert len("\n".join(lines[1000:])) > METRICS_TAIL_BYTES  # the restart is before the tail
    result = subprocess.run([sys.executable, "-m", "core", "watch", str(out), "--json"], cwd=Path(__file__).parents[2],
                            capture_output=True, text=True, timeout=120,
                            env={"TUNEDECK_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    latest = json.loads(result.stdout)["latest"]
    assert latest["step"] == 1500 and latest["elapsed_s"] == 1000.0 + 1000.0


def test_a_restart_right_after_an_evaluation_at_the_tails_edge_goes_on_after_the_evaluation(tmp_path):
    """LLaMA-Factory logs an evaluation after its step's train line; a run restarted after it counts its elapsed
    time from 0. Where the tail began with that evaluation (the restart's first line next), the new attempt
    was put after the last train line's time, not the evaluation's end (its minute drawn twice over), and the
    evaluation, superseded by the restart as the steps before it are, was kept and drawn one whole attempt
    later on the time axis. The same as read whole now."""
    path = tmp_path / "trainer_log.jsonl"

    def line(step: int, elapsed: int, **values) -> str:
        return json.dumps({"current_steps": step, "total_steps": 100, "epoch": step / 100, "percentage": float(step),
                           "elapsed_time": str(timedelta(seconds=elapsed)), "remaining_time": "0:00:05",
                           "padding": "x" * 200, **values})

    lines = [line(step, step, loss=2.0 + step / 1000) for step in range(1, 21)]
    lines.append(line(20, 80, eval_loss=1.5))  # the evaluation at step 20 took a minute
    lines += [line(step, step - 10, loss=1.0 + step / 1000) for step in range(11, 31)]  # restarted at step 11
    path.write_text("\n".join(lines) + "\n")
    edge = len("\n".join(lines[20:]) + "\n") + 1  # the tail begins with the evaluation

    def time_points(tail_bytes: int) -> tuple[list, list]:
        feed = MetricsFeed(path, "llamafactory", tail_bytes=tail_bytes)
        tail = feed.read_tail()
        series = _drawn(feed, tail)
        return _points(series, "loss", "time"), _points(series, "eval_loss", "time")

    whole = time_points(10**9)
    assert whole[0][10] == (81, 1.011)  # step 11 of the restart: after the evaluation
    assert whole[1] == []  # the evaluation at step 20: superseded by the restart at step 11, as A's steps 11-20
    assert time_points(edge) == whole


def test_watch_json_places_the_tail_from_each_lines_step_and_kind_alone(tmp_path, monkeypatch):
    """``watch --json`` on a restarted LLaMA-Factory or ms-swift log read every line before the tail through
    its normaliser (its metrics, both times parsed) to find the restarts: seconds on a 100 MB log. The lines'
    metrics are not read now (the normaliser is not called before the tail), and the tail is placed as the
    whole read places it: evaluations, lines without a time or with one that does not parse, broken and
    non-object lines, ms-swift's summary line, restarts at the tail's edge."""
    from core.watch import adapters
    from core.watch.adapters import parse_lines
    from core.watch.feed import Attempts, mark_restarts, read_lines_between

    normalised: list[dict] = []  # lines the normaliser read while the tail was placed

    def counted(kind: str):
        real = adapters.NORMALIZERS[kind]
        return real, lambda raw: normalised.append(raw) or real(raw)

    def lf(step: int, elapsed, **values) -> str:
        return json.dumps({"current_steps": step, "total_steps": 100, "epoch": step / 100,
                           "elapsed_time": elapsed, "remaining_time": "0:00:05", "padding": "x" * 100, **values})

    def swift(step: int, elapsed, **values) -> str:
        return json.dumps({"global_step/max_steps": f"{step}/100", "elapsed_time": elapsed,
                           "remaining_time": "5s", "padding": "x" * 100, **values})

    for kind, line, seconds in (("llamafactory", lf, lambda s: str(timedelta(seconds=s))),
                                ("swift", swift, lambda s: f"{s // 60}m {s % 60}s")):
        lines = [line(s, seconds(s), loss=2.0) for s in range(1, 21)]
        lines.append(line(20, seconds(80), eval_loss=1.5))
        lines.append(line(21, "soon", loss=1.9))  # an attempt's last time that does not parse
        lines += ["[1, 2]", "{broken", "", line(21, None, loss=1.9)]
        lines += [line(s, seconds(s - 10), loss=1.0) for s in range(11, 31)]  # restarted: time from 0
        lines.append(line(30, seconds(25), eval_loss=1.2, loss=None))
        lines += [line(s, seconds(s - 20), loss=0.5) for s in range(21, 41)]  # and again
        if kind == "swift":
            lines.append(json.dumps({"train_runtime": 99.0, "train_loss": 1.0}))
        lines += [line(s, seconds(s - 35), loss=0.4) for s in range(36, 46)]  # after the summary line
        path = tmp_path / f"{kind}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        total = path.stat().st_size
        for tail_bytes in range(200, total, 180):  # the tail starting on every few lines
            feed = MetricsFeed(path, kind, tail_bytes=tail_bytes)
            feed.read_tail()
            if feed.start <= 0:
                continue
            wanted = Attempts()  # as the normaliser and mark_restarts read every record before the tail
            for block in read_lines_between(path, 0, feed.start):
                mark_restarts(parse_lines(block, kind), wanted)
            real, spy = counted(kind)
            monkeypatch.setitem(adapters.NORMALIZERS, kind, spy)
            assert feed._attempts_before_tail() == wanted, (kind, tail_bytes)
            feed.place_tail()
            assert normalised == [], (kind, tail_bytes)
            monkeypatch.setitem(adapters.NORMALIZERS, kind, real)


def _asked_to_resume(path, step: int) -> None:
    """What ``tunedeck resume`` records in run.json before its trainer has loaded (``prepare_resume``)."""
    record = json.loads((path / "run.json").read_text())
    record["resumes"] = [{"time": "2026-11-29T22:00:00Z", "step": step, "previous_status": "failed"}]
    (path / "run.json").write_text(json.dumps(record))


def test_a_resume_whose_trainer_has_not_logged_cuts_the_charts_at_its_checkpoint_as_status_does(tmp_path):
    """A run at step 30 resumed from checkpoint-20 whose new attempt stopped (or failed) while loading: its
    metrics file never got a ``resumed`` record. `tunedeck status` said step 20 and step 20's loss (steps 21-30
    are lost: the next resume goes on from 20), the dashboard's header step 20 too, but its charts drew 1-30
    with step 30's loss in the legend, and `watch --json` said step 30. Now every reader cuts at 20, from the
    tail alone or with the backfill, and the file stays as written."""
    import subprocess
    import sys
    from pathlib import Path

    from core.runs.run_dir import RunDirectory
    from core.watch.feed import open_metrics_feed
    from core.watch.source import open_watch_source
    from tests.fixtures.watch.run_builder import build_run, loss_at

    path = build_run(tmp_path / "runs", "20261129-2100-resumed", status="stopped", steps=30, total=100,
                     evals_every=25)
    _asked_to_resume(path, 20)
    before = (path / "metrics.jsonl").read_bytes()
    status = RunDirectory(path).latest_metrics()
    assert status["step"] == 20 and status["loss"] == loss_at(20)  # what `tunedeck status` says
    assert RunDirectory(path).latest_eval() is None  # and its eval loss: the eval at 25 was given up too
    feeds = [open_metrics_feed(open_watch_source(path)),
             MetricsFeed(path / "metrics.jsonl", "tunedeck", tail_bytes=2_000, record_path=path / "run.json")]
    for feed in feeds:
        tail = feed.read_tail()
        assert all(r["step"] <= 20 for r in tail if r.get("kind") in ("train", "eval"))
        series = _drawn(feed, tail)
        assert [x for x, _ in _points(series)] == list(range(1, 21))
        assert series.last_loss == loss_at(20) and series.latest["step"] == 20 and series.latest["eta_s"] is None
        assert _points(series, "eval_loss") == []  # the eval at 25 was the attempt given up's
    assert feeds[1].start > 0  # the backfill was cut too
    result = subprocess.run([sys.executable, "-m", "core", "watch", str(path), "--json"],
                            cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=120,
                            env={"TUNEDECK_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    latest = json.loads(result.stdout)["latest"]
    assert latest["step"] == 20 and latest["loss"] == loss_at(20), latest
    assert (path / "metrics.jsonl").read_bytes() == before


def test_a_resume_asked_while_the_dashboard_follows_starts_the_charts_over_at_its_checkpoint(tmp_path):
    """The dashboard open on a run at step 30, then `u` (or `tunedeck resume`) from checkpoint-20: the charts kept
    steps 21-30 until the new trainer had loaded and logged its ``resumed`` record (for good where it never did),
    while the header already said step 20. Now the feed starts over at 20 as soon as run.json records the resume,
    and the trainer's own ``resumed`` record, when it comes, changes nothing more."""
    from tests.fixtures.watch.run_builder import build_run, loss_at, train_record, write_jsonl

    path = build_run(tmp_path / "runs", "20261129-2100-followed", status="stopped", steps=30, total=100,
                     evals_every=0)
    feed = MetricsFeed(path / "metrics.jsonl", "tunedeck", record_path=path / "run.json")
    series = RunSeries()
    series.extend(feed.read_tail())
    assert series.latest["step"] == 30 and feed.poll() == ([], False)
    _asked_to_resume(path, 20)
    records, restarted = feed.poll()
    assert restarted
    series = RunSeries()
    series.extend(records)
    assert [x for x, _ in _points(series)] == list(range(1, 21)) and series.last_loss == loss_at(20)
    assert feed.poll() == ([], False)  # taken in once
    write_jsonl(path / "metrics.jsonl", [{"kind": "resumed", "step": 20, "total_steps": 100,
                                          "time": "2026-11-29T22:00:07Z"},
                                         train_record(21, 100, time="2026-11-29T22:00:08Z")], mode="a")
    records, restarted = feed.poll()
    assert not restarted and [(r["kind"], r["step"]) for r in records] == [("resumed", 20), ("train", 21)]
