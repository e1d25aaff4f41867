"""Following a TensorBoard log dir (``events.out.tfevents.*``) through tensorboard's EventAccumulator.

The reader is tensorboard's own (``tensorboard.backend.event_processing.event_accumulator``), imported
when a feed is made, in the dashboard's file worker: never on the way to the first frame. Its ``Reload``
reads only what was appended since the last call. Scalars written by torch's SummaryWriter (HF Trainer's
TensorBoardCallback, LLaMA-Factory, ms-swift) are ``simple_value`` scalars; TF2 writers store them as
tensors of the scalars plugin: both are read. Tags are mapped onto tunedeck's record keys below; a step
becomes a train record when it has a loss and an eval record when it has an eval loss. HF's end-of-run
summary tags (``train/train_runtime``…) mark the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.watch.activity import WriterActivity
from core.watch.metrics import BY_NAME, METRICS, TRAIN

# record key -> tags that carry it, first found wins (HF/TRL "train/…", plain names, Megatron's spaced ones):
# the train metrics' ``tensorboard`` tags of core.watch.metrics.METRICS, and the epoch
TRAIN_TAGS: dict[str, tuple[str, ...]] = {
    **{m.name: m.tensorboard for m in METRICS if m.kind == TRAIN and m.tensorboard},
    "epoch": ("train/epoch", "epoch"),
}
EVAL_TAGS = BY_NAME["eval_loss"].tensorboard
END_TAGS = ("train/train_runtime", "train/train_loss", "train_runtime")
_KNOWN = frozenset(tag for tags in (*TRAIN_TAGS.values(), EVAL_TAGS, END_TAGS) for tag in tags)


class TensorBoardFeed:
    """The same interface as ``core.watch.feed.MetricsFeed``: ``read_tail``, ``backfill``, ``poll``."""

    def __init__(self, folder: Path) -> None:
        from tensorboard.backend.event_processing import event_accumulator as ea

        self.folder = Path(folder)
        self.activity = WriterActivity()
        self._ea = ea
        self._accumulator = self._new_accumulator()
        self._seen: dict[str, int] = {}
        self._pending: dict[int, dict[str, float]] = {}  # train values of steps whose loss is not in yet
        self._emitted_step: int | None = None
        self._start_wall: float | None = None
        self._ended = False
        self._files: tuple | None = None

    def _new_accumulator(self) -> Any:
        ea = self._ea
        keep_all = {ea.SCALARS: 0, ea.TENSORS: 0, ea.IMAGES: 1, ea.AUDIO: 1, ea.HISTOGRAMS: 1,
                    ea.COMPRESSED_HISTOGRAMS: 1}
        return ea.EventAccumulator(str(self.folder), size_guidance=keep_all)

    def read_tail(self) -> list[dict[str, Any]]:
        return self._read()[0]

    def backfill(self) -> None:
        return None  # read_tail read everything: the accumulator keeps no byte offsets to split on

    def poll(self) -> tuple[list[dict[str, Any]], bool]:
        return self._read()

    def _events(self, since: dict[str, int]) -> tuple[dict[str, int], dict[str, list[tuple[int, float, float]]]]:
        """(tag -> how many events so far, tag -> the (step, wall_time, value) after ``since[tag]``) of the
        tags we chart, from scalars and scalar-plugin tensors; only the new ones are converted."""
        accumulator = self._accumulator
        tags = accumulator.Tags()
        counts: dict[str, int] = {}
        new: dict[str, list[tuple[int, float, float]]] = {}
        for tag in tags.get("scalars", []):
            if tag in _KNOWN:
                items = accumulator.Scalars(tag)
                counts[tag] = len(items)
                new[tag] = [(e.step, e.wall_time, e.value) for e in items[since.get(tag, 0):]]
        tensor_tags = [tag for tag in tags.get("tensors", []) if tag in _KNOWN and tag not in counts]
        if tensor_tags:
            from tensorboard.util import tensor_util

            for tag in tensor_tags:
                if accumulator.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
                    continue
                items = accumulator.Tensors(tag)
                counts[tag] = len(items)
                values = []
                for e in items[since.get(tag, 0):]:
                    array = tensor_util.make_ndarray(e.tensor_proto)
                    if array.size == 1:
                        values.append((e.step, e.wall_time, float(array.reshape(-1)[0])))
                new[tag] = values
        return counts, new

    def _signature(self) -> tuple:
        try:
            return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                                for p in self.folder.glob("events.out.tfevents.*")))
        except OSError:
            return ()

    def _read(self) -> tuple[list[dict[str, Any]], bool]:
        signature = self._signature()
        if signature == self._files:
            return [], False  # nothing written since the last read: no Reload, no work
        try:
            self._accumulator.Reload()
        except (OSError, RuntimeError, ValueError):
            return [], False  # a file caught being created or removed: the next poll tries again
        self._files = signature
        counts, new = self._events(self._seen)
        restarted = any(counts.get(tag, 0) < seen for tag, seen in self._seen.items())
        if restarted:  # the accumulator purged events of a restarted run (a step went back)
            self._seen, self._pending, self._emitted_step, self._start_wall = {}, {}, None, None
            self._ended = False
            self.activity.reset()
            counts, new = self._events({})
        self._seen = counts
        walls = [wall for values in new.values() for _step, wall, _v in values]
        if walls and self._start_wall is None:
            self._start_wall = min(walls)
        records = self._records(counts, new)
        self.activity.observe(records)
        return records, restarted

    def _records(self, events: dict[str, int], new: dict[str, list]) -> list[dict[str, Any]]:
        start = self._start_wall or 0.0
        walls: dict[int, float] = {}
        for key, tags in TRAIN_TAGS.items():
            tag = next((t for t in tags if t in events), None)
            for step, wall, value in new.get(tag, ()) if tag else ():
                self._pending.setdefault(step, {})[key] = value
                if key == "loss":
                    walls[step] = wall
        eval_tag = next((t for t in EVAL_TAGS if t in events), None)
        evals = {step: (wall, value) for step, wall, value in new.get(eval_tag, ())} if eval_tag else {}
        records: list[dict[str, Any]] = []
        for step in sorted(set(self._pending) | set(evals)):
            values = self._pending.get(step)
            if values is not None and "loss" in values:
                del self._pending[step]
                record: dict[str, Any] = {"kind": "train", "step": step, **values}
                if step in walls:
                    record["elapsed_s"] = walls[step] - start
                records.append(record)
                self._emitted_step = step if self._emitted_step is None else max(self._emitted_step, step)
            if step in evals:
                wall, value = evals[step]
                records.append({"kind": "eval", "step": step, "eval_loss": value, "elapsed_s": wall - start})
        if self._emitted_step is not None:  # values of steps that will never get a loss: drop them
            for step in [s for s in self._pending if s < self._emitted_step]:
                del self._pending[step]
        if not self._ended and any(tag in events for tag in END_TAGS):
            self._ended = True
            records.append({"kind": "end"})
        return records
