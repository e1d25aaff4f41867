"""Small HTTP helpers shared by the hub sources and the downloader: timeouts and error translation."""

from __future__ import annotations

import io
from typing import Any

from core.hub.errors import HubAccessError, HubError, HubNotFoundError, HubUnavailableError
from core.hub.problems import (
    ENDPOINT_ENV,
    HUB_NAMES,
    TOKEN_ENV,
    link_refused_problem,
    looks_like_web_page,
    status_problem,
    unreachable_problem,
    web_page_problem,
)

CONNECT_TIMEOUT_S = 4.0
READ_TIMEOUT_S = 15.0
TOKEN_ENV_NAME = TOKEN_ENV

__all__ = ["CONNECT_TIMEOUT_S", "ENDPOINT_ENV", "HUB_NAMES", "READ_TIMEOUT_S", "TOKEN_ENV_NAME", "auth_headers_for",
           "labelled_web_page", "raise_if_web_page", "requests_error", "status_error", "storage_refusal",
           "unreachable_error",
           "web_page_hook"]


def status_error(hub: str, status: int, what: str, endpoint: str, detail: str = "",
                 operation: str = "model", web_page: bool = False) -> HubError:
    """The exception for an HTTP error ``status`` on ``what`` (a model id or a file; ``operation``
    "search" when the request was a search; ``web_page`` when the answer was an HTML page)."""
    problem = status_problem(hub, endpoint, status, what, detail, operation, web_page)
    if problem.kind == "access":
        return HubAccessError(problem.message(), status, problem)
    if problem.kind == "not_found":
        return HubNotFoundError(problem.message(), problem)
    return HubUnavailableError(problem.message(), problem)


def unreachable_error(hub: str, endpoint: str, reason: BaseException | str) -> HubUnavailableError:
    """No connection to the hub, or no answer in time; ``reason`` is what the HTTP stack raised."""
    problem = unreachable_problem(hub, endpoint, reason)
    return HubUnavailableError(problem.message(), problem)


# Query keys of a signed download link (S3, CloudFront, Aliyun OSS, Azure): a link that expires.
SIGNED_LINK_KEYS = frozenset({"expires", "signature", "x-amz-signature", "x-amz-expires", "key-pair-id", "policy",
                              "ossaccesskeyid", "x-oss-signature", "x-oss-expires", "sig", "se"})


def storage_refusal(response: Any) -> str | None:
    """The host of the storage server behind a 403 ``response`` to a file: where the hub redirected the
    file to another host (its CDN, a bucket) or the link is signed; None where the hub itself answered (a
    gated or private model: its word on the token). The storage's 403, HTML or XML, is about the link."""
    from urllib.parse import parse_qsl, urlsplit

    final = urlsplit(str(response.url))
    history = getattr(response, "history", None)
    asked = urlsplit(str(history[0].url)) if history else final
    signed = any(key.lower() in SIGNED_LINK_KEYS for key, _ in parse_qsl(final.query, keep_blank_values=True))
    return final.netloc if signed or final.netloc != asked.netloc else None


def requests_error(hub: str, exc: BaseException, what: str, endpoint: str) -> HubError:
    """Translate an exception of ``requests`` (or a response status carried on it). A 403 from the storage
    server the hub sent a file to (``storage_refusal``) is the link's refusal, not the hub's word on access."""
    response: Any = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status == 403 and storage_refusal(response) is not None:
        problem = link_refused_problem(hub, endpoint, storage_refusal(response) or "", what, status, str(exc))
        return HubUnavailableError(problem.message(), problem)
    if isinstance(status, int) and status >= 400:
        return status_error(hub, status, what, endpoint, str(exc))
    return unreachable_error(hub, endpoint, exc)


def auth_headers_for(hub: str, token: str | None) -> dict[str, str]:
    """Headers that authenticate file downloads on ``hub`` (ModelScope's SDK sends both forms)."""
    if not token:
        return {}
    headers = {"Authorization": f"Bearer {token}"}
    if hub == "modelscope":
        headers["Cookie"] = f"m_session_id={token}"
    return headers


def _origin(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(str(url))
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else str(url)


def labelled_web_page(status: int, content_type: str) -> bool:
    """Whether a successful answer says it is a web page (``text/html``): its body is to be looked at."""
    return 200 <= status < 300 and "text/html" in (content_type or "").lower()


def raise_if_web_page(hub: str, status: int, content_type: str, url: str, body: bytes | str | None) -> None:
    """Raise ``HubUnavailableError`` when a successful answer is a web page: labelled ``text/html`` and its
    ``body`` (the first bytes are enough) an HTML page. That is what a captive portal, a proxy's login page or
    a website in place of the hub sends, where the hub's API sends JSON and its file routes the file; the SDKs
    would parse it into an empty list or fail on it. The label alone is not enough: a mirror or a proxy may
    label JSON or a README ``text/html``."""
    if labelled_web_page(status, content_type) and looks_like_web_page(body):
        problem = web_page_problem(hub, _origin(url), str(url), content_type, status)
        raise HubUnavailableError(problem.message(), problem)


def web_page_hook(hub: str) -> Any:
    """A ``requests`` response hook running ``raise_if_web_page`` on each answer of a session (the body of
    one labelled ``text/html`` is read to look at it: a page or a small file; ``iter_content`` still yields
    it after)."""

    def check(response: Any, *args: Any, **kwargs: Any) -> Any:
        content_type = response.headers.get("Content-Type", "")
        if labelled_web_page(response.status_code, content_type):
            body = response.content
            # What reads ``raw`` itself after the hook (ModelScope's SDK does) finds it spent: it is the body
            # again, and no ``stream`` attribute sends such readers to ``iter_content`` (the read content).
            response.raw = io.BytesIO(body)
            raise_if_web_page(hub, response.status_code, content_type, response.url, body)
        return response

    return check
