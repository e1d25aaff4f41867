"""Contrast of every theme, as defined (truecolor) and as a 256-colour terminal shows it.

WCAG 2 contrast: text that carries information >= 4.5:1 against what it is drawn on, borders >= 3:1.
A 256-colour terminal (tmux's default ``screen-256color``, many SSH setups) gets each colour rounded to
the xterm palette, the way Rich downgrades it, and rounding can take two close colours onto one entry:
the light theme's GPU card borders were palette 231 on 231 there. So each pair is checked twice.

Two levels: the theme variables our stylesheets draw text with, and the rendered screens (the colours
of the cells the compositor really drew: card border, border title and subtitle, footer keys,
placeholders), so a stylesheet that picks a weak variable fails too. No GPU needed: fake NVML.
"""

from __future__ import annotations

import asyncio

import pytest
from rich.color import Color as RichColor
from rich.color import ColorSystem
from rich.segment import Segment
from textual.color import Color
from textual.widgets import Input

from core.paths import runs_dir
from tests.fixtures.watch.run_builder import build_run
from tests.tui.conftest import fake_monitor, quiet_settings, wait_for, wait_screen_stable
from themes import THEMES
from tui.app import make_app
from tui.screens.gpus import GpuCard, GpuScreen
from tui.widgets.keys_footer import KeysFooter

TEXT = 4.5
BORDER = 3.0
THEME_NAMES = [theme.name for theme in THEMES]


def luminance(color: Color) -> float:
    def channel(value: int) -> float:
        value /= 255
        return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(color.r) + 0.7152 * channel(color.g) + 0.0722 * channel(color.b)


def contrast(a: Color, b: Color) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def in_256(color: Color) -> Color:
    """``color`` as an xterm 256-colour terminal shows it (Rich's downgrade, which Textual's output uses)."""
    rounded = RichColor.from_rgb(color.r, color.g, color.b).downgrade(ColorSystem.EIGHT_BIT).get_truecolor()
    return Color(rounded.red, rounded.green, rounded.blue)


def contrasts(foreground: Color, background: Color) -> tuple[float, float]:
    """(truecolor, 256 colours)."""
    return contrast(foreground, background), contrast(in_256(foreground), in_256(background))


def resolve(value: str, under: Color) -> Color:
    """A theme variable's value as drawn over ``under``: alpha blended, ``auto N%`` as Textual does it."""
    if value.startswith("auto"):
        parts = value.split()
        alpha = float(parts[1].rstrip("%")) / 100 if len(parts) > 1 else 1.0
        return under.blend(under.get_contrast_text(1.0), alpha)
    color = Color.parse(value)
    return under.blend(color.with_alpha(1.0), color.a) if color.a < 1 else color


# (what, foreground variable, background variable, minimum): the variables our stylesheets draw with.
PAIRS = [
    ("text", "foreground", "background", TEXT),
    ("text on a surface (help, inputs)", "foreground", "surface", TEXT),
    ("muted text (card details, hints)", "foreground-muted", "background", TEXT),
    ("placeholder (tui/app.tcss)", "foreground-muted", "surface", TEXT),
    ("footer key", "footer-key-foreground", "footer-background", TEXT),
    ("footer description", "footer-description-foreground", "footer-background", TEXT),
    ("help title and card titles", "primary", "background", TEXT),
    ("help title", "primary", "surface", TEXT),
    ("help sections", "accent", "surface", TEXT),
    ("card subtitle (temperature, power)", "foreground", "background", TEXT),
    ("card border", "foreground-muted", "background", BORDER),
    ("errors", "error", "background", TEXT),
    ("warnings", "warning", "background", TEXT),
    ("run states, fit verdict", "success", "background", TEXT),
    ("memory history, gradients", "secondary", "background", TEXT),
]


@pytest.mark.parametrize("theme", THEMES, ids=THEME_NAMES)
def test_theme_variables_that_carry_text_are_readable_in_truecolor_and_256_colours(theme):
    variables = theme.to_color_system().generate()
    failures = []
    for what, fg_name, bg_name, minimum in PAIRS:
        background = resolve(variables[bg_name], Color(0, 0, 0))
        foreground = resolve(variables[fg_name], background)
        true, eight_bit = contrasts(foreground, background)
        if min(true, eight_bit) < minimum:
            failures.append(f"{what}: ${fg_name} {foreground.hex} on ${bg_name} {background.hex}: "
                            f"{true:.2f}:1 truecolor, {eight_bit:.2f}:1 in 256 colours (need {minimum})")
    assert not failures, "\n".join(failures)


def cell(app, x: int, y: int) -> Segment:
    """The segment the compositor drew at screen cell (x, y)."""
    strip = app.screen._compositor.render_strips()[y]
    offset = 0
    for segment in strip:
        if offset <= x < offset + segment.cell_length:
            return segment
        offset += segment.cell_length
    raise AssertionError(f"no cell at {x},{y}")


def cells_of(app, text: str) -> list[Segment]:
    """The segments that draw ``text`` (its first occurrence on screen), one per non-blank character."""
    strips = app.screen._compositor.render_strips()
    for y, strip in enumerate(strips):
        column = strip.text.find(text)
        if column >= 0:
            return [cell(app, column + i, y) for i, char in enumerate(text) if not char.isspace()]
    raise AssertionError(f"{text!r} is not on screen")


def drawn_contrasts(segment: Segment) -> tuple[float, float]:
    style = segment.style
    assert style is not None and style.color is not None and style.bgcolor is not None, segment
    return contrasts(Color.from_rich_color(style.color), Color.from_rich_color(style.bgcolor))


def assert_readable(what: str, segments: list[Segment], minimum: float) -> None:
    for segment in segments:
        true, eight_bit = drawn_contrasts(segment)
        assert min(true, eight_bit) >= minimum, (
            f"{what} {segment.text!r} ({segment.style}): {true:.2f}:1 truecolor, {eight_bit:.2f}:1 in 256 "
            f"colours, need {minimum}")


@pytest.mark.parametrize("theme", THEME_NAMES)
def test_gpu_cards_footer_and_placeholders_as_drawn(theme):
    """One fake H200 at 160x50 (full cards), then the runs screen's filter placeholder (one finished run listed:
    the filter is offered with a run to filter)."""
    build_run(runs_dir(), "20261207-1700-contrast", status="finished", steps=600, created="2026-12-07T17:00:00Z")

    async def scenario():
        app = make_app(quiet_settings(theme=theme), monitor=fake_monitor("h200x1"))
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, GpuScreen) and app.screen.snapshot is not None)
            await wait_for(pilot, lambda: bool(app.screen.query_one(KeysFooter).shown()))
            await wait_screen_stable(pilot, app)
            assert app.theme == theme
            card = app.screen.query_one(GpuCard)
            assert not card.has_class("-compact")
            x, y = card.region.x, card.region.y
            assert cell(app, x, y).text.startswith("╭")
            assert_readable("card border", [cell(app, x, y), cell(app, x, y + 1)], BORDER)
            assert_readable("card title", cells_of(app, str(card.border_title)), TEXT)
            assert_readable("card subtitle", cells_of(app, str(card.border_subtitle)), TEXT)
            for key, _ in app.screen.query_one(KeysFooter).shown():
                footer_row = app.screen.query_one(KeysFooter).region.y
                strip_text = app.screen._compositor.render_strips()[footer_row].text
                column = strip_text.find(key)
                assert column >= 0, key
                assert_readable("footer key", [cell(app, column + i, footer_row) for i in range(len(key))], TEXT)

            await pilot.press("r")
            await wait_for(pilot, lambda: bool(app.screen.query("#runs-filter")))
            await wait_screen_stable(pilot, app)
            await pilot.press("f")  # the filter field opens empty: its placeholder says what it filters by
            field = app.screen.query_one("#runs-filter", Input)
            await wait_for(pilot, lambda: field.display and app.screen.focused is field)
            field.cursor_blink = False
            await wait_screen_stable(pilot, app)
            # the cursor cell is drawn inverted: look past the first characters
            assert_readable("placeholder", cells_of(app, str(field.placeholder)[5:30]), TEXT)

    asyncio.run(scenario())
