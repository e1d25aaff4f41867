"""Wide (CJK) characters of a widget in front stay whole where the widgets behind it have their edges.

Textual 8.2.8's compositor cuts every line of the screen at the left and right edge of every widget on it
and divides each widget's line at those cuts, the ones of the widgets behind included. A two-cell character
across such a cut became two spaces (``Segment.split_cells``): a toast over the Models screen's divider read
正在后  下载 for 正在后台下载, over the dashboard's panels 已复制到  贴板 (Textualize/textual#6357, open).

Two places divide a line, and both are replaced here:

* ``_render_chops`` (full and partial updates): where the widget in front takes the cells on both sides of
  a cut through a wide character, that cut is left out: the bucket before it gets the cells up to the next
  cut, the character whole, and the bucket at the cut an empty strip (taken, so that no widget behind
  fills it, and adding no cells to a joined line).
* ``render_partial_update``: a ``ChopsUpdate`` crops each bucket at its end and at the end of the changed
  span (``ChopsUpdate.render_segments``). The ends are taken from the buckets (a joined one reaches past
  its cut), and a span that ends inside a wide character is widened to its second cell, so that a refresh
  of a widget behind a toast writes the toast's character whole and leaves no cell unwritten.

Applied once, on import of ``tui.app``, for the pinned Textual version only: another version keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import textual
from rich.cells import cell_len, get_character_cell_size
from textual._compositor import ChopsUpdate, Compositor
from textual.geometry import Region
from textual.strip import Strip

PATCHED_VERSION = "8.2.8"  # the version whose compositor this patches (pyproject.toml pins it)
_EMPTY = Strip([], 0)
_textual_partial_update = Compositor.render_partial_update


def straddled(strip: Strip, offsets: Iterable[int]) -> set[int]:
    """Those of ``offsets`` (cells from the strip's start) that fall inside a two-cell character.

    Whole segments are stepped over by their cell length (``cell_len`` is cached); the characters are read only
    in a segment that is not ASCII and has a wanted offset inside it (a character never spans two segments)."""
    wanted = sorted(set(offsets))
    found: set[int] = set()
    if not wanted:
        return found
    index, count = 0, len(wanted)
    position = 0
    for text, _style, control in strip:
        if control:
            continue
        end = position + cell_len(text)
        while index < count and wanted[index] <= position:
            index += 1
        if index == count:
            break
        if wanted[index] < end and not text.isascii():
            inside = set(wanted[index:])
            for char in text:
                width = get_character_cell_size(char)
                if width == 2 and position + 1 in inside:
                    found.add(position + 1)
                position += width
        position = end
    return found


def render_chops(self: Compositor, crop: Region, is_rendered_line: Callable[[int], bool]
                 ) -> Sequence[Mapping[int, Strip]]:
    """``Compositor._render_chops``, less the cuts through a wide character whose both sides one widget takes.

    A widget line with no cut between two free buckets, or none through a wide character (every ASCII line),
    takes Textual's own loop: the joining costs only where it can join."""
    cuts = self.cuts
    chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
    intersection = Region.intersection
    for region, clip, strips in self._get_renders(crop):  # front to back: the first to fill a bucket wins
        render_region = intersection(region, clip)
        render_x = render_region.x
        first_cut, last_cut = render_region.column_span
        for y, strip in zip(render_region.line_range, strips, strict=False):
            if not is_rendered_line(y):
                continue
            chops_line = chops[y]
            final_cuts = [cut for cut in cuts[y] if last_cut >= cut >= first_cut]
            joined: set[int] = set()
            if len(final_cuts) > 2:
                free = [cut - render_x for before, cut in zip(final_cuts, final_cuts[1:-1], strict=False)
                        if chops_line[before] is None and chops_line[cut] is None]
                if free:
                    joined = straddled(strip, free)
            get_chops_line = chops_line.get
            if not joined:  # Textual's loop
                for cut, piece in zip(final_cuts, strip.divide([cut - render_x for cut in final_cuts[1:]]),
                                      strict=False):
                    if get_chops_line(cut) is None:
                        chops_line[cut] = piece
                continue
            joined = {offset + render_x for offset in joined}
            kept = [cut for cut in final_cuts if cut not in joined]
            pieces = dict(zip(kept, strip.divide([cut - render_x for cut in kept[1:]]), strict=False))
            for cut in final_cuts[:-1]:
                piece = _EMPTY if cut in joined else pieces.get(cut)  # a joined bucket's cells: in the one before
                if piece is not None and get_chops_line(cut) is None:
                    chops_line[cut] = piece
    return chops  # type: ignore[return-value]


def render_partial_update(self: Compositor) -> ChopsUpdate | None:
    """Textual's partial update, with the ends of joined buckets, and spans that end on a whole character.
    Only the lines of the update's spans are written (``ChopsUpdate.render_segments``): the others keep
    Textual's ends."""
    update = _textual_partial_update(self)
    if update is None:
        return None
    ends = list(update.chop_ends)
    for y in {y for y, _, _ in update.spans}:
        ends[y] = [end if strip is None else max(end, x + strip.cell_length)
                   for (x, strip), end in zip(update.chops[y].items(), ends[y], strict=False)]
    spans = []
    for y, x1, x2 in update.spans:
        for (x, strip), end in zip(update.chops[y].items(), ends[y], strict=False):
            if strip is not None and x < x2 < end and straddled(strip, [x2 - x]):
                x2 += 1  # the span ended inside a wide character: write its second cell too
                break
        spans.append((y, x1, x2))
    return ChopsUpdate(update.chops, spans, ends)


def apply() -> bool:
    """Put both in place of Textual's, for the pinned version; True when they were applied."""
    if textual.__version__ != PATCHED_VERSION:
        return False
    Compositor._render_chops = render_chops  # type: ignore[method-assign]
    Compositor.render_partial_update = render_partial_update  # type: ignore[method-assign]
    return True
