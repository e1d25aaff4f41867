"""The dashboard's feed: what comes in, and what the screen does with it.

A worker thread reads a tunedeck run's ``run.json`` (its GPUs), then follows the run's files by byte offset
(metrics tail first, then the whole history as a backfill, then appends; the log; the events; the status
every two seconds) and posts one message per poll with everything new. The GPU charts come from the app's
one GPU poll (``tui.gpu_poll``), once the run's GPUs are known: the app's history, then each new snapshot.
Only message handlers touch widgets; nothing reads a file on the UI thread.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from rich.text import Text
from textual import work
from textual.message import Message
from textual.widgets import DataTable
from textual.worker import get_current_worker

from core.i18n import render_stored, t
from core.runs.states import ACTIVE_STATES
from core.watch.alerts import (
    disk_alert,
    ended_alert,
    gpu_idle_alert,
    loss_alert,
    stalled_alert,
    throughput_alert,
)
from core.watch.downsample import BucketedSeries
from core.watch.feed import EventsFeed, LinesFeed, open_metrics_feed
from core.watch.series import RunSeries
from tui.gpu_poll import GpuPollFailed, SnapshotReady, expected_errors
from tui.screens.dashboard.header import REASON_WORDING
from tui.widgets.log_pane import LogPane

FILE_POLL_S = 0.5
STATUS_EVERY_S = 2.0
DISK_EVERY_S = 15.0
GPU_BUCKETS = 1024


# --- messages from the workers --------------------------------------------------------------------
class MetricsBatch(Message):
    """Records appended since the last poll; ``reset``: start a new series with them (tail or truncation)."""

    def __init__(self, records: list[dict[str, Any]], reset: bool = False) -> None:
        super().__init__()
        self.records = records
        self.reset = reset


class SeriesBackfilled(Message):
    """The whole history, built in the worker; replaces the tail-only series. None: the tail was the
    whole history (the series already holds everything the source has)."""

    def __init__(self, series: RunSeries | None) -> None:
        super().__init__()
        self.series = series


class LogLines(Message):
    """New log lines and events; ``log_from_start``: the log's lines were read from its first (a tail of a
    long log was not: the search says its lines are not all here)."""

    def __init__(self, lines: list[str], events: list[dict[str, Any]], reset_log: bool, reset_events: bool,
                 log_from_start: bool = True) -> None:
        super().__init__()
        self.lines = lines
        self.events = events
        self.reset_log = reset_log
        self.reset_events = reset_events
        self.log_from_start = log_from_start


class RunRecordRead(Message):
    """A tunedeck run's ``run.json`` (its GPUs, its configuration's summary), read before anything else;
    ``unreadable``: why it cannot be read ("" when it was; the record then ``{}``): a state the header
    says, not a watcher failure (the metrics and logs still come). ``config``: the run's ``config.yaml``
    (``{}`` where it does not read): the header's precision and ZeRO stage before the metrics header
    says them, and for good when the run ended before writing one."""

    def __init__(self, record: dict[str, Any], unreadable: str = "", config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.record = record
        self.unreadable = unreadable
        self.config = config or {}


class RunStatusRead(Message):
    """Latest status and disk figures (latest only); ``has_checkpoint``: the run has ended and has a
    complete checkpoint (what the after-training actions need); ``resumable``: a resume is offered
    (``core.runs.listing.offers_resume``: a checkpoint, or the run ended before its first step)."""

    def __init__(self, status: str, reason: str, disk_free: int | None, disk_total: int | None,
                 has_checkpoint: bool = False, problem: str = "", reason_message: dict[str, Any] | None = None,
                 resumable: bool = False, pending_resume: dict[str, Any] | None = None) -> None:
        super().__init__()
        # a resume asked for whose trainer has not logged yet (``RunDirectory.latest_metrics``): its step,
        # total and time; the metrics file says nothing of it until the trainer has loaded
        self.pending_resume = pending_resume
        self.status = status
        self.reason = reason
        self.reason_message = reason_message  # the reason as a message record: which one it is (``still_stopping``)
        self.problem = problem  # a read-only source's file that has not parsed for a while, said in the header
        self.has_checkpoint = has_checkpoint
        self.resumable = resumable
        self.disk_free = disk_free
        self.disk_total = disk_total

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunStatusRead)


class NewerRunFound(Message):
    """A run started below the folder named since the one shown (``core.watch.source.newer_run``), and the
    status of the one shown when it was found."""

    def __init__(self, source: Any, status: str) -> None:
        super().__init__()
        self.source = source
        self.status = status

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, NewerRunFound)


class DashboardFeed:
    """The file watcher, the app's GPU poll and their messages' handlers (mixed into DashboardScreen)."""

    source_problem = ""  # "trainer_state.json cannot be read (…): …" while the watched file does not parse
    record_unreadable = ""  # why a tunedeck run's run.json cannot be read ("Permission denied"), "" if it can
    _record_read = False  # the first RunRecordRead came (the GPU charts follow the app's poll from then on)

    # --- workers ---------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="dash-files", exit_on_error=False)
    def watch_files(self) -> None:
        worker = get_current_worker()
        source = self.source
        # Which GPUs are the run's, before their charts start; an unreadable run.json is read again with
        # the status until it reads (the user fixed it), posted when what it says changes.
        record_unreadable = self._post_record("") if not source.read_only else ""
        metrics = open_metrics_feed(source)
        self._activity = metrics.activity
        self.post_message(MetricsBatch(metrics.read_tail(), reset=True))
        log = LinesFeed(source.log_path)
        events = EventsFeed(source.events_path)
        self._post_logs(log, events)
        self._post_state()
        # The backfill competes with the UI thread for the GIL: it waits until the tail is on screen.
        self.first_frame_drawn.wait(timeout=2.0)
        self.post_message(SeriesBackfilled(metrics.backfill()))
        last_status = time.monotonic()
        last_disk = 0.0
        while not worker.is_cancelled:
            records, restarted = metrics.poll()
            if records or restarted:
                self.post_message(MetricsBatch(records, reset=restarted))
            if restarted:  # read again from its tail (a resume superseded records shown): the rest follows
                self.post_message(SeriesBackfilled(metrics.backfill()))
            self._post_logs(log, events)
            now = time.monotonic()
            if now - last_status >= STATUS_EVERY_S:
                last_status = now
                with_disk = now - last_disk >= DISK_EVERY_S
                if with_disk:
                    last_disk = now
                self._post_state(with_disk)
                if record_unreadable:
                    record_unreadable = self._post_record(record_unreadable)
            end = time.monotonic() + FILE_POLL_S
            while not worker.is_cancelled and time.monotonic() < end:
                time.sleep(0.05)

    def _post_record(self, posted: str) -> str:
        """Read the run's ``run.json``; post it, or why it cannot be read, unless that is ``posted`` again
        (the reason said last time; "" at first, when it is always posted). The reason now, "" if none."""
        import yaml

        from core.runs import RunDirectory

        run = RunDirectory(self.source.path)
        record, reason = run.read_record()
        if not posted or reason != posted:
            try:
                config = run.config()
            except (OSError, UnicodeDecodeError, yaml.YAMLError):  # the header does without it
                config = {}
            self.post_message(RunRecordRead(record, reason, config))
        return reason

    def _post_logs(self, log: LinesFeed, events: EventsFeed) -> None:
        lines, reset_log = log.poll()
        records, reset_events = events.poll()
        if lines or records or reset_log or reset_events:
            self.post_message(LogLines(lines, records, reset_log, reset_events, log_from_start=log.start == 0))

    def _post_state(self, with_disk: bool = True) -> None:
        free = total = None
        if with_disk:
            try:
                usage = shutil.disk_usage(self.source.path)
                free, total = usage.free, usage.total
            except OSError:
                pass
        if self.source.read_only:
            from core.watch.activity import writer_state
            from core.watch.source import newer_run

            state = writer_state(self.source, self._activity)
            self.post_message(RunStatusRead(state.status, state.label(), free, total, problem=state.problem()))
            newer = newer_run(self.source)
            if newer is not None:
                self.post_message(NewerRunFound(newer, state.status))
            return
        from core.runs import RunDirectory, effective_status, ended_with_checkpoint
        from core.runs.listing import offers_resume

        run = RunDirectory(self.source.path)
        if not run.path.is_dir():  # deleted while shown: its status reads as "queued" (no status.json)
            from core.watch.activity import GONE, WriterState

            self.post_message(RunStatusRead(GONE, WriterState(GONE).label(), free, total))
            return
        status = effective_status(run)
        figures = run.latest_metrics() or {}
        pending = figures if figures.get("kind") == "resumed" else None
        # Once the run has ended: a complete checkpoint offers resume and what comes after training (the
        # Runs list's resume follows the same rule).
        has_checkpoint = ended_with_checkpoint(run, status.status)
        reason = render_stored(status.reason, status.reason_message, REASON_WORDING)  # "u resumes it"
        self.post_message(RunStatusRead(status.status, reason, free, total, has_checkpoint,
                                        reason_message=status.reason_message,
                                        resumable=offers_resume(run, status.status), pending_resume=pending))

    # --- the app's GPU poll -----------------------------------------------------------------------
    def on_unmount(self) -> None:
        self.app.unwatch_gpus(self)  # type: ignore[attr-defined]

    def on_screen_resume(self) -> None:
        self.app.gpu_screens_changed()  # type: ignore[attr-defined]

    def on_screen_suspend(self) -> None:
        self.app.gpu_screens_changed()  # type: ignore[attr-defined]

    def _follow_gpus(self) -> None:
        """The app's GPU readings from now on, and those it holds from before; once the run's GPUs are
        known (a tunedeck run's ``run.json``, read by the file watcher: ``on_run_record_read``)."""
        self._gpu_backfill()
        self.app.watch_gpus(self)  # type: ignore[attr-defined]

    def _gpu_backfill(self) -> None:
        """The readings the app's history holds from before this screen opened (the GPU screen's, say),
        all but the latest, which comes as a SnapshotReady like every later one."""
        history, latest = self.app.gpu_history, self.app.gpu_snapshot  # type: ignore[attr-defined]
        if latest is None or self._not_this_boxs_gpus():
            return
        wanted = set(self.gpu_indices)
        indices = [g.index for g in latest.gpus if not wanted or g.index in wanted]
        times = history.times()[:-1]
        if not indices or not times:
            return
        util = {i: history.series(i, "utilization_gpu_pct") for i in indices}
        frac = {i: history.series(i, "memory_used_fraction") for i in indices}
        for n, at in enumerate(times):
            self._add_gpu_points(at, [(i, util[i][n], frac[i][n]) for i in indices])

    def _add_gpu_points(self, at: float, readings: list[tuple[int, float | None, float | None]]) -> None:
        """One reading of the run's GPUs at ``at`` (the snapshot's time): (index, util %, memory fraction)."""
        if self.gpu_started is None:
            self.gpu_started = at
        x = at - self.gpu_started
        utils = []
        for index, util, frac in readings:
            if util is not None:
                self.gpu_util.setdefault(index, BucketedSeries(GPU_BUCKETS)).add(x, float(util))
                utils.append(float(util))
            if frac is not None:
                self.gpu_mem.setdefault(index, BucketedSeries(GPU_BUCKETS)).add(x, frac * 100.0)
        mean = sum(utils) / len(utils) if utils else None
        self.util_samples.append((at, mean))
        self.gpu_version += 1
        self._dirty = True

    # --- message handlers ------------------------------------------------------------------------
    def on_run_record_read(self, message: RunRecordRead) -> None:
        first = not self._record_read
        self._record_read = True
        host = self._other_host()
        self._record = message.record
        if host != self._other_host():
            self.refresh_bindings()  # stop is not offered on another host's run (check_action)
        self._config = message.config
        if message.unreadable and message.unreadable != self.record_unreadable:  # the whole story, once
            self.notify(t("dashboard.record_unreadable", dir=str(self.source.path), reason=message.unreadable),
                        severity="warning", timeout=15, markup=False)
        self.record_unreadable = message.unreadable
        latest = self.app.gpu_snapshot  # type: ignore[attr-defined]
        self._set_gpu_indices(list(getattr(latest, "gpus", None) or []))
        if first:
            self._follow_gpus()
        self._show_info()

    def _set_gpu_indices(self, box: list[Any]) -> None:
        """The run's GPUs as the snapshots number them (``run_gpu_indices``: run.json's indices count within
        the ``CUDA_VISIBLE_DEVICES`` of its launch; ``box``, the latest snapshot's GPUs, names UUID entries);
        once known, the charts keep them, not all the box's."""
        from core.runs.gpus import run_gpu_indices

        indices = run_gpu_indices(self._record, box)
        if indices == self.gpu_indices:
            return
        self.gpu_indices = indices
        if indices:
            for series in (self.gpu_util, self.gpu_mem):
                for index in [i for i in series if i not in indices]:
                    del series[index]
            self.gpu_version += 1
            self._dirty = True
        self._show_info()  # the header names them

    def on_metrics_batch(self, message: MetricsBatch) -> None:
        if message.reset:
            self.series = RunSeries()
        self.series.extend(message.records)
        if self.first_data_at is None and self.series.train_records:
            self.first_data_at = time.perf_counter()
        if not self.first_frame_drawn.is_set() and self.series.train_records:
            self.call_after_refresh(self._first_frame_done)
        self._changed()
        self._check_alerts()

    def _first_frame_done(self) -> None:
        if self.first_frame_at is None:
            self.first_frame_at = time.perf_counter()
        self.first_frame_drawn.set()

    def on_series_backfilled(self, message: SeriesBackfilled) -> None:
        if message.series is None:
            self.backfilled = True
            self._changed()  # a metric without a point now is one this source does not have
            return
        # Records that arrived after the backfill began follow it in this screen's series: keep them.
        full = message.series
        header = self.series.header
        tail_latest = self.series.latest
        full.header = full.header or header
        if tail_latest and full.latest.get("step", -1) < tail_latest.get("step", -1):
            full.latest = tail_latest
        self.series = full
        self.backfilled = True
        self._changed()

    def on_log_lines(self, message: LogLines) -> None:
        pane = self.query_one("#dash-log", LogPane)
        if message.reset_log:
            pane.clear()
        pane.from_start = message.log_from_start
        pane.append(message.lines)
        table = self.query_one("#dash-events", DataTable)
        if message.reset_events:
            table.clear()
            self.events = []
        for record in message.events:
            self.events.append(record)
            table.add_row(*(Text(cell, no_wrap=True, overflow="ellipsis") for cell in self._event_row(record)))
        if message.events or message.reset_events:
            table.scroll_end(animate=False, immediate=True)
            self.call_after_refresh(self._fit_detail_column)
            self._show_event_detail()

    def on_newer_run_found(self, message: NewerRunFound) -> None:
        """A newer run below the folder named: followed once the one shown is no longer written to, else
        said once and offered on ``o`` (``action_watch_newer``)."""
        from core.watch.activity import follows_newer

        if follows_newer(message.status):
            if self.is_current:  # not under a modal or the help (it would replace them): at the next poll
                self.watch_newer(message.source, followed=True)
            return
        if self.newer is not None and self.newer.path == message.source.path:
            return
        self.newer = message.source
        self.refresh_bindings()  # o now in the footer, the help and the palette
        self._take_newer_toast()  # an earlier newer run's: o no longer watches that one
        from textual.notifications import Notification, Notify

        # kept, to be taken away once the newer run is watched (o, or followed): it said "o watches the newer
        # one" over the newer run's own dashboard, where o does nothing
        self._newer_toast = Notification(t("dashboard.newer_run", run=self._run_name(message.source),
                                           current=self.source.run_id), timeout=15, markup=False)
        self.app.post_message(Notify(self._newer_toast))

    def _take_newer_toast(self) -> None:
        """The toast that offered ``o`` on a newer run taken away (Textual has no public call for one
        notification: ``_unnotify`` is what its own Toast calls when clicked; textual is pinned)."""
        toast, self._newer_toast = self._newer_toast, None
        if toast is not None and toast in self.app._notifications:
            self.app._unnotify(toast)

    def _run_name(self, source: Any) -> str:
        """A run folder as the user knows it below the folder named (``<model>/vN-…`` one level further)."""
        try:
            return str(source.path.relative_to(source.root))
        except (TypeError, ValueError):
            return source.run_id

    def on_run_status_read(self, message: RunStatusRead) -> None:
        previous = self.status or None
        offered = (self.status, self.has_checkpoint, self.resumable)
        self.status, self.reason = message.status, message.reason
        self.reason_message = message.reason_message
        if self.status != (previous or ""):
            self._changed()  # a chart without a point says what the state means (waiting, or ended)
            self._check_alerts()  # records that came before the state was known (a NaN in the tail of a live run)
        self.source_problem = message.problem
        self.has_checkpoint = message.has_checkpoint
        self.resumable = message.resumable
        self.pending_resume = message.pending_resume
        if offered != (self.status, self.has_checkpoint, self.resumable):
            self.refresh_bindings()  # footer, help and palette offer what applies now (check_action)
        if message.disk_free is not None:
            self.disk = (message.disk_free, message.disk_total)
        alerts = {"ended": ended_alert(previous, self.status, self.source.run_id),
                  "disk": disk_alert(self.disk[0], self.disk[1], str(self.source.path)),  # the folder measured
                  "stalled": stalled_alert(self.status, self.source.run_id, self.reason)}
        self._notify(self.gate.filter(alerts))
        self._show_info()

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self._gpu_failed = False
        if self._not_this_boxs_gpus():
            return  # the box's GPUs are not this run's (a CPU run, another host's): no chart of them, no idle alert
        snapshot = message.snapshot
        gpus = list(getattr(snapshot, "gpus", []) or [])
        self._set_gpu_indices(gpus)  # a UUID entry of the run's CUDA_VISIBLE_DEVICES: known with a snapshot
        wanted = set(self.gpu_indices)
        mine = [g for g in gpus if not wanted or g.index in wanted]
        if not mine:
            if not self.gpu_util and self.gpu_charts:
                self.gpu_charts = False  # two charts saying "no GPU readings" are noise: the others get the room
                self._layout_charts()
            return
        if not self.gpu_charts:
            self.gpu_charts = True
            self._layout_charts()
        self.gpu_name = mine[0].name
        self._note_lost_gpus(tuple(g.index for g in mine if getattr(g, "lost", False)))
        at = snapshot.taken_at
        self._add_gpu_points(at, [(g.index, g.utilization_gpu_pct, g.memory_used_fraction) for g in mine])
        self._notify(self.gate.filter({"gpu_idle": gpu_idle_alert(self.util_samples, self.status, at)}))

    def _note_lost_gpus(self, lost: tuple[int, ...]) -> None:
        """The run's GPUs NVML calls lost (fallen off the bus): the GPU charts and the header say so while it
        lasts, and one toast says it when a GPU is lost (its charts only stop: at 80x24 they are not shown)."""
        if lost == self.gpu_lost:
            return
        newly = [index for index in lost if index not in self.gpu_lost]
        self.gpu_lost = lost
        if newly:
            self.notify(t("dashboard.gpu_lost_alert", gpus=",".join(map(str, newly))), severity="error",
                        timeout=30, markup=False)
            if self.app.settings.bell:
                self.app.bell()
        self._dirty = True
        self._show_info()

    def on_gpu_poll_failed(self, message: GpuPollFailed) -> None:
        """The app's poll failed: said once until a reading comes again (a bug opened the error modal)."""
        if message.expected and not self._gpu_failed:
            error = message.error
            self.notify(f"{t('gpuscreen.poll_failed')} {type(error).__name__}: {error}", severity="error",
                        markup=False)
        self._gpu_failed = True

    def on_worker_state_changed(self, event) -> None:
        """The file watcher failed: a notification for what may fail (files), the error modal for a bug."""
        from textual.worker import WorkerState

        from tui.screens.error_modal import report_unexpected

        error = event.worker.error
        if event.worker.group != "dash-files" or event.state != WorkerState.ERROR or error is None:
            return
        if isinstance(error, expected_errors()):
            self.notify(t("dashboard.worker_failed", error=f"{type(error).__name__}: {error}"), severity="error",
                        markup=False)
        else:
            report_unexpected(self.app, error, "dashboard.watch_files")

    def _check_alerts(self) -> None:
        if self.status not in ACTIVE_STATES:
            # An ended run's history (or one whose state is not read yet): a collapse or spike in its last
            # records is not news; "Throughput collapsed" toasted on opening last week's finished run.
            return
        series = self.series
        step = series.latest.get("step")
        alerts = {
            "loss": loss_alert(series.last_loss, series.last_loss_nan, series.ema_before_last, series.ema_points, step),
            "throughput": throughput_alert(list(series.recent_tokens_per_s)),
        }
        self._notify(self.gate.filter(alerts))

    def _notify(self, alerts: list) -> None:
        for alert in alerts:
            self.notify(alert.message, severity=alert.severity, timeout=10)
            if self.app.settings.bell:
                self.app.bell()
