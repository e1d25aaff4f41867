"""The app's one GPU poll: its messages and what counts as an expected failure.

``TunedeckApp`` runs one thread worker that polls the hardware monitor at the current interval while a
screen watches (``app.watch_gpus(screen)``; the GPU screen and the dashboards), adds each new snapshot to
one ``core.hardware.history.GpuHistory`` on the UI thread and posts ``SnapshotReady`` to every watching
screen. While none of them is in the current screen stack (another section is shown) it polls at
``IDLE_POLL_S``; with no screen watching it stops. Only message handlers touch widgets.
"""

from __future__ import annotations

from textual.message import Message

from core.hardware.snapshot import BoxSnapshot

HISTORY_SAMPLES = 600  # ten minutes at 1 Hz
IDLE_POLL_S = 10.0  # while no watching screen is shown


def expected_errors() -> tuple[type[BaseException], ...]:
    """Failures a screen reports with a notification: a domain error, the file system, NVML itself.
    Anything else is a bug (``tui.screens.error_modal.report_unexpected``)."""
    from core.errors import TunedeckError
    from core.hardware.nvml_backend import nvml_error_types

    return (TunedeckError, OSError, *nvml_error_types())


def replay_note(monitor: object, snapshot: BoxSnapshot) -> str | None:
    """``Fake GPUs replayed from h200x8.json`` for a snapshot of fake GPUs (``$TUNEDECK_FAKE_GPUS`` left set
    in a shell looks like a box of H200s otherwise), else None; the file by its name, which fits at 80 columns."""
    from pathlib import Path

    from core.i18n import t

    if not snapshot.synthetic:
        return None
    source = getattr(monitor, "source", None)
    if source is None:
        return t("gpuscreen.replayed_unnamed")
    return t("gpuscreen.replayed", file=Path(source).name)


class GpuPolled(Message):
    """From the poll worker to the app: one poll's snapshot (the app keeps the history)."""

    def __init__(self, snapshot: BoxSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class GpuPollFailed(Message):
    """From the poll worker to the app, then to each watching screen: a poll raised ``error``."""

    bubble = False

    def __init__(self, error: BaseException, expected: bool) -> None:
        super().__init__()
        self.error = error
        self.expected = expected


class SnapshotReady(Message):
    """From the app to a watching screen: a snapshot the history had not seen (latest only)."""

    bubble = False  # handled by the screen it was posted to, never again by the app

    def __init__(self, snapshot: BoxSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        # Only the latest reading matters: a queued older one is dropped.
        return isinstance(message, SnapshotReady)
