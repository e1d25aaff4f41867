"""What the planner needs to know about the data: records, token lengths, a length histogram."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HISTOGRAM_BINS = 8


@dataclass(frozen=True)
class DatasetSummary:
    """Records and token lengths of a local data file (``exact`` False: characters / 4)."""

    path: str
    format: str | None
    records: int
    issues: int
    lengths: tuple[int, ...] = field(default=(), repr=False)
    exact: bool = False

    @property
    def total_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def p95(self) -> int:
        if not self.lengths:
            return 0
        ordered = sorted(self.lengths)
        return ordered[min(len(ordered), max(1, math.ceil(0.95 * len(ordered)))) - 1]

    @property
    def max_length(self) -> int:
        return max(self.lengths, default=0)

    def histogram(self, bins: int = HISTOGRAM_BINS) -> list[tuple[int, int, int]]:
        """(low, high, count) bins of equal width over the token lengths."""
        if not self.lengths:
            return []
        low, high = min(self.lengths), max(self.lengths)
        width = max(1, math.ceil((high - low + 1) / bins))
        counts = [0] * bins
        for n in self.lengths:
            counts[min(bins - 1, (n - low) // width)] += 1
        return [(low + i * width, low + (i + 1) * width - 1, c) for i, c in enumerate(counts)]

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "records": self.records, "issues": self.issues,
                "total_tokens": self.total_tokens, "p95_tokens": self.p95, "max_tokens": self.max_length,
                "exact": self.exact,
                "histogram": [{"low": lo, "high": hi, "count": c} for lo, hi, c in self.histogram()]}


def summarise_dataset(path: str | Path, model: str | None = None) -> DatasetSummary:
    """Read ``path`` and measure its samples; tokens are exact when ``model`` is a local folder
    with a tokenizer, else approximate. Raises ``DataError`` when the file cannot be read at all."""
    from core.data import read_dataset
    from core.data.stats import approximate_lengths

    loaded = read_dataset(path)
    records = loaded.records
    lengths: list[int] | None = None
    exact = False
    if model and records:
        lengths = _exact_lengths(records, model)
        exact = lengths is not None
    if lengths is None:
        lengths = approximate_lengths(records)
    return DatasetSummary(str(path), loaded.format, len(records), loaded.issue_count, tuple(lengths), exact)


def _exact_lengths(records: list[Any], model: str) -> list[int] | None:
    """Token lengths with the model's own tokenizer, or None when it is not on this machine."""
    from core.data.stats import load_tokenizer
    from core.data.tokenize import token_lengths

    # Two tries: transformers' lazy module can fail an import made while another thread is importing it.
    for attempt in range(2):
        try:
            return list(token_lengths(records, load_tokenizer(model)))
        except ImportError:
            if attempt:
                return None
        except Exception:  # no local tokenizer (a hub id not downloaded): approximate instead
            return None
    return None
