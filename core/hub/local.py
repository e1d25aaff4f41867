"""Models already on disk: ModelScope's cache, Hugging Face's cache, folders the user adds, and the
models bundled with tunedeck (``bundled_models``), which need no download at all.

The user's folders are the ``hub_model_dirs`` list in settings.json (each folder holds model folders
with a config.json, or is one). Deleting is limited to what this listing found.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import EXIT_USAGE, TunedeckError
from core.hub.hf_source import hf_hub_cache
from core.hub.modelscope_source import modelscope_cache_root, modelscope_cache_roots
from core.i18n import t

SETTINGS_KEY = "hub_model_dirs"


@dataclass(frozen=True)
class LocalModel:
    """A model folder on this box."""

    source: str  # modelscope | hf | folder
    model_id: str
    path: Path
    size_bytes: int
    last_used: float  # newest access or change time of its files (epoch seconds)
    has_config: bool
    weights: str = "complete"  # one of WEIGHT_STATES: complete | partial | none
    empty: bool = False  # no file of the model at all (``holds_no_files``): a download that failed at its start

    @property
    def complete(self) -> bool:
        """A model that can be trained as it is: its config.json and whole weights are there."""
        return self.has_config and self.weights == "complete"

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "id": self.model_id, "path": str(self.path), "size_bytes": self.size_bytes,
                "last_used": self.last_used, "has_config": self.has_config, "weights": self.weights,
                "complete": self.complete, "partial": self.weights == "partial"}


# Files a download leaves while it is not finished: tunedeck's downloader (``<name>.part``) and the
# Hugging Face cache (``blobs/<hash>.incomplete``).
PARTIAL_PATTERNS = ("*.part", "*.incomplete")
WEIGHT_STATES = ("complete", "partial", "none")


def partial_files(path: Path) -> list[Path]:
    """The unfinished download files anywhere under ``path``."""
    return sorted(item for pattern in PARTIAL_PATTERNS for item in path.rglob(pattern) if item.is_file())


def partial_files_words(count: int) -> str:
    """``1 .part/.incomplete file``, ``3 .part/.incomplete files``: how a refusal counts them."""
    from core.units import plural_key

    return t(plural_key("hub.part_files", count), count=count)


def weights_state(path: Path, model_dir: Path | None = None) -> str:
    """``partial`` when a download under ``path`` is not finished (a ``.part`` file), ``none`` when
    ``model_dir`` (the folder with config.json; ``path`` by default) holds no weights at all (the
    trainer's own test, ``core.train.model_setup.has_weights``), else ``complete``."""
    from core.train.model_setup import has_weights

    if partial_files(path):
        return "partial"
    return "complete" if has_weights(model_dir or path) else "none"


def cache_repo(folder: Path) -> Path:
    """Where a download into cached model ``folder`` keeps its unfinished files: a Hugging Face snapshot's
    repo (its blobs/ stand beside snapshots/), else the folder itself."""
    return folder.parents[1] if folder.parent.name == "snapshots" else folder


def cached_model_folder(model_id: str, hub: str = "modelscope") -> Path | None:
    """The folder of a whole copy of hub id ``model_id`` in the Hugging Face or ModelScope cache (its
    config.json and weights, no unfinished download), else None. A run of that id loads it rather than
    asking a hub: the hub may be out of reach (``train --check`` passes a cached model as it is), and a
    model downloaded from one hub is not fetched again from the other the run names. The cache of ``hub``
    (as a run's ``hub`` key says it; ModelScope by default, as there) is looked in first, then the other's."""
    from core.estimate.model_source import cached_configs

    configs = cached_configs(model_id)
    wanted_hf = hub == "huggingface"  # sorted() is stable: each cache keeps its newest snapshot first
    configs = sorted(configs, key=lambda config: config.is_relative_to(hf_hub_cache()) != wanted_hf)
    for config in configs:  # a half-finished copy in one cache does not hide a whole one
        folder = config.parent
        if not partial_files(cache_repo(folder)) and weights_state(folder) == "complete":
            return folder
    return None


def cached_hub(model_id: str) -> str | None:
    """The hub (``huggingface`` or ``modelscope``, as a run's ``hub`` key says it) whose cache holds the whole
    copy a run of ``model_id`` with the default hub (ModelScope) loads (``cached_model_folder``); None where
    neither holds one."""
    folder = cached_model_folder(model_id)
    if folder is None:
        return None
    return "huggingface" if folder.is_relative_to(hf_hub_cache()) else "modelscope"


# What the hubs' SDKs write into a model's folder besides its files: ModelScope's cache index, model and
# version notes (``.msc``, ``.mdl``, ``.mv``) and lock files; Hugging Face's ``refs/`` (the revision asked).
BOOKKEEPING_NAMES = (".msc", ".mdl", ".mv")


def _bookkeeping(item: Path, folder: Path) -> bool:
    relative = item.relative_to(folder).parts
    return item.name in BOOKKEEPING_NAMES or item.name.endswith(".lock") or relative[0] == "refs"


def holds_no_files(path: Path) -> bool:
    """Whether ``path`` holds no file of a model: nothing, or only empty folders and the SDKs' lock and
    bookkeeping files. A download that failed before its first byte leaves such a folder: it is no model."""
    return not any(item.is_file() and not _bookkeeping(item, path) for item in path.rglob("*"))


def _measure(path: Path) -> tuple[int, float]:
    """(bytes of the model's files, each counted once, newest atime/mtime) of a folder; symlinks not followed.
    File bytes, not the disk blocks they take: the figure the hub gives, that ``models info`` and ``download``
    say (blocks made the same model two sizes); the SDKs' bookkeeping files are no part of it."""
    total = 0
    newest = 0.0
    seen: set[tuple[int, int]] = set()
    for item in path.rglob("*"):
        try:
            stat = item.lstat()
        except OSError:
            continue
        if item.is_symlink() or not item.is_file():
            continue
        key = (stat.st_dev, stat.st_ino)
        if key in seen:
            continue
        seen.add(key)
        if not _bookkeeping(item, path):
            total += stat.st_size
        newest = max(newest, stat.st_atime, stat.st_mtime)
    return total, newest


def _entry(source: str, model_id: str, path: Path, config_search: Path | None = None) -> LocalModel:
    size, newest = _measure(path)
    search = config_search or path
    configs = [search / "config.json"] if (search / "config.json").exists() else sorted(search.glob("*/config.json"))
    has_config = bool(configs)
    weights = weights_state(path, configs[0].parent if configs else search)
    return LocalModel(source, model_id, path, size, newest, has_config, weights, holds_no_files(path))


def _modelscope_models() -> list[LocalModel]:
    found: list[LocalModel] = []
    for root in sorted(modelscope_cache_roots()):
        models = root / "models"
        if not models.is_dir():
            continue
        # Not a hidden folder: the SDK's ``._____temp/<owner>/<name>`` holds the files a download of its has not
        # finished (listed as a whole model "._____temp/Qwen", it read as one to train and to delete).
        for owner in sorted(p for p in models.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if "--" in owner.name:  # new layout: models/<owner>--<name>/snapshots/<rev>
                model_id = owner.name.replace("--", "/", 1)
                found.append(_entry("modelscope", model_id, owner, owner / "snapshots"))
                continue
            for model in sorted(p for p in owner.iterdir() if p.is_dir() and not p.name.startswith(".")):
                found.append(_entry("modelscope", f"{owner.name}/{model.name.replace('___', '.')}", model))
    return found


def _hf_models() -> list[LocalModel]:
    root = hf_hub_cache()
    if not root.is_dir():
        return []
    found = []
    for repo in sorted(root.glob("models--*")):
        parts = repo.name.split("--")
        if len(parts) >= 3 and repo.is_dir():
            found.append(_entry("hf", "/".join([parts[1], "--".join(parts[2:])]), repo, repo / "snapshots"))
    return found


def _folder_models(folders: list[str]) -> list[LocalModel]:
    found = []
    for folder in folders:
        path = Path(folder).expanduser()
        if not path.is_dir():
            continue
        if (path / "config.json").exists():
            found.append(_entry("folder", path.name, path))
            continue
        for child in sorted(p for p in path.iterdir() if p.is_dir() and (p / "config.json").exists()):
            found.append(_entry("folder", child.name, child))
    return found


@dataclass(frozen=True)
class BundledModel:
    """A model name tunedeck takes with no download: the built-in tiny model (``builtin``: config and
    tokenizer, its weights start from a fixed seed, so it trains offline) or a bundled config (``config``:
    a published config.json, so the wizard and the estimator plan it offline; training it needs its
    weights from a hub)."""

    name: str
    kind: str  # builtin | config
    path: Path

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "path": str(self.path)}


def bundled_models() -> list[BundledModel]:
    """The names the wizard, ``plan`` and ``estimate`` resolve without a hub: ``tiny`` first, then the
    bundled configs by name."""
    from core.assets import TINY_MODEL_NAME, tiny_model_dir
    from core.estimate.model_source import KNOWN_CONFIG_DIR, known_model_names

    return [BundledModel(TINY_MODEL_NAME, "builtin", tiny_model_dir())] + [
        BundledModel(name, "config", KNOWN_CONFIG_DIR / f"{name}.json")
        for name in sorted(known_model_names(), key=natural_key)]


def natural_key(name: str) -> tuple[tuple[int, float, str], ...]:
    """``name`` sorted as a person reads it: numbers by value, so Qwen2.5-3B comes before Qwen2.5-14B
    (sorted as text, 14B came first), and a family's sizes come smallest first."""
    import re

    return tuple((0, float(part), "") if index % 2 else (1, 0.0, part.lower())
                 for index, part in enumerate(re.split(r"(\d+(?:\.\d+)?)", name)) if part)


def find_bundled(name: str) -> BundledModel | None:
    """The bundled model called ``name`` (as ``models list`` spells it, case aside), if there is one."""
    wanted = name.strip().lower()
    return next((b for b in bundled_models() if b.name.lower() == wanted), None)


def bundled_config(model: BundledModel) -> dict[str, Any]:
    """The config.json of a bundled model (the tiny model's folder holds one; a bundled config is one)."""
    import json

    path = model.path / "config.json" if model.path.is_dir() else model.path
    return json.loads(path.read_text(encoding="utf-8"))


def wizard_model_name(model: LocalModel | BundledModel) -> str:
    """What to hand the wizard for a listed model: a bundled name as it is, a hub cache's model by its
    id (the estimator finds its config.json in the cache), a folder of the user's by its path."""
    if isinstance(model, BundledModel):
        return model.name
    return str(model.path) if model.source == "folder" else model.model_id


def user_model_dirs(settings: Any) -> list[str]:
    """The ``hub_model_dirs`` setting (a list of folders), tolerant of a wrong type."""
    value = getattr(settings, "extra", {}).get(SETTINGS_KEY, []) if settings is not None else []
    return [str(v) for v in value] if isinstance(value, list) else []


def list_local_models(extra_dirs: list[str] | None = None) -> list[LocalModel]:
    """Every model folder in the hub caches and in ``extra_dirs``, most recently used first. A folder that
    holds no file (``holds_no_files``) is listed only as the download tunedeck records into it (failed or
    stopped before its first file: the listing says so and how to resume it); else it is no model (the
    SDK's own download, at a run's start, that failed) and not listed: a 0 B "incomplete model" misled."""
    models = _modelscope_models() + _hf_models() + _folder_models(extra_dirs or [])
    if any(m.empty for m in models):
        from core.hub.download import list_downloads

        downloads = list_downloads()
        models = [m for m in models if not m.empty or download_of(m, downloads) is not None]
    return sorted(models, key=lambda m: m.last_used, reverse=True)


def download_command(model_id: str, hub: str) -> str:
    """The command that downloads (or resumes a download of) ``model_id``; ``hub`` as ``tunedeck models``
    spells it (``modelscope``, ``hf``)."""
    return f"tunedeck models download {model_id}" + (" --hub hf" if hub == "hf" else "")


def download_of(model: LocalModel, downloads: list[Any]) -> Any | None:
    """The download record (``core.hub.download.DownloadStatus``, from ``list_downloads``, newest first) that
    filled ``model``'s folder: its target lies in that folder, or it is the same model from the same hub.
    None for a folder no tunedeck download wrote (a stray one, the user's own)."""
    by_folder = next((job for job in downloads if job.target_dir and _within(job.target_dir, model.path)), None)
    if by_folder is not None or model.complete:
        # A whole model is no unfinished download's: a record of its id that wrote another folder (a cache that
        # moved: MODELSCOPE_CACHE or HF_HOME changed) speaks of that folder, not of this one.
        return by_folder
    return next((job for job in downloads if job.hub == model.source and job.model_id == model.model_id), None)


def superseded_download(job: Any) -> bool:
    """Whether download record ``job`` (``core.hub.download.DownloadStatus``) ended unfinished (failed, stopped)
    in a folder other than the one where its model is now whole in its hub's cache (the cache moved, and the
    model came there another way): the whole model wins, and the record is of a folder no longer in use. A
    finished one whose folder is gone is of no folder in use either."""
    if job.active:
        return False
    if job.status == "done":
        # Its folder deleted by hand since (rm -rf; models rm and x remove the record too): "downloaded to"
        # a folder that is not there is no news of it.
        return bool(job.target_gone)
    folder = cached_model_folder(job.model_id, "huggingface" if job.hub == "hf" else "modelscope")
    if folder is None:
        return False
    root = hf_hub_cache() if job.hub == "hf" else modelscope_cache_root()
    return _within(folder, root) and not (job.target_dir and _within(job.target_dir, cache_repo(folder)))


def _within(path: Path | str, root: Path | str) -> bool:
    """Whether ``path`` is ``root`` or lies under it, both resolved (False when either cannot be)."""
    try:
        path, root = Path(path).resolve(), Path(root).resolve()
    except OSError:
        return False
    return path == root or root in path.parents


def hub_model_of(folder: Path) -> tuple[str, str] | None:
    """``(hub, model id)`` of the download ``folder`` belongs to: a tunedeck download's target, else a
    model of the ModelScope or Hugging Face cache; None for a folder of the user's own."""
    from core.hub.download import list_downloads

    for job in list_downloads():
        if job.target_dir and _within(folder, job.target_dir):
            return job.hub, job.model_id
    for model in _modelscope_models() + _hf_models():
        if _within(folder, model.path):
            return model.source, model.model_id
    return None


def local_model_at(path: Path, extra_dirs: list[str] | None = None) -> LocalModel | None:
    """The model on disk at ``path`` as the Local tab lists it (a hub cache's model by its id, ``path`` its
    folder or a folder inside it, a snapshot); None for a folder the Local tab does not list."""
    resolved = path.resolve()
    found = [m for m in list_local_models(extra_dirs) if _within(resolved, m.path)]
    return max(found, key=lambda m: len(m.path.resolve().parts)) if found else None  # the innermost folder


def folder_model(path: Path) -> LocalModel:
    """``path`` measured as a model folder of the user's (its config.json in it), named by its name."""
    resolved = path.resolve()
    return _entry("folder", resolved.name, resolved)


def config_json_of(model: LocalModel, path: Path | None = None) -> Path | None:
    """The config.json the Local tab reads for ``model``: in ``path`` (a folder the user named inside it) first,
    then its folder, a snapshot of it, a folder inside it; None when there is none."""
    found = [*([path / "config.json"] if path is not None else []), model.path / "config.json",
             *sorted(model.path.glob("snapshots/*/config.json")), *sorted(model.path.glob("*/config.json"))]
    return next((p for p in found if p.is_file()), None)


class DeleteRefusedError(TunedeckError, ValueError):
    """A delete refused (exit 2): a folder the local listing does not know, a download still running into it, a
    live run training on it. ``str()`` says nothing was deleted (``models rm``, ``delete_local_model``: asked to
    delete); ``why`` is the reason and the way out alone, for the app's dialog, said before anything was tried."""

    exit_code = EXIT_USAGE

    def __init__(self, message: object, why: str | None = None) -> None:
        super().__init__(message)
        self.why = str(message) if why is None else why


def _download_records_of(model: LocalModel, target: Path) -> list[Any]:
    """The download records (``core.hub.download``) of ``model``: its hub and id, or a target folder
    inside ``target``."""
    from core.hub.download import list_downloads

    return [job for job in list_downloads()
            if (job.target_dir and _within(job.target_dir, target))
            or (job.hub == model.source and job.model_id == model.model_id)]


def _run_model_folder(model: str, hub: str) -> Path | None:
    """The folder a run of base model ``model`` loads (``core.train.model_setup.resolve_model_path`` without
    its download): the path as given, the bundled model's, or the whole copy in a hub cache."""
    from core.assets import resolve_model_name

    if not model:
        return None
    try:
        local = Path(resolve_model_name(model)).expanduser()
        if local.is_dir():
            return local.resolve()
        cached = cached_model_folder(model, hub)
    except (OSError, ValueError):
        return None
    return cached.resolve() if cached is not None else None


def live_runs_on(target: Path) -> list[tuple[str, str]]:
    """``(run id, status)`` of each live run of this box (queued to stopping, liveness applied: a dead one
    is crashed) whose base model is the folder ``target``: the run loads it, a folder within it (a hub
    cache's ``snapshots/<rev>``, where the listing names the repo folder) or a folder holding it."""
    import socket

    from core.runs.listing import iter_run_dirs
    from core.runs.liveness import effective_status
    from core.runs.states import ACTIVE_STATES

    host = socket.gethostname()
    target = target.resolve()
    found = []
    for run in iter_run_dirs():
        if run.status().status not in ACTIVE_STATES:  # a final status file: no liveness check needed
            continue
        status = effective_status(run).status
        record, unreadable = run.read_record()
        if status not in ACTIVE_STATES or unreadable or record.get("host", host) != host:
            continue
        config = run.config()
        folder = _run_model_folder(str(config.get("model") or record.get("model") or ""),
                                   str(config.get("hub") or "modelscope"))
        if folder is not None and (_within(folder, target) or _within(target, folder)):
            found.append((run.id, str(status)))
    return found


def delete_blocker(model: LocalModel, extra_dirs: list[str] | None = None) -> DeleteRefusedError | None:
    """Why deleting ``model`` would be refused now, as the error ``delete_local_model`` raises (None when it
    would go): a folder the listing does not find, a download into it still running (the way to cancel it), a
    live run of this box training on it (the run, and ``tunedeck stop RUN``). Reads the disk and the runs: off
    the UI thread. The app says it in the dialog and ``models rm`` before asking, not after a y."""
    from core.hub.download import download_running

    if not model.path.exists():  # deleted since it was listed (models rm, another app): said as such
        return _refusal("hub.local.delete_gone", model=model.model_id, path=str(model.path))
    known = {m.path.resolve() for m in list_local_models(extra_dirs)}
    target = model.path.resolve()
    if target not in known:
        return _refusal("hub.local.delete_refused", path=str(model.path))
    running = next((job for job in _download_records_of(model, target)
                    if job.active and download_running(job.job_dir)), None)
    if running is not None:
        return _refusal("hub.local.delete_downloading", model=running.model_id, path=str(model.path),
                        cancel=download_command(running.model_id, running.hub) + " --cancel")
    training = live_runs_on(target)
    if training:
        from core.runs.states import state_label

        run_id, status = training[0]
        return _refusal("hub.local.delete_in_use", model=model.model_id, path=str(model.path),
                        run=run_id, status=state_label(status))
    return None


def _refusal(key: str, **values: Any) -> DeleteRefusedError:
    """A refusal said two ways: ``key`` (nothing was deleted: for a delete that was asked for) and ``key``
    with ``_why`` (the reason and the way out: the app's dialog, before any delete)."""
    return DeleteRefusedError(t(key, **values), why=t(key + "_why", **values))


def stale_download_records(model_id: str, hub: str | None = None) -> list[Any]:
    """The download records (``core.hub.download.DownloadStatus``) of hub id ``model_id`` (case aside; ``hub``'s
    only, when given) that have ended and whose folder is not on disk: ``models list`` lists them under Downloads
    ("deleted": finished, its folder removed by hand; failed or stopped before its folder was made), and no model
    on disk is there for ``models rm`` to delete with them."""
    from core.hub.download import list_downloads

    wanted = model_id.strip().lower()
    return [job for job in list_downloads()
            if job.model_id.lower() == wanted and (hub is None or job.hub == hub) and not job.active
            and not (job.target_dir and Path(job.target_dir).exists())]


def forget_download_records(records: list[Any]) -> list[Any]:
    """Remove the records ``stale_download_records`` found, but one whose download has started again since (its
    downloader runs: it is no record to forget); returns those removed."""
    from core.hub.download import download_running

    removed = []
    for job in records:
        if download_running(job.job_dir):
            continue
        shutil.rmtree(job.job_dir, ignore_errors=True)
        removed.append(job)
    return removed


def delete_local_model(model: LocalModel, extra_dirs: list[str] | None = None) -> int:
    """Delete ``model``'s folder and the record of its download (``models list`` would still show it
    done); returns the bytes freed. Only a folder the listing finds is deleted, and none while a
    download into it runs or a live run trains on it: that is refused (``delete_blocker``), nothing
    deleted (cancel the download, stop the run first)."""
    blocker = delete_blocker(model, extra_dirs)
    if blocker is not None:
        raise blocker
    target = model.path.resolve()
    records = _download_records_of(model, target)
    size, _ = _measure(target)
    shutil.rmtree(target)
    for job in records:
        shutil.rmtree(job.job_dir, ignore_errors=True)
    return size
