"""Metric records of other trainers, normalised to tunedeck's ``metrics.jsonl`` keys.

Normalised record keys (any may be missing): ``kind`` ("train" | "eval" | "header" | "resumed"), ``step``,
``total_steps``, ``epoch``, ``elapsed_s``, ``eta_s``, and the metrics of ``core.watch.metrics.METRICS``
(``loss``, ``eval_loss``, ``learning_rate``, ``grad_norm``, ``tokens_per_s``, ``memory_gib``…), read by
the keys that table gives each trainer.

* ms-swift writes ``logging.jsonl`` in its output dir (``output/vN-YYYYMMDD-HHMMSS/``): the trainer's log
  dict plus ``global_step/max_steps`` ("10/100"), ``percentage`` ("10.00%"), ``elapsed_time`` /
  ``remaining_time`` ("1m 2s", "1h 5m"), ``memory(GiB)``, ``train_speed(iter/s)``; eval lines carry
  ``eval_loss``; the last line is the run summary (``train_runtime``, ``train_loss``).
* LLaMA-Factory writes ``trainer_log.jsonl``: ``current_steps``, ``total_steps``, ``loss``, ``lr``,
  ``epoch``, ``percentage``, ``elapsed_time`` / ``remaining_time`` (``str(timedelta)``: "0:01:02",
  "1 day, 2:03:04"), optional ``throughput`` (tokens/s since start) and ``vram_allocated``; eval lines
  carry ``eval_loss``; evaluation-progress lines carry only the step counters (skipped). LLaMA-Factory
  ≤ 0.7 wrote every key on every line, unset ones as null (``"eval_loss": null`` on train lines,
  ``"loss": null`` on eval lines) and the rate as ``learning_rate``.
* ms-swift ≤ 2.2.1 (and 2.x with ``disable_tqdm``) wrote only ``global_step`` (a number), 2.2.2
  ``steps[global_step/max_steps]``, neither with times.
* Megatron-SWIFT writes the same ``logging.jsonl`` with ``iteration`` ("5/176") in place of
  ``global_step/max_steps`` and ``train_speed(s/it)``.
* HF Trainer keeps ``log_history`` in ``trainer_state.json``: entries with ``step``, ``epoch``, ``loss``,
  ``learning_rate``, ``grad_norm``; eval entries with ``eval_loss``; the last one the run summary.

A line that says the writer is done (ms-swift's summary and its final ``last_model_checkpoint`` line, the
HF summary entry) becomes ``{"kind": "end"}``: nothing is charted from it, ``core.watch.activity`` reads it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from core.watch.metrics import (
    BY_NAME,
    EVAL,
    INT_KEYS,
    LATEST_KEYS,
    METRICS,
    TRAIN,
    TUNEDECK_FAST_KEYS,
    X_KEYS,
    Metric,
)

Record = dict[str, Any]

_UNIT_SECONDS = {"d": 86400.0, "day": 86400.0, "days": 86400.0, "h": 3600.0, "m": 60.0, "min": 60.0,
                 "s": 1.0, "sec": 1.0}
_UNIT_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(days?|d|h|min|m|sec|s)\b")


def parse_duration(value: Any) -> float | None:
    """Seconds from "1:02:03", "1 day, 2:03:04", "1h 2m 3s", "1d 2h", "12s", or a number; else None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    text = str(value).strip().lower()
    if not text:
        return None
    days = 0.0
    day_match = re.match(r"^(\d+)\s*days?,\s*(.*)$", text)
    if day_match:
        days = float(day_match.group(1)) * 86400.0
        text = day_match.group(2)
    if ":" in text:
        parts = text.split(":")
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            return None
        seconds = 0.0
        for number in numbers:
            seconds = seconds * 60.0 + number
        return days + seconds
    parts = _UNIT_PART.findall(text)
    if parts:
        return days + sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    number = to_float(text)
    return None if number is None else days + number


def to_float(value: Any) -> float | None:
    """A finite float from a number or a numeric string ("0.5", "83.3%"); None otherwise (NaN too)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        value = value.strip().rstrip("%")
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _is_nan_text(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value) or isinstance(value, str) and value.strip().lower() == "nan"


def _to_int(value: Any) -> int | None:
    number = to_float(value)
    return None if number is None else int(number)


def _put(record: Record, key: str, value: Any) -> None:
    if value is not None:
        record[key] = value


# The keys of tunedeck's train and eval records that the charts and the header take as numbers.
_TUNEDECK_NUMBERS = frozenset({m.tunedeck for m in METRICS if m.tunedeck} | set(X_KEYS.values()) | set(LATEST_KEYS))


def _is_number(value: Any) -> bool:
    return type(value) is int or type(value) is float


def normalize_tunedeck(raw: Record) -> Record | None:
    """tunedeck's own records are already normalised; unknown kinds are kept as they are. A train or eval
    record whose step is not a number is broken (None: skipped, as a line that does not parse is); another
    of its figures that is not a number (a hand edit, a damaged disk) is left out, never charted."""
    if raw.get("kind") not in (TRAIN, EVAL):
        return raw
    step = raw.get("step")
    if step is not None and not _is_number(step):
        return None
    bad = [key for key in _TUNEDECK_NUMBERS if raw.get(key) is not None and not _is_number(raw[key])]
    if not bad:
        return raw
    return {key: value for key, value in raw.items() if key not in bad}


def normalize_swift(raw: Record) -> Record | None:
    """One ``logging.jsonl`` record of ms-swift, or None for the summary line and unknown lines."""
    if "train_runtime" in raw or "train_loss" in raw or "last_model_checkpoint" in raw:
        return {"kind": "end"}  # the end-of-training summary (its loss is a run average) or the final state line
    step, total = _swift_step(raw)
    out = _metrics_record(raw, "swift")
    if out is None:
        return None
    if out["kind"] == "train" and "steps_per_s" not in out:
        seconds_per_step = to_float(raw.get("train_speed(s/it)"))  # Megatron-SWIFT
        if seconds_per_step:
            out["steps_per_s"] = 1.0 / seconds_per_step
    return _progress(out, raw, step, total)


_SWIFT_PROGRESS = ("global_step/max_steps", "iteration", "steps[global_step/max_steps]", "global_step")


def _swift_step(raw: Record) -> tuple[int | None, int | None]:
    """(step, total steps) of an ms-swift line. ms-swift ≥ 2.3: "global_step/max_steps"; Megatron-SWIFT:
    "iteration"; 2.2.2: "steps[global_step/max_steps]" (all "step/total" strings); ms-swift ≤ 2.2.1, and 2.x's
    printer callback (disable_tqdm), a bare "global_step" number."""
    progress = _first(raw, _SWIFT_PROGRESS)
    if isinstance(progress, str) and "/" in progress:
        left, _, right = progress.partition("/")
        return _to_int(left), _to_int(right)
    return (_to_int(progress) if progress is not None else None), None


def _first(raw: Record, keys: tuple[str, ...]) -> Any:
    """The value of the first of ``keys`` that ``raw`` has a value (not null) for; None if none."""
    for key in keys:
        value = raw.get(key)
        if value is not None:
            return value
    return None


_LOSS, _EVAL_LOSS = BY_NAME["loss"], BY_NAME["eval_loss"]


def _metrics_record(raw: Record, adapter: str) -> Record | None:
    """The eval or train record of a line of a trainer built on transformers' logging, its metrics read
    through ``core.watch.metrics.METRICS`` by ``adapter``'s keys; None for a line with neither loss."""
    # A key that is present but null is unset (LLaMA-Factory ≤ 0.7 writes every key on every line):
    # only a value makes a line an eval or a train line. NaN is a value (a diverged loss).
    out: Record = {}
    kind = _line_kind(raw, adapter)
    if kind is None:
        return None
    out["kind"] = kind
    if kind == TRAIN:
        raw_loss = _first(raw, _LOSS.keys(adapter))
        loss = to_float(raw_loss)
        out["loss"] = loss
        if loss is None and _is_nan_text(raw_loss):
            out["loss_nan"] = True
    for metric in _READ[adapter][out["kind"]]:
        _put(out, metric.name, to_float(_first(raw, metric.keys(adapter))))
    return out


def _line_kind(raw: Record, adapter: str) -> str | None:
    """EVAL for a line with an eval loss, else TRAIN for one with a loss, else None (``_metrics_record``)."""
    if _first(raw, _EVAL_LOSS.keys(adapter)) is not None:
        return EVAL
    return TRAIN if _first(raw, _LOSS.keys(adapter)) is not None else None


def progress_of(raw: Record, kind: str) -> tuple[str, int | None, Any] | None:
    """(kind, step, the elapsed time as logged, not parsed) of an ms-swift (``kind`` "swift") or LLaMA-Factory
    line's train or eval record: what its normaliser makes of those, without reading its metrics; None where
    it makes no train or eval record. For a pass that only places restarts (``core.watch.feed.MetricsFeed
    .place_tail``): the metrics and the remaining time of every line before the tail took most of its time."""
    if kind == "swift":
        if "train_runtime" in raw or "train_loss" in raw or "last_model_checkpoint" in raw:
            return None  # {"kind": "end"}
        line_kind = _line_kind(raw, "swift")
        step = _swift_step(raw)[0] if line_kind is not None else None
    else:
        line_kind = _line_kind(raw, "llamafactory")
        step = _to_int(raw.get("current_steps")) if line_kind is not None else None
    return None if line_kind is None else (line_kind, step, raw.get("elapsed_time"))


# adapter -> kind -> the metrics read from its records (the loss is read above: it decides the kind)
_READ: dict[str, dict[str, tuple[Metric, ...]]] = {
    adapter: {kind: tuple(m for m in METRICS if m.kind == kind and m.keys(adapter) and m is not _LOSS)
              for kind in (TRAIN, EVAL)}
    for adapter in ("swift", "llamafactory", "hf_trainer")
}


def _progress(out: Record, raw: Record, step: int | None, total: int | None) -> Record:
    _put(out, "step", step)
    _put(out, "total_steps", total)
    _put(out, "epoch", to_float(raw.get("epoch")))
    _put(out, "elapsed_s", parse_duration(raw.get("elapsed_time")))
    _put(out, "eta_s", parse_duration(raw.get("remaining_time")))
    return out


def normalize_llamafactory(raw: Record) -> Record | None:
    """One ``trainer_log.jsonl`` record of LLaMA-Factory, or None for evaluation-progress lines."""
    out = _metrics_record(raw, "llamafactory")
    if out is None:
        return None
    return _progress(out, raw, _to_int(raw.get("current_steps")), _to_int(raw.get("total_steps")))


def normalize_hf_trainer(raw: Record) -> Record | None:
    """One ``log_history`` entry of HF Trainer's ``trainer_state.json`` (``total_steps`` comes from the
    state's ``max_steps``: the caller adds it)."""
    if "train_runtime" in raw or "train_loss" in raw:
        return {"kind": "end"}
    out = _metrics_record(raw, "hf_trainer")
    if out is None:
        return None
    _put(out, "step", _to_int(raw.get("step")))
    _put(out, "epoch", to_float(raw.get("epoch")))
    return out


NORMALIZERS: dict[str, Callable[[Record], Record | None]] = {
    "tunedeck": normalize_tunedeck,
    "swift": normalize_swift,
    "llamafactory": normalize_llamafactory,
    "hf_trainer": normalize_hf_trainer,
}


_NUMBER = rb"(-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|null)"  # JSON's number: "1.2.3" is no match
# tunedeck's train records always begin with the same keys in the same order (core.train.callbacks writes
# them so: ``TUNEDECK_TRAIN_LAYOUT``): a regex match of that prefix, through every key a series, an x axis
# or the header reads (``TUNEDECK_FAST_KEYS``, derived from ``METRICS``), is several times cheaper than
# json.loads of the whole line, which matters when a dashboard backfills a million lines. Any line that
# does not match goes through json.
TUNEDECK_TRAIN = re.compile(
    rb'\{"kind": "train"'
    + b"".join(b', "' + key.encode() + b'": ' + (rb"(-?[0-9]+)" if key == "step" else _NUMBER)
               for key in TUNEDECK_FAST_KEYS)
    + rb"[,}]"
)
FAST_INDEX = {key: i for i, key in enumerate(TUNEDECK_FAST_KEYS)}  # record key -> its group in a match


def _fast_value(key: str, raw: bytes) -> int | float | None:
    if raw == b"null":
        return None
    if key in INT_KEYS and raw.lstrip(b"-").isdigit():
        return int(raw)
    return float(raw)


def fast_train_record(groups: tuple[bytes, ...]) -> Record:
    """The keys ``TUNEDECK_FAST_KEYS`` of a train record from a ``TUNEDECK_TRAIN`` match's groups."""
    record: Record = {"kind": "train"}
    for key, raw in zip(TUNEDECK_FAST_KEYS, groups, strict=True):
        record[key] = _fast_value(key, raw)
    return record


def parse_lines(lines: Iterable[bytes], kind: str = "tunedeck", fast: bool = False) -> list[Record]:
    """Normalised records from raw JSON lines; blank, broken and non-object lines are skipped.

    ``fast`` (backfills of tunedeck's own files): train records keep only the charted keys, read by a
    regex instead of json.loads; other lines still go through json."""
    normalize = NORMALIZERS[kind]
    loads = json.loads
    fast_match = TUNEDECK_TRAIN.match if fast and kind == "tunedeck" else None
    out: list[Record] = []
    append = out.append
    for line in lines:
        if not line or line[:1] != b"{":
            continue
        if fast_match is not None:
            matched = fast_match(line)
            if matched is not None and line.endswith(b"}"):
                append(fast_train_record(matched.groups()))
                continue
        try:
            raw = loads(line)
        except ValueError:
            continue
        if type(raw) is not dict:
            continue
        record = normalize(raw)
        if record is not None:
            append(record)
    return out
