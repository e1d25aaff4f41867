"""Pick a hub: ``open_hub("modelscope" | "hf")`` gives an object with the same methods for both."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from core.hub.http import READ_TIMEOUT_S
from core.hub.records import HUBS, ModelDetails, RepoFile, SearchPage, SearchQuery
from core.hub.tokens import hub_token


class HubSource(Protocol):
    hub: str
    endpoint: str

    def search(self, query: SearchQuery) -> SearchPage: ...

    def details(self, model_id: str) -> ModelDetails: ...

    def file_url(self, model_id: str, path: str, revision: str = ...) -> str: ...

    def auth_headers(self) -> dict[str, str]: ...

    def read_small_file(self, model_id: str, path: str, revision: str = ...) -> bytes: ...

    def model_dir(self, model_id: str, revision: str = ...) -> Path: ...


def open_hub(hub: str = "modelscope", endpoint: str | None = None, token: str | None = None,
                timeout_s: float = READ_TIMEOUT_S) -> HubSource:
    """A client for ``hub``; the token defaults to the environment or tunedeck's token file.

    Raises ``HubSdkMissingError`` when the hub's SDK is not installed.
    """
    if hub not in HUBS:
        raise ValueError(f"unknown hub {hub!r}; choose one of {', '.join(HUBS)}")
    token = token if token is not None else hub_token(hub)
    if hub == "hf":
        from core.hub.hf_source import HfSource

        return HfSource(endpoint=endpoint, token=token, timeout_s=timeout_s)
    from core.hub.modelscope_source import ModelScopeSource

    return ModelScopeSource(endpoint=endpoint, token=token, timeout_s=timeout_s)


def parse_files(entries: list[dict]) -> tuple[RepoFile, ...]:
    """RepoFiles from their JSON form (``RepoFile.to_json``)."""
    return tuple(RepoFile(path=e["path"], size=int(e["size"]), sha256=e.get("sha256")) for e in entries)
