"""The GPU screen: a card per GPU with bars and a rolling history, processes, the host.

The app's one GPU poll (``tui.gpu_poll``: 1 Hz by default, never faster than every 0.25 s) posts each
snapshot here, and each card draws its history from the app's one ``GpuHistory``; a worker thread of
this screen links the GPU processes to tunedeck runs (``core.hardware.run_links``: file reads). Only
message handlers touch widgets, so input never waits on NVML or /proc.

The process list works like nvitop's: nothing is selected until ``p`` (or an arrow key) selects a
process; then its full command line, start and run show below the list, ``Enter`` shows everything in
a window, ``k`` / ``K`` send SIGTERM / SIGKILL after a ``y`` in a dialog (``core.hardware.process_control``
checks first that the pid still names the same process, and refuses with the reason where it cannot
send), ``o`` opens the run's dashboard, ``Esc`` leaves the list. A process a key acts on is always on screen:
full cards show only where they leave the list (and a selected process's detail) its room, ``c`` says why
where they do not, and a terminal too short even for compact lines scrolls to the selected process.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.markup import escape
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import DataTable, Header, Static

from core.hardware.history import GpuHistory
from core.hardware.run_links import TRAINER, RunLink, RunLinker
from core.hardware.snapshot import BoxSnapshot, CacheDisk, GpuProcess, GpuSnapshot
from core.i18n import t
from core.settings import MIN_POLL_INTERVAL_S
from core.text_width import cell_len, one_line, pad, truncate
from core.units import UNKNOWN, format_disk, format_duration, format_memory, plural_key
from tui.gpu_poll import GpuPollFailed, SnapshotReady, expected_errors, replay_note
from tui.widgets.bar import bar, level_variable
from tui.widgets.history import history_rows
from tui.widgets.keys_footer import KeysFooter
from tui.widgets.log_pane import wrap_points

CARD_HEIGHT = 7  # border + five lines
CARD_MIN_WIDTH = 60
GIB = 1024**3
CELL_PADDING = 1  # the process table's, on each side of a cell
COMMAND_MIN_WIDTH = 20  # columns drop before the command gets narrower than this
USER_MAX_WIDTH = 10
DETAIL_MAX_LINES = 6  # the selected process under the list: a head line and up to five of command
DETAIL_RESERVE_LINES = 4  # what a selection needs at least: cards fold (compact) to leave it
# Header, host strip and footer, and the process list's header and five rows: what full cards leave at least,
# with the status's lines (the status may take several).
LIST_RESERVE_LINES = 3 + 6
SIGNAL_WAIT_S = 10.0  # how long after a signal the screen waits to say whether the process exited


_MARKUP_TAG = re.compile(r"\[[^\]]*\]")  # the host line's style tags ([$primary], [/]): no cells of their own


# The hubs as the host line names their caches: short, as their variables (MODELSCOPE_CACHE, HF_HOME) do.
_CACHE_HUBS = {"modelscope": "ModelScope", "hf": "HF"}


# Where the line is short of room (80 columns, two caches on two disks): the hubs as "MS" and "HF", no "cache".
_CACHE_HUBS_SHORT = {"modelscope": "MS", "hf": "HF"}


def _cache_disk_label(disk: CacheDisk, short: bool = False) -> str:
    """A hub cache's disk on the host line: "hub cache 1.2 TB" holding both hubs' caches, else the hub's name;
    ``short``: "MS 1.2 TB", "HF 1.2 TB", "MS+HF 1.2 TB"."""
    free = format_disk(disk.free_bytes)
    if short and disk.hubs and all(hub in _CACHE_HUBS_SHORT for hub in disk.hubs):
        return t("gpuscreen.disk_cache_short", hubs="+".join(_CACHE_HUBS_SHORT[hub] for hub in disk.hubs), free=free)
    if len(disk.hubs) == 1 and disk.hubs[0] in _CACHE_HUBS:
        return t("gpuscreen.disk_cache_of", hub=_CACHE_HUBS[disk.hubs[0]], free=free)
    return t("gpuscreen.disk_cache", free=free)


def _gib(value: int | None) -> str:
    if value is None:
        return t("gpuscreen.na")
    gib = value / GIB
    return f"{gib:.0f}" if gib >= 100 else f"{gib:.1f}"


def _num(value: float | int | None, fmt: str = "{:.0f}", suffix: str = "") -> str:
    return t("gpuscreen.na") if value is None else fmt.format(value) + suffix


def _list_command(text: str) -> str:
    """The list's command cell: the program by its name, not its path (``/root/tunedeck/.venv/bin/python -m
    core.train.worker ...`` is ``python -m core.train.worker ...``): at 80 columns a virtual environment's path
    filled the cell, and the arguments are what tell processes apart. The selected process's full command line
    shows under the list."""
    program, space, rest = one_line(text).partition(" ")
    name = program.rstrip("/").rsplit("/", 1)[-1] if "/" in program.rstrip("/") else program
    return name + space + rest


_RUN_STAMP = re.compile(r"^\d{8}-\d{4}-(.+)$")


def _run_label(run_id: str, width: int) -> str:
    """A run's name before its process's command: the id without its date-time stamp where the id
    would take more than half the column (the detail line below has the whole id)."""
    match = _RUN_STAMP.match(run_id)
    if match and cell_len(run_id) > width // 2:
        run_id = match.group(1)
    return truncate(run_id, max(1, width // 2))


@dataclass(frozen=True)
class ProcColumn:
    """One column of the process table. ``priority``: lower stays longer as the screen narrows (0 never
    drops); the command column takes what the others leave."""

    key: str
    label: str  # i18n key
    priority: int
    right: bool = False


PROC_COLUMNS: tuple[ProcColumn, ...] = (
    ProcColumn("gpu", "gpuscreen.col_gpu", 0),
    ProcColumn("pid", "gpuscreen.col_pid", 0, right=True),
    ProcColumn("user", "gpuscreen.col_user", 5),
    ProcColumn("gpu_mem", "gpuscreen.col_mem", 1, right=True),
    ProcColumn("cpu", "gpuscreen.col_cpu", 2, right=True),
    ProcColumn("host_mem", "gpuscreen.col_host_mem", 3, right=True),
    ProcColumn("elapsed", "gpuscreen.col_elapsed", 4, right=True),
    ProcColumn("command", "gpuscreen.col_command", 0),
)


def fit_process_columns(width: int, natural: dict[str, int]) -> dict[str, int]:
    """{column key: content width} of the columns that fit in ``width`` cells, in table order.

    Each column is as wide as its widest cell or label; while the command would get fewer than
    ``COMMAND_MIN_WIDTH`` cells the column of the highest priority number drops (user, then elapsed,
    RAM, CPU, GPU memory); GPU, PID and command always stay. The command takes the rest."""
    kept = list(PROC_COLUMNS)

    def fixed(columns: list[ProcColumn]) -> int:
        return sum(natural.get(c.key, 1) + 2 * CELL_PADDING for c in columns if c.key != "command")

    for column in sorted(PROC_COLUMNS, key=lambda c: -c.priority):
        if column.priority == 0 or fixed(kept) + COMMAND_MIN_WIDTH + 2 * CELL_PADDING <= width:
            break
        kept.remove(column)
    widths = {c.key: natural.get(c.key, 1) for c in kept if c.key != "command"}
    widths["command"] = max(COMMAND_MIN_WIDTH, width - fixed(kept) - 2 * CELL_PADDING)
    return {c.key: widths[c.key] for c in kept}


@dataclass(frozen=True)
class ProcRow:
    """One line of the process table: a process on one GPU, with its run if it is a tunedeck run's."""

    key: str
    gpu: int
    process: GpuProcess
    run: RunLink | None
    elapsed_s: float | None


class RunsLinked(Message):
    """pid -> run of a snapshot's processes, looked up in a worker (the runs' files)."""

    def __init__(self, links: dict[int, RunLink]) -> None:
        super().__init__()
        self.links = links

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunsLinked)


class SignalChecked(Message):
    """The outcome of ``check_signal`` for the process the user asked to kill (from a worker)."""

    def __init__(self, row: ProcRow, force: bool, target: object | None, refusal: str | None) -> None:
        super().__init__()
        self.row = row
        self.force = force
        self.target = target
        self.refusal = refusal


class SignalOutcome(Message):
    """What came of a signal: sent, refused, exited or still running (from a worker)."""

    def __init__(self, text: str, severity: str = "information") -> None:
        super().__init__()
        self.text = text
        self.severity = severity


class ProcessTable(DataTable, inherit_bindings=False):
    """The process list: the first arrow key selects a process rather than moving a hidden cursor, as in
    nvitop. Enter is left to the screen (the selected process in full), not the table's row selection."""

    BINDINGS = [b for b in DataTable.BINDINGS if isinstance(b, Binding) and b.key != "enter"]

    def _selecting(self) -> bool:
        return bool(getattr(self.screen, "selecting", False))

    def action_cursor_down(self) -> None:
        if self._selecting():
            super().action_cursor_down()
        else:
            self.screen.start_selecting()  # type: ignore[attr-defined]

    def action_cursor_up(self) -> None:
        if self._selecting():
            super().action_cursor_up()
        else:
            self.screen.start_selecting()  # type: ignore[attr-defined]


class GpuCard(Widget):
    """One GPU: full card (bars, two history rows, details) or one compact line."""

    DEFAULT_CSS = """
    GpuCard { height: 7; border: round $foreground-muted; padding: 0 1;
              border-title-color: $primary; border-subtitle-color: $foreground; }
    GpuCard.-compact { height: 1; border: none; padding: 0; }
    """

    def __init__(self, index: int, history: GpuHistory) -> None:
        super().__init__(id=f"gpu-{index}")
        self.index = index
        self.history = history  # the app's one history: readings taken before this card was made too
        self.gpu: GpuSnapshot | None = None

    @property
    def util_history(self) -> list[float | None]:
        return self.history.series(self.index, "utilization_gpu_pct")

    @property
    def mem_history(self) -> list[float | None]:
        return [None if frac is None else frac * 100 for frac in self.history.series(self.index, "memory_used_fraction")]

    def record(self, gpu: GpuSnapshot) -> None:
        self.gpu = gpu
        self.border_title = f"{gpu.index} · {gpu.name or t('gpuscreen.na')}"
        self.border_subtitle = t("gpuscreen.lost") if gpu.lost else (
            f"{_num(gpu.temperature_c, suffix='°C')} · "
            f"{_num(gpu.power_draw_w)}/{_num(gpu.power_limit_w)} W"
        )
        self.refresh()

    def render(self) -> str:
        gpu = self.gpu
        if gpu is None:
            return t("gpuscreen.waiting")
        return self._compact_line(gpu) if self.has_class("-compact") else self._full(gpu)

    def _full(self, gpu: GpuSnapshot) -> str:
        width = max(20, self.content_region.width)
        if gpu.lost:  # not a GPU whose every field is N/A and that runs nothing: one that needs a reboot
            return f"[b $error]{t('gpuscreen.lost')}[/]\n{escape(t('gpuscreen.lost_detail'))}"
        util = gpu.utilization_gpu_pct
        mem = gpu.memory_used_fraction
        bar_width = max(8, width - 30)
        util_label = pad(t("gpuscreen.util"), 4)
        mem_label = pad(t("gpuscreen.mem"), 4)
        util_text = f"{_num(util, suffix='%'):>4}  SM {_num(gpu.clock_sm_mhz)} MHz"
        mem_text = f"{_gib(gpu.memory_used_bytes)}/{_gib(gpu.memory_total_bytes)} GiB"
        hist_width = width - 5
        util_hist = history_rows(self.util_history, hist_width, 1)[0]
        mem_hist = history_rows(self.mem_history, hist_width, 1)[0]
        details = [
            t("gpuscreen.pcie", gen=_num(gpu.pcie_gen), width=_num(gpu.pcie_width)),
            t("gpuscreen.ecc", count=_num(gpu.ecc_uncorrected_volatile)),
            t("gpuscreen.mig_on", count=len(gpu.mig_instances)) if gpu.mig_enabled else t("gpuscreen.mig_off"),
            # N/A, not "0 proc", where NVML would not list them: the GPU may well be busy
            t("gpuscreen.procs_count", count=len(gpu.processes) if gpu.processes_known else t("gpuscreen.na")),
        ]
        return "\n".join([
            f"{util_label} [{level_variable(None if util is None else util / 100)}]{bar(None if util is None else util / 100, bar_width)}[/] {util_text}",
            f"{mem_label} [{level_variable(mem)}]{bar(mem, bar_width)}[/] {mem_text}",
            f"[$foreground-muted]{pad(t('gpuscreen.hist_util'), 4)}[/] [$primary]{util_hist}[/]",
            f"[$foreground-muted]{pad(t('gpuscreen.hist_mem'), 4)}[/] [$secondary]{mem_hist}[/]",
            f"[$foreground-muted]{truncate(' · '.join(details), width)}[/]",
        ])

    def _compact_line(self, gpu: GpuSnapshot) -> str:
        width = max(40, self.content_region.width)
        if gpu.lost:
            name = pad((gpu.name or "").replace("NVIDIA ", ""), 10)
            return f"[$primary]{gpu.index:>2}[/] {name} [b $error]{escape(truncate(t('gpuscreen.lost_compact'), width - 14))}[/]"
        util = gpu.utilization_gpu_pct
        mem = gpu.memory_used_fraction
        name = pad((gpu.name or "").replace("NVIDIA ", ""), 10)
        mem_text = f"{_gib(gpu.memory_used_bytes) + '/' + _gib(gpu.memory_total_bytes) + 'G':>10}"
        tail = f"{_num(gpu.temperature_c, suffix='°C'):>4} {_num(gpu.power_draw_w, suffix='W'):>5}"
        fixed = 2 + 1 + 10 + 1 + 6 + 1 + 6 + 1 + cell_len(mem_text) + 1 + cell_len(tail) + 1
        spark_width = max(0, min(30, width - fixed - 16))
        bar_width = max(4, (width - fixed - spark_width) // 2)
        return (
            f"[$primary]{gpu.index:>2}[/] {name} "
            f"[{level_variable(None if util is None else util / 100)}]{bar(None if util is None else util / 100, bar_width)}[/]"
            f"{_num(util, suffix='%'):>5} "
            f"[{level_variable(mem)}]{bar(mem, bar_width)}[/] {mem_text} {tail} "
            f"[$primary]{history_rows(self.util_history, spark_width, 1)[0] if spark_width else ''}[/]"
        )


class GpuScreen(Screen[None]):
    """Live NVML view of every GPU, its processes and the host."""

    DEFAULT_CSS = """
    GpuScreen #gpu-procs { scrollbar-gutter: stable; }
    GpuScreen #gpu-proc-detail { height: auto; padding: 0 1; display: none; }
    GpuScreen #gpu-proc-detail.-shown { display: block; }
    """
    BINDINGS = [
        # In the footer before the app's section keys (KeysFooter drops what does not fit, ? stays).
        Binding("c", "toggle_compact", t("gpuscreen.key.compact"), id="gpus.compact"),
        Binding("p", "focus_processes", t("gpuscreen.key.processes"), id="gpus.processes"),
        Binding("plus", "interval(2.0)", t("gpuscreen.key.interval_up"), key_display="+", id="gpus.slower"),
        Binding("minus", "interval(0.5)", t("gpuscreen.key.interval_down"), key_display="-", id="gpus.faster"),
        # While a process is selected (check_action): signal it, see it whole, open its run, leave.
        Binding("k", "kill(False)", t("gpuscreen.key.kill"), id="gpus.kill"),
        Binding("K", "kill(True)", t("gpuscreen.key.force_kill"), key_display="K", id="gpus.force_kill"),
        Binding("enter", "details", t("gpuscreen.key.details"), id="gpus.details"),
        Binding("o", "open_run", t("gpuscreen.key.open_run"), id="gpus.open_run"),
        Binding("escape", "unselect", t("gpuscreen.key.back"), id="gpus.back"),
    ]
    # Footer labels of the keys whose help and palette descriptions are long: the footer line's short forms
    # (KeysFooter reads them), never the palette's, where a new user looks an action up by what it does.
    FOOTER_LABELS = {
        "gpus.kill": "gpuscreen.key.kill_short",
        "gpus.force_kill": "gpuscreen.key.force_kill_short",
        "gpus.details": "gpuscreen.key.details_short",
        "gpus.open_run": "gpuscreen.key.open_run_short",
        "gpus.back": "gpuscreen.key.back_short",
    }
    PROCESS_ACTIONS = ("kill", "details", "unselect")

    def footer_priority(self) -> tuple[str, ...]:
        """Binding ids in the order the footer keeps them when the line is short."""
        if self.selecting:
            return ("gpus.kill", "gpus.open_run", "gpus.details", "gpus.force_kill", "gpus.back",
                    "gpus.compact", "gpus.slower", "gpus.faster")
        return ("gpus.compact", "gpus.processes", "gpus.slower", "gpus.faster")

    def footer_label(self, binding_id: str, description: str) -> str | None:
        if binding_id == "gpus.open_run":  # o is offered on the footer for a run's process only
            row = self.selected()
            if row is None or row.run is None:
                return None
        return description

    def __init__(self) -> None:
        super().__init__(name="gpus")
        self.snapshot: BoxSnapshot | None = None
        self.compact_chosen = False  # c: compact lines even where full cards fit
        self.links: dict[int, RunLink] = {}
        self.rows: dict[str, ProcRow] = {}  # the process table's rows, in order, by row key
        self.column_widths: dict[str, int] = {}
        self.selecting = False  # a process is selected (nvitop's selection mode)
        self.selected_key: str | None = None
        self._linker = RunLinker()
        self._linker_lock = threading.Lock()  # link workers may overlap; the linker caches run records

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(t("gpuscreen.waiting"), id="gpu-status")
        yield Static("", id="host-strip")
        yield Vertical(id="gpu-cards")
        table = ProcessTable(id="gpu-procs", cursor_type="row", zebra_stripes=False, cell_padding=CELL_PADDING,
                             show_cursor=False)
        yield table
        yield Static("", id="gpu-proc-detail")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.title = t("app.title")
        self.sub_title = t("app.mode.gpus")
        self._fill_processes()
        self.app.watch_gpus(self)  # type: ignore[attr-defined]

    def on_unmount(self) -> None:
        self.app.unwatch_gpus(self)  # type: ignore[attr-defined]

    def on_screen_resume(self) -> None:
        self.app.gpu_screens_changed()  # type: ignore[attr-defined]

    def on_screen_suspend(self) -> None:
        self.app.gpu_screens_changed()  # type: ignore[attr-defined]

    @property
    def interval_s(self) -> float:
        """The app's poll interval (+ and - change it for every screen: there is one poll)."""
        return self.app.gpu_interval_s  # type: ignore[attr-defined]

    @interval_s.setter
    def interval_s(self, seconds: float) -> None:
        self.app.set_gpu_interval(seconds)  # type: ignore[attr-defined]

    # --- the app's snapshots; run links in a worker thread -------------------------------------------
    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        had_gpus = self._has_gpus()
        self.snapshot = message.snapshot
        if self._has_gpus() != had_gpus:  # the GPU keys come (or go) with the GPUs
            self.refresh_bindings()
        self._show(message.snapshot)
        self._link_runs(message.snapshot)

    @work(thread=True, exclusive=True, group="gpu-links", exit_on_error=False)
    def _link_runs(self, snapshot: BoxSnapshot) -> None:
        try:
            with self._linker_lock:
                links = self._linker.link(p for g in snapshot.gpus for p in g.processes)
        except OSError:
            return  # an unreadable runs directory: the processes still show, with the last links
        self.post_message(RunsLinked(links))

    def on_runs_linked(self, message: RunsLinked) -> None:
        if message.links == self.links:
            return
        self.links = message.links
        if self.snapshot is not None:
            self._update_processes(self.snapshot)

    def on_gpu_poll_failed(self, message: GpuPollFailed) -> None:
        error = message.error
        self.query_one("#gpu-status", Static).update(
            f"[b $error]{t('gpuscreen.poll_failed')}[/] {escape(type(error).__name__)}: {escape(str(error))}\n"
            f"[$foreground-muted]{t('gpuscreen.unavailable_hint')}[/]"
        )

    def on_worker_state_changed(self, event) -> None:
        """This screen's workers (run links, signals) that failed: a notification for what may fail,
        the error modal for anything else."""
        from textual.worker import WorkerState

        from tui.screens.error_modal import report_unexpected

        error = event.worker.error
        if event.state != WorkerState.ERROR or error is None or event.worker.group not in ("gpu-links", "gpu-signal"):
            return
        if not isinstance(error, expected_errors()):
            report_unexpected(self.app, error, f"gpus.{event.worker.name}")
        elif event.worker.group == "gpu-signal":
            self.notify(f"{t('gpuscreen.signal_failed')} {type(error).__name__}: {error}", severity="error",
                        markup=False)
        else:
            self.notify(f"{t('gpuscreen.poll_failed')} {type(error).__name__}: {error}", severity="error",
                        markup=False)

    # --- presentation --------------------------------------------------------------------------------
    def _show(self, snapshot: BoxSnapshot) -> None:
        self._show_status(snapshot)
        self.query_one("#host-strip", Static).update(self._host_line(snapshot))
        self._update_cards(snapshot)
        self._update_processes(snapshot)

    def _show_status(self, snapshot: BoxSnapshot) -> None:
        """The summary line (or why there are no readings), after what says the GPUs are fake, if they are:
        on the same line, where the topology gives way when both do not fit, so that no card moves down."""
        status = self.query_one("#gpu-status", Static)
        note = replay_note(self.app.monitor, snapshot)
        marked = "" if note is None else f"[b $warning]{escape(note)}[/]"
        if snapshot.nvml_error is not None:
            status.update(
                f"[b $error]{t('gpuscreen.unavailable_title')}[/]{' · ' + marked if marked else ''}\n"
                f"{snapshot.nvml_error.message}\n[$foreground-muted]{t('gpuscreen.unavailable_hint')}[/]"
            )
            status.add_class("-error")
            return
        line = t(plural_key("gpuscreen.summary", len(snapshot.gpus)), count=len(snapshot.gpus), driver=snapshot.driver_version or t("gpuscreen.na"),
                 cuda=snapshot.cuda_driver_version or t("gpuscreen.na"))
        if snapshot.topology is not None and len(snapshot.gpus) > 1:
            links = snapshot.topology.matrix()
            kinds = Counter(links[i][j] for i in range(len(links)) for j in range(i + 1, len(links)))
            topology = f" · {t('gpuscreen.topology')} " + " ".join(f"{kind}×{n}" for kind, n in kinds.most_common())
            width = (self.size.width or self.app.size.width) - 2  # the status's padding
            if note is None or cell_len(f"{note} · {line}{topology}") <= width:
                line += topology
        if note is not None:
            line = f"{marked} · {line}"
        if snapshot.pid_namespace_mismatch:
            line += f"\n[$warning]{t('gpuscreen.pid_mismatch')}[/]"
        status.update(truncate(line, 10_000))
        status.remove_class("-error")

    def _host_line(self, snapshot: BoxSnapshot) -> str:
        """CPU, RAM, load and the disks on one line that fits the screen (80 columns): where the hub caches'
        disks do not fit beside the rest, the load gives way, then the caches go by the hubs' short names
        without "cache", then the CPU and RAM bars (their figures stay)."""
        host = snapshot.host
        ram = None
        if host.memory_total_bytes and host.memory_used_bytes is not None:
            ram = host.memory_used_bytes / host.memory_total_bytes
        cpu = None if host.cpu_percent is None else host.cpu_percent / 100
        load = " ".join(f"{x:.1f}" for x in host.load_average) or t("gpuscreen.na")
        head = (
            f"[$primary]{t('gpuscreen.cpu')}[/] [{level_variable(cpu)}]{bar(cpu, 6)}[/]{_num(host.cpu_percent, suffix='%'):>4}"
            f"  [$primary]{t('gpuscreen.ram')}[/] [{level_variable(ram)}]{bar(ram, 6)}[/] "
            f"{_gib(host.memory_used_bytes)}/{_gib(host.memory_total_bytes)}G"
        )
        barless = (
            f"[$primary]{t('gpuscreen.cpu')}[/] [{level_variable(cpu)}]{_num(host.cpu_percent, suffix='%')}[/]"
            f"  [$primary]{t('gpuscreen.ram')}[/] [{level_variable(ram)}]"
            f"{_gib(host.memory_used_bytes)}/{_gib(host.memory_total_bytes)}G[/]"
        )
        load_part = f"  [$primary]{t('gpuscreen.load')}[/] {load}"
        if host.disk_error:  # its disk is not known (`tunedeck gpus` says why and what to do)
            disk_parts = [f"  [$warning]{t('gpuscreen.disk_unreadable')}[/]"]
        elif not host.cache_disks:
            disk_parts = [f"  [$primary]{t('gpuscreen.disk')}[/] {format_disk(host.disk_free_bytes)}"]
        else:  # the hub caches on other disks than the data root's: a download fills theirs, each is named
            data = t("gpuscreen.disk_data", free=format_disk(host.disk_free_bytes))
            disk_parts = [f"  [$primary]{t('gpuscreen.disks')}[/] "
                          + " · ".join([data, *(_cache_disk_label(disk, short) for disk in host.cache_disks)])
                          for short in (False, True)]
        candidates = [head + load_part + disk_parts[0], *(head + part for part in disk_parts),
                      barless + disk_parts[-1]]
        width = self.size.width - 2  # the strip's padding
        if width <= 0:
            return candidates[0]
        return next((line for line in candidates if cell_len(_MARKUP_TAG.sub("", line)) <= width), candidates[-1])

    def _compact_wanted(self, count: int) -> bool:
        return self.compact_chosen or self._full_cards_lines(count) > self.size.height

    def _full_cards_lines(self, count: int, selecting: bool | None = None) -> int:
        """Lines the screen needs with full cards: the cards, with at least five process rows under them
        (and, while a process is selected, its detail), so that a selected process is never off screen."""
        columns = self._columns(count)
        rows = math.ceil(count / columns) if count else 0
        status = max(1, self.query_one("#gpu-status").outer_size.height)
        selecting = self.selecting if selecting is None else selecting
        return rows * CARD_HEIGHT + LIST_RESERVE_LINES + status + (DETAIL_RESERVE_LINES if selecting else 0)

    def _columns(self, count: int) -> int:
        return max(1, min(count, self.size.width // CARD_MIN_WIDTH, 4)) if count else 1

    def _update_cards(self, snapshot: BoxSnapshot, record: bool = True) -> None:
        """Lay the cards out for the GPU count and terminal size; ``record`` adds the readings."""
        container = self.query_one("#gpu-cards", Vertical)
        cards = {card.index: card for card in container.query(GpuCard)}
        wanted = [gpu.index for gpu in snapshot.gpus]
        if sorted(cards) != sorted(wanted):
            container.remove_children()
            cards = {index: GpuCard(index, self.app.gpu_history) for index in wanted}  # type: ignore[attr-defined]
            container.mount_all(cards.values())
        compact = self._compact_wanted(len(wanted))
        columns = 1 if compact else self._columns(len(wanted))
        container.set_class(compact, "-compact")
        container.styles.grid_size_columns = columns
        for gpu in snapshot.gpus:
            card = cards[gpu.index]
            card.set_class(compact, "-compact")
            if record:
                card.record(gpu)

    # --- the process table -----------------------------------------------------------------------------
    def _update_processes(self, snapshot: BoxSnapshot) -> None:
        rows: dict[str, ProcRow] = {}
        for gpu in snapshot.gpus:
            for proc in gpu.processes:
                # NVML lists a pid once per context (several contexts, MIG instances): each is a row, as
                # `tunedeck gpus` lists them; a repeat's key counts it, so each keeps its selection.
                key = base = f"{gpu.index}:{proc.pid}"
                repeat = 1
                while key in rows:
                    key, repeat = f"{base}:{repeat}", repeat + 1
                elapsed = None if proc.started_at is None else max(0.0, snapshot.taken_at - proc.started_at)
                rows[key] = ProcRow(key, gpu.index, proc, self.links.get(proc.pid) if proc.visible else None,
                                    elapsed)
        self.rows = rows
        self._fill_processes()

    def _cells(self, row: ProcRow) -> dict[str, str]:
        proc = row.process
        if proc.visible:
            user = truncate(proc.user or t("gpuscreen.na"), USER_MAX_WIDTH)
            command = _list_command(proc.command or t("gpuscreen.na"))
        else:
            user = UNKNOWN
            command = t(f"gpuscreen.hidden_{proc.hidden_reason or 'not_in_namespace'}")
        return {
            "gpu": str(row.gpu),
            "pid": str(proc.pid),
            "user": user,
            "gpu_mem": format_memory(proc.used_memory_bytes),
            "cpu": UNKNOWN if proc.cpu_percent is None else f"{proc.cpu_percent:.0f}",
            "host_mem": format_memory(proc.host_memory_bytes),
            "elapsed": format_duration(row.elapsed_s),
            "command": command,
        }

    def _table_width(self, table: DataTable) -> int:
        """Cells a row may use: the table's width less the vertical scrollbar's gutter (always kept)."""
        width = table.size.width or self.size.width or self.app.size.width
        return max(1, width - table.styles.scrollbar_size_vertical)

    def _fill_processes(self) -> None:
        """Show ``self.rows``: columns from the data and the width, the selection kept on its process."""
        table = self.query_one("#gpu-procs", DataTable)
        cells = {key: self._cells(row) for key, row in self.rows.items()}
        natural = {c.key: max([cell_len(t(c.label)), *(cell_len(row[c.key]) for row in cells.values())])
                   for c in PROC_COLUMNS}
        layout = fit_process_columns(self._table_width(table), natural)
        old_index = table.cursor_row
        keys = list(self.rows)
        same_rows = [str(k.value) for k in table.rows] == keys
        if layout != self.column_widths or not table.columns:
            table.clear(columns=True)
            for column in PROC_COLUMNS:
                if column.key in layout:
                    table.add_column(truncate(t(column.label), layout[column.key]), key=column.key,
                                     width=layout[column.key])
            self.column_widths = layout
            same_rows = False
        variables = self.app.theme_variables
        accent = variables.get("accent") or ""

        def texts(key: str) -> list[Text]:
            row, values = self.rows[key], cells[key]
            out = []
            for column in PROC_COLUMNS:
                if column.key not in layout:
                    continue
                width = layout[column.key]
                if column.key == "command" and row.run is not None:
                    # Text, not str: a DataTable parses str cells as markup, and commands hold brackets.
                    text = Text(_run_label(row.run.run_id, width), style=f"bold {accent}".strip())
                    text.append(" " + values["command"])
                    text.truncate(width, overflow="ellipsis")
                else:
                    # A pid of another namespace reads as a note, not a command (dim: no theme colour
                    # with an alpha is a Rich colour).
                    style = "dim" if column.key == "command" and not row.process.visible else ""
                    text = Text(truncate(values[column.key], width), style=style,
                                justify="right" if column.right else "left")
                out.append(text)
            return out

        if same_rows:
            for key in keys:
                for column_key, text in zip(layout, texts(key), strict=True):
                    table.update_cell(key, column_key, text)
        else:
            table.clear()
            for key in keys:
                table.add_row(*texts(key), key=key)
        if not keys:
            self._set_selecting(False)
            return
        if self.selected_key in self.rows:
            index = keys.index(self.selected_key)
        else:  # the selected process went away: the row now at its place is selected
            index = min(max(old_index, 0), len(keys) - 1)
            if self.selecting:
                self.selected_key = keys[index]
        if table.cursor_row != index:
            table.move_cursor(row=index, animate=False)
        self._show_detail()

    def selected(self) -> ProcRow | None:
        """The selected process, or None when none is (the list is not in selection mode)."""
        if not self.selecting or self.selected_key is None:
            return None
        return self.rows.get(self.selected_key)

    def start_selecting(self) -> None:
        """Select a process (the one under the cursor) and offer what can be done with it."""
        table = self.query_one("#gpu-procs", DataTable)
        if not self.rows:
            unlisted = [str(g.index) for g in self.snapshot.gpus if not g.processes_known] if self.snapshot else []
            # "No compute processes" only where NVML listed none: a GPU whose list it refused may be busy
            self.notify(t("gpuscreen.procs_unknown", gpus=", ".join(unlisted)) if unlisted else t("gpuscreen.no_procs"),
                        timeout=3)
            return
        table.focus()
        keys = list(self.rows)
        self.selected_key = keys[min(max(table.cursor_row, 0), len(keys) - 1)]
        self._set_selecting(True)

    def _set_selecting(self, on: bool) -> None:
        table = self.query_one("#gpu-procs", DataTable)
        if not on:
            self.selected_key = None
        changed = on != self.selecting
        self.selecting = on
        table.show_cursor = on
        self._show_detail()
        if changed:
            self.refresh_bindings()
            if self.snapshot is not None:  # the cards may fold to make room for the detail
                self._update_cards(self.snapshot, record=False)
            self.call_after_refresh(self._show_detail)  # sized again from the new layout
            if not on:
                self.scroll_home(animate=False)  # the cards again, where the selection had scrolled them off

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key is not None else None
        if self.selecting and key in self.rows and key != self.selected_key:
            self.selected_key = key
            self._show_detail()
            self.refresh_bindings()  # o follows the process: offered for a run's process only

    def _detail_room(self) -> int:
        """Lines the detail may take: what the cards, the status and a table of every process leave."""
        used = 2 + 1  # header and footer, the host strip
        for selector in ("#gpu-status", "#gpu-cards"):
            used += self.query_one(selector).outer_size.height
        used += max(3, min(1 + len(self.rows), 6))  # the table: its header and a few rows, or all
        return max(2, min(DETAIL_MAX_LINES, (self.size.height or self.app.size.height) - used))

    def _show_detail(self) -> None:
        """The selected process under the list: PID, start and run, then its command line, wrapped."""
        detail = self.query_one("#gpu-proc-detail", Static)
        row = self.selected()
        detail.set_class(row is not None, "-shown")
        if row is None:
            detail.update("")
            return
        proc = row.process
        width = max(20, (self.size.width or self.app.size.width) - 2)
        # The head line by importance (it is cut at the width): which process, its run, more, its start.
        head = [f"PID {proc.pid}"]
        if proc.visible:
            if row.run is not None:
                role = "gpuscreen.detail.run_trainer" if row.run.role == TRAINER else "gpuscreen.detail.run_worker"
                # with the key that opens its dashboard
                head.append(t(role, run=row.run.run_id) + t("gpuscreen.detail.open_key"))
            body = one_line(proc.command or t("gpuscreen.na"))
        else:
            body = t(f"gpuscreen.hidden_{proc.hidden_reason or 'not_in_namespace'}")
        # Wrapped here, by cells, so that the lines shown are exactly the lines counted.
        starts = wrap_points(body, width)
        lines = [body[a:b] for a, b in zip(starts, [*starts[1:], len(body)], strict=True)]
        room = self._detail_room() - 1
        if len(lines) > room:
            lines = [*lines[: room - 1], truncate(lines[room - 1] + " …", width)]
            head.append(t("gpuscreen.detail.more_hint"))
        if proc.visible and proc.started_at is not None:
            head.append(t("gpuscreen.detail.started", time=self._short_time(proc.started_at)))
        detail.styles.height = 1 + len(lines)
        text = Text(truncate(" · ".join(head), width), style=f"bold {self.app.theme_variables.get('primary', '')}".strip())
        for line in lines:
            text.append("\n" + line)
        detail.update(text)
        self.call_after_refresh(self._reveal_selection)

    def _reveal_selection(self) -> None:
        """Where even compact lines leave the list no room (a terminal a dozen lines high), the screen
        scrolls to its end: the list, its selected row (the table keeps it in its own view) and the detail
        stay on screen, so k and Enter never act on a process out of sight."""
        if self.selected() is not None and self.max_scroll_y > 0:
            self.scroll_end(animate=False, x_axis=False)

    @staticmethod
    def _clock_time(when: float) -> str:
        return datetime.fromtimestamp(when).strftime("%Y-%m-%d %H:%M:%S")

    def _short_time(self, when: float) -> str:
        """``14:03:27`` on the day of the snapshot, ``11-29 14:03`` before it (local time)."""
        day = datetime.fromtimestamp(self.snapshot.taken_at if self.snapshot else time.time()).date()
        moment = datetime.fromtimestamp(when)
        return moment.strftime("%H:%M:%S" if moment.date() == day else "%m-%d %H:%M")

    def on_resize(self) -> None:
        if self.snapshot is not None:
            self._show_status(self.snapshot)  # the topology shows again where the width has room for it
            # the load gives way to the hub caches' disks by the width (80 columns): laid out again for it
            self.query_one("#host-strip", Static).update(self._host_line(self.snapshot))
            self._update_cards(self.snapshot, record=False)
        # Columns drop or come back with the width; the table's new size is known after this refresh.
        self.call_after_refresh(self._fill_processes)

    # --- actions -------------------------------------------------------------------------------------
    GPU_ACTIONS = ("toggle_compact", "focus_processes", "interval")

    def _has_gpus(self) -> bool:
        return self.snapshot is not None and bool(self.snapshot.gpus)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Process actions only while a process is selected (o too: on a process that is no run of this
        box it says why; the footer offers it for a run's process only); p outside. Without GPUs, the
        keys of the cards, the processes and the poll speed are not offered: there is nothing to act on."""
        if action in self.GPU_ACTIONS and not self._has_gpus():
            return False
        if action in self.PROCESS_ACTIONS or action == "open_run":
            return self.selected() is not None
        if action == "focus_processes":
            return not self.selecting
        return True

    def action_interval(self, factor: float) -> None:
        self.interval_s = min(10.0, max(MIN_POLL_INTERVAL_S, self.interval_s * factor))  # the app's poll
        self.notify(t("gpuscreen.interval", seconds=self.interval_s), timeout=2)

    def action_toggle_compact(self) -> None:
        """Compact lines, or full cards where they leave the process list (and a selected process) its
        room; where they would not, say why rather than push the processes that k and Enter act on off
        the screen. Full cards asked for come as soon as they fit (Esc, a taller terminal)."""
        count = len(self.snapshot.gpus) if self.snapshot else 0
        if not self._compact_wanted(count):
            self.compact_chosen = True
        else:
            self.compact_chosen = False
            need, have = self._full_cards_lines(count), self.size.height
            if need > have:
                if self.selecting and self._full_cards_lines(count, selecting=False) <= have:
                    self.notify(t("gpuscreen.full_after_selection"), timeout=4)
                else:
                    self.notify(t("gpuscreen.full_no_room", need=need, have=have), timeout=4)
        if self.snapshot is not None:
            self._update_cards(self.snapshot, record=False)

    def action_focus_processes(self) -> None:
        self.start_selecting()

    def action_unselect(self) -> None:
        self._set_selecting(False)

    def action_details(self) -> None:
        from tui.widgets.text_modal import TextModal

        row = self.selected()
        if row is None:
            return
        proc = row.process
        lines = [t("gpuscreen.details.where", gpu=row.gpu, user=proc.user or t("gpuscreen.na"),
                   memory=format_memory(proc.used_memory_bytes))]
        if proc.visible:
            started = UNKNOWN if proc.started_at is None else self._clock_time(proc.started_at)
            lines.append(t("gpuscreen.details.usage",
                           cpu=UNKNOWN if proc.cpu_percent is None else f"{proc.cpu_percent:.0f}%",
                           ram=format_memory(proc.host_memory_bytes), started=started,
                           elapsed=format_duration(row.elapsed_s)))
            if row.run is not None:
                role = "gpuscreen.detail.run_trainer" if row.run.role == TRAINER else "gpuscreen.detail.run_worker"
                lines += [t(role, run=row.run.run_id), row.run.run_dir]
            lines += ["", t("gpuscreen.details.command"), proc.command or t("gpuscreen.na")]
        else:
            lines += ["", t(f"gpuscreen.hidden_{proc.hidden_reason or 'not_in_namespace'}")]
        lines += ["", t("gpuscreen.details.keys")]
        self.app.push_screen(TextModal(t("gpuscreen.details_title", pid=proc.pid), "\n".join(lines)))

    def action_open_run(self) -> None:
        from tui.screens.runs import open_dashboard

        row = self.selected()
        if row is None:
            return
        if row.run is None:  # say why nothing opens: only runs of this box's tunedeck have a dashboard
            from core.paths import runs_dir

            self.notify(t("gpuscreen.no_run", pid=row.process.pid, runs=str(runs_dir())), severity="warning",
                        markup=False)
            return
        open_dashboard(self.app, row.run.run_dir)

    # --- signalling ----------------------------------------------------------------------------------
    def action_kill(self, force: bool) -> None:
        row = self.selected()
        if row is not None:
            self._check_signal(row, force)

    @work(thread=True, group="gpu-signal", exit_on_error=False)
    def _check_signal(self, row: ProcRow, force: bool) -> None:
        from core.hardware.process_control import SignalRefused, check_signal

        try:
            target = check_signal(row.process)
        except SignalRefused as refused:
            self.post_message(SignalChecked(row, force, None, str(refused)))
            return
        self.post_message(SignalChecked(row, force, target, None))

    def on_signal_checked(self, message: SignalChecked) -> None:
        from core.hardware.process_control import signal_name
        from tui.widgets.confirm import ConfirmScreen

        if message.refusal is not None:
            self.notify(message.refusal, severity="warning", markup=False)
            return
        row, force, target = message.row, message.force, message.target
        proc = row.process
        signal = signal_name(force)
        parts = [t("gpuscreen.kill_where", pid=proc.pid, user=proc.user or t("gpuscreen.na"), gpu=row.gpu),
                 truncate(one_line(proc.command or t("gpuscreen.na")), 240), "",
                 t("gpuscreen.kill_explain_kill" if force else "gpuscreen.kill_explain_term")]
        if row.run is not None:
            parts.append(t("gpuscreen.kill_run_note", run=row.run.run_id))

        def answered(ok: bool | None) -> None:
            if ok:
                self._send_signal(target, force)

        self.app.push_screen(ConfirmScreen(t("gpuscreen.kill_title", signal=signal, pid=proc.pid),
                                           "\n".join(parts)), answered)

    @work(thread=True, group="gpu-signal", exit_on_error=False)
    def _send_signal(self, target, force: bool) -> None:
        from core.hardware.process_control import SignalRefused, send_signal, wait_until_ended

        try:
            signal = send_signal(target, force=force)
        except SignalRefused as refused:
            self.post_message(SignalOutcome(str(refused), "warning"))
            return
        self.post_message(SignalOutcome(t("gpuscreen.signal_sent", signal=signal, pid=target.pid)))
        ended = wait_until_ended(target, SIGNAL_WAIT_S)
        self.app.poll_gpus_now()  # type: ignore[attr-defined]  # the list drops the process now, not a second later
        if ended:
            self.post_message(SignalOutcome(t("gpuscreen.signal_ended", pid=target.pid)))
        else:
            self.post_message(SignalOutcome(t("gpuscreen.signal_still_running", pid=target.pid, signal=signal,
                                              seconds=f"{SIGNAL_WAIT_S:.0f}"), "warning"))

    def on_signal_outcome(self, message: SignalOutcome) -> None:
        self.notify(message.text, severity=message.severity, markup=False)
