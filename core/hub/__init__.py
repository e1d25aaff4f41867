"""ModelScope and Hugging Face: search, model facts, file lists, downloads, local caches, tokens.

``open_hub(hub)`` gives a client with ``search``, ``details``, ``file_url``; ``plan_download`` /
``check_disk`` / ``start_download`` run a detached, resumable download whose progress
``read_status`` reads; ``list_local_models`` / ``delete_local_model`` manage what is on disk. Nothing
here imports an SDK until a client is opened.
"""

from __future__ import annotations

from core.hub.errors import (
    DownloadError,
    HubAccessError,
    HubError,
    HubNotFoundError,
    HubSdkMissingError,
    HubUnavailableError,
    NotEnoughDiskError,
)
from core.hub.records import (
    HUBS,
    SIZE_CLASSES,
    SORTS,
    ModelDetails,
    ModelSummary,
    RepoFile,
    SearchPage,
    SearchQuery,
)

__all__ = [
    "HUBS",
    "SIZE_CLASSES",
    "SORTS",
    "DownloadError",
    "HubAccessError",
    "HubError",
    "HubNotFoundError",
    "HubSdkMissingError",
    "HubUnavailableError",
    "ModelDetails",
    "ModelSummary",
    "NotEnoughDiskError",
    "RepoFile",
    "SearchPage",
    "SearchQuery",
]
