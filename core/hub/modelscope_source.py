"""ModelScope through its SDK (``modelscope_hub``, which ``modelscope`` 1.40 delegates all hub calls to).

``modelscope_hub`` is imported here rather than ``modelscope.hub.api``: the latter pulls in torch and
takes seconds, the former is the same client without the weight. The SDK's own settings apply:
``MODELSCOPE_ENDPOINT`` (or an explicit endpoint), ``MODELSCOPE_API_TOKEN``, ``MODELSCOPE_CACHE``.
Its clients are built with short timeouts and one attempt, so an offline box gets an answer in seconds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from core.hub.errors import HubError, HubSdkMissingError
from core.hub.http import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, requests_error, unreachable_error
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

HUB = "modelscope"
_SORT_KEYS = {"downloads": "downloads", "likes": "likes", "recent": "last_modified"}
SMALL_FILE_LIMIT = 2 * 1024 * 1024
MAX_LISTED = 3000  # the hub lists at most this many results of one query (page x size)  # README.md and config.json are read whole, up to this size


def modelscope_cache_root() -> Path:
    """Root of ModelScope's model cache: ``MODELSCOPE_CACHE``, else ``~/.cache/modelscope/hub``."""
    value = os.environ.get("MODELSCOPE_CACHE", "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "modelscope" / "hub"


def modelscope_cache_roots() -> list[Path]:
    """Every folder the SDK's versions put ModelScope models under, ``modelscope_cache_root()`` first: with
    ``MODELSCOPE_CACHE`` also its ``hub/`` (an SDK that kept models in ``$MODELSCOPE_CACHE/hub``); without,
    also ``~/.cache/modelscope``, beside ``hub/`` (the SDK's new layout). Models are in ``models/`` under each,
    or (older SDKs) right in it as ``<owner>/<name>``."""
    base = modelscope_cache_root()
    if base.name != "hub":
        return [base, base / "hub"]
    if base.parent.name == "modelscope":
        return [base, base.parent]
    return [base]


def modelscope_model_dir(model_id: str) -> Path:
    """Where a model's files go: ``<cache root>/models/<owner>/<name>`` with dots spelt ``___``.

    This is the layout the SDK's ``snapshot_download`` reuses (and ``core.estimate`` finds configs in).
    """
    owner, name = model_id.split("/", 1)
    return modelscope_cache_root() / "models" / owner / name.replace(".", "___")


def _iso(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (int, float)):
        import datetime as _dt

        return _dt.datetime.fromtimestamp(value, tz=_dt.timezone.utc).isoformat()
    return str(value)


class ModelScopeSource:
    """Search, details, file lists and download URLs of ModelScope."""

    hub = HUB

    def __init__(self, endpoint: str | None = None, token: str | None = None,
                 timeout_s: float = READ_TIMEOUT_S) -> None:
        try:
            from modelscope_hub import HubApi
            from modelscope_hub._legacy_api import LegacyClient
            from modelscope_hub._openapi import OpenAPIClient
            from modelscope_hub.config import HubConfig
        except ImportError as exc:
            raise HubSdkMissingError(t("hub.error.sdk_missing", hub="ModelScope", package="modelscope")) from exc
        # A config of our own rather than the SDK's per-process default: it reads MODELSCOPE_ENDPOINT,
        # MODELSCOPE_CACHE and MODELSCOPE_HOME now, and the token is exactly ours ("" = none, never the
        # SDK's stored login).
        config = HubConfig(endpoint=endpoint or None, token=token or "")
        self._api = HubApi(config=config)
        self.endpoint: str = config.endpoint
        self.token = token or None
        self.timeout_s = timeout_s
        # The SDK's defaults are 10 s to connect, 60 s to read and five attempts with back-off: fine for a
        # script, a frozen-looking screen for a person. The same clients, built with our limits (the
        # ``modelscope.hub.api`` shim builds its legacy client the same way).
        self._api._openapi = OpenAPIClient(config, timeout=timeout_s, max_retries=1)
        legacy = LegacyClient(token=token or None, endpoint=self.endpoint, timeout=int(max(1, timeout_s)),
                              max_retries=0)
        legacy._timeout = (CONNECT_TIMEOUT_S, timeout_s)
        self._api._legacy = legacy
        # A web page where the API answers JSON (a captive portal, a website at MODELSCOPE_ENDPOINT): the
        # SDK would take it for an empty search or fail parsing it; said for what it is instead.
        from core.hub.http import web_page_hook

        for client in (self._api._openapi, legacy):
            for session in (client._session, client._read_session):
                session.hooks["response"].append(web_page_hook(HUB))

    # --- errors ------------------------------------------------------------------------------------
    def _translate(self, exc: BaseException, what: str, operation: str = "model") -> HubError:
        from modelscope_hub import errors as sdk

        status = getattr(exc, "status_code", None)
        if isinstance(exc, sdk.AuthenticationError):
            status = 401
        elif isinstance(exc, sdk.PermissionDeniedError):
            status = 403
        elif isinstance(exc, sdk.NotExistError):
            status = 404
        if isinstance(status, int) and status >= 400:
            from core.hub.http import status_error
            from core.hub.problems import looks_like_web_page

            return status_error(HUB, status, what, self.endpoint, str(exc), operation,
                                looks_like_web_page(getattr(exc, "response_body", None)))
        return unreachable_error(HUB, self.endpoint, exc)

    def _call(self, what: str, fn: Any, *args: Any, operation: str = "model", **kwargs: Any) -> Any:
        from modelscope_hub.errors import HubError as SdkError

        try:
            return fn(*args, **kwargs)
        except (SdkError, OSError) as exc:
            raise self._translate(exc, what, operation) from exc

    # --- reading -----------------------------------------------------------------------------------
    def _summary(self, info: Any) -> ModelSummary:
        model_id = f"{info.owner}/{info.name}"
        return ModelSummary(
            hub=HUB, model_id=model_id, downloads=int(info.downloads or 0), likes=int(info.likes or 0),
            updated=_iso(info.last_modified), license=info.license or None, tasks=tuple(info.tasks or ()),
            params=parameters_from_name(model_id), private=bool(info.private), gated=bool(info.gated),
        )

    def search(self, query: SearchQuery) -> SearchPage:
        """A page of models matching ``query``; with a size class (filtered here: the hub has no such
        filter) the first page from ``query.page`` on that holds one (``scan_for_size_class``)."""
        return scan_for_size_class(query, lambda number: self._search_page(query, number))

    def _search_page(self, query: SearchQuery, number: int) -> SearchPage:
        if number * query.page_size > MAX_LISTED:
            return SearchPage(items=(), total=MAX_LISTED, page=number, page_size=query.page_size)
        filters = {"task": query.task} if query.task else {}
        page = self._call(query.text or "*", self._api.list_repos, "model", operation="search",
                          search=query.text or None, owner=query.owner or None, sort=_SORT_KEYS.get(query.sort),
                          page_number=number, page_size=query.page_size, **filters)
        matching = [s for s in (self._summary(info) for info in page.items) if in_size_class(s.params, query.size_class)]
        items = tuple(s for s in matching if usable_id(s.model_id))
        total = min(int(page.total_count or 0), MAX_LISTED)
        return SearchPage(items=items, total=total, page=number, page_size=query.page_size,
                          unusable=len(matching) - len(items))

    def file_url(self, model_id: str, path: str, revision: str = "master") -> str:
        return self._api.legacy.get_download_url(model_id, "model", path, revision)

    def auth_headers(self) -> dict[str, str]:
        from core.hub.http import auth_headers_for

        return auth_headers_for(HUB, self.token)

    def list_files(self, model_id: str, revision: str = "master") -> tuple[RepoFile, ...]:
        files = self._call(model_id, self._api.list_repo_files, model_id, "model", revision=revision)
        return tuple(RepoFile(path=f.path, size=int(f.size or 0), sha256=f.sha256 or None)
                     for f in files if not f.is_dir)

    def read_small_file(self, model_id: str, path: str, revision: str = "master") -> bytes:
        """A small file's bytes (README.md, config.json)."""
        import requests

        from core.hub.http import web_page_hook

        url = self.file_url(model_id, path, revision)
        try:
            response = requests.get(url, headers=self.auth_headers(), timeout=(CONNECT_TIMEOUT_S, self.timeout_s),
                                    hooks={"response": web_page_hook(HUB)})
            response.raise_for_status()
        except requests.RequestException as exc:
            raise requests_error(HUB, exc, f"{model_id}/{path}", self.endpoint) from exc
        return response.content[:SMALL_FILE_LIMIT]

    def details(self, model_id: str) -> ModelDetails:
        """Metadata, files, model card and config.json of ``model_id``."""
        from core.hub.details import assemble_details

        info = self._call(model_id, self._api.get_repo, model_id, "model")
        files = self.list_files(model_id)
        return assemble_details(self, self._summary(info), files, "master")

    def model_dir(self, model_id: str, revision: str = "master") -> Path:
        return modelscope_model_dir(model_id)
