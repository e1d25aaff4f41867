"""The Runs screen: every run under the data root, sortable and filterable; Enter opens its dashboard.

A worker lists the runs every two seconds (runs started from the CLI, another terminal or before the app
appear on their own; liveness turns dead active runs into crashed ones). Deleting asks first, shows the
disk it frees, and refuses an active run. ``on_app_start`` opens a dashboard at start and announces runs
that ended since the last visit.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Header, Input, Static
from textual.worker import get_current_worker

from core import units
from core.i18n import t
from core.runs import ACTIVE_STATES, RunState, can_stop, state_label
from core.runs.listing import name_part
from core.runs.liveness import foreign_host
from core.text_width import cell_len, truncate
from core.watch.figures import directory_size, format_bytes
from tui.widgets.keys_footer import KeysFooter

LIST_EVERY_S = 2.0
CELL_PADDING = 1  # the DataTable's, on each side of a cell
FLEX_FLOOR = 8  # the narrowest a flex column (run id, model) is still worth showing
# Room a live run's cells are given from its first listing, as they may grow to it: an ETA past an hour, a
# speed in the tens of thousands (the progress gets its full ``total/total 100%``).
LIVE_ROOM = {"eta": "0:00:00", "tokens": "00,000"}


@dataclass(frozen=True)
class RunColumn:
    """One column of the Runs table. ``priority``: lower stays longer as the screen narrows. A column
    joins with its content's width (at most ``max_width``); a ``flex`` one with at most ``reserve``
    cells, then grows towards its content with what the others leave."""

    key: str
    label: str  # i18n key
    sort: Callable[[Any], Any]
    priority: int
    flex: bool = False
    reserve: int = 0
    max_width: int = 40
    room_for: str = ""  # a flex column joins leaving room for this next one, while it stays FLEX_FLOOR wide


COLUMNS: tuple[RunColumn, ...] = (
    RunColumn("status", "runs_screen.col_status", lambda s: s.status, 0),
    RunColumn("id", "runs_screen.col_id", lambda s: s.id, 1, flex=True, reserve=20, max_width=48,
              room_for="progress"),
    RunColumn("model", "runs_screen.col_model", lambda s: s.model or "", 7, flex=True, reserve=16),
    RunColumn("method", "runs_screen.col_method", lambda s: s.method or "", 6, max_width=8),
    RunColumn("gpus", "runs_screen.col_gpus", lambda s: len(s.gpus), 9, max_width=9),
    RunColumn("progress", "runs_screen.col_progress",
              lambda s: (s.step or 0) / s.total_steps if s.total_steps else -1.0, 2, max_width=18),
    RunColumn("loss", "runs_screen.col_loss", lambda s: s.loss if s.loss is not None else float("inf"), 3),
    RunColumn("tokens", "runs_screen.col_tokens", lambda s: s.steady_tokens_per_s or 0.0, 4),
    RunColumn("started", "runs_screen.col_started", lambda s: s.created, 8),
    RunColumn("eta", "runs_screen.col_eta", lambda s: s.eta_s if s.eta_s is not None else float("inf"), 5),
)
STATUS_COLOURS = {RunState.RUNNING: "$success", RunState.STARTING: "$success",
                  RunState.QUEUED: "$foreground-muted", RunState.STALLED: "$warning",
                  RunState.STOPPING: "$warning", RunState.STOPPED: "$warning", RunState.FINISHED: "$primary",
                  RunState.FAILED: "$error", RunState.CRASHED: "$error"}
# At start the app opens the dashboard of a run that is under way (not one still queued or stalled).
OPEN_AT_START = frozenset({RunState.RUNNING, RunState.STARTING, RunState.STOPPING})




class RunsListed(Message):
    def __init__(self, runs: list[Any]) -> None:
        super().__init__()
        self.runs = runs

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RunsListed)


class DeleteChecked(Message):
    """A run's size, measured in a worker before asking to delete it, and its server if one runs."""

    def __init__(self, run_id: str, path: str, size: int, active: bool, served: Any = None) -> None:
        super().__init__()
        self.run_id = run_id
        self.path = path
        self.size = size
        self.active = active
        self.served = served  # core.lifecycle.serve.ServerState of the run's server, or None


class RunActed(Message):
    """What came of a stop or resume started from the list (posted from its worker)."""

    def __init__(self, text: str, severity: str = "information") -> None:
        super().__init__()
        self.text = text
        self.severity = severity


class WatchSourceOpened(Message):
    """From ``open_dashboard``'s worker to the app: the directory's watch source, or why there is none
    (``error``, shown as an error); its handler calls ``show_dashboard``. ``request``: which request it
    answers (``app.dashboard_request`` when it was asked); an answer to an older one is dropped."""

    def __init__(self, source: Any, error: str, standalone: bool, request: int) -> None:
        super().__init__()
        self.source = source
        self.error = error
        self.standalone = standalone
        self.request = request


class RunDeleted(Message):
    def __init__(self, text: str, severity: str = "information") -> None:
        super().__init__()
        self.text = text
        self.severity = severity


def _progress(step: int | None, total: int | None, unknown: bool = False) -> str:
    if step is None:
        return "–"
    if total:
        return f"{step}/{total} {100 * step / total:.0f}%"
    return f"{step}/{units.TOTAL_PENDING}" if unknown else str(step)  # a resume changed it, its trainer still loading


def _started(created: str) -> str:
    # "2026-11-29T23:01:05Z" -> "11-29 23:01"
    return f"{created[5:10]} {created[11:16]}" if len(created) >= 16 else created


def fit_id(run_id: str, width: int) -> str:
    """A run id in ``width`` cells: whole when it fits, else its name part without the date-time stamp
    (the Started column has it), cut with an ellipsis when even that is too long. Every command that takes a
    RUN accepts that name part (``core.runs.listing.name_part``) and its start."""
    if cell_len(run_id) <= width:
        return run_id
    return truncate(name_part(run_id) or run_id, width)


def fit_columns(width: int, natural: dict[str, int], columns: Sequence[RunColumn] = COLUMNS) -> dict[str, int]:
    """Which columns fit in ``width`` cells and how wide each is: {key: content width}, in table order.

    Columns join by priority while their width (a flex column's at most its reserve) and padding fit;
    then the flex columns grow, by priority, towards their content. The first column always stays. A flex
    column with ``room_for`` joins leaving room for that column when it can stay ``FLEX_FLOOR`` wide
    doing so (a narrow screen shows a short id and the progress, not a wider id alone)."""
    def wanted(column: RunColumn) -> int:
        return max(1, min(natural.get(column.key, 1), column.max_width))

    chosen: dict[str, int] = {}
    used = 0
    ordered = sorted(columns, key=lambda c: c.priority)
    by_key = {c.key: c for c in columns}
    for column in ordered:
        need = min(column.reserve, wanted(column)) if column.flex else wanted(column)
        left = width - used - 2 * CELL_PADDING
        if column.flex and need > left >= FLEX_FLOOR:
            need = left  # a narrow screen still gets a short id, cut with an ellipsis
        if column.flex and column.room_for in by_key:
            room = left - wanted(by_key[column.room_for]) - 2 * CELL_PADDING
            if FLEX_FLOOR <= room < need:
                need = room
        if chosen and used + need + 2 * CELL_PADDING > width:
            break  # columns drop strictly from the lowest priority up: no gap-filling with later ones
        chosen[column.key] = need
        used += need + 2 * CELL_PADDING
    for column in ordered:
        if column.flex and column.key in chosen:
            grow = max(0, min(wanted(column) - chosen[column.key], width - used))
            chosen[column.key] += grow
            used += grow
    return {c.key: chosen[c.key] for c in columns if c.key in chosen}


class RunsTable(DataTable, inherit_bindings=False):
    """The runs list. Enter is left to the screen's binding (open the run), not the table's row selection
    (a hidden binding that took the key), so the footer offers it. Home and End go to the first and the
    last run: DataTable's own scroll a row table sideways (nothing happened), and help listed them as
    "Home  Home" / "End  End"."""

    BINDINGS = [b for b in DataTable.BINDINGS if isinstance(b, Binding) and b.key not in ("enter", "home", "end")] + [
        Binding("home", "first_row", t("runs_screen.key.first"), show=False),
        Binding("end", "last_row", t("runs_screen.key.last"), show=False),
    ]

    def action_first_row(self) -> None:
        self.action_scroll_top()  # a row table: the cursor to the first row, scrolled into view

    def action_last_row(self) -> None:
        self.action_scroll_bottom()


class RunsScreen(Screen[None]):
    """Every run on this box, newest first by default."""

    DEFAULT_CSS = """
    RunsScreen #runs-status { height: 1; padding: 0 1; color: $foreground-muted; }
    RunsScreen #runs-filter { dock: bottom; }
    RunsScreen #runs-table { height: 1fr; scrollbar-gutter: stable; }
    RunsScreen #runs-empty { padding: 1 2; color: $foreground-muted; }
    """
    BINDINGS = [
        Binding("enter", "open", t("runs_screen.key.open"), id="runs.open"),
        Binding("s", "sort", t("runs_screen.key.sort"), id="runs.sort"),
        Binding("S", "reverse", t("runs_screen.key.reverse"), key_display="S", show=False, id="runs.reverse"),
        Binding("f", "filter", t("runs_screen.key.filter"), id="runs.filter"),
        Binding("d", "delete", t("runs_screen.key.delete"), id="runs.delete"),
        Binding("k", "stop", t("dashboard.key.stop"), id="runs.stop"),
        Binding("u", "resume", t("dashboard.key.resume"), id="runs.resume"),
        Binding("p", "probes", t("runs_screen.key.probes"), id="runs.probes"),
        Binding("escape", "clear_filter", t("runs_screen.key.clear"), show=False, id="runs.clear"),
    ]

    def __init__(self) -> None:
        super().__init__(name="runs")
        self.runs: list[Any] = []
        self.shown: list[Any] = []
        self.sort_column = 8  # started
        self.sort_reverse = True
        self.filter_text = ""
        # The wizard's probe runs (a few steps each to measure a plan) are hidden until p shows them, dimmed:
        # they are not the user's training, and each probe made several.
        self.show_probes = False
        self.listed = False
        self.column_widths: dict[str, int] = {}  # the columns shown now: {key: content width}
        # The widest each column's cells have been while the same runs are listed (see ``_natural``).
        self.widest: dict[str, int] = {}
        self.widest_for: frozenset[str] = frozenset()
        from core.watch.last_seen import EndsSeen

        self.ends_seen = EndsSeen()  # lives across the list worker's restarts (refresh_now after a stop)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(t("runs_screen.loading"), id="runs-status")
        yield RunsTable(id="runs-table", cursor_type="row", zebra_stripes=False, cell_padding=CELL_PADDING)
        yield Static(t("runs_screen.empty"), id="runs-empty")
        yield Input(placeholder=t("runs_screen.filter_placeholder"), id="runs-filter")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one("#runs-filter", Input).display = False
        self.query_one("#runs-empty", Static).display = False
        self._fill()
        self.list_runs_forever()

    def on_screen_resume(self) -> None:
        self.title = t("app.title")
        self.sub_title = t("app.mode.runs")
        self.call_after_refresh(self._fill)  # the terminal may have been resized under another screen

    def on_resize(self) -> None:
        # Columns drop or come back with the width; the table's new size is known after this refresh.
        self.call_after_refresh(self._fill)

    # --- listing ---------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="runs-list", exit_on_error=False)
    def list_runs_forever(self) -> None:
        from core.runs import list_runs

        worker = get_current_worker()
        while not worker.is_cancelled:
            runs = list_runs()
            self.ends_seen.shown(runs)  # a run the app shows finishing is no news at the next start
            self.post_message(RunsListed(runs))
            end = time.monotonic() + LIST_EVERY_S
            while not worker.is_cancelled and time.monotonic() < end:
                time.sleep(0.05)

    def refresh_now(self) -> None:
        self.list_runs_forever()

    def on_runs_listed(self, message: RunsListed) -> None:
        self.runs = message.runs
        self.listed = True
        self._fill()
        self.refresh_bindings()  # stop / resume follow the highlighted run's state

    def _cells(self, summary: Any) -> dict[str, str]:
        return {
            "status": state_label(summary.status),
            "id": summary.id,
            # A run.json that does not read: the run's model is unknown, and the status line says why.
            "model": t("runs.record_unreadable_short") if summary.record_error else summary.model or "–",
            "method": summary.method or "–",
            "gpus": ",".join(summary.physical_gpus) or "–",
            "progress": _progress(summary.step, summary.total_steps, summary.total_unknown),
            "loss": "–" if summary.loss is None else f"{summary.loss:.4f}",
            "tokens": units.format_rate(summary.steady_tokens_per_s),
            "started": _started(summary.created),
            "eta": units.format_duration(summary.eta_s) if summary.status in ACTIVE_STATES else units.UNKNOWN,
        }

    def _natural(self, cells: dict[str, dict[str, str]]) -> dict[str, int]:
        """Each column's content width, steady while the same runs are listed.

        A live run's progress, loss, speed and ETA change width from one listing to the next (an ETA of
        ``59:58`` then ``1:00:03``, ``–`` while it is not known), and the run id takes what the other columns
        leave: at 80 columns it flipped between ``20261206-1037-conc-91c6`` and ``conc-91c6`` every few
        seconds. A live run's cells get the room they may grow to from the start (``LIVE_ROOM``, the full
        progress), and a width only grows while the same runs are listed (a loss from ``10.1234`` to
        ``9.8765`` keeps its cell); it starts over when a run appears or goes."""
        room: dict[str, list[int]] = {c.key: [cell_len(t(c.label))] for c in COLUMNS}
        for summary in self._listed():
            row = cells[summary.id]
            for key, value in row.items():
                room[key].append(cell_len(value))
            if summary.status in ACTIVE_STATES:
                room["eta"].append(cell_len(LIVE_ROOM["eta"]))
                room["tokens"].append(cell_len(LIVE_ROOM["tokens"]))
                if summary.total_steps:
                    room["progress"].append(cell_len(_progress(summary.total_steps, summary.total_steps)))
        natural = {key: max(widths) for key, widths in room.items()}
        natural["status"] = max(natural["status"], *(cell_len(state_label(s)) for s in STATUS_COLOURS))
        if frozenset(cells) != self.widest_for:
            self.widest, self.widest_for = {}, frozenset(cells)
        for key, width in natural.items():
            natural[key] = self.widest[key] = max(width, self.widest.get(key, 0))
        return natural

    def _table_width(self, table: DataTable) -> int:
        """Cells a row may use: the table's width less the vertical scrollbar's gutter (always kept)."""
        width = table.size.width or self.size.width or self.app.size.width
        return max(1, width - table.styles.scrollbar_size_vertical)

    def _fill(self) -> None:
        table = self.query_one("#runs-table", DataTable)
        was_at = table.cursor_row
        selected = self.shown[was_at].id if self.shown and 0 <= was_at < len(self.shown) else None
        needle = self.filter_text.lower()
        listed = self._listed()
        # The status as the table shows it (已完成) and as the CLI and --json spell it (finished).
        runs = [s for s in listed if not needle or needle in " ".join(
            [s.id, s.status, state_label(s.status), s.model or "", s.method or "", s.name or ""]).lower()]
        runs.sort(key=COLUMNS[self.sort_column].sort, reverse=self.sort_reverse)
        self.shown = runs
        # Widths come from every run listed, not just the filtered ones, so filtering does not reshuffle columns.
        cells = {summary.id: self._cells(summary) for summary in listed}
        layout = fit_columns(self._table_width(table), self._natural(cells))
        if layout != self.column_widths or not table.columns:
            table.clear(columns=True)
            for column in COLUMNS:
                if column.key in layout:
                    table.add_column(truncate(t(column.label), layout[column.key]), key=column.key,
                                     width=layout[column.key])
            self.column_widths = layout
        else:
            table.clear()
        variables = self.app.theme_variables
        for summary in runs:
            colour = variables.get(STATUS_COLOURS.get(summary.status, "$foreground")[1:])
            dim = " dim" if summary.probe else ""  # a probe run, shown (p): there, but not one's training
            row = cells[summary.id]
            texts = []
            for key, width in layout.items():
                value = fit_id(row[key], width) if key == "id" else truncate(row[key], width)
                # Text, not str: a DataTable parses str cells as markup, and ids or models may hold brackets.
                texts.append(Text(value, style=(((colour or "") if key == "status" else "") + dim).strip()))
            table.add_row(*texts, key=summary.id)
        if selected is not None:
            index = next((i for i, summary in enumerate(runs) if summary.id == selected), None)
            if index is None and runs:  # gone (deleted): stay where it was, on the run that took its place
                index = min(was_at, len(runs) - 1)
            if index is not None:
                table.move_cursor(row=index, animate=False)
        self.query_one("#runs-empty", Static).display = self.listed and not self.runs
        if self.listed:
            self._show_status(len(runs))

    def _listed(self) -> list[Any]:
        """The runs the table lists before the filter: the probe runs only once p shows them."""
        return [s for s in self.runs if self.show_probes or not s.probe]

    def _show_status(self, shown: int) -> None:
        """The summary line; the key hint joins it only where it fits (the footer lists the keys too)."""
        listed = self._listed()
        active = sum(1 for s in listed if s.status in ACTIVE_STATES)
        parts = [t(units.plural_key("runs_screen.summary", len(listed)), count=len(listed), active=active,
                   column=t(COLUMNS[self.sort_column].label),
                   order=t("runs_screen.desc" if self.sort_reverse else "runs_screen.asc"))]
        probes = sum(1 for s in self.runs if s.probe)
        if probes and not self.show_probes:
            parts.append(t(units.plural_key("runs_screen.probes_hidden", probes), count=probes))
        elif probes:
            parts.append(t("runs_screen.probes_shown"))
        if self.filter_text:
            parts.append(t("runs_screen.filtered", text=self.filter_text, shown=shown))
        chosen = self.selected()
        if chosen is not None and chosen.record_error:  # first: at 80 columns the model column is not shown
            parts.insert(0, t("dashboard.record_unreadable_short", reason=chosen.record_error))
        room = max(1, (self.size.width or self.app.size.width) - 2)
        hint = t("runs_screen.hint")
        if cell_len(" · ".join([*parts, hint])) <= room:
            parts.append(hint)
        self.query_one("#runs-status", Static).update(Text(truncate(" · ".join(parts), room)))

    def selected(self) -> Any | None:
        table = self.query_one("#runs-table", DataTable)
        if not self.shown or not 0 <= table.cursor_row < len(self.shown):
            return None
        return self.shown[table.cursor_row]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.refresh_bindings()
        if self.listed:
            self._show_status(len(self.shown))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Stop for a live highlighted run, resume for a stopped, failed or crashed one with a checkpoint to
        go on from or that ended before its first step (``offers_resume``, the dashboard's rule; the list
        worker found it, nothing is read here): else not offered. Delete wants a highlighted run: with no
        runs (or none the filter shows) it is not offered."""
        if action in ("stop", "resume", "delete"):
            summary = self.selected() if self.is_mounted else None
            if summary is None:
                return False
            if action == "delete":  # an active run is refused with a reason when asked (action_delete)
                return True
            if action == "stop":  # a run of another host is not this box's to signal (``foreign_host``)
                return can_stop(summary.status) and foreign_host({"host": summary.host}) is None
            return summary.resumable
        if action == "open":  # Enter opens the highlighted run's dashboard: with none listed there is none
            return self.selected() is not None if self.is_mounted else False
        if action in ("sort", "reverse"):  # nothing to order before a run is listed
            return bool(self._listed())
        if action == "filter":  # nothing to filter before a run is listed; a filter that matched none stays editable
            return bool(self._listed()) or bool(self.filter_text)
        if action == "probes":  # offered only where there are probe runs to show or hide
            return any(s.probe for s in self.runs)
        if action == "clear_filter":  # Esc clears a filter or closes its open box: with neither, nothing to do
            return bool(self.filter_text) or self.is_mounted and self.query_one("#runs-filter", Input).display
        return True

    def footer_priority(self) -> tuple[str, ...]:
        if self.listed and not self._listed():  # no runs yet: the wizard (w) starts one, first on the line
            return ("mode.wizard", "runs.probes")
        return ("runs.open", "runs.stop", "runs.resume", "runs.sort", "runs.filter", "runs.delete", "runs.probes")

    # --- actions ---------------------------------------------------------------------------------
    def action_sort(self) -> None:
        """The next column shown (a column the width hides is skipped, but Started, the default order,
        always comes round again)."""
        for step in range(1, len(COLUMNS) + 1):
            index = (self.sort_column + step) % len(COLUMNS)
            if COLUMNS[index].key in self.column_widths or COLUMNS[index].key == "started":
                self.sort_column = index
                break
        self._fill()

    def action_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._fill()

    def action_probes(self) -> None:
        """Show the probe runs (dimmed) or hide them again; the highlighted run stays where it is listed."""
        self.show_probes = not self.show_probes
        self._fill()
        self.refresh_bindings()

    def action_filter(self) -> None:
        box = self.query_one("#runs-filter", Input)
        box.display = True
        box.value = self.filter_text
        self.set_focus(box)  # now, not after a refresh: see tui.widgets.burst_typing
        self.refresh_bindings()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "runs-filter":
            self.filter_text = event.value.strip()
            self._fill()
            self.refresh_bindings()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "runs-filter":
            event.input.display = False
            self.query_one("#runs-table", DataTable).focus()
            self.refresh_bindings()

    def action_clear_filter(self) -> None:
        box = self.query_one("#runs-filter", Input)
        box.display = False
        box.value = ""
        self.filter_text = ""
        self.query_one("#runs-table", DataTable).focus()
        self._fill()
        self.refresh_bindings()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        summary = self.selected()
        if summary is None:
            return
        open_dashboard(self.app, summary.run_dir)

    def action_stop(self) -> None:
        from tui.widgets.run_control import ask_stop

        summary = self.selected()
        if summary is not None:
            ask_stop(self, summary.run_dir, summary.id, summary.status, self._said, self._relist,
                     summary.reason_message)

    def action_resume(self) -> None:
        from tui.widgets.run_control import ask_resume

        summary = self.selected()
        if summary is not None:
            # No GPU in a run.json that reads: a CPU run (one that does not read knows none either way).
            cpu = not summary.gpus and not summary.record_error
            ask_resume(self, summary.run_dir, summary.id, summary.status, self._said, self._relist, cpu=cpu,
                       from_start=not summary.has_checkpoint)

    def _said(self, text: str, severity: str) -> None:
        self.post_message(RunActed(text, severity))  # from the worker thread

    def _relist(self) -> None:
        self.post_message(RunActed("", "information"))

    def on_worker_state_changed(self, event: Any) -> None:
        # A worker that ended in an exception nothing caught (an unreadable runs folder …): reported.
        from tui.screens.error_modal import report_failed_worker

        report_failed_worker(self.app, event)

    def on_run_acted(self, message: RunActed) -> None:
        if message.text:
            self.notify(message.text, severity=message.severity, markup=False)  # file names, log lines
        self.refresh_now()

    def action_delete(self) -> None:
        summary = self.selected()
        if summary is None:
            return
        if summary.status in ACTIVE_STATES:
            self.notify(t("runs_screen.delete_active", id=summary.id, status=state_label(summary.status)), severity="warning")
            return
        self._measure(summary.id, summary.run_dir)

    @work(thread=True, group="runs-delete", exit_on_error=False)
    def _measure(self, run_id: str, path: str) -> None:
        from core.lifecycle.serve import server_state
        from core.runs import RunDirectory, effective_status

        active = effective_status(RunDirectory(path)).active
        self.post_message(DeleteChecked(run_id, path, directory_size(path), active, server_state(run_id)))

    def on_delete_checked(self, message: DeleteChecked) -> None:
        if message.active:
            self.notify(t("runs_screen.delete_active", id=message.run_id, status=t("runs_screen.status.active")), severity="warning")
            return
        from tui.widgets.confirm import ConfirmScreen

        def answered(ok: bool | None) -> None:
            if ok:
                self._delete(message.run_id, message.path)

        body = t("runs_screen.delete_body", path=message.path, size=format_bytes(message.size))
        if message.served is not None:  # deleting stops it: said before the answer, not found out after
            body += "\n\n" + t("runs_screen.delete_served", url=message.served.url or "–", pid=message.served.pid)
        self.app.push_screen(ConfirmScreen(t("runs_screen.delete_title", id=message.run_id), body), answered)

    @work(thread=True, group="runs-delete", exit_on_error=False)
    def _delete(self, run_id: str, path: str) -> None:
        from core.runs import RunDirectory, effective_status

        # Checked again at the last moment: the run may have been resumed while the dialog was open.
        if effective_status(RunDirectory(path)).active:
            self.post_message(RunDeleted(t("runs_screen.delete_active", id=run_id, status=t("runs_screen.status.active")), "warning"))
            return
        from core.lifecycle.serve import forget_server, stop_server_state

        # The run's server is stopped first (also one started while the dialog was open): a server left
        # serving a deleted run could only be found by its pid.
        served = stop_server_state(run_id)
        try:
            shutil.rmtree(path)
        except OSError as exc:
            self.post_message(RunDeleted(t("runs_screen.delete_failed", id=run_id, error=str(exc)), "error"))
            return
        forget_server(run_id)  # its state folder (state.json, log) goes with the run (and one started meanwhile)
        if served is not None:
            url = served.url or "–"
            self.post_message(RunDeleted(t("runs_screen.deleted_served", id=run_id, url=url)))
        else:
            self.post_message(RunDeleted(t("runs_screen.deleted", id=run_id)))

    def on_run_deleted(self, message: RunDeleted) -> None:
        self.notify(message.text, severity=message.severity)
        self.refresh_now()


def open_dashboard(app: Any, path: str | Path, standalone: bool = False) -> None:
    """Push the dashboard of a run directory (tunedeck's or another trainer's) on the Runs section.
    ``standalone``: the app was opened for this folder alone (``tunedeck watch DIR`` outside tunedeck's
    runs), so Esc quits rather than show a Runs list the folder is not in.

    The directory is read (``open_watch_source``: file I/O) in a worker, never on the UI thread: it posts
    ``WatchSourceOpened`` to the app, whose handler calls ``show_dashboard``. A second request before the
    answer cancels the first (exclusive group; an answer already posted is dropped by its request number):
    one dashboard opens, the last one asked for. The user going to a section or opening a screen (help,
    the palette, a modal: any change of the screen stack) meanwhile cancels it too
    (``app.cancel_dashboard_open``): they stay where they went."""
    from tui.gpu_poll import expected_errors
    from tui.screens.error_modal import report_unexpected

    app.dashboard_request += 1
    request = app.dashboard_request

    def read() -> None:
        from core.watch.source import SourceNotFound, open_watch_source

        try:
            source, error = open_watch_source(path), ""
        except SourceNotFound as exc:  # none of the layouts it reads: its message says what it looked for
            source, error = None, str(exc)
        except expected_errors() as exc:  # an unreadable folder
            source, error = None, t("runs_screen.open_failed", path=str(path), error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug: the error modal, not a dead key
            report_unexpected(app, exc, "open_dashboard")
            return
        if not get_current_worker().is_cancelled:
            app.post_message(WatchSourceOpened(source, error, standalone, request))

    app.run_worker(read, thread=True, exclusive=True, group="open-dashboard", exit_on_error=False)


def show_dashboard(app: Any, message: WatchSourceOpened) -> None:
    """On the UI thread, with ``open_dashboard``'s worker's answer: the error, or the dashboard pushed.
    An answer to a request since superseded (another open, or the user going elsewhere) is dropped: its
    worker may have posted it just before it was cancelled."""
    from tui.screens.dashboard import DashboardScreen

    if message.request != app.dashboard_request:
        return
    if message.error:
        app.notify(message.error, severity="error", markup=False)  # a path, the reference typed
        return
    if app.current_mode != "runs":
        app.switch_mode("runs")
    app.push_screen(DashboardScreen(message.source, standalone=message.standalone))


def on_app_start(app: Any, open_run: str | None, announce: bool, request: int) -> None:
    """Open the asked-for run (an id, prefix or any watchable directory), else the active run; announce
    runs that ended since the last visit (neither for the wizard's probe runs). Listing happens in a worker;
    the screens open from its result, unless the user went to a section or opened a screen since ``request``
    (``app.dashboard_request`` at the start) was current (``app.cancel_dashboard_open``): they stay there;
    the announcements still show."""

    def work_() -> None:
        from core.runs import RunNotFound, list_runs, resolve_run
        from core.watch.last_seen import runs_ended_since

        target: str | None = None
        error: str | None = None
        # the wizard's probe runs (a few steps to measure a plan) are neither opened nor announced
        runs = [s for s in list_runs() if not s.probe] if announce or open_run is None else []
        if open_run is not None:
            if Path(open_run).expanduser().is_dir():
                target = str(Path(open_run).expanduser())
            else:
                try:
                    target = str(resolve_run(open_run).path)
                except RunNotFound as exc:
                    error = str(exc)
        elif announce:
            active = [s for s in runs if s.status in OPEN_AT_START]
            if active:
                target = active[0].run_dir
        ended = runs_ended_since(runs) if announce else []
        standalone = open_run is not None and target is not None and not _under_runs(Path(target))
        app.call_from_thread(_after_start, app, target, error, ended, standalone, request)

    app.run_worker(work_, thread=True, group="app-start", exit_on_error=False)


def _under_runs(path: Path) -> bool:
    """The folder is one of tunedeck's runs (the Runs list shows it)."""
    from core.paths import runs_dir

    try:
        return path.resolve().is_relative_to(runs_dir().resolve())
    except OSError:
        return False


def _after_start(app: Any, target: str | None, error: str | None, ended: list[Any],
                 standalone: bool, request: int) -> None:
    if error:
        app.notify(error, severity="error", markup=False)  # quotes the reference typed
    for summary in ended:
        severity = "error" if summary.status in (RunState.FAILED, RunState.CRASHED) else "information"
        app.notify(t("runs_screen.ended_since", id=summary.id, status=state_label(summary.status)), severity=severity, timeout=10)
    if target is not None and request == app.dashboard_request:
        # (not when the user went to a section or opened a screen while the runs were listed: they stay there)
        open_dashboard(app, target, standalone=standalone)
