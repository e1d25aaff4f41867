"""Text measured in terminal cells, not characters: CJK characters take two cells.

Layouts (tables, bars, truncation) use these so that a Chinese interface lines up like an English one.
``one_line`` folds text from elsewhere (a process's command line) onto the one line a table row has.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

ELLIPSIS = "…"


def one_line(text: str) -> str:
    """``text`` on one line: each run of whitespace and control characters (newlines, tabs, terminal escapes,
    NULs) is one space, none at either end. A ``python -c`` script's command line is several lines, and a
    process's arguments are anyone's bytes: printed raw they break a table, or drive the terminal."""
    return " ".join("".join(" " if unicodedata.category(c) == "Cc" else c for c in text).split())


# A terminal escape: CSI (colours, cursor moves: ``\x1b[31m``, ``\x1b[2K``), OSC (titles, links) to its BEL or ST, or
# a two-byte one (``\x1b(B``, ``\x1bM``).
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])")


def as_shown(line: str) -> str:
    """A line of a program's output as a terminal leaves it on screen, in plain printable cells: its escapes
    (colours, cursor moves) dropped, what it wrote after a carriage return laid over the start of what came
    before (a progress bar's updates: the newest shows), tabs to the next multiple of 8 and any other control
    character left out. Drawn raw, they move a full-screen app's cursor and scramble the screen around them."""
    if line.isprintable():
        return line
    shown: list[str] = []
    for part in _ESCAPE.sub("", line).split("\r"):
        cells: list[str] = []
        used = 0
        for char in part:
            if char == "\t":
                cells.append(" " * (8 - used % 8))
                used += 8 - used % 8
            elif unicodedata.category(char) != "Cc":
                cells.append(char)
                used += char_width(char)
        shown[:len(cells)] = cells
    return "".join(shown)


@lru_cache(maxsize=4096)
def char_width(char: str) -> int:
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def cell_len(text: str) -> int:
    """Number of terminal cells ``text`` occupies."""
    if text.isascii():
        return len(text)
    return sum(char_width(c) for c in text)


def truncate(text: str, width: int) -> str:
    """``text`` cut to at most ``width`` cells, with an ellipsis when something was cut."""
    if cell_len(text) <= width:
        return text
    if width <= 0:
        return ""
    out: list[str] = []
    used = 0
    for char in text:
        w = char_width(char)
        if used + w > width - 1:
            break
        out.append(char)
        used += w
    return "".join(out) + ELLIPSIS


def pad(text: str, width: int, align: str = "left") -> str:
    """``text`` truncated or padded with spaces to exactly ``width`` cells."""
    text = truncate(text, width)
    gap = width - cell_len(text)
    if align == "right":
        return " " * gap + text
    if align == "center":
        return " " * (gap // 2) + text + " " * (gap - gap // 2)
    return text + " " * gap
