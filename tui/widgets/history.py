"""A rolling history drawn as rows of block glyphs, for the GPU screen's sparklines."""

from __future__ import annotations

from collections.abc import Iterable

BLOCKS = " ▁▂▃▄▅▆▇█"


def history_rows(values: Iterable[float | None], width: int, height: int) -> list[str]:
    """``height`` rows of block glyphs (top row first) for the last ``width`` values in 0..100."""
    recent = [0.0 if v is None else max(0.0, min(100.0, float(v))) for v in list(values)[-width:]] if width > 0 else []
    rows = []
    for row_from_bottom in range(height - 1, -1, -1):
        chars = []
        for value in recent:
            level = int(round(value / 100.0 * height * 8 - row_from_bottom * 8))
            chars.append(BLOCKS[max(0, min(8, level))])
        rows.append(" " * (width - len(recent)) + "".join(chars))
    return rows
