"""Which records of a tunedeck ``metrics.jsonl`` a resume superseded.

The file is append-only: a run resumed from checkpoint-1500 after a crash at step 1657 logs steps 1501-1657
again after its ``{"kind": "resumed", "step": 1500}`` record, and the first attempt's records of those steps
stay in the file (its ``elapsed_s`` goes back too). Readers take each step once, the latest attempt's: a
train or eval record whose step is past the step of a later ``resumed`` record is dropped. The same rule
holds when the new attempt has logged nothing yet: the steps after its checkpoint are lost, whatever the
dead attempt said of them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

RESUMED = "resumed"
_NEEDLE = b'"resumed"'
_SUPERSEDED_KINDS = ("train", "eval")


def resume_step(record: dict[str, Any]) -> int | None:
    """The checkpoint step of a ``resumed`` record, None for any other record."""
    step = record.get("step")
    if record.get("kind") != RESUMED or not isinstance(step, int) or isinstance(step, bool):
        return None
    return step


def pending_resume(resumes: Any, newest: dict[str, Any] | None) -> dict[str, Any] | None:
    """A tunedeck run's newest resume as ``run.json`` records it (``resumes``: its list) when its trainer has
    logged nothing since (``newest``: the newest train or ``resumed`` record of ``metrics.jsonl``, None if
    none), else None. Asked for, it has already given up the steps the last attempt logged after its checkpoint,
    though the metrics file says nothing of it until the new trainer has loaded (or ever, where that attempt
    stopped or failed while loading): readers take it as a ``resumed`` record at the file's end."""
    asked = resumes[-1] if isinstance(resumes, list) and resumes else None
    if not isinstance(asked, dict) or not asked.get("time") or \
            not isinstance(asked.get("step"), int) or isinstance(asked["step"], bool):
        return None
    if newest is not None and str(newest.get("time") or "~") > str(asked["time"]):
        return None
    return asked


def superseded(record: dict[str, Any], cutoff: float) -> bool:
    """A train or eval record past ``cutoff`` (the lowest step of the resumes after it)."""
    step = record.get("step")
    return (record.get("kind") in _SUPERSEDED_KINDS and isinstance(step, (int, float))
            and not isinstance(step, bool) and step > cutoff)


def drop_superseded(records: list[dict[str, Any]], cutoff: float = math.inf) -> list[dict[str, Any]]:
    """``records`` (file order) without those a later resume superseded; ``cutoff``: the lowest step of the
    resumes that come after all of them (records further on in the file)."""
    kept: list[dict[str, Any]] = []
    for record in reversed(records):
        step = resume_step(record)
        if step is not None:
            cutoff = min(cutoff, step)
        elif superseded(record, cutoff):
            continue
        kept.append(record)
    kept.reverse()
    return kept


def lowest_resume(records: Iterable[dict[str, Any]]) -> float:
    """The lowest checkpoint step of the ``resumed`` records among ``records`` (infinity if none)."""
    return min((s for s in map(resume_step, records) if s is not None), default=math.inf)


def resume_points(path: Path | str, end: int, block: int = 4 * 1024 * 1024) -> list[tuple[int, int]]:
    """(byte offset of the line, checkpoint step) of every ``resumed`` record in ``path``'s first ``end``
    bytes. A byte search, not a parse per line: a backfill of a million records pays a scan of the bytes."""
    points: list[tuple[int, int]] = []
    with open(path, "rb") as handle:
        position = 0
        rest = b""
        while position < end:
            chunk = handle.read(min(block, end - position))
            if not chunk:
                break
            base = position - len(rest)
            position += len(chunk)
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            data, rest = data[:cut], data[cut:]
            found = data.find(_NEEDLE)
            while found >= 0:
                start = data.rfind(b"\n", 0, found) + 1
                stop = data.find(b"\n", found)
                try:
                    record = json.loads(data[start:stop])
                except ValueError:
                    record = None
                step = resume_step(record) if isinstance(record, dict) else None
                if step is not None:
                    points.append((base + start, step))
                found = data.find(_NEEDLE, stop)
    return points


def segments(start: int, end: int, points: list[tuple[int, int]], after: float) -> Iterator[tuple[int, int, float]]:
    """[start, end) cut at the resume points: (from, to, cutoff) where ``cutoff`` is the lowest step of the
    resumes at or after ``to`` (those at ``points`` and ``after``, the lowest of the resumes past ``end``)."""
    cuts = [offset for offset, _ in points if start < offset < end]
    bounds = [start, *cuts, end]
    for i in range(len(bounds) - 1):
        to = bounds[i + 1]
        cutoff = min([after, *(step for offset, step in points if offset >= to)])
        yield bounds[i], to, cutoff
