"""What can go wrong talking to a hub, as exceptions whose message says what to do."""

from __future__ import annotations


class HubError(Exception):
    """A hub operation failed; ``str(exc)`` is the message for the user."""


class HubUnavailableError(HubError):
    """The hub did not answer (offline, refused, timed out) or answered with a server error."""


class HubAccessError(HubError):
    """401/403: a private or gated model, and the token is missing or not granted access."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class HubNotFoundError(HubError):
    """404: no such model (or file) on this hub."""


class HubSdkMissingError(HubError):
    """The hub's Python SDK is not installed (the app-only install)."""


class DownloadError(HubError):
    """A download could not start or finish."""


class NotEnoughDiskError(DownloadError):
    """The files would not fit on the disk that holds the target folder."""

    def __init__(self, message: str, needed_bytes: int, free_bytes: int) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
