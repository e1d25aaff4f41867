"""The dashboard screen: its CSS, keys and state, the layout, and the charts' redraw.

The charts redraw at most twice a second whatever the write rate. Leaving the screen only stops the
watching: the run goes on.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Header, Input, Static

from core.i18n import t
from core.runs import TERMINAL_STATES
from core.watch.alerts import AlertGate
from core.watch.downsample import BucketedSeries
from core.watch.metrics import CHARTS
from core.watch.series import RunSeries
from core.watch.source import LOG_NAMES, WatchSource
from tui.screens.dashboard.actions import DashboardActions
from tui.screens.dashboard.feed import DashboardFeed
from tui.screens.dashboard.header import DashboardHeader, EventsTable
from tui.widgets.chart import LineChart, SeriesSpec
from tui.widgets.keys_footer import KeysFooter
from tui.widgets.log_pane import LogPane

REDRAW_EVERY_S = 0.5


class DashboardScreen(DashboardFeed, DashboardHeader, DashboardActions, Screen[None]):
    """Live view of one run (tunedeck's own, or another trainer's output dir, read-only)."""

    DEFAULT_CSS = """
    DashboardScreen #dash-info { height: auto; max-height: 4; padding: 0 1; }
    /* a run that ended with a reason (failed, crashed): the reason wraps in full, the charts give way */
    DashboardScreen.-ended #dash-info { max-height: 8; }
    DashboardScreen #dash-charts { layout: grid; grid-size: 2 2; height: 2fr; min-height: 8; }
    DashboardScreen #dash-bottom { height: 1fr; min-height: 5; }
    DashboardScreen #dash-log-box { width: 3fr; }
    DashboardScreen #dash-log { height: 1fr; border: round $foreground-muted; border-title-color: $primary; }
    DashboardScreen #dash-search { dock: bottom; }
    DashboardScreen #dash-events-box { width: 2fr; height: 1fr; border: round $foreground-muted;
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
        Binding("o", "watch_newer", t("dashboard.key.newer"), id="dashboard.newer"),
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
        self.newer: WatchSource | None = None  # a run started below the folder named since: ``o`` watches it
        self._newer_toast: Any = None  # the toast that says so (a Notification): gone once it is watched
        self.series = RunSeries()
        self.axis = "step"
        self.status = ""  # read-only sources too: core.watch.activity says running, idle or finished
        self.reason = ""
        self.reason_message: dict[str, Any] | None = None  # the status's reason as a message record
        self.has_checkpoint = False  # ended with a complete checkpoint: resume, merge, chat … (check_action)
        self.resumable = False  # a resume is offered (``core.runs.listing.offers_resume``; check_action)
        self.pending_resume: dict[str, Any] | None = None  # a resume asked for, not logged yet (RunStatusRead)
        self.gpu_indices: list[int] = []
        self.gpu_name: str | None = None
        self.gpu_util: dict[int, BucketedSeries] = {}
        self.gpu_mem: dict[int, BucketedSeries] = {}
        self.gpu_version = 0
        self.gpu_started: float | None = None
        self.gpu_charts = True  # False on a CPU run, or where no GPU reading names one of the run's
        self.gpu_lost: tuple[int, ...] = ()  # the run's GPUs the latest reading says lost (fell off the bus, Xid 79)
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
        self._config: dict[str, Any] = {}  # a tunedeck run's config.yaml (RunRecordRead)
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
                            y_floor=0.0, y_ceiling=100.0, keep_note=True)
            yield LineChart(t("dashboard.chart_gpu_mem"), t("dashboard.no_gpus"), id="chart-gpu-mem",
                            y_floor=0.0, y_ceiling=100.0, keep_note=True)
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
        log = self.query_one("#dash-log", LogPane)
        # titled for the file it follows (ms-swift's and LLaMA-Factory's are not train.log); another tool's
        # folder without one says so, and which names were looked for, rather than an empty "train.log"
        if self.source.log_path is not None:
            log.border_title = self.source.log_path.name
        else:
            log.border_title = t("dashboard.log_title")
            log.empty_text = t("dashboard.no_log_file", files=", ".join(LOG_NAMES))
        self.query_one("#dash-events-box").border_title = t("dashboard.events_title")
        self._layout_charts()
        self._show_info()
        # A tunedeck run's run.json (its GPUs) is read by the file watcher, first: the GPU charts follow
        # once it has come (on_run_record_read). Another tool's folder has none: every GPU is the run's.
        self.watch_files()
        if self.source.read_only:
            self._follow_gpus()
        self.set_interval(REDRAW_EVERY_S, self._redraw_if_dirty)

    def on_resize(self) -> None:
        self._layout_charts()
        self.call_after_refresh(self._fit_detail_column)
        self.call_after_refresh(self._show_info)  # the stats line keeps what fits the new width

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

    # --- presentation ----------------------------------------------------------------------------
    def _changed(self) -> None:
        self._dirty = True
        if self._drawn_version is None:
            self._redraw()  # the first data shows at once, not on the next tick

    def _redraw_if_dirty(self) -> None:
        if self._dirty:
            self._redraw()
        self.query_one("#dash-events", EventsTable).keep_up()
        self.query_one("#dash-log", LogPane).keep_up()

    def _redraw(self) -> None:
        self._dirty = False
        series, axis = self.series, self.axis
        version = series.version
        self._drawn_version = (version, axis, self.gpu_version)
        note = t("dashboard.axis_time") if axis == "time" else t("dashboard.axis_step")
        if self._not_this_boxs_gpus() and (self.gpu_charts or self.gpu_util or self.gpu_mem):
            # Readings of the box's GPUs may have come before the metrics header said this run is on the CPU
            # (or run.json, that it runs on another host).
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
        # A lost GPU's readings are gaps: the charts say why (as the GPU screen's card does), not only stop.
        lost = ",".join(map(str, self.gpu_lost))
        gpu_note = t("dashboard.gpu_lost_note", gpus=lost) if lost else t("dashboard.axis_time")
        gpu_empty = t("dashboard.gpu_lost_empty", gpus=lost) if lost else t("dashboard.no_gpus")
        for chart_id, data in (("#chart-gpu-util", self.gpu_util), ("#chart-gpu-mem", self.gpu_mem)):
            specs = [SeriesSpec(str(index), data[index], n, "line") for n, index in enumerate(sorted(data))]
            self.query_one(chart_id, LineChart).set_series(specs, "time", self.gpu_version, gpu_note, gpu_empty)
        self._show_info()

    def _empty_text(self, metric: str) -> str:
        """What a chart without a point says: waiting while the run has logged no step yet (or its history
        is still being read), that none will come when a tunedeck run has ended without one (its dataset
        gone, a bad config: it failed before its first step), else that this run (another tool's folder:
        this source) does not log it."""
        if not self.series.train_records and self.backfilled and self._ended_run():
            return t("dashboard.ended_without_metrics")
        if not self.series.train_records or not self.backfilled:
            return t("dashboard.waiting")
        if self.source.read_only:
            return t("dashboard.not_in_source", kind=t("dashboard.kind_" + self.source.kind))
        return t("dashboard.not_logged")

    def _ended_run(self) -> bool:
        """A tunedeck run that has ended (finished, failed, stopped, crashed): no metric is coming. (Another
        tool's folder reads as finished when its files stop changing: a later line may still come.)"""
        return not self.source.read_only and self.status in TERMINAL_STATES
