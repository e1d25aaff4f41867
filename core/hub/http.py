"""Small HTTP helpers shared by the hub sources and the downloader: timeouts and error translation."""

from __future__ import annotations

from typing import Any

from core.hub.errors import HubAccessError, HubError, HubNotFoundError, HubUnavailableError
from core.i18n import t

CONNECT_TIMEOUT_S = 4.0
READ_TIMEOUT_S = 15.0
HUB_NAMES = {"modelscope": "ModelScope", "hf": "Hugging Face"}
ENDPOINT_ENV = {"modelscope": "MODELSCOPE_ENDPOINT", "hf": "HF_ENDPOINT"}
TOKEN_ENV_NAME = {"modelscope": "MODELSCOPE_API_TOKEN", "hf": "HF_TOKEN"}


def status_error(hub: str, status: int, what: str, endpoint: str) -> HubError:
    """The exception for an HTTP error ``status`` on ``what`` (a model id or a file)."""
    name = HUB_NAMES[hub]
    if status == 401:
        return HubAccessError(t("hub.error.unauthorised", hub=name, what=what, env=TOKEN_ENV_NAME[hub]), 401)
    if status == 403:
        return HubAccessError(t("hub.error.forbidden", hub=name, what=what, env=TOKEN_ENV_NAME[hub]), 403)
    if status == 404:
        return HubNotFoundError(t("hub.error.not_found", hub=name, what=what))
    return HubUnavailableError(t("hub.error.status", hub=name, status=status, what=what, endpoint=endpoint))


def unreachable_error(hub: str, endpoint: str, reason: BaseException | str) -> HubUnavailableError:
    text = str(reason).splitlines()[0] if str(reason) else type(reason).__name__
    if len(text) > 160:
        text = text[:157] + "..."
    return HubUnavailableError(t("hub.error.unreachable", hub=HUB_NAMES[hub], endpoint=endpoint, reason=text,
                                 env=ENDPOINT_ENV[hub]))


def requests_error(hub: str, exc: BaseException, what: str, endpoint: str) -> HubError:
    """Translate an exception of ``requests`` (or a response status carried on it)."""
    response: Any = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int) and status >= 400:
        return status_error(hub, status, what, endpoint)
    return unreachable_error(hub, endpoint, exc)


def auth_headers_for(hub: str, token: str | None) -> dict[str, str]:
    """Headers that authenticate file downloads on ``hub`` (ModelScope's SDK sends both forms)."""
    if not token:
        return {}
    headers = {"Authorization": f"Bearer {token}"}
    if hub == "modelscope":
        headers["Cookie"] = f"m_session_id={token}"
    return headers
