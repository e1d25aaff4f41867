"""A run's live dashboard: header figures, charts, GPUs of the run, the followed log and the events.

A worker thread follows the run's files by byte offset (metrics tail first, then the whole history as
a backfill, then appends; the log; the events; the status every two seconds) and posts one message per
poll with everything new. The GPU charts come from the app's one GPU poll (``tui.gpu_poll``): the app's
history when the screen opens, then each new snapshot. Only message handlers touch widgets, and the
charts redraw at most twice a second whatever the write rate. Leaving the screen only stops the
watching: the run goes on.
"""

from __future__ import annotations

import shlex
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Header, Input, Static
from textual.worker import get_current_worker

from core.i18n import DEFAULT_LANGUAGE, catalogue, render_stored, t
from core.paths import data_root
from core.runs import ACTIVE_STATES, TERMINAL_STATES, RunState, can_resume, can_stop, state_label
from core.runs.listing import shown_total
from core.units import format_rate
from core.watch.activity import IDLE
from core.watch.alerts import (
    AlertGate,
    disk_alert,
    ended_alert,
    gpu_idle_alert,
    loss_alert,
    stalled_alert,
    throughput_alert,
)
from core.watch.downsample import BucketedSeries
from core.watch.feed import EventsFeed, LinesFeed, open_metrics_feed
from core.watch.figures import cost_so_far, format_duration, mfu
from core.watch.metrics import CHARTS
from core.watch.series import RunSeries
from core.watch.source import WatchSource
from tui.gpu_poll import GpuPollFailed, SnapshotReady, expected_errors
from tui.widgets.chart import LineChart, SeriesSpec
from tui.widgets.keys_footer import KeysFooter
from tui.widgets.log_pane import LogPane

FILE_POLL_S = 0.5
STATUS_EVERY_S = 2.0
DISK_EVERY_S = 15.0
REDRAW_EVERY_S = 0.5
GPU_BUCKETS = 1024
DETAIL_MIN_WIDTH = 24  # cells: a Detail column narrower than this gives way to the line under the table


# --- messages from the workers --------------------------------------------------------------------
class MetricsBatch(Message):
    """Records appended since the last poll; ``reset``: start a new series with them (tail or truncation)."""

    def __init__(self, records: list[dict[str, Any]], reset: bool = False) -> None:
        super().__init__()
        self.records = records
        self.reset = reset


EVENT_KEY_PREFIX = "dashboard.event."
# Events tunedeck itself writes to events.jsonl (trainer, supervisor, lifecycle commands) are those with a
# label in the catalogue (one place to add one). Another tool's event (a watched directory) or a newer
# version's has none and is shown under its own name.
KNOWN_EVENTS = frozenset(key[len(EVENT_KEY_PREFIX):] for key in catalogue(DEFAULT_LANGUAGE)
                         if key.startswith(EVENT_KEY_PREFIX))


def event_label(name: str) -> str:
    """An event's name as shown in the events table: translated when known, else as recorded."""
    key = EVENT_KEY_PREFIX + name
    return t(key) if key in catalogue(DEFAULT_LANGUAGE) else name

class SeriesBackfilled(Message):
    """The whole history, built in the worker; replaces the tail-only series. None: the tail was the
    whole history (the series already holds everything the source has)."""

    def __init__(self, series: RunSeries | None) -> None:
        super().__init__()
        self.series = series


class LogLines(Message):
    def __init__(self, lines: list[str], events: list[dict[str, Any]], reset_log: bool, reset_events: bool) -> None:
        super().__init__()
        self.lines = lines
        self.events = events
        self.reset_log = reset_log
        self.reset_events = reset_events


class RunStatusRead(Message):
    """Latest status and disk figures (latest only)."""

    def __init__(self, status: str, reason: str, disk_free: int | None, disk_total: int | None) -> None:
        super().__init__()
        self.status = status
        self.reason = reason
        self.disk_free = disk_free
        self.disk_total = disk_total

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunStatusRead)


class ActionDone(Message):
    def __init__(self, text: str, severity: str = "information") -> None:
        super().__init__()
        self.text = text
        self.severity = severity


class EventsTable(DataTable):
    """The events, newest at the bottom, kept in view: rows arrive (the table measures them when idle)
    and its height changes with the detail line under it, until ``e`` gives it a cursor to move.
    (Textual's ``anchor()`` follows a container's children, not the rows of a DataTable.)"""

    following = True

    def on_resize(self) -> None:
        self._follow()

    def watch_virtual_size(self) -> None:
        self._follow()

    def _follow(self) -> None:
        if self.following:
            self.scroll_end(animate=False, immediate=True)
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True)


def _na(value: str | None) -> str:
    return value if value else t("dashboard.na")


class DashboardScreen(Screen[None]):
    """Live view of one run (tunedeck's own, or another trainer's output dir, read-only)."""

    DEFAULT_CSS = """
    DashboardScreen #dash-info { height: auto; max-height: 4; padding: 0 1; }
    DashboardScreen #dash-charts { layout: grid; grid-size: 2 2; height: 2fr; min-height: 8; }
    DashboardScreen #dash-bottom { height: 1fr; min-height: 5; }
    DashboardScreen #dash-log-box { width: 3fr; }
    DashboardScreen #dash-log { height: 1fr; border: round $panel-lighten-2; border-title-color: $primary; }
    DashboardScreen #dash-search { dock: bottom; }
    DashboardScreen #dash-events-box { width: 2fr; height: 1fr; border: round $panel-lighten-2;
                                       border-title-color: $primary; }
    DashboardScreen #dash-events { height: 1fr; min-height: 1; overflow-x: hidden; scrollbar-size-vertical: 1; }
    /* under a table too narrow for its Detail column (80 columns): the described event's detail, wrapped;
       the table keeps one row, the described event's (scrolled to it) */
    DashboardScreen #dash-event-detail { height: auto; max-height: 4; padding: 0 1; display: none; }
    DashboardScreen #dash-events-box.-narrow #dash-event-detail { display: block; }
    /* f: the log and the events over the whole screen, one above the other, each at full width */
    DashboardScreen.-full #dash-info, DashboardScreen.-full #dash-charts { display: none; }
    DashboardScreen.-full #dash-bottom { layout: vertical; height: 1fr; }
    DashboardScreen.-full #dash-log-box { width: 1fr; height: 2fr; }
    DashboardScreen.-full #dash-events-box { width: 1fr; height: 1fr; min-height: 4; }
    """

    BINDINGS = [
        Binding("x", "toggle_axis", t("dashboard.key.axis"), id="dashboard.axis"),
        Binding("s", "search", t("dashboard.key.search"), id="dashboard.search"),
        Binding("n", "next_match(1)", t("dashboard.key.next"), show=False, id="dashboard.next"),
        Binding("N", "next_match(-1)", t("dashboard.key.prev"), key_display="N", show=False, id="dashboard.prev"),
        Binding("k", "stop", t("dashboard.key.stop"), id="dashboard.stop"),
        Binding("u", "resume", t("dashboard.key.resume"), show=False, id="dashboard.resume"),
        Binding("c", "config", t("dashboard.key.config"), show=False, id="dashboard.config"),
        Binding("y", "copy_command", t("dashboard.key.copy"), show=False, id="dashboard.copy"),
        Binding("j", "jump_gpus", t("dashboard.key.gpus"), show=False, id="dashboard.gpus"),
        Binding("l", "focus_log", t("dashboard.key.log"), show=False, id="dashboard.log"),
        Binding("f", "toggle_full", t("dashboard.key.full"), id="dashboard.full"),
        Binding("f8", "toggle_full", t("dashboard.key.full"), show=False, id="dashboard.full.f8"),
        Binding("e", "focus_events", t("dashboard.key.events"), show=False, id="dashboard.events"),
        Binding("escape", "back", t("dashboard.key.back"), id="dashboard.back"),
        Binding("b", "back", t("dashboard.key.back"), show=False, id="dashboard.back_b"),
        Binding("M", "after_training('merge')", t("lifecycle.key.merge"), key_display="M", show=False,
                id="dashboard.merge"),
        Binding("a", "after_training('chat')", t("lifecycle.key.chat"), show=False, id="dashboard.chat"),
        Binding("v", "after_training('serve')", t("lifecycle.key.serve"), show=False, id="dashboard.serve"),
        Binding("E", "after_training('evaluate')", t("lifecycle.key.evaluate"), key_display="E", show=False,
                id="dashboard.evaluate"),
        Binding("X", "after_training('export')", t("lifecycle.key.export"), key_display="X", show=False,
                id="dashboard.export"),
    ]

    def __init__(self, source: WatchSource, clock: Callable[[], float] = time.monotonic,
                 standalone: bool = False) -> None:
        super().__init__(name="dashboard")
        self.source = source
        # Opened by ``tunedeck watch DIR`` on a folder outside tunedeck's runs: Esc quits (back to the shell
        # the user came from), it does not lead to a Runs list this folder is not in.
        self.standalone = standalone
        self.clock = clock
        self.series = RunSeries()
        self.axis = "step"
        self.status = ""  # read-only sources too: core.watch.activity says running, idle or finished
        self.reason = ""
        self.gpu_indices: list[int] = []
        self.gpu_name: str | None = None
        self.gpu_util: dict[int, BucketedSeries] = {}
        self.gpu_mem: dict[int, BucketedSeries] = {}
        self.gpu_version = 0
        self.gpu_started: float | None = None
        self.gpu_charts = True  # False on a CPU run, or where no GPU reading names one of the run's
        self.util_samples: deque[tuple[float, float | None]] = deque(maxlen=600)
        self._gpu_failed = False
        self.gate = AlertGate(clock)
        self.disk: tuple[int | None, int | None] = (None, None)
        self.backfilled = False
        self.first_data_at: float | None = None
        self.events: list[dict[str, Any]] = []
        self._dirty = True
        self._drawn_version: tuple | None = None
        self._record = source.facts if source.read_only else {}
        self.opened_at = time.perf_counter()
        self.first_frame_drawn = threading.Event()
        self.first_frame_at: float | None = None

    # --- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="dash-info")
        with Container(id="dash-charts"):
            for chart in CHARTS:  # the metrics' charts (core.watch.metrics), then the GPU monitor's
                yield LineChart(t(chart.title), t("dashboard.waiting"), id=chart.id, y_floor=chart.y_floor,
                                clip_outliers=chart.clip_outliers)
            yield LineChart(t("dashboard.chart_gpu_util"), t("dashboard.no_gpus"), id="chart-gpu-util",
                            y_floor=0.0, y_ceiling=100.0)
            yield LineChart(t("dashboard.chart_gpu_mem"), t("dashboard.no_gpus"), id="chart-gpu-mem",
                            y_floor=0.0, y_ceiling=100.0)
        with Horizontal(id="dash-bottom"):
            with Vertical(id="dash-log-box"):
                yield LogPane(id="dash-log")
                yield Input(placeholder=t("dashboard.search_placeholder"), id="dash-search")
            with Vertical(id="dash-events-box"):
                events = EventsTable(id="dash-events", cursor_type="row", show_cursor=False)
                events.add_columns(t("dashboard.col_time"), t("dashboard.col_event"), t("dashboard.col_detail"))
                yield events
                yield Static("", id="dash-event-detail", markup=False)
        yield KeysFooter()

    def on_mount(self) -> None:
        self.title = t("app.title")
        self.sub_title = t("dashboard.subtitle", id=self.source.run_id)
        self.query_one("#dash-search", Input).display = False
        self.query_one("#dash-log", LogPane).border_title = t("dashboard.log_title")
        self.query_one("#dash-events-box").border_title = t("dashboard.events_title")
        if not self.source.read_only:
            from core.runs import RunDirectory

            self._record = RunDirectory(self.source.path).record()
            self.gpu_indices = [int(i) for i in self._record.get("gpus") or []]
        self._layout_charts()
        self._show_info()
        self.watch_files()
        self._gpu_backfill()
        self.app.watch_gpus(self)  # type: ignore[attr-defined]
        self.set_interval(REDRAW_EVERY_S, self._redraw_if_dirty)

    def on_resize(self) -> None:
        self._layout_charts()
        self.call_after_refresh(self._fit_detail_column)

    def _fit_detail_column(self) -> None:
        """Detail takes what Time and Event leave of the table's width (it showed one character).

        Every width comes from the data (the headers and the events received), none from what the table
        has measured so far, and the scrollbar's room is always kept: the result is the same whenever
        this runs, before or after the rows and the layout settle."""
        from rich.cells import cell_len

        table = self.query_one("#dash-events", DataTable)
        columns = list(table.columns.values())
        if len(columns) < 3 or table.size.width <= 0:
            return
        rows = [self._event_row(record) for record in self.events]
        wanted = [max([cell_len(str(column.label))] + [cell_len(row[i]) for row in rows]) for i, column
                  in enumerate(columns[:2])]
        inner = table.size.width - table.styles.scrollbar_size_vertical - table.styles.gutter.width
        fixed = sum(wanted) + 3 * 2 * table.cell_padding
        widths = [*wanted, max(4, inner - fixed)]
        # Too narrow to read a detail in its column (80 columns: not even one cell is left): the line
        # under the table shows it in full instead, the header row's room goes to one more event, and
        # Event takes the width (a cut label is whole in that line), Detail none of it.
        narrow = inner - fixed < DETAIL_MIN_WIDTH
        if narrow:
            widths = [wanted[0], max(1, inner - wanted[0] - 2 * 2 * table.cell_padding), 0]
        box = self.query_one("#dash-events-box")
        if narrow != box.has_class("-narrow"):
            box.set_class(narrow, "-narrow")
            table.show_header = not narrow
            self._show_event_detail()
        if [c.width for c in columns] != widths or any(c.auto_width for c in columns):
            for column, width in zip(columns, widths, strict=True):
                column.auto_width = False
                column.width = width
            table._require_update_dimensions = True
            table._clear_caches()  # rows rendered at the old widths are cached
            table.refresh()

    def _layout_charts(self) -> None:
        charts = self.query_one("#dash-charts", Container)
        width = self.size.width or self.app.size.width
        height = self.size.height or self.app.size.height
        columns = 3 if width >= 150 else 2
        gpu_shown = (height >= 30 or width >= 150) and self.gpu_charts
        for chart_id in ("#chart-gpu-util", "#chart-gpu-mem"):
            self.query_one(chart_id, LineChart).display = gpu_shown
        count = 6 if gpu_shown else 4
        charts.styles.grid_size_columns = columns
        charts.styles.grid_size_rows = -(-count // columns)

    # --- workers ---------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="dash-files", exit_on_error=False)
    def watch_files(self) -> None:
        worker = get_current_worker()
        source = self.source
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
            self._post_logs(log, events)
            now = time.monotonic()
            if now - last_status >= STATUS_EVERY_S:
                last_status = now
                with_disk = now - last_disk >= DISK_EVERY_S
                if with_disk:
                    last_disk = now
                self._post_state(with_disk)
            end = time.monotonic() + FILE_POLL_S
            while not worker.is_cancelled and time.monotonic() < end:
                time.sleep(0.05)

    def _post_logs(self, log: LinesFeed, events: EventsFeed) -> None:
        lines, reset_log = log.poll()
        records, reset_events = events.poll()
        if lines or records or reset_log or reset_events:
            self.post_message(LogLines(lines, records, reset_log, reset_events))

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

            state = writer_state(self.source, self._activity)
            self.post_message(RunStatusRead(state.status, state.label(), free, total))
            return
        from core.runs import RunDirectory, effective_status

        status = effective_status(RunDirectory(self.source.path))
        self.post_message(RunStatusRead(status.status, status.reason_text, free, total))

    # --- the app's GPU poll -----------------------------------------------------------------------
    def on_unmount(self) -> None:
        self.app.unwatch_gpus(self)  # type: ignore[attr-defined]

    def on_screen_resume(self) -> None:
        self.app.gpu_screens_changed()  # type: ignore[attr-defined]

    def on_screen_suspend(self) -> None:
        self.app.gpu_screens_changed()  # type: ignore[attr-defined]

    def _gpu_backfill(self) -> None:
        """The readings the app's history holds from before this screen opened (the GPU screen's, say),
        all but the latest, which comes as a SnapshotReady like every later one."""
        history, latest = self.app.gpu_history, self.app.gpu_snapshot  # type: ignore[attr-defined]
        if latest is None or self._cpu_run():
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

    def footer_priority(self) -> tuple[str, ...]:
        """Binding ids in the order the footer keeps them: what applies to the run as it stands first."""
        keys: list[str] = []
        if self.has_class("-full"):
            keys.append("dashboard.back")
        if not self.source.read_only:
            if can_stop(self.status):
                keys.append("dashboard.stop")
            elif self.status == RunState.FINISHED:
                keys += ["dashboard.merge", "dashboard.chat", "dashboard.serve", "dashboard.evaluate",
                         "dashboard.export"]
            elif can_resume(self.status):
                keys.append("dashboard.resume")
        return (*keys, "dashboard.full", "dashboard.search", "dashboard.back", "dashboard.axis")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Stop only while the run is live, evaluate and export only once it finished, and neither on
        another trainer's output: refused here, they leave the footer, the palette and the help."""
        if action == "stop":
            return not self.source.read_only and can_stop(self.status)
        if action == "after_training" and parameters and parameters[0] in ("evaluate", "export"):
            return not self.source.read_only and self.status == RunState.FINISHED
        return True

    def footer_label(self, binding_id: str, description: str) -> str:
        """Esc leaves the full view before it goes back to the runs: the footer says which it does now."""
        if binding_id == "dashboard.back" and self.has_class("-full"):
            return t("dashboard.key.leave_full")
        if binding_id == "dashboard.back" and self._leaves_app():
            return t("dashboard.key.quit_watch")
        return description

    def on_log_lines(self, message: LogLines) -> None:
        pane = self.query_one("#dash-log", LogPane)
        if message.reset_log:
            pane.clear()
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

    def _described_event(self) -> dict[str, Any] | None:
        """The event the line under the table shows: the highlighted one once the table has its cursor
        (e), else the newest (a failure's reason is the last thing written)."""
        table = self.query_one("#dash-events", DataTable)
        if table.show_cursor and 0 <= table.cursor_row < len(self.events):
            return self.events[table.cursor_row]
        return self.events[-1] if self.events else None

    def _show_event_detail(self) -> None:
        record = self._described_event()
        line = Text()
        if record is not None:
            _clock, label, detail = self._event_row(record)
            line.append(label, "bold")
            if detail:
                line.append(" " + detail)
        self.query_one("#dash-event-detail", Static).update(line)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "dash-events":
            self._show_event_detail()

    def on_run_status_read(self, message: RunStatusRead) -> None:
        previous = self.status or None
        self.status, self.reason = message.status, message.reason
        if previous != self.status:
            self.refresh_bindings()  # the footer offers what applies now (stop, resume, merge/chat/serve)
        if message.disk_free is not None:
            self.disk = (message.disk_free, message.disk_total)
        alerts = {"ended": ended_alert(previous, self.status, self.source.run_id),
                  "disk": disk_alert(self.disk[0], self.disk[1], str(data_root())),
                  "stalled": stalled_alert(self.status, self.source.run_id, self.reason)}
        self._notify(self.gate.filter(alerts))
        self._show_info()

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self._gpu_failed = False
        if self._cpu_run():
            return  # the box's GPUs are not this run's: no chart of them, no idle alert
        snapshot = message.snapshot
        gpus = list(getattr(snapshot, "gpus", []) or [])
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
        at = snapshot.taken_at
        self._add_gpu_points(at, [(g.index, g.utilization_gpu_pct, g.memory_used_fraction) for g in mine])
        self._notify(self.gate.filter({"gpu_idle": gpu_idle_alert(self.util_samples, self.status, at)}))

    def on_gpu_poll_failed(self, message: GpuPollFailed) -> None:
        """The app's poll failed: said once until a reading comes again (a bug opened the error modal)."""
        if message.expected and not self._gpu_failed:
            error = message.error
            self.notify(f"{t('gpuscreen.poll_failed')} {type(error).__name__}: {error}", severity="error",
                        markup=False)
        self._gpu_failed = True

    def on_action_done(self, message: ActionDone) -> None:
        self.notify(message.text, severity=message.severity)

    def on_worker_state_changed(self, event) -> None:
        """The file watcher failed: a notification for what may fail (files), the error modal for a bug."""
        from textual.worker import WorkerState

        from tui.screens.error_modal import report_unexpected

        error = event.worker.error
        if event.worker.group != "dash-files" or event.state != WorkerState.ERROR or error is None:
            return
        if isinstance(error, expected_errors()):
            self.notify(t("dashboard.worker_failed", error=f"{type(error).__name__}: {error}"), severity="error")
        else:
            report_unexpected(self.app, error, "dashboard.watch_files")

    # --- presentation ----------------------------------------------------------------------------
    def _changed(self) -> None:
        self._dirty = True
        if self._drawn_version is None:
            self._redraw()  # the first data shows at once, not on the next tick

    def _redraw_if_dirty(self) -> None:
        if self._dirty:
            self._redraw()

    def _redraw(self) -> None:
        self._dirty = False
        series, axis = self.series, self.axis
        version = series.version
        self._drawn_version = (version, axis, self.gpu_version)
        note = t("dashboard.axis_time") if axis == "time" else t("dashboard.axis_step")
        if self._cpu_run() and (self.gpu_charts or self.gpu_util or self.gpu_mem):
            # Readings of the box's GPUs may have come before the metrics header said this run is on the CPU.
            self.gpu_util, self.gpu_mem = {}, {}
            self.util_samples.clear()
            self.gpu_version += 1
            if self.gpu_charts:
                self.gpu_charts = False
                self._layout_charts()
        for chart in CHARTS:  # the lines of each metrics chart come from core.watch.metrics
            specs = [SeriesSpec(t(m.legend) if m.legend else "", series.series(m.name, axis), m.colour, m.mode)
                     for m in chart.metrics]
            self.query_one("#" + chart.id, LineChart).set_series(
                specs, axis, version, note if chart.axis_note else "", self._empty_text(chart.metrics[0].name))
        # The GPU charts are always by time, and their titles say so whatever x chose for the others: their
        # points are the monitor's readings, taken while this screen is open, not values the run logged
        # at a step; x runs from the first reading.
        for chart_id, data in (("#chart-gpu-util", self.gpu_util), ("#chart-gpu-mem", self.gpu_mem)):
            specs = [SeriesSpec(str(index), data[index], n, "line") for n, index in enumerate(sorted(data))]
            self.query_one(chart_id, LineChart).set_series(specs, "time", self.gpu_version,
                                                           t("dashboard.axis_time"))
        self._show_info()

    def _empty_text(self, metric: str) -> str:
        """What a chart without a point says: waiting while the run has logged no step yet (or its history
        is still being read), else that this run (another tool's folder: this source) does not log it."""
        if not self.series.train_records or not self.backfilled:
            return t("dashboard.waiting")
        if self.source.read_only:
            return t("dashboard.not_in_source", kind=t("dashboard.kind_" + self.source.kind))
        return t("dashboard.not_logged")

    def _cpu_run(self) -> bool:
        """The run trains on the CPU (its metrics header says so): the box's GPUs are none of its business."""
        return self.series.header.get("device") == "cpu"

    def _leaves_app(self) -> bool:
        """Esc here quits: this dashboard is what ``tunedeck watch DIR`` opened, over nothing of its own."""
        return self.standalone and not self.has_class("-full")

    def _gpu_count(self) -> int:
        if self.gpu_indices:
            return len(self.gpu_indices)
        header = self.series.header
        return int(header.get("world_size") or 0) if header.get("device", "cuda") != "cpu" else 0

    def _show_info(self) -> None:
        header = self.series.header
        facts = self._record if self.source.read_only else (self._record.get("config_summary") or {})
        latest = self.series.latest
        model = header.get("model") or facts.get("model")
        method = header.get("method") or facts.get("method")
        precision = header.get("precision") or facts.get("precision")
        zero = header.get("zero_stage", facts.get("zero_stage"))
        gpus = ",".join(str(i) for i in self.gpu_indices) or (str(self._gpu_count()) if self._gpu_count() else None)
        status = self.status or "…"
        colour = {RunState.RUNNING: "$success", RunState.FINISHED: "$primary", RunState.FAILED: "$error",
                  RunState.CRASHED: "$error", RunState.STALLED: "$warning", RunState.STOPPING: "$warning",
                  RunState.STOPPED: "$warning", IDLE: "$warning"}.get(status, "$foreground-muted")
        line1 = " · ".join([
            f"[b]{_escape(_na(model))}[/]", _na(method), _na(precision),
            t("dashboard.zero", stage=_na(None if zero is None else str(zero))),
            t("dashboard.cpu_run") if self._cpu_run() else t("dashboard.gpus", gpus=_na(gpus)),
            f"[{colour}]{_escape(self.reason if status == IDLE else state_label(status))}[/]",
        ])
        if self.source.read_only:
            line1 += f"  [$foreground-muted]{t('dashboard.read_only', kind=t('dashboard.kind_' + self.source.kind))}[/]"
        step, total = latest.get("step"), latest.get("total_steps") or header.get("total_steps")
        total = shown_total(step, total, status)
        progress = _na(None if step is None else f"{step}/{total}" if total else str(step))
        if step is not None and total:
            progress += f" {100.0 * step / total:.0f}%"
        elapsed = latest.get("elapsed_s")
        eta = latest.get("eta_s") if status in (RunState.RUNNING, RunState.STOPPING, "") else None
        tokens = latest.get("tokens_per_s")
        gpu_count = self._gpu_count()
        mfu_value = mfu(latest, header, gpu_count, self.gpu_name)
        parts = [
            t("dashboard.step", progress=progress),
            t("dashboard.epoch", epoch=_na(None if latest.get("epoch") is None else f"{latest['epoch']:.2f}")),
            t("dashboard.elapsed", value=_na(format_duration(elapsed))),
            *([t("dashboard.eta", value=_na(format_duration(eta)))] if eta is not None or status in ACTIVE_STATES else []),
            t("dashboard.tokens", value=_na(None if tokens is None else format_rate(tokens))),
            t("dashboard.mfu", value=_na(None if mfu_value is None else f"{100 * mfu_value:.0f}%")),
        ]
        cost = cost_so_far(elapsed, gpu_count, self.app.settings.price_per_gpu_hour)
        if cost is not None:
            parts.append(t("dashboard.cost", value=f"{cost:.2f}"))
        line2 = " · ".join(parts)
        if self.reason and status in TERMINAL_STATES and status != RunState.FINISHED:
            line2 += f"\n[$error]{_escape(self.reason)}[/]"
        self.query_one("#dash-info", Static).update(line1 + "\n" + line2)

    @staticmethod
    def _event_row(record: dict[str, Any]) -> tuple[str, str, str]:
        when = str(record.get("time", ""))
        clock = when[11:19] if len(when) >= 19 else when
        fields = {k: v for k, v in record.items() if k not in ("time", "ts", "event", "reason_message")}
        if "reason" in fields:  # written by the supervisor with its message record: show the reader's language
            fields["reason"] = render_stored(str(fields["reason"]), record.get("reason_message"))
        detail = " ".join(f"{k}={v}" for k, v in fields.items())
        return clock, event_label(str(record.get("event", ""))), detail

    def _check_alerts(self) -> None:
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

    # --- actions ---------------------------------------------------------------------------------
    def action_toggle_axis(self) -> None:
        self.axis = "time" if self.axis == "step" else "step"
        self._redraw()

    def action_search(self) -> None:
        box = self.query_one("#dash-search", Input)
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "dash-search":
            return
        pane = self.query_one("#dash-log", LogPane)
        count = pane.search(event.value.strip())
        event.input.display = False
        pane.focus()
        if event.value.strip():
            self.notify(t("dashboard.search_found", count=count, text=event.value.strip()),
                        severity="information" if count else "warning", timeout=3)

    def action_next_match(self, step: int) -> None:
        pane = self.query_one("#dash-log", LogPane)
        if pane.next_match(step) is None:
            self.notify(t("dashboard.search_none"), severity="warning", timeout=3)

    def action_focus_log(self) -> None:
        self.query_one("#dash-log", LogPane).focus()

    def action_focus_events(self) -> None:
        table = self.query_one("#dash-events", EventsTable)
        if not table.show_cursor:
            table.following = False
            table.show_cursor = True  # Enter shows the highlighted event in full
            if self.events:  # from the newest, where the table is scrolled to
                table.move_cursor(row=len(self.events) - 1, animate=False)
        table.focus()
        self._show_event_detail()

    def action_toggle_full(self) -> None:
        """The log and the events over the whole screen (again, or Esc: back to the dashboard)."""
        self.toggle_class("-full")
        if self.has_class("-full"):
            self.query_one("#dash-log", LogPane).focus()
        self.refresh_bindings()
        self.call_after_refresh(self._fit_detail_column)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id != "dash-events" or not 0 <= event.cursor_row < len(self.events):
            return
        from tui.widgets.text_modal import TextModal

        record = self.events[event.cursor_row]
        clock, label, _detail = self._event_row(record)
        fields = {k: v for k, v in record.items() if k not in ("event", "reason_message")}
        if "reason" in fields:
            fields["reason"] = render_stored(str(fields["reason"]), record.get("reason_message"))
        body = "\n".join(f"{k}: {v}" for k, v in fields.items())
        self.app.push_screen(TextModal(t("dashboard.event_title", time=clock, event=label), body))

    def action_back(self) -> None:
        box = self.query_one("#dash-search", Input)
        if box.display:
            box.display = False
            self.query_one("#dash-log", LogPane).focus()
            return
        if self.has_class("-full"):
            self.action_toggle_full()
            return
        if self._leaves_app():
            self.app.exit()
            return
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()

    def action_jump_gpus(self) -> None:
        self.app.action_section("gpus")

    def action_stop(self) -> None:
        from tui.widgets.run_control import ask_stop

        if self.source.read_only:
            self.notify(t("dashboard.read_only_action"), severity="warning")
            return
        ask_stop(self, self.source.path, self.source.run_id, self.status, self._say,
                 lambda: self._post_state(with_disk=False))

    def action_resume(self) -> None:
        from tui.widgets.run_control import ask_resume

        if self.source.read_only:
            self.notify(t("dashboard.read_only_action"), severity="warning")
            return
        ask_resume(self, self.source.path, self.source.run_id, self.status, self._say,
                   lambda: self._post_state(with_disk=False))

    def _say(self, text: str, severity: str) -> None:
        self.post_message(ActionDone(text, severity))  # from the worker thread

    def action_config(self) -> None:
        from tui.widgets.text_modal import TextModal

        candidates = ["config.yaml"] if not self.source.read_only else ["args.json", "training_args.yaml",
                                                                       "llamaboard_config.yaml"]
        for name in candidates:
            path = self.source.path / name
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            self.app.push_screen(TextModal(str(path), text))
            return
        self.notify(t("dashboard.no_config", path=str(self.source.path)), severity="warning")

    def command_line(self) -> str:
        """The command that reproduces (or continues) this run."""
        if self.source.read_only:
            return shlex.join(["tunedeck", "watch", str(self.source.path)])
        if can_resume(self.status):
            return shlex.join(["tunedeck", "resume", self.source.run_id])
        argv = [str(a) for a in self._record.get("argv") or []]
        if argv:
            if argv[0] != "tunedeck":
                argv = ["tunedeck", *argv[1:]] if argv[0].endswith("tunedeck") else argv
            return shlex.join(argv)
        return shlex.join(["tunedeck", "train", str(self.source.path / "config.yaml")])

    def action_after_training(self, what: str) -> None:
        """Merge / chat / serve / evaluate / export a finished run (``tui.screens.chat`` does the work)."""
        from tui.screens import chat

        if self.source.read_only:
            self.notify(t("lifecycle.tui_read_only"), severity="warning")
            return
        {"merge": chat.merge_in_background, "chat": chat.open_chat, "serve": chat.serve_in_background,
         "evaluate": chat.evaluate_in_background,
         "export": chat.export_in_background}[what](self, self.source.path)

    def action_copy_command(self) -> None:
        command = self.command_line()
        self.app.copy_to_clipboard(command)
        self.notify(t("dashboard.copied", command=command), timeout=8)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
