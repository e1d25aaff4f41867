"""Sample datasets bundled with tunedeck (regenerate with ``make_samples.py``)."""

from __future__ import annotations

from pathlib import Path

SAMPLE_DIR = Path(__file__).parent


def sample_dataset_path() -> Path:
    """The bundled messages-style JSONL the demo trains on."""
    return SAMPLE_DIR / "tiny_skills.jsonl"
