"""A followed log through the line API: appends are cheap, search highlights and jumps between matches."""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from core.text_width import cell_len

MAX_LINES = 20_000


class LogPane(ScrollView, can_focus=True):
    """Lines of a log, newest at the bottom; stays at the bottom while the user has not scrolled up."""

    COMPONENT_CLASSES = {"logpane--match", "logpane--current", "logpane--warning", "logpane--error"}
    DEFAULT_CSS = """
    LogPane { background: $surface; overflow-x: hidden; }
    LogPane > .logpane--match { background: $warning 30%; }
    LogPane > .logpane--current { background: $warning; color: $background; }
    LogPane > .logpane--warning { color: $warning; }
    LogPane > .logpane--error { color: $error; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.lines: list[str] = []
        self.widest = 0
        self.query_text = ""
        self.matches: list[int] = []
        self.current = -1
        self.following = True  # stuck to the newest line until the user scrolls up

    # --- content ---------------------------------------------------------------------------------
    def clear(self) -> None:
        self.lines = []
        self.widest = 0
        self.matches = []
        self.current = -1
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
            self.matches = [m - drop for m in self.matches if m >= drop]
            self.current = min(self.current, len(self.matches) - 1)
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

    def on_resize(self) -> None:
        # A resize (the header gaining a line, a terminal resize) must not leave a following pane short
        # of the newest line.
        if self.following:
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True)

    def _resize(self) -> None:
        self.virtual_size = Size(self.widest, len(self.lines))
        self.refresh()

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
            line = self.matches[self.current]
            self.scroll_to(y=max(0, line - self.size.height // 2), animate=False, immediate=True)

    # --- drawing ---------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.scrollable_content_region.width
        if index >= len(self.lines):
            return Strip.blank(width, self.rich_style)
        text = self.lines[index]
        style = self.rich_style
        if self.matches and self.query_text and self.query_text.lower() in text.lower():
            current = 0 <= self.current < len(self.matches) and self.matches[self.current] == index
            style = style + self.get_component_rich_style("logpane--current" if current else "logpane--match")
        elif "error" in text.lower() or "traceback" in text.lower():
            style = style + self.get_component_rich_style("logpane--error", partial=True)
        elif "warning" in text.lower():
            style = style + self.get_component_rich_style("logpane--warning", partial=True)
        strip = Strip([Segment(text, style if isinstance(style, Style) else None)])
        return strip.crop(scroll_x, scroll_x + width).adjust_cell_length(width, self.rich_style)
