"""Hugging Face through ``huggingface_hub`` (which honours ``HF_ENDPOINT`` and ``HF_TOKEN``).

The SDK's shared HTTP client has no timeout by default; ``set_client_factory`` (its documented hook)
gives it ours, so an unreachable hub is a message in seconds rather than a hang.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any

from core.hub.errors import HubError, HubSdkMissingError
from core.hub.http import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    labelled_web_page,
    raise_if_web_page,
    requests_error,
    status_error,
    unreachable_error,
    web_page_hook,
)
from core.hub.records import (
    ModelDetails,
    ModelSummary,
    RepoFile,
    SearchPage,
    SearchQuery,
    in_size_class,
    parameters_from_name,
    scan_for_size_class,
    usable_id,
)
from core.i18n import t

HUB = "hf"
_SORT_KEYS = {"downloads": "downloads", "likes": "likes", "recent": "last_modified"}
_factory_lock = threading.Lock()
_factory_timeout: float | None = None
_CALL_THREAD = "hf-call"
_SDK_HTTP_LOGGER = "huggingface_hub.utils._http"
# Once an attempt has failed, the SDK's retries get this long from the call's start before it is abandoned.
RETRY_GRACE_S = 4.5
# The queue of each call still awaited, by its thread's name. Its retry warnings go there as (None, message):
# the first says why its connection failed. A call abandoned at its deadline leaves the table, so what its
# thread logs afterwards is dropped.
_awaited: dict[str, queue.Queue[tuple[bool | None, Any]]] = {}
_call_numbers = itertools.count(1)


class _RetryReasons(logging.Filter):
    """Keeps the SDK's retry warnings of our call threads off the terminal, and hands them to the caller: the
    first is the only record of why the connection failed when the deadline abandons the call."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.threadName or ""
        if not name.startswith(_CALL_THREAD):
            return True
        message = record.getMessage()
        answers = _awaited.get(name)
        if "thrown while requesting" in message and answers is not None:
            answers.put((None, message))
        return False


def _install_retry_filter() -> None:
    sdk_logger = logging.getLogger(_SDK_HTTP_LOGGER)
    if not any(isinstance(f, _RetryReasons) for f in sdk_logger.filters):
        sdk_logger.addFilter(_RetryReasons())


def hf_hub_cache() -> Path:
    """``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home).expanduser() / "hub"


def hf_repo_dir(model_id: str) -> Path:
    owner, name = model_id.split("/", 1)
    return hf_hub_cache() / f"models--{owner}--{name}"


class _Abandoned(Exception):
    """Raised in a call thread whose caller gave up on it, at its next request: not an error the SDK
    retries, so the thread ends instead of retrying for half a minute (and closing the SDK's shared client,
    which it does after a failed connection, under the calls made since)."""


def _stop_if_abandoned() -> None:
    name = threading.current_thread().name
    if name.startswith(_CALL_THREAD) and name not in _awaited:
        raise _Abandoned(name)


def _install_timeouts(timeout_s: float) -> None:
    global _factory_timeout
    with _factory_lock:
        if _factory_timeout == timeout_s:
            return
        import httpx2
        from huggingface_hub.utils import _http

        limits = httpx2.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)

        def cap_timeout(request: Any) -> None:
            _stop_if_abandoned()
            # The SDK passes its own per-request timeout (10 s and more); ours wins.
            request.extensions["timeout"] = limits.as_dict()

        def refuse_web_page(response: Any) -> None:
            # A web page where the API answers JSON (a captive portal, a website at HF_ENDPOINT): said for
            # what it is, not as a JSON parser's error.
            # The label alone is not enough (a mirror may label JSON text/html): the body is read, only then.
            content_type = response.headers.get("content-type", "")
            if labelled_web_page(response.status_code, content_type):
                raise_if_web_page(HUB, response.status_code, content_type, str(response.request.url),
                                  response.read())

        def factory() -> Any:
            client = _http.default_client_factory()
            client.timeout = limits
            client.event_hooks["request"].append(cap_timeout)
            client.event_hooks["response"].append(refuse_web_page)
            return client

        _http.set_client_factory(factory)
        _factory_timeout = timeout_s


class HfSource:
    """Search, details, file lists and download URLs of the Hugging Face Hub."""

    hub = HUB

    def __init__(self, endpoint: str | None = None, token: str | None = None,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        try:
            from huggingface_hub import HfApi, constants
        except ImportError as exc:
            raise HubSdkMissingError(t("hub.error.sdk_missing", hub="Hugging Face", package="huggingface_hub")) from exc
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
        self.token = token or None
        self.timeout_s = timeout_s
        _install_timeouts(timeout_s)
        # token=False: never fall back to a token file the user did not hand to tunedeck.
        self._api = HfApi(endpoint=self.endpoint, token=self.token or False)

    def _call(self, what: str, fn: Any, *args: Any, operation: str = "model", **kwargs: Any) -> Any:
        """Run an SDK call under a deadline: ``timeout_s`` while it waits on an answer, and
        ``RETRY_GRACE_S`` from its start once an attempt has failed.

        The SDK retries timeouts, refused connections and 5xx answers five times with back-off (tens of
        seconds); the call runs in a daemon thread and is abandoned at the deadline, so a failure is
        said in seconds, with the reason of its first failed attempt (refused, unknown host, HTTP 503),
        while a slow hub that does answer gets the whole read timeout.
        """
        answers: queue.Queue[tuple[bool | None, Any]] = queue.Queue()

        def call() -> None:
            try:
                result = fn(*args, **kwargs)
                answers.put((True, list(result) if hasattr(result, "__next__") else result))
            except BaseException as exc:  # handed to the caller's thread
                answers.put((False, exc))

        _install_retry_filter()
        name = f"{_CALL_THREAD}-{next(_call_numbers)}"
        _awaited[name] = answers
        start = time.monotonic()
        reason: str | None = None  # the first failed attempt's warning
        threading.Thread(target=call, name=name, daemon=True).start()
        try:
            while True:
                wait = min(self.timeout_s + 0.5, RETRY_GRACE_S) if reason else self.timeout_s + 0.5
                try:
                    ok, value = answers.get(timeout=max(0.0, start + wait - time.monotonic()))
                except queue.Empty:
                    break
                if ok is None:  # an attempt failed: the shorter deadline holds from now on
                    reason = reason or value
                    continue
                if ok:
                    return value
                return self._reraise(what, value, operation)
        finally:
            _awaited.pop(name, None)
        status = re.search(r"HTTP Error (\d{3})", reason or "")
        if status:
            raise status_error(HUB, int(status.group(1)), what, self.endpoint, reason or "", operation)
        raise unreachable_error(HUB, self.endpoint, reason or TimeoutError(t("hub.error.deadline")))

    def _reraise(self, what: str, error: BaseException, operation: str = "model") -> Any:
        from huggingface_hub.errors import HfHubHTTPError

        try:
            raise error
        except HfHubHTTPError as exc:
            response = getattr(exc, "response", None)
            status = getattr(response, "status_code", None)
            if isinstance(status, int):
                content_type = str(getattr(response, "headers", {}).get("content-type", ""))
                raise status_error(HUB, status, what, self.endpoint, str(exc), operation,
                                   "text/html" in content_type.lower()) from exc
            raise unreachable_error(HUB, self.endpoint, exc) from exc
        except HubError:
            raise
        except Exception as exc:  # httpx2 transport errors (connect refused, timeouts)
            if type(exc).__module__.startswith(("httpx", "httpcore")) or isinstance(exc, OSError):
                raise unreachable_error(HUB, self.endpoint, exc) from exc
            raise

    @staticmethod
    def _license(info: Any) -> str | None:
        card = getattr(info, "card_data", None)
        if card is not None and getattr(card, "license", None):
            return str(card.license)
        for tag in getattr(info, "tags", None) or ():
            if tag.startswith("license:"):
                return tag.split(":", 1)[1]
        return None

    def _summary(self, info: Any) -> ModelSummary:
        model_id = info.id
        updated = info.last_modified.isoformat() if getattr(info, "last_modified", None) else None
        return ModelSummary(
            hub=HUB, model_id=model_id, downloads=int(info.downloads or 0), likes=int(info.likes or 0),
            updated=updated, license=self._license(info),
            tasks=(info.pipeline_tag,) if getattr(info, "pipeline_tag", None) else (),
            params=parameters_from_name(model_id), private=bool(info.private), gated=bool(info.gated),
        )

    def search(self, query: SearchQuery) -> SearchPage:
        """A page of models; with a size class (filtered here) the first page from ``query.page`` on that
        holds one (``scan_for_size_class``)."""
        return scan_for_size_class(query, lambda number: self._search_page(query, number))

    def _search_page(self, query: SearchQuery, number: int) -> SearchPage:
        """Page ``number``; the Hub pages by cursor, so earlier pages are fetched and skipped."""
        wanted = number * query.page_size
        infos = self._call(query.text or "*", self._api.list_models, operation="search",
                           search=query.text or None, author=query.owner or None, pipeline_tag=query.task or None,
                           sort=_SORT_KEYS.get(query.sort), limit=wanted + 1)
        page = infos[(number - 1) * query.page_size: wanted]
        matching = [s for s in (self._summary(info) for info in page) if in_size_class(s.params, query.size_class)]
        items = tuple(s for s in matching if usable_id(s.model_id))
        # every match up to this page and one beyond was fetched: that many are known (a page past the
        # last one counted its own start as found)
        total = len(infos)
        return SearchPage(items=items, total=total, page=number, page_size=query.page_size,
                          unusable=len(matching) - len(items))

    def file_url(self, model_id: str, path: str, revision: str = "main") -> str:
        from huggingface_hub import hf_hub_url

        return hf_hub_url(model_id, path, revision=revision, endpoint=self.endpoint)

    def auth_headers(self) -> dict[str, str]:
        from core.hub.http import auth_headers_for

        return auth_headers_for(HUB, self.token)

    def read_small_file(self, model_id: str, path: str, revision: str = "main") -> bytes:
        import requests

        from core.hub.modelscope_source import SMALL_FILE_LIMIT

        try:
            response = requests.get(self.file_url(model_id, path, revision), headers=self.auth_headers(),
                                    timeout=(CONNECT_TIMEOUT_S, self.timeout_s), hooks={"response": web_page_hook(HUB)})
            response.raise_for_status()
        except requests.RequestException as exc:
            raise requests_error(HUB, exc, f"{model_id}/{path}", self.endpoint) from exc
        return response.content[:SMALL_FILE_LIMIT]

    def details(self, model_id: str) -> ModelDetails:
        from core.hub.details import assemble_details

        info = self._call(model_id, self._api.model_info, model_id, files_metadata=True, timeout=self.timeout_s)
        files = []
        for sibling in info.siblings or ():
            lfs = getattr(sibling, "lfs", None)
            sha = getattr(lfs, "sha256", None) if lfs is not None else None
            files.append(RepoFile(path=sibling.rfilename, size=int(sibling.size or 0), sha256=sha))
        revision = info.sha or "main"
        return assemble_details(self, self._summary(info), tuple(files), revision)

    def model_dir(self, model_id: str, revision: str = "main") -> Path:
        return hf_repo_dir(model_id) / "snapshots" / revision
