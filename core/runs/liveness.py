"""Is a run's supervisor still alive? Whoever looks decides, and a dead one is recorded as ``crashed``.

A live supervisor holds an exclusive ``flock`` on ``RUN_DIR/lock`` for its whole life and records its
pid and process start time in run.json. A run whose status says queued/starting/running/stopping is
``crashed`` when that lock can be taken (the kernel released it: the supervisor is gone, however it
died), or when the recorded pid no longer names the same live process. The crashed status is written
while holding the lock, after re-reading the status, so a supervisor that just finished cleanly (final
status written, then lock released) is never mislabelled.

Readers never fail because they could not write: on a full or read-only disk the crashed status is
computed and returned, and recorded by the next reader that can. A running, starting or stopping run whose
supervisor is alive but whose trainer has gone silent (no step, no heartbeat: ``core.runs.heartbeat``) is ``stalled``, a
state that is only ever computed, never written.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.i18n import Message
from core.runs.run_dir import (
    ACTIVE_STATES,
    CRASHED,
    FAILED,
    FINISHED,
    QUEUED,
    RUNNING,
    STALLED,
    STARTING,
    STOPPED,
    STOPPING,
    RunDirectory,
    RunStatus,
)

if TYPE_CHECKING:
    from core.runs.heartbeat import Beats

# A run stays "queued" between `tunedeck train` writing it and the supervisor taking the lock.
QUEUED_GRACE_S = 30.0
ENDED_EVENTS = frozenset({FINISHED, STOPPED, FAILED})  # the supervisor's end events


def process_start_time(pid: int) -> float | None:
    """The process's start time (psutil create_time), or None if no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def same_process_alive(pid: int | None, start_time: float | None) -> bool:
    """True if ``pid`` is alive and started at ``start_time`` (not a recycled pid)."""
    import psutil

    if not pid:
        return False
    try:
        proc = psutil.Process(int(pid))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False
    return start_time is None or abs(created - float(start_time)) < 0.5


@contextmanager
def try_lock(run: RunDirectory) -> Iterator[bool]:
    """Try to take the run's supervisor lock without blocking; yields whether we hold it."""
    try:
        fd = os.open(run.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except FileNotFoundError:  # the run directory vanished
        yield False
        return
    except OSError:
        # A read-only (or otherwise unwritable) disk: flock works on a read-only descriptor too. No lock
        # file at all means no supervisor ever took it (it creates the file before locking).
        try:
            fd = os.open(run.lock_path, os.O_RDONLY)
        except FileNotFoundError:
            yield run.path.is_dir()
            return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                yield False
                return
            raise
        yield True
    finally:
        os.close(fd)


def supervisor_alive(run: RunDirectory) -> bool:
    """True while some process holds the run's lock (normally its supervisor)."""
    with try_lock(run) as got:
        return not got


def lock_holder(run: RunDirectory, locks_path: str = "/proc/locks") -> int | None:
    """The pid of the process that holds the run's lock (its supervisor), or None: nobody holds it, or
    this system does not say (no ``/proc/locks``: not Linux). For a stop when run.json, which records the
    supervisor's pid, does not read. The pid is taken only if that process has the lock file open: a
    lock whose holder has gone does not name another process that got its pid."""
    import psutil

    try:
        inode = os.stat(run.lock_path).st_ino
        with open(locks_path, encoding="ascii", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 4321 fe:00:2146540 0 EOF"; a waiter's line reads "1: -> FLOCK ...". The
    # device is left out: in a container stat() gives the overlay's, the kernel the lower file system's.
    for fields in (line.split() for line in lines):
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        pid, ident = fields[4], fields[5].rsplit(":", 1)
        if len(ident) != 2 or ident[1] != str(inode) or not pid.isdigit():
            continue
        try:
            paths = {Path(f.path) for f in psutil.Process(int(pid)).open_files()}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if run.lock_path in paths or run.lock_path.resolve() in paths:
            return int(pid)
    return None


def foreign_host(record: Mapping[str, Any]) -> str | None:
    """The host a run's run.json says it runs on, when that is not this one (a data root shared between
    nodes over NFS): its processes are not this box's to look at or signal, nor its GPUs this box's to
    chart. None for a run of this host, or one whose run.json does not say."""
    import socket

    host = record.get("host")
    return host if isinstance(host, str) and host and host != socket.gethostname() else None


KILLING_BOUND_S = 120.0  # how long run.json's ``killing`` (a forced stop at work) may keep readers off the run


def being_killed(record: Mapping[str, Any]) -> bool:
    """Whether a forced stop (``core.runs.control.request_stop``) is killing the run now: run.json's ``killing``
    names a live process. Its end is that stop's to record ("stopped", the attempt "killed", one event); a
    reader that recorded one meanwhile (the trainer's outcome.json, or crashed) made the attempt read as the
    trainer said and the stop event appear twice. A stop that died on the way names no live process; one
    recorded longer ago than ``KILLING_BOUND_S`` (a stop's kill and wait take some 30 s at most) is not at
    work either: a stop suspended (Ctrl-Z), or the app's stop whose clearing of it failed (a full disk) and
    that lives on, left the run active with its supervisor dead, its next attempts' crashes never recorded."""
    killing = record.get("killing")
    if not isinstance(killing, dict) or not isinstance(killing.get("pid"), int):
        return False
    since = killing.get("since")
    if isinstance(since, (int, float)) and time.time() - since > KILLING_BOUND_S:
        return False
    start = killing.get("start_time")
    return same_process_alive(killing["pid"], start if isinstance(start, (int, float)) else None)


def never_trained(run: RunDirectory) -> bool:
    """Whether the run ended before it had anything to lose: no complete checkpoint and no training step
    logged (stopped or crashed while loading the model or the data). A resume starts it again from step 0
    in the same run directory (its id, config.yaml and metrics kept) instead of refusing for want of a
    checkpoint (``core.runs.control.prepare_resume``)."""
    return run.last_complete_checkpoint() is None and run.first_train_metrics() is None


def recorded_end(run: RunDirectory) -> RunStatus | None:
    """How the run's last attempt ended as ``events.jsonl`` records it (the supervisor's ``finished``,
    ``stopped`` or ``failed`` event, after the newest resume asked for), or None. For a status.json that
    does not read, with no supervisor alive: such a run read as queued, then crashed ("the supervisor process is
    gone … kill -9?"), and that verdict replaced the file, a finished run's included."""
    event = run.last_event_of(ENDED_EVENTS)
    if event is None:
        return None
    ts = event.get("ts")
    if not isinstance(ts, (int, float)) or any(when >= ts for when, _step in run.resume_times()):
        return None  # a resume came after it: that attempt's end is not known
    message = event.get("reason_message")
    return RunStatus(str(event["event"]), str(event.get("reason") or ""), str(event.get("time") or ""), float(ts),
                     message if isinstance(message, dict) else None)


def trainer_verdict(run: RunDirectory, status: str) -> tuple[str, str | Message] | None:
    """How the trainer of the run's last attempt said it ended (its ``outcome.json``: finished, stopped or
    failed, and why), for a run whose supervisor is gone before recording it (killed, or the box went down,
    in the moment between the trainer's exit and the final status), else None. Such a run read "crashed …
    continue with tunedeck resume", and a finished one's resume was then refused (no step left): it could
    neither go on nor be evaluated or exported as finished. The supervisor removes outcome.json as each attempt
    starts; the verdict must name the last attempt run.json records (``TUNEDECK_ATTEMPT``). Where the supervisor
    recorded that attempt's end (its exit code) before the status, its verdict is taken (``_supervisor_verdict``):
    it judged the trainer's. ``status``: the run's; a queued run's supervisor never
    started its attempt (a resume that died on the way), so the verdict there is the attempt before's."""
    import json

    if status == QUEUED:
        return None
    attempts = run.read_record()[0].get("attempts")
    last = attempts[-1] if isinstance(attempts, list) and attempts else None
    if isinstance(last, dict) and last.get("exit_code") is not None and last.get("status") in ENDED_EVENTS:
        return _supervisor_verdict(run, last)
    try:
        outcome = json.loads(run.outcome_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(outcome, dict) or not isinstance(last, dict) or outcome.get("status") not in ENDED_EVENTS:
        return None
    if str(outcome.get("attempt")) != str(last.get("number")) or last.get("status") not in (None, outcome["status"]):
        return None
    message = Message.from_record(outcome.get("reason_message"))
    return str(outcome["status"]), message if message is not None else str(outcome.get("reason") or "")


def _supervisor_verdict(run: RunDirectory, last: dict[str, Any]) -> tuple[str, str | Message]:
    """The end the supervisor recorded for the last attempt (its status and exit code in run.json, written before
    its event and the final status) when it was gone before the status: its event's reason where it got that far,
    else the reason it gives for that exit. It may differ from the trainer's outcome.json (a trainer that said
    finished and exited non-zero failed); such a run read "crashed … continue with tunedeck resume"."""
    status, code = str(last["status"]), last["exit_code"]
    ended = recorded_end(run)
    if ended is not None and ended.status == status:
        return status, Message.from_record(ended.reason_message) or ended.reason
    return status, exit_reason(code) if status == FAILED else ""


def exit_reason(code: Any) -> Message:
    """Why a trainer that left no verdict of its own failed: the signal that killed it (``code`` below 0, as
    ``Popen.returncode`` gives it), else its exit code."""
    import signal

    if isinstance(code, int) and code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return Message("runs.reason_signal", signal=name)
    return Message("runs.reason_exit_code", code=code)


def record_verdict(run: RunDirectory, verdict: tuple[str, str | Message]) -> RunStatus | None:
    """Record ``trainer_verdict``'s end as the supervisor would have (the status, the attempt, the event); the
    status written, or None where another reader recorded an end first."""
    from core.i18n import stored_reason

    status, reason = verdict
    attempts = run.read_record()[0].get("attempts")
    last = attempts[-1] if isinstance(attempts, list) and attempts else None
    closed = isinstance(last, dict) and last.get("exit_code") is not None  # by its supervisor, event next
    if not run.transition(status, reason, only_from=ACTIVE_STATES):
        return None
    run.close_open_attempt(status, replacing=(CRASHED,))
    ended = recorded_end(run) if closed else None
    if ended is None or ended.status != status:  # the supervisor's event, where it got that far, is not repeated
        run.append_event(status, exit_code=None, supervisor_gone=True, **stored_reason(reason))
    return run.status()


def crashed_reason(run: RunDirectory) -> Message:
    """Why a run is crashed, and what to do: resume it when it has a complete checkpoint or never trained
    (a resume starts it again from step 0), else start it again (offering a resume that can only fail with
    "no complete checkpoint" misleads). A directory scan only: whether that checkpoint is sound, the resume
    checks and says (falling back, or what to do)."""
    if run.last_complete_checkpoint() is not None or never_trained(run):
        return Message("runs.reason_crashed", id=run.id)
    return Message("runs.reason_crashed_no_checkpoint", config=str(run.config_path))


def stopped_early_reason(run: RunDirectory) -> Message:
    """Why a run stopped before this attempt saved a checkpoint (a stop in its first moments, before or while
    it loads): "nothing saved" only when the run has no checkpoint at all. A resumed run keeps its earlier
    ones, and the reason names the one ``tunedeck resume`` takes (the newest sound, resumable one)."""
    checkpoint = run.last_sound_checkpoint(resumable=True)
    if checkpoint is None:
        return Message("runs.reason_stopped_no_checkpoint")
    return Message("runs.reason_stopped_resumable", id=run.id, name=checkpoint.path.name)


def unrecorded_crash_reason(run: RunDirectory, error: OSError) -> Message:
    """Why a run is crashed when its folder cannot be written (``error``: what writing the crashed status
    met). The run's own processes met it too, and could record neither their failure nor how they ended:
    the usual guesses (a reboot, kill -9) would send the user after the wrong cause, and a resume fails
    until the folder can be written again."""
    from core.runs.disk_space import UNWRITABLE_ERRNOS

    if error.errno not in UNWRITABLE_ERRNOS | {errno.EACCES, errno.EPERM}:
        return crashed_reason(run)
    key = "runs.reason_crashed_unwritable" if run.last_complete_checkpoint() is not None \
        else "runs.reason_crashed_unwritable_no_checkpoint"
    return Message(key, path=str(run.path), error=error.strerror or str(error), log=str(run.supervisor_log_path),
                   id=run.id, config=str(run.config_path))


def effective_status(run: RunDirectory, persist: bool = True, beats: Beats | None = None) -> RunStatus:
    """The run's status with liveness applied; a dead active run becomes (and is saved as) crashed.
    ``beats``: the run's heartbeats (``core.runs.heartbeat.read_beats``) when the caller has read them."""
    status = run.status()
    if status.status not in ACTIVE_STATES:
        return status
    # Another node's run (a shared data root): its pid names a process of that node, and its lock may not be
    # seen from here (a mount with local locks). Its heartbeats are files, read alike from every node.
    foreign = foreign_host(run.read_record()[0]) is not None
    with try_lock(run) as got:
        if got:
            current = run.status()  # re-read under the lock: the supervisor may have just finished
            if current.status not in ACTIVE_STATES:
                return current
            if current.status == QUEUED and time.time() - current.updated_ts < QUEUED_GRACE_S:
                return current  # the supervisor is still on its way to the lock
            if foreign and _beating(run, current, beats):
                return current  # alive on its host as far as its files tell: not for this box to call crashed
            if being_killed(run.read_record()[0]):
                return current  # a forced stop killed it and records the end itself, in a moment
            ended = recorded_end(run) if not current.updated_ts else None
            if ended is not None:  # status.json unreadable (a hand edit, a torn copy): the end events.jsonl holds
                if persist:
                    try:
                        run.write_status(ended.status, Message.from_record(ended.reason_message) or ended.reason)
                    except OSError:
                        pass
                return ended
            verdict = trainer_verdict(run, current.status)
            if verdict is not None:  # the trainer ended and said how; only its supervisor's record of it is missing
                return _verdict_status(run, verdict, persist)
            reason = crashed_reason(run)
            if persist:
                try:
                    written = run.write_status(CRASHED, reason)
                    run.close_open_attempt(CRASHED)
                    return written
                except OSError as exc:  # a full or read-only disk: say what we found; a later reader records it
                    reason = unrecorded_crash_reason(run, exc)
            return RunStatus(CRASHED, reason.english(), current.updated, current.updated_ts, reason.to_record())
    # Someone holds the lock. Cross-check the recorded supervisor: a pid that no longer names the
    # process that recorded it means the holder is not our supervisor (e.g. a stray inherited fd).
    record = run.read_record()[0]
    sup = record.get("supervisor") or {}  # one that does not read names no supervisor
    pid = sup.get("pid")
    if pid and not foreign and not same_process_alive(pid, sup.get("start_time")) and not being_killed(record):
        verdict = trainer_verdict(run, status.status)
        if verdict is not None:  # as above
            return _verdict_status(run, verdict, persist)
        reason = crashed_reason(run)
        try:
            if persist and run.transition(CRASHED, reason, only_from=ACTIVE_STATES):
                run.close_open_attempt(CRASHED)
                return run.status()
        except OSError as exc:  # as above: computed, not recorded
            reason = unrecorded_crash_reason(run, exc)
        current = run.status()
        return current if current.status not in ACTIVE_STATES else RunStatus.new(CRASHED, reason)
    # A trainer can hang loading the model as well as training, and while it saves its last checkpoint or
    # exits after a stop (a "stopping" that never ends).
    if status.status in (RUNNING, STARTING, STOPPING):
        return _with_stall(run, status, sup if status.status != RUNNING else None, beats)
    return status


def _verdict_status(run: RunDirectory, verdict: tuple[str, str | Message], persist: bool) -> RunStatus:
    """``trainer_verdict``'s end, recorded where ``persist`` (``record_verdict``) and so returned; the end another
    reader recorded first; else (not to be recorded, or a full or read-only disk: a later reader records it)
    computed."""
    if persist:
        try:
            written = record_verdict(run, verdict)
            if written is not None:
                return written
        except OSError:
            pass
    current = run.status()
    return current if current.status not in ACTIVE_STATES else RunStatus.new(*verdict)


FOREIGN_DEAD_S = 1800.0  # another host's run silent this long (and thrice its stall threshold) is taken for dead
FOREIGN_DEAD_FACTOR = 3.0


def _beating(run: RunDirectory, status: RunStatus, beats: Beats | None) -> bool:
    """Whether another host's run, holding no lock seen here, may still be alive: its heartbeats (or, before
    the first, its last status) silent for less than ``FOREIGN_DEAD_S`` and thrice the stall threshold. A
    stall is what its own host says of it (a long model load, a slow save); from here only a silence far past
    that is taken for death, and written (a container that was replaced has a new host name, and its old run
    must not stay running for ever)."""
    from core.runs.heartbeat import find_stall

    stall = find_stall(run.path, started_at=status.updated_ts, beats=beats)
    return stall is None or stall.silent_s < max(FOREIGN_DEAD_S, FOREIGN_DEAD_FACTOR * stall.threshold_s)


def _with_stall(run: RunDirectory, status: RunStatus, supervisor: dict | None = None, beats: Beats | None = None) -> RunStatus:
    """``status`` (running, starting or stopping, supervisor alive), or ``stalled`` when the trainer has gone
    silent. ``supervisor`` (run.json's, while starting or stopping): before the trainer's first heartbeat, its silence counts
    from the trainer process's start (run.json ``trainer``), or the supervisor's when that is not there yet."""
    from core.runs.heartbeat import find_stall

    started_at = None
    if supervisor is not None:
        record = run.read_record()[0]
        for process in (record.get("trainer"), supervisor):
            if isinstance(process, dict) and isinstance(process.get("start_time"), (int, float)):
                started_at = max(float(process["start_time"]), status.updated_ts or 0.0)
                break
    stall = find_stall(run.path, started_at=started_at, beats=beats)
    if stall is None:
        return status
    step = stalled_step(run, stall.step, beats)
    if status.status == STOPPING:  # a second stop kills it (request_stop), as for any run still stopping
        reason = Message("runs.reason_stalled_stopping", seconds=int(stall.silent_s),
                         threshold=int(stall.threshold_s), rank=stall.rank, id=run.id)
        return RunStatus(STALLED, reason.english(), status.updated, status.updated_ts, reason.to_record())
    if status.status == STARTING and step is None:  # no step yet: loading the model or the data
        reason = Message("runs.reason_stalled_starting", seconds=int(stall.silent_s),
                         threshold=int(stall.threshold_s), rank=stall.rank, id=run.id)
        return RunStatus(STALLED, reason.english(), status.updated, status.updated_ts, reason.to_record())
    reason = Message("runs.reason_stalled", seconds=int(stall.silent_s), threshold=int(stall.threshold_s),
                     step=step if step is not None else "?", rank=stall.rank, id=run.id)
    return RunStatus(STALLED, reason.english(), status.updated, status.updated_ts, reason.to_record())


def stalled_step(run: RunDirectory, step: int | None, beats: Beats | None = None) -> int | None:
    """The step a stalled run stands at: the newest of ``step`` (a heartbeat's or the metrics') and the last
    step that metrics.jsonl and the heartbeats know. The heartbeat is rewritten every few seconds and a step's
    record can be written a step late, so either can be ahead; the reason and the step column both say this."""
    from core.runs.heartbeat import last_heartbeat_step

    known = [s for s in (step, (run.latest_metrics() or {}).get("step"), last_heartbeat_step(run.path, beats))
             if isinstance(s, int) and not isinstance(s, bool)]
    return max(known) if known else None
