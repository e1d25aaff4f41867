"""The dashboard's header and events table: what they say about the run.

The two info lines over the charts (model, method, state; progress, rates, cost), and the events: their
rows, their labels (translated where tunedeck wrote them), the table that follows the newest and the
line under it that shows one in full when the Detail column has no room.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable, Static

from core.assets import model_label
from core.i18n import DEFAULT_LANGUAGE, catalogue, render_stored, t
from core.runs import TERMINAL_STATES, RunState, state_label
from core.runs.listing import shown_total
from core.runs.states import shows_eta
from core.units import TOTAL_PENDING, format_cost, format_disk, format_rate
from core.watch.activity import GONE, IDLE
from core.watch.figures import cost_so_far, format_duration, mfu, steady_tokens_per_s
from core.watch.metrics import BY_NAME

DETAIL_MIN_WIDTH = 24  # cells: a Detail column narrower than this gives way to the line under the table

EVENT_KEY_PREFIX = "dashboard.event."
# Events tunedeck itself writes to events.jsonl (trainer, supervisor, lifecycle commands) are those with a
# label in the catalogue (one place to add one). Another tool's event (a watched directory) or a newer
# version's has none and is shown under its own name.
KNOWN_EVENTS = frozenset(key[len(EVENT_KEY_PREFIX):] for key in catalogue(DEFAULT_LANGUAGE)
                         if key.startswith(EVENT_KEY_PREFIX))


# Stored reasons the dashboard words for itself (same parameters): where the stored message, which
# `tunedeck status` shows, says "continue with 'tunedeck resume'", the dashboard names its own key (u).
REASON_WORDING = {
    "train.stopped_at": "dashboard.reason_stopped_at",
    "runs.reason_crashed": "dashboard.reason_crashed",
}


EVENT_FIELD_KEY_PREFIX = "dashboard.event_field."
SIZE_FIELDS = frozenset({"bytes", "needed_bytes", "free_bytes"})


def event_field(name: str, value: Any) -> str:
    """One field of an event as the Detail column shows it: its name in the reader's language where
    tunedeck wrote it (退出码：0; English keeps the recorded name, exit_code=0), else as recorded; a size is
    written as one (3.2 GB, not 3200000000)."""
    key = EVENT_FIELD_KEY_PREFIX + name
    label = t(key) if key in catalogue(DEFAULT_LANGUAGE) else name
    if name in SIZE_FIELDS and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = format_disk(value)
    return t("dashboard.event_field", name=label, value=value)


def event_label(name: str) -> str:
    """An event's name as shown in the events table: translated when known, else as recorded."""
    key = EVENT_KEY_PREFIX + name
    return t(key) if key in catalogue(DEFAULT_LANGUAGE) else name


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

    @property
    def at_newest(self) -> bool:
        """The newest event is in view (what following means; tests wait for it)."""
        return self.scroll_y >= self.max_scroll_y

    def keep_up(self) -> None:
        """The dashboard's tick: a scroll made against a layout that changed after it (a busy box measures
        rows late) is put right by the next tick, so following never stays short of the newest."""
        if self.following and not self.at_newest:
            self.scroll_end(animate=False, immediate=True)


STAT_KEPT = 1 << 30  # the rank of a figure the stats line never drops (the step)
SEPARATOR = " · "


def fit_stats(parts: list[tuple[str, int]], width: int) -> str:
    """The stats line in ``width`` cells: ``parts`` (text, rank) joined in their order, the lowest-ranked
    dropped first until the rest fits (80 columns: one line, not a figure wrapped onto the next, pushing
    every chart down); what still does not fit is cut with an ellipsis."""
    from core.text_width import cell_len, truncate

    kept = list(parts)
    while len(kept) > 1 and cell_len(SEPARATOR.join(text for text, _ in kept)) > width:
        lowest = min(range(len(kept)), key=lambda i: kept[i][1])
        if kept[lowest][1] >= STAT_KEPT:
            break
        del kept[lowest]
    return truncate(SEPARATOR.join(text for text, _ in kept), max(1, width))


MODEL_RANK = 6  # the model name's rank in the first info line: shortened before it goes
MODEL_MIN_CELLS = 12  # a model name shortened to fewer cells than this says nothing: it goes instead


def fit_first_line(parts: list[tuple[str, int, str, str]], width: int) -> str:
    """The first info line in ``width`` cells, as markup: ``parts`` are (plain text, rank, the separator
    before it, a style or ""), in their order. Too wide (80 columns, a long model name, "read-only (HF
    Trainer)"): the model name (the part ranked ``MODEL_RANK``) is shortened with an ellipsis first, to
    ``MODEL_MIN_CELLS`` at the least; then the other parts go by rank, lowest first, the model last; a
    ``STAT_KEPT`` part (the state) stays. (A figure not known is not a part: the caller leaves it out.)"""
    from core.text_width import cell_len, truncate

    kept = [list(part) for part in parts]

    def excess() -> int:
        return sum(cell_len(sep + text) for text, _rank, sep, _style in kept) - width

    shortened = False
    while excess() > 0 and len(kept) > 1:
        lowest = min(range(len(kept)), key=lambda i: kept[i][1])
        if kept[lowest][1] >= STAT_KEPT:
            break
        model = next((part for part in kept if part[1] == MODEL_RANK), None)
        if model is not None and not shortened:
            shortened = True
            room = max(MODEL_MIN_CELLS, cell_len(model[0]) - excess())
            model[0] = truncate(model[0], room)
            continue
        del kept[lowest]
    if kept:
        kept[0][2] = ""  # the first shown part has no separator before it
    line = ""
    for text, _rank, sep, style in kept:
        shown = _escape(truncate(text, max(1, width)) if len(kept) == 1 else text)
        line += sep + (f"[{style}]{shown}[/]" if style else shown)
    return line


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def _step_rate(steps_per_s: float) -> str:
    """A step rate as the trainers log it: "2.5 it/s", or below one step a second "8.0 s/it"."""
    if steps_per_s <= 0 or steps_per_s >= 1:
        return t("dashboard.steps_per_s", value=format_rate(steps_per_s))
    return t("dashboard.seconds_per_step", value=format_rate(1.0 / steps_per_s))


class DashboardHeader:
    """The info lines and the events table's rows and detail (mixed into DashboardScreen)."""

    # --- the events table ------------------------------------------------------------------------
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

    # --- the info lines --------------------------------------------------------------------------
    def _cpu_run(self) -> bool:
        """The run trains on the CPU (its metrics header says so, or, before one, a tunedeck run's run.json
        gives it no GPU): the box's GPUs are none of its business."""
        header = self.series.header
        if header.get("device"):
            return header["device"] == "cpu"
        record = self._record
        return not self.source.read_only and "gpus" in record and not record["gpus"]

    def _other_host(self) -> str | None:
        """The host a tunedeck run runs on when it is not this one (run.json's ``host``: a data root shared
        between nodes): this box's GPUs are none of its business, as for a CPU run."""
        from core.runs.liveness import foreign_host

        return None if self.source.read_only else foreign_host(self._record)

    def _not_this_boxs_gpus(self) -> bool:
        """The box's GPU readings are not the run's: it trains on the CPU, or on another host."""
        return self._cpu_run() or self._other_host() is not None

    def _gpu_count(self) -> int:
        if self.gpu_indices:
            return len(self.gpu_indices)
        header = self.series.header
        return int(header.get("world_size") or 0) if header.get("device", "cuda") != "cpu" else 0

    def _show_info(self) -> None:
        header = self.series.header
        # A tunedeck run's facts before (or without: it failed first) its metrics header: its run.json's
        # summary, then its config.yaml (precision, ZeRO stage)
        facts = self._record if self.source.read_only else {**self._config,
                                                            **(self._record.get("config_summary") or {})}
        latest = self.series.latest
        pending = self.pending_resume
        if pending is not None and str(latest.get("time") or "") <= str(pending.get("resume_time") or ""):
            # asked to resume, its trainer still loading: the figures at the checkpoint's step and no ETA, as
            # `tunedeck status` says (the last record's step, epoch, elapsed and ETA were the attempt given up's;
            # the series, cut at the resume as run.json records it, does not know a total it made unknown)
            latest = {**latest, **pending, "total_steps": pending.get("total_steps") or (
                None if pending.get("total_unknown") else latest.get("total_steps"))}
        # A tunedeck run's model is run.json's first: a resume with model= (the folder moved) updates it, the
        # metrics header keeps the first attempt's (`tunedeck runs` and `status` show run.json's too)
        summary = {} if self.source.read_only else (self._record.get("config_summary") or {})
        model = summary.get("model") or header.get("model") or facts.get("model")
        model = model_label(str(model)) if model else None  # the bundled tiny model as "tiny", demo or wizard
        method = header.get("method") or facts.get("method")
        precision = header.get("precision") or facts.get("precision")
        zero = header.get("zero_stage", facts.get("zero_stage"))
        gpus = ",".join(str(i) for i in self.gpu_indices) or (str(self._gpu_count()) if self._gpu_count() else None)
        status = self.status or "…"
        colour = {RunState.RUNNING: "$success", RunState.FINISHED: "$primary", RunState.FAILED: "$error",
                  RunState.CRASHED: "$error", RunState.STALLED: "$warning", RunState.STOPPING: "$warning",
                  RunState.STOPPED: "$warning", IDLE: "$warning", GONE: "$error"}.get(status, "$foreground-muted")
        # (text, rank, separator before it, style): at 80 columns the line keeps to one line (it wrapped
        # "read-only (HF" / "Trainer)" under a long model name). A figure not known is left out, not shown as
        # "N/A": a LLaMA-Factory folder without its training_args.yaml read "N/A · N/A · N/A · ZeRO N/A ·
        # GPUs N/A", the same figures of an ms-swift folder "ZeRO N/A · GPUs N/A" (as the stats line does).
        cpu_run = self._cpu_run()
        other_host = self._other_host()
        lost = "" if cpu_run or other_host else ",".join(map(str, self.gpu_lost))  # fell off the bus (Xid 79)
        gpu_part = t("dashboard.cpu_run") if cpu_run else t("dashboard.on_host", host=other_host) if other_host \
            else gpus and (t("dashboard.gpus_lost", gpus=gpus, lost=lost) if lost else t("dashboard.gpus", gpus=gpus))
        # ZeRO 0 is named as the plan's headline names it: nothing for one process (the CPU, one GPU), "DDP" for
        # several (each GPU holds the whole model); a ZeRO stage above 0 as "ZeRO N"
        single = cpu_run or self._gpu_count() == 1
        zero_text = None if zero is None or (single and str(zero) == "0") else t("dashboard.ddp") if str(
            zero) == "0" else t("dashboard.zero", stage=str(zero))
        shown: list[tuple[str | None, int, str, str]] = [
            (model, MODEL_RANK, "", "b"),
            (method, 4, SEPARATOR, ""),
            (precision, 2, SEPARATOR, ""),
            (zero_text, 1, SEPARATOR, ""),
            (gpu_part, 3, SEPARATOR, "$error" if lost else ""),
            (self.reason if status in (IDLE, GONE) else state_label(status), STAT_KEPT, SEPARATOR, colour),
        ]
        first = [(str(text), rank, sep, style) for text, rank, sep, style in shown if text]
        if self.source.read_only:
            first.append((t("dashboard.read_only", kind=t("dashboard.kind_" + self.source.kind)), 5, "  ",
                          "$foreground-muted"))
        line1 = fit_first_line(first, self._info_width())
        unknown = bool(latest.get("total_unknown"))  # a resume changed what decides it: "?" until it logs
        step, total = latest.get("step"), latest.get("total_steps") or (None if unknown else header.get("total_steps"))
        total = shown_total(step, total, status)
        progress = ("–" if step is None else f"{step}/{total}" if total else
                    f"{step}/{TOTAL_PENDING}" if unknown else str(step))
        if step is not None and total:
            progress += f" {100.0 * step / total:.0f}%"
        elapsed = latest.get("elapsed_s")
        eta = latest.get("eta_s") if shows_eta(status) else None  # none while stalled or stopping
        # Over the steady steps so far, as the Runs list and `tunedeck status` say: one interval's rate swings
        # with a busy CPU or a save (the tokens/s chart keeps every interval's). MFU is taken from the same.
        # A stalled run's last speed is no longer true (the Runs list and `tunedeck status` leave it out too).
        tokens = steady_tokens_per_s(self.series.first, latest) if status != RunState.STALLED else None
        gpu_count = self._gpu_count()
        mfu_value = mfu({**latest, "tokens_per_s": tokens}, header, gpu_count, self.gpu_name)
        cost = cost_so_far(elapsed, gpu_count, self.app.settings.price_per_gpu_hour)
        # (text, rank): what goes first when the line is too wide, lowest rank first; the step stays. A figure
        # not known (yet) is left out, not shown as "N/A": a fresh run's line read "step N/A · epoch N/A ·
        # elapsed N/A · ETA N/A · N/A tok/s"; before its first step it says what the charts say instead.
        epoch = latest.get("epoch")
        memory = latest.get("memory_gib")
        step_rate = latest.get("steps_per_s") if tokens is None else None  # where tokens/s is not logged
        known = [
            (epoch is not None and t("dashboard.epoch", epoch=f"{epoch:.2f}"), 0),
            (elapsed is not None and t("dashboard.elapsed", value=format_duration(elapsed)), 3),
            (eta is not None and t("dashboard.eta", value=format_duration(eta)), 5),
            (tokens is not None and t("dashboard.tokens", value=format_rate(tokens)), 4),
            (mfu_value is not None and t("dashboard.mfu", value=f"{100 * mfu_value:.0f}%"), 1),
            (cost is not None and t("dashboard.cost", value=format_cost(cost, t("dashboard.currency"))), 2),
            # what another trainer logs of its own (ms-swift's memory(GiB) and train_speed, LLaMA-Factory's
            # vram_allocated): read by core.watch.adapters, said here with where it comes from
            (memory is not None and t("dashboard.logged_memory", value=BY_NAME["memory_gib"].format(memory),
                                      kind=t("dashboard.kind_" + self.source.kind)), 1),
            (step_rate is not None and _step_rate(step_rate), 4),
        ]
        parts: list[tuple[str, int]] = [(t("dashboard.step", progress=progress), STAT_KEPT)]
        if step is None:
            none_coming = self._ended_run() and self.backfilled
            parts.append((t("dashboard.ended_without_metrics" if none_coming else "dashboard.waiting"), 3))
        parts += [(text, rank) for text, rank in known if text]
        line2 = _escape(fit_stats(parts, self._info_width()))
        ended = bool(self.reason) and status in TERMINAL_STATES and status != RunState.FINISHED
        # A stalled run says why and what to do for as long as it is stalled, not only in a 10 s toast.
        stalled = bool(self.reason) and status == RunState.STALLED
        if ended or stalled:
            line2 += f"\n[{'$error' if ended else '$warning'}]{_escape(self.reason)}[/]"
        self.set_class(ended or stalled, "-ended")  # the reason wraps in full: the info block may grow (screen CSS)
        if self.source_problem:  # the watched file does not parse: say so, not just "waiting for metrics"
            line2 += f"\n[$warning]{_escape(self.source_problem)}[/]"
        if self.record_unreadable:  # run.json does not read (a notification said which, why, what to do)
            line2 += f"\n[$warning]{_escape(t('dashboard.record_unreadable_short', reason=self.record_unreadable))}[/]"
        self.query_one("#dash-info", Static).update(line1 + "\n" + line2)

    def _info_width(self) -> int:
        """The cells one line of the info block holds (the screen's width less its padding)."""
        info = self.query_one("#dash-info", Static)
        return info.content_region.width or max(1, (self.size.width or self.app.size.width) - 2)

    @staticmethod
    def _event_row(record: dict[str, Any]) -> tuple[str, str, str]:
        when = str(record.get("time", ""))
        clock = when[11:19] if len(when) >= 19 else when
        fields = {k: v for k, v in record.items()
                  if k not in ("time", "ts", "event", "reason_message") and v not in ("", None)}  # "reason=" says nothing
        if "reason" in fields:  # written by the supervisor with its message record: show the reader's language
            fields["reason"] = render_stored(str(fields["reason"]), record.get("reason_message"), REASON_WORDING)
        detail = t("dashboard.event_field_sep").join(event_field(k, v) for k, v in fields.items())
        return clock, event_label(str(record.get("event", ""))), detail
