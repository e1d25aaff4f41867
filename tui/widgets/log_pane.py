"""A followed log through the line API: appends are cheap, search highlights and jumps between matches.

Long lines wrap at the pane's width (an error at 80 columns is read in full, not cut at 44): each log
line becomes one or more display rows, rebuilt only when the width changes.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from core.text_width import cell_len, char_width

MAX_LINES = 20_000


def wrap_points(text: str, width: int) -> list[int]:
    """Character offsets where the display rows of ``text`` start, each row at most ``width`` cells."""
    if width <= 0 or len(text) <= width and (text.isascii() or cell_len(text) <= width):
        return [0]
    if text.isascii():
        return list(range(0, len(text), width))
    starts, used = [0], 0
    for i, char in enumerate(text):
        size = char_width(char)
        if used + size > width and used:
            starts.append(i)
            used = 0
        used += size
    return starts


class LogPane(ScrollView, can_focus=True):
    """Lines of a log, newest at the bottom; stays at the bottom while the user has not scrolled up."""

    COMPONENT_CLASSES = {"logpane--match", "logpane--current", "logpane--warning", "logpane--error",
                         "logpane--empty"}
    DEFAULT_CSS = """
    LogPane { background: $surface; overflow-x: hidden; }
    LogPane > .logpane--match { background: $warning 30%; }
    LogPane > .logpane--current { background: $warning; color: $background; }
    LogPane > .logpane--warning { color: $warning; }
    LogPane > .logpane--error { color: $error; }
    LogPane > .logpane--empty { color: $foreground-muted; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.lines: list[str] = []
        self.widest = 0
        self.query_text = ""
        self.matches: list[int] = []
        self.current = -1
        self.following = True  # stuck to the newest line until the user scrolls up
        # display rows: (index into lines, start offset, end offset), for the width in _wrap_width
        self.rows: list[tuple[int, int, int]] = []
        self._wrap_width = 0
        self._rewrap_pending = False
        self.empty_text = ""  # said, wrapped, while there is no line (a folder without a log file)
        self.from_start = True  # the feed read the log from its first line (set by the dashboard)
        self._dropped = False  # lines went to keep MAX_LINES

    # --- content ---------------------------------------------------------------------------------
    def clear(self) -> None:
        self.lines = []
        self.rows = []
        self.widest = 0
        self.matches = []
        self.current = -1
        self._dropped = False
        self._resize()

    def append(self, lines: list[str]) -> None:
        if not lines:
            return
        at_bottom = self.following or self.scroll_offset.y >= self.max_scroll_y - 1
        base = len(self.lines)
        self.lines.extend(lines)
        self.widest = max(self.widest, *(cell_len(line) for line in lines))
        if self.query_text:
            needle = self.query_text.lower()
            self.matches.extend(base + i for i, line in enumerate(lines) if needle in line.lower())
        if len(self.lines) > MAX_LINES:
            drop = len(self.lines) - MAX_LINES // 2
            self.lines = self.lines[drop:]
            self._dropped = True
            self.matches = [m - drop for m in self.matches if m >= drop]
            self.current = min(self.current, len(self.matches) - 1)
            self._rewrap()
        else:
            self._add_rows(base)
        self._resize()
        if at_bottom:
            # after the next layout: the new virtual size is not applied yet
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True)

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        if new < old:  # the user scrolled up: stop following until back at the bottom
            self.following = new >= self.max_scroll_y - 1
        elif new >= self.max_scroll_y - 1:
            self.following = True

    @property
    def at_newest(self) -> bool:
        """The newest line's last row is in view (what following means; tests wait for it)."""
        return self.scroll_y >= self.max_scroll_y

    def keep_up(self) -> None:
        """The dashboard's tick (as ``EventsTable.keep_up``): a scroll made against rows or a layout that changed
        after it (a busy box lays out late) is put right by the next tick, so following never stays short of the
        newest line."""
        if self.following and not self.at_newest:
            self.scroll_end(animate=False, immediate=True)

    def on_resize(self) -> None:
        if self._content_width() != self._wrap_width:
            self._rewrap()
            self._resize()
        # A resize (the header gaining a line, a terminal resize) must not leave a following pane short
        # of the newest line.
        if self.following:
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True)

    def _content_width(self) -> int:
        return self.scrollable_content_region.width

    def _add_rows(self, first: int) -> None:
        width = self._wrap_width
        for index in range(first, len(self.lines)):
            text = self.lines[index]
            starts = wrap_points(text, width)
            ends = [*starts[1:], len(text)]
            self.rows.extend((index, start, end) for start, end in zip(starts, ends, strict=True))

    def _rewrap(self) -> None:
        self._wrap_width = self._content_width()
        self.rows = []
        self._add_rows(0)

    def _rewrap_now(self) -> None:
        self._rewrap_pending = False
        if self._content_width() != self._wrap_width:
            self._rewrap()
            self._resize()

    def row_of_line(self, index: int) -> int:
        """The first display row of log line ``index``."""
        from bisect import bisect_left

        return bisect_left(self.rows, (index, -1, -1))

    def _resize(self) -> None:
        self.virtual_size = Size(self._wrap_width or self.widest, len(self.rows))
        self.refresh()

    @property
    def holds_all(self) -> bool:
        """Every line of the log is here: it was read from its start and none was dropped (a search that
        finds nothing here found nothing in the file)."""
        return self.from_start and not self._dropped

    # --- search ----------------------------------------------------------------------------------
    def search(self, text: str) -> int:
        """Highlight lines containing ``text`` (case-insensitive) and jump to the last one; returns the count."""
        self.query_text = text
        needle = text.lower()
        self.matches = [i for i, line in enumerate(self.lines) if needle in line.lower()] if text else []
        self.current = len(self.matches) - 1
        self._show_current()
        self.refresh()
        return len(self.matches)

    def next_match(self, step: int) -> int | None:
        """Move to the next (+1) or previous (-1) match, wrapping; returns its line number."""
        if not self.matches:
            return None
        self.current = (self.current + step) % len(self.matches)
        self._show_current()
        self.refresh()
        return self.matches[self.current]

    def _show_current(self) -> None:
        if 0 <= self.current < len(self.matches):
            row = self.row_of_line(self.matches[self.current])
            self.scroll_to(y=max(0, row - self.size.height // 2), animate=False, immediate=True)

    # --- drawing ---------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.scrollable_content_region.width
        if width != self._wrap_width and not self._rewrap_pending:
            # the width changed without a resize (a scrollbar came or went): wrap again after this frame
            self._rewrap_pending = True
            self.call_after_refresh(self._rewrap_now)
        if not self.lines and self.empty_text:
            return self._empty_line(y, width)
        if row >= len(self.rows):
            return Strip.blank(width, self.rich_style)
        index, start, end = self.rows[row]
        text = self.lines[index]  # the whole line decides the colour, its row is drawn
        style = self.rich_style
        if self.matches and self.query_text and self.query_text.lower() in text.lower():
            current = 0 <= self.current < len(self.matches) and self.matches[self.current] == index
            style = style + self.get_component_rich_style("logpane--current" if current else "logpane--match")
        elif "error" in text.lower() or "traceback" in text.lower():
            style = style + self.get_component_rich_style("logpane--error", partial=True)
        elif "warning" in text.lower():
            style = style + self.get_component_rich_style("logpane--warning", partial=True)
        strip = Strip([Segment(text[start:end], style if isinstance(style, Style) else None)])
        return strip.crop(scroll_x, scroll_x + width).adjust_cell_length(width, self.rich_style)

    def _empty_line(self, y: int, width: int) -> Strip:
        """Row ``y`` of ``empty_text``, wrapped at word boundaries to ``width``."""
        from rich.text import Text

        rows = Text(self.empty_text).wrap(self.app.console, max(1, width))
        if y >= len(rows):
            return Strip.blank(width, self.rich_style)
        style = self.rich_style + self.get_component_rich_style("logpane--empty", partial=True)
        return Strip([Segment(rows[y].plain.rstrip(), style)]).adjust_cell_length(width, self.rich_style)
