"""Horizontal bars as markup strings, sized in cells."""

from __future__ import annotations

FULL = "█"
PARTIALS = " ▏▎▍▌▋▊▉"


def bar(fraction: float | None, width: int) -> str:
    """A bar of ``width`` cells filled to ``fraction`` (0..1) with eighth-cell precision."""
    if width <= 0:
        return ""
    if fraction is None:
        return "·" * width
    fraction = max(0.0, min(1.0, fraction))
    eighths = int(round(fraction * width * 8))
    full, rest = divmod(eighths, 8)
    text = FULL * full + (PARTIALS[rest] if rest and full < width else "")
    return text + " " * (width - len(text))


def level_variable(fraction: float | None) -> str:
    """Theme variable for a load level: calm, busy, critical."""
    if fraction is None:
        return "$foreground-muted"
    if fraction >= 0.9:
        return "$error"
    if fraction >= 0.7:
        return "$warning"
    return "$success"
