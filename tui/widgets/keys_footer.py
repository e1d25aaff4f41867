"""A one-line footer built by priority: the keys that matter here, as many as fit, ``?`` always shown.

Textual's own footer lists every shown binding in declaration order and cuts the line at the right
edge, so at 80 columns (and sooner in Chinese, two cells a character) the help key falls off. This one
measures each entry in cells and drops the lowest-priority entries first, as lazygit and k9s do.

Order: help first (``?``, or ``F1`` while a text field has the focus); then the screen's own priority
list (``footer_priority()``, binding ids, so it can follow the state: stop while running, merge/chat/serve
when finished); then the screen's other shown keys; the focused widget's; the app's (quit, sections); the
palette last. The screen's ``footer_label()`` names an entry for the state it is in, or leaves it out
(None) where another entry says the same. An action refused by ``check_action`` (hidden or disabled) is
not offered. While a text field has the focus (or the screen sends typed keys to one), letter keys would be
typed into it, so only the entries with another key remain.
"""

from __future__ import annotations

from rich.text import Text
from textual.keys import format_key
from textual.widget import Widget
from textual.widgets import Input, TextArea

from core.text_width import cell_len

# The app's entries after the screen's, most useful first.
APP_ORDER = ("quit", "mode.gpus", "mode.models", "mode.wizard", "mode.runs")
SEPARATOR = "  "
# Textual names keys in lower case ("esc", "pageup", "^p", "⏎"); help, footer and palette name them as
# keyboards print them, in one style: Esc, Tab, F1, PgUp, Ctrl+P, Shift+Tab. Arrows stay arrows.
KEY_NAMES = {"escape": "Esc", "enter": "Enter", "pageup": "PgUp", "pagedown": "PgDn", "tab": "Tab",
             "home": "Home", "end": "End", "space": "Space", "backspace": "Backspace", "delete": "Del",
             "insert": "Ins"}
MODIFIER_NAMES = {"ctrl": "Ctrl", "shift": "Shift", "alt": "Alt"}
# Modifiers a terminal over SSH never sends (super+c is the macOS Cmd key), or sends only where it is set up to
# (Alt: macOS terminals type Option+Backspace as a character unless "Option as Meta" is on): not offered.
NOT_OVER_SSH = {"super", "meta", "hyper", "alt"}


def survives_ssh(key: str) -> bool:
    """Whether a terminal over SSH can send ``key`` (not super+c and the like)."""
    return not NOT_OVER_SSH.intersection(key.split("+")[:-1])


def key_name(key: str) -> str | None:
    """The name a keyboard prints for ``key`` (F7, Esc, PgUp, Ctrl+P, Shift+Tab), or None to let Textual
    name it (letters and symbols as typed: q, S, ?, +; arrows)."""
    *modifiers, base = key.split("+")
    if base[:1] == "f" and base[1:].isdigit():
        name = base.upper()
    elif base in KEY_NAMES:
        name = KEY_NAMES[base]
    elif modifiers:
        name = format_key(base)
        name = name.upper() if len(name) == 1 else name.capitalize()
    else:
        return None
    return "+".join([*(MODIFIER_NAMES.get(modifier, modifier.capitalize()) for modifier in modifiers), name])


def is_typed_key(key: str) -> bool:
    """Whether a text field would take ``key`` as text (a letter, digit or printable symbol)."""
    return len(key) == 1 or key in {"question_mark", "plus", "minus", "space", "full_stop", "comma", "slash"}


def field_focused(screen) -> bool:
    """Whether a text field (an Input or a TextArea) has the focus on ``screen``."""
    return isinstance(screen.focused, (Input, TextArea))


def typing(screen) -> bool:
    """Whether a letter pressed now is text: a text field has the focus, or the screen sends typed keys to one
    (``takes_typing()``: the wizard's model, data and hardware steps start a new value with the first key)."""
    return field_focused(screen) or bool(getattr(screen, "takes_typing", bool)())


def footer_entries(screen) -> list[tuple[str, str]]:
    """(key display, description) in priority order for ``screen`` as it stands (state and focus)."""
    app = screen.app
    typed = typing(screen)
    # action -> (node kind, binding ids, usable key displays, shown, description), in binding-chain order
    actions: dict[str, dict] = {}
    for key, active in screen.active_bindings.items():
        binding = active.binding
        if not active.enabled:
            continue
        name = binding.action
        if name == f"section('{getattr(app, 'current_mode', '')}')":
            continue  # the section already on screen
        if name in ("command_palette", "app.command_palette"):
            name = "command_palette"
        kind = "app" if active.node is app else "screen" if active.node is screen else "widget"
        entry = actions.setdefault(name, {"kind": kind, "ids": [], "keys": [], "shown": False,
                                          "description": binding.description, "label_id": binding.id})
        if binding.id:
            entry["ids"].append(binding.id)
        if typed and is_typed_key(key) or not survives_ssh(key):
            continue
        display = binding.key_display or key_name(key) or app.get_key_display(binding) or key
        if binding.show:
            entry["shown"] = True
            entry["keys"].insert(0, display)  # the shown key first, its F-key twin after
            entry["description"] = binding.description
            entry["label_id"] = binding.id
        else:
            entry["keys"].append(display)
    by_id = {binding_id: name for name, entry in actions.items() for binding_id in entry["ids"]}
    order: list[str] = []

    def take(name: str | None) -> None:
        if name and name not in order and actions.get(name, {}).get("keys"):
            order.append(name)

    take("help")
    priority = screen.footer_priority() if hasattr(screen, "footer_priority") else ()
    for binding_id in priority:
        take(by_id.get(binding_id))
    for kind in ("screen", "widget"):
        for name, entry in actions.items():
            if entry["kind"] == kind and entry["shown"]:
                take(name)
    for binding_id in APP_ORDER:
        take(by_id.get(binding_id))
    take("command_palette")
    rows = []
    for name in order:
        entry = actions[name]
        description = entry["description"]
        if name == "command_palette":
            from core.i18n import t

            description = t("app.key.palette_footer")
        elif hasattr(screen, "footer_label") and entry["label_id"]:
            description = screen.footer_label(entry["label_id"], description)
            if description is None:
                continue  # another entry already says what this key does here
            short = getattr(screen, "FOOTER_LABELS", {}).get(entry["label_id"])
            if short:  # a long description's short form, for the footer line alone (help and palette keep it whole)
                from core.i18n import t

                description = t(short)
        rows.append((entry["keys"][0], description))
    return rows


def fit(entries: list[tuple[str, str]], width: int) -> list[tuple[str, str]]:
    """The entries that fit in ``width`` cells, highest priority first; the first one always stays."""
    kept: list[tuple[str, str]] = []
    used = 0
    for i, (key, description) in enumerate(entries):
        size = cell_len(key) + 1 + cell_len(description) + (cell_len(SEPARATOR) if kept else 0)
        if i and used + size > width:
            continue  # a shorter, lower entry may still fit
        kept.append((key, description))
        used += size
    return kept


class KeysFooter(Widget):
    """The footer of every screen (see the module docstring)."""

    COMPONENT_CLASSES = {"keysfooter--key", "keysfooter--description"}
    DEFAULT_CSS = """
    KeysFooter { dock: bottom; height: 1; background: $footer-background; padding: 0 1; }
    KeysFooter > .keysfooter--key { color: $footer-key-foreground; text-style: bold; }
    KeysFooter > .keysfooter--description { color: $footer-description-foreground; }
    """

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen) -> None:
        if self.is_attached and screen is self.screen:
            self.refresh()

    def shown(self) -> list[tuple[str, str]]:
        """The entries on the line now (what a test reads)."""
        return fit(footer_entries(self.screen), self.content_region.width or self.app.size.width - 2)

    def render(self) -> Text:
        key_style = self.get_component_rich_style("keysfooter--key")
        text_style = self.get_component_rich_style("keysfooter--description")
        line = Text(no_wrap=True, overflow="crop")
        for i, (key, description) in enumerate(self.shown()):
            if i:
                line.append(SEPARATOR)
            line.append(key, key_style)
            line.append(" ")
            line.append(description, text_style)
        return line
