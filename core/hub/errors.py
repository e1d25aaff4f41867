"""What can go wrong talking to a hub, as exceptions whose message says what to do.

An error from a hub call carries its ``HubProblem`` (``core.hub.problems``) where one is known: the
summary, the advice and the raw detail apart, for a screen that shows them apart. ``str(exc)`` stays the
whole message (summary and advice) for everything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.errors import EXIT_HUB, EXIT_USAGE, TunedeckError

if TYPE_CHECKING:
    from core.hub.problems import HubProblem


class HubError(TunedeckError):
    """A hub operation failed; ``str(exc)`` is the message for the user."""

    exit_code = EXIT_HUB

    def __init__(self, message: str, problem: HubProblem | None = None) -> None:
        super().__init__(message)
        self.problem = problem


class HubUnavailableError(HubError):
    """The hub did not answer (offline, refused, timed out) or answered with a server error."""


class HubAccessError(HubError):
    """401/403: a private or gated model, and the token is missing or not granted access."""

    def __init__(self, message: str, status: int, problem: HubProblem | None = None) -> None:
        super().__init__(message, problem)
        self.status = status


class HubNotFoundError(HubError):
    """404: no such model (or file) on this hub."""


class HubSdkMissingError(HubError):
    """The hub's Python SDK is not installed (the app-only install)."""


class DownloadError(HubError):
    """A download could not start or finish."""


class NothingSelectedError(DownloadError):
    """``--include`` patterns that match no file of the model: the request is wrong (exit 2)."""

    exit_code = EXIT_USAGE


class NotEnoughDiskError(DownloadError):
    """The files would not fit on the disk that holds the target folder."""

    def __init__(self, message: str, needed_bytes: int, free_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
