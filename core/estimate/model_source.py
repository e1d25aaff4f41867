"""Finding a model's ``config.json``: a path, a local model folder, a bundled config, or a hub cache.

The bundled configs (``known_configs/``) are the published ones of common base models, so an estimate
works offline; chat/instruct variants share their base model's shapes, so ``Qwen/Qwen2.5-7B-Instruct``
resolves to ``Qwen2.5-7B.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import EXIT_USAGE, TunedeckError
from core.estimate.architecture import ModelArchitecture, architecture_from_config
from core.i18n import t

KNOWN_CONFIG_DIR = Path(__file__).parent / "known_configs"
# The hub ids each bundled config was published under, per hub (data beside the configs; a file whose name
# starts with "_" is no config).
HUB_IDS_FILE = KNOWN_CONFIG_DIR / "_hub_ids.json"

# Suffixes of fine-tuned variants whose shapes are those of the base model.
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-base", "-hf")
# Names under which a bundled config is also known (lower case, organisation dropped).
_ALIASES = {
    "llama-3-8b": "meta-llama-3-8b",
    "llama3-8b": "meta-llama-3-8b",
    "mistral-7b": "mistral-7b-v0.1",
}


class ModelNotFoundError(TunedeckError, ValueError):
    """No config.json could be found for what the user named. ``kind`` names the case (``unknown_model``,
    ``no_config_in_dir``; empty for the others) and ``params`` its values: the message tells a command line what
    to pass (``--model``), and a screen says what to type in its own words from these."""

    exit_code = EXIT_USAGE

    def __init__(self, message: object = "", *, kind: str = "", **params: object) -> None:
        super().__init__(message)
        self.kind, self.params = kind, params


@dataclass(frozen=True)
class ModelConfig:
    """A model's config.json contents and where they came from."""

    name: str
    config: dict[str, Any]
    source: str  # "bundled", a file path, or a cache path

    def architecture(self) -> ModelArchitecture:
        return architecture_from_config(self.config, name=self.name, source=self.source)


def known_model_names() -> list[str]:
    """Names of the bundled configs (file stems), sorted."""
    return sorted(path.stem for path in _config_files())


def _config_files() -> list[Path]:
    return [path for path in KNOWN_CONFIG_DIR.glob("*.json") if not path.name.startswith("_")]


def _bundled_key(name: str) -> str:
    key = name.strip().rstrip("/").split("/")[-1].lower()
    changed = True
    while changed:
        changed = False
        for suffix in _VARIANT_SUFFIXES:
            if key.endswith(suffix):
                key = key[: -len(suffix)]
                changed = True
    return _ALIASES.get(key, key)


def _bundled_config(name: str) -> Path | None:
    key = _bundled_key(name)
    for path in _config_files():
        if path.stem.lower() == key:
            return path
    return None


def bundled_hub_id(name: str, hub: str) -> str | None:
    """The hub id under which the bundled config ``name`` was published on ``hub`` (``modelscope`` or
    ``huggingface``); None when ``name`` is no bundled config's name (a path, a hub id ``owner/name``,
    anything else). A variant (``Qwen2.5-7B-Instruct``) keeps its own name under its base model's owner."""
    value = name.strip()
    if not value or "/" in value or "\\" in value:
        return None
    bundled = _bundled_config(value)
    if bundled is None:
        return None
    try:
        ids = json.loads(HUB_IDS_FILE.read_text(encoding="utf-8")).get(bundled.stem) or {}
    except (OSError, ValueError):
        return None
    hub_id = ids.get(hub) or ids.get("modelscope")
    if not isinstance(hub_id, str):
        return None
    if value.lower().endswith(("-instruct", "-chat")):  # a tuned variant, published under its own name
        return f"{hub_id.split('/')[0]}/{value}"
    return hub_id


def cached_config(model_id: str) -> Path | None:
    """config.json of ``org/name`` in the Hugging Face or ModelScope cache, if downloaded there: the first
    of ``cached_configs``."""
    return next(iter(cached_configs(model_id)), None)


def cached_configs(model_id: str) -> list[Path]:
    """Every config.json of ``org/name`` in the Hugging Face and ModelScope caches, Hugging Face's first and
    each cache's newest snapshot first (a half-finished copy in one may stand beside a whole one in the other)."""
    if model_id.count("/") != 1:
        return []
    from core.hub.hf_source import hf_hub_cache  # where downloads go, and what core.hub.local compares with
    from core.hub.modelscope_source import modelscope_cache_roots  # the SDK's and core.hub.download's

    org, name = model_id.split("/")
    candidates = _snapshot_configs(hf_hub_cache() / f"models--{org}--{name}" / "snapshots")
    # <root>/models/<owner>/<name> (the SDK now, and tunedeck's downloads), <root>/<owner>/<name> (older SDKs)
    for base in [root / "models" for root in modelscope_cache_roots()] + modelscope_cache_roots():
        candidates.append(base / org / name / "config.json")
        # ModelScope stores dots in names as "___" in some versions.
        candidates.append(base / org / name.replace(".", "___") / "config.json")
        # The SDK's new layout, as Hugging Face's: models/<org>--<name>/snapshots/<revision>/ (listed by
        # core.hub.local as on disk, so planned and trained from there too).
        candidates += _snapshot_configs(base / f"{org}--{name}" / "snapshots")
    return [path for path in candidates if path.is_file()]


def _snapshot_configs(snapshots: Path) -> list[Path]:
    """The config.json of each revision under a ``snapshots`` folder, the newest first."""
    if not snapshots.is_dir():
        return []
    return sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelNotFoundError(t("estimate.error.config_unreadable", path=str(path), reason=str(exc))) from exc
    except json.JSONDecodeError as exc:
        raise ModelNotFoundError(
            t("estimate.error.config_json", path=str(path), line=exc.lineno, reason=exc.msg)
        ) from exc
    if not isinstance(data, dict):
        raise ModelNotFoundError(t("estimate.error.config_json", path=str(path), line=1, reason="not an object"))
    return data


def read_config_json(path: Path) -> dict[str, Any] | None:
    """A model's config.json as a dict, None where it does not read or is not a JSON object (the checks of
    ``load_model_config``, for a caller that has another answer to fall back on)."""
    try:
        return _read_config(path)
    except ModelNotFoundError:
        return None


def load_model_config(spec: str, hub_cache: bool = False, fetch: bool = False) -> ModelConfig:
    """Resolve ``spec`` (a config.json path, a model folder, a hub id or a bundled name) to its config.

    Order: an existing file or folder on disk, then the bundled configs, then the local hub caches (the
    weights' downloads); with ``hub_cache`` (planning and estimating, not a run's own checks) then the
    config.json tunedeck read from a hub (``core.hub.config_cache``: its ``source`` is the kept file), and
    with ``fetch`` a hub id found nowhere here is read from the hub and kept (raises ``ModelNotFoundError``
    with what was looked at and what to do when the hub cannot give it).
    """
    path = Path(spec).expanduser()
    if path.is_file():
        return ModelConfig(name=path.parent.name or path.stem, config=_read_config(path), source=str(path))
    if path.is_dir():
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelNotFoundError(t("estimate.error.no_config_in_dir", path=str(path)), kind="no_config_in_dir",
                                     path=str(path))
        return ModelConfig(name=path.name, config=_read_config(config_path), source=str(config_path))
    bundled = _bundled_config(spec)
    if bundled is not None:
        return ModelConfig(name=spec, config=_read_config(bundled), source="bundled")
    cached = cached_config(spec)
    if cached is not None:
        return ModelConfig(name=spec, config=_read_config(cached), source=str(cached))
    if hub_cache or fetch:
        from core.hub.config_cache import find_hub_config

        kept = find_hub_config(spec)
        if kept is not None:
            return ModelConfig(name=spec, config=_read_config(kept.path), source=str(kept.path))
    if fetch:
        from core.hub.records import is_hub_id

        if is_hub_id(spec):
            return _fetched_config(spec)
    known = ", ".join(known_model_names())
    raise ModelNotFoundError(t("estimate.error.unknown_model", model=spec, known=known), kind="unknown_model",
                             model=spec, known=known)


def _fetched_config(model_id: str) -> ModelConfig:
    """``model_id``'s config.json from the hub (kept for the next plan), or why it cannot be had, in one line."""
    from core.hub.config_cache import fetch_hub_config
    from core.hub.errors import HubError, HubNotFoundError
    from core.hub.problems import describe_error

    try:
        fetched = fetch_hub_config(model_id)
    except HubNotFoundError as exc:
        problem = describe_error(exc, "").summary
        raise ModelNotFoundError(t("estimate.error.hub_not_found", model=model_id, problem=problem),
                                 kind="hub_not_found", model=model_id, problem=problem) from exc
    except HubError as exc:
        problem = describe_error(exc, "").summary
        raise ModelNotFoundError(t("estimate.error.hub_config_unavailable", model=model_id, problem=problem),
                                 kind="hub_config_unavailable", model=model_id, problem=problem) from exc
    if fetched is None:
        raise ModelNotFoundError(t("estimate.error.hub_no_config", model=model_id), kind="hub_no_config",
                                 model=model_id)
    config, kept = fetched
    return ModelConfig(name=model_id, config=config, source=str(kept.path))
