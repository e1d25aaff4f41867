"""The GPU screen: a card per GPU with bars and a rolling history, processes, the host.

A worker thread polls the hardware monitor (1 Hz by default, never faster than every 0.25 s) and posts
each snapshot; only the message handler touches widgets, so input never waits on NVML.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import DataTable, Header, Static
from textual.worker import get_current_worker

from core.hardware.snapshot import BoxSnapshot, GpuSnapshot
from core.i18n import t
from core.settings import MIN_POLL_INTERVAL_S
from core.text_width import cell_len, pad, truncate
from core.units import format_disk, plural_key
from tui.widgets.bar import bar, level_variable
from tui.widgets.history import history_rows
from tui.widgets.keys_footer import KeysFooter

HISTORY_SAMPLES = 600  # ten minutes at 1 Hz
CARD_HEIGHT = 7  # border + five lines
CARD_MIN_WIDTH = 60
GIB = 1024**3


def _gib(value: int | None) -> str:
    if value is None:
        return t("gpuscreen.na")
    gib = value / GIB
    return f"{gib:.0f}" if gib >= 100 else f"{gib:.1f}"


def _num(value: float | int | None, fmt: str = "{:.0f}", suffix: str = "") -> str:
    return t("gpuscreen.na") if value is None else fmt.format(value) + suffix


class SnapshotReady(Message):
    """A new poll of the box."""

    def __init__(self, snapshot: BoxSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot

    def can_replace(self, message: Message) -> bool:
        # Only the latest reading matters: a queued older one is dropped.
        return isinstance(message, SnapshotReady)


class GpuCard(Widget):
    """One GPU: full card (bars, two history rows, details) or one compact line."""

    DEFAULT_CSS = """
    GpuCard { height: 7; border: round $panel-lighten-2; padding: 0 1; border-title-color: $primary; }
    GpuCard.-compact { height: 1; border: none; padding: 0; }
    """

    def __init__(self, index: int) -> None:
        super().__init__(id=f"gpu-{index}")
        self.index = index
        self.gpu: GpuSnapshot | None = None
        self.util_history: deque[float | None] = deque(maxlen=HISTORY_SAMPLES)
        self.mem_history: deque[float | None] = deque(maxlen=HISTORY_SAMPLES)

    def record(self, gpu: GpuSnapshot) -> None:
        self.gpu = gpu
        self.util_history.append(gpu.utilization_gpu_pct)
        frac = gpu.memory_used_fraction
        self.mem_history.append(None if frac is None else frac * 100)
        self.border_title = f"{gpu.index} · {gpu.name or t('gpuscreen.na')}"
        self.border_subtitle = (
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
            t("gpuscreen.procs_count", count=len(gpu.processes)),
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

    BINDINGS = [
        # In the footer before the app's section keys (KeysFooter drops what does not fit, ? stays).
        Binding("c", "toggle_compact", t("gpuscreen.key.compact"), id="gpus.compact"),
        Binding("p", "focus_processes", t("gpuscreen.key.processes"), id="gpus.processes"),
        Binding("plus", "interval(2.0)", t("gpuscreen.key.interval_up"), key_display="+", id="gpus.slower"),
        Binding("minus", "interval(0.5)", t("gpuscreen.key.interval_down"), key_display="-", id="gpus.faster"),
    ]

    def footer_priority(self) -> tuple[str, ...]:
        """Binding ids in the order the footer keeps them when the line is short."""
        return ("gpus.compact", "gpus.processes", "gpus.slower", "gpus.faster")

    def __init__(self) -> None:
        super().__init__(name="gpus")
        self.snapshot: BoxSnapshot | None = None
        self.forced_compact: bool | None = None
        self.interval_s = 1.0

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(t("gpuscreen.waiting"), id="gpu-status")
        yield Static("", id="host-strip")
        yield Vertical(id="gpu-cards")
        table: DataTable = DataTable(id="gpu-procs", cursor_type="row", zebra_stripes=False)
        table.add_columns(t("gpuscreen.col_gpu"), t("gpuscreen.col_pid"), t("gpuscreen.col_user"),
                          t("gpuscreen.col_mem"), t("gpuscreen.col_command"))
        yield table
        yield KeysFooter()

    def on_mount(self) -> None:
        self.title = t("app.title")
        self.sub_title = t("app.mode.gpus")
        self.interval_s = max(MIN_POLL_INTERVAL_S, self.app.settings.gpu_poll_interval_s)
        self.poll_hardware()

    # --- polling in a worker thread ----------------------------------------------------------------
    @work(thread=True, exclusive=True, group="gpu-poll", exit_on_error=False)
    def poll_hardware(self) -> None:
        worker = get_current_worker()
        monitor = self.app.monitor
        while not worker.is_cancelled:
            started = time.monotonic()
            snapshot = monitor.poll()
            self.post_message(SnapshotReady(snapshot))
            # Reschedule after the poll finished: polls never overlap, whatever NVML's latency.
            delay = max(MIN_POLL_INTERVAL_S, self.interval_s) - (time.monotonic() - started)
            end = time.monotonic() + max(0.0, delay)
            while not worker.is_cancelled and time.monotonic() < end:
                time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def on_worker_state_changed(self, event) -> None:
        from textual.worker import WorkerState

        if event.worker.group == "gpu-poll" and event.state == WorkerState.ERROR:
            error = event.worker.error
            self.query_one("#gpu-status", Static).update(
                f"[b $error]{t('gpuscreen.poll_failed')}[/] {type(error).__name__}: {error}\n"
                f"[$foreground-muted]{t('gpuscreen.unavailable_hint')}[/]"
            )

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self.snapshot = message.snapshot
        self._show(message.snapshot)

    # --- presentation --------------------------------------------------------------------------------
    def _show(self, snapshot: BoxSnapshot) -> None:
        status = self.query_one("#gpu-status", Static)
        if snapshot.nvml_error is not None:
            status.update(
                f"[b $error]{t('gpuscreen.unavailable_title')}[/]\n{snapshot.nvml_error.message}\n"
                f"[$foreground-muted]{t('gpuscreen.unavailable_hint')}[/]"
            )
            status.add_class("-error")
        else:
            line = t(plural_key("gpuscreen.summary", len(snapshot.gpus)), count=len(snapshot.gpus), driver=snapshot.driver_version or t("gpuscreen.na"),
                     cuda=snapshot.cuda_driver_version or t("gpuscreen.na"))
            if snapshot.topology is not None and len(snapshot.gpus) > 1:
                links = snapshot.topology.matrix()
                kinds = Counter(links[i][j] for i in range(len(links)) for j in range(i + 1, len(links)))
                line += f" · {t('gpuscreen.topology')} " + " ".join(f"{kind}×{n}" for kind, n in kinds.most_common())
            if snapshot.pid_namespace_mismatch:
                line += f"\n[$warning]{t('gpuscreen.pid_mismatch')}[/]"
            status.update(truncate(line, 10_000))
            status.remove_class("-error")
        self.query_one("#host-strip", Static).update(self._host_line(snapshot))
        self._update_cards(snapshot)
        self._update_processes(snapshot)

    def _host_line(self, snapshot: BoxSnapshot) -> str:
        host = snapshot.host
        ram = None
        if host.memory_total_bytes and host.memory_used_bytes is not None:
            ram = host.memory_used_bytes / host.memory_total_bytes
        cpu = None if host.cpu_percent is None else host.cpu_percent / 100
        load = " ".join(f"{x:.1f}" for x in host.load_average) or t("gpuscreen.na")
        return (
            f"[$primary]{t('gpuscreen.cpu')}[/] [{level_variable(cpu)}]{bar(cpu, 6)}[/]{_num(host.cpu_percent, suffix='%'):>4}"
            f"  [$primary]{t('gpuscreen.ram')}[/] [{level_variable(ram)}]{bar(ram, 6)}[/] "
            f"{_gib(host.memory_used_bytes)}/{_gib(host.memory_total_bytes)}G"
            f"  [$primary]{t('gpuscreen.load')}[/] {load}"
            f"  [$primary]{t('gpuscreen.disk')}[/] {format_disk(host.disk_free_bytes)}"
        )

    def _compact_wanted(self, count: int) -> bool:
        if self.forced_compact is not None:
            return self.forced_compact
        columns = self._columns(count)
        rows = math.ceil(count / columns) if count else 0
        # Keep at least five lines for processes under header, status, host strip and footer.
        return rows * CARD_HEIGHT + 10 > self.size.height

    def _columns(self, count: int) -> int:
        return max(1, min(count, self.size.width // CARD_MIN_WIDTH, 4)) if count else 1

    def _update_cards(self, snapshot: BoxSnapshot, record: bool = True) -> None:
        """Lay the cards out for the GPU count and terminal size; ``record`` adds the readings."""
        container = self.query_one("#gpu-cards", Vertical)
        cards = {card.index: card for card in container.query(GpuCard)}
        wanted = [gpu.index for gpu in snapshot.gpus]
        if sorted(cards) != sorted(wanted):
            container.remove_children()
            cards = {index: GpuCard(index) for index in wanted}
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

    def _update_processes(self, snapshot: BoxSnapshot) -> None:
        table = self.query_one("#gpu-procs", DataTable)
        table.clear()
        for gpu in snapshot.gpus:
            for proc in gpu.processes:
                if proc.visible:
                    user = proc.user or t("gpuscreen.na")
                    command = " ".join((proc.command or t("gpuscreen.na")).split())
                else:
                    user = "—"
                    command = t(f"gpuscreen.hidden_{proc.hidden_reason or 'not_in_namespace'}")
                mem = "—" if proc.used_memory_bytes is None else f"{proc.used_memory_bytes / GIB:.1f} GiB"
                table.add_row(str(gpu.index), str(proc.pid), user, mem, command, key=f"{gpu.index}:{proc.pid}")

    def on_resize(self) -> None:
        if self.snapshot is not None:
            self._update_cards(self.snapshot, record=False)

    # --- actions -------------------------------------------------------------------------------------
    def action_interval(self, factor: float) -> None:
        self.interval_s = min(10.0, max(MIN_POLL_INTERVAL_S, self.interval_s * factor))
        self.notify(t("gpuscreen.interval", seconds=self.interval_s), timeout=2)

    def action_toggle_compact(self) -> None:
        current = self._compact_wanted(len(self.snapshot.gpus) if self.snapshot else 0)
        self.forced_compact = not current
        if self.snapshot is not None:
            self._update_cards(self.snapshot, record=False)

    def action_focus_processes(self) -> None:
        self.query_one("#gpu-procs", DataTable).focus()
