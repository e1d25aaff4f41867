"""A short memory of hubs that could not be reached, so a burst of filter changes asks once, not per key.

An offline box answers every search with the same failure after a connect timeout of seconds; a person
cycling through filters would wait that long for each. After an ``offline`` problem the hub counts as
out of reach for ``hold_s``; an explicit retry (the caller's choice) asks anyway, and any answer from the
hub clears the memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from core.hub.problems import HubProblem

HOLD_S = 30.0


@dataclass(frozen=True)
class RecentFailure:
    """The last offline problem of a hub and how long ago it came (seconds)."""

    problem: HubProblem
    age_s: float


class HubReachability:
    """Per hub: the last time it could not be reached (``failed``), forgotten after ``hold_s``."""

    def __init__(self, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self._clock = clock
        self._failures: dict[str, tuple[HubProblem, float]] = {}

    def failed(self, problem: HubProblem) -> None:
        """Note ``problem``; only the offline kinds (no connection, no answer in time) are remembered."""
        if problem.offline:
            self._failures[problem.hub] = (problem, self._clock())

    def answered(self, hub: str) -> None:
        """The hub answered: it is reachable again."""
        self._failures.pop(hub, None)

    def recent_failure(self, hub: str) -> RecentFailure | None:
        """The offline problem of ``hub`` if it came less than ``hold_s`` ago, else None."""
        entry = self._failures.get(hub)
        if entry is None:
            return None
        problem, when = entry
        age = self._clock() - when
        if age >= self.hold_s:
            del self._failures[hub]
            return None
        return RecentFailure(problem, max(0.0, age))
