"""Which tunedeck run a GPU process belongs to, from the runs' own records, not from NVML.

The supervisor of a run records its trainer's pid and start time in ``run.json`` (``trainer``: the
training process itself, or the torchrun/deepspeed launcher whose workers hold the GPUs). A GPU process
is that run's when its (pid, start time) is the trainer's, or when the trainer or the run's supervisor
is among its ancestors here. A pid alone never links: the number may have been reused since.

``RunLinker`` keeps the records it read and re-reads a ``run.json`` only when it changed, so a poll
each second costs a directory listing and a few ``stat`` calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.hardware.snapshot import GpuProcess
from core.paths import runs_dir

# As the runs' liveness check allows (core.runs.liveness.same_process_alive): a start time recorded by
# the supervisor and one read now are the same process within this.
START_TIME_MATCH_S = 0.5
TRAINER = "trainer"  # the process the supervisor started
WORKER = "worker"  # a descendant of it (a torchrun rank)
ANCESTOR_DEPTH = 8


@dataclass(frozen=True)
class RunLink:
    """A GPU process's run: its id (the run directory's name), directory and the process's role."""

    run_id: str
    run_dir: str
    role: str  # TRAINER or WORKER


@dataclass(frozen=True)
class _Recorded:
    pid: int
    start_time: float
    run_id: str
    run_dir: str
    is_trainer: bool


def _recorded_processes(path: Path, record: dict[str, Any]) -> list[_Recorded]:
    out = []
    for key, is_trainer in (("trainer", True), ("supervisor", False)):
        entry = record.get(key)
        if not isinstance(entry, dict):
            continue
        pid, start = entry.get("pid"), entry.get("start_time")
        if isinstance(pid, int) and isinstance(start, (int, float)) and not isinstance(start, bool):
            out.append(_Recorded(pid, float(start), path.name, str(path), is_trainer))
    return out


class RunLinker:
    """Links GPU processes to the runs under ``root()`` (default: the runs directory)."""

    def __init__(self, root: Callable[[], Path] = runs_dir) -> None:
        self._root = root
        self._records: dict[Path, tuple[int, list[_Recorded]]] = {}  # run.json -> (mtime_ns, processes)

    def _known(self) -> list[_Recorded]:
        root = self._root()
        try:
            children = [p for p in root.iterdir() if p.is_dir()]
        except OSError:
            self._records.clear()
            return []
        seen: dict[Path, tuple[int, list[_Recorded]]] = {}
        for path in children:
            record_path = path / "run.json"
            try:
                mtime = record_path.stat().st_mtime_ns
            except OSError:
                continue
            cached = self._records.get(record_path)
            if cached is None or cached[0] != mtime:
                try:
                    record = json.loads(record_path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                cached = (mtime, _recorded_processes(path, record) if isinstance(record, dict) else [])
            seen[record_path] = cached
        self._records = seen
        return [entry for _mtime, entries in seen.values() for entry in entries]

    def link(self, processes: Iterable[GpuProcess]) -> dict[int, RunLink]:
        """pid -> its run, for the visible processes that belong to one. Reads /proc: call it from a worker."""
        candidates = [p for p in processes if p.visible and p.started_at is not None]
        if not candidates:
            return {}
        known = self._known()
        if not known:
            return {}
        links: dict[int, RunLink] = {}
        for process in candidates:
            assert process.started_at is not None
            direct = _match(known, process.pid, process.started_at, trainers_only=True)
            if direct is not None:
                links[process.pid] = RunLink(direct.run_id, direct.run_dir, TRAINER)
                continue
            for pid, start in _ancestors(process.pid, process.started_at):
                parent = _match(known, pid, start, trainers_only=False)
                if parent is not None:
                    links[process.pid] = RunLink(parent.run_id, parent.run_dir, WORKER)
                    break
        return links


def _match(known: list[_Recorded], pid: int, start: float, trainers_only: bool) -> _Recorded | None:
    for entry in known:
        if entry.pid == pid and (entry.is_trainer or not trainers_only) \
                and abs(entry.start_time - start) < START_TIME_MATCH_S:
            return entry
    return None


def _ancestors(pid: int, started_at: float) -> list[tuple[int, float]]:
    """(pid, start time) of the process's parents here, nearest first; none when ``pid`` now names a
    process other than the one that started at ``started_at`` (a replayed recording, a reused pid)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started_at) >= START_TIME_MATCH_S:
            return []
        out = []
        for parent in proc.parents()[:ANCESTOR_DEPTH]:
            try:
                out.append((parent.pid, parent.create_time()))
            except psutil.Error:
                break
        return out
    except (psutil.Error, ValueError):
        return []


__all__ = ["TRAINER", "WORKER", "RunLink", "RunLinker"]
