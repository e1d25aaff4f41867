"""Chinese text wraps between its characters, not inside the Latin words and keys it holds.

Rich (and Textual's ``Content``, through ``rich._wrap.divide_line``) breaks lines at whitespace only. Chinese
has none, so a paragraph was one "word" longer than the line, folded at the last cell whatever stood there:
the wizard's model step at 80 columns read ``模型浏览器（Ctr`` / ``l+P，模型）``. Chinese text may break
between any two of its characters; ``words`` gives ``divide_line`` those places as well, keeping a run
of Latin letters, digits and signs whole, a closing mark (，。）…) on the line of what it closes and an
opening one (（“…) on the line of what it opens. Text without a wide character is divided as before.

Applied once, on import of ``tui.app``, for the pinned Rich version only: another version keeps its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import rich._wrap
from rich.cells import get_character_cell_size

PATCHED_VERSION = "15.0.0"  # the version whose rich._wrap.words this replaces (pyproject.toml pins it)
_WORD = re.compile(r"\s*\S+\s*")
# No line starts with these (they close what comes before) or ends with those (they open what follows).
_CLOSING = set("，。、；：！？）」』】〉》”’％…—,.;:!?)]}%")
_OPENING = set("（「『【〈《“‘([{")


def _wide(char: str) -> bool:
    return get_character_cell_size(char) == 2


def _breaks(word: str) -> list[int]:
    """Offsets inside ``word`` (whitespace-free but for its ends) where a line may break."""
    offsets = []
    for index in range(1, len(word)):
        before, after = word[index - 1], word[index]
        if after.isspace() or before.isspace():
            continue
        if not (_wide(before) or _wide(after)):
            continue  # inside a Latin run: Ctrl+P, Qwen2.5-7B, 0.5B
        if after in _CLOSING or before in _OPENING:
            continue
        offsets.append(index)
    return offsets


def words(text: str) -> Iterable[tuple[int, int, str]]:
    """``rich._wrap.words``, with a word of Chinese text split where a line may break inside it."""
    position = 0
    match = _WORD.match(text, position)
    while match is not None:
        start, end = match.span()
        word = match.group(0)
        if word.isascii():
            yield start, end, word
        else:
            last = 0
            for offset in _breaks(word):
                yield start + last, start + offset, word[last:offset]
                last = offset
            yield start + last, end, word[last:]
        match = _WORD.match(text, end)


def apply() -> bool:
    """Put ``words`` in place of Rich's, for the pinned version; True when it was applied."""
    from importlib.metadata import version

    if version("rich") != PATCHED_VERSION:
        return False
    rich._wrap.words = words  # type: ignore[assignment]  (divide_line looks it up in its module)
    return True

