"""Hub tokens: from the environment (``MODELSCOPE_API_TOKEN``, ``HF_TOKEN``) or tunedeck's token file.

The file (``<config dir>/hub_tokens.json``) is written 0600 and ignored when its mode lets anyone else
read it. Tokens are handed to the SDKs and the downloader's environment only: never printed, logged or
written into a download's folder.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from core.atomic_file import write_json_atomic
from core.paths import config_dir, ensure_private_dir

TOKEN_ENV = {"modelscope": ("MODELSCOPE_API_TOKEN",), "hf": ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}


def token_file() -> Path:
    return config_dir() / "hub_tokens.json"


def _file_tokens() -> dict[str, str]:
    path = token_file()
    try:
        mode = path.stat().st_mode
    except OSError:
        return {}
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return {}  # readable by others: refuse to use it (the app says so through token_file_problem)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {key: value for key, value in data.items() if isinstance(value, str)} if isinstance(data, dict) else {}


def token_file_problem() -> str | None:
    """The path of the token file when it exists but is ignored because others can read it."""
    path = token_file()
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return str(path) if mode & (stat.S_IRWXG | stat.S_IRWXO) else None


def hub_token(hub: str) -> str | None:
    """The token for ``hub`` ("modelscope" or "hf"): environment first, then the token file."""
    for name in TOKEN_ENV[hub]:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return _file_tokens().get(hub) or None


def token_source(hub: str) -> str | None:
    """Where the token ``hub_token`` hands out comes from: the environment variable's name, else the
    token file's path; None when there is no token (what a 401 tells the user to do depends on it)."""
    for name in TOKEN_ENV.get(hub, ()):
        if os.environ.get(name, "").strip():
            return name
    return str(token_file()) if _file_tokens().get(hub) else None


def save_hub_token(hub: str, token: str) -> Path:
    """Store ``token`` for ``hub`` in the token file (mode 0600)."""
    if hub not in TOKEN_ENV:
        raise ValueError(f"unknown hub {hub!r}")
    tokens = _file_tokens()
    tokens[hub] = token.strip()
    ensure_private_dir(config_dir())
    write_json_atomic(token_file(), tokens, mode=0o600)
    return token_file()
