"""Where a bench writes what it measured: a JSON file and its Markdown beside it, rewritten as each row
finishes so that a call cut off at its time limit keeps the rows it had.

Each file is replaced whole (``core.atomic_file``): a call killed while writing leaves the previous rows,
never a half-written JSON that loses them all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.atomic_file import write_atomic

RESULTS_MODE = 0o644  # committed with the repository


def write_results(path: Path, payload: Any, markdown: str) -> None:
    """``markdown`` into ``path`` (its ``.md`` where ``path`` names the JSON) and ``payload`` as JSON beside it."""
    path = Path(path)
    text = path.with_suffix(".md") if path.suffix == ".json" else path
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path.with_suffix(".json"), json.dumps(payload, indent=2, default=str) + "\n", RESULTS_MODE)
    write_atomic(text, markdown if markdown.endswith("\n") else markdown + "\n", RESULTS_MODE)
