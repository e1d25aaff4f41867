"""User settings: one JSON file under the config dir, mode 0600, replaced atomically.

Unknown keys are kept as they are, so that a newer tunedeck's settings survive an older one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from core.atomic_file import write_json_atomic
from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import t
from core.paths import ensure_private_dir, settings_path

MIN_POLL_INTERVAL_S = 0.25


class SettingsError(TunedeckError):
    """A settings file that cannot be read or holds a value out of range (exit 2)."""

    exit_code = EXIT_USAGE


@dataclass
class Settings:
    theme: str = "tunedeck-dark"
    language: str = ""  # "" = from the locale
    gpu_poll_interval_s: float = 1.0
    price_per_gpu_hour: float = 0.0
    bell: bool = False
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.gpu_poll_interval_s = max(MIN_POLL_INTERVAL_S, float(self.gpu_poll_interval_s))


def load_settings(path: Path | None = None) -> Settings:
    """Read the settings file; a missing file gives the defaults, a broken one a clear error."""
    path = path or settings_path()
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Settings()
    except IsADirectoryError as exc:  # "fix or delete the file" does not fit a folder: it is to be moved
        raise SettingsError(t("cli.settings_is_dir", path=path)) from exc
    except (OSError, ValueError) as exc:
        raise SettingsError(t("cli.settings_unreadable", path=path, reason=exc)) from exc
    if not isinstance(raw, dict):
        raise SettingsError(t("cli.settings_not_object", path=path))
    known = {f.name for f in fields(Settings)} - {"extra"}
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        (values if key in known else extra)[key] = value
    defaults = Settings()
    for key, value in list(values.items()):
        expected = type(getattr(defaults, key))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
            raise SettingsError(
                t("cli.settings_wrong_type", path=path, key=key, expected=expected.__name__, value=repr(value))
            )
        values[key] = value
    return Settings(**values, extra=extra)


def save_settings(settings: Settings, path: Path | None = None) -> None:
    path = path or settings_path()
    ensure_private_dir(path.parent)
    data = asdict(settings)
    extra = data.pop("extra")
    write_json_atomic(path, {**extra, **data})
