"""Where tunedeck keeps its files.

One root holds everything of tunedeck's own (settings, runs, caches). ``TUNEDECK_HOME`` moves it, for
tests and shared boxes; otherwise it follows XDG: config in ``~/.config/tunedeck``, data in
``~/.local/share/tunedeck``. Directories are created private to the user (0700): run directories can
hold the names of private models and datasets.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_DIR_MODE = 0o700


def _home_override() -> Path | None:
    value = os.environ.get("TUNEDECK_HOME", "").strip()
    return Path(value).expanduser() if value else None


def nearest_existing_dir(path: Path) -> Path:
    """``path`` (``~`` expanded, made absolute) or its closest existing ancestor: the folder whose file system a
    folder not made yet (the data root before the first run, a download's target) will land on."""
    path = Path(path).expanduser().absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def config_dir() -> Path:
    """Directory of settings files."""
    override = _home_override()
    if override is not None:
        return override
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tunedeck"


def data_root() -> Path:
    """Root of runs, downloads bookkeeping and caches of tunedeck's own."""
    override = _home_override()
    if override is not None:
        return override
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tunedeck"


def runs_dir() -> Path:
    return data_root() / "runs"


def settings_path() -> Path:
    return config_dir() / "settings.json"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if missing; the leaf is made 0700."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(path, PRIVATE_DIR_MODE)
    except PermissionError:
        pass  # a directory we do not own (e.g. a shared root): leave its mode alone
    return path
