"""Downloads that outlive the terminal: a detached downloader process per model, resumable.

A download is a folder ``<data root>/downloads/<hub>--<owner>--<name>/`` holding

- ``job.json``        what to fetch: hub, model, revision, target folder, files with sizes and sha256;
- ``state.json``      progress, replaced atomically (bytes, rate, ETA, the file being fetched, status);
- ``events.jsonl``    one line per file started/finished, retry, end;
- ``lock``            held (flock) by the running downloader: liveness without trusting a pid file;
- ``start.lock``      held (flock) while a download is looked for and started: one start at a time;
- ``cancel``          present = the downloader stops at the next chunk;
- ``downloader.log``  the process's own stderr.

The downloader writes each file to ``<name>.part`` next to its final place and resumes it with an
HTTP ``Range`` request, both after a dropped connection (in-process retries) and after the process
itself was killed (the next start finds the ``.part``). Sizes, and sha256 where the hub gives one, are
checked before a file takes its final name. The token travels in the child's environment only.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.atomic_file import write_json_atomic
from core.hub.errors import DownloadError, NotEnoughDiskError, NothingSelectedError
from core.hub.records import ModelDetails, RepoFile
from core.i18n import t
from core.paths import data_root, ensure_private_dir, nearest_existing_dir

SCHEMA = 1
TOKEN_ENV = "TUNEDECK_HUB_TOKEN"
LANGUAGE_ENV = "TUNEDECK_DOWNLOADER_LANG"  # the language its messages (why it failed) are written in
PART_SUFFIX = ".part"
CHUNK_BYTES = 64 * 1024
STATE_INTERVAL_S = 0.25
MAX_STALLED_ATTEMPTS = 6  # consecutive failures without a byte of progress before giving up
DISK_SLACK_BYTES = 64 * 1024**2  # keep this much free after the download
# "unreadable": the record's state.json or job.json holds a value that is no number where one belongs (edited by
# hand): said of that download alone (``read_status``), the others listed as ever.
STATUSES = ("queued", "running", "done", "failed", "cancelled", "interrupted", "unreadable")
STALL_AFTER_S = 5.0  # no progress written for this long while running: the line says the link is stalled
SPAWNED_FILE = "spawned.json"  # the downloader start_download started: alive and not yet locked = queued


def download_state_label(status: str) -> str:
    """A download's status in the interface language (--json keeps the value; an unknown one as it is)."""
    return t(f"hub.download.state.{status}") if status in STATUSES else status


def downloads_dir() -> Path:
    return data_root() / "downloads"


def job_dir_for(hub: str, model_id: str) -> Path:
    return downloads_dir() / f"{hub}--{model_id.replace('/', '--')}"


def human_bytes(value: float | None) -> str:
    """A download's or a model's size on disk: ``core.units.format_disk`` (decimal, as the hubs count)."""
    from core.units import format_disk

    return format_disk(value)


# --- planning --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DownloadPlan:
    """What a download will fetch, where to, and how much of it is already on disk."""

    hub: str
    model_id: str
    endpoint: str
    revision: str
    target_dir: Path
    files: tuple[RepoFile, ...]
    skipped: tuple[RepoFile, ...]
    urls: tuple[str, ...]

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.files)

    def present_bytes(self) -> int:
        """Bytes already there: complete files and the partial ``.part`` ones."""
        done = 0
        for item in self.files:
            final = self.target_dir / item.path
            part = final.with_name(final.name + PART_SUFFIX)
            if final.is_file() and final.stat().st_size == item.size:
                done += item.size
            elif part.is_file():
                done += min(part.stat().st_size, item.size)
        return done

    def complete(self) -> bool:
        """Every file of the plan is in its final place at its full size: nothing to fetch."""
        return all((self.target_dir / item.path).is_file()
                   and (self.target_dir / item.path).stat().st_size == item.size for item in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "hub": self.hub, "model_id": self.model_id, "endpoint": self.endpoint,
            "revision": self.revision, "target_dir": str(self.target_dir),
            "files": [{**item.to_json(), "url": url} for item, url in zip(self.files, self.urls, strict=True)],
            "skipped": [item.to_json() for item in self.skipped],
        }


def plan_download(source: Any, details: ModelDetails, include: list[str] | None = None,
                  paths: list[str] | None = None) -> DownloadPlan:
    """The files to fetch for ``details`` (one weight format unless ``include`` names patterns); ``paths``:
    exactly the files of that name (a resumed download's own choice, ``recorded_files``)."""
    from core.hub.file_selection import select_files

    if paths:
        wanted = set(paths)
        chosen = [item for item in details.files if item.path in wanted]
        skipped = [item for item in details.files if item.path not in wanted]
    else:
        chosen, skipped = select_files(details.files, include)
    if not chosen:
        # the user's patterns matching nothing are a wrong request (exit 2), not a hub failure
        error = NothingSelectedError if include and not paths else DownloadError
        raise error(t("hub.download.nothing_selected", model=details.summary.model_id,
                      patterns=", ".join(include or paths or []) or "-"))
    model_id = details.summary.model_id
    return DownloadPlan(
        hub=source.hub, model_id=model_id, endpoint=source.endpoint, revision=details.revision,
        target_dir=Path(source.model_dir(model_id, details.revision)), files=tuple(chosen),
        skipped=tuple(skipped), urls=tuple(source.file_url(model_id, f.path, details.revision) for f in chosen),
    )


def free_bytes_at(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    return shutil.disk_usage(nearest_existing_dir(path)).free


def check_disk(plan: DownloadPlan, advice: str = "cli") -> int:
    """Raise ``NotEnoughDiskError`` with the numbers when the rest of the download would not fit; its
    advice for where the download was asked for (``cli``: --include; ``app``: the app has no --include).
    A download of the same model already running is never refused: ``start_download`` attaches to it, and the
    space it has taken so far is its own, not a shortage."""
    if download_running(job_dir_for(plan.hub, plan.model_id)):
        return 0
    needed = plan.total_bytes - plan.present_bytes()
    free = free_bytes_at(plan.target_dir)
    if needed + DISK_SLACK_BYTES > free:
        raise NotEnoughDiskError(
            t("hub.download.no_space", model=plan.model_id, needed=human_bytes(needed), free=human_bytes(free),
              path=str(plan.target_dir), slack=human_bytes(DISK_SLACK_BYTES))
            + " " + t(f"hub.download.no_space_advice.{advice}"), needed, free)
    return needed


# --- status ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DownloadStatus:
    """A download's state as the downloader last wrote it, with liveness checked now."""

    job_dir: Path
    hub: str
    model_id: str
    target_dir: str
    status: str
    bytes_done: int
    bytes_total: int
    current_file: str | None
    rate_bps: float
    eta_s: float | None
    files_done: int
    files_total: int
    error: str | None
    pid: int | None
    updated: float
    retry_attempt: int | None = None  # while the downloader tries a dropped link again: the attempt it is at
    retry_reason: str | None = None  # ... and the error that dropped it, in short
    verifying: bool = False  # the current file is whole and its sha256 being checked (no byte comes meanwhile)

    @property
    def retrying(self) -> bool:
        return self.active and self.retry_attempt is not None

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else (1.0 if self.status == "done" else 0.0)

    @property
    def active(self) -> bool:
        return self.status in ("queued", "running")

    def stalled_s(self, now: float | None = None) -> float | None:
        """Seconds since the downloader last wrote progress (it writes with every chunk) when that is
        ``STALL_AFTER_S`` or more while it runs: the hub holds the transfer. None otherwise, and while it tries
        again or checks a file's checksum (said as such)."""
        if self.status != "running" or self.retrying or self.verifying or not self.updated:
            return None
        waited = (time.time() if now is None else now) - self.updated
        return waited if waited >= STALL_AFTER_S else None

    @property
    def target_gone(self) -> bool:
        """A finished download whose folder is no longer there (deleted by hand: ``models rm`` and the app's x
        remove the record too): "done" is no longer true of it."""
        return self.status == "done" and bool(self.target_dir) and not Path(self.target_dir).exists()

    def to_json(self) -> dict[str, Any]:
        data = {key: value for key, value in self.__dict__.items() if key != "job_dir"}
        data["job_dir"] = str(self.job_dir)
        data["target_exists"] = bool(self.target_dir) and Path(self.target_dir).exists()
        return data


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def downloader_alive(job_dir: Path) -> bool:
    """True while a downloader holds the job's lock. Looked at with a shared lock: two readers looking at the
    same instant (the app's screen and ``models list``) never take each other for a downloader."""
    lock_path = job_dir / "lock"
    if not lock_path.exists():
        return False
    with open(lock_path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _spawned_downloader(job_dir: Path) -> bool | None:
    """Whether the downloader ``start_download`` spawned for ``job_dir`` still lives (a zombie or a reused
    pid does not: ``core.runs.liveness.same_process_alive``); ``None`` when no spawn was recorded."""
    from core.runs.liveness import same_process_alive

    spawned = _read_json(job_dir / SPAWNED_FILE)
    if not spawned or not isinstance(spawned.get("pid"), int):
        return None
    return same_process_alive(spawned["pid"], spawned.get("started_at"))


def _gone_downloader_status(job_dir: Path, state: dict[str, Any]) -> str:
    """The status of a job whose downloader holds no lock, from its state read after that was known."""
    status = str(state.get("status") or "queued")
    if status not in ("queued", "running"):
        return status
    spawned = _spawned_downloader(job_dir)
    if status == "running" or spawned is False:
        return "interrupted"
    if spawned is None:
        # No record of the process (a job written before the record existed): queued and never
        # started is only a moment after spawning; long after it, the process is gone.
        started = _number(state, "updated", float, "state.json") or (job_dir / "job.json").stat().st_mtime
        return "interrupted" if time.time() - started > 10 else status
    # The downloader is alive and has not taken the lock yet (its interpreter is starting, which takes
    # seconds on a loaded box): still queued, however long that takes.
    return status


class _BadNumber(ValueError):
    """A value of a download's record that is no number where one belongs."""

    def __init__(self, file: str, key: str, value: object) -> None:
        super().__init__(key)
        self.file, self.key, self.value = file, key, value


def _number(data: dict[str, Any], key: str, kind: type, file: str) -> Any:
    """``data[key]`` as ``kind`` (int or float); a missing or empty one is None; else ``_BadNumber``."""
    value = data.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise _BadNumber(file, key, value)
    try:
        number = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise _BadNumber(file, key, value) from None
    if number != number or number in (float("inf"), float("-inf")):  # NaN, infinity: no count of bytes
        raise _BadNumber(file, key, value)
    return number


def read_status(job_dir: Path) -> DownloadStatus | None:
    """The status of the download in ``job_dir``; ``None`` if there is none. A record holding a value that is
    no number where one belongs (state.json or job.json edited by hand) reads "unreadable", its ``error`` naming
    the file, the key and what to do: ``list_downloads``, ``models list`` and the app crashed on it."""
    job = _read_json(job_dir / "job.json")
    if job is None:
        return None
    try:
        return _read_status(job_dir, job)
    except _BadNumber as bad:
        from core.hub.local import download_command

        hub, model_id = str(job.get("hub") or "?"), str(job.get("model_id") or "?")
        return DownloadStatus(
            job_dir=job_dir, hub=hub, model_id=model_id, target_dir=str(job.get("target_dir") or ""),
            status="unreadable", bytes_done=0, bytes_total=0, current_file=None, rate_bps=0.0, eta_s=None,
            files_done=0, files_total=0, pid=None, updated=0.0,
            error=t("hub.download.unreadable", path=str(job_dir / bad.file), key=bad.key,
                    value=json.dumps(bad.value, ensure_ascii=False)[:80], command=download_command(model_id, hub),
                    folder=str(job_dir)))


def _read_status(job_dir: Path, job: dict[str, Any]) -> DownloadStatus:
    state = _read_json(job_dir / "state.json") or {}
    status = str(state.get("status") or "queued")
    if status in ("queued", "running") and not downloader_alive(job_dir):
        # The downloader may have written its last state and exited between the read and the check:
        # read again now that it is known gone, or a finished download reads "interrupted".
        state = _read_json(job_dir / "state.json") or state
        status = _gone_downloader_status(job_dir, state)
    retry = state.get("retry") if isinstance(state.get("retry"), dict) else {}
    files = job.get("files") if isinstance(job.get("files"), list) else []

    def number(key: str, kind: type = int) -> Any:
        return _number(state, key, kind, "state.json")

    def job_total() -> int:
        return sum(_number(item, "size", int, "job.json") or 0 for item in files if isinstance(item, dict))

    attempt = _number(retry, "attempt", int, "state.json")
    return DownloadStatus(
        job_dir=job_dir, hub=job.get("hub", "?"), model_id=job.get("model_id", "?"),
        target_dir=job.get("target_dir", ""), status=status, bytes_done=number("bytes_done") or 0,
        bytes_total=number("bytes_total") or job_total(),
        current_file=state.get("current_file"), rate_bps=number("rate_bps", float) or 0.0,
        eta_s=number("eta_s", float), files_done=number("files_done") or 0,
        files_total=number("files_total") or len(files), error=state.get("error"),
        pid=number("pid"), updated=number("updated", float) or 0.0,
        retry_attempt=attempt, retry_reason=retry.get("reason"),
        verifying=status == "running" and state.get("verifying") is True,
    )


def recorded_files(job_dir: Path) -> list[str]:
    """The paths the download in ``job_dir`` fetches, as its record holds them (the file choice it was
    started with: one weight format, all files, ``--include``); [] when there is no readable record."""
    job = _read_json(job_dir / "job.json") or {}
    files = job.get("files")
    return [str(item["path"]) for item in files if isinstance(item, dict) and item.get("path")] \
        if isinstance(files, list) else []


def list_downloads() -> list[DownloadStatus]:
    """Every download tunedeck knows of, newest first."""
    root = downloads_dir()
    if not root.is_dir():
        return []
    found = [status for status in (read_status(path) for path in root.iterdir() if path.is_dir()) if status]
    return sorted(found, key=lambda s: s.updated, reverse=True)


# --- starting and stopping ---------------------------------------------------------------------------------
END_STATUSES = ("done", "failed", "cancelled")  # written by a downloader as its last word, lock still held


def download_running(job_dir: Path) -> bool:
    """True while a downloader runs for the job: it holds the lock, or the one ``start_download`` spawned lives
    and has not taken the lock yet (its interpreter is starting: the job is still queued). A downloader that
    has written its end (done, failed, cancelled) and is exiting, the lock not yet let go, runs it no more:
    a start in that moment read "Already under way", then "Done", and started nothing (the next downloader
    waits for the lock: ``core.hub.downloader.main``)."""
    state = _read_json(job_dir / "state.json") or {}
    if downloader_alive(job_dir):
        return state.get("status") not in END_STATUSES
    return state.get("status") == "queued" and _spawned_downloader(job_dir) is True


def start_download(plan: DownloadPlan, token: str | None = None) -> Path:
    """Write the job and start a detached downloader for it; returns the job folder.

    A downloader already running for the same model is left alone (its folder is returned).
    """
    return start_or_join_download(plan, token)[0]


def start_or_join_download(plan: DownloadPlan, token: str | None = None) -> tuple[Path, bool]:
    """``start_download``, and whether it started a downloader (False: one already ran for the model, its job
    and its choice of files left as they are). The look and the start hold the job's ``start.lock``: two
    starts at the same instant (two terminals, the app and a terminal) start one downloader, not two, and the
    second never rewrites the first's job.json (a different --include would have won)."""
    from core.runs.run_dir import held_lock

    job_dir = job_dir_for(plan.hub, plan.model_id)
    ensure_private_dir(downloads_dir())
    ensure_private_dir(job_dir)
    with held_lock(job_dir / "start.lock"):
        if download_running(job_dir):
            return job_dir, False
        return _start_locked(plan, token, job_dir), True


def _start_locked(plan: DownloadPlan, token: str | None, job_dir: Path) -> Path:
    (job_dir / "cancel").unlink(missing_ok=True)
    write_json_atomic(job_dir / "job.json", plan.to_json())
    write_json_atomic(job_dir / "state.json", {"status": "queued", "updated": time.time(),
                                               "bytes_done": plan.present_bytes(),
                                               "bytes_total": plan.total_bytes,
                                               "files_total": len(plan.files)})
    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    if token:
        env[TOKEN_ENV] = token
    from core.i18n import current_language

    # The downloader writes why it failed ("the disk filled up ...") into state.json, which the app, models list
    # and models download show: in the language of whoever started it (--lang, the settings), not always English.
    env[LANGUAGE_ENV] = current_language()
    # The child imports ``core`` from where this process found it (a source checkout or site-packages).
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    (job_dir / SPAWNED_FILE).unlink(missing_ok=True)
    with open(job_dir / "downloader.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "core.hub.downloader", str(job_dir)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=str(job_dir),
            start_new_session=True, close_fds=True,
        )
    from core.runs.liveness import process_start_time

    write_json_atomic(job_dir / SPAWNED_FILE, {"pid": process.pid, "started_at": process_start_time(process.pid)})
    return job_dir


def cancel_download(job_dir: Path) -> bool:
    """Ask the downloader to stop (its partial files stay for a later resume); False if none runs
    (``download_running``: one that has ended its job and is exiting runs none; one spawned and still starting,
    the job queued, does: it finds the cancel file before its first byte)."""
    if not download_running(job_dir):
        return False
    (job_dir / "cancel").write_text("cancel\n", encoding="utf-8")
    return True


def wait_for_download(job_dir: Path, timeout_s: float, poll_s: float = 0.1) -> DownloadStatus | None:
    """Poll until the download is no longer active or ``timeout_s`` passed; the last status."""
    end = time.monotonic() + timeout_s
    status = read_status(job_dir)
    while time.monotonic() < end:
        status = read_status(job_dir)
        if status is not None and not status.active:
            return status
        time.sleep(poll_s)
    return status
