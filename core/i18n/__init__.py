"""The message catalogue: every user-facing string goes through ``t(key, **params)``.

A language's catalogue is a folder of flat JSON files, one per area (``en/hardware.json``, ``en/app.json``
…), merged on load; English is complete by definition, other languages fall back to it for a missing
key until a test flags it. Keys are dotted names prefixed by their area (``gpus.no_driver``); a key may
be defined in one file only. Parameters use ``str.format`` names.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

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
    """The interface language the locale asks for, if we have it, else English. Only the language part
    counts: zh_CN, zh_TW, zh_HK, zh-Hant and zh_TW.Big5 all get the (Simplified) zh catalogue, as there is
    no Traditional one."""
    for var in ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE"):
        value = os.environ.get(var, "")
        if value:
            code = re.split(r"[_.@:-]", value, maxsplit=1)[0].lower()
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


def join_words(items: Iterable[str]) -> str:
    """Short translated items (filters, names) as one list in the current language: ``org Qwen, size 7B``,
    ``组织 Qwen、规模 7B``. Identifiers, paths and keys keep ", " (ASCII inside code, GLOSSARY.md)."""
    return t("i18n.item_separator").join(items)


def english(key: str, /, **params: object) -> str:
    """The English text for ``key``, whatever the current language (for records other tools read)."""
    text = catalogue(DEFAULT_LANGUAGE)[key]
    return text.format(**params) if params else text


class Message:
    """A user-facing message kept as data (key + parameters) until someone reads it.

    A process that writes text for another process to show (the detached trainer and supervisor write
    run-failure reasons into run files) does not know the reader's language, and the reader may switch
    language later. So records store ``{"key", "params"}`` next to the English text: readers render the
    message in their own language with ``render_stored``, and old run directories or other tools, which
    only know the text, keep working. A parameter may itself be a Message, or a list of them (joined by
    the language's list separator), e.g. the tips inside the out-of-memory advice.
    """

    __slots__ = ("key", "params")

    def __init__(self, key: str, /, **params: object) -> None:
        self.key = key
        self.params = params

    def _render(self, lookup: Callable[..., str]) -> str:
        def value(param: object) -> object:
            if isinstance(param, Message):
                return param._render(lookup)
            if isinstance(param, (list, tuple)) and param and all(isinstance(p, Message) for p in param):
                return lookup("i18n.list_separator").join(p._render(lookup) for p in param)
            return param

        # Always formatted (t() skips formatting without parameters): a record whose parameters are
        # missing must fail here, so that render_stored falls back to the stored text.
        return lookup(self.key).format(**{name: value(param) for name, param in self.params.items()})

    def text(self) -> str:
        """The message in the current language."""
        return self._render(t)

    def english(self) -> str:
        return self._render(english)

    __str__ = text

    def __repr__(self) -> str:
        return f"Message({self.key!r}, **{self.params!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and (self.key, self.params) == (other.key, other.params)

    __hash__ = None  # type: ignore[assignment]  (params are mutable)

    def to_record(self) -> dict[str, Any]:
        """JSON-ready ``{"key", "params"}``; nested messages become nested records."""
        def value(param: object) -> object:
            if isinstance(param, Message):
                return param.to_record()
            if isinstance(param, (list, tuple)) and param and all(isinstance(p, Message) for p in param):
                return [p.to_record() for p in param]
            return param

        return {"key": self.key, "params": {name: value(param) for name, param in self.params.items()}}

    @classmethod
    def from_record(cls, record: object) -> Message | None:
        """The message a record holds, or None when it is missing or not one (old runs, other tools)."""
        if not (isinstance(record, dict) and isinstance(record.get("key"), str)):
            return None
        params = record.get("params") or {}
        if not isinstance(params, dict):
            return None

        def value(param: object) -> object:
            nested = cls.from_record(param)
            if nested is not None:
                return nested
            if isinstance(param, list) and param and all(cls.from_record(p) for p in param):
                return [cls.from_record(p) for p in param]
            return param

        return cls(record["key"], **{str(name): value(param) for name, param in params.items()})


def stored_reason(reason: str | Message) -> dict[str, Any]:
    """How a reason goes into a record another process reads: ``{"reason": English text}``, plus
    ``"reason_message"`` (the message as data, for ``render_stored``) when it is a Message."""
    if isinstance(reason, Message):
        return {"reason": reason.english(), "reason_message": reason.to_record()}
    return {"reason": reason}


def render_stored(text: str, record: object, wording: Mapping[str, str] | None = None) -> str:
    """Stored text for display: the message in ``record`` rendered in the current language when it is a
    message this version knows how to render, else ``text`` as stored (old runs, newer versions).

    ``wording``: message key -> the key a reader renders it under instead, with the same parameters (a
    screen's own wording of a stored reason: the dashboard names the key that resumes a run, where the
    stored message, which the CLI shows, names the command)."""
    message = Message.from_record(record)
    if message is None:
        return text
    if wording and message.key in wording:
        message = Message(wording[message.key], **message.params)
    try:
        return message.text()
    except (KeyError, IndexError, ValueError):  # unknown key or parameters that do not fit this version
        return text
