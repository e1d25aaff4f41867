"""Small HTTP helpers shared by the hub sources and the downloader: timeouts and error translation."""

from __future__ import annotations

from typing import Any

from core.hub.errors import HubAccessError, HubError, HubNotFoundError, HubUnavailableError
from core.hub.problems import (
    ENDPOINT_ENV,
    HUB_NAMES,
    TOKEN_ENV,
    status_problem,
    unreachable_problem,
    web_page_problem,
)

CONNECT_TIMEOUT_S = 4.0
READ_TIMEOUT_S = 15.0
TOKEN_ENV_NAME = TOKEN_ENV

__all__ = ["CONNECT_TIMEOUT_S", "ENDPOINT_ENV", "HUB_NAMES", "READ_TIMEOUT_S", "TOKEN_ENV_NAME", "auth_headers_for",
           "raise_if_web_page", "requests_error", "status_error", "unreachable_error",
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


def requests_error(hub: str, exc: BaseException, what: str, endpoint: str) -> HubError:
    """Translate an exception of ``requests`` (or a response status carried on it)."""
    response: Any = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
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


def raise_if_web_page(hub: str, status: int, content_type: str, url: str) -> None:
    """Raise ``HubUnavailableError`` when a successful answer is a web page (``text/html``): what a captive
    portal, a proxy's login page or a website in place of the hub sends, where the hub's API sends JSON
    and its file routes the file. The SDKs would parse it into an empty list or fail on it."""
    if 200 <= status < 300 and "text/html" in (content_type or "").lower():
        problem = web_page_problem(hub, _origin(url), str(url), content_type, status)
        raise HubUnavailableError(problem.message(), problem)


def web_page_hook(hub: str) -> Any:
    """A ``requests`` response hook running ``raise_if_web_page`` on each answer of a session."""

    def check(response: Any, *args: Any, **kwargs: Any) -> Any:
        raise_if_web_page(hub, response.status_code, response.headers.get("Content-Type", ""), response.url)
        return response

    return check
