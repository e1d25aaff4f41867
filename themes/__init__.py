"""tunedeck's themes, as Textual ``Theme`` objects.

Stylesheets use only theme variables ($primary, $panel, $error …), so every screen follows the theme.
The high-contrast theme keeps to plain, saturated colours that map cleanly onto 256-colour terminals.
Text that carries information stays at 4.5:1 or more against what it is drawn on, and borders at 3:1, as
defined and once a 256-colour terminal rounds the colours (tests/tui/test_theme_contrast.py).
"""

from __future__ import annotations

from textual.theme import Theme

DEFAULT_THEME = "tunedeck-dark"

DARK = Theme(
    name="tunedeck-dark",
    primary="#4FB3D9",
    secondary="#8C7AE6",
    accent="#F5A623",
    warning="#F5A623",
    error="#E5534B",
    success="#57AB5A",
    foreground="#D8DEE9",
    background="#11151C",
    surface="#1A2029",
    panel="#232B36",
    dark=True,
)

LIGHT = Theme(
    name="tunedeck-light",
    primary="#0A6C94",
    secondary="#5B4DB3",
    # Darker than a "light theme orange": it is the footer's key colour on $panel, and #B35900 became
    # 130 on 188 in 256 colours (3.3:1). This one stays >= 4.5:1 on background, surface and panel there too.
    accent="#704A00",
    warning="#9A5B00",
    error="#B3261E",
    success="#2E7D32",
    foreground="#1C2430",
    background="#F7F8FA",
    surface="#ECEFF3",
    panel="#DDE3EA",
    dark=False,
    # Textual's muted text (foreground at 60%) is 4.2:1 here; placeholders and card borders use it.
    variables={"foreground-muted": "#565D67"},
)

HIGH_CONTRAST = Theme(
    name="tunedeck-high-contrast",
    primary="#00FFFF",
    secondary="#FF00FF",
    accent="#FFFF00",
    warning="#FFFF00",
    error="#FF0000",
    success="#00FF00",
    foreground="#FFFFFF",
    background="#000000",
    surface="#000000",
    panel="#303030",
    dark=True,
    luminosity_spread=0.0,
)

THEMES: tuple[Theme, ...] = (DARK, LIGHT, HIGH_CONTRAST)
