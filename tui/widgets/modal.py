"""The app's modals answer ? and F1 as every other screen does.

A ``ModalScreen`` takes the app's own keys away (only priority bindings pass it): ? and F1 did nothing over
a dialog, so the one screen that asks a question had no help. These keys open the help over the modal
(its own keys, and the app's that work there); the modal, and the choice it waits for, stay under it.
Not priority bindings: a text field's ? stays text.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.screen import ModalScreen, ScreenResultType

from core.i18n import t


class KeyedModal(ModalScreen[ScreenResultType]):
    BINDINGS = [
        Binding("question_mark", "app.help", t("app.key.help"), key_display="?", show=False, id="modal.help"),
        Binding("f1", "app.help", t("app.key.help"), show=False, id="modal.help_f1"),
    ]
