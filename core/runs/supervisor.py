"""The supervisor of one run: ``python -m core.runs.supervisor RUN_DIR [--resume CHECKPOINT]``.

It is started detached (own session) by ``tunedeck train`` / ``resume`` / ``demo --detach``, or in the
foreground by ``tunedeck demo --headless``. For its whole life it holds an exclusive ``flock`` on
``RUN_DIR/lock`` (that is how everyone else knows it is alive), records its pid and start time in
run.json, starts the trainer as its child — ``python -m core.train.worker`` for one GPU or the CPU,
``torchrun`` for several GPUs or nodes — prefixes every output line with its rank into ``train.log``,
relays SIGTERM/SIGINT to the trainer processes (which then save a checkpoint and exit), and records the
exit code and the final status atomically.

The trainer is started with ``PR_SET_PDEATHSIG=SIGKILL``: if the supervisor is killed, the trainer dies
too, so a crashed run never has an orphan trainer still writing into its directory (a new supervisor
started by ``resume`` can trust the directory).

A full disk does not kill it: it writes ``RUN_DIR/.reserve`` (1 MiB) at the start; when a line no longer
fits in train.log it keeps the trainer's last lines in memory (and tries the disk again now and then),
and at the end it deletes the reserve if need be, so that the final status, its event and those last
lines reach the disk (see ``core.runs.disk_space``).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.i18n import Message, stored_reason
from core.listen import free_port
from core.runs.disk_space import create_reserve, disk_full_reason, free_bytes, is_disk_full, release_reserve
from core.runs.heartbeat import clear_heartbeats
from core.runs.jsonl import append_line
from core.runs.run_dir import (
    ACTIVE_STATES,
    FAILED,
    FINISHED,
    QUEUED,
    STARTING,
    STOPPED,
    STOPPING,
    RunDirectory,
    utc_now_iso,
)

EXIT_LOCKED = 3
# Lines kept in memory while train.log cannot grow (a full disk), and how often the disk is tried again.
HELD_LINES = 400
DISK_RETRY_S = 5.0
CPU_PROCESSES_ENV = "TUNEDECK_CPU_PROCESSES"
_PR_SET_PDEATHSIG = 1
_TORCHRUN_PREFIX = re.compile(r"^\[default(\d+)\]:")
# torchrun's summary of the workers that failed, a block each: "  time      : 2026-12-07_00:03:10",
# "  rank      : 1 (local_rank: 1)" (the global rank), "  exitcode  : -9 (pid: 23548)  (SIGKILL)".
_SUMMARY_TIME = re.compile(r"^\s*time\s*:\s*(\S+)")
_SUMMARY_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\b")
_SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\b")


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def visible_devices(gpus: list[int], inherited: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for the trainer: the run's GPU indices, counted within what we were given.

    Indices in run.json are positions among the GPUs visible to ``tunedeck train``; if that already ran
    under CUDA_VISIBLE_DEVICES=2,3, index 0 is physical GPU 2. No GPUs: "" (a CPU run grabs none).
    """
    from core.runs.gpus import physical_gpus

    return ",".join(physical_gpus(gpus, inherited))  # no GPUs: ""


def trainer_env(inherited: Mapping[str, str], run_path: Path, attempt: int, gpus: list[int]) -> dict[str, str]:
    """The trainer's environment: ``inherited`` with the run's directory, attempt and GPUs. A run without GPUs has
    its OpenMP threads sleep while they wait (``OMP_WAIT_POLICY=PASSIVE``, unless set): spinning, two CPU runs on one
    box's cores (or a run and the wizard's probe) slowed each other ~8x more than sharing them costs (two tiny runs
    on 2 cores: 50-60 steps each in 35 s, against ~430 passive and 540 alone)."""
    env = dict(inherited)
    env["TUNEDECK_RUN_DIR"] = str(run_path)
    env["TUNEDECK_ATTEMPT"] = str(attempt)
    env["PYTHONUNBUFFERED"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = visible_devices(gpus, env.get("CUDA_VISIBLE_DEVICES"))
    if not gpus:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def trainer_command(run: RunDirectory, resume_from: str | None, record: dict[str, Any]) -> tuple[list[str], int, int]:
    """The trainer command line, the number of processes on this node and the global rank offset, for the
    run whose run.json is ``record`` (its GPUs, its distributed settings)."""
    gpus = list(record.get("gpus") or [])
    dist = record.get("distributed") or {}
    nnodes = int(dist.get("nnodes", 1) or 1)
    node_rank = int(dist.get("node_rank", 0) or 0)
    nproc = max(1, len(gpus))
    if not gpus:
        # Several CPU processes (DDP over gloo): how the multi-process path is tested without GPUs.
        nproc = max(1, int(os.environ.get(CPU_PROCESSES_ENV, "1") or 1))
    worker = ["-m", "core.train.worker", str(run.path)]
    if resume_from:
        worker += ["--resume", resume_from]
    zero_stage = int((run.config() or {}).get("zero_stage") or 0)
    # DeepSpeed needs the distributed environment torchrun sets up, even for a single GPU.
    if nproc == 1 and nnodes == 1 and zero_stage == 0:
        return [sys.executable, *worker], 1, 0
    # Single node only (several nodes must be told one port): a free loopback port, picked as the model
    # server's are (core.listen.free_port).
    port = int(dist.get("master_port") or 0) or free_port("127.0.0.1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc_per_node={nproc}", f"--nnodes={nnodes}", f"--node_rank={node_rank}",
        f"--master_addr={dist.get('master_addr') or '127.0.0.1'}", f"--master_port={port}",
        "--tee=3", f"--log_dir={run.path / 'ranks'}",
        *worker,
    ]
    return cmd, nproc, node_rank * nproc


class Supervisor:
    def __init__(self, run: RunDirectory, resume_from: str | None = None) -> None:
        self.run = run
        self.resume_from = resume_from
        self.child: subprocess.Popen | None = None
        self.stop_requests = 0
        self.stop_to_record = ""  # the first stop's signal, until "stopping" and its event are written
        self.writing = 0  # inside a write that holds one of the run's file locks (``_holding_locks``)
        self.lock_fd: int | None = None
        self.rank_offset = 0
        self.multi_process = False
        self.disk_full = False  # a write of ours met a full disk during this attempt
        self.held: deque[str] = deque(maxlen=HELD_LINES)  # train.log lines waiting for room
        self.held_dropped = 0
        self.next_disk_try = 0.0
        # train.log refused a write for another reason than a full disk (its permissions, a read-only file
        # bind-mounted over it): the lines are dropped (counted) and the file tried again every DISK_RETRY_S.
        self.log_error: str | None = None
        self.log_error_said = False
        self.log_dropped = 0
        self.next_log_try = 0.0
        # torchrun's summary of its failed workers: rank -> (time, exit code; a signal's as its negative)
        self.failed_ranks: dict[int, tuple[str, int]] = {}
        self._summary_time = ""
        self._summary_rank: int | None = None

    # -- logging -----------------------------------------------------------------------------------
    def log(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            self._write_line(f"[supervisor] {line}")

    def _write_line(self, line: str) -> None:
        """One line into train.log; on a full disk it waits in memory (the newest ``HELD_LINES``); a log that
        cannot be written for another reason loses it (``_log_unwritable``), and the run goes on."""
        with self._holding_locks():
            if self.held and not self._flush_held(force=False):
                self._hold(line)
                return
            if self.log_error is not None and time.monotonic() < self.next_log_try:
                self.log_dropped += 1
                return
            try:
                if self.log_error is not None:  # writable again: say first what was lost
                    append_line(self.run.log_path, f"[supervisor] {self.log_dropped} lines could not be written to "
                                                   f"{self.run.log_path}: {self.log_error}")
                    self.log_error, self.log_dropped = None, 0
                append_line(self.run.log_path, line)
            except OSError as exc:
                if not is_disk_full(exc):
                    self._log_unwritable(exc)
                    self.log_dropped += 1
                    return
                self.disk_full = True
                self.next_disk_try = time.monotonic() + DISK_RETRY_S
                self._hold(line)

    def _log_unwritable(self, exc: OSError) -> None:
        """train.log refused a write (not for a full disk): a healthy run must not die of its log file, so the
        lines are dropped until it takes them again, and why is said once, in events.jsonl and supervisor.log.
        A run folder that cannot be written at all raises: nothing of the run can be recorded, and readers
        say why (``core.runs.liveness.unrecorded_crash_reason``)."""
        if not os.access(self.run.path, os.W_OK):
            raise exc
        self.next_log_try = time.monotonic() + DISK_RETRY_S
        self.log_error = exc.strerror or str(exc)
        if self.log_error_said:
            return
        self.log_error_said = True
        print(f"cannot write {self.run.log_path}: {self.log_error}; the run goes on, its log lines are lost until "
              "the file can be written again", file=sys.stderr, flush=True)
        try:
            self.run.append_event("log_unwritable", path=str(self.run.log_path), error=self.log_error)
        except OSError:
            pass  # supervisor.log has it

    def _hold(self, line: str) -> None:
        if len(self.held) == self.held.maxlen:
            self.held_dropped += 1
        self.held.append(line)

    def _flush_held(self, force: bool) -> bool:
        """Write the held lines (every ``DISK_RETRY_S``, or now with ``force``); True when none are left."""
        if not self.held:
            return True
        if not force and time.monotonic() < self.next_disk_try:
            return False
        with self._holding_locks():
            try:
                if self.held_dropped:
                    append_line(self.run.log_path, f"[supervisor] disk full: {self.held_dropped} earlier lines lost")
                    self.held_dropped = 0
                while self.held:
                    append_line(self.run.log_path, self.held[0])
                    self.held.popleft()
            except OSError as exc:
                if not is_disk_full(exc):  # no longer full, but refused: the held lines are lost with the others
                    self._log_unwritable(exc)
                    self.log_dropped += len(self.held)
                    self.held.clear()
                    return True
                self.next_disk_try = time.monotonic() + DISK_RETRY_S
                return False
            return True

    def _durably(self, action: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a write of the run's records; on a full disk free the reserve and try once more."""
        with self._holding_locks():
            try:
                return action(*args, **kwargs)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                self.disk_full = True
                release_reserve(self.run.path)
            try:
                return action(*args, **kwargs)
            except OSError as exc:
                if not is_disk_full(exc):
                    raise
                print(f"cannot record {getattr(action, '__name__', action)} in {self.run.path}: {exc}",
                      file=sys.stderr, flush=True)
                return None

    def _record(self, **changes: Any) -> None:
        """``update_record`` once the trainer has started: a run.json that cannot be read or written (its
        permissions changed; a full disk is ``_durably``'s) is said in train.log and goes no further. Raised,
        it ended the supervisor, which takes the trainer with it (parent-death signal) and recorded a
        finished attempt as failed ("supervisor error"). A corrupt run.json is kept aside by update_record."""
        try:
            self._durably(self.run.update_record, **changes)
        except OSError as exc:
            self.log(f"cannot record {', '.join(sorted(changes))} in {self.run.record_path}: {exc}; the run goes on")

    def _relay_line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        match = _TORCHRUN_PREFIX.match(text)
        if match:
            rank = self.rank_offset + int(match.group(1))
            text = f"[rank{rank}] {text[match.end():]}"
        elif self.multi_process:
            self._note_killed_rank(text)
            text = f"[launcher] {text}"
        else:
            text = f"[rank0] {text}"
        self._write_line(text)

    def _note_killed_rank(self, text: str) -> None:
        """Read torchrun's summary of the workers that failed (see ``_SUMMARY_EXIT``) into ``failed_ranks``."""
        if match := _SUMMARY_TIME.match(text):
            self._summary_time = match.group(1)
        elif match := _SUMMARY_RANK.match(text):
            self._summary_rank = int(match.group(1))
        elif (match := _SUMMARY_EXIT.match(text)) and self._summary_rank is not None:
            self.failed_ranks[self._summary_rank] = (self._summary_time, int(match.group(1)))
            self._summary_rank = None

    def _with_killed_rank(self, status: str, reason: str | Message) -> str | Message:
        """A multi-process attempt that failed because a worker was killed (the host's OOM killer, kill -9):
        the reason names that rank first. The others then fail on the lost connection ("Connection reset by
        peer", an NCCL timeout), and rank 0's error, which the trainer records, blamed the wrong process.
        Only a worker killed among the first failures counts: once one fails torchrun stops the others
        itself (SIGTERM, SIGKILL 30 s later) and lists them too."""
        if status != FAILED or self.stop_requests or not self.failed_ranks:
            return reason
        first = min(when for when, _code in self.failed_ranks.values())
        killed = sorted(rank for rank, (when, code) in self.failed_ranks.items()
                        if when == first and code < 0 and -code != signal.SIGTERM)
        if not killed:
            return reason
        number = -self.failed_ranks[killed[0]][1]
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
        return Message("runs.reason_rank_signal", rank=killed[0], signal=name, then=reason)

    # -- signals -----------------------------------------------------------------------------------
    def _trainer_processes(self) -> list[Any]:
        """The processes that run the training loop: the child itself, or torchrun's workers."""
        import psutil

        if self.child is None:
            return []
        try:
            parent = psutil.Process(self.child.pid)
        except psutil.NoSuchProcess:
            return []
        if not self.multi_process:
            return [parent]
        return parent.children(recursive=False)  # torchrun's workers (not their helper processes)

    def _on_stop_signal(self, signum: int, _frame: Any) -> None:
        self.stop_requests += 1
        if self.stop_requests == 1:
            self.stop_to_record = signal.Signals(signum).name
            if not self.writing:
                self._record_stop_request()
        self._relay(signal.SIGTERM)

    def _record_stop_request(self) -> None:
        """"stopping", the ``stop_requested`` event and the log line of the first stop signal."""
        name, self.stop_to_record = self.stop_to_record, ""
        self._durably(self.run.transition, STOPPING, Message("runs.reason_stop_requested"), only_from=ACTIVE_STATES)
        self._durably(self.run.append_event, "stop_requested", signal=name)
        self.log(f"{name} received: asking the trainer to save a checkpoint and stop")

    @contextmanager
    def _holding_locks(self) -> Iterator[None]:
        """A write of train.log, events.jsonl, status.json or run.json: each is written under an ``flock``, and
        such a lock belongs to the open file, not to the process. The stop handler runs in this thread, between
        two bytecodes of whatever it interrupted: its own write, on another open file, waited for the lock the
        interrupted write held, for ever; the trainer was never told and the run stayed "stopping". A stop that
        comes during such a write is recorded as the write ends (the trainer is told at once)."""
        self.writing += 1
        try:
            yield
        finally:
            self.writing -= 1
            if not self.writing and self.stop_to_record:
                self._record_stop_request()

    def _relay(self, sig: int) -> None:
        import psutil

        for proc in self._trainer_processes():
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    # -- life --------------------------------------------------------------------------------------
    def acquire_lock(self, patience_s: float = 3.0) -> bool:
        """Take the run's lock. Liveness checks (``tunedeck runs``, the app) hold it for microseconds,
        so a busy lock is retried for a moment; one held longer belongs to another supervisor."""
        fd = os.open(self.run.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + patience_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                if time.monotonic() > deadline:
                    os.close(fd)
                    return False
                time.sleep(0.02)
        self.lock_fd = fd
        return True

    def run_to_end(self) -> int:
        """Supervise one attempt; returns the supervisor's exit code (0 = the run finished or stopped)."""
        import psutil

        if not self.acquire_lock():
            print(f"another supervisor holds {self.run.lock_path}", file=sys.stderr)
            return EXIT_LOCKED
        me = psutil.Process(os.getpid())
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if self.run.status().status not in (QUEUED, STARTING):  # stopped while queued (stop --force): not started
            return self._not_queued_any_more()
        record, unreadable = self.run.read_launch_record()
        if unreadable:  # before anything is written: a corrupt one is not set aside
            return self._refuse_start(unreadable)
        attempts = list(record.get("attempts") or [])
        attempt = {"number": len(attempts) + 1, "started": utc_now_iso(), "resume_from": self.resume_from}
        attempts.append(attempt)
        with self._holding_locks():
            record = self.run.update_record(
                supervisor={"pid": me.pid, "start_time": me.create_time(), "host": socket.gethostname()},
                attempts=attempts,
            )
            starting = self.run.transition(STARTING, "", only_from={QUEUED, STARTING})
            if not starting:  # a stop since the check above
                self.run.close_open_attempt(self.run.status().status)
        if not starting:
            return self._not_queued_any_more()
        try:
            self.run.outcome_path.unlink()
        except FileNotFoundError:
            pass
        clear_heartbeats(self.run.path)  # an earlier attempt's trainer must not count as this one's
        create_reserve(self.run.path)
        cmd, nproc, self.rank_offset = trainer_command(self.run, self.resume_from, record)  # as just written
        self.multi_process = nproc > 1 or cmd[1:3] == ["-m", "torch.distributed.run"]
        env = trainer_env(os.environ, self.run.path, attempt["number"], record.get("gpus") or [])
        self.log(f"attempt {attempt['number']}: {' '.join(cmd)}")
        started = time.time()
        self.child = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            close_fds=True,
            env=env,
            cwd=str(self.run.path),
            preexec_fn=set_parent_death_signal,
        )
        try:
            child_proc = psutil.Process(self.child.pid)
            self._record(trainer={"pid": self.child.pid, "start_time": child_proc.create_time()})
        except psutil.NoSuchProcess:
            pass
        if self.stop_requests:  # a stop that arrived while we were starting
            self._relay(signal.SIGTERM)
        assert self.child.stdout is not None
        pending = b""
        while True:
            chunk = self.child.stdout.read1(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._relay_line(line)
        if pending:
            self._relay_line(pending)
        code = self.child.wait()
        status, reason = self.final_status(code)
        reason = self._with_killed_rank(status, reason)
        if self.disk_full and status == FAILED and not _is_disk_full_reason(reason):
            # The trainer left no verdict of its own about it, but we saw the disk fill up.
            reason = disk_full_reason(self.run.path, None, free_bytes(self.run.path), self.run.id)
        elapsed = round(time.time() - started, 1)
        attempt.update({"ended": utc_now_iso(), "exit_code": code, "status": status, "elapsed_s": elapsed})
        # Each write frees the reserve on a full disk if it must (_durably). The status goes last: a reader
        # that sees the final status finds the attempt, the final event and the whole log already written.
        self._record(attempts=attempts)
        # The reason is a Message where we know its key: status.json and the event keep it as data next
        # to the English text, and each reader shows it in its own language (see RunStatus.reason_text).
        fields = stored_reason(reason)
        self._durably(self.run.append_event, status, exit_code=code, **fields)
        if self.held:  # the trainer's last lines, kept while train.log could not grow
            release_reserve(self.run.path)
            self._flush_held(force=True)
        english = fields["reason"]
        self.next_log_try = 0.0  # a train.log that refused lines: try it again now for the last ones
        self.log(f"trainer exited with code {code}: {status}{' — ' + english if english else ''}")
        self._durably(self.run.write_status, status, reason)
        self._flush_held(force=True)
        release_reserve(self.run.path)  # this attempt is over; the next one writes its own
        sys.stdout.flush()
        sys.stderr.flush()
        return 0 if status in (FINISHED, STOPPED) else 1

    def _not_queued_any_more(self) -> int:
        """No trainer for a run that is no longer queued when its supervisor takes the lock: a ``stop --force``
        that came while a ``train``/``resume`` was starting it found nothing to kill and wrote "stopped", and
        this supervisor then trained on under that status (its switch to "starting" refused, unseen). The run
        stays as the stop left it; train.log and supervisor.log say why nothing ran. Exit 0: nothing failed."""
        state = self.run.status().status
        why = " (stopped before its supervisor started)" if state == STOPPED else ""
        said = f"not started: the run is {state}{why}"
        self.log(said)
        print(said, file=sys.stderr, flush=True)  # supervisor.log, whose tail `train`/`resume` show for an early exit
        return 0

    def _refuse_start(self, unreadable: str) -> int:
        """No trainer when run.json does not read: its GPUs unknown, CUDA_VISIBLE_DEVICES would be "" and
        the run would train on the CPU. The run is failed with a reason that names the file and what to do
        (status.json, events.jsonl, train.log) and supervisor.log, whose tail ``tunedeck train`` / ``resume``
        and the app show for a supervisor that exits at once, ends with it."""
        key = "runs.reason_record_unreadable_resume" if self.resume_from else "runs.reason_record_unreadable"
        reason = Message(key, path=str(self.run.record_path), reason=unreadable, id=self.run.id)
        english = reason.english()
        self.log(english)
        self._durably(self.run.append_event, FAILED, exit_code=None, **stored_reason(reason))
        self._durably(self.run.write_status, FAILED, reason)
        print(english, file=sys.stderr, flush=True)
        return 1

    def final_status(self, code: int) -> tuple[str, str | Message]:
        """What the attempt ended as: the trainer's own verdict (outcome.json) or the exit code's."""
        outcome = _read_json(self.run.outcome_path)
        if outcome and outcome.get("status") in (FINISHED, STOPPED, FAILED):
            status = str(outcome["status"])
            # A signal we relayed for a stop can land after the trainer recorded its outcome: keep it.
            killed_by_our_stop = code < 0 and self.stop_requests > 0
            if status == FINISHED and code != 0 and not killed_by_our_stop:
                return FAILED, Message("runs.reason_exit_code", code=code)
            # The trainer's own reason: its message record when it wrote one, else its text (older trainers).
            return status, Message.from_record(outcome.get("reason_message")) or str(outcome.get("reason", ""))
        from core.runs.liveness import exit_reason, stopped_early_reason

        if code < 0 and self.stop_requests and -code in (signal.SIGTERM, signal.SIGKILL):
            # Killed by the stop before its handler was in place (its first moments): this attempt saved
            # nothing, but a resumed run keeps its earlier checkpoints.
            return STOPPED, stopped_early_reason(self.run)
        if self.stop_requests and code == 0:
            return STOPPED, ""
        return FAILED, exit_reason(code)


def _is_disk_full_reason(reason: str | Message) -> bool:
    return isinstance(reason, Message) and reason.key.startswith("runs.reason_disk_full")


def _read_json(path: Path) -> dict[str, Any] | None:
    import json

    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def supervise(run_dir: Path | str, resume_from: str | None = None) -> int:
    """Run the supervisor in this process (``demo --headless`` does; detached runs use ``main``)."""
    os.umask(0o077)  # everything the run writes is private to the user (0700 dirs, 0600 files)
    run = RunDirectory(Path(run_dir))
    return Supervisor(run, resume_from).run_to_end()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.runs.supervisor")
    parser.add_argument("run_dir")
    parser.add_argument("--resume", default=None, help="checkpoint directory to resume from")
    args = parser.parse_args(argv)
    try:
        return supervise(args.run_dir, args.resume)
    except Exception as exc:
        # Whatever broke, leave a final status behind rather than a run stuck in "starting"; on a full
        # disk the reserve makes room for it and for the traceback in supervisor.log. A stop now has nothing left
        # to stop, and its handler's writes would wait for the status lock this write holds (_holding_locks).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        run = RunDirectory(Path(args.run_dir))
        if is_disk_full(exc):
            release_reserve(run.path)
            reason = disk_full_reason(run.path, None, free_bytes(run.path), run.id)
        else:
            reason = Message("runs.reason_supervisor_error", error=str(exc))
        try:
            run.write_status(FAILED, reason)
        except OSError as write_error:
            print(f"cannot record the final status in {run.status_path}: {write_error}", file=sys.stderr)
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
