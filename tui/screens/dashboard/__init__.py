"""A run's live dashboard: header figures, charts, GPUs of the run, the followed log and the events.

A worker thread reads a tunedeck run's ``run.json`` (its GPUs), then follows the run's files by byte offset
(metrics tail first, then the whole history as a backfill, then appends; the log; the events; the status
every two seconds) and posts one message per poll with everything new: no file is read on the UI thread.
The GPU charts come from the app's one GPU poll (``tui.gpu_poll``) once the run's GPUs are known: the
app's history, then each new snapshot. Only message handlers touch widgets, and the
charts redraw at most twice a second whatever the write rate. Leaving the screen only stops the
watching: the run goes on.

The screen is one class made of method groups, each in a module of this package:

- ``screen``: the screen itself (its CSS, keys, state, layout and the charts' redraw);
- ``feed``: what comes in (the file-watching worker and its messages, the app's GPU poll, the alerts);
- ``header``: what the header and the events table say (the info lines, the event rows and labels);
- ``actions``: the keys' actions and what the footer offers for the run as it stands.
"""

from tui.screens.dashboard.actions import ActionDone
from tui.screens.dashboard.feed import (
    DISK_EVERY_S,
    FILE_POLL_S,
    GPU_BUCKETS,
    STATUS_EVERY_S,
    LogLines,
    MetricsBatch,
    RunRecordRead,
    RunStatusRead,
    SeriesBackfilled,
)
from tui.screens.dashboard.header import (
    DETAIL_MIN_WIDTH,
    EVENT_KEY_PREFIX,
    KNOWN_EVENTS,
    EventsTable,
    event_label,
)
from tui.screens.dashboard.screen import REDRAW_EVERY_S, DashboardScreen

__all__ = [
    "DETAIL_MIN_WIDTH",
    "DISK_EVERY_S",
    "EVENT_KEY_PREFIX",
    "FILE_POLL_S",
    "GPU_BUCKETS",
    "KNOWN_EVENTS",
    "REDRAW_EVERY_S",
    "STATUS_EVERY_S",
    "ActionDone",
    "DashboardScreen",
    "EventsTable",
    "LogLines",
    "MetricsBatch",
    "RunRecordRead",
    "RunStatusRead",
    "SeriesBackfilled",
    "event_label",
]
