"""The config.json of hub models read from a hub but not downloaded, kept so that ``plan``, ``estimate`` and
the wizard size a model before its weights come (``tunedeck train`` downloads them at its start).

``<data root>/cache/hub-configs/<hub>/<org>/<name>/config.json``, with ``meta.json`` beside it: the bytes a
download of the model fetches (one weight format, ``core.hub.file_selection``), from the hub's file list.
Filled wherever tunedeck reads a model's config.json from a hub (``core.hub.details.assemble_details``: the
Models screen's card, ``models info``, and ``fetch_hub_config``, which ``plan`` and ``estimate`` use for a
hub id found nowhere on this box). Model ids are data: only one ``is_hub_id`` accepts names a folder here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.hub.records import HUBS, RepoFile, is_hub_id
from core.paths import data_root, ensure_private_dir

# A hub answering slowly is not waited on as a search is: planning says what to do instead.
FETCH_TIMEOUT_S = 8.0
META_NAME = "meta.json"
# A kept config is used however old (plans work offline); one older than this says when it was read, since
# the model may have changed on the hub since (the card and ``models info`` read it again).
STALE_AFTER_S = 7 * 24 * 3600


@dataclass(frozen=True)
class CachedHubConfig:
    """A model's config.json as a hub gave it: where it lies here, the hub, and what a download fetches."""

    path: Path
    hub: str
    model_id: str
    download_bytes: int | None = None


def cache_root() -> Path:
    """The folder of every cached hub config."""
    return data_root() / "cache" / "hub-configs"


def cached_config_path(hub: str, model_id: str) -> Path | None:
    """Where ``model_id``'s config.json from ``hub`` is kept; None for an id that names no model (``../x``,
    ``a/b/c``, an absolute path): such an id never becomes a path."""
    if hub not in HUBS or not is_hub_id(model_id):
        return None
    org, name = model_id.split("/")
    return cache_root() / hub / org / name / "config.json"


def store_hub_config(hub: str, model_id: str, config: dict[str, Any],
                     files: tuple[RepoFile, ...] = ()) -> Path | None:
    """Keep ``config`` (read from ``hub``) with the size of the download ``files`` make; the path kept, or None
    when the id is refused or the disk is not writable (a cache: its failure costs only the next plan)."""
    from core.atomic_file import write_json_atomic
    from core.hub.file_selection import select_files

    path = cached_config_path(hub, model_id)
    if path is None:
        return None
    chosen, _ = select_files(files)
    download_bytes = sum(item.size for item in chosen) if chosen else None
    try:
        ensure_private_dir(path.parent)
        write_json_atomic(path, config)
        write_json_atomic(path.parent / META_NAME, {"hub": hub, "model_id": model_id,
                                                     "download_bytes": download_bytes})
    except OSError:
        return None
    return path


def _entry(path: Path, hub: str, model_id: str) -> CachedHubConfig:
    download_bytes = None
    try:
        meta = json.loads((path.parent / META_NAME).read_text(encoding="utf-8"))
        value = meta.get("download_bytes") if isinstance(meta, dict) else None
        download_bytes = value if isinstance(value, int) and not isinstance(value, bool) else None
    except (OSError, ValueError):
        pass
    return CachedHubConfig(path=path, hub=hub, model_id=model_id, download_bytes=download_bytes)


def find_hub_config(model_id: str) -> CachedHubConfig | None:
    """The cached config.json of ``model_id``, the default hub's first; None when none is kept."""
    for hub in HUBS:
        path = cached_config_path(hub, model_id)
        if path is not None and path.is_file():
            return _entry(path, hub, model_id)
    return None


def hub_config_origin(source: str) -> CachedHubConfig | None:
    """The cached hub config that ``source`` (a ``ModelConfig.source``) is, or None when it is something else
    (a file the user named, a model on disk, a bundled config)."""
    if not source or source == "bundled":
        return None
    try:
        relative = Path(source).resolve().relative_to(cache_root().resolve())
    except (OSError, ValueError):
        return None
    parts = relative.parts
    if len(parts) != 4 or parts[3] != "config.json":
        return None
    return _entry(Path(source), parts[0], f"{parts[1]}/{parts[2]}")


def fetch_hub_config(model_id: str, timeout_s: float = FETCH_TIMEOUT_S) -> tuple[dict[str, Any], CachedHubConfig] | None:
    """Read ``model_id``'s details (its config.json among them) from the default hub, then from the other one
    where the first does not know the model, and keep its config: (the config, where it is kept). None when
    the hub has the model but no config.json that is a JSON object. Raises the ``HubError`` of the hub that
    failed (out of reach, refused; the first one's "not found" when neither knows the model) and ``ValueError``
    for an id that names no model."""
    from core.hub.errors import HubError, HubNotFoundError
    from core.hub.source import open_hub

    path = cached_config_path(HUBS[0], model_id)
    if path is None:
        raise ValueError(model_id)
    first: HubError | None = None
    for hub in HUBS:
        try:
            details = open_hub(hub, timeout_s=timeout_s).details(model_id)  # assemble_details keeps the config
        except HubNotFoundError as exc:
            first = first or exc
            continue
        # any other HubError (out of reach, refused) goes up: the other hub is not asked, offline costs seconds
        if details.config is None:
            return None
        if details.summary.model_id != model_id:  # the hub's spelling of it: kept under the one asked for too
            store_hub_config(hub, model_id, details.config, details.files)
        return details.config, _entry(cached_config_path(hub, model_id) or path, hub, model_id)
    assert first is not None
    raise first


def weights_not_here(source: str) -> str:
    """What a plan or an estimate sized from ``source`` (a ``ModelConfig.source``) says when that is a hub's
    config.json kept here: the weights are not on this box yet and ``tunedeck train`` downloads them (their
    size, where the hub listed the files). "" for any other source."""
    from core.hub.download import human_bytes
    from core.hub.problems import HUB_NAMES
    from core.i18n import t

    kept = hub_config_origin(source)
    if kept is None:
        return ""
    hub = HUB_NAMES.get(kept.hub, kept.hub)
    if kept.download_bytes:
        text = t("estimate.weights_not_here_size", model=kept.model_id, hub=hub, size=human_bytes(kept.download_bytes))
    else:
        text = t("estimate.weights_not_here", model=kept.model_id, hub=hub)
    read = config_read_at(kept)
    if read is not None and time.time() - read > STALE_AFTER_S:
        command = f"tunedeck models info {kept.model_id}" + (" --hub hf" if kept.hub == "hf" else "")
        text += t("estimate.hub_config_read_on", date=time.strftime("%Y-%m-%d", time.localtime(read)), command=command)
    return text


def config_read_at(kept: CachedHubConfig) -> float | None:
    """When the kept config.json was read from its hub (the time it was written here), None if unreadable."""
    try:
        return kept.path.stat().st_mtime
    except OSError:
        return None


def source_json(source: str) -> dict[str, Any]:
    """Where a plan's config.json came from, for ``--json``: ``config`` (a path, or ``bundled``), and for a hub's
    config kept here ``hub``, ``weights_on_box`` false and ``download_bytes`` (null where not listed)."""
    kept = hub_config_origin(source)
    if kept is None:
        return {"config": source, "hub": None, "weights_on_box": None, "download_bytes": None, "config_read": None}
    read = config_read_at(kept)
    return {"config": source, "hub": kept.hub, "weights_on_box": False, "download_bytes": kept.download_bytes,
            "config_read": None if read is None else time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(read))}
