"""A line chart drawn with braille dots through the line API: cheap for a million points.

Series come as ``BucketedSeries`` (see ``core.watch.downsample``): a frame maps their buckets onto twice
the plot's width in dot columns, so drawing costs the screen, not the data. Each dot column is drawn from
the lowest to the highest value it stands for (or its mean, for smoothed lines) and joined to the previous
column, so spikes stay visible however far the data is squeezed. Columns with no point between two that
have one (few points on a wide chart) are bridged by a straight line, so three points read as a curve, not
as three dots. A rate chart (``clip_outliers``) leaves an isolated spike out of its y range
(``core.watch.chart_scale``): the steady rate fills the chart, the spike is drawn clipped at the top, marked
``↑`` there, and its value is in the title. The y labels of a chart share one unit and precision
(``core.units.format_axis``). The grid is computed once per change of data or size and cached;
``render_line`` only hands out strips.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

from core.text_width import cell_len, truncate
from core.units import format_axis
from core.watch.chart_scale import outlier_ceiling
from core.watch.downsample import BucketedSeries
from core.watch.figures import format_count, format_duration, format_value

BRAILLE_BASE = 0x2800
# bit of the dot at (dx, dy) inside a 2×4 braille cell
_DOT_BITS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
# The cells left of the plot: a blank, the y label right-aligned in LABEL_WIDTH (``format_axis``'s widest,
# ``1.6e-03``), a space and the axis. The blank keeps a label off whatever is drawn left of the chart: at 80
# columns the loss chart's line reached the learning-rate chart's label ("⣀⣀⣀1.6e-03 ┤").
GUTTER = 10
LABEL_WIDTH = GUTTER - 3
PALETTE_SIZE = 8
CLIPPED_MARK = "↑"
# Blank cells a title leaves at its chart's right edge: two charts side by side (80 columns) have their
# titles separated ("… EMA 2.572   Learning rate"), not run together ("… EMA 2.572 Learning rate").
TITLE_GAP = 2


@dataclass
class SeriesSpec:
    """One line of a chart: its data, legend label, colour slot (0-7) and how columns are drawn."""

    label: str
    data: BucketedSeries
    colour: int = 0
    mode: str = "band"  # band: min..max per column; line: mean per column; points: dots only


def format_x(value: float, axis: str) -> str:
    if axis == "time":
        return format_duration(value) or "?"
    return format_count(value) or "?"


class LineChart(Widget):
    """A titled chart with y labels (min/max) on the left and the x range underneath."""

    COMPONENT_CLASSES = {
        "linechart--title", "linechart--axis", "linechart--empty",
        *(f"linechart--s{i}" for i in range(PALETTE_SIZE)),
    }
    DEFAULT_CSS = """
    LineChart { height: 1fr; min-height: 4; }
    LineChart > .linechart--title { color: $foreground; text-style: bold; }
    LineChart > .linechart--axis { color: $foreground-muted; }
    LineChart > .linechart--empty { color: $foreground-muted; }
    LineChart > .linechart--s0 { color: $primary; }
    LineChart > .linechart--s1 { color: $warning; }
    LineChart > .linechart--s2 { color: $success; }
    LineChart > .linechart--s3 { color: $secondary; }
    LineChart > .linechart--s4 { color: $error; }
    LineChart > .linechart--s5 { color: $accent; }
    LineChart > .linechart--s6 { color: $foreground; }
    LineChart > .linechart--s7 { color: $primary-lighten-2; }
    """

    def __init__(self, title: str, empty_text: str = "", *, id: str | None = None, classes: str | None = None,
                 y_floor: float | None = None, y_ceiling: float | None = None, clip_outliers: bool = False,
                 keep_note: bool = False) -> None:
        super().__init__(id=id, classes=classes)
        # The axis note stays however narrow the chart (the legends are cut instead): a chart whose axis
        # is not the one x chose for the others (the GPU charts, always by time) must say so.
        self.keep_note = keep_note
        self.title = title
        self.empty_text = empty_text
        self.series: list[SeriesSpec] = []
        self.axis = "step"
        self.note = ""
        self.y_floor = y_floor
        self.y_ceiling = y_ceiling
        self.clip_outliers = clip_outliers
        self.clipped_peak: float | None = None  # the highest value left above the y range (clip_outliers)
        self._key: tuple | None = None
        self._strips: list[Strip] = []
        self.data_version = 0

    def set_series(self, series: list[SeriesSpec], axis: str, version: int, note: str = "",
                   empty_text: str | None = None) -> None:
        """New data (or the same data at a new ``version``): redrawn on the next frame. ``empty_text``:
        what the chart says while it has no point (waiting, or that the run does not log this)."""
        self.series = series
        self.axis = axis
        self.note = note
        if empty_text is not None:
            self.empty_text = empty_text
        self.data_version = version
        if self._key is None or self._key[0] != (version, axis, note, self.empty_text):
            self.refresh()

    # --- drawing ---------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        key = ((self.data_version, self.axis, self.note, self.empty_text), width, height, self.app.theme)
        if key != self._key:
            self._strips = self._draw(width, height)
            self._key = key
        if y < len(self._strips):
            return self._strips[y]
        return Strip.blank(width)

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(f"linechart--{name}")

    def _draw(self, width: int, height: int) -> list[Strip]:
        if width <= 0 or height <= 0:
            return []
        title_style, axis_style = self._style("title"), self._style("axis")
        visible = [s for s in self.series if s.data.points]
        self.clipped_peak = None
        y_range = self._y_range(visible) if visible else None
        lines: list[Strip] = [self._title_strip(width, visible, title_style, axis_style)]
        plot_h = height - 2
        plot_w = width - GUTTER
        if plot_h < 1 or plot_w < 4 or y_range is None:
            empty = self._style("empty")
            for row in range(1, height):
                text = truncate(self.empty_text, max(0, width - 2)) if row == height // 2 and not visible else ""
                lines.append(Strip([Segment("  " + text, empty)]).adjust_cell_length(width))
            return lines
        x_min = min(s.data.x_range()[0] for s in visible)
        x_max = max(s.data.x_range()[1] for s in visible)
        y_min, y_max = y_range
        dots_w, dots_h = plot_w * 2, plot_h * 4
        cells = [[0] * plot_w for _ in range(plot_h)]
        owner = [[-1] * plot_w for _ in range(plot_h)]
        y_scale = (dots_h - 1) / (y_max - y_min)

        def dot_row(value: float) -> int:
            row = int(round((y_max - value) * y_scale))
            return 0 if row < 0 else dots_h - 1 if row >= dots_h else row

        clipped: set[int] = set()  # cell columns with a value above the y range

        def paint(dx: int, top: int, bottom: int, colour: int) -> None:
            cx, bit_column = divmod(dx, 2)
            bits = _DOT_BITS[bit_column]
            for dy in range(top, bottom + 1):
                cy, sub = divmod(dy, 4)
                cells[cy][cx] |= bits[sub]
                owner[cy][cx] = colour

        for spec in visible:
            columns = spec.data.columns(dots_w, x_min, x_max)
            previous: tuple[int, float] | None = None  # (dot column, dot row) where the line left off
            for dx, column in enumerate(columns):
                if column is None:
                    continue
                if spec.mode == "band":
                    low, high = column.low, column.high
                else:
                    low = high = column.mean if spec.mode == "line" else column.last
                if high > y_max:
                    clipped.add(dx // 2)
                top, bottom = dot_row(high), dot_row(low)
                if previous is not None and spec.mode != "points":
                    last_dx, last_row = previous
                    gap = dx - last_dx
                    entry = float(dot_row(column.mean))
                    # a straight line over the empty columns between the two points (none when adjacent)
                    for i in range(last_dx + 1, dx):
                        a = last_row + (entry - last_row) * (i - 0.5 - last_dx) / gap
                        b = last_row + (entry - last_row) * (i + 0.5 - last_dx) / gap
                        paint(i, int(round(min(a, b))), int(round(max(a, b))), spec.colour)
                    joint = last_row if gap == 1 else last_row + (entry - last_row) * (gap - 0.5) / gap
                    joint_row = int(round(joint))
                    top, bottom = min(top, joint_row), max(bottom, joint_row)
                previous = (dx, float(dot_row(column.last if spec.mode == "band" else low)))
                paint(dx, top, bottom, spec.colour)
        palette = [self._style(f"s{i}") for i in range(PALETTE_SIZE)]
        rows = [0, plot_h - 1] + ([(plot_h - 1) // 2] if plot_h >= 5 else [])
        values = [y_max, y_min] + ([(y_max + y_min) / 2] if plot_h >= 5 else [])
        labels = dict(zip(rows, format_axis(values), strict=True))
        marks = clipped if self.clipped_peak is not None else set()
        for row in range(plot_h):
            label = labels.get(row, "")
            segments = [Segment(f" {label:>{LABEL_WIDTH}} ┤"[:GUTTER] if label else " " * (GUTTER - 1) + "│", axis_style)]
            run_text, run_owner = [], None
            for cx in range(plot_w):
                bits = cells[row][cx]
                char = chr(BRAILLE_BASE + bits) if bits else " "
                who = owner[row][cx] if bits else -1
                if row == 0 and cx in marks:
                    char = CLIPPED_MARK  # the value goes on above the chart: its peak is in the title
                if who != run_owner and run_text:
                    segments.append(Segment("".join(run_text), palette[run_owner % PALETTE_SIZE] if run_owner >= 0 else axis_style))
                    run_text = []
                run_owner = who
                run_text.append(char)
            if run_text:
                segments.append(Segment("".join(run_text), palette[run_owner % PALETTE_SIZE] if run_owner >= 0 else axis_style))
            lines.append(Strip(segments, width))
        left, right = format_x(x_min, self.axis), format_x(x_max, self.axis)
        gap = max(1, plot_w - cell_len(left) - cell_len(right))
        lines.append(Strip([Segment(" " * GUTTER + left + " " * gap + right, axis_style)]).adjust_cell_length(width))
        return lines

    def _y_range(self, visible: list[SeriesSpec]) -> tuple[float, float] | None:
        """The y range of the plot; with ``clip_outliers``, an isolated spike's highs are left out of it
        (``clipped_peak`` keeps the highest of them for the title)."""
        ranges = [r for r in (s.data.y_range() for s in visible) if r]
        if not ranges:
            return None
        y_min = min(r[0] for r in ranges)
        y_max = max(r[1] for r in ranges)
        if self.clip_outliers:
            highs = [h for s in visible for h, c in zip(s.data.highs, s.data.counts, strict=True) if c]
            ceiling = outlier_ceiling(highs)
            if ceiling is not None:
                self.clipped_peak, y_max = y_max, ceiling
        if self.y_floor is not None:
            y_min = min(y_min, self.y_floor)
        if self.y_ceiling is not None:
            y_max = max(y_max, self.y_ceiling)
        if y_max - y_min < 1e-12:
            pad = abs(y_max) * 0.05 or 1.0
            y_min, y_max = y_min - pad, y_max + pad
        return y_min, y_max

    def _title_strip(self, width: int, visible: list[SeriesSpec], title_style: Style, axis_style: Style) -> Strip:
        """The title, the axis note and each line's legend with its last value. Too wide for the chart
        (80 columns): the note goes first (the x labels under the plot say steps or time too; not where
        ``keep_note``), then the legends' spacing, then the legends' names, the main line's first (the
        title's own), then a dotted line's, while their values and colours stay; only then is the end cut, with an ellipsis.
        The title keeps ``TITLE_GAP`` cells clear at the right edge, where the next chart's title begins."""
        room = width - TITLE_GAP if width > 2 * TITLE_GAP else width
        shown = [spec for spec in self.series if spec.data.points]

        # Whose names go first: the main line's (the title names it), then dotted ones' (• reads apart
        # from the lines), then the others' in their order.
        unname_order = sorted(range(len(shown)), key=lambda n: (n != 0, shown[n].mode != "points", n))

        def legends(gap: str, unnamed: int) -> list[Segment]:
            segments: list[Segment] = []
            nameless = set(unname_order[:unnamed])
            for n, spec in enumerate(shown):
                value = format_value(spec.data.y_last)
                label = "" if n in nameless else spec.label
                segments.append(Segment(gap, axis_style))
                segments.append(Segment("━" if spec.mode != "points" else "•",
                                        self._style(f"s{spec.colour % PALETTE_SIZE}")))
                segments.append(Segment(f" {label} {value}" if label else f" {value}", axis_style))
            if self.clipped_peak is not None:
                segments.append(Segment(f"{gap}{CLIPPED_MARK}{format_value(self.clipped_peak)}", self._style("s4")))
            return segments

        title = [Segment(" " + self.title, title_style)]
        note = [Segment(f" · {self.note}", axis_style)] if self.note else []
        if self.keep_note:
            tries = [[*title, *note, *legends("  ", 0)], [*title, *note, *legends(" ", 0)]]
        else:
            tries = [[*title, *note, *legends("  ", 0)], [*title, *legends("  ", 0)]]
            tries += [[*title, *legends(" ", unnamed)] for unnamed in range(len(shown) + 1)]
        strip = Strip([])
        for segments in tries:
            strip = Strip(segments)
            if strip.cell_length <= room:
                break
        if strip.cell_length > room > 1:
            # Cut legends end in an ellipsis (a wide character never half-shown), not mid-word.
            strip = Strip.join([strip.crop(0, room - 1), Strip([Segment("…", axis_style)])])
        return strip.crop(0, room).adjust_cell_length(width)
