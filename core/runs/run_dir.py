"""One run's directory: the files a run leaves behind and the cheap reads the CLI and dashboard use.

Layout of ``runs_dir()/<id>/`` (directory 0700, every file 0600)::

    config.yaml       the resolved run configuration (what the trainer really used)
    run.json          id, created, command, argv, GPUs, host, version, pids, attempts, killing (a forced stop at work)
    status.json       {"status", "reason", "reason_message", "updated", "updated_ts"}, replaced atomically
    lock              flock'ed exclusively by the supervisor for its whole life
    metrics.jsonl     header record, then one record per logging step / evaluation / resume; append-only,
                      so after a resume the steps past its checkpoint appear again: readers take each
                      step once, the latest attempt's (core.watch.resumes)
    events.jsonl      checkpoint saved, OOM, NaN loss, stop requested, resumed, finished, failed …
    train.log         human log of every rank, each line prefixed "[rank N]" (or "[supervisor]")
    supervisor.log    the supervisor's own stdout/stderr (tracebacks if it dies)
    outcome.json      the trainer's verdict for the last attempt (read by the supervisor)
    checkpoints/      checkpoint-N/ with a COMPLETE marker; checkpoint-N.tmp/ while being written
    deepspeed.json    generated when ZeRO is on
    heartbeat-rankN.json  rewritten every few seconds by each trainer process (core.runs.heartbeat)
    .reserve          1 MiB kept free for the last records: deleted when the disk fills up (disk_space)
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Collection, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from core.atomic_file import write_atomic, write_json_atomic
from core.i18n import Message, render_stored, stored_reason
from core.runs.checkpoints import Checkpoint, list_checkpoints
from core.runs.jsonl import append_jsonl, first_record, last_record
from core.runs.states import ACTIVE_STATES, ALL_STATES, RunState

# The states are ``core.runs.states.RunState``; these names are its members, for the modules that
# import them from here (the supervisor, liveness, the trainer).
QUEUED = RunState.QUEUED
STARTING = RunState.STARTING
RUNNING = RunState.RUNNING
STOPPING = RunState.STOPPING
STOPPED = RunState.STOPPED
FINISHED = RunState.FINISHED
FAILED = RunState.FAILED
CRASHED = RunState.CRASHED
STALLED = RunState.STALLED

METRICS_SCHEMA = 1


@contextmanager
def held_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the ``with`` block; waits for it. A file is made if missing
    (0600); a directory is locked as it is, leaving nothing behind."""
    fd = os.open(path, os.O_RDONLY if path.is_dir() else os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def utc_iso(ts: float) -> str:
    """A Unix time as run.json and status.json write times: ``2026-12-06T10:45:59Z``."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_now_iso() -> str:
    return utc_iso(time.time())


@dataclass(frozen=True)
class RunStatus:
    """What ``status.json`` says (or what liveness concluded).

    ``reason`` is English text, for other tools and old readers; ``reason_message`` is the same reason as
    a message record (``core.i18n.Message``), so that a reader shows it in its own language: the process
    that writes a reason (the detached supervisor or trainer) cannot know who will read it, in which
    language. Show ``reason_text``.
    """

    status: str
    reason: str = ""
    updated: str = ""
    updated_ts: float = 0.0
    reason_message: dict[str, Any] | None = None

    @classmethod
    def new(cls, status: str, reason: str | Message = "") -> RunStatus:
        """A status written now; a Message reason is kept both as English text and as a record."""
        fields = stored_reason(reason)
        return cls(status, fields["reason"], utc_now_iso(), time.time(), fields.get("reason_message"))

    @property
    def reason_text(self) -> str:
        """The reason in the current interface language (the stored text when no message is recorded)."""
        return render_stored(self.reason, self.reason_message)

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATES

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RunDirectory:
    """Reads and writes the files of one run directory. Cheap to construct; reads on demand."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    # -- paths -------------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def record_path(self) -> Path:
        return self.path / "run.json"

    @property
    def status_path(self) -> Path:
        return self.path / "status.json"

    @property
    def lock_path(self) -> Path:
        return self.path / "lock"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def log_path(self) -> Path:
        return self.path / "train.log"

    @property
    def supervisor_log_path(self) -> Path:
        return self.path / "supervisor.log"

    @property
    def outcome_path(self) -> Path:
        return self.path / "outcome.json"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def deepspeed_config_path(self) -> Path:
        return self.path / "deepspeed.json"

    def exists(self) -> bool:
        return self.record_path.is_file()

    # -- reads -------------------------------------------------------------------------------------
    def status(self) -> RunStatus:
        """The recorded status (no liveness check: see ``core.runs.liveness.effective_status``)."""
        try:
            raw = json.loads(self.status_path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):  # a hand edit: `[]` took `tunedeck runs` down with a traceback
                raise ValueError("not a JSON object")
            return RunStatus(
                status=str(raw.get("status", QUEUED)),
                reason=str(raw.get("reason", "") or ""),
                updated=str(raw.get("updated", "") or ""),
                updated_ts=float(raw.get("updated_ts", 0.0) or 0.0),
                reason_message=raw.get("reason_message") if isinstance(raw.get("reason_message"), dict) else None,
            )
        except (FileNotFoundError, ValueError, TypeError):  # missing or unreadable: liveness and the events say
            return RunStatus(QUEUED, "", "", 0.0)

    def record(self) -> dict[str, Any]:
        """``run.json`` as a dict (empty when missing or unreadable)."""
        try:
            value = json.loads(self.record_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def read_record(self) -> tuple[dict[str, Any], str]:
        """``run.json`` as a dict, and why it cannot be read: "" when it was read or is missing (a run not
        recorded yet, as ``record`` takes it); else the reason (permission denied, not JSON, not a JSON
        object). For a reader that shows what it can and says what it could not (the dashboard), where
        ``record`` gives ``{}`` for bad JSON and raises an OSError."""
        try:
            value = json.loads(self.record_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}, ""
        except OSError as exc:
            return {}, exc.strerror or type(exc).__name__
        except ValueError as exc:  # not JSON, or not UTF-8
            return {}, str(exc) or type(exc).__name__
        if not isinstance(value, dict):
            from core.i18n import t

            return {}, t("runs.record_not_object")
        return value, ""

    def read_launch_record(self) -> tuple[dict[str, Any], str]:
        """``read_record`` for starting a trainer, which takes the run's GPUs from it: a record without a
        ``gpus`` list of GPU indices (every run.json tunedeck writes has one, ``[]`` for a CPU run) gives a
        reason too, or the run would train on the CPU. A missing run.json has none either."""
        record, unreadable = self.read_record()
        gpus = record.get("gpus")
        if unreadable or (isinstance(gpus, list) and all(
                isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)):
            return record, unreadable
        from core.i18n import t

        return record, t("runs.record_no_gpus")

    def config(self) -> dict[str, Any]:
        """The resolved configuration (``config.yaml``) as a plain dict."""
        import yaml

        try:
            value = yaml.safe_load(self.config_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return value if isinstance(value, dict) else {}

    def latest_metrics(self) -> dict[str, Any] | None:
        """The run's figures now: the last training record of ``metrics.jsonl`` that no resume superseded
        (reads the tail only; ``core.watch.resumes``: the rule the charts follow). A resume goes back to its
        checkpoint: the steps an attempt reached after it are lost. So when the newest resume (the trainer's
        ``resumed`` record, or one asked for, run.json ``resumes``, after the last record) has not logged a
        step yet, the figures are the last record up to its checkpoint with the resume's ``step``,
        ``"kind": "resumed"`` and no ETA: its last known loss and rate, as the dashboard shows them. A resume that
        changed what decides the step total (its run.json record has ``total_steps``: its max_steps, or null)
        gives that total, or None with ``"total_unknown": True`` ("?"), not the given-up attempt's; the
        resumed trainer's own record gives its count."""
        from core.watch.resumes import pending_resume, resume_step, superseded

        cutoff = float("inf")
        newest: dict[str, Any] | None = None  # the newest train or resumed record, superseded or not

        def surviving(record: dict[str, Any]) -> bool:
            # read from the end backwards (a longer read starts at the end again: the same outcome)
            nonlocal cutoff, newest
            step = resume_step(record)
            if newest is None and (step is not None or record.get("kind") == "train"):
                newest = record
            if step is not None:
                cutoff = min(cutoff, step)
                return False
            return record.get("kind") == "train" and isinstance(record.get("step"), int) and not superseded(record, cutoff)

        last = last_record(self.metrics_path, surviving)
        # (a run.json that does not read: no resume known)
        asked = pending_resume(self.read_record()[0].get("resumes"), newest)
        resume: dict[str, Any] | None = None
        if asked is not None:
            resume = asked  # asked for, not started yet: the attempt given up lost what it logged after
        elif newest is not None and newest.get("kind") == "resumed":
            resume = newest  # the newest attempt has not logged since its resume
        if resume is None:
            return last
        step = resume["step"]
        if last is not None and last["step"] > step:
            last = last_record(self.metrics_path, lambda r: r.get("kind") == "train"
                               and isinstance(r.get("step"), int) and r["step"] <= step)
        if resume is asked and "total_steps" in asked:  # the resume changed what decides it: its own, or unknown
            total = asked["total_steps"] if isinstance(asked["total_steps"], int) else None
        elif resume is newest:  # the resumed trainer's count
            total = resume.get("total_steps") or (last or {}).get("total_steps")
        else:
            total = (last or {}).get("total_steps") or resume.get("total_steps") or (newest or {}).get("total_steps")
        return {**(last or {}), "kind": "resumed", "step": step, "eta_s": None, "total_steps": total,
                "total_unknown": total is None and resume is asked and "total_steps" in asked,
                "resume_time": str(resume.get("time") or "")}

    def latest_eval(self) -> dict[str, Any] | None:
        """The last eval record no resume superseded (``core.watch.resumes``; reads the tail only), a resume
        asked for whose trainer has not logged yet included (``latest_metrics``)."""
        from core.watch.resumes import RESUMED, pending_resume, resume_step, superseded

        newest = last_record(self.metrics_path, lambda r: r.get("kind") in ("train", RESUMED))
        asked = pending_resume(self.read_record()[0].get("resumes"), newest)
        cutoff = float("inf") if asked is None else float(asked["step"])

        def surviving(record: dict[str, Any]) -> bool:
            nonlocal cutoff
            step = resume_step(record)
            if step is not None:
                cutoff = min(cutoff, step)
                return False
            return record.get("kind") == "eval" and not superseded(record, cutoff)

        return last_record(self.metrics_path, surviving)

    def metrics_header(self) -> dict[str, Any] | None:
        """The first record of ``metrics.jsonl`` (schema, model, method, world size …)."""
        try:
            with open(self.metrics_path, "rb") as handle:
                first = handle.readline()
        except FileNotFoundError:
            return None
        try:
            value = json.loads(first)
        except ValueError:
            return None
        return value if isinstance(value, dict) and value.get("kind") == "header" else None

    def first_train_metrics(self) -> dict[str, Any] | None:
        """The first train record of ``metrics.jsonl`` (reads the head only): where the steady rate starts
        (``core.watch.figures.steady_tokens_per_s``)."""
        return first_record(self.metrics_path, lambda r: r.get("kind") == "train")

    def last_event(self, kind: str | None = None) -> dict[str, Any] | None:
        return last_record(self.events_path, lambda r: kind is None or r.get("event") == kind)

    def last_event_of(self, kinds: Collection[str]) -> dict[str, Any] | None:
        """The last event of ``events.jsonl`` whose kind is one of ``kinds``."""
        return last_record(self.events_path, lambda r: r.get("event") in kinds)

    def checkpoints(self, complete_only: bool = False) -> list[Checkpoint]:
        """Checkpoints by step; incomplete ones (no COMPLETE marker, or ``.tmp``) flagged."""
        found = list_checkpoints(self.checkpoints_dir)
        return [c for c in found if c.complete] if complete_only else found

    def resume_times(self) -> list[tuple[float, int]]:
        """(time, checkpoint step) of each resume run.json records (``ts``, or its ``time`` to the second
        for older records); [] when none or run.json does not read."""
        return [(ts, step) for ts, step, _record in self._resume_records()]

    def _resume_records(self) -> list[tuple[float, int, dict]]:
        """``resume_times`` with each resume's record."""
        points: list[tuple[float, int, dict]] = []
        for resume in self.read_record()[0].get("resumes") or []:  # (unreadable: no resume known)
            if not isinstance(resume, dict):
                continue
            step, ts = resume.get("step"), resume.get("ts")
            if not isinstance(step, int) or isinstance(step, bool):
                continue
            if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                try:
                    ts = datetime.strptime(str(resume.get("time")), "%Y-%m-%dT%H:%M:%SZ").replace(
                        tzinfo=timezone.utc).timestamp()
                except ValueError:
                    continue
            points.append((float(ts), step, resume))
        return points

    def left_behind(self) -> dict[int, int]:
        """The complete checkpoints of a branch a later resume went away from (``left_behind_steps``): step →
        the step that resume went to. They stay on disk (``resume --checkpoint N`` takes one, which makes it
        current again) but are not the run's newest state, and rotation removes them first."""
        from core.runs.checkpoints import left_behind_steps, written_at

        points: list[tuple[float, int, float | None]] = []
        complete = self.checkpoints(complete_only=True)
        for ts, step, record in self._resume_records():
            parent = record.get("checkpoint_ts")
            if not isinstance(parent, (int, float)) or isinstance(parent, bool):
                # an older record: the checkpoint it resumed from, if it is still there and older than it
                there = [c for c in complete if c.step == step]
                parent = written_at(there[0].path) if there else None
                parent = parent if parent is not None and parent < ts else None
            points.append((ts, step, float(parent) if parent is not None else None))
        return left_behind_steps(complete, points)

    def current_checkpoints(self) -> list[Checkpoint]:
        """The complete checkpoints by step, those a later resume left behind (``left_behind``) left out,
        unless no other is left (the one resumed from was deleted by hand): then all of them."""
        complete = self.checkpoints(complete_only=True)
        behind = self.left_behind()
        return [c for c in complete if c.step not in behind] or complete

    def last_complete_checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint with a COMPLETE marker, the marker trusted (a directory scan; markers read
        only past a resume's step), one a later resume left behind passed over. What a checkpoint is loaded
        from is ``last_sound_checkpoint``."""
        complete = self.current_checkpoints()
        return complete[-1] if complete else None

    def sound_checkpoints(self, resumable: bool = False) -> Iterator[Checkpoint]:
        """The complete checkpoints that pass the checks resume makes (``verify_checkpoint``: the marker's
        file sizes, the safetensors headers, trainer_state.json; stat calls and a few KB read each), newest
        first, each checked only when it is asked for: their weights load as far as that can tell.
        ``resumable``: their optimizer and scheduler state too."""
        from core.runs.checkpoints import verify_checkpoint

        for checkpoint in reversed(self.current_checkpoints()):
            check = verify_checkpoint(checkpoint)
            if check.resumable or (not resumable and check.weights_usable):
                yield checkpoint

    def last_sound_checkpoint(self, resumable: bool = False) -> Checkpoint | None:
        """The newest of ``sound_checkpoints``. Status, the run's output, merge, export and chat take this
        one: a damaged newer one is passed over."""
        return next(self.sound_checkpoints(resumable), None)

    # -- writes ------------------------------------------------------------------------------------
    def _status_lock(self) -> AbstractContextManager[None]:
        """Serialises read-modify-write of status.json between supervisor, trainer and CLI."""
        return held_lock(self.path / ".status.lock")

    def write_status(self, status: str, reason: str | Message = "") -> RunStatus:
        """Replace status.json atomically; give the reason as a Message so readers see their language."""
        if status not in ALL_STATES:
            raise ValueError(f"unknown run status {status!r}")
        new = RunStatus.new(status, reason)
        with self._status_lock():
            write_json_atomic(self.status_path, new.to_dict())
        return new

    def transition(self, status: str, reason: str | Message = "", only_from: frozenset[str] | set[str] = frozenset()) -> bool:
        """Write ``status`` only if the current status is one of ``only_from``; True if written."""
        with self._status_lock():
            current = self.status().status
            if current not in only_from:
                return False
            write_json_atomic(self.status_path, RunStatus.new(status, reason).to_dict())
        return True

    def update_record(self, **changes: Any) -> dict[str, Any]:
        """Merge ``changes`` into run.json (atomic replace) and return the new record.

        A run.json that is there but is not a JSON object (a torn or hand-edited file) is not replaced
        by ``changes`` alone, which would lose everything else it held: it is kept first, as
        ``run.json.corrupt-<time>`` (``set_aside_record``), and the write goes on, so that a supervisor
        recording its trainer or an attempt's end never stops a training for it. One that cannot be read
        at all (permission denied) raises its OSError and is left as it is."""
        with self._status_lock():
            record = self._record_to_update()
            record.update(changes)
            write_json_atomic(self.record_path, record)
        return record

    def _record_to_update(self) -> dict[str, Any]:
        """run.json for a read-modify-write, under the status lock: ``{}`` when missing, or when it did not
        parse and was set aside (said in events.jsonl: ``record_set_aside``)."""
        try:
            raw = self.record_path.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            value = json.loads(raw)
        except ValueError as exc:  # not JSON, or not UTF-8
            problem = str(exc) or type(exc).__name__
        else:
            if isinstance(value, dict):
                return value
            problem = Message("runs.record_not_object").english()
        kept = self.set_aside_record(raw)
        self.append_event("record_set_aside", path=str(kept), **stored_reason(
            Message("runs.record_set_aside", path=str(self.record_path), problem=problem, kept=str(kept))))
        return {}

    def set_aside_record(self, raw: bytes) -> Path:
        """Keep ``raw`` (the bytes of a run.json that does not parse) as ``run.json.corrupt-<UTC time>``
        (``-2``, ``-3`` … when that name is taken), 0600, before run.json is replaced. A copy, not a
        rename: run.json stays in place for the readers (a run without one is not listed) until the
        atomic replace, and is still there if writing its successor fails."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        kept, number = self.path / f"run.json.corrupt-{stamp}", 1
        while kept.exists():
            number += 1
            kept = self.path / f"run.json.corrupt-{stamp}-{number}"
        write_atomic(kept, raw)
        return kept

    def close_open_attempt(self, status: str, replacing: Collection[str] = (), **fields: Any) -> bool:
        """Record the end of the run's open attempt (the last in run.json without ``ended``), atomically:
        ``ended``, ``status`` and ``exit_code`` (None: nobody saw the process exit), plus ``fields``. For the
        ends the supervisor cannot record itself: killed by ``stop --force`` (status ``"killed"``), found
        dead by a liveness check (``"crashed"``). False when no attempt is open (the supervisor closed it).

        ``replacing``: statuses a reader may have closed the last attempt with while the caller was ending
        it (a liveness check that found the supervisor just killed by a forced stop calls it crashed); such
        an end, with no exit code seen, is rewritten. An end the supervisor recorded (its exit code) stays."""
        with self._status_lock():
            record = self.record()
            attempts = record.get("attempts")
            if not isinstance(attempts, list) or not attempts or not isinstance(attempts[-1], dict):
                return False
            last = attempts[-1]
            if last.get("ended") and not (last.get("status") in replacing and last.get("exit_code") is None):
                return False
            attempts[-1].update({"ended": utc_now_iso(), "exit_code": None, "status": status, **fields})
            write_json_atomic(self.record_path, record)
        return True

    def append_event(self, event: str, **data: Any) -> None:
        """One line in events.jsonl: ``{"time", "ts", "event", ...data}``."""
        append_jsonl(self.events_path, {"time": utc_now_iso(), "ts": round(time.time(), 3), "event": event, **data})

    def record_event(self, event: str, **data: Any) -> bool:
        """``append_event`` for the record of something already done outside the run folder (a merge or export
        written, an evaluation saved elsewhere, a server started): a folder that cannot take the line
        (read-only, a full disk) loses the record, not the work. Said as a warning (stderr for the CLI);
        returns whether it was recorded. The done thing reported as failed ("try again") left a server
        running, or a merge written, behind a message that said otherwise."""
        try:
            self.append_event(event, **data)
        except OSError as exc:
            import logging

            from core.i18n import t

            logging.getLogger("tunedeck.runs").warning(
                "%s", t("runs.event_not_recorded", event=event, path=str(self.events_path),
                        error=exc.strerror or str(exc)))
            return False
        return True

    def append_metrics(self, record: dict[str, Any]) -> None:
        append_jsonl(self.metrics_path, record)
