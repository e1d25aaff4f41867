"""What went wrong talking to a hub, said for a person: what failed, what to do, and the raw detail.

The SDKs report an offline box as ``[E1020] Connection error: HTTPSConnectionPool(host=..., port=443):
Max retries exceeded with url: ... (Caused by NameResolutionError(...))``: true, long, and no help. A
``HubProblem`` splits that into a one-sentence ``summary`` (the hub could not be reached, and why in
words; it did not answer in time; it answered HTTP N), ``advice`` (check the network or the proxy, point
the endpoint variable at a mirror), and the untouched ``detail`` for whoever wants it. The app and the
CLI show the same summary and advice; each adds its own way to go on offline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from core.i18n import t

HUB_NAMES = {"modelscope": "ModelScope", "hf": "Hugging Face"}
ENDPOINT_ENV = {"modelscope": "MODELSCOPE_ENDPOINT", "hf": "HF_ENDPOINT"}
TOKEN_ENV = {"modelscope": "MODELSCOPE_API_TOKEN", "hf": "HF_TOKEN"}
DEFAULT_ENDPOINTS = {"modelscope": "https://modelscope.cn", "hf": "https://huggingface.co"}
# Another endpoint worth trying when the default one is out of reach (the hubs' own alternatives).
MIRRORS = {"modelscope": "https://modelscope.ai", "hf": "https://hf-mirror.com"}
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")

# kind: unreachable (no connection), timeout (connected or not, no answer in time), status (an HTTP
# error the hub sent), access (401/403), not_found (404 of a model or file), sdk_missing, other.
KINDS = ("unreachable", "timeout", "status", "access", "not_found", "sdk_missing", "other")
OFFLINE_KINDS = frozenset({"unreachable", "timeout"})

# Why a connection failed, from the words the HTTP stacks (urllib3, requests, httpx, the SDKs) use;
# the first reason whose marker appears wins, so the proxy comes before the refusal it causes.
_REASON_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("proxy", ("proxyerror", "unable to connect to proxy", "tunnel connection failed", "proxy error")),
    ("timeout", ("timed out", "timeout", "[e1001]")),
    ("tls", ("sslerror", "ssl:", "[ssl", "certificate verify failed", "certificate_verify_failed")),
    ("dns", ("nameresolutionerror", "failed to resolve", "name or service not known",
             "temporary failure in name resolution", "nodename nor servname", "getaddrinfo failed",
             "no address associated", "[errno -2]", "[errno -3]", "[errno 11001]")),
    ("refused", ("connection refused", "[errno 111]", "econnrefused", "[winerror 10061]")),
    ("no_route", ("network is unreachable", "no route to host", "[errno 101]", "[errno 113]")),
    ("reset", ("connection reset", "remotedisconnected", "connection aborted", "[errno 104]")),
)
REASONS = tuple(reason for reason, _ in _REASON_MARKERS) + ("other",)


@dataclass(frozen=True)
class HubProblem:
    """One failed hub call, classified: ``summary`` says what failed, ``advice`` what to do."""

    kind: str
    hub: str
    endpoint: str
    summary: str
    advice: tuple[str, ...] = ()
    detail: str = ""  # the text underneath (SDK, HTTP library), whole
    status: int | None = None
    reason: str | None = None  # for unreachable and timeout: one of REASONS

    @property
    def offline(self) -> bool:
        """The hub is out of reach (no connection, or no answer in time): asking again now is pointless."""
        return self.kind in OFFLINE_KINDS

    def message(self) -> str:
        """Summary and advice as one paragraph (what ``str()`` of the exception carrying it gives)."""
        return t("hub.problem.sentence_gap").join((self.summary, *self.advice))

    def lines(self) -> list[str]:
        """Summary, then each piece of advice, one per line."""
        return [self.summary, *self.advice]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "hub": self.hub, "endpoint": self.endpoint, "summary": self.summary,
                "advice": list(self.advice), "detail": self.detail, "status": self.status, "reason": self.reason}


def _text_of(reason: BaseException | str) -> str:
    """The whole text of an exception and of the ones it was raised from (the cause often says why)."""
    if isinstance(reason, str):
        return reason
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = reason
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(str(current) or type(current).__name__)
        current = current.__cause__ or current.__context__
    return " <- ".join(dict.fromkeys(parts))


def connection_reason(reason: BaseException | str) -> str:
    """Why a connection failed, as one of ``REASONS`` (``other`` when the text does not say)."""
    if isinstance(reason, TimeoutError):
        return "timeout"
    text = _text_of(reason).lower()
    for name, markers in _REASON_MARKERS:
        if any(marker in text for marker in markers):
            return name
    return "other"


def _proxy_variable() -> str | None:
    return next((name for name in PROXY_ENV if os.environ.get(name, "").strip()), None)


def _endpoint_advice(hub: str, endpoint: str) -> str:
    """Where to point the hub instead: the variable as it is set now, or the mirror to try."""
    env = ENDPOINT_ENV[hub]
    if os.environ.get(env, "").strip():
        return t("hub.advice.endpoint_set", env=env, endpoint=endpoint, default=DEFAULT_ENDPOINTS[hub])
    return t("hub.advice.endpoint_mirror", env=env, mirror=MIRRORS[hub])


def _network_advice(hub: str, endpoint: str) -> tuple[str, ...]:
    proxy = _proxy_variable()
    first = t("hub.advice.proxy_set", env=proxy) if proxy else t("hub.advice.network")
    return first, _endpoint_advice(hub, endpoint)


def unreachable_problem(hub: str, endpoint: str, reason: BaseException | str) -> HubProblem:
    """No connection to ``endpoint`` (refused, unknown host, TLS, proxy) or no answer in time."""
    detail = _text_of(reason)
    why = connection_reason(reason)
    name = HUB_NAMES[hub]
    if why == "timeout":
        return HubProblem("timeout", hub, endpoint, t("hub.problem.timeout", hub=name, endpoint=endpoint),
                          _network_advice(hub, endpoint), detail, reason=why)
    return HubProblem("unreachable", hub, endpoint,
                      t("hub.problem.unreachable", hub=name, endpoint=endpoint, why=t(f"hub.reason.{why}")),
                      _network_advice(hub, endpoint), detail, reason=why)


def web_page_problem(hub: str, endpoint: str, url: str, content_type: str, status: int) -> HubProblem:
    """The hub's address answered a 2xx web page (HTML) where its API answers JSON or a file: a captive
    portal or a proxy's login page (the box is offline in effect), or an endpoint variable pointing at a
    website. Said as such, not as "no models match" or a parser's error."""
    return HubProblem("unreachable", hub, endpoint, t("hub.problem.web_page", hub=HUB_NAMES[hub], endpoint=endpoint),
                      _web_page_advice(hub, endpoint), f"HTTP {status} {content_type} <- {url}", reason="other")


def _web_page_advice(hub: str, endpoint: str) -> tuple[str, ...]:
    """What to do about a web page where the hub's API belongs: the endpoint variable, where one is set (it
    may name a website); else the network or proxy (a portal), and the endpoint to try."""
    env = ENDPOINT_ENV[hub]
    if os.environ.get(env, "").strip():
        return (t("hub.advice.not_a_hub", env=env, hub=HUB_NAMES[hub], default=DEFAULT_ENDPOINTS[hub]),)
    proxy = _proxy_variable()
    return (t("hub.advice.proxy_set", env=proxy) if proxy else t("hub.advice.network"),
            _endpoint_advice(hub, endpoint))


def looks_like_web_page(body: object) -> bool:
    """Whether an answer's body (text, or its first bytes) is an HTML page: what a website sends, never the
    hubs' JSON nor a file (whatever the Content-Type says: a mirror may label JSON or a README text/html)."""
    if isinstance(body, (bytes, bytearray)):
        body = bytes(body[:256]).decode("utf-8", "replace")
    return isinstance(body, str) and body.lstrip("\ufeff \t\r\n")[:64].lower().startswith(("<!doctype html", "<html"))


def status_problem(hub: str, endpoint: str, status: int, what: str, detail: str = "",
                   operation: str = "model", web_page: bool = False) -> HubProblem:
    """The hub answered HTTP ``status`` about ``what`` (a model id or a file; ``operation`` "search" for
    a search, where a 404 means the endpoint is not a hub rather than a missing model). ``web_page``: the
    answer was an HTML page; a 404 page is a website's "Not Found" at the endpoint, no hub's answer about a
    model (the hubs answer a missing model in JSON): not a hub, for ``models info`` as for a search; a 401 or 403
    page is a proxy's or a captive portal's login page, no hub's word on the token."""
    name, env, token_env = HUB_NAMES[hub], ENDPOINT_ENV[hub], TOKEN_ENV[hub]
    if status == 404 and web_page:
        return HubProblem("status", hub, endpoint, t("hub.problem.web_404", hub=name, endpoint=endpoint),
                          _web_page_advice(hub, endpoint), detail, status=status)
    if status in (401, 403) and web_page:
        # the hubs refuse a token or a gated model in JSON or plain text, never an HTML page: a page is a proxy's
        # or a captive portal's login page (or a website's), and no token would get past it
        return HubProblem("status", hub, endpoint, t("hub.problem.web_login", hub=name, endpoint=endpoint,
                                                     status=status), _web_page_advice(hub, endpoint), detail,
                          status=status)
    if status == 401 and operation != "search":
        from core.hub.tokens import token_source

        source = token_source(hub)
        if source is not None:  # a token was sent and refused: setting one is not the advice
            return HubProblem("access", hub, endpoint,
                              t("hub.error.token_rejected", hub=name, what=what, source=source), (), detail,
                              status=status)
        return HubProblem("access", hub, endpoint, t("hub.error.unauthorised", hub=name, what=what, env=token_env),
                          (), detail, status=status)
    if status == 403 and operation != "search":
        return HubProblem("access", hub, endpoint, t("hub.error.forbidden", hub=name, what=what, env=token_env),
                          (), detail, status=status)
    if status == 404 and operation != "search":
        return HubProblem("not_found", hub, endpoint, t("hub.error.not_found", hub=name, what=what), (), detail,
                          status=status)
    if status == 404:
        return HubProblem("status", hub, endpoint, t("hub.problem.search_404", hub=name, endpoint=endpoint),
                          (t("hub.advice.not_a_hub", env=env, hub=name, default=DEFAULT_ENDPOINTS[hub]),),
                          detail, status=status)
    if status == 429:
        advice: tuple[str, ...] = (t("hub.advice.rate_limited"),)
    elif status >= 500:
        advice = (t("hub.advice.server_error"), _endpoint_advice(hub, endpoint))
    else:
        advice = (t("hub.advice.try_again"),)
    return HubProblem("status", hub, endpoint, t("hub.problem.status", hub=name, status=status, endpoint=endpoint),
                      advice, detail, status=status)


def link_refused_problem(hub: str, endpoint: str, host: str, what: str, status: int, detail: str = "") -> HubProblem:
    """The storage server ``host`` the hub sent a file to (its CDN, a bucket) refused the signed link with
    ``status`` (403): expired or refused there; no word of the hub's on access, nor a login page. A new try
    asks the hub for a new link."""
    name = HUB_NAMES[hub]
    return HubProblem("status", hub, endpoint, t("hub.problem.link_refused", host=host, hub=name, what=what,
                                                 status=status),
                      (t("hub.advice.new_link", hub=name),), detail, status=status)


def describe_error(exc: BaseException, hub: str, endpoint: str = "") -> HubProblem:
    """The problem behind any exception a hub call raised: tunedeck's own errors carry theirs; an SDK
    surprise becomes ``other`` with its text as the detail (a message on screen, not a traceback)."""
    from core.hub.errors import HubError

    endpoint = endpoint or DEFAULT_ENDPOINTS.get(hub, "")
    if isinstance(exc, HubError):
        if exc.problem is not None:
            return exc.problem
        kind = "sdk_missing" if type(exc).__name__ == "HubSdkMissingError" else "other"
        return HubProblem(kind, hub, endpoint, str(exc))
    return HubProblem("other", hub, endpoint,
                      t("hub.problem.other", hub=HUB_NAMES.get(hub, hub), error=type(exc).__name__),
                      (t("hub.advice.try_again"),), _text_of(exc))
