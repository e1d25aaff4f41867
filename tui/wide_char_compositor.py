"""Wide (CJK) characters of a widget in front stay whole where the widgets behind it have their edges.

Textual's compositor cuts every line of the screen at the left and right edge of every widget on it, and
divides each widget's line at those cuts, the ones of the widgets behind included. A two-cell character
that straddles such a cut is replaced by two spaces (``Segment.split_cells``): a toast over the Models
screen's divider read 正在后  下载 for 正在后台下载, over the dashboard's panels 已复制到  贴板
(Textualize/textual#6357, open for Textual 8.2.8). Where the widget in front takes the cells on both sides
of such a cut, nothing behind shows there, so its line need not be divided: ``render_chops`` leaves that
one cut out, gives the bucket before it the whole character, and marks the bucket after it taken with an
empty strip (it adds no cells to a joined line). Lines without a character across a cut are divided as
Textual divides them.

Applied once, on import of ``tui.app``, for the pinned Textual version only: another version keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import textual
from rich.cells import get_character_cell_size
from textual._compositor import Compositor
from textual.geometry import Region
from textual.strip import Strip

PATCHED_VERSION = "8.2.8"  # the version whose Compositor._render_chops this replaces (pyproject.toml pins it)
_EMPTY = Strip([], 0)


def straddled(strip: Strip, offsets: Iterable[int]) -> set[int]:
    """Those of ``offsets`` (cells from the strip's start) that fall inside a two-cell character."""
    wanted = set(offsets)
    found: set[int] = set()
    if not wanted:
        return found
    last = max(wanted)
    position = 0
    for segment in strip:
        text = segment.text
        if segment.control:
            continue
        if text.isascii():
            position += len(text)
        else:
            for char in text:
                width = get_character_cell_size(char)
                if width == 2 and position + 1 in wanted:
                    found.add(position + 1)
                position += width
        if position >= last:
            break
    return found


def render_chops(self: Compositor, crop: Region, is_rendered_line: Callable[[int], bool]
                 ) -> Sequence[Mapping[int, Strip]]:
    """``Compositor._render_chops``, less the cuts through a wide character between two buckets still free."""
    cuts = self.cuts
    chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
    for region, clip, strips in self._get_renders(crop):
        render_region = region.intersection(clip)
        render_x = render_region.x
        first_cut, last_cut = render_region.column_span
        for y, strip in zip(render_region.line_range, strips, strict=False):
            if not is_rendered_line(y):
                continue
            chops_line = chops[y]
            final_cuts = [cut for cut in cuts[y] if last_cut >= cut >= first_cut]
            inner = final_cuts[1:-1]
            # Painted front to back: a bucket still free is this widget's, the first to claim it wins.
            kept = set(final_cuts)
            if inner and not strip.text.isascii():
                free = {cut for cut in final_cuts[:-1] if chops_line.get(cut) is None}
                joinable = [cut - render_x for index, cut in enumerate(inner, start=1)
                            if final_cuts[index - 1] in free and cut in free]
                kept -= {offset + render_x for offset in straddled(strip, joinable)}
            if len(kept) == len(final_cuts):
                pieces = iter(strip.divide([cut - render_x for cut in final_cuts[1:]]))
                for cut, piece in zip(final_cuts, pieces, strict=False):
                    if chops_line.get(cut) is None:
                        chops_line[cut] = piece
                continue
            divided = [cut for cut in final_cuts if cut in kept]
            pieces = dict(zip(divided, strip.divide([cut - render_x for cut in divided[1:]]), strict=False))
            for cut in final_cuts[:-1]:
                piece = pieces.get(cut) if cut in kept else _EMPTY  # a joined bucket's cells are in the one before
                if piece is not None and chops_line.get(cut) is None:
                    chops_line[cut] = piece
    return chops  # type: ignore[return-value]


def apply() -> bool:
    """Put ``render_chops`` in place of Textual's, for the pinned version; True when it was applied."""
    if textual.__version__ != PATCHED_VERSION:
        return False
    Compositor._render_chops = render_chops  # type: ignore[method-assign]
    return True
