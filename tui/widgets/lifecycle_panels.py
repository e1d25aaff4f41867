"""Panels the dashboard opens on a finished run: the merge with its stages, and the run's server with its
URL, port and live health, a test request, and keys to test again, copy the URL or stop it.

The work runs in app-level thread workers, so closing a panel (Esc) leaves it going: the merge still
ends with a notification, and the server is detached anyway (it outlives the app).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import ProgressBar, Static
from textual.worker import get_current_worker

from core.errors import TunedeckError
from core.i18n import render_stored, t
from core.text_width import cell_len, pad
from tui.screens.error_modal import describe, report_unexpected
from tui.widgets.modal import KeyedModal

HEALTH_EVERY_S = 1.0
REPLY_PREVIEW_CHARS = 200  # of the test reply shown in the serve panel (it is a sign of life, not a chat)

PANEL_CSS = """
{name} {{ align: center middle; background: $background 60%; }}
{name} > Vertical {{ width: 90; max-width: 100%; height: auto; max-height: 100%; border: round $primary;
                    background: $surface; padding: 0 1; }}
{name} .panel-title {{ text-style: bold; color: $primary; }}
{name} .panel-body {{ margin-top: 1; }}
{name} .panel-hint {{ margin-top: 1; color: $foreground-muted; }}
"""


class MergeStage(Message):
    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage


class MergeEnded(Message):
    """``reused``: a whole merge of the checkpoint was there already, nothing was done; ``ok`` with no
    stage reached: the user kept the folder in the way (nothing was merged, nothing failed)."""

    def __init__(self, out: str | None, text: str, ok: bool, reused: bool = False) -> None:
        super().__init__()
        self.out = out
        self.text = text
        self.ok = ok
        self.reused = reused


class MergePanel(KeyedModal[None]):
    """A run's merge, stage by stage; ends with the merged directory (or the reason it failed).

    As ``tunedeck export`` does, a whole merge of the same checkpoint already in the run's merged folder is
    the result as it is (said, not written again); another earlier merge (or an empty folder) in the way
    is replaced only once the user answers y in a dialog (the TUI has no --force); a folder holding
    anything else is never replaced (core's ``OutputNotReplaceable``): the panel says what it holds."""

    DEFAULT_CSS = PANEL_CSS.format(name="MergePanel")
    BINDINGS = [Binding("escape", "dismiss", t("lifecycle.key.close"), id="merge.close")]

    def __init__(self, run_dir: Path, adapter: bool = True) -> None:
        """``adapter``: whether the run's checkpoint is an adapter; a full fine-tune's load step loads the
        fine-tuned model alone, and says so."""
        super().__init__()
        self.run_dir = Path(run_dir)
        self.adapter = adapter
        self.stage: str | None = None
        self.stages: list[str] = []  # every stage reported, in order
        self.out: str | None = None
        self.ended = False
        self.ok = False

    def compose(self) -> ComposeResult:
        from core.lifecycle.merge import MERGE_STAGES

        with Vertical():
            yield Static(t("lifecycle.merge_title", run=self.run_dir.name), classes="panel-title", markup=False)
            yield ProgressBar(total=len(MERGE_STAGES) - 1, show_eta=False, id="merge-progress")
            yield Static("", id="merge-stages", classes="panel-body")
            yield Static("", id="merge-result", classes="panel-body")
            yield Static(t("lifecycle.merge_hint"), id="merge-hint", classes="panel-hint")

    def on_mount(self) -> None:
        self.query_one("#merge-result", Static).display = False
        self._show_stages()
        self._merge(force=False)

    def _merge(self, force: bool) -> None:
        """Merge in an app-level worker; ``force``: replace the folder in the way (the user said y)."""
        panel, app, run_dir = self, self.app, self.run_dir

        def job() -> None:
            from core.lifecycle.merge import MergeCancelled, merge_run, merge_words
            from core.lifecycle.source import OutputExists
            from core.runs import RunDirectory

            # The app quitting cancels this worker: the merge stops at its next stage, leaving nothing.
            worker = get_current_worker()
            try:
                result = merge_run(RunDirectory(run_dir), force=force, reuse=True,
                                   progress=lambda stage: panel.post_message(MergeStage(stage)),
                                   cancelled=lambda: worker.is_cancelled)
            except MergeCancelled:
                return
            except OutputExists as exc:  # a folder that is no whole merge of this checkpoint: asked first
                if force:
                    raise
                app.call_from_thread(panel.ask_to_replace, exc.path)
                return
            except TunedeckError as exc:  # a LifecycleError: no adapter, a merge already running …
                text = tui_words(exc, "M")
                panel.post_message(MergeEnded(None, text, False))
                app.call_from_thread(app.notify, text, severity="error", timeout=15)
                return
            except Exception as exc:  # CUDA OOM, a missing library …: the panel says so, the modal and log too
                panel.post_message(MergeEnded(None, describe(exc), False))
                report_unexpected(app, exc, "lifecycle.merge")
                return
            text = merge_words(result)  # as the CLI says it: "15.0 GB", not "15000.0 MB"
            note = result.qlora_note()  # into the bf16 base, not the 4-bit weights trained against
            if note:
                text += "\n" + note
            panel.post_message(MergeEnded(str(result.out), text, True, reused=result.reused))
            app.call_from_thread(app.notify, text, timeout=15)

        # Owned by the app, not this panel: closing the panel does not orphan the merge's messages.
        self.app.run_worker(job, thread=True, group="lifecycle", exit_on_error=False)

    def ask_to_replace(self, path: Path) -> None:
        """``path`` is in the way: y merges again into it (the old folder goes once the new one is whole);
        n or Esc keeps it, and the panel says how to merge later."""
        from tui.widgets.confirm import ConfirmScreen

        def answered(ok: bool | None) -> None:
            if ok:
                self._merge(force=True)
                return
            text = t("lifecycle.merge_kept", path=str(path), run=self.run_dir.name)
            self.post_message(MergeEnded(None, text, True))
            self.app.notify(text, timeout=15)

        self.app.push_screen(ConfirmScreen(t("lifecycle.replace_title", path=path.name),
                                           t("lifecycle.replace_body", path=str(path))), answered)

    def _show_stages(self) -> None:
        from core.lifecycle.merge import MERGE_STAGES

        current = MERGE_STAGES.index(self.stage) if self.stage in MERGE_STAGES else -1
        lines = []
        for index, stage in enumerate(MERGE_STAGES[:-1]):
            if (index < current or self.stage == "done") and stage not in self.stages:
                mark, style = "–", "dim"  # skipped: a full fine-tune has no adapter to fold in
            elif index < current or self.stage == "done":
                mark, style = "✓", "green"
            elif index == current and not self.ended:
                mark, style = "…", "bold"
            elif index == current:
                mark, style = "✗", "red"
            else:
                mark, style = " ", "dim"
            key = "lifecycle.stage.load_full" if stage == "load" and not self.adapter else "lifecycle.stage." + stage
            lines.append(Text(f" {mark} " + t(key), style=style))
        self.query_one("#merge-stages", Static).update(Text("\n").join(lines))
        self.query_one("#merge-progress", ProgressBar).update(progress=max(0, current))

    def on_merge_stage(self, message: MergeStage) -> None:
        self.stage = message.stage
        self.stages.append(message.stage)
        self._show_stages()

    def on_merge_ended(self, message: MergeEnded) -> None:
        self.ended, self.ok, self.out = True, message.ok, message.out
        if message.reused:
            self.stage = "done"  # every stage shown as not needed: the merge was already there
        self._show_stages()
        result = self.query_one("#merge-result", Static)
        result.update(Text(message.text, style="" if message.ok else "red"))
        result.display = True
        self.query_one("#merge-hint", Static).update(t("lifecycle.merge_hint_done"))  # nothing goes on now


# A refusal whose CLI message gives shell advice (--out, --force, --checkpoint N) is worded here by which key
# does it ({key}: the one that started the action), through render_stored's wording, as the dashboard's
# REASON_WORDING words a run's stored reason; the CLI keeps its own words.
LIFECYCLE_WORDING = {
    "lifecycle.out_not_replaceable": "lifecycle.out_not_replaceable_tui",
    "lifecycle.merge_running": "lifecycle.merge_running_tui",
    "lifecycle.export_out_running": "lifecycle.export_out_running_tui",
    "lifecycle.checkpoint_unreadable": "lifecycle.checkpoint_unreadable_tui",
    "lifecycle.checkpoint_rotated": "lifecycle.checkpoint_rotated_tui",
    "lifecycle.disk_full": "lifecycle.disk_full_tui",
    "lifecycle.out_below_file": "lifecycle.out_below_file_tui",
    "lifecycle.out_unwritable": "lifecycle.out_unwritable_tui",
    "lifecycle.serve_merge_incomplete": "lifecycle.serve_merge_incomplete_tui",
}


def app_words(text: str, record: object, key: str) -> str:
    """A lifecycle refusal (``text``, and its message as a ``{"key", "params"}`` record, when it has one)
    in the app's words (``LIFECYCLE_WORDING``), ``key`` being the key that started it; ``text`` as it is
    for one with no record."""
    if isinstance(record, dict) and isinstance(record.get("params"), dict):
        record = {**record, "params": {**record["params"], "key": key}}
    return render_stored(text, record, LIFECYCLE_WORDING)


def tui_words(exc: Exception, key: str) -> str:
    """``exc``'s message in the app's words (``app_words``); ``key``: the key that started the action."""
    message = exc.stored_message if isinstance(exc, TunedeckError) else None
    return app_words(str(exc) or type(exc).__name__, message.to_record() if message is not None else None, key)


# --- evaluate and export: no panel, a notification at each end ------------------------------------------
def _lifecycle_job(app: Any, name: str, start_text: str, work_: Any, key: str = "") -> None:
    """Run ``work_() -> str | None`` (the text to notify; None: nothing to say) in an app-level worker,
    announced by ``start_text``; a second one for the same run and command while the first is going only
    says so. ``key``: the key that starts it, for the app's own words of a refusal (``tui_words``)."""
    if any(w.name == name and not w.is_finished for w in app.workers):
        app.notify(start_text, timeout=5)
        return
    app.notify(start_text, timeout=8)

    def job() -> None:
        try:
            text = work_()
        except TunedeckError as exc:  # a LifecycleError: said in a notification
            text = tui_words(exc, key)
            app.call_from_thread(app.notify, text, severity="error", timeout=15)
            return
        except Exception as exc:  # a missing library, CUDA OOM, a bug: the error modal, the traceback logged
            from core.runs.disk_space import cannot_write_message, is_unwritable

            if is_unwritable(exc):  # a read-only or full disk under the run: its one line, as the CLI says it
                app.call_from_thread(app.notify, cannot_write_message(exc), severity="error", timeout=15)
                return
            report_unexpected(app, exc, f"lifecycle.{name}")
            return
        if text is not None:
            app.call_from_thread(app.notify, text, timeout=20)

    app.run_worker(job, name=name, thread=True, group="lifecycle", exit_on_error=False)


def evaluate_in_worker(app: Any, run_dir: Path) -> None:
    """The run's loss and sample answers, fine-tuned vs base (core.lifecycle.evaluate, as the CLI does)."""

    def work_() -> str:
        from core.lifecycle.evaluate import evaluate_run, evaluation_summary
        from core.runs import RunDirectory

        return evaluation_summary(evaluate_run(RunDirectory(run_dir)))

    _lifecycle_job(app, f"evaluate:{run_dir}", t("lifecycle.evaluating", run=run_dir.name), work_, key="E")


def export_in_worker(app: Any, run_dir: Path, force: bool = False) -> None:
    """The run's merged model in its export directory (core.lifecycle.export, the CLI's default format).

    A whole merge of the same checkpoint (M before X) is the export as it is. An earlier merge in the way
    that is not one is not a dead end (the TUI has no --out / --force): a dialog asks whether to replace it,
    and only y exports again with ``force``. A folder there that is no merge at all (the user's files) is
    never replaced: a notification says what it holds and to move it."""

    def work_() -> str | None:
        from core.lifecycle.export import export_note, export_run
        from core.lifecycle.source import OutputExists
        from core.runs import RunDirectory
        from core.watch.figures import format_bytes

        try:
            result = export_run(RunDirectory(run_dir), "merged", force=force)
        except OutputExists as exc:
            if force:
                raise
            app.call_from_thread(_ask_to_replace_export, app, run_dir, exc.path)
            return None
        size = format_bytes(result["bytes"])
        if result.get("reused"):
            text = t("lifecycle.export_reused", out=result["out"], size=size, step=result["step"])
        else:
            text = t("lifecycle.exported", format=result["format"], out=result["out"], size=size)
        note = export_note(result)  # into the bf16 base, not the 4-bit weights trained against, as M says
        return text if note is None else text + "\n" + note

    _lifecycle_job(app, f"export:{run_dir}", t("lifecycle.exporting", run=run_dir.name), work_, key="X")


def _ask_to_replace_export(app: Any, run_dir: Path, path: Path) -> None:
    from tui.widgets.confirm import ConfirmScreen

    def answered(ok: bool | None) -> None:
        if ok:
            export_in_worker(app, run_dir, force=True)

    app.push_screen(ConfirmScreen(t("lifecycle.replace_title", path=path.name),
                                  t("lifecycle.replace_body", path=str(path))), answered)


# --- the server ---------------------------------------------------------------------------------------
class ServerSeen(Message):
    """The server as the health poller last saw it (latest only)."""

    def __init__(self, state: dict[str, Any], alive: bool, healthy: bool | None) -> None:
        super().__init__()
        self.state = state
        self.alive = alive
        self.healthy = healthy

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ServerSeen)


class ServerStarted(Message):
    def __init__(self, url: str | None, error: str | None = None, needs_key: bool = False,
                 newest: int | None = None) -> None:
        super().__init__()
        self.url = url
        self.error = error
        self.needs_key = needs_key  # the server wants an API key this app does not have: no test request
        self.newest = newest  # the run's newest complete checkpoint when the server was started or found


class ServeWaiting(Message):
    """The start waits (True) for the run's previous server, being stopped, to end; or no longer (False)."""

    def __init__(self, waiting: bool) -> None:
        super().__init__()
        self.waiting = waiting


class TestAnswered(Message):
    def __init__(self, reply: str | None, seconds: float, error: str | None = None) -> None:
        super().__init__()
        self.reply = reply
        self.seconds = seconds
        self.error = error


class ServerStopped(Message):
    def __init__(self, stopped: bool) -> None:
        super().__init__()
        self.stopped = stopped


def reply_preview(reply: str) -> str:
    """The test reply on one line: line breaks shown as ⏎, a whitespace-only reply described (it would
    otherwise be blank lines pushing the panel's keys off an 80x24 screen), at most REPLY_PREVIEW_CHARS."""
    if not reply.strip():
        return t("lifecycle.serve_reply_blank", count=len(reply), lines=reply.count("\n"))
    shown = reply.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "⏎").replace("\t", " ")
    return shown if len(shown) <= REPLY_PREVIEW_CHARS else shown[:REPLY_PREVIEW_CHARS] + "…"


def _served_by_default(run_dir: Path) -> int | None:
    """The checkpoint a server of the run started now would serve (its newest sound one, as `serve RUN`
    picks it), or None; file I/O: a worker's."""
    from core.lifecycle.source import LifecycleError, resolve_model_source
    from core.runs import RunDirectory

    try:
        return resolve_model_source(RunDirectory(run_dir)).step
    except LifecycleError:
        return None


class ServePanel(KeyedModal[None]):
    """Starts (or finds) the run's detached server; shows URL, port, pid, status and health as they
    change; sends a test request once it is up. The test line is capped in height (a long error, a long
    reply), so that the keys' hint below it stays on an 80x24 screen."""

    DEFAULT_CSS = PANEL_CSS.format(name="ServePanel") + """
    ServePanel #serve-test { max-height: 5; overflow: hidden hidden; }
    """
    BINDINGS = [
        Binding("t", "test", t("lifecycle.key.test"), id="serve.test"),
        Binding("y", "copy_url", t("lifecycle.key.copy_url"), id="serve.copy"),
        Binding("k", "stop", t("lifecycle.key.stop_server"), id="serve.stop"),
        Binding("escape", "dismiss", t("lifecycle.key.close"), id="serve.close"),
    ]

    def __init__(self, run_dir: Path) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.run_id = self.run_dir.name
        self.state: dict[str, Any] = {}
        self.alive = False
        self.healthy: bool | None = None
        self.started = False
        self.start_error: str | None = None
        self.testing = False
        self.reply: str | None = None
        self.test_error: str | None = None
        self.test_seconds = 0.0
        self.test_note: str | None = None  # why no test request was sent (the server wants an API key)
        self.stopped = False
        # Until the start (or the find) answers: a record of a server that is not alive is the previous
        # one's (stopped, crashed), not this one's, which has not written its own yet.
        self.launching = True
        self.waiting = False  # the start waits for the previous server, being stopped, to end (ServeWaiting)
        self.newest: int | None = None  # the run's newest checkpoint: a server found may serve an older one

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(t("lifecycle.serve_title", run=self.run_id), classes="panel-title", markup=False)
            yield Static("", id="serve-fields", classes="panel-body")
            yield Static("", id="serve-test", classes="panel-body")
            yield Static(t("lifecycle.serve_hint", run=self.run_id), id="serve-hint", classes="panel-hint",
                         markup=False)

    def on_mount(self) -> None:
        self._show()
        self.watch_server()
        panel, app, run_dir = self, self.app, self.run_dir

        def job() -> None:
            from core.lifecycle.serve import (
                ServeStopped,
                ServeWaitCancelled,
                client_api_key,
                server_state,
                start_server,
                wait_until_ready,
            )
            from core.runs import RunDirectory

            # The app quitting cancels this worker: stop waiting then, the detached server goes on.
            worker = get_current_worker()

            def cancelled() -> bool:
                return worker.is_cancelled

            try:
                if server_state(run_dir.name) is not None:  # found, perhaps still loading its model
                    state = wait_until_ready(run_dir.name, cancelled=cancelled)
                else:
                    # the previous server still stopping (k, then this panel again): waited for, said in a
                    # note and shown in the panel's status while it lasts
                    state = start_server(RunDirectory(run_dir), cancelled=cancelled,
                                         note=lambda text: app.call_from_thread(app.notify, text, timeout=10),
                                         waiting=lambda on: panel.post_message(ServeWaiting(on)))
            except ServeWaitCancelled:
                return
            except ServeStopped:  # k here (its own note said so) or serve --stop: the panel shows it stopped
                panel.post_message(ServerStarted(None))
                return
            except TunedeckError as exc:  # a LifecycleError, a failed merge: said in the panel and a note
                text = tui_words(exc, "v")
                panel.post_message(ServerStarted(None, text))
                app.call_from_thread(app.notify, text, severity="error", timeout=15)
                return
            except Exception as exc:  # a missing library, a bug: the panel says so, the modal and log too
                panel.post_message(ServerStarted(None, describe(exc)))
                report_unexpected(app, exc, "lifecycle.serve")
                return
            newest_step = _served_by_default(run_dir)
            if state.auth and client_api_key() is None:  # a 401 would say nothing useful: say why not
                panel.post_message(ServerStarted(state.url, needs_key=True, newest=newest_step))
                return
            panel.post_message(ServerStarted(state.url, newest=newest_step))
            panel._probe(state.url)

        app.run_worker(job, thread=True, group="lifecycle", exit_on_error=False)

    # --- workers ---------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="serve-health", exit_on_error=False)
    def watch_server(self) -> None:
        """The state file and /v1/models, every second while the panel is open."""
        from core.lifecycle.serve import health, read_server_record, server_state

        worker = get_current_worker()
        while not worker.is_cancelled:
            record = read_server_record(self.run_id)
            alive = server_state(self.run_id) is not None
            url = str(record.get("url") or "")
            healthy = health(url, timeout=1.0) if url and alive else (False if url else None)
            self.post_message(ServerSeen(record, alive, healthy))
            end = time.monotonic() + HEALTH_EVERY_S
            while not worker.is_cancelled and time.monotonic() < end:
                time.sleep(0.05)

    def _probe(self, url: str) -> None:
        """The app's test request (a real chat completion); called in a worker thread."""
        from core.lifecycle.serve import probe_request

        started = time.monotonic()
        try:
            reply, seconds = probe_request(url, self.run_id)
        except TunedeckError as exc:  # a LifecycleError: no answer, a bad reply; said in the panel
            self.post_message(TestAnswered(None, time.monotonic() - started, str(exc) or type(exc).__name__))
            return
        except Exception as exc:  # a bug: the panel still leaves "sending …"; the modal and log say what
            self.post_message(TestAnswered(None, time.monotonic() - started, describe(exc)))
            report_unexpected(self.app, exc, "lifecycle.serve_test")
            return
        self.post_message(TestAnswered(reply, seconds))

    # --- handlers --------------------------------------------------------------------------------
    def on_server_seen(self, message: ServerSeen) -> None:
        if self.launching and not message.alive:  # the previous server's record: not what is starting now
            self.state, self.alive, self.healthy = {}, False, None
        else:
            self.state, self.alive, self.healthy = message.state, message.alive, message.healthy
        self._show()

    def on_serve_waiting(self, message: ServeWaiting) -> None:
        self.waiting = message.waiting and self.launching
        self._show()

    def on_server_started(self, message: ServerStarted) -> None:
        self.launching = False
        self.waiting = False
        self.newest = message.newest
        self.started = message.url is not None
        self.start_error = message.error
        self.testing = self.started and not message.needs_key
        self.test_note = t("lifecycle.serve_test_needs_key") if message.needs_key else None
        self._show()
        self.watch_server()  # its own record now: look at once, not on the next tick

    def on_test_answered(self, message: TestAnswered) -> None:
        self.testing = False
        self.test_note = None
        self.reply, self.test_seconds, self.test_error = message.reply, message.seconds, message.error
        self._show()

    def on_server_stopped(self, message: ServerStopped) -> None:
        self.stopped = message.stopped
        self.notify(t("lifecycle.serve_stopped" if message.stopped else "lifecycle.serve_not_running",
                      run=self.run_id), severity="information" if message.stopped else "warning")
        self.watch_server()  # look again now, not on the next tick

    # --- presentation ----------------------------------------------------------------------------
    def phase(self) -> str:
        """waiting (for the previous server, being stopped, to end), starting, loading, ready, stopped or
        failed: what the panel says the server is doing."""
        if self.start_error:
            return "failed"
        if self.waiting:
            return "waiting"
        status = str(self.state.get("status") or "starting")
        if self.state and not self.alive and status != "starting":
            return "stopped"
        return status if status in ("starting", "loading", "ready", "stopped") else "starting"

    def _show(self) -> None:
        state = self.state
        url = str(state.get("url") or "")
        if url:
            health = {None: t("lifecycle.health_checking"), True: t("lifecycle.health_ok"),
                      False: t("lifecycle.health_down")}[self.healthy]
        else:
            health = t("lifecycle.health_checking") if self.alive or not self.started else "–"
        fields = [
            (t("lifecycle.field.status"), t("lifecycle.phase." + self.phase())),
            (t("lifecycle.field.url"), url or "–"),
            (t("lifecycle.field.port"), str(state.get("port") or "–") if url else "–"),
            (t("lifecycle.field.pid"), str(state.get("pid") or "–") if self.alive else "–"),
            (t("lifecycle.field.backend"), str(state.get("backend") or "–")),
            (t("lifecycle.field.auth"), "–" if "auth" not in state else
             t("lifecycle.auth_required" if state.get("auth") else "lifecycle.auth_not_required")),
            (t("lifecycle.field.health"), health),
        ]
        step = state.get("step")
        if isinstance(step, int) and url:  # a run's server: the checkpoint it serves (before the health)
            shown = str(step) if self.newest in (None, step) else t("lifecycle.serve_step_not_newest", step=step,
                                                                    newest=self.newest)
            fields.insert(len(fields) - 1, (t("lifecycle.field.checkpoint"), shown))
        lines = []
        width = max(cell_len(label) for label, _ in fields)
        for index, (label, value) in enumerate(fields):
            style = ""
            if index == len(fields) - 1 and url:  # health
                style = "green" if self.healthy else "red" if self.healthy is False else ""
            lines.append(Text.assemble((pad(label, width) + "  ", "bold"), (value, style)))
        self.query_one("#serve-fields", Static).update(Text("\n").join(lines))
        test = self.query_one("#serve-test", Static)
        if self.start_error:
            test.update(Text(self.start_error, style="red"))
        elif self.testing:
            test.update(Text(t("lifecycle.test_sending")))
        elif self.test_note:
            test.update(Text(self.test_note, style="yellow"))
        elif self.test_error:
            test.update(Text(t("lifecycle.test_failed", error=self.test_error), style="red"))
        elif self.reply is not None:
            test.update(Text(t("lifecycle.serve_test", seconds=self.test_seconds, reply=reply_preview(self.reply))))
        else:
            test.update("")
        test.display = bool(self.start_error or self.testing or self.test_note or self.test_error
                            or self.reply is not None)
        # The hint follows the server: "keeps running" only while there is one to keep running.
        gone = self.phase() in ("stopped", "failed")
        self.query_one("#serve-hint", Static).update(
            t("lifecycle.serve_hint_stopped") if gone else t("lifecycle.serve_hint", run=self.run_id))

    def url(self) -> str | None:
        url = str(self.state.get("url") or "")
        return url if url and self.alive else None

    # --- actions ---------------------------------------------------------------------------------
    def action_test(self) -> None:
        if self.testing:
            self.notify(t("lifecycle.test_running"), severity="information", timeout=5)
            return
        url = self.url()
        if url is None:
            self.notify(t("lifecycle.serve_not_running", run=self.run_id), severity="warning")
            return
        from core.lifecycle.serve import client_api_key

        if self.state.get("auth") and client_api_key() is None:
            self.test_note = t("lifecycle.serve_test_needs_key")
            self._show()
            return
        self.testing, self.test_note = True, None
        self._show()
        self.app.run_worker(lambda: self._probe(url), thread=True, group="lifecycle", exit_on_error=False)

    def action_copy_url(self) -> None:
        url = self.url()
        if url is None:
            self.notify(t("lifecycle.serve_not_running", run=self.run_id), severity="warning")
            return
        self.app.copy_to_clipboard(url)
        self.notify(t("lifecycle.url_copied", url=url), timeout=5)

    def action_stop(self) -> None:
        if not self.alive:
            # Before the new server has a process (the checks, the backend's choice), "no server is running"
            # was untrue: it came up a moment later and served. Said as it is, by k and the palette alike.
            key = "lifecycle.serve_still_starting" if self.launching and not self.start_error \
                else "lifecycle.serve_not_running"
            self.notify(t(key, run=self.run_id), severity="warning")
            return
        from tui.widgets.confirm import ConfirmScreen

        def answered(ok: bool | None) -> None:
            if ok:
                self._stop()

        url = self.url()
        # Still starting (no address yet): "Clients using – lose their connection" said nothing true.
        body = t("lifecycle.stop_server_body", url=url) if url else t("lifecycle.stop_server_body_starting")
        self.app.push_screen(ConfirmScreen(t("lifecycle.stop_server_title", run=self.run_id), body), answered)

    def _stop(self) -> None:
        panel, run_id = self, self.run_id

        def job() -> None:
            from core.lifecycle.serve import stop_server

            panel.post_message(ServerStopped(stop_server(run_id)))

        self.app.run_worker(job, thread=True, group="lifecycle", exit_on_error=False)
