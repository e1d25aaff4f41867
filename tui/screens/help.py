"""Help generated from the bindings in force: what the user can press here, and everywhere."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from core.i18n import t
from core.text_width import pad


class HelpScreen(ModalScreen[None]):
    """A modal listing the keys of the screen it was opened from, then the app-wide ones."""

    BINDINGS = [
        Binding("escape", "dismiss", t("help.key.close"), id="help.close"),
        Binding("q", "dismiss", t("help.key.close"), show=False),
        Binding("f1", "dismiss", t("help.key.close"), show=False),
        Binding("question_mark", "dismiss", t("help.key.close"), show=False),
    ]

    def __init__(self, sections: list[tuple[str, list[tuple[str, str]]]]) -> None:
        """``sections``: ("screen" | "app" | "widget", rows of (key display, description))."""
        super().__init__()
        self.sections = sections

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(t("help.title"), classes="help-title")
            for name, rows in self.sections:
                yield Static(t(f"help.section_{name}"), classes="help-section")
                yield Static(self._table(rows), classes="help-table", markup=False)
            yield Static(t("help.close"), classes="help-hint")

    @staticmethod
    def _table(rows: list[tuple[str, str]]) -> str:
        width = max(10, *(len(key) for key, _ in rows)) if rows else 10
        return "\n".join(f"{pad(key, width)}  {text}" for key, text in rows)
