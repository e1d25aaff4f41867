"""One formatter of numbers for the app and the CLI: durations, counts, rates, costs and sizes.

Conventions: durations read like a clock (``0:27``, ``1:02:03``, ``2d 03h``); counts and rates carry
thousands separators (``7,745``, ``8,452``); memory is binary (``81.3 GiB``, as NVML and torch count it) and
disk decimal (``21.5 TB``, as ``df -H`` and the clouds count it). An unknown value is ``–`` everywhere.
Text output only: ``--json`` keeps the numbers themselves (a cost through ``json_cost``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

UNKNOWN = "–"
# A step total a resume has made unknown until its trainer counts it again ("921/?"; RunDirectory.latest_metrics)
TOTAL_PENDING = "?"


def _known(value: float | None) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def format_duration(seconds: float | None) -> str:
    """``0:27``, ``59:59``, ``1:02:03``, ``2d 03h``; ``< 0:01`` for a fraction of a second (an estimate's
    epoch of a tiny model, which "0:00" read as none); ``–`` when unknown or negative."""
    if not _known(seconds) or seconds < 0 or math.isinf(seconds):  # type: ignore[operator]
        return UNKNOWN
    if 0 < seconds < 1:  # type: ignore[operator]
        return "< 0:01"
    total = int(seconds)  # type: ignore[arg-type]
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"  # minutes are noise a day out, and the width is a column's
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_count(value: float | None) -> str:
    """A whole count with thousands separators: ``7,745``; ``–`` when unknown."""
    if not _known(value):
        return UNKNOWN
    return f"{round(value):,}"  # type: ignore[arg-type]


def format_rate(value: float | None) -> str:
    """A per-second rate: ``8,452``, one decimal below 10 (``3.5``); ``–`` when unknown."""
    if not _known(value):
        return UNKNOWN
    if abs(value) < 10 and value != 0:  # type: ignore[arg-type]
        return f"{value:.1f}"
    return format_count(value)


def format_cost(value: float | None, currency: str = "") -> str:
    """A cost to the cent with thousands separators (``1,234.50``); a cost above zero but under a cent is
    ``< 0.01``, never ``0.00`` (which reads as free); ``currency`` goes before the number (``< $0.01``,
    ``$0.60``); ``–`` when unknown."""
    if not _known(value):
        return UNKNOWN
    if 0 < value < 0.01:  # type: ignore[operator]
        return f"< {currency}0.01"
    return f"{currency}{value:,.2f}"


def json_figure(value: float | None, decimals: int) -> float | None:
    """A figure for ``--json``: four significant digits and never fewer than ``decimals`` decimals, so that a
    small one is not rounded to ``0.0`` and float noise goes; None stays None."""
    if value is None or not math.isfinite(value) or value == 0:
        return value
    return round(value, max(decimals, 3 - math.floor(math.log10(abs(value)))))


def json_cost(value: float | None) -> float | None:
    """A cost for ``--json``: ``json_figure`` to at least the cent (``1234.57``, ``0.08333``, ``3.572e-05``): a
    cost under a cent is not ``0.0``, which reads as free. The text formats with ``format_cost``."""
    return json_figure(value, 2)


def json_hours(value: float | None) -> float | None:
    """A duration in hours for ``--json``: ``json_figure`` to at least 4 decimals, under a second
    (``12.3457``, ``0.0002778`` for one second, which rounding to 0.001 h made 0.0)."""
    return json_figure(value, 4)


def format_compact(value: float | None) -> str:
    """At most ~6 characters, for chart axes: ``1234``, ``12.3k``, ``1.20M``; ``–`` when unknown."""
    if not _known(value):
        return UNKNOWN
    if abs(value) >= 1e6:  # type: ignore[arg-type]
        return f"{value / 1e6:.2f}M"  # type: ignore[operator]
    if abs(value) >= 1e4:  # type: ignore[arg-type]
        return f"{value / 1e3:.1f}k"  # type: ignore[operator]
    return f"{value:.0f}"


def format_magnitude(value: float | None, unknown: str = UNKNOWN) -> str:
    """Parameter and download counts in a column: ``7.6B``, ``1.2M``, ``3.4K``, ``950``."""
    if not _known(value):
        return unknown
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:  # type: ignore[operator]
            return f"{value / scale:.1f}{unit}"  # type: ignore[operator]
    return str(value)


def format_axis(values: Sequence[float | None]) -> list[str]:
    """Labels of one chart axis in one unit and one precision: ``12.6k 6.3k 0``, never ``10.4k`` beside
    ``5201``. The unit (k, M) and the decimals come from the largest magnitude; very small or very large
    axes use one exponent format (``2.0e-04``); zero is ``0``; thousands carry their separator (``9,351``,
    as the header's ``9,351 tok/s``); at most ~7 characters a label."""
    known = [float(v) for v in values if _known(v)]
    if not known:
        return [UNKNOWN] * len(values)
    top = max(abs(v) for v in known)
    if top == 0:
        return [UNKNOWN if not _known(v) else "0" for v in values]
    if top < 1e-2 or top >= 1e9:
        return [UNKNOWN if not _known(v) else "0" if v == 0 else f"{v:.1e}" for v in values]  # type: ignore[str-format]
    divisor, suffix = (1e6, "M") if top >= 1e6 else (1e3, "k") if top >= 1e4 else (1.0, "")
    scaled_top = top / divisor
    if suffix:
        decimals = 0 if scaled_top >= 100 else 1 if scaled_top >= 10 or suffix == "k" else 2
    else:
        decimals = 0 if top >= 100 else min(4, max(0, 3 - math.floor(math.log10(top))))
    out = []
    for value in values:
        if not _known(value):
            out.append(UNKNOWN)
        elif value == 0:
            out.append("0")
        else:
            out.append(f"{value / divisor:,.{decimals}f}{suffix}")  # type: ignore[operator]
    return out


def format_memory(num_bytes: float | None) -> str:
    """Memory in binary units: ``81.3 GiB``, ``512.0 MiB``; ``–`` when unknown."""
    if not _known(num_bytes):
        return UNKNOWN
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(num_bytes) >= size:  # type: ignore[arg-type]
            return f"{num_bytes / size:.1f} {unit}"  # type: ignore[operator]
    return f"{num_bytes:.0f} B"


def format_disk(num_bytes: float | None) -> str:
    """Disk and file sizes in decimal units: ``21.5 TB``, ``3.2 GB``, ``980.0 MB``; ``–`` when unknown."""
    if not _known(num_bytes):
        return UNKNOWN
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(num_bytes) >= size:  # type: ignore[arg-type]
            return f"{num_bytes / size:.1f} {unit}"  # type: ignore[operator]
    return f"{num_bytes:.0f} B"


def plural_key(key: str, count: int) -> str:
    """``key_one`` for exactly one, else ``key_other``: the catalogue holds both (zh gives them the same text)."""
    return f"{key}_one" if count == 1 else f"{key}_other"
