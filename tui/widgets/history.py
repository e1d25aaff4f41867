"""A rolling history drawn with block glyphs through the line API: cheap to update every second."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from rich.segment import Segment
from textual.strip import Strip
from textual.widget import Widget

BLOCKS = " ▁▂▃▄▅▆▇█"


class HistoryChart(Widget):
    """Values in 0..100, newest on the right, as many rows tall as the widget; one column per sample."""

    COMPONENT_CLASSES = {"historychart--bar", "historychart--empty"}
    DEFAULT_CSS = """
    HistoryChart { height: 2; }
    HistoryChart > .historychart--bar { color: $primary; }
    HistoryChart > .historychart--empty { color: $panel; }
    """

    def __init__(self, capacity: int = 600, *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.values: deque[float] = deque(maxlen=capacity)

    def push(self, value: float | None) -> None:
        self.values.append(0.0 if value is None else max(0.0, min(100.0, float(value))))
        self.refresh()

    def extend(self, values: Iterable[float | None]) -> None:
        for value in values:
            self.values.append(0.0 if value is None else max(0.0, min(100.0, float(value))))
        self.refresh()

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        if width <= 0 or y >= height:
            return Strip.blank(width)
        text = history_rows(self.values, width, height)[y]
        return Strip([Segment(text, self.get_component_rich_style("historychart--bar"))], width)


def sparkline(values: Iterable[float | None], width: int) -> str:
    """One-row history of the last ``width`` values (0..100) as block glyphs, right-aligned."""
    return history_rows(values, width, 1)[0]


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
