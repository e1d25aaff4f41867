"""Chat with a run's result: the model runs in a worker process and streams tokens into the transcript.

Side by side (F2) sends each message to the base (adapter off) and the fine-tuned model, one after the
other, in the same worker. A model without an adapter (a full fine-tune, a merged folder) has no base to
switch to: its one pane takes the width and F2 is not offered. The system prompt, temperature and max
tokens sit above the transcript.

Leaving the screen (Esc, a palette "Go to …") ends the model process but not the conversation: both panes,
the system prompt, the sampling settings, F2 and an unsent message are kept in the app (``KeptChat``, one
per run or model folder, for the app session) and come back when the chat is opened again. Where the run
has a newer checkpoint by then (it was resumed), the earlier transcript stays visible above a line that
says step N -> step M, and the new checkpoint is sent only what comes below it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, Input, Static

from core.i18n import t
from tui.widgets.keys_footer import KeysFooter
from tui.widgets.lifecycle_panels import app_words

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("base", "tuned")


class WorkerEvent(Message):
    """One JSON line from the chat worker process."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__()
        self.record = record


NOTE = "note"  # a turn's role for a line of the screen's own (the checkpoint changed), never sent to a model


@dataclass
class KeptChat:
    """A conversation left by leaving the chat screen, as the app keeps it until the chat is opened again
    on the same run or model folder (in memory, for the app session). ``step``: the checkpoint its replies
    came from (None: a model folder, or not known: the model never loaded)."""

    step: int | None
    turns: dict[str, list[tuple[str, str]]] = dataclass_field(default_factory=dict)
    system: str = ""
    temperature: str = "0.7"
    max_tokens: str = "256"
    draft: str = ""
    compare: bool | None = None


def kept_chats(app: Any) -> dict[str, KeptChat]:
    """The app's kept conversations, by ``ChatScreen.keep_key``."""
    kept = getattr(app, "chat_kept", None)
    if kept is None:
        kept = app.chat_kept = {}
    return kept


def transcript_text(turns: list[tuple[str, str]]) -> Text:
    """The turns as shown: the speaker's label, its colon (the reader's language's: 你：), the text."""
    out = Text()
    for role, text in turns:
        if role == NOTE:
            out.append(text + "\n\n", style="italic yellow")
            continue
        style = "bold cyan" if role == "user" else "bold green"
        out.append(t("chat.you") if role == "user" else t("chat.model"), style=style)
        out.append(t("chat.speaker_colon") + text + "\n\n")
    return out


class Transcript(VerticalScroll):
    """One model's side of the conversation."""

    def __init__(self, title: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.border_title = title
        self.turns: list[tuple[str, str]] = []
        self.pieces = 0  # streamed pieces of the last turn

    def compose(self) -> ComposeResult:
        yield Static("", classes="chat-text")

    def add(self, role: str, text: str) -> None:
        self.turns.append((role, text))
        self.pieces = 0
        self.refresh_text(follow=True)  # a new message: shown, wherever the reader was

    def append_to_last(self, piece: str) -> None:
        role, text = self.turns[-1]
        self.turns[-1] = (role, text + piece)
        self.pieces += 1
        self.refresh_text()

    def refresh_text(self, follow: bool | None = None) -> None:
        """Show the turns. The pane follows the newest text only where the reader is at its end: one who
        paged up to read an earlier part of a long reply is not pulled back down by each streamed piece."""
        if follow is None:
            follow = self.scroll_y >= self.max_scroll_y
        self.query_one(".chat-text", Static).update(transcript_text(self.turns))
        if follow:
            self.scroll_end(animate=False)

    def page(self, direction: int) -> None:
        if direction < 0:
            self.scroll_page_up(animate=False)
        else:
            self.scroll_page_down(animate=False)

    def messages(self) -> list[dict[str, str]]:
        """The turns as the model is sent them. A user turn left unanswered (side by side, this side's reply
        stopped or failed before any text while the other side answered: both panes keep the same user turns)
        is joined to the next one, each shown as written: a template that demands alternating turns
        (Gemma's) refuses two user messages in a row, and this model is given what its pane shows."""
        out: list[dict[str, str]] = []
        notes = [i for i, (role, _) in enumerate(self.turns) if role == NOTE]
        # the turns above a note came from an earlier checkpoint: this model is not sent them as its own
        for role, text in self.turns[notes[-1] + 1 if notes else 0:]:
            if role == "user" and out and out[-1]["role"] == "user":
                out[-1]["content"] += "\n\n" + text
            else:
                out.append({"role": role, "content": text})
        return out


def _reap(proc: subprocess.Popen[str]) -> None:
    """Wait for the model process to end (a thread's): terminated after 2 s, killed after 5 more."""
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
        with _reaping_lock:
            _reaping.pop(threading.current_thread(), None)


# The reapers still waiting for a model process, and their processes: a daemon thread dies with the app, its
# kill never run, so the app's exit finishes them (``finish_reapers``).
_reaping: dict[threading.Thread, subprocess.Popen[str]] = {}
_reaping_lock = threading.Lock()
REAP_AT_EXIT_S = 3.0


def start_reaper(proc: subprocess.Popen[str]) -> threading.Thread:
    """Reap ``proc`` on a daemon thread (``_reap``), known to ``finish_reapers`` until it ends."""
    thread = threading.Thread(target=_reap, args=(proc,), daemon=True, name="tunedeck-chat-reaper")
    with _reaping_lock:
        _reaping[thread] = proc
    thread.start()
    return thread


def finish_reapers(timeout_s: float = REAP_AT_EXIT_S) -> None:
    """At the app's exit: every model process a reaper still waits for is terminated now, its reaper joined
    for ``timeout_s`` in all, and one still running then is killed. Esc then quit left a model that was loading
    (it reads no SIGTERM before its load ends) running once the app was gone."""
    with _reaping_lock:
        pending = list(_reaping.items())
    for _thread, proc in pending:
        if proc.poll() is None:
            try:
                proc.terminate()
            except OSError:
                pass
    deadline = time.monotonic() + timeout_s
    for thread, proc in pending:
        thread.join(max(0.0, deadline - time.monotonic()))
        if proc.poll() is None:
            try:
                proc.kill()
                proc.wait(timeout=1)
            except (OSError, subprocess.TimeoutExpired):
                pass


class MessageInput(Input):
    """The message (and system prompt) field: one line on screen. Textual's field kept only the first line of a paste, the rest
    of a pasted prompt (code, a list) dropped unsaid; here every line stays, each line break shown as ⏎ and
    sent as a line break (``message_text``)."""

    def _on_paste(self, event: events.Paste) -> None:
        event.prevent_default()  # not Input's own, which keeps the first line
        event.stop()
        if not event.text:
            return
        text = field_text(event.text.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n"))
        if self.selection.is_empty:
            self.insert_text_at_cursor(text)
        else:
            self.replace(text, *self.selection)


LINE_BREAK = "⏎"


def field_text(message: str) -> str:
    """A message as its one-line field shows it: line breaks as ⏎."""
    return message.replace("\n", LINE_BREAK)


def message_text(value: str) -> str:
    """The message a field's value stands for: its ⏎ line breaks again, ends trimmed."""
    return value.replace(LINE_BREAK, "\n").strip()


class ChatScreen(Screen[None]):
    """Chat with base + adapter of a run (or a merged model folder)."""

    DEFAULT_CSS = """
    ChatScreen #chat-settings { height: 3; }
    ChatScreen #chat-system { width: 1fr; }
    ChatScreen #chat-temperature, ChatScreen #chat-max-tokens { width: 20; }
    ChatScreen #chat-panes { height: 1fr; }
    ChatScreen Transcript { width: 1fr; border: round $foreground-muted; border-title-color: $primary; }
    ChatScreen #chat-status { height: auto; max-height: 4; padding: 0 1; color: $text-muted; }
    """
    # A jump to another section (the palette's "Go to GPUs") leaves the chat as Esc does (tui.app's
    # action_section): its conversation kept (KeptChat), its model process ended. Before, the chat stayed
    # on the Runs stack and its model went on holding GPU memory behind the user's back.
    CLOSES_ON_SECTION_JUMP = True

    BINDINGS = [
        Binding("f2", "toggle_compare", t("chat.key.compare"), id="chat.compare"),
        Binding("ctrl+l", "clear", t("chat.key.clear"), id="chat.clear"),
        # Ctrl+G (readline's and Emacs' "abort"): Ctrl+C copies in a text field and asks to quit elsewhere.
        Binding("ctrl+g", "stop_reply", t("chat.key.stop"), id="chat.stop"),
        Binding("escape", "back", t("chat.key.back"), id="chat.back"),
        # The message field has the focus, and a one-line field takes PgUp/PgDn (to scroll itself: nothing):
        # before it, they page the transcript (both panes side by side) from wherever the focus is.
        Binding("pageup", "page(-1)", t("chat.key.page_up"), show=False, priority=True, id="chat.page_up"),
        Binding("pagedown", "page(1)", t("chat.key.page_down"), show=False, priority=True, id="chat.page_down"),
    ]

    def __init__(self, run_dir: Path | None = None, model_dir: Path | None = None,
                 checkpoint: int | None = None, compare: bool = False, adapter: bool | None = None) -> None:
        """``adapter``: whether the model has one, when the caller knows before it loads (None: the worker
        says once the model is ready; a model folder never has one)."""
        super().__init__(name="chat")
        self.run_dir = run_dir
        self.model_dir = model_dir
        self.checkpoint = checkpoint
        self.adapter_known: bool | None = False if model_dir is not None else adapter
        self.compare = compare and self.adapter_known is not False
        self.ready = False
        self.stopped = False  # the reply under way (or the last one) was stopped by the stop key
        self.has_adapter = False
        self.busy: set[str] = set()
        self.reply_ids: dict[str, int] = {}  # the worker's request id of each variant's reply under way
        # how each reply to the last message ended ("done", "stopped", "error"), by variant: once all have,
        # a reply stopped or failed before any text is taken out of its pane (_exchange_ended)
        self.endings: dict[str, str] = {}
        self.overflows: dict[str, dict[str, Any]] = {}  # the too_long records of the replies past the context
        # the seconds of the last message's replies so far: side by side the worker generates one after the
        # other, so "done in" is their sum (the last reply's own time alone was the tuned side's)
        self.exchange_seconds = 0.0
        self.next_id = 0
        self.proc: subprocess.Popen[str] | None = None
        self.load_error: str | None = None  # why the model did not load (the worker then exits)
        self.label = str(run_dir.name if run_dir else model_dir.name if model_dir else "")
        self.step: int | None = None  # the checkpoint the worker loaded (its ready event)
        self.keep_key = f"run:{run_dir}" if run_dir is not None else f"model:{model_dir}"
        self.kept: KeptChat | None = None  # the conversation taken back on opening, if one was kept
        self._panes: dict[str, Transcript] = {}
        self._fields: dict[str, Input] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="chat-settings"):
            yield MessageInput(placeholder=t("chat.system_placeholder"), id="chat-system")
            yield Input("0.7", placeholder=t("chat.temperature"), id="chat-temperature", type="number")
            yield Input("256", placeholder=t("chat.max_tokens"), id="chat-max-tokens", type="integer")
        with Horizontal(id="chat-panes"):
            yield Transcript(t("chat.base_title"), id="chat-base")
            yield Transcript(t("chat.tuned_title"), id="chat-tuned")
        yield Static(t("chat.loading", model=self.label), id="chat-status")
        yield MessageInput(placeholder=t("chat.input_placeholder"), id="chat-input")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.title = t("app.title")
        self.sub_title = t("chat.subtitle", model=self.label)
        self.query_one("#chat-temperature", Input).border_title = t("chat.temperature")
        self.query_one("#chat-max-tokens", Input).border_title = t("chat.max_tokens")  # its value hides the placeholder
        self._restore()
        self.query_one("#chat-base", Transcript).display = self.compare
        self.query_one("#chat-input", Input).focus()
        self._start_worker()

    # --- the conversation kept while the screen is away ------------------------------------------
    def _restore(self) -> None:
        """Take back the conversation kept when this chat was last left (shown while the model loads)."""
        # held for _keep: on unmount the widgets are out of the DOM already, past query_one's reach
        self._panes = {variant: self._pane(variant) for variant in VARIANTS}
        self._fields = {selector: self.query_one(selector, Input)
                        for selector in ("#chat-system", "#chat-temperature", "#chat-max-tokens", "#chat-input")}
        self.kept = kept = kept_chats(self.app).pop(self.keep_key, None)
        if kept is None:
            return
        self.step = kept.step
        for variant in VARIANTS:
            pane = self._pane(variant)
            pane.turns = list(kept.turns.get(variant, []))
            pane.refresh_text(follow=True)
        for selector, value in (("#chat-system", kept.system), ("#chat-temperature", kept.temperature),
                                ("#chat-max-tokens", kept.max_tokens), ("#chat-input", kept.draft)):
            self.query_one(selector, Input).value = value
        if kept.compare is not None and self.adapter_known is not False:
            self.compare = kept.compare

    def _keep(self) -> None:
        """Keep the conversation in the app as the screen goes (its model process ends). A reply under way
        keeps what came of it, as a stopped one does; one with no text yet leaves no empty answer."""
        if not self._fields:  # never mounted: nothing shown, nothing to keep
            return
        turns = {variant: [turn for i, turn in enumerate(pane.turns)
                           if not (i == len(pane.turns) - 1 and turn == ("assistant", ""))]
                 for variant, pane in self._panes.items()}
        values = {selector: box.value for selector, box in self._fields.items()}
        kept_chats(self.app)[self.keep_key] = KeptChat(
            step=self.step, turns=turns, system=values["#chat-system"], temperature=values["#chat-temperature"],
            max_tokens=values["#chat-max-tokens"], draft=values["#chat-input"], compare=self.compare)

    def _checkpoint_changed(self, step: int) -> None:
        """The model loaded from another checkpoint than the kept conversation's (the run was resumed since):
        the earlier transcript stays to be read, under a line that says so; the new checkpoint is sent only
        what follows the line, never the earlier one's replies as its own."""
        line = t("chat.checkpoint_changed", old=self.step, new=step)  # either way: an older one is loaded where
        noted = False  # the newest is damaged (passed over)
        for variant in VARIANTS:
            pane = self._pane(variant)
            if any(role != NOTE for role, _ in pane.turns):
                pane.add(NOTE, line)
                noted = True
        if noted:  # nothing said before it (a system prompt or a draft kept alone): nothing to tell apart
            self.notify(line, severity="warning", timeout=15)

    # --- the worker process ----------------------------------------------------------------------
    def _start_worker(self) -> None:
        cmd = [sys.executable, "-m", "core.lifecycle.chat_worker"]
        if self.model_dir is not None:
            cmd += ["--model-dir", str(self.model_dir)]
        else:
            cmd += ["--run", str(self.run_dir)]
            if self.checkpoint is not None:
                cmd += ["--checkpoint", str(self.checkpoint)]
        self.proc = subprocess.Popen(cmd, cwd=str(ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)
        threading.Thread(target=self._read_worker, args=(self.proc,), daemon=True,
                         name="tunedeck-chat-reader").start()

    def _read_worker(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            self.post_message(WorkerEvent(record))
        self.post_message(WorkerEvent({"event": "exited", "code": proc.wait()}))

    def _stop_worker(self) -> None:
        """End the model process without waiting for it here: Esc froze the screen for 2 s and more while the
        model loaded or a reply was generated (the process reads its end only between replies). An idle
        model ends on its closed stdin; one loading or generating is terminated at once, nothing of it to
        keep. A thread reaps it, killing it where it does not end."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.close()
        except OSError:
            pass
        if not self.ready or self.busy:
            proc.terminate()
        start_reaper(proc)

    def on_unmount(self) -> None:
        self._stop_worker()
        self._keep()  # every way out: Esc, a palette "Go to …", a section key popping the stack

    def on_worker_event(self, message: WorkerEvent) -> None:
        record = message.record
        event = record.get("event")
        status = self.query_one("#chat-status", Static)
        if event == "ready":
            self.ready = True
            self.has_adapter = self.adapter_known = bool(record.get("has_adapter"))
            step = record.get("step")
            if isinstance(step, int):
                if self.kept is not None and self.step is not None and step != self.step:
                    self._checkpoint_changed(step)
                self.step = step
            if not self.has_adapter:  # nothing to compare with: one full-width pane, no F2
                self.compare = False
                self.query_one("#chat-base", Transcript).display = False
            self.refresh_bindings()
            status.update(t("chat.ready", model=str(record.get("label", self.label)),
                            device=str(record.get("device", ""))))
        elif event == "token":
            self._pane(str(record.get("variant"))).append_to_last(str(record.get("text", "")))
        elif event == "done":
            variant = str(record.get("variant"))
            self.endings[variant] = "stopped" if record.get("stopped") else "done"
            self.exchange_seconds += float(record.get("seconds") or 0.0)
            self._reply_ended(variant)
            if record.get("stopped"):
                self.stopped = True
            if not self.busy:
                unanswered = self._exchange_ended()
                status.update(t("chat.stopped_empty") if self.stopped and unanswered else t("chat.stopped")
                              if self.stopped else t("chat.done", seconds=self.exchange_seconds))
        elif event == "too_long":
            self._too_long(record, status)
        elif event == "warning":  # a Python warning of the model's code, ours or the user's: said, not acted on
            self.notify(t("chat.warning", message=str(record.get("message", ""))), severity="warning", timeout=15)
        elif event == "error":
            if record.get("id") is not None:
                self.endings[str(record.get("variant"))] = "error"
            self._reply_ended(str(record.get("variant")))
            if record.get("id") is not None and not self.busy:
                self._exchange_ended()
            # In the app's words where the CLI's give shell advice (--checkpoint N): a opens this chat again.
            text = app_words(str(record.get("message", "")), record.get("message_record"), "a")
            if record.get("id") is None:  # loading failed: the reason stays on the status line
                self.load_error = text
            status.update(t("chat.error", message=text))
            self.notify(t("chat.error", message=text), severity="error")
        elif event == "exited" and self.proc is not None:
            self.ready = False
            if self.load_error is not None:  # not "open the chat again": it would fail the same way
                status.update(t("chat.load_failed", message=self.load_error))
            else:
                status.update(t("chat.worker_exited", code=record.get("code")))

    def _too_long(self, record: dict[str, Any], status: Static) -> None:
        """The worker refused to generate: the conversation and max tokens go past the model's context. The
        message goes back to its field and out of the transcript (nothing was answered); once every reply
        of the message has been refused, one line says the counts and what to do. Side by side the worker
        refuses both when one side is over (its conversation can be the longer one): the line names it."""
        from tui.widgets.keys_footer import key_name

        variant = str(record.get("variant"))
        self.endings[variant] = "too_long"
        if record.get("over", True):
            self.overflows[variant] = record
        self._reply_ended(variant)
        pane = self._pane(variant)
        if len(pane.turns) >= 2 and pane.turns[-1] == ("assistant", ""):
            text = pane.turns[-2][1]
            del pane.turns[-2:]
            pane.refresh_text()
            field = self.query_one("#chat-input", Input)
            if not field.value:
                field.value = field_text(text)
        if self.busy:  # side by side: said once, when both are refused
            return
        refused, overflows = len(self.endings), dict(self.overflows)
        self._exchange_ended()
        if not overflows:
            return
        side, over = max(overflows.items(), key=lambda item: int(item[1].get("prompt") or 0))
        clear = next(b.key for b in self.BINDINGS if isinstance(b, Binding) and b.id == "chat.clear")
        prompt, max_tokens = int(over.get("prompt") or 0), int(over.get("max_tokens") or 0)
        words = dict(prompt=prompt, max_tokens=max_tokens, total=prompt + max_tokens, limit=over.get("limit"),
                     clear=key_name(clear) or clear)
        if len(overflows) < refused:  # one side over, the other fits: the message went to neither
            line = t("chat.too_long_side", side=self._pane(side).border_title, **words)
        else:
            line = t("chat.too_long", **words)
        status.update(line)
        self.notify(line, severity="warning", timeout=15)

    def _exchange_ended(self) -> bool:
        """Every reply to the last message has ended. One stopped (or failed) before any text leaves no
        assistant turn: an empty one would go to the model as its answer with the next message. The user's
        turn stays where another pane got a reply (side by side, both panes keep the same user turns); where
        no pane got any, the message goes back to its field and out of every pane, as if never sent.
        Whether it went back."""
        empty = [v for v, how in self.endings.items()
                 if how in ("stopped", "error") and self._pane(v).turns[-1:] == [("assistant", "")]]
        for variant in empty:
            self._pane(variant).turns.pop()
        # a refused reply (past the context) has taken its turns out already: it got no answer either
        unanswered = bool(empty) and all(v in empty or how == "too_long" for v, how in self.endings.items())
        if unanswered:
            text = ""
            for variant in empty:
                pane = self._pane(variant)
                if pane.turns and pane.turns[-1][0] == "user":
                    text = pane.turns.pop()[1]
            field = self.query_one("#chat-input", Input)
            if text and not field.value:
                field.value = field_text(text)
        for variant in empty:
            self._pane(variant).refresh_text()
        self.endings, self.overflows = {}, {}
        return unanswered

    def _reply_ended(self, variant: str) -> None:
        self.busy.discard(variant)
        self.reply_ids.pop(variant, None)
        self.refresh_bindings()  # the stop key goes with the last reply

    def _pane(self, variant: str) -> Transcript:
        return self.query_one("#chat-base" if variant == "base" else "#chat-tuned", Transcript)

    # --- sending ---------------------------------------------------------------------------------
    def _settings(self) -> tuple[float, int] | None:
        """The temperature and reply length in their fields (empty: the defaults), checked as `tunedeck chat`
        checks its --temperature and --max-tokens; a wrong one is said, its field focused, and None returned
        (nothing is sent: the message stays in its field)."""
        import argparse

        from core.config.checks import cli_number

        values = []
        for field, kind, default in (("#chat-temperature", float, 0.7), ("#chat-max-tokens", int, 256)):
            box = self.query_one(field, Input)
            try:
                values.append(cli_number(kind, minimum=0 if kind is float else 1)(box.value.strip())
                              if box.value.strip() else default)
            except argparse.ArgumentTypeError as exc:
                self.notify(t("chat.bad_setting", name=box.border_title, problem=str(exc)), severity="error")
                box.focus()
                return None
        return values[0], values[1]

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "chat-input":
            self.query_one("#chat-input", Input).focus()
            return
        text = message_text(event.value)
        if not text:
            return
        if not self.ready or self.proc is None or self.proc.stdin is None:
            self.notify(t("chat.not_ready"), severity="warning")
            return
        if self.busy:
            self.notify(t("chat.busy"), severity="warning")
            return
        settings = self._settings()
        if settings is None:
            return
        temperature, max_tokens = settings
        event.input.value = ""
        self.endings, self.overflows = {}, {}
        self.exchange_seconds = 0.0
        system = message_text(self.query_one("#chat-system", Input).value)
        variants = [v for v in VARIANTS if v == "tuned" or (self.compare and self.has_adapter)]
        requests = []
        for variant in variants:
            pane = self._pane(variant)
            pane.add("user", text)
            messages = pane.messages()
            if system:
                messages.insert(0, {"role": "system", "content": system})
            pane.add("assistant", "")
            self.next_id += 1
            requests.append({"id": self.next_id, "variant": variant, "messages": messages,
                             "temperature": temperature, "max_tokens": max_tokens})
            self.busy.add(variant)
            self.reply_ids[variant] = self.next_id
        # side by side, one line: the worker checks both conversations against the context before either
        # is generated, so that one side past it refuses the message for both
        line = requests[0] if len(requests) == 1 else {"replies": requests}
        self.proc.stdin.write(json.dumps(line) + "\n")
        self.proc.stdin.flush()
        self.stopped = False
        self.refresh_bindings()
        self.query_one("#chat-status", Static).update(t("chat.generating"))

    # --- actions ---------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "toggle_compare" and self.adapter_known is False:
            return False  # no adapter: no base model to show beside it
        if action == "stop_reply":
            return bool(self.busy)  # offered while a reply is being generated
        return True

    def footer_priority(self) -> tuple[str, ...]:
        return ("chat.stop",)  # while a reply streams in, stopping it is what matters most

    def action_stop_reply(self) -> None:
        """End the reply being generated (both, side by side): what came stays in the transcript, and the model
        stays loaded for the next message (Esc ends the model process)."""
        if not self.busy or self.proc is None or self.proc.stdin is None:
            return
        try:
            self.proc.stdin.write(json.dumps({"stop": sorted(self.reply_ids.values())}) + "\n")
            self.proc.stdin.flush()
        except OSError:  # the process is gone: its "exited" event says so
            return
        self.query_one("#chat-status", Static).update(t("chat.stopping"))

    def action_page(self, direction: int) -> None:
        """Page the focused pane, or (from a field) every pane shown."""
        focused = self.focused
        panes = [focused] if isinstance(focused, Transcript) else \
            [pane for pane in (self._pane(v) for v in VARIANTS) if pane.display]
        for pane in panes:
            pane.page(direction)

    def action_toggle_compare(self) -> None:
        if self.ready and not self.has_adapter:
            self.notify(t("chat.no_base"), severity="warning")
            return
        self.compare = not self.compare
        self.query_one("#chat-base", Transcript).display = self.compare

    def action_clear(self) -> None:
        if self.busy:  # the reply streaming in belongs to the transcript: said, not silently ignored
            self.notify(t("chat.busy"), severity="warning")
            return
        for variant in VARIANTS:
            pane = self._pane(variant)
            pane.turns.clear()
            pane.refresh_text()

    def action_back(self) -> None:
        self._stop_worker()
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()


# --- after-training actions the dashboard offers on a finished run ---------------------------------------
class RunResultChecked(Message):
    """From the check worker to the screen that asked for ``what``: why it cannot be done now
    (``problem``, a warning to show) or, with ``problem`` empty, go ahead; ``adapter``: the run's
    checkpoints are adapters (chat and merge say what they load); ``notice``: a warning to show before going
    ahead (the newest checkpoint is damaged and an older one is used), or ""."""

    def __init__(self, what: str, run_dir: Path, problem: str, adapter: bool, notice: str = "") -> None:
        super().__init__()
        self.what = what
        self.run_dir = run_dir
        self.problem = problem
        self.adapter = adapter
        self.notice = notice


def _check_result(run_dir: Path) -> tuple[str, bool, str]:
    """(problem, adapter, notice) of a run about to be merged, chatted with …: its status (liveness applied),
    a directory scan of its checkpoints, and whether the newest is damaged and passed over (the CLI says so
    on stderr; here it would go unsaid: the chat loads in a process whose stderr is dropped). File I/O: a
    worker's, never the UI thread's."""
    from core.lifecycle.source import no_checkpoint_message, passed_over_notice, run_has_adapter
    from core.runs import ACTIVE_STATES, RunDirectory, effective_status
    from core.runs.states import state_label

    run = RunDirectory(run_dir)
    status = effective_status(run).status
    if status in ACTIVE_STATES:  # a stalled run too: its supervisor is alive and may step again
        return t("lifecycle.tui_still_running", status=state_label(status)), False, ""
    if run.last_complete_checkpoint() is None:
        return no_checkpoint_message(run, status), False, ""
    return "", run_has_adapter(run), passed_over_notice(run) or ""


def after_training(screen: Any, what: str, run_dir: Path) -> None:
    """Merge / chat / serve / evaluate / export ``run_dir``: its status and checkpoint are read again in a
    worker (the run may have been resumed, or its checkpoints deleted, since the screen last looked), which
    posts ``RunResultChecked`` to ``screen``; its handler calls ``take_after_training``."""
    from textual.worker import get_current_worker

    from tui.gpu_poll import expected_errors
    from tui.screens.error_modal import report_unexpected

    def check() -> None:
        try:
            problem, adapter, notice = _check_result(Path(run_dir))
        except expected_errors() as exc:
            problem, adapter, notice = t("lifecycle.tui_check_failed", run=Path(run_dir).name,
                                         error=f"{type(exc).__name__}: {exc}"), False, ""
        except Exception as exc:  # a bug: the error modal, not a dead key
            report_unexpected(screen.app, exc, "after_training.check")
            return
        if not get_current_worker().is_cancelled:  # not a key pressed again, nor the screen gone
            screen.post_message(RunResultChecked(what, Path(run_dir), problem, adapter, notice))

    screen.run_worker(check, thread=True, exclusive=True, group="after-training", exit_on_error=False)


def take_after_training(screen: Any, message: RunResultChecked) -> None:
    """On the UI thread, with the worker's answer: the warning, or the panel / screen / app worker."""
    if message.problem:
        screen.notify(message.problem, severity="warning")
        return
    if message.notice:
        screen.notify(message.notice, severity="warning", timeout=15)
    actions = {"merge": merge_in_background, "chat": open_chat, "serve": serve_in_background,
               "evaluate": evaluate_in_background, "export": export_in_background}
    actions[message.what](screen, message.run_dir, message.adapter)


def open_chat(screen: Any, run_dir: Path, adapter: bool) -> None:
    """Push the chat screen for ``run_dir`` (a finished run with a checkpoint): base and fine-tuned side by
    side for an adapter, the fine-tuned model alone for a full fine-tune."""
    screen.app.push_screen(ChatScreen(run_dir=run_dir, compare=adapter, adapter=adapter))


def merge_in_background(screen: Any, run_dir: Path, adapter: bool) -> None:
    """Merge the run's adapter in a worker, shown stage by stage in a panel that ends with the merged
    directory (closing the panel leaves the merge going; a notification says where the model went)."""
    from tui.widgets.lifecycle_panels import MergePanel

    screen.app.push_screen(MergePanel(Path(run_dir), adapter=adapter))


def evaluate_in_background(screen: Any, run_dir: Path, adapter: bool) -> None:
    """``tunedeck evaluate RUN`` in an app-level worker; a notification gives the losses and the file."""
    from tui.widgets.lifecycle_panels import evaluate_in_worker

    evaluate_in_worker(screen.app, Path(run_dir))


def export_in_background(screen: Any, run_dir: Path, adapter: bool) -> None:
    """``tunedeck export RUN`` (a merged model) in an app-level worker; a notification says where it went."""
    from tui.widgets.lifecycle_panels import export_in_worker

    export_in_worker(screen.app, Path(run_dir))


def serve_in_background(screen: Any, run_dir: Path, adapter: bool) -> None:
    """Start (or find) the run's detached server in a panel showing URL, port, health and a test request."""
    from tui.widgets.lifecycle_panels import ServePanel

    screen.app.push_screen(ServePanel(Path(run_dir)))
