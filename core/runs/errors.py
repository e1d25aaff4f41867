"""What starting, resuming or stopping a run raises when it cannot be done (``core.runs.lifecycle``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.errors import TunedeckError


class RunError(TunedeckError):
    """A run that cannot be started, resumed or stopped; the message says why and what to do.

    ``code`` is the exit status the CLI gives it: 2 when the request itself is wrong (the config, the
    model, the data, a box or disk that cannot hold the run), 1 when doing it failed.
    """

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message, code)


class SupervisorDidNotStart(RunError):
    """The run's supervisor exited at once (the run is marked failed if it got no further than queued);
    ``log_path`` is its supervisor.log, which says why."""

    def __init__(self, message: str, log_path: Path, last_line: str = "") -> None:
        super().__init__(message, 1)
        self.log_path = log_path
        self.last_line = last_line  # what the log ends with: the reason it printed, a traceback's error

    def summary(self, headline: str = "") -> str:
        """``headline`` (by default the message's first line) and the log's last line: for a notification,
        which shows a few lines."""
        first = headline or (str(self).splitlines()[0] if str(self) else "")
        return f"{first}\n{self.last_line}" if self.last_line and self.last_line != first else first


class GpuMemoryShort(RunError):
    """The run's estimated per-GPU peak is past the memory its GPUs have free: it would load the model, then
    die of CUDA out-of-memory. ``check`` is the ``core.runs.gpu_memory.GpuMemoryCheck`` (the figures, the
    micro-batch that fits), so that a caller can show them and start anyway with ``allow_over_memory``."""

    def __init__(self, message: str, check: Any) -> None:
        super().__init__(message, 2)
        self.check = check


class GpusInUse(RunError):
    """Another live run of this box uses some of the GPUs a new run would get: the second would run both
    out of memory. ``runs`` holds ``(run id, status, shared GPU indices)`` of each, so that a caller can
    ask (the wizard's y/n) and start anyway with ``allow_shared_gpus``."""

    def __init__(self, message: str, runs: list[tuple[str, str, list[int]]]) -> None:
        super().__init__(message, 2)
        self.runs = runs
