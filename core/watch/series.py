"""A run's metric series, built incrementally from normalised records (see ``core.watch.adapters``).

The series are those of ``core.watch.metrics.METRICS``, read by the same table on both paths: ``extend``
(normalised records) and ``extend_tunedeck_lines`` (the backfill's regex over tunedeck's own lines), so
that a metric in the table reaches the series whichever path its record takes.

Every chartable metric is kept twice in bucketed form (x = step, x = elapsed seconds), so switching the
x-axis costs nothing and a million records stay a few thousand buckets. The latest record (with the first,
for the steady tokens/s), the loss EMA and a window of recent throughput feed the header and the alerts.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from core.watch.downsample import DEFAULT_MAX_BUCKETS, BucketedSeries
from core.watch.metrics import EVAL, METRICS, SERIES, TRAIN, X_KEYS
from core.watch.resumes import resume_step, superseded

CHART_METRICS = SERIES
# Series read straight from a train record's value (the loss and its EMA are handled apart: the EMA is
# derived, and a missing or NaN loss is counted), and from an eval record's.
_DERIVED = {m.name: m.derived for m in METRICS if m.series and m.derived}
if _DERIVED != {"loss_ema": "loss"}:
    raise ValueError(f"RunSeries derives only the loss EMA, not {_DERIVED}")
TRAIN_VALUES = tuple(m.name for m in METRICS if m.series and m.kind == TRAIN and not m.derived and m.name != "loss")
EVAL_VALUES = tuple(m.name for m in METRICS if m.series and m.kind == EVAL)


def _picker(indices: list[int]) -> Callable[[tuple[bytes, ...]], tuple[bytes, ...]]:
    """groups -> a tuple of the groups at ``indices`` (itemgetter gives a bare item for one index)."""
    if len(indices) == 1:
        only = indices[0]
        return lambda groups: (groups[only],)
    return itemgetter(*indices) if indices else lambda groups: ()


# Versions are drawn from one counter for every series: a widget that drew version N of one series must
# not take a new series (a restarted or replaced history) that has also reached N for the one it drew.
_VERSIONS = itertools.count(1)

EMA_ALPHA = 0.1  # weight of the newest loss in the smoothed curve
THROUGHPUT_WINDOW = 256


class RunSeries:
    """Metric series of one run: ``extend(records)`` as they come, read buckets and latest values."""

    def __init__(self, max_buckets: int = DEFAULT_MAX_BUCKETS) -> None:
        self.by_step = {name: BucketedSeries(max_buckets) for name in CHART_METRICS}
        self.by_time = {name: BucketedSeries(max_buckets) for name in CHART_METRICS}
        self.header: dict[str, Any] = {}
        self.latest: dict[str, Any] = {}
        self.first: dict[str, Any] = {}  # the first train record: where the steady tokens/s starts
        self.latest_eval: dict[str, Any] = {}
        self.records = 0
        self.train_records = 0
        self.ema: float | None = None
        self.ema_before_last: float | None = None
        self.ema_points = 0
        self.last_loss: float | None = None
        self.last_loss_nan = False
        self.nan_count = 0
        self.recent_tokens_per_s: deque[float] = deque(maxlen=THROUGHPUT_WINDOW)
        # Moves on every change, and is never the same for two series (_VERSIONS): widgets redraw on a new one.
        self.version = next(_VERSIONS)

    def series(self, name: str, x_axis: str = "step") -> BucketedSeries:
        return (self.by_time if x_axis == "time" else self.by_step)[name]

    def extend(self, records: list[dict[str, Any]], max_step: float = math.inf) -> None:
        """Add normalised records in file order (columns are gathered first, then bucketed in bulk); train
        and eval records past ``max_step`` are left out (a later resume superseded them:
        ``core.watch.resumes``). A ``resumed`` record moves the latest figures to its step, without an ETA
        until the new attempt logs: the steps after its checkpoint are lost."""
        if max_step < math.inf:
            records = [r for r in records if not superseded(r, max_step)]
        columns: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {
            name: ([], [], [], []) for name in CHART_METRICS}  # step xs, step ys, time xs, time ys
        finite = math.isfinite
        tokens_window = self.recent_tokens_per_s
        for record in records:
            kind = record.get("kind")
            self.records += 1
            if kind == "train":
                self.train_records += 1
                self.latest = record
                if not self.first:
                    self.first = record
                step = record.get("step")
                x_step = float(step) if step is not None else float(self.train_records)
                elapsed = record.get("elapsed_s")
                x_time = float(elapsed) if elapsed is not None else None
                loss = record.get("loss")
                if (type(loss) is float or type(loss) is int) and finite(loss):
                    loss = float(loss)
                    self.last_loss = loss
                    self.last_loss_nan = False
                    self.ema_before_last = self.ema
                    self.ema = loss if self.ema is None else self.ema + EMA_ALPHA * (loss - self.ema)
                    self.ema_points += 1
                    loss_col, ema_col = columns["loss"], columns["loss_ema"]
                    loss_col[0].append(x_step)
                    loss_col[1].append(loss)
                    ema_col[0].append(x_step)
                    ema_col[1].append(self.ema)
                    if x_time is not None:
                        loss_col[2].append(x_time)
                        loss_col[3].append(loss)
                        ema_col[2].append(x_time)
                        ema_col[3].append(self.ema)
                else:
                    # tunedeck writes a NaN loss as null (JSON has no NaN); the others' adapters flag it
                    self.last_loss = None
                    self.last_loss_nan = True
                    self.nan_count += 1
                for name in TRAIN_VALUES:
                    value = record.get(name)
                    if (type(value) is float or type(value) is int) and finite(value):
                        column = columns[name]
                        column[0].append(x_step)
                        column[1].append(float(value))
                        if x_time is not None:
                            column[2].append(x_time)
                            column[3].append(float(value))
                tokens = record.get("tokens_per_s")
                if (type(tokens) is float or type(tokens) is int) and finite(tokens):
                    tokens_window.append(float(tokens))
            elif kind == "eval":
                self.latest_eval = record
                step = record.get("step")
                elapsed = record.get("elapsed_s")
                for name in EVAL_VALUES:
                    value = record.get(name)
                    if (type(value) is float or type(value) is int) and finite(value):
                        column = columns[name]
                        if step is not None:
                            column[0].append(float(step))
                            column[1].append(float(value))
                        if elapsed is not None:
                            column[2].append(float(elapsed))
                            column[3].append(float(value))
            elif kind == "header":
                self.header = record
            elif (step := resume_step(record)) is not None:
                self.latest = {**self.latest, "kind": "resumed", "step": step, "eta_s": None,
                               "total_steps": record.get("total_steps") or self.latest.get("total_steps")}
        for name, (step_xs, step_ys, time_xs, time_ys) in columns.items():
            self.by_step[name].add_many(step_xs, step_ys)
            self.by_time[name].add_many(time_xs, time_ys)
        self.version = next(_VERSIONS)

    def extend_tunedeck_lines(self, lines: list[bytes], max_step: float = math.inf) -> None:
        """Backfill from raw lines of a tunedeck ``metrics.jsonl``: train records go straight from a regex
        match into the columns (no dict per record); any other line goes through ``extend``. Train and eval
        records past ``max_step`` are left out (``extend``)."""
        from core.watch.adapters import FAST_INDEX, TUNEDECK_TRAIN, fast_train_record, parse_lines

        match = TUNEDECK_TRAIN.match
        finite = math.isfinite
        null = b"null"
        pending: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {
            name: ([], [], [], []) for name in CHART_METRICS}
        loss_col, ema_col = pending["loss"], pending["loss_ema"]
        # (column, group of the match) of every train value: the regex reads all of them (TUNEDECK_FAST_KEYS)
        fast_values = [m for m in METRICS if m.name in TRAIN_VALUES and m.tunedeck]
        other_cols = tuple(pending[m.name] for m in fast_values)
        pick = _picker([FAST_INDEX[m.tunedeck] for m in fast_values])
        i_step, i_time = FAST_INDEX[X_KEYS["step"]], FAST_INDEX[X_KEYS["time"]]
        i_loss = FAST_INDEX["loss"]
        i_tokens = FAST_INDEX["tokens_per_s"]
        tokens_window = self.recent_tokens_per_s
        ema = self.ema
        last_groups = None
        trains = 0

        def flush() -> None:
            for name, (step_xs, step_ys, time_xs, time_ys) in pending.items():
                self.by_step[name].add_many(step_xs, step_ys)
                self.by_time[name].add_many(time_xs, time_ys)
                for column in pending[name]:
                    column.clear()

        for line in lines:
            matched = match(line) if line.endswith(b"}") else None
            if matched is None:
                if line[:1] != b"{":
                    continue
                flush()
                self.ema = ema
                if last_groups is not None:  # the newest record so far, before a resumed record moves it on
                    self.latest, last_groups = fast_train_record(last_groups), None
                self.extend(parse_lines([line], "tunedeck"), max_step)
                ema = self.ema
                continue
            groups = matched.groups()
            x_step = float(groups[i_step])
            if x_step > max_step:
                continue  # superseded by a later resume
            last_groups = groups
            if not self.first:
                self.first = fast_train_record(groups)
            trains += 1
            x_time = None if groups[i_time] == null else float(groups[i_time])
            raw_loss = groups[i_loss]
            if raw_loss != null and finite(loss := float(raw_loss)):
                self.ema_before_last = ema
                ema = loss if ema is None else ema + EMA_ALPHA * (loss - ema)
                self.ema_points += 1
                self.last_loss = loss
                self.last_loss_nan = False
                loss_col[0].append(x_step)
                loss_col[1].append(loss)
                ema_col[0].append(x_step)
                ema_col[1].append(ema)
                if x_time is not None:
                    loss_col[2].append(x_time)
                    loss_col[3].append(loss)
                    ema_col[2].append(x_time)
                    ema_col[3].append(ema)
            else:
                self.last_loss = None
                self.last_loss_nan = True
                self.nan_count += 1
            for column, raw in zip(other_cols, pick(groups), strict=True):
                if raw != null:
                    value = float(raw)
                    if finite(value):
                        column[0].append(x_step)
                        column[1].append(value)
                        if x_time is not None:
                            column[2].append(x_time)
                            column[3].append(value)
            if groups[i_tokens] != null:
                tokens_window.append(float(groups[i_tokens]))
        flush()
        self.ema = ema
        self.records += trains
        self.train_records += trains
        if last_groups is not None:
            self.latest = fast_train_record(last_groups)
        self.version = next(_VERSIONS)

