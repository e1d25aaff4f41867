"""The steps of stopping and resuming a run: signals and kills, the choice of checkpoint, the checks
before a resume. Callers use ``core.runs.lifecycle`` (``stop_run``, ``resume_run``), which adds the rest
(disk space, overrides, starting the supervisor)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.i18n import Message, t
from core.runs.checkpoints import CheckpointCheck, resume_candidates, written_at
from core.runs.errors import RunError
from core.runs.fingerprint import compare_fingerprint, record_fingerprint
from core.runs.liveness import (
    effective_status,
    foreign_host,
    lock_holder,
    never_trained,
    process_start_time,
    same_process_alive,
    try_lock,
)
from core.runs.run_dir import (
    ACTIVE_STATES,
    CRASHED,
    FINISHED,
    QUEUED,
    STARTING,
    STOPPED,
    STOPPING,
    RunDirectory,
    RunStatus,
    utc_now_iso,
)
from core.runs.states import TERMINAL_STATES, state_label, still_stopping
from core.watch.figures import directory_size, format_bytes


class RunControlError(RunError):
    """A stop/resume that cannot be done; the message says why and what to do. Its ``code`` (the CLI's exit
    status): 2 for a request that cannot be (a run that is not running, finished or still active, a checkpoint
    that is not there or not sound), 1 where doing it failed (a run.json that does not read, a supervisor
    not found)."""


@dataclass
class StopResult:
    """What a stop did: ``forced`` (killed, now final), the status after it, and for a stop that waited
    (``core.runs.lifecycle.stop_run_and_wait``) whether the wait ran out with the run still live."""

    forced: bool
    status: RunStatus
    timed_out: bool = False
    notices: list[Message] = field(default_factory=list)  # what the user must still be told (run.json)


def _user_name(uid: int) -> str:
    """The login name of ``uid``, or the number where it has none (a container's user without a passwd entry)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _not_permitted(run: RunDirectory, pid: int, error: str) -> RunControlError:
    """A stop whose signal this user may not send (kill(2): EPERM): which run, which process, whose it is and
    what to do. A request that cannot be (exit 2): nothing was sent, nothing written."""
    import psutil

    me = _user_name(os.geteuid())
    try:
        uid: int | None = psutil.Process(pid).uids().real
    except (psutil.Error, ValueError):
        uid = None
    owner = None if uid is None else _user_name(uid)
    # sudo's command names the run's folder: sudo resets the environment (TUNEDECK_HOME, XDG_DATA_HOME, HOME), and
    # root's data root, where the id is looked up, does not hold this user's runs
    where = {"id": run.id, "pid": pid, "user": me, "error": error, "path": os.path.abspath(run.path)}
    if uid == 0 and owner != me:  # a run started with sudo: root is the one way on ("as root or as root" said it twice)
        return RunControlError(t("runs.stop_root_owned", **where), 2)
    if owner is not None and owner != me:
        return RunControlError(t("runs.stop_other_user", owner=owner, **where), 2)
    return RunControlError(t("runs.stop_not_permitted", **where), 2)


def _may_signal(run: RunDirectory, pid: int) -> None:
    """Refuse (``_not_permitted``) a stop whose signal to ``pid`` the kernel would refuse: a supervisor of
    another user (a shared box, a run started with sudo). Checked with signal 0, which checks and sends
    nothing, before the run's status is touched. A pid gone meanwhile is for the caller's liveness to judge."""
    try:
        os.kill(pid, 0)
    except PermissionError as exc:
        raise _not_permitted(run, pid, exc.strerror or str(exc)) from exc
    except ProcessLookupError:
        pass


def _kill_trees(run: RunDirectory, pids: list[int]) -> None:
    """SIGKILL each of ``pids`` and all their descendants (torchrun workers live in sessions of their own).
    Each is checked first: where one may not be signalled (another user's), none is, and the stop is refused
    (``_not_permitted``), so the run is not written "stopped" while it trains on. One refused after all, once
    others were killed (a security module, a process that changed its user meanwhile), fails the stop (exit 1)
    saying which were killed and which not."""
    import psutil

    victims: list[Any] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            victims += root.children(recursive=True) + [root]
        except psutil.NoSuchProcess:
            continue
    for proc in victims:
        _may_signal(run, proc.pid)
    denied: list[tuple[int, str]] = []
    killed: list[int] = []
    for proc in victims:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied as exc:  # refused after all (a security module): said, not a traceback
            denied.append((proc.pid, exc.msg or "access denied"))
        else:
            killed.append(proc.pid)
    refused = {pid for pid, _ in denied}
    psutil.wait_procs([proc for proc in victims if proc.pid not in refused], timeout=10)  # not those alive still
    if denied and killed:  # some were killed before one was refused: "nothing was sent" would be untrue
        raise RunControlError(t("runs.stop_partly_killed", id=run.id, killed=", ".join(map(str, killed)),
                                refused=", ".join(str(pid) for pid, _ in denied), error=denied[0][1],
                                path=os.path.abspath(run.path)), 1)
    if denied:
        raise _not_permitted(run, *denied[0])


def _late_supervisor(run: RunDirectory, killed: list[int]) -> list[int]:
    """A supervisor that started while a forced stop waited for the run's lock (a `resume` just launched, its
    run still queued: the stop found nothing to kill): killed (``_kill_trees``), else it trained on under the
    "stopped" the stop wrote. Its pid, or [] where run.json names none alive but those already killed."""
    sup = run.read_record()[0].get("supervisor") or {}
    pid = sup.get("pid") if isinstance(sup, dict) else None
    if not isinstance(pid, int) or pid in killed or not same_process_alive(pid, sup.get("start_time")):
        return []
    _kill_trees(run, [pid])
    return [pid]


def _record_forced_end(run: RunDirectory, second: bool, unreadable: str | None) -> RunStatus:
    """A forced stop's end: its event, "stopped", and the open attempt "killed". ``second``: a second stop while
    the first was saving (the app's second stop too, which passes force), else --force, as it was asked."""
    run.append_event("stopped", reason="second_stop" if second else "force", forced=True)
    written = run.write_status(STOPPED, Message("runs.reason_second_stop" if second else "runs.reason_forced"))
    if not unreadable:  # (one that does not read is not written: the notice says so)
        # Its supervisor, killed, cannot record its end. A reader that looked since the kill, before ``killing``
        # was recorded (an older tunedeck), found it gone and called the attempt crashed: it was killed.
        run.close_open_attempt("killed", replacing=(CRASHED,))
    return written


def request_stop(run: RunDirectory, force: bool = False) -> StopResult:
    """Graceful stop (SIGTERM: checkpoint, then exit); ``force`` or a second stop kills the processes.

    The supervisor's pid is in run.json; when that does not read (permissions, bad JSON) the process that
    holds the run's lock is the supervisor (``lock_holder``): the stop goes to it, and a notice says which
    file could not be read and what to do."""
    status = effective_status(run)
    if status.status not in ACTIVE_STATES:
        raise RunControlError(t("runs.stop_not_running", id=run.id, status=state_label(status.status)), 2)
    record, unreadable = run.read_record()
    host = foreign_host(record)
    if host is not None:  # its pids are another box's: a signal here would reach nothing, or the wrong process
        raise RunControlError(t("runs.stop_other_host", id=run.id, host=host), 2)
    notices: list[Message] = []
    if unreadable:
        pid = lock_holder(run)
        if pid is None:
            raise RunControlError(t("runs.stop_record_unreadable_no_supervisor", id=run.id, reason=unreadable,
                                    path=str(run.record_path), lock=str(run.lock_path)))
        notices.append(Message("runs.stop_record_unreadable", path=str(run.record_path), reason=unreadable, pid=pid))
        alive = True
    else:
        sup = record.get("supervisor") or {}
        pid = sup.get("pid")
        alive = bool(pid) and same_process_alive(pid, sup.get("start_time"))
    # Still stopping: a second stop kills it, also when its trainer hangs while stopping (its stalled reason
    # says so), as the app's stop key decides it.
    stopping = still_stopping(status.status, status.reason_message)
    if force or stopping:
        trainer = record.get("trainer") or {}
        trainer_alive = bool(trainer.get("pid")) and same_process_alive(trainer["pid"], trainer.get("start_time"))
        if not unreadable:  # (one that does not read is not written: the notice says so)
            # Readers leave the run to this stop until it has recorded its end (``killing``): one that looked
            # between the kill and the status below took the trainer's outcome.json (a trainer that hung after
            # writing it) for the end, its event too, and the stop's "killed" did not replace it.
            me = os.getpid()
            run.update_record(killing={"pid": me, "start_time": process_start_time(me), "since": time.time()})
        try:
            victims = ([int(pid)] if alive else []) + ([int(trainer["pid"])] if trainer_alive else [])
            _kill_trees(run, victims)
            deadline = time.monotonic() + 10
            while True:
                # The end is written holding the run's lock: a supervisor that takes it after (a `train` or
                # `resume` just started, the run still queued) finds the run stopped and does not start it.
                with try_lock(run) as got:
                    if got or time.monotonic() >= deadline:
                        written = _record_forced_end(run, stopping, unreadable)
                        break
                if not unreadable:  # one that took the lock and recorded itself since run.json was read: killed
                    victims += _late_supervisor(run, victims)
                time.sleep(0.1)
        finally:
            if not unreadable:
                run.update_record(killing=None)
        return StopResult(True, written, notices=notices)
    if not alive:
        if status.status == QUEUED:
            raise RunControlError(t("runs.stop_not_started", id=run.id))
        return StopResult(False, effective_status(run))
    _may_signal(run, int(pid))  # before "stopping" is written: not for a supervisor that cannot be told
    before = run.status()
    run.transition(STOPPING, Message("runs.reason_stop_requested"), only_from=ACTIVE_STATES)
    try:
        os.kill(int(pid), signal.SIGTERM)
    except PermissionError as exc:  # refused after all: the run goes on, as it was
        run.transition(before.status, Message.from_record(before.reason_message) or before.reason,
                       only_from={STOPPING})
        raise _not_permitted(run, int(pid), exc.strerror or str(exc)) from exc
    except ProcessLookupError:  # it ended between the check and the signal: nothing was sent, the run ended as
        # it did (its own final status, or crashed), not "stopping" for a stop that reached no one
        run.transition(before.status, Message.from_record(before.reason_message) or before.reason,
                       only_from={STOPPING})
        return StopResult(False, effective_status(run), notices=notices)
    return StopResult(False, run.status(), notices=notices)


def wait_for_end(run: RunDirectory, timeout_s: float | None = None, poll_s: float = 0.25) -> RunStatus:
    """Block until the run reaches a final status (or ``timeout_s`` passes); returns the last status."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        status = effective_status(run)
        if status.status in TERMINAL_STATES:
            return status
        if deadline is not None and time.monotonic() > deadline:
            return status
        time.sleep(poll_s)


@dataclass
class ResumePlan:
    """What ``prepare_resume`` decided: the checkpoint to resume from and what the user must be told
    (``notices``: fallbacks, removals, warnings about changed data or configuration, in order)."""

    checkpoint: str | None  # None: the run starts again from step 0 (``never_trained``)
    step: int
    weights_only: bool = False
    notices: list[Message] = field(default_factory=list)


def _choose_checkpoint(run: RunDirectory, step: int | None, weights_only: bool,
                       notices: list[Message]) -> CheckpointCheck | None:
    """The newest sound checkpoint (or checkpoint ``step``); every one passed over is told and recorded.
    None for a run that never trained (``never_trained``): it starts again from step 0."""
    candidates = resume_candidates(run.checkpoints_dir)
    if not candidates and step is None and never_trained(run):
        return None
    behind = run.left_behind() if step is None else {}
    current = [c for c in candidates if c.checkpoint.step not in behind]
    if behind and current:  # a branch an earlier resume went back from: told, not taken (--checkpoint N takes it)
        for check in candidates:
            back = behind.get(check.checkpoint.step)
            if back is not None and check.checkpoint.step > current[0].checkpoint.step:
                notices.append(Message("resume.left_behind", name=check.checkpoint.path.name, back=back,
                                       id=run.id, step=check.checkpoint.step))
        candidates = current
    told = len(notices)
    if step is not None:
        chosen = [c for c in candidates if c.checkpoint.step == step]
        if not chosen:
            steps = ", ".join(str(c.checkpoint.step) for c in reversed(candidates)) or "-"
            raise RunControlError(t("resume.no_such_checkpoint", id=run.id, step=step, steps=steps), 2)
        candidates = chosen
    for check in candidates:
        usable = check.resumable or (weights_only and check.weights_usable)
        if usable:
            if len(notices) > told:  # some newer damaged ones were passed over
                notices.append(Message("resume.fell_back", name=check.checkpoint.path.name))
            return check
        bad = check.first_problem
        assert bad is not None
        run.append_event("checkpoint_rejected", step=check.checkpoint.step, path=str(check.checkpoint.path),
                         file=bad.file, problem=bad.message.english(), state_only=check.weights_usable)
        key = "resume.state_missing" if check.weights_usable else "resume.checkpoint_damaged"
        if step is not None:
            hint = Message("resume.hint_weights_only", step=step) if check.weights_usable else \
                Message("resume.hint_other_checkpoint")
            raise RunControlError(Message("resume.checkpoint_refused", reason=Message(
                key, name=check.checkpoint.path.name, file=bad.file, problem=bad.message), hint=hint).text(), 2)
        notices.append(Message(key, name=check.checkpoint.path.name, file=bad.file, problem=bad.message))
    if not candidates:
        raise RunControlError(t("runs.resume_no_checkpoint", id=run.id, path=str(run.checkpoints_dir),
                                config=str(run.config_path)), 2)  # a user error: nothing to resume from
    hint = Message("resume.hint_weights_only_any") if any(c.weights_usable for c in candidates) else \
        Message("resume.hint_restart")
    raise RunControlError(Message("resume.no_sound_checkpoint", id=run.id, problems=list(notices),
                                  hint=hint).text(), 2)  # no sound checkpoint to resume from: a request that cannot be


def _checkpoint_epoch(path: Any) -> float | None:
    """The epoch the trainer had reached at a checkpoint (its trainer_state.json), or None."""
    import json

    try:
        epoch = json.loads((path / "trainer_state.json").read_text(encoding="utf-8")).get("epoch")
    except (OSError, ValueError, AttributeError):
        return None
    return float(epoch) if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) else None


def _no_step_left(run: RunDirectory, cfg: dict[str, Any], step: int, path: Any) -> str | None:
    """Why resuming from checkpoint ``step`` with ``cfg`` would train no step at all, or None. A max_steps
    at or below the checkpoint's step (or, without max_steps, epochs no more than the checkpoint had
    reached) let the trainer finish at once: the run ended "finished, step 1168/100" and could never be
    resumed again. max_steps wins over epochs, as in the trainer."""
    max_steps = cfg.get("max_steps")
    if max_steps:
        if int(max_steps) <= step:
            return t("resume.max_steps_reached", id=run.id, step=step, max_steps=max_steps)
        return None
    epochs = cfg.get("epochs")
    reached = _checkpoint_epoch(path)
    if epochs and reached is not None and float(epochs) <= reached:
        return t("resume.epochs_reached", id=run.id, step=step, epochs=f"{float(epochs):g}",
                 reached=f"{round(reached, 2):g}")
    return None


def _batch(keys: dict[str, Any]) -> tuple[int, int] | None:
    """(micro_batch_size, gradient_accumulation) of a configuration's keys, or None where one is not a
    whole number."""
    try:
        return int(keys.get("micro_batch_size", 1) or 1), int(keys.get("gradient_accumulation", 1) or 1)
    except (TypeError, ValueError):
        return None


def _batch_changed(run: RunDirectory, cfg: dict[str, Any], step: int, path: Any) -> str | None:
    """Why resuming from checkpoint ``step`` with ``cfg`` would skip or repeat samples, or None: the
    trainer places its data and its LR schedule by the step count (the checkpoint's global step, batches
    skipped by steps × the new batch), so another samples-a-step (micro_batch_size × gradient_accumulation;
    the GPU count is refused by ``_moving_gpus``) moves the epoch with it: at step 921, 2 → 4 a step took
    the run from epoch 7.08 to 14.17, skipping half of what was left. Refused with the numbers and the
    ways out; the same product (4 × 1 → 2 × 2, the OOM advice) resumes. The batch the checkpoint trained
    with is the fingerprint's (the last start or resume); a run without one is not judged."""
    from core.runs.fingerprint import read_fingerprint

    recorded = read_fingerprint(run.path)
    old_keys = ((recorded or {}).get("config") or {}).get("keys") if isinstance(recorded, dict) else None
    if not isinstance(old_keys, dict) or step <= 0:
        return None
    old, new = _batch(old_keys), _batch(cfg)
    if old is None or new is None or old[0] * old[1] == new[0] * new[1]:
        return None
    old_batch, new_batch = old[0] * old[1], new[0] * new[1]
    epoch = _checkpoint_epoch(path)
    where = Message("resume.batch_epoch", epoch=f"{round(epoch, 2):g}",
                    new_epoch=f"{round(epoch * new_batch / old_batch, 2):g}") if epoch else ""
    keep = f"micro_batch_size={old[0]} gradient_accumulation={old[1]}"
    if new[0] != old[0] and old_batch % new[0] == 0:  # the new micro-batch with the accumulation that keeps it
        trade = Message("resume.batch_trade", keys=f"micro_batch_size={new[0]} gradient_accumulation="
                                                   f"{old_batch // new[0]}")
    else:
        trade = ""
    return t("resume.batch_changed", id=run.id, step=step, old=f"{old[0]} × {old[1]}", new=f"{new[0]} × {new[1]}",
             old_batch=old_batch, new_batch=new_batch, samples=step * old_batch,
             new_step=f"{step * old_batch / new_batch:g}", where=where, keep=keep, trade=trade)


# The keys that decide a run's step total (with the data): a change to one makes the last attempt's total
# untrue until the resumed trainer has counted the data again. Besides the batch and the data itself, what
# tokenises the samples: the chat template's ``thinking``, the ``model`` (its tokenizer and template), ``loss_on``
# (a sample left with no target is skipped) and the records' selection (``split``, ``dataset_info``, ``dataset_dir``):
# each moves samples past ``max_seq_len`` (cut to no answer, or dropped) and so the samples an epoch has.
TOTAL_KEYS = frozenset({"max_steps", "epochs", "micro_batch_size", "gradient_accumulation", "dataset",
                        "max_samples", "packing", "max_seq_len", "overlong", "eval_split", "thinking", "model",
                        "loss_on", "split", "dataset_info", "dataset_dir"})


def _total_after(cfg: dict[str, Any], report: Any) -> dict[str, Any]:
    """What a resume knows of the step total before its trainer logs (``{"total_steps": N | None}`` for its
    run.json record), or {} where the last attempt's total holds: a max_steps is the total, whatever the
    data; else a change to the data or to a key that decides the total (``TOTAL_KEYS``) leaves it unknown
    (None: status and the dashboard say "?") until the trainer has counted it; the old total would read
    as the new one (92 % done of an epoch count that changed)."""
    keys = {m.params.get("key") for m in report.config_changed}
    if not (keys & TOTAL_KEYS or report.data_changed):
        return {}
    max_steps = cfg.get("max_steps")
    return {"total_steps": int(max_steps) if max_steps else None}


def _being_resumed(run: RunDirectory, status: RunStatus) -> bool:
    """True while a resume is starting the run: queued by ``prepare_resume``, or the supervisor of an
    attempt a resume started getting going (two resumes that race: the second is told this). Every attempt
    after the first is a resume's: from a checkpoint, or from step 0 for a run that had none (its
    ``resume_from`` is empty, as the first attempt's)."""
    if status.status == QUEUED:
        return (status.reason_message or {}).get("key") in ("runs.reason_resuming", "runs.reason_restarting")
    if status.status == STARTING:
        attempts = run.read_record()[0].get("attempts")  # one that does not read: a resume cannot tell
        return isinstance(attempts, list) and bool(attempts) and isinstance(attempts[-1], dict) \
            and (len(attempts) > 1 or bool(attempts[-1].get("resume_from")))
    return False


def refuse_unresumable(run: RunDirectory) -> Any:
    """The run's status, if its state allows a resume and its run.json reads; else ``RunControlError``
    (active, finished, a run.json that does not read, a run of another host). Reads only: the first thing a resume says."""
    status = effective_status(run)
    if status.status in ACTIVE_STATES:
        key = "runs.resume_in_progress" if _being_resumed(run, status) else "runs.resume_running"
        raise RunControlError(t(key, id=run.id, status=state_label(status.status)), 2)
    if status.status == FINISHED:
        raise RunControlError(t("runs.resume_finished", id=run.id), 2)
    record, unreadable = run.read_launch_record()
    if unreadable:  # before anything is written: its GPUs unknown, the new attempt would train on the CPU
        raise RunControlError(t("runs.resume_record_unreadable", id=run.id, path=str(run.record_path),
                                reason=unreadable))
    host = foreign_host(record)
    if host is not None:  # its GPUs are another box's numbering: a trainer here would take this box's ones
        raise RunControlError(t("runs.resume_other_host", id=run.id, host=host), 2)
    if not run.checkpoints(complete_only=True) and not never_trained(run):  # said alone, not after warnings
        # about a resume that cannot be (one that never trained starts again from step 0: prepare_resume)
        raise RunControlError(t("runs.resume_no_checkpoint", id=run.id, path=str(run.checkpoints_dir),
                                config=str(run.config_path)), 2)  # a user error: nothing to resume from
    return status


def prepare_resume(run: RunDirectory, step: int | None = None, weights_only: bool = False,
                   config: Any = None, check_data: Callable[[], None] | None = None) -> ResumePlan:
    """Check that ``run`` can resume and mark it queued; returns the plan (checkpoint, notices).

    The newest checkpoint that passes ``verify_checkpoint`` is chosen (or checkpoint ``step``, refused if
    it does not pass); one with sound weights but no optimizer / scheduler state only with
    ``weights_only``, which restarts the optimizer and the LR schedule. The data and configuration are
    compared with the run's fingerprint: a missing dataset file refuses, a change is a notice. ``config``
    (a ``RunConfig``) replaces the run's config.yaml once every check has passed (key overrides).
    ``check_data`` (the data check of ``train``, raising ``RunError``) runs after a missing dataset file
    is refused and before anything is written for the resume.
    Nothing is removed without an event and a notice naming it.
    """
    status = refuse_unresumable(run)
    run.close_open_attempt(status.status)  # one whose end was recorded without closing it (older versions)
    notices: list[Message] = []
    check = _choose_checkpoint(run, step, weights_only, notices)
    checkpoint = check.checkpoint if check is not None else None
    from_step = checkpoint.step if checkpoint is not None else 0
    weights_only = weights_only and check is not None  # nothing to take weights from: a plain start
    cfg = config.to_dict() if config is not None else run.config()
    no_step_left = None if checkpoint is None else _no_step_left(run, cfg, checkpoint.step, checkpoint.path)
    if no_step_left is not None:  # before anything is written: the run stays as it was, resumable
        raise RunControlError(no_step_left, 2)
    moved = None if checkpoint is None else _batch_changed(run, cfg, checkpoint.step, checkpoint.path)
    if moved is not None:  # the data and the LR schedule would jump: refused, nothing written
        raise RunControlError(moved, 2)
    report = compare_fingerprint(run.path, cfg)
    if report.missing:  # the user's to restore or point at (dataset=): a user error, as data that does not load
        raise RunControlError(Message("resume.data_refused", id=run.id, problems=report.missing).text(), 2)
    if check_data is not None:  # data that does not load fails the trainer later: refused now, nothing written
        check_data()
    for kind, data in report.events:
        run.append_event(kind, **data)
    notices += report.warnings
    if report.events or not report.recorded:  # compare the next resume with what the rest trains on
        record_fingerprint(run.path, cfg)
    if check is not None and check.legacy:
        notices.append(Message("resume.legacy_marker", name=checkpoint.path.name))
    if weights_only:
        run.append_event("resume_weights_only", step=checkpoint.step, path=str(checkpoint.path),
                         missing=[p.file for p in check.problems])
        notices.append(Message("resume.weights_only", name=checkpoint.path.name))
    # Leftovers of the dead attempt (half-written, or renamed but never marked) must not linger: the
    # trainer would meet them at the same steps. Each is named in an event and a notice before it goes.
    for leftover in run.checkpoints(complete_only=False):
        if not leftover.complete:
            size = directory_size(leftover.path)
            run.append_event("checkpoint_removed", path=str(leftover.path), why="incomplete", bytes=size)
            notices.append(Message("resume.removed_incomplete", name=leftover.path.name, size=format_bytes(size)))
            shutil.rmtree(leftover.path, ignore_errors=True)
    behind = run.left_behind() if step is None else {}  # told above, as passed over
    newer = [c.checkpoint.path.name for c in resume_candidates(run.checkpoints_dir)
             if c.checkpoint.step > from_step and c.checkpoint.step not in behind]
    if newer:
        notices.append(Message("resume.newer_kept", name=checkpoint.path.name, newer=", ".join(newer)))
    if config is not None:
        config.save(run.config_path)
        run.append_event("config_overridden", keys=[m.params.get("key") for m in report.config_changed])
    record = run.record()
    resumes = list(record.get("resumes") or [])
    total = _total_after(cfg, report)
    resumes.append({"time": utc_now_iso(), "ts": time.time(), "checkpoint": str(checkpoint.path) if checkpoint else None,
                    "checkpoint_ts": written_at(checkpoint.path) if checkpoint else None, "step": from_step,
                    "previous_status": status.status, "weights_only": weights_only,
                    "notices": [n.english() for n in notices], **total})
    changes: dict[str, Any] = {}
    if config is not None:  # a model or dataset that moved: the list and status show where it trains from now
        from core.runs.launch import config_summary

        name = (record.get("config_summary") or {}).get("name") or cfg.get("name") or ""
        changes["config_summary"] = config_summary(str(name), cfg)
    # Forget the old supervisor: its pid must not be mistaken for the new one's.
    run.update_record(resumes=resumes, supervisor=None, trainer=None, **changes)
    run.write_status(QUEUED, Message("runs.reason_resuming", step=from_step) if checkpoint is not None
                     else Message("runs.reason_restarting"))
    return ResumePlan(str(checkpoint.path) if checkpoint is not None else None, from_step, weights_only, notices)


__all__ = ["ResumePlan", "RunControlError", "StopResult", "prepare_resume", "refuse_unresumable", "request_stop",
           "wait_for_end", "STOPPED"]
