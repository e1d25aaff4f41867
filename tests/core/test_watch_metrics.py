"""The metrics table (core.watch.metrics) against everything it drives: the trainer's record, both paths
into a run's series (records, and the backfill's regex over tunedeck's lines), the other trainers' readers
and the dashboard's charts. Parametrised over the table: a metric added there is tested here at once."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from core import i18n
from core.watch.adapters import TUNEDECK_TRAIN, normalize_llamafactory, normalize_swift, parse_lines
from core.watch.metrics import (
    BY_NAME,
    CHARTS,
    EVAL,
    FORMATTERS,
    METRICS,
    NOT_CHARTED,
    SERIES,
    TRAIN,
    TUNEDECK_EVAL_LAYOUT,
    TUNEDECK_FAST_KEYS,
    TUNEDECK_TRAIN_LAYOUT,
    X_AXES,
)
from core.watch.series import RunSeries

CALLBACKS = Path(__file__).resolve().parents[2] / "core" / "train" / "callbacks.py"
VALUE = 0.8125  # exact in binary and in JSON: both paths must give it back as it is

# values of the keys of the trainer's train record as it writes them (the lists, the clock)
SAMPLE = {"kind": "train", "step": 7, "total_steps": 100, "epoch": 0.21, "loss": 1.5, "learning_rate": 2e-4,
          "grad_norm": 1.25, "tokens_per_s": 12000.5, "samples_per_s": 5.9, "elapsed_s": 10.5, "eta_s": 140.0,
          "tokens_seen": 126000, "peak_allocated_gib": [61.2, 61.0], "peak_reserved_gib": [66.0, 65.8],
          "time": "2026-11-29T21:00:10Z"}
EVAL_SAMPLE = {"kind": "eval", "step": 7, "epoch": 0.21, "eval_loss": 1.6, "elapsed_s": 10.5}


def _dict_keys(node: ast.Dict) -> tuple[str, ...]:
    return tuple(k.value for k in node.keys if isinstance(k, ast.Constant))


def _trainer_records() -> dict[str, tuple[str, ...]]:
    """kind -> the keys, in order, of the dict literals core.train.callbacks writes as train / eval records."""
    found: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(ast.parse(CALLBACKS.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Dict) and node.keys and isinstance(node.keys[0], ast.Constant) \
                and node.keys[0].value == "kind" and isinstance(node.values[0], ast.Constant) \
                and node.values[0].value in (TRAIN, EVAL):
            found[node.values[0].value] = _dict_keys(node)
    return found


def _line(layout: tuple[str, ...], sample: dict, **values: float) -> bytes:
    record = {key: sample.get(key, 3.0) for key in layout}  # a key new to the layout: a number
    record.update(values)
    return json.dumps(record).encode()


def _series_by_both_paths(lines: list[bytes]) -> tuple[RunSeries, RunSeries]:
    by_records, by_lines = RunSeries(), RunSeries()
    by_records.extend(parse_lines(lines, "tunedeck"))
    by_lines.extend_tunedeck_lines(lines)
    return by_records, by_lines


def test_the_trainer_writes_the_layout_the_table_reads():
    records = _trainer_records()
    assert records[TRAIN] == TUNEDECK_TRAIN_LAYOUT, "core.train.callbacks' train record changed: update " \
        "TUNEDECK_TRAIN_LAYOUT and decide in core.watch.metrics whether each new key is a metric or NOT_CHARTED"
    assert records[EVAL] == TUNEDECK_EVAL_LAYOUT


def test_every_key_of_the_trainers_records_is_a_metric_or_not_charted():
    metric_keys = {m.tunedeck for m in METRICS if m.tunedeck}
    for key in (*TUNEDECK_TRAIN_LAYOUT, *TUNEDECK_EVAL_LAYOUT):
        assert (key in metric_keys) != (key in NOT_CHARTED), f"{key!r}: a metric of METRICS or NOT_CHARTED, not both"
    assert set(NOT_CHARTED) <= {*TUNEDECK_TRAIN_LAYOUT, *TUNEDECK_EVAL_LAYOUT}, "stale NOT_CHARTED entries"
    assert metric_keys <= {*TUNEDECK_TRAIN_LAYOUT, *TUNEDECK_EVAL_LAYOUT}, "a metric the trainer does not write"


def test_the_fast_path_matches_a_record_as_the_trainer_writes_it():
    line = _line(TUNEDECK_TRAIN_LAYOUT, SAMPLE)
    assert TUNEDECK_TRAIN.match(line), "the backfill would read every line through json: the trainer " \
        "should write the keys of metrics before its lists and strings (TUNEDECK_FAST_KEYS reads up to the last)"
    (record,) = parse_lines([line], "tunedeck", fast=True)
    assert record == {key: SAMPLE.get(key, 3.0) for key in ("kind", *TUNEDECK_FAST_KEYS)}


TUNEDECK_SERIES = [m for m in METRICS if m.series and (m.tunedeck or BY_NAME[m.derived or m.name].tunedeck)]


@pytest.mark.parametrize("metric", TUNEDECK_SERIES, ids=lambda m: m.name)
def test_a_metric_reaches_the_series_by_both_paths_with_the_same_value(metric):
    source = BY_NAME[metric.derived] if metric.derived else metric
    if source.kind == TRAIN:
        lines = [_line(TUNEDECK_TRAIN_LAYOUT, SAMPLE, **{source.tunedeck: VALUE})]
        assert TUNEDECK_TRAIN.match(lines[0])  # the line does take the fast path
    else:
        lines = [_line(TUNEDECK_EVAL_LAYOUT, EVAL_SAMPLE, **{source.tunedeck: VALUE})]
    by_records, by_lines = _series_by_both_paths(lines)
    for axis in X_AXES:
        a, b = by_records.series(metric.name, axis), by_lines.series(metric.name, axis)
        assert a.points == b.points == 1, (metric.name, axis)
        assert a.y_last == b.y_last == VALUE
        assert a.x_range() == b.x_range() == ((7.0, 7.0) if axis == "step" else (10.5, 10.5))


@pytest.mark.parametrize("metric", [m for m in METRICS if m.tunedeck and m.kind == TRAIN], ids=lambda m: m.name)
def test_a_metric_reaches_the_latest_record_by_both_paths(metric):
    lines = [_line(TUNEDECK_TRAIN_LAYOUT, SAMPLE, **{metric.tunedeck: VALUE})]
    by_records, by_lines = _series_by_both_paths(lines)
    assert by_records.latest[metric.name] == by_lines.latest[metric.name] == VALUE


def test_the_first_train_record_and_its_running_totals_are_kept_by_both_paths():
    """The header's steady tokens/s starts at the first train record: the backfill's regex path must keep
    it, with ``tokens_seen``, as the json path does."""
    lines = [_line(TUNEDECK_TRAIN_LAYOUT, SAMPLE, step=s, elapsed_s=s * 1.5, tokens_seen=s * 18000)
             for s in range(1, 6)]
    for series in _series_by_both_paths(lines):
        assert (series.first["step"], series.first["tokens_seen"], series.first["elapsed_s"]) == (1, 18000, 1.5)
        assert (series.latest["step"], series.latest["tokens_seen"]) == (5, 90000)


def test_every_series_is_kept_on_both_paths_after_mixed_lines():
    lines = [_line(TUNEDECK_TRAIN_LAYOUT, SAMPLE, step=s, elapsed_s=s * 1.5, loss=2.0 - s / 10) for s in range(1, 6)]
    lines.insert(3, _line(TUNEDECK_EVAL_LAYOUT, EVAL_SAMPLE, step=3))
    lines.append(json.dumps({"kind": "train", "loss": 1.0, "step": 6}).encode())  # another key order: json
    by_records, by_lines = _series_by_both_paths(lines)
    for name in SERIES:
        for axis in X_AXES:
            a, b = by_records.series(name, axis), by_lines.series(name, axis)
            assert (a.points, a.y_last, a.x_range()) == (b.points, b.y_last, b.x_range()), (name, axis)
    assert by_records.ema == by_lines.ema and by_records.latest == by_lines.latest


READERS = {"swift": (normalize_swift, {"global_step/max_steps": "7/100", "elapsed_time": "10s"}),
           "llamafactory": (normalize_llamafactory, {"current_steps": 7, "total_steps": 100,
                                                      "elapsed_time": "0:00:10"})}
READ_CASES = [(adapter, m, key) for adapter in READERS for m in METRICS for key in m.keys(adapter)]


@pytest.mark.parametrize(("adapter", "metric", "key"), READ_CASES,
                         ids=[f"{a}-{m.name}-{k}" for a, m, k in READ_CASES])
def test_each_trainers_key_of_a_metric_reaches_its_series(adapter, metric, key):
    normalize, progress = READERS[adapter]
    raw = {**progress, key: VALUE}
    if metric.kind == TRAIN and metric.name != "loss":
        raw[BY_NAME["loss"].keys(adapter)[0]] = 1.5
    record = normalize(raw)
    assert record is not None and record["kind"] == metric.kind and record[metric.name] == VALUE
    if metric.series:
        series = RunSeries()
        series.extend([record])
        assert series.series(metric.name, "step").y_last == VALUE
        assert series.series(metric.name, "time").y_last == VALUE


def test_the_table_is_consistent():
    chart_ids = [chart.id for chart in CHARTS]
    assert len(set(chart_ids)) == len(chart_ids) and len(BY_NAME) == len(METRICS)
    english, chinese = i18n.catalogue("en"), i18n.catalogue("zh")
    for metric in METRICS:
        assert metric.tunedeck in (None, metric.name), "tunedeck's records are read as they are"
        assert metric.unit in FORMATTERS and metric.kind in (TRAIN, EVAL)
        assert metric.chart is None or (metric.chart in chart_ids and metric.series)
        assert 0 <= metric.colour < 8 and metric.mode in ("band", "line", "points")
        for key in (metric.label, metric.legend):
            assert key is None or (key in english and key in chinese), key
        assert isinstance(metric.format(VALUE), str) and metric.format(None) == "–"
    for chart in CHARTS:
        assert chart.metrics and chart.title in english and chart.title in chinese
        legends = [m.legend for m in chart.metrics]
        assert len(chart.metrics) == 1 or all(legends), f"{chart.id}: a chart of several lines names each"


def test_units_format_through_core_units():
    assert BY_NAME["tokens_per_s"].format(8452.4) == "8,452"
    assert BY_NAME["memory_gib"].format(81.25) == "81.2 GiB"
    assert BY_NAME["loss"].format(VALUE) == "0.8125"
