"""Assets bundled with tunedeck: the tiny demo model (config + tokenizer, no weights)."""

from __future__ import annotations

from pathlib import Path

TINY_MODEL_NAME = "tiny"
_TINY_DIR = Path(__file__).parent / "tiny"


def tiny_model_dir() -> Path:
    """Directory of the bundled tiny Qwen2-architecture model.

    It holds ``config.json``, ``generation_config.json``, ``tokenizer.json`` and ``tokenizer_config.json``
    but no weights: whoever trains it initialises them from the config with a fixed seed.
    """
    return _TINY_DIR


def is_tiny_model(name_or_path: str) -> bool:
    """Whether a ``--model`` value names the bundled tiny model (``tiny`` or its directory)."""
    if name_or_path == TINY_MODEL_NAME:
        return True
    try:
        return Path(name_or_path).resolve() == _TINY_DIR.resolve()
    except OSError:
        return False


def model_label(name_or_path: str) -> str:
    """A model as the runs list, ``tunedeck runs`` and the dashboard show it: the bundled tiny model by its
    short name ``tiny`` (a demo run records its folder, a wizard run the name), anything else as given."""
    if name_or_path == TINY_MODEL_NAME or Path(name_or_path).name != _TINY_DIR.name:
        return name_or_path  # (no file system call for every other model)
    return TINY_MODEL_NAME if is_tiny_model(name_or_path) else name_or_path


def resolve_model_name(name_or_path: str) -> str:
    """``tiny`` becomes the bundled directory; anything else is returned as it is."""
    return str(_TINY_DIR) if name_or_path == TINY_MODEL_NAME else name_or_path
