"""Keys that arrive in one read (a paste, tmux send-keys, keystrokes a slow SSH link bundles) after a key that
moves the focus into a text field.

Textual routes each key of a read to the widget focused when it is handled, and a key goes on up to the app's
bindings one message queue at a time: the keys after ``f`` (open the filter) were all on their way before
``f``'s action focused the field, and reached the app's keys (``g``: the GPUs) or nothing. An Input stops every
printable key it types, so a printable key that reaches the app while an Input has the focus never came from
that Input: it was routed before the focus moved, and ``hand_on_to_focused_input`` gives it to the Input. The
action that moves the focus does it at once (``Screen.set_focus``), not after a refresh (``Widget.focus``), so
that the key right after it already finds the field."""

from __future__ import annotations

from textual import events
from textual.widgets import Input


def type_into(field: Input, event: events.Key) -> None:
    """``event``'s character typed by ``field`` (after what it has queued), and nothing else done with it."""
    event.stop()
    event.prevent_default()
    field.post_message(events.Key(event.key, event.character))


def hand_on_to_focused_input(focused: object, event: events.Key) -> bool:
    """For the app's ``on_key``, before its bindings: a printable key that reached it while an Input has the
    focus (``focused``) is typed by that Input; True when it was."""
    if not isinstance(focused, Input) or not event.is_printable or not event.character:
        return False
    type_into(focused, event)
    return True
