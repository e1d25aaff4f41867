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
        # Priority: the keys scroll the help wherever the focus is (the border says so).
        Binding("pagedown", "page(1)", t("help.key.page_down"), show=False, priority=True),
        Binding("pageup", "page(-1)", t("help.key.page_up"), show=False, priority=True),
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

    def on_mount(self) -> None:
        body = self.query_one("#help-body", VerticalScroll)
        body.border_subtitle = t("help.scroll_hint")
        body.focus()  # arrows scroll too

    def action_page(self, direction: int) -> None:
        body = self.query_one("#help-body", VerticalScroll)
        (body.scroll_page_down if direction > 0 else body.scroll_page_up)(animate=False)

    @staticmethod
    def _table(rows: list[tuple[str, str]]) -> str:
        width = max(10, *(len(key) for key, _ in rows)) if rows else 10
        return "\n".join(f"{pad(key, width)}  {text}" for key, text in rows)
