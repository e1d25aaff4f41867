"""Put a model's details together: metadata, files, and the small files read whole (card, config; the config
is kept in ``core.hub.config_cache``)."""

from __future__ import annotations

import json
from typing import Any

from core.hub.errors import HubError
from core.hub.records import ModelDetails, ModelSummary, RepoFile
from core.i18n import t


def assemble_details(source: Any, summary: ModelSummary, files: tuple[RepoFile, ...], revision: str) -> ModelDetails:
    """``ModelDetails`` with README.md and config.json read through ``source.read_small_file``.

    A missing or unreadable card or config is a note, not a failure: the files and metadata still show.
    """
    names = {item.path for item in files}
    notes: list[str] = []
    readme = ""
    card = next((name for name in ("README.md", "readme.md", "README.MD") if name in names), None)
    if card is not None:
        try:
            readme = source.read_small_file(summary.model_id, card, revision).decode("utf-8", "replace")
        except HubError as exc:
            notes.append(t("hub.note.readme_unreadable", reason=str(exc)))
    config: dict[str, Any] | None = None
    if "config.json" in names:
        try:
            raw = source.read_small_file(summary.model_id, "config.json", revision)
            data = json.loads(raw.decode("utf-8"))
            config = data if isinstance(data, dict) else None
            if config is None:
                notes.append(t("hub.note.config_not_object"))
        except HubError as exc:
            notes.append(t("hub.note.config_unreadable", reason=str(exc)))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            notes.append(t("hub.note.config_invalid", reason=str(exc)))
    else:
        notes.append(t("hub.note.no_config"))
    if config is not None:  # kept: plan, estimate and the wizard size the model before it is downloaded
        from core.hub.config_cache import store_hub_config

        store_hub_config(summary.hub, summary.model_id, config, files)
    return ModelDetails(summary=summary, files=files, readme=readme, config=config, revision=revision,
                        notes=tuple(notes))
