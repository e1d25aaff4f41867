"""The metrics of a run, as one table: what each is called, where each trainer writes it, how it is charted.

``METRICS`` drives the readers of every trainer's records (``core.watch.adapters``), the series a
dashboard keeps (``core.watch.series``: both its paths, records and the fast regex over tunedeck's own
lines) and the dashboard's charts (``CHARTS``). A metric added here reaches all of them; a key added to
the trainer's record (``core.train.callbacks``) must be named here, as a metric or in ``NOT_CHARTED``
(tests/core/test_watch_metrics.py fails until it is).

Every series is kept by both x axes (``X_AXES``: the step and the elapsed seconds), so the dashboard's x
toggle costs nothing; ``X_KEYS`` names the record key each x comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core import units
from core.watch.figures import format_value

TRAIN = "train"
EVAL = "eval"
X_AXES = ("step", "time")
X_KEYS = {"step": "step", "time": "elapsed_s"}  # x axis -> the record key its x comes from


def _gib(value: float | None) -> str:
    return units.format_memory(None if value is None else value * 1024**3)


# unit -> formatter (``core.units``); ``value`` is the short metric format of the charts' legends
FORMATTERS: dict[str, Callable[[float | None], str]] = {
    "value": format_value, "rate": units.format_rate, "count": units.format_count, "gib": _gib,
    "duration": units.format_duration,
}


@dataclass(frozen=True)
class Metric:
    """One metric: its series name (also its key in a normalised record) and where it comes from.

    ``tunedeck`` / ``swift`` / ``llamafactory`` / ``hf_trainer`` / ``tensorboard``: the key(s) of the raw
    record of each trainer that carry it (tunedeck's ``metrics.jsonl``, ms-swift's ``logging.jsonl``,
    LLaMA-Factory's ``trainer_log.jsonl``, HF Trainer's ``log_history``, TensorBoard scalar tags), the first
    one with a value wins; empty: that trainer does not write it. tunedeck's key is the metric's name
    (its records are already normalised). ``derived``: computed from another series (the loss EMA), read
    from no record. ``series``: kept as a series (False: the latest record
    only, for the header). ``chart``: the id of the dashboard chart it is drawn in (``CHARTS``), None for
    none; ``legend`` (an i18n key, or None for a chart's only line), ``colour`` (palette slot) and
    ``mode`` ("band", "line", "points": see ``tui.widgets.chart.SeriesSpec``) say how."""

    name: str
    label: str | None  # i18n key naming the metric (None: shown nowhere by name)
    unit: str  # a key of FORMATTERS
    kind: str = TRAIN  # the records that carry it: TRAIN or EVAL
    tunedeck: str | None = None
    swift: tuple[str, ...] = ()
    llamafactory: tuple[str, ...] = ()
    hf_trainer: tuple[str, ...] = ()
    tensorboard: tuple[str, ...] = ()
    derived: str | None = None
    series: bool = True
    chart: str | None = None
    legend: str | None = None
    colour: int = 0
    mode: str = "band"

    def format(self, value: float | None) -> str:
        return FORMATTERS[self.unit](value)

    def keys(self, adapter: str) -> tuple[str, ...]:
        """The raw keys ``adapter`` ("tunedeck", "swift", "llamafactory", "hf_trainer", "tensorboard")
        writes this metric under."""
        if adapter == "tunedeck":
            return (self.tunedeck,) if self.tunedeck else ()
        return getattr(self, adapter)


METRICS: tuple[Metric, ...] = (
    Metric("loss", "dashboard.chart_loss", "value", tunedeck="loss", swift=("loss", "lm loss"),
           llamafactory=("loss",), hf_trainer=("loss",),
           tensorboard=("train/loss", "loss", "train_loss", "Loss/train", "loss/train", "lm loss", "train/lm loss"),
           chart="chart-loss", legend="dashboard.series_raw", colour=0, mode="band"),
    Metric("loss_ema", "dashboard.series_ema", "value", derived="loss",
           chart="chart-loss", legend="dashboard.series_ema", colour=1, mode="line"),
    Metric("eval_loss", "dashboard.series_eval", "value", kind=EVAL, tunedeck="eval_loss", swift=("eval_loss",),
           llamafactory=("eval_loss",), hf_trainer=("eval_loss",),
           tensorboard=("eval/loss", "eval_loss", "eval/eval_loss", "val/loss", "val_loss", "Loss/val",
                        "validation/loss"),
           chart="chart-loss", legend="dashboard.series_eval", colour=2, mode="points"),
    Metric("learning_rate", "dashboard.chart_lr", "value", tunedeck="learning_rate", swift=("learning_rate",),
           llamafactory=("lr", "learning_rate"), hf_trainer=("learning_rate",),
           tensorboard=("train/learning_rate", "learning_rate", "train/lr", "lr", "learning-rate"),
           chart="chart-lr", colour=3),
    Metric("grad_norm", "dashboard.chart_grad", "value", tunedeck="grad_norm", swift=("grad_norm",),
           llamafactory=("grad_norm",), hf_trainer=("grad_norm",),
           tensorboard=("train/grad_norm", "grad_norm", "grad-norm", "train/grad-norm"),
           chart="chart-grad", colour=5),
    Metric("tokens_per_s", "dashboard.chart_tokens", "rate", tunedeck="tokens_per_s", swift=("tokens_per_s",),
           llamafactory=("throughput",),
           tensorboard=("train/tokens_per_s", "tokens_per_s", "train/throughput", "throughput"),
           chart="chart-tokens", colour=2),
    # read into the latest record only (no series, no chart): ms-swift's and LLaMA-Factory's memory, ms-swift's
    # step rate (its s/it form is inverted in core.watch.adapters)
    Metric("memory_gib", None, "gib", swift=("memory(GiB)",), llamafactory=("vram_allocated",), series=False),
    Metric("steps_per_s", None, "rate", swift=("train_speed(iter/s)",), series=False),
)

BY_NAME: dict[str, Metric] = {metric.name: metric for metric in METRICS}
SERIES: tuple[str, ...] = tuple(m.name for m in METRICS if m.series)  # every series a RunSeries keeps


@dataclass(frozen=True)
class Chart:
    """One chart of the dashboard's metrics grid (the GPU charts, fed by the GPU monitor, are not here)."""

    id: str
    title: str  # i18n key
    y_floor: float | None = None
    clip_outliers: bool = False  # a rate: an isolated spike is left out of the y range
    axis_note: bool = False  # its title says which x axis the charts show (one chart says it for all)

    @property
    def metrics(self) -> tuple[Metric, ...]:
        return tuple(m for m in METRICS if m.chart == self.id)


CHARTS: tuple[Chart, ...] = (
    Chart("chart-loss", "dashboard.chart_loss", axis_note=True),
    Chart("chart-lr", "dashboard.chart_lr", y_floor=0.0),
    Chart("chart-grad", "dashboard.chart_grad", y_floor=0.0),
    Chart("chart-tokens", "dashboard.chart_tokens", y_floor=0.0, clip_outliers=True),
)

# The keys of the trainer's train record (core.train.callbacks, ``RunMetricsCallback.on_log``), in the
# order it writes them. The fast path (``TUNEDECK_FAST_KEYS``) reads a prefix of them by regex, so the
# order matters; tests/core/test_watch_metrics.py holds the trainer to it.
TUNEDECK_TRAIN_LAYOUT: tuple[str, ...] = (
    "kind", "step", "total_steps", "epoch", "loss", "learning_rate", "grad_norm", "tokens_per_s",
    "samples_per_s", "elapsed_s", "eta_s", "tokens_seen", "peak_allocated_gib", "peak_reserved_gib", "time",
)
TUNEDECK_EVAL_LAYOUT: tuple[str, ...] = ("kind", "step", "epoch", "eval_loss", "elapsed_s")

# Keys the trainer writes that no chart draws, each with why (a new key must be a metric or land here).
NOT_CHARTED: dict[str, str] = {
    "kind": "the record's kind",
    "step": "x axis (X_KEYS)",
    "elapsed_s": "x axis (X_KEYS)",
    "total_steps": "progress, in the header",
    "epoch": "progress, in the header",
    "eta_s": "progress, in the header",
    "samples_per_s": "tokens/s says the same for the chart",
    "tokens_seen": "a running total; tokens/s is its chart",
    "peak_allocated_gib": "one value per rank (a list); the GPU memory chart reads the GPU monitor",
    "peak_reserved_gib": "one value per rank (a list); the GPU memory chart reads the GPU monitor",
    "time": "wall clock of the record",
}

# Header keys of the latest train record that the dashboard shows besides the charted ones (the running
# total of tokens is what its steady tokens/s is taken from: core.watch.figures.steady_tokens_per_s).
LATEST_KEYS: tuple[str, ...] = ("total_steps", "epoch", "eta_s", "tokens_seen")
INT_KEYS = frozenset({"step", "total_steps", "tokens_seen"})


def _fast_keys() -> tuple[str, ...]:
    """The leading keys of the trainer's train record the fast path reads: through the last one that a
    metric, an x axis or the header needs (every later key is one no reader of the backfill needs)."""
    wanted = {m.tunedeck for m in METRICS if m.kind == TRAIN and m.tunedeck}
    wanted |= set(X_KEYS.values()) | set(LATEST_KEYS)
    missing = wanted - set(TUNEDECK_TRAIN_LAYOUT)
    if missing:
        raise ValueError(f"not in TUNEDECK_TRAIN_LAYOUT (the trainer's record): {sorted(missing)}")
    last = max(TUNEDECK_TRAIN_LAYOUT.index(key) for key in wanted)
    return TUNEDECK_TRAIN_LAYOUT[1:last + 1]


TUNEDECK_FAST_KEYS: tuple[str, ...] = _fast_keys()  # "kind" is matched as a literal
