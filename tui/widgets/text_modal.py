"""A read-only text in a scrollable modal (a run's config.yaml): Esc or q closes."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from core.i18n import t
from tui.widgets.modal import KeyedModal


class TextModal(KeyedModal[None]):
    DEFAULT_CSS = """
    TextModal { align: center middle; background: $background 60%; }
    TextModal > VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 90%;
                                 border: round $primary; background: $surface; padding: 0 1; }
    TextModal .text-title { text-style: bold; color: $primary; }
    TextModal .text-hint { color: $foreground-muted; }
    """
    BINDINGS = [
        Binding("escape", "dismiss", t("dashboard.close"), id="text.close"),
        Binding("q", "dismiss", t("dashboard.close"), show=False),
    ]

    def __init__(self, title: str, text: str) -> None:
        super().__init__()
        self.title_text = title
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.title_text, classes="text-title", markup=False)
            yield Static(self.text, id="text-body", markup=False)
            yield Static(t("dashboard.close_hint"), classes="text-hint")
