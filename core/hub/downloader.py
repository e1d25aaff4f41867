"""The detached downloader: ``python -m core.hub.downloader JOB_DIR`` (started by ``start_download``).

Runs in its own session, so a closed terminal or a dropped SSH connection does not stop it. Holds the
job's lock for its whole life; writes ``state.json`` a few times a second and ``events.jsonl`` per event.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.atomic_file import write_json_atomic
from core.errors import EXIT_HUB, TunedeckError
from core.hub.download import (
    CHUNK_BYTES,
    LANGUAGE_ENV,
    MAX_STALLED_ATTEMPTS,
    PART_SUFFIX,
    STATE_INTERVAL_S,
    TOKEN_ENV,
)
from core.hub.http import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, auth_headers_for, status_error, storage_refusal
from core.i18n import set_language, t

FATAL_STATUSES = (401, 403, 404, 410)
# Of those, the ones whose HTML page is no hub's answer (``_refuse_status``): a website's Not Found, a proxy's or a
# captive portal's login page.
WEB_PAGE_STATUSES = (401, 403, 404)
# A reason kept in state.json and events.jsonl is bounded: a requests error runs to about 300 characters, its
# cause (Connection refused, Name or service not known) at the end; one much longer is cut at a word.
REASON_MAX_CHARS = 600
RETRY_REASON_MAX_CHARS = 120  # the error in short beside a progress line that retries
CANCEL_POLL_S = 0.2  # how often a transfer (and a back-off) looks for the cancel file


def bounded_reason(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """``text`` on one line, whole up to ``limit`` characters; a longer one cut before the word that would
    pass it (never mid-word, a word longer than half the room aside) and marked with an ellipsis."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    if not text[limit - 1].isspace():
        space = cut.rfind(" ")
        if space > limit // 2:
            cut = cut[:space]
    return cut.rstrip() + "…"


class Cancelled(Exception):
    pass


class LocalWriteError(Exception):
    """Writing a file on this box failed (a full disk, a quota, a read-only folder): no retry can help, so it
    is kept apart from the network's errors, which are OSErrors too (``requests.RequestException`` is one)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class LinkRefused(Exception):
    """The storage server the hub sent the file to (a CDN, a bucket: another host, a signed link) refused the
    link with 403: an expired or refused signed link, tried again with a new one from the hub (``_retry``)."""


class FatalDownloadError(TunedeckError):
    """A file the downloader gives up on (retries spent, a hash mismatch, a refusal): the job fails."""

    exit_code = EXIT_HUB


class Downloader:
    """Fetches the files of one job, resuming partial ones."""

    def __init__(self, job_dir: Path, token: str | None) -> None:
        self.job_dir = job_dir
        self.job: dict[str, Any] = json.loads((job_dir / "job.json").read_text(encoding="utf-8"))
        self.headers = auth_headers_for(self.job["hub"], token)
        self.target = Path(self.job["target_dir"])
        self.files: list[dict[str, Any]] = self.job["files"]
        self.total = sum(int(f["size"]) for f in self.files)
        self.done_before: dict[str, int] = {}
        self.current: str | None = None
        self.verifying = False  # the current file's sha256 is being checked: no byte comes, and none is missing
        self.files_done = 0
        self.rate = 0.0
        self._last_state = 0.0
        self._rate_mark = (time.monotonic(), 0)
        self._session: Any = None
        # Bytes written since state.json was last written (its writes are at most every STATE_INTERVAL_S): the
        # body's watcher writes them once no chunk has come for a moment (``_cancel_cuts``), or a transfer the
        # hub holds said the figure of up to a quarter second before, for the whole stall.
        self._unsaid = False
        self._last_chunk = 0.0
        self._state_lock = threading.Lock()  # the watcher's write and the transfer's

    # --- bookkeeping -------------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> None:
        with open(self.job_dir / "events.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"t": round(time.time(), 3), "event": kind, **fields}) + "\n")

    def bytes_done(self) -> int:
        done = 0
        for item in self.files:
            final = self.target / item["path"]
            part = final.with_name(final.name + PART_SUFFIX)
            if final.is_file() and final.stat().st_size == int(item["size"]):
                done += int(item["size"])
            elif part.is_file():
                done += min(part.stat().st_size, int(item["size"]))
        return done

    def write_state(self, status: str, done: int | None = None, error: str | None = None, force: bool = False,
                    retry: dict[str, Any] | None = None) -> None:
        """Replace ``state.json``; ``retry`` (``{"attempt": n, "reason": ...}``) while the link is being tried
        again: the rate and ETA then read unknown, not the last good ones, and the rate starts afresh after.
        An end state (not ``running``) has none either: a failed job kept its last speed and ETA."""
        with self._state_lock:
            self._write_state(status, done, error, force, retry)

    def _write_state(self, status: str, done: int | None, error: str | None, force: bool,
                     retry: dict[str, Any] | None) -> None:
        now = time.monotonic()
        if not force and now - self._last_state < STATE_INTERVAL_S:
            self._unsaid = True
            return
        self._last_state = now
        self._unsaid = False
        done = self.bytes_done() if done is None else done
        mark_time, mark_bytes = self._rate_mark
        if retry is not None:
            self.rate = 0.0
            self._rate_mark = (now, done)
        elif now - mark_time >= 0.5:
            instant = (done - mark_bytes) / (now - mark_time)
            self.rate = instant if self.rate == 0 else 0.6 * self.rate + 0.4 * instant
            self._rate_mark = (now, done)
        if status != "running":  # an end state (done, failed, cancelled): no speed, nothing left to wait for
            self.rate = 0.0
        remaining = max(0, self.total - done)
        eta = remaining / self.rate if self.rate > 0 else None
        write_json_atomic(self.job_dir / "state.json", {
            "status": status, "pid": os.getpid(), "updated": time.time(), "bytes_done": done,
            "bytes_total": self.total, "current_file": self.current, "rate_bps": round(max(self.rate, 0.0), 1),
            "eta_s": None if eta is None else round(eta, 1), "files_done": self.files_done,
            "files_total": len(self.files), "error": error, "retry": retry,
            "verifying": self.verifying and status == "running",
        })

    def check_cancel(self) -> None:
        if (self.job_dir / "cancel").exists():
            raise Cancelled()

    # --- one file ----------------------------------------------------------------------------------
    def fetch(self, item: dict[str, Any]) -> None:
        import requests

        size = int(item["size"])
        final = self.target / item["path"]
        part = final.with_name(final.name + PART_SUFFIX)
        if final.is_file() and final.stat().st_size == size:
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        stalled = 0
        retries = 0
        mismatches = 0
        while True:
            self.check_cancel()
            offset = part.stat().st_size if part.is_file() else 0
            if offset > size:
                part.unlink()
                offset = 0
            if offset < size:
                try:
                    self._get(item["url"], part, offset)
                except (FatalDownloadError, LocalWriteError):
                    raise
                except LinkRefused as exc:  # each try asks the hub again, for a new link
                    stalled, retries = self._retry(item, offset, part, stalled, retries, str(exc))
                    continue
                except (requests.RequestException, OSError) as exc:
                    stalled, retries = self._retry(item, offset, part, stalled, retries, str(exc), exc)
                    continue
            if part.stat().st_size > size:
                # More bytes than the file list says (the file was uploaded again, larger): no progress towards
                # this size. Deleted and fetched again, it came too long each time, "running" without end.
                part.unlink()
                raise FatalDownloadError(t("hub.download.size_changed", file=item["path"], size=size))
            if part.stat().st_size != size:
                # The server ended the body early without an error (a 206 of 0 bytes, a short 200): tried again
                # with the same back-off, and counted towards giving up, as a dropped link is.
                short = t("hub.download.short_body", offset=part.stat().st_size, size=size)
                stalled, retries = self._retry(item, offset, part, stalled, retries, short)
                continue
            expected = item.get("sha256")
            if expected and not self._verified(part, expected):
                part.unlink()
                mismatches += 1
                self.event("hash_mismatch", file=item["path"])
                if mismatches >= 2:
                    raise FatalDownloadError(t("hub.download.hash_mismatch", file=item["path"]))
                continue
            os.replace(part, final)
            return

    def _verified(self, part: Path, expected: str) -> bool:
        """Whether ``part``'s sha256 is ``expected``. Hashing a shard of gigabytes takes seconds with no byte
        coming: said meanwhile (state.json's ``verifying``), or the watchers took it for a stalled link."""
        self.verifying = True
        self.write_state("running", force=True)
        try:
            return _sha256(part, self.check_cancel) == expected.lower()
        finally:
            self.verifying = False

    def _retry(self, item: dict[str, Any], offset: int, part: Path, stalled: int, retries: int, reason: str,
               exc: BaseException | None = None) -> tuple[int, int]:
        """After an attempt at ``item`` from ``offset`` that did not finish it (the link dropped, or the body
        ended short): note it, give up (``FatalDownloadError``) after ``MAX_STALLED_ATTEMPTS`` in a row that
        wrote no byte, else wait its back-off. Returns the new (stalled, retries) counts."""
        # An attempt that wrote bytes made progress: only attempts that wrote none count towards giving up
        # (a flaky link that drops every few MB gets there).
        self.check_cancel()  # a cancel that cut the transfer (``_cancel_cuts``) or came meanwhile: no retry
        progressed = (part.stat().st_size if part.is_file() else 0) > offset
        stalled = 0 if progressed else stalled + 1
        retries += 1
        self.event("retry", file=item["path"], offset=offset, reason=bounded_reason(reason))
        if stalled >= MAX_STALLED_ATTEMPTS:
            raise FatalDownloadError(t("hub.download.gave_up", file=item["path"], attempts=stalled,
                                       reason=bounded_reason(reason))) from exc
        # Said while it waits and tries again: the rate and ETA of before the drop are not live.
        self.write_state("running", force=True, retry={
            "attempt": retries + 1, "reason": bounded_reason(reason, RETRY_REASON_MAX_CHARS)})
        backoff = min(5.0, 0.25 * 2 ** stalled)
        steps = max(1, math.ceil(backoff / CANCEL_POLL_S))
        for _ in range(steps):  # the back-off, a cancel seen within it
            time.sleep(backoff / steps)
            self.check_cancel()
        return stalled, retries

    @contextmanager
    def _cancel_cuts(self, response: Any) -> Iterator[None]:
        """While ``response``'s body is read: a cancel asked while the hub holds the transfer was seen only when the
        read timed out (15 s) and the back-off ended, the app and the CLI saying "running" meanwhile. The
        connection's socket is shut down at once: the read ends, and ``_retry`` stops at its cancel check."""
        import socket

        over = threading.Event()

        def watch() -> None:
            while not over.wait(CANCEL_POLL_S):
                if self._unsaid and time.monotonic() - self._last_chunk >= CANCEL_POLL_S:
                    # no chunk for a moment (the hub holds the transfer): the bytes of the last ones said now
                    try:
                        self.write_state("running", force=True)
                    except OSError:  # a full disk: the transfer's next write says it; the cancel is watched on
                        pass
                if (self.job_dir / "cancel").exists():
                    sock = getattr(getattr(response.raw, "connection", None), "sock", None)
                    if sock is not None:
                        try:
                            sock.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass
                    return

        watcher = threading.Thread(target=watch, name="cancel-watch", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            over.set()
            watcher.join()

    def _request(self, url: str, headers: dict[str, str]) -> Any:
        """The GET of ``url`` up to its answer's headers, a cancel looked for meanwhile. A hub that holds the
        request before it answers (a busy mirror, a CDN fetching the file first) kept a cancel waiting for the
        read timeout (15 s), the app and the CLI saying "running": the request waits in a thread of its own,
        and a cancel ends the wait at once (``Cancelled``; the process then ends, the request with it). Once
        the headers are in, ``_cancel_cuts`` watches the body."""
        answer: dict[str, Any] = {}
        answered = threading.Event()

        def ask() -> None:
            try:
                answer["response"] = self._session.get(url, headers=headers, stream=True,
                                                       timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
            except BaseException as exc:  # raised below, in the downloader's thread, as if asked there
                answer["error"] = exc
            finally:
                answered.set()

        threading.Thread(target=ask, name="request", daemon=True).start()
        while not answered.wait(CANCEL_POLL_S):
            self.check_cancel()
        if "error" in answer:
            raise answer["error"]
        return answer["response"]

    def _get(self, url: str, part: Path, offset: int) -> bool:
        """One ranged GET appended to ``part``; True when at least one byte arrived."""
        headers = dict(self.headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        response = self._request(url, headers)
        with response, self._cancel_cuts(response):
            if response.status_code in FATAL_STATUSES:
                self._refuse_status(response, part)
            response.raise_for_status()
            mode = "ab"
            if offset and response.status_code != 206:
                mode = "wb"  # the server ignored the range: start the file over
            chunks = (chunk for chunk in response.iter_content(CHUNK_BYTES) if chunk)
            first = next(chunks, None)
            if first is None:  # an empty body: the part is kept as it is (made, where there was none)
                try:
                    part.touch()
                except OSError as exc:
                    raise LocalWriteError(exc) from exc
                return False
            self._refuse_web_page(response, part, first)  # looked at before the part is opened (or emptied)
            try:
                handle = open(part, mode)
            except OSError as exc:
                raise LocalWriteError(exc) from exc
            try:
                for chunk in itertools.chain((first,), chunks):
                    try:
                        handle.write(chunk)
                    except OSError as exc:
                        raise LocalWriteError(exc) from exc
                    self._last_chunk = time.monotonic()
                    self.check_cancel()
                    self.write_state("running")
            finally:
                try:
                    handle.close()  # a buffered write may meet the full disk only here
                except OSError as exc:
                    raise LocalWriteError(exc) from exc
            return True

    def _refuse_status(self, response: Any, part: Path) -> None:
        """Fail on a status that asking again will not change (FATAL_STATUSES). A 404 that is an HTML page
        (a proxy's or a website's "Not Found" at the endpoint) is no hub's word that the file is missing, nor a
        401 or 403 page (a proxy's or a captive portal's login page) its word on the token: said as a web page,
        with its URL, as the listing says it (``status_problem``'s ``web_page``). A 403 from the storage server the
        hub redirected the file to (``storage_refusal``: an expired or refused signed link) is ``LinkRefused``:
        tried again, with a new link."""
        from core.hub.problems import looks_like_web_page

        name = part.name[:-len(PART_SUFFIX)]
        status = response.status_code
        storage = storage_refusal(response) if status == 403 else None
        if storage is not None:  # the CDN's 403 (its HTML or XML page): the link, not a login nor the token
            raise LinkRefused(t("hub.download.link_refused", file=name, host=storage, status=status))
        content_type = response.headers.get("Content-Type", "")
        page = status in WEB_PAGE_STATUSES and looks_like_web_page(next(response.iter_content(1024), b""))
        error = status_error(self.job["hub"], status, f"{self.job['model_id']}/{name}", self.job["endpoint"],
                             f"HTTP {status} {content_type} <- {response.url}", web_page=page)
        if page:
            raise FatalDownloadError(t("hub.download.web_page_status", file=name, url=str(response.url),
                                       status=status, problem=str(error)))
        raise FatalDownloadError(str(error))

    def _refuse_web_page(self, response: Any, part: Path, first_chunk: bytes) -> None:
        """A web page where the file's bytes belong (a captive portal, a proxy's login page): written into
        the part it never matched the file's size, and the loop fetched it again and again without end.
        Labelled ``text/html`` and its first chunk an HTML page; a file a mirror labels so is the file."""
        from core.hub.errors import HubUnavailableError
        from core.hub.http import raise_if_web_page

        name = part.name[:-len(PART_SUFFIX)]
        if name.lower().endswith((".html", ".htm")):
            return  # the repository's own web page
        try:
            raise_if_web_page(self.job["hub"], response.status_code, response.headers.get("Content-Type", ""),
                              response.url, first_chunk)
        except HubUnavailableError as exc:
            raise FatalDownloadError(t("hub.download.web_page", file=name, problem=str(exc))) from exc

    # --- the whole job -----------------------------------------------------------------------------
    def run(self) -> int:
        import requests

        self._session = requests.Session()
        # The speed counts what this process fetches: a resumed download starts at the bytes already on disk
        # (from 0, its first figure counted them as fetched in half a second, the ETA as short).
        resumed = self.bytes_done()
        self._rate_mark = (time.monotonic(), resumed)
        self.write_state("running", done=resumed, force=True)
        self.event("start", files=len(self.files), bytes=self.total, resumed_bytes=resumed)
        try:
            for item in self.files:
                self.current = item["path"]
                self.event("file_start", file=item["path"], size=int(item["size"]))
                self.write_state("running", force=True)
                self.fetch(item)
                self.files_done += 1
                self.event("file_done", file=item["path"])
        except Cancelled:
            self.current = None
            (self.job_dir / "cancel").unlink(missing_ok=True)
            self.event("cancelled")
            self.write_state("cancelled", force=True)
            return 3
        except FatalDownloadError as exc:
            self.event("failed", reason=str(exc))
            self.write_state("failed", error=str(exc), force=True)
            return 2
        except LocalWriteError as exc:
            message = self._write_failure(exc.error)
            self.event("failed", reason=message)
            self.write_state("failed", error=message, force=True)
            return 2
        except OSError as exc:  # disk full, permissions
            message = t("hub.download.disk_error", path=str(self.target), reason=bounded_reason(str(exc)))
            self.event("failed", reason=message)
            self.write_state("failed", error=message, force=True)
            return 2
        self.current = None
        self._point_hf_ref()
        self.event("done")
        self.write_state("done", force=True)
        return 0


    def _write_failure(self, error: OSError) -> str:
        """What a failed write of the current file says: a full disk (or quota) with what is free now and
        what to do; anything else (permissions, a read-only folder) with the system's reason."""
        import errno

        from core.hub.download import free_bytes_at
        from core.units import format_disk

        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            try:
                free: int | None = free_bytes_at(self.target)
            except OSError:
                free = None
            return t("hub.download.disk_full", file=self.current or "", free=format_disk(free),
                     path=str(self.target))
        return t("hub.download.disk_error", path=str(self.target), reason=bounded_reason(str(error)))

    def _point_hf_ref(self) -> None:
        """In the Hugging Face cache layout, ``refs/main`` names the snapshot, as the SDK leaves it."""
        if self.job["hub"] != "hf" or self.target.parent.name != "snapshots":
            return
        refs = self.target.parent.parent / "refs"
        refs.mkdir(parents=True, exist_ok=True)
        (refs / "main").write_text(self.job["revision"], encoding="utf-8")


HASH_CANCEL_EVERY = 32  # MiB read between two looks for the cancel file while a file's sha256 is checked


def _sha256(path: Path, check_cancel: Any = None) -> str:
    """``path``'s sha256; ``check_cancel`` called every ``HASH_CANCEL_EVERY`` MiB: hashing a shard of gigabytes on
    a slow disk takes a minute, and a cancel asked meanwhile waited for its end, "verifying" said all along."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for index, block in enumerate(iter(lambda: handle.read(1024 * 1024), b"")):
            if check_cancel is not None and index % HASH_CANCEL_EVERY == 0:
                check_cancel()
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    job_dir = Path(argv[0])
    token = os.environ.pop(TOKEN_ENV, None) or None
    try:
        set_language(os.environ.get(LANGUAGE_ENV, ""))
    except ValueError:  # a language this install lacks: the locale's
        set_language("")
    with open(job_dir / "lock", "a+") as lock:
        if not _take_lock(lock):
            return 0  # another downloader has this job
        return Downloader(job_dir, token).run()


LOCK_WAIT_S = 10.0


def _take_lock(lock: Any, wait_s: float = LOCK_WAIT_S) -> bool:
    """Take the job's lock, waiting a moment for it: the downloader of the job's last run may have written its
    end and not yet let go (``download_running`` no longer counts it, so this one was started), and a reader
    looks with a shared lock for an instant. Gave up at once, this download never started ("interrupted").
    False when another downloader keeps it: that one has the job."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
