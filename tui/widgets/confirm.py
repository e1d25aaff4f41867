"""A yes/no dialog for destructive actions: only y confirms; n, Esc and Enter cancel (an Enter meant for
the screen below, typed as the dialog opened, must not delete or stop anything)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Static

from core.i18n import t
from tui.widgets.modal import KeyedModal


class ConfirmScreen(KeyedModal[bool]):
    """Dismisses with True (confirmed) or False."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; background: $background 60%; }
    ConfirmScreen > Vertical { width: 64; max-width: 100%; height: auto; border: round $warning;
                               background: $surface; padding: 0 1; }
    ConfirmScreen .confirm-title { text-style: bold; color: $warning; }
    ConfirmScreen .confirm-body { margin-top: 1; }
    ConfirmScreen .confirm-keys { margin-top: 1; color: $foreground-muted; }
    """
    BINDINGS = [
        Binding("y", "answer(True)", t("dashboard.confirm_yes"), id="confirm.yes"),
        Binding("enter", "answer(False)", t("dashboard.confirm_no"), show=False),
        Binding("n", "answer(False)", t("dashboard.confirm_no"), id="confirm.no"),
        Binding("escape", "answer(False)", t("dashboard.confirm_no"), show=False),
    ]

    def __init__(self, title: str, body: str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="confirm-title", markup=False)
            yield Static(self.body, classes="confirm-body", markup=False)
            yield Static(t("dashboard.confirm_keys"), classes="confirm-keys")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)
