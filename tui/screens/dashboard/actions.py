"""The dashboard's keys: their actions, and what the footer offers for the run as it stands."""

from __future__ import annotations

import shlex

from textual import work
from textual.message import Message
from textual.widgets import DataTable, Input

from core.i18n import render_stored, t
from core.runs import TERMINAL_STATES, can_resume, can_stop
from tui.screens.dashboard.header import EventsTable
from tui.widgets.log_pane import LogPane

# The actions that act on the run itself, offered by its state (``check_action``).
RUN_ACTIONS = frozenset({"stop", "resume", "after_training"})


class ActionDone(Message):
    def __init__(self, text: str, severity: str = "information") -> None:
        super().__init__()
        self.text = text
        self.severity = severity


class DashboardActions:
    """Stop, resume, config, the command line, after training, search, focus, full view, back; and
    which of them the footer shows (mixed into DashboardScreen, whose BINDINGS name them)."""

    # --- the footer, the help and the palette: one rule -------------------------------------------
    def footer_priority(self) -> tuple[str, ...]:
        """Binding ids in the order the footer keeps them. The run's own actions come first, the one
        that matters most for its state first (stop while live, resume, then what its checkpoint is good
        for), then Esc on an ended run (the way out stays on an 80-column line); those ``check_action`` refuses are left out by the footer like by the help and the palette."""
        keys: list[str] = ["dashboard.newer"]  # a newer run (offered only then): what the user wants next
        if self.has_class("-full"):
            keys.append("dashboard.back")
        keys += ["dashboard.stop", "dashboard.resume", "dashboard.merge", "dashboard.chat", "dashboard.serve",
                 "dashboard.evaluate", "dashboard.export"]
        if self.status in TERMINAL_STATES:
            # An ended run offers up to five actions of its own: at 80 columns they fill the line, and Esc, the
            # way out, went first. It stays, right after them; the full log and the search give way.
            keys.append("dashboard.back")
        return (*keys, "dashboard.full", "dashboard.search", "dashboard.back", "dashboard.axis")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """What the run as it stands allows, and nothing on another trainer's output: stop while it is
        live, on this host (another host's processes are not this box's to signal); resume once it ended
        short (stopped, failed, crashed) with a checkpoint to go on from, or before its first step (it
        starts again from step 0);
        merge, chat, serve, evaluate and export once it ended with a checkpoint (``core.lifecycle``
        loads its last complete one). Refused here, a key leaves the footer, the help and the palette.
        n/N (next, previous match) once a log search was made: before one they have nothing to go to."""
        if action == "watch_newer":
            return self.newer is not None
        if action == "next_match":
            return bool(self.is_mounted and self.query_one("#dash-log", LogPane).query_text)
        if action not in RUN_ACTIONS:
            return True
        if self.source.read_only:
            return False
        if action == "stop":  # not a run of another host: its processes are not this box's to signal
            return can_stop(self.status) and self._other_host() is None
        if action == "resume":  # a checkpoint to go on from, or ended before its first step (from step 0)
            return self.resumable and can_resume(self.status)
        return self.status in TERMINAL_STATES and self.has_checkpoint

    def footer_label(self, binding_id: str, description: str) -> str | None:
        """Esc leaves the full view before it goes back to the runs: the footer says which it does now.
        Where Esc quits (``tunedeck watch DIR`` on an outside folder) the footer leaves it out: the app's
        ``q Quit`` already says so, and Esc still quits."""
        if binding_id == "dashboard.back" and self.has_class("-full"):
            return t("dashboard.key.leave_full")
        if binding_id == "dashboard.back" and self._leaves_app():
            return None
        return description

    def _leaves_app(self) -> bool:
        """Esc here quits: this dashboard is what ``tunedeck watch DIR`` opened, over nothing of its own (and
        neither the full view nor the log search is open, which Esc closes first)."""
        return self.standalone and not self.has_class("-full") and not self.query_one("#dash-search", Input).display

    def on_action_done(self, message: ActionDone) -> None:
        self.notify(message.text, severity=message.severity, markup=False)  # file names, log lines

    # --- actions ---------------------------------------------------------------------------------
    def action_toggle_axis(self) -> None:
        self.axis = "time" if self.axis == "step" else "step"
        self._redraw()

    def action_search(self) -> None:
        box = self.query_one("#dash-search", Input)
        box.display = True
        self.set_focus(box)  # now, not after a refresh: see tui.widgets.burst_typing
        self.refresh_bindings()  # Esc now closes the search: the footer says Back

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "dash-search":
            return
        pane = self.query_one("#dash-log", LogPane)
        count = pane.search(event.value.strip())
        event.input.display = False
        pane.focus()
        self.refresh_bindings()  # n/N go through the matches now (none after an empty search)
        text = event.value.strip()
        if text and not count and not pane.holds_all:
            # Only the log's tail is loaded: "no match" would claim more than was searched.
            self.notify(t("dashboard.search_none_loaded", text=text, lines=len(pane.lines), where=self._whole_log()),
                        severity="warning", timeout=8, markup=False)
        elif text:
            # "n next" only where there is a next; "[rank0]" is text, not markup
            key = "dashboard.search_found" if count > 1 else "dashboard.search_found_one" if count else \
                "dashboard.search_found_none"
            self.notify(t(key, count=count, text=text),
                        severity="information" if count else "warning", timeout=3, markup=False)

    def _whole_log(self) -> str:
        """Where the whole log is read: ``tunedeck logs RUN`` for a tunedeck run, else the log file."""
        source = self.source
        if source.read_only:
            return str(source.log_path)
        from core.paths import runs_dir

        return f"tunedeck logs {source.run_id if source.path.parent == runs_dir() else source.path}"

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
            self.refresh_bindings()  # Esc quits again: the footer says so
            return
        if self.has_class("-full"):
            self.action_toggle_full()
            return
        if self._leaves_app():
            self.app.exit()
            return
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()

    def action_watch_newer(self) -> None:
        if self.newer is not None:
            self.watch_newer(self.newer, followed=False)

    def watch_newer(self, source, followed: bool) -> None:
        """This dashboard replaced by one on ``source`` (a newer run below the folder named), and said."""
        from tui.screens.dashboard import DashboardScreen

        key = "dashboard.followed_newer" if followed else "dashboard.watching_newer"
        previous = self.source.run_id
        self._take_newer_toast()  # "o watches the newer one": done
        self.app.switch_screen(DashboardScreen(source, clock=self.clock, standalone=self.standalone))
        self.app.notify(t(key, run=self._run_name(source), previous=previous), timeout=10, markup=False)

    def action_jump_gpus(self) -> None:
        self.app.action_section("gpus")

    def action_stop(self) -> None:
        from tui.widgets.run_control import ask_stop

        if self.source.read_only:
            self.notify(t("dashboard.read_only_action"), severity="warning")
            return
        ask_stop(self, self.source.path, self.source.run_id, self.status, self._say,
                 lambda: self._post_state(with_disk=False), self.reason_message)

    def action_resume(self) -> None:
        from tui.widgets.run_control import ask_resume

        if self.source.read_only:
            self.notify(t("dashboard.read_only_action"), severity="warning")
            return
        ask_resume(self, self.source.path, self.source.run_id, self.status, self._say,
                   lambda: self._post_state(with_disk=False), cpu=self._cpu_run(), from_start=not self.has_checkpoint)

    def _say(self, text: str, severity: str) -> None:
        self.post_message(ActionDone(text, severity))  # from the worker thread

    def action_config(self) -> None:
        self._read_config()

    @work(thread=True, exclusive=True, group="dash-config", exit_on_error=False)
    def _read_config(self) -> None:
        """The run's configuration file, read in a worker (a slow or network disk must not stall the
        keys), then shown full screen; another trainer's folder: its own arguments file."""
        candidates = ["config.yaml"] if not self.source.read_only else ["args.json", "training_args.yaml",
                                                                       "llamaboard_config.yaml"]
        for name in candidates:
            path = self.source.path / name
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            self.app.call_from_thread(self._show_config, str(path), text)
            return
        self.app.call_from_thread(self.notify, t("dashboard.no_config", path=str(self.source.path)),
                                  severity="warning", markup=False)

    def _show_config(self, path: str, text: str) -> None:
        from tui.widgets.text_modal import TextModal

        self.app.push_screen(TextModal(path, text))

    def command_line(self) -> str:
        """The command that reproduces this run: ``tunedeck train`` on the run's own saved config, by its
        absolute path. (The command it was launched with named a plan file relative to wherever the app
        was started, which later wizard launches overwrite; the run's config.yaml is its resolved config,
        the one core's own advice names too.) On another trainer's output: watching it again."""
        if self.source.read_only:
            return shlex.join(["tunedeck", "watch", str(self.source.path.resolve())])
        from core.runs import RunDirectory

        return shlex.join(["tunedeck", "train", str(RunDirectory(self.source.path).config_path.resolve())])

    def action_after_training(self, what: str) -> None:
        """Merge / chat / serve / evaluate / export a finished run (``tui.screens.chat`` does the work: the
        run is checked in a worker, whose answer comes back as ``RunResultChecked``)."""
        from tui.screens import chat

        if self.source.read_only:
            self.notify(t("lifecycle.tui_read_only"), severity="warning")
            return
        chat.after_training(self, what, self.source.path)

    def on_run_result_checked(self, message) -> None:
        from tui.screens import chat

        chat.take_after_training(self, message)

    def action_copy_command(self) -> None:
        command = self.command_line()
        self.app.copy_to_clipboard(command)
        self.notify(t("dashboard.copied", command=command), timeout=8, markup=False)
