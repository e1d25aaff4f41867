"""A run's metric series, built incrementally from normalised records (see ``core.watch.adapters``).

Every chartable metric is kept twice in bucketed form (x = step, x = elapsed seconds), so switching the
x-axis costs nothing and a million records stay a few thousand buckets. The latest record, the loss EMA
and a window of recent throughput feed the header and the alert rules.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from core.watch.downsample import DEFAULT_MAX_BUCKETS, BucketedSeries

CHART_METRICS = ("loss", "loss_ema", "eval_loss", "learning_rate", "grad_norm", "tokens_per_s")
EMA_ALPHA = 0.1  # weight of the newest loss in the smoothed curve
THROUGHPUT_WINDOW = 256


class RunSeries:
    """Metric series of one run: ``extend(records)`` as they come, read buckets and latest values."""

    def __init__(self, max_buckets: int = DEFAULT_MAX_BUCKETS) -> None:
        self.by_step = {name: BucketedSeries(max_buckets) for name in CHART_METRICS}
        self.by_time = {name: BucketedSeries(max_buckets) for name in CHART_METRICS}
        self.header: dict[str, Any] = {}
        self.latest: dict[str, Any] = {}
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
        self.version = 0  # bumped on every change; widgets redraw when it moves

    def series(self, name: str, x_axis: str = "step") -> BucketedSeries:
        return (self.by_time if x_axis == "time" else self.by_step)[name]

    def extend(self, records: list[dict[str, Any]]) -> None:
        """Add normalised records in file order (columns are gathered first, then bucketed in bulk)."""
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
                for name in ("learning_rate", "grad_norm", "tokens_per_s"):
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
                value = record.get("eval_loss")
                if (type(value) is float or type(value) is int) and finite(value):
                    step = record.get("step")
                    elapsed = record.get("elapsed_s")
                    column = columns["eval_loss"]
                    if step is not None:
                        column[0].append(float(step))
                        column[1].append(float(value))
                    if elapsed is not None:
                        column[2].append(float(elapsed))
                        column[3].append(float(value))
            elif kind == "header":
                self.header = record
        for name, (step_xs, step_ys, time_xs, time_ys) in columns.items():
            self.by_step[name].add_many(step_xs, step_ys)
            self.by_time[name].add_many(time_xs, time_ys)
        self.version += 1

    def extend_tunedeck_lines(self, lines: list[bytes]) -> None:
        """Backfill from raw lines of a tunedeck ``metrics.jsonl``: train records go straight from a regex
        match into the columns (no dict per record); any other line goes through ``extend``."""
        from core.watch.adapters import TUNEDECK_TRAIN, parse_lines

        match = TUNEDECK_TRAIN.match
        finite = math.isfinite
        null = b"null"
        pending: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {
            name: ([], [], [], []) for name in CHART_METRICS}
        loss_col, ema_col = pending["loss"], pending["loss_ema"]
        other_cols = (pending["learning_rate"], pending["grad_norm"], pending["tokens_per_s"])
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
                before = self.latest
                self.extend(parse_lines([line], "tunedeck"))
                ema = self.ema
                if self.latest is not before:
                    last_groups = None  # the newest train record came through json
                continue
            groups = matched.groups()
            last_groups = groups
            trains += 1
            x_step = float(groups[0])
            x_time = None if groups[8] == null else float(groups[8])
            raw_loss = groups[3]
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
            for column, raw in zip(other_cols, (groups[4], groups[5], groups[6]), strict=True):
                if raw != null:
                    value = float(raw)
                    if finite(value):
                        column[0].append(x_step)
                        column[1].append(value)
                        if x_time is not None:
                            column[2].append(x_time)
                            column[3].append(value)
            if groups[6] != null:
                tokens_window.append(float(groups[6]))
        flush()
        self.ema = ema
        self.records += trains
        self.train_records += trains
        if last_groups is not None:
            from core.watch.adapters import fast_train_record

            self.latest = fast_train_record(last_groups)
        self.version += 1

