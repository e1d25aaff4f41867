"""Bucketed downsampling against a one-shot reference, the run series, tail-then-backfill feeds."""

from __future__ import annotations

import json
import math
import random

import pytest

from core.watch.downsample import BucketedSeries, downsample_minmax
from core.watch.feed import MetricsFeed
from core.watch.series import RunSeries


def test_few_points_map_exactly_like_the_reference():
    xs = list(range(1, 41))
    ys = [math.sin(x / 3) for x in xs]
    series = BucketedSeries(max_buckets=64)
    for x, y in zip(xs, ys, strict=True):
        series.add(float(x), y)
    columns = series.columns(80, 1.0, 40.0)
    reference = downsample_minmax([float(x) for x in xs], ys, 80)
    assert [None if c is None else (c.low, c.high) for c in columns] == reference


def test_million_points_stay_bounded_and_keep_extremes():
    rng = random.Random(7)
    series = BucketedSeries(max_buckets=512)
    spike_at, total = 654_321, 1_000_000
    low = high = None
    for x in range(total):
        y = 1.0 + rng.random() * 0.01
        if x == spike_at:
            y = 50.0  # one spike among a million points must survive the squeeze
        series.add(float(x), y)
        low = y if low is None else min(low, y)
        high = y if high is None else max(high, y)
    assert len(series.counts) <= 512 and sum(series.counts) == total
    # A frame costs buckets, not points: drawing reads each bucket a bounded number of times (the seconds
    # it takes are bench/dashboard.py's "frame" figure, not a test's).
    reads = count_bucket_reads(series)
    columns = series.columns(150, 0.0, float(total - 1))
    assert 0 < reads() <= 8 * len(series.counts) and reads() * 100 < total
    assert sum(c.count for c in columns if c) == total
    assert max(c.high for c in columns if c) == 50.0 and min(c.low for c in columns if c) == pytest.approx(low)
    spike_column = max(range(150), key=lambda i: columns[i].high if columns[i] else 0)
    assert abs(spike_column - spike_at / total * 149) <= 2
    assert series.y_range() == (pytest.approx(low), 50.0)


class _CountingList(list):
    """A bucket list that counts the items read from it (by index or by iterating)."""

    def __init__(self, items, tally: list[int]) -> None:
        super().__init__(items)
        self.tally = tally

    def __getitem__(self, index):
        self.tally[0] += 1
        return super().__getitem__(index)

    def __iter__(self):
        for item in super().__iter__():
            self.tally[0] += 1
            yield item


def count_bucket_reads(series: BucketedSeries):
    """Swap the series' bucket lists for counting copies; returns a function giving the reads so far."""
    tally = [0]
    for name in ("lows", "highs", "sums", "counts", "lasts"):
        setattr(series, name, _CountingList(getattr(series, name), tally))
    return lambda: tally[0]


def test_out_of_order_x_lands_in_the_first_bucket_and_columns_clip():
    series = BucketedSeries(max_buckets=8)
    series.add(10.0, 1.0)
    series.add(5.0, 2.0)  # a resume that rewound (x before the origin)
    series.add(20.0, 3.0)
    assert series.points == 3 and series.counts[0] == 2
    assert series.columns(0, 0, 1) == [] and BucketedSeries().columns(3, 0, 1) == [None, None, None]


def train(step, loss, tokens=1000.0, elapsed=None):
    return {"kind": "train", "step": step, "loss": loss, "learning_rate": 1e-4, "grad_norm": 1.0,
            "tokens_per_s": tokens, "elapsed_s": step * 2.0 if elapsed is None else elapsed}


def test_run_series_ema_nan_and_both_axes():
    series = RunSeries()
    series.extend([{"kind": "header", "model": "m"}] + [train(s, 2.0) for s in range(1, 11)])
    assert series.header["model"] == "m" and series.train_records == 10
    assert series.ema == pytest.approx(2.0) and series.ema_points == 10
    series.extend([train(11, 8.0)])
    assert series.ema_before_last == pytest.approx(2.0) and series.last_loss == 8.0
    series.extend([train(12, None), {"kind": "eval", "step": 12, "eval_loss": 2.5, "elapsed_s": 24.0}])
    assert series.last_loss_nan and series.nan_count == 1
    assert series.series("loss").points == 11  # the NaN is not drawn
    assert series.series("eval_loss", "time").x_range() == (24.0, 24.0)
    assert series.series("tokens_per_s", "time").x_range() == (2.0, 24.0)
    assert list(series.recent_tokens_per_s)[-1] == 1000.0
    version = series.version
    series.extend([])
    assert series.version > version
    assert RunSeries().version > series.version  # a new series never repeats a version a widget drew


def test_tail_first_then_backfill_equals_a_full_read(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as handle:
        handle.write(json.dumps({"kind": "header", "model": "m", "total_steps": 5000}) + "\n")
        for step in range(1, 5001):
            handle.write(json.dumps(train(step, None if step == 777 else 3.0 - step / 5000)) + "\n")
            if step % 1000 == 0:
                handle.write(json.dumps({"kind": "eval", "step": step, "eval_loss": 2.0, "elapsed_s": step * 2.0}) + "\n")
            if step == 2500:  # another writer's key order: read through json, in its place
                handle.write(json.dumps({"step": 2500.5, "kind": "train", "loss": 9.0, "elapsed_s": 5001.0}) + "\n")
        handle.write('{"kind": "train", "step": 5001, "lo')  # a torn last line
    feed = MetricsFeed(path, "tunedeck", tail_bytes=4096)
    tail = feed.read_tail()
    assert tail[0]["kind"] == "header"  # the header is read from the first line even when skipping ahead
    assert 5 < len(tail) < 100 and tail[-1]["step"] == 5000
    full = feed.backfill()
    assert full is not None and full.train_records == 5001 and full.latest["step"] == 5000
    reference = RunSeries()
    reference.extend([json.loads(line) for line in path.read_text().splitlines()[:-1]])
    for name in ("loss", "loss_ema", "eval_loss", "learning_rate", "tokens_per_s"):
        for axis in ("step", "time"):
            ours, theirs = full.series(name, axis), reference.series(name, axis)
            assert (ours.counts, ours.lows, ours.highs, ours.lasts) == (theirs.counts, theirs.lows, theirs.highs,
                                                                        theirs.lasts), (name, axis)
    assert full.ema == pytest.approx(reference.ema) and full.nan_count == reference.nan_count == 1
    assert full.series("eval_loss").points == 5
    with open(path, "a") as handle:
        handle.write('ss": 0.5}\n')
    records, restarted = feed.poll()
    assert not restarted and [r["step"] for r in records] == [5001]


def test_small_file_needs_no_backfill(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(train(1, 1.0)) + "\n")
    feed = MetricsFeed(path, "tunedeck")
    assert len(feed.read_tail()) == 1 and feed.backfill() is None


def test_bulk_add_matches_one_by_one():
    rng = random.Random(3)
    xs = sorted(rng.uniform(0, 10_000) for _ in range(5000))
    ys = [rng.gauss(0, 1) for _ in xs]
    one, bulk = BucketedSeries(max_buckets=64), BucketedSeries(max_buckets=64)
    for x, y in zip(xs, ys, strict=True):
        one.add(x, y)
    bulk.add_many(xs[:100], ys[:100])
    bulk.add_many(xs[100:], ys[100:])
    assert (bulk.span, bulk.counts, bulk.lows, bulk.highs, bulk.lasts) == (one.span, one.counts, one.lows, one.highs, one.lasts)
    assert bulk.sums == pytest.approx(one.sums) and bulk.points == one.points == 5000
