"""ms-swift and LLaMA-Factory records normalised to tunedeck's keys; durations; fast line parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.watch.adapters import normalize_llamafactory, normalize_swift, parse_duration, parse_lines, to_float

FIXTURES = Path(__file__).parents[1] / "fixtures" / "watch"
SWIFT_LOG = FIXTURES / "swift_output" / "v0-20261129-210000" / "logging.jsonl"
LF_LOG = FIXTURES / "llamafactory_output" / "trainer_log.jsonl"


@pytest.mark.parametrize("text, seconds", [
    ("0:01:02", 62), ("1:02:03", 3723), ("1 day, 2:03:04", 93784), ("2 days, 0:00:01", 172801),
    ("12s", 12), ("1m 2s", 62), ("13m 12s", 792), ("1h 5m", 3900), ("2d 3h", 183600), ("15h 30m", 55800),
    (42, 42), ("7.5", 7.5),
])
def test_durations_of_both_tools(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [None, "", "soon", True, float("nan")])
def test_unparseable_durations_are_none(value):
    assert parse_duration(value) is None


def test_numbers_from_strings_and_percentages():
    assert to_float("83.33%") == pytest.approx(83.33)
    assert to_float("0.5") == 0.5
    assert to_float("nan") is None and to_float("x") is None and to_float(True) is None


def test_swift_train_eval_and_summary_lines():
    raw = [json.loads(line) for line in SWIFT_LOG.read_text().splitlines()]
    first = normalize_swift(raw[0])
    assert first == {"kind": "train", "loss": raw[0]["loss"], "learning_rate": raw[0]["learning_rate"],
                     "grad_norm": raw[0]["grad_norm"], "memory_gib": 15.46, "steps_per_s": 0.125, "step": 1,
                     "total_steps": 100, "epoch": 0.01, "elapsed_s": 8.0, "eta_s": 792.0}
    evals = [normalize_swift(r) for r in raw if "eval_loss" in r]
    assert [e["kind"] for e in evals] == ["eval", "eval"] and evals[0]["step"] == 50
    assert normalize_swift(raw[-1]) == {"kind": "end"}  # the summary: its loss is a run average, not charted


def test_swift_string_values_and_nan_loss():
    record = normalize_swift({"loss": "NaN", "learning_rate": "1e-4", "global_step/max_steps": "7/70"})
    assert record["loss"] is None and record["loss_nan"] and record["learning_rate"] == 1e-4
    assert record["step"] == 7 and record["total_steps"] == 70


def test_llamafactory_train_eval_and_progress_lines():
    raw = [json.loads(line) for line in LF_LOG.read_text().splitlines()]
    first = normalize_llamafactory(raw[0])
    assert first["kind"] == "train" and first["step"] == 5 and first["total_steps"] == 100
    assert first["learning_rate"] == raw[0]["lr"] and first["tokens_per_s"] == raw[0]["throughput"]
    assert first["elapsed_s"] == 26 and first["eta_s"] == 494
    evals = [normalize_llamafactory(r) for r in raw if "eval_loss" in r]
    assert len(evals) == 2 and evals[1]["step"] == 100 and evals[1]["kind"] == "eval"
    progress = {"current_steps": 5, "total_steps": 20, "percentage": 25.0, "elapsed_time": "0:00:05",
                "remaining_time": "0:00:15"}
    assert normalize_llamafactory(progress) is None


def test_parse_lines_skips_garbage():
    lines = [b'{"kind": "train", "step": 1, "loss": 2.0}', b"", b"not json", b"[1, 2]", b'{"kind": "tr',
             b'{"kind": "eval", "step": 1, "eval_loss": 2.1}']
    records = parse_lines(lines, "tunedeck")
    assert [r["kind"] for r in records] == ["train", "eval"]
    assert len(parse_lines(SWIFT_LOG.read_bytes().splitlines(), "swift")) == 103  # 100 train, 2 eval, the end
    assert len(parse_lines(LF_LOG.read_bytes().splitlines(), "llamafactory")) == 22


def test_fast_path_reads_tunedeck_train_records_like_json():
    from tests.fixtures.watch.run_builder import train_record

    records = [train_record(1, 10), train_record(2, 10, loss=None, eta_s=None), train_record(3, 10, loss=1e-05)]
    lines = [json.dumps(r).encode() for r in records]
    lines.append(json.dumps({"kind": "train", "loss": 1.0, "step": 4}).encode())  # other key order: json path
    lines.append(b'{"kind": "train", "step": 5, "total_steps": 10, "epoch": 0.1, "loss": NaN, "lr": 1}')
    fast = parse_lines(lines, "tunedeck", fast=True)
    full = parse_lines(lines, "tunedeck")
    keys = ("kind", "step", "total_steps", "epoch", "loss", "learning_rate", "grad_norm", "tokens_per_s",
            "elapsed_s", "eta_s")
    assert len(fast) == len(full) == 5
    for a, b in zip(fast, full, strict=True):
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}
    assert fast[1]["loss"] is None and fast[2]["loss"] == 1e-05


def test_tunedeck_records_with_figures_that_are_not_numbers_are_skipped_not_fatal():
    """A damaged or hand-edited metrics.jsonl line ("step": "x", "loss": "abc", a number "1.2.3") closed the
    dashboard with a traceback (float("x") in RunSeries); such a record is skipped, a bad figure left out."""
    from core.watch.series import RunSeries

    lines = [
        b'{"kind": "train", "step": 1, "total_steps": 10, "loss": 2.0, "elapsed_s": 1.0}',
        b'{"kind": "train", "step": "x", "loss": "abc"}',
        b'{"kind": "eval", "step": "x", "eval_loss": 1.0}',
        b'{"kind": "train", "step": 2, "total_steps": "t", "epoch": "e", "loss": 1.5, "elapsed_s": "z",'
        b' "tokens_per_s": "q", "tokens_seen": "n"}',
    ]
    records = parse_lines(lines, "tunedeck")
    assert [r["step"] for r in records] == [1, 2]
    assert records[1] == {"kind": "train", "step": 2, "loss": 1.5}
    series = RunSeries()
    series.extend(records)
    assert series.latest["step"] == 2 and series.last_loss == 1.5

    # the backfill's fast path: a "number" JSON does not have goes through json (and is skipped), not float()
    damaged = (b'{"kind": "train", "step": 3, "total_steps": 1.2.3, "epoch": 0.1, "loss": 1.0, "learning_rate": 0,'
               b' "grad_norm": 1, "tokens_per_s": 5, "samples_per_s": 1, "elapsed_s": 3, "eta_s": 1, "tokens_seen": 9}')
    assert parse_lines([damaged], "tunedeck", fast=True) == []
    series.extend_tunedeck_lines([*lines, damaged])
    assert series.latest["step"] == 2
