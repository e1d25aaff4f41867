"""argparse's own words ("usage:", "options:", its error messages) in the interface language.

The stdlib's argparse (3.10 to 3.14) looks every one of its texts up at call time through the module
globals ``_`` and ``ngettext`` it imported from gettext. ``speaking_interface_language()`` puts a
translation object there for the length of a call and puts the originals back afterwards, so only our
parser's calls are affected and other argparse users in the same process see the stdlib unchanged.

The translations live in the catalogue (``argparse.json``): the English text of each key is argparse's
message id, byte for byte, so the ids need no second table here; an id we do not know (a newer Python's
new message) stays English. In English nothing is looked up at all: the output is exactly the stdlib's.
"""

from __future__ import annotations

import argparse
import gettext
import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

from core.i18n import DEFAULT_LANGUAGE, catalogue, current_language
from core.text_width import cell_len

PREFIX = "argparse."


@cache
def _key_by_message_id() -> dict[str, str]:
    return {text: key for key, text in catalogue(DEFAULT_LANGUAGE).items() if key.startswith(PREFIX)}


class ArgparseTranslation(gettext.NullTranslations):
    """argparse's message ids translated into the current interface language (read at each lookup)."""

    def gettext(self, message: str) -> str:
        language = current_language()
        if language == DEFAULT_LANGUAGE:
            return message
        key = _key_by_message_id().get(message)
        return catalogue(language).get(key, message) if key else message

    def ngettext(self, singular: str, plural: str, n: int) -> str:
        return self.gettext(singular if n == 1 else plural)


_TRANSLATION = ArgparseTranslation()


@contextmanager
def speaking_interface_language() -> Iterator[None]:
    """While inside, argparse's lookups go through the catalogue; the stdlib's are restored on exit."""
    saved = argparse._, argparse.ngettext  # type: ignore[attr-defined]
    argparse._ = _TRANSLATION.gettext  # type: ignore[attr-defined]
    argparse.ngettext = _TRANSLATION.ngettext  # type: ignore[attr-defined]
    try:
        yield
    finally:
        argparse._, argparse.ngettext = saved  # type: ignore[attr-defined]


_TOKENS = re.compile(r"\s+|[^\s\u1100-\uffff]+|[\u1100-\uffff]")
# Full-width punctuation that must not start a line (it stays at the end of the line before).
_NO_LINE_START = set("，。、；：？！）」』》〉”’")


def wrap_cells(text: str, width: int) -> list[str]:
    """``text`` (whitespace collapsed) in lines of at most ``width`` terminal cells: breaks at spaces and
    between wide characters, never inside a Latin word, never before closing punctuation."""
    lines: list[str] = []
    line, used = "", 0
    for token in _TOKENS.findall(" ".join(text.split())):
        size = cell_len(token)
        if token.isspace():
            if line:
                line, used = line + " ", used + 1
            continue
        if line and used + size > width and token not in _NO_LINE_START:
            lines.append(line.rstrip())
            line, used = "", 0
        line, used = line + token, used + size
    if line.strip():
        lines.append(line.rstrip())
    return lines


class CatalogueHelpFormatter(argparse.HelpFormatter):
    """Two things the lookups cannot reach in every version: the colon after a section heading (a
    literal before 3.14) and the indent of wrapped usage lines, which argparse counts in characters
    where a Chinese prefix is two cells per character."""

    class _Section(argparse.HelpFormatter._Section):  # type: ignore[name-defined]
        def format_help(self) -> str:
            text = super().format_help()
            heading = self.heading
            if isinstance(heading, str) and heading is not argparse.SUPPRESS and text:
                translated = _TRANSLATION.gettext("%(heading)s:") % {"heading": heading}
                text = text.replace(f"{heading}:\n", f"{translated}\n", 1)
            return text

    # argparse wraps help texts at a width in characters; a Chinese character takes two cells, so a text
    # with wide characters is wrapped here by cells (an all-narrow text keeps argparse's own wrapping).
    def _split_lines(self, text: str, width: int) -> list[str]:
        if cell_len(text) == len(text):
            return super()._split_lines(text, width)
        return wrap_cells(text, width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if cell_len(text) == len(text):
            return super()._fill_text(text, width, indent)
        return "\n".join(indent + line for line in wrap_cells(text, width - len(indent)))

    def _format_usage(self, usage, actions, groups, prefix):  # noqa: ANN001, ANN202 (argparse's signature)
        if prefix is None:
            prefix = _TRANSLATION.gettext("usage: ")
        text = super()._format_usage(usage, actions, groups, prefix)
        extra = cell_len(prefix) - len(prefix)
        if extra <= 0:
            return text
        first, *rest = text.split("\n")
        return "\n".join([first, *(" " * extra + line if line.startswith(" ") else line for line in rest)])


class CatalogueArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose built-in texts come out in the interface language.

    Every entry point that makes argparse produce text is wrapped: construction (the "positional
    arguments"/"options" group titles and the -h help), parsing (errors, --help, --version), and the
    formatting calls. Subparsers are built with the same class (argparse's default ``parser_class``).
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", CatalogueHelpFormatter)
        with speaking_interface_language():
            super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201 (argparse's signature)
        with speaking_interface_language():  # "unrecognized arguments" is looked up here, not below
            return super().parse_args(args, namespace)

    def parse_known_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201 (argparse's signature)
        with speaking_interface_language():
            return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        with speaking_interface_language():
            return super().format_usage()

    def format_help(self) -> str:
        with speaking_interface_language():
            return super().format_help()

    def error(self, message: str):  # noqa: ANN201 (NoReturn in argparse)
        with speaking_interface_language():
            # Python 3.10 formats "argument X: ..." with a literal, not through gettext (3.11+ do).
            untranslated = _ARGUMENT_PREFIX.match(message)
            if untranslated:
                message = _TRANSLATION.gettext("argument %(argument_name)s: %(message)s") % {
                    "argument_name": untranslated["name"], "message": untranslated["rest"]}
            super().error(message)


_ARGUMENT_PREFIX = re.compile(r"^argument (?P<name>\S+): (?P<rest>.*)$", re.DOTALL)
