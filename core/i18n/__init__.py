"""The message catalogue: every user-facing string goes through ``t(key, **params)``.

A language's catalogue is a folder of flat JSON files, one per area (``en/hardware.json``, ``en/app.json``
…), merged on load; English is complete by definition, other languages fall back to it for a missing
key until a test flags it. Keys are dotted names prefixed by their area (``gpus.no_driver``); a key may
be defined in one file only. Parameters use ``str.format`` names.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

_DIR = Path(__file__).parent
DEFAULT_LANGUAGE = "en"
_current = DEFAULT_LANGUAGE


def available_languages() -> list[str]:
    return sorted(p.name for p in _DIR.iterdir() if p.is_dir() and any(p.glob("*.json")))


@cache
def catalogue(language: str) -> dict[str, str]:
    """All messages of ``language``; a key defined twice is an error."""
    merged: dict[str, str] = {}
    for path in sorted((_DIR / language).glob("*.json")):
        for key, text in json.loads(path.read_text(encoding="utf-8")).items():
            if key in merged:
                raise ValueError(f"{path}: message key '{key}' is already defined in another file")
            merged[key] = text
    return merged


def language_from_locale() -> str:
    """The interface language the locale asks for, if we have it, else English."""
    for var in ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE"):
        value = os.environ.get(var, "")
        if value:
            code = value.split(".")[0].split("_")[0].lower()
            return code if code in available_languages() else DEFAULT_LANGUAGE
    return DEFAULT_LANGUAGE


def set_language(language: str) -> str:
    """Switch the interface language ('' = from the locale); returns the language in force."""
    global _current
    language = language or language_from_locale()
    if language not in available_languages():
        raise ValueError(f"unknown language '{language}'; available: {', '.join(available_languages())}")
    _current = language
    return _current


def current_language() -> str:
    return _current


def t(key: str, /, **params: object) -> str:
    """The text for ``key`` in the current language, formatted with ``params``.

    An unknown key is a programming error and raises ``KeyError``.
    """
    text = catalogue(_current).get(key)
    if text is None:
        text = catalogue(DEFAULT_LANGUAGE)[key]
    return text.format(**params) if params else text
