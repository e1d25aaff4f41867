"""The full-screen app: four sections as modes, help and palette generated from the bindings.

Built by ``make_app`` from injected parts (settings, hardware monitor), so the CLI, the tests and the
benchmarks build it the same way. Nothing heavy is imported on the way to the first frame.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Iterable
from functools import partial

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.command import CommandPalette
from textual.screen import Screen

from core.hardware.history import GpuHistory
from core.hardware.snapshot import BoxSnapshot
from core.i18n import available_languages, t
from core.settings import MIN_POLL_INTERVAL_S, Settings, save_settings
from themes import DEFAULT_THEME, THEMES
from tui.gpu_poll import HISTORY_SAMPLES, IDLE_POLL_S, GpuPolled, GpuPollFailed, SnapshotReady
from tui.screens.help import HelpScreen
from tui.wide_char_compositor import apply as keep_wide_characters_whole
from tui.wide_char_wrap import apply as wrap_between_wide_characters
from tui.widgets.burst_typing import hand_on_to_focused_input
from tui.widgets.keys_footer import field_focused, is_typed_key, key_name, survives_ssh, typing

wrap_between_wide_characters()  # Chinese wrapped inside Latin words: 模型浏览器（Ctr / l+P，模型）
keep_wide_characters_whole()  # a toast's 正在后台下载 lost 台 where it crossed a divider (Textualize/textual#6357)

SECTIONS = ("gpus", "models", "wizard", "runs")


def _lazy_screen(module: str, name: str, *args: object):
    """A mode factory that imports its screen's module on first use."""

    def make() -> Screen:
        return getattr(importlib.import_module(module), name)(*args)

    return make


def _builtin_description(action: str) -> str:
    """Textual's own bindings (focus, cursor, scrolling, copy) in the interface language; '' if not ours.

    Their descriptions are English literals inside Textual, so the help looks them up by action name:
    ``app.focus_next`` -> ``help.textual.focus_next``, ``cursor_left(True)`` -> ``help.textual.cursor_left_select``.
    """
    name = action.rpartition(".")[2]
    if name.endswith("(True)"):
        name = name[: -len("(True)")] + "_select"
    try:
        return t(f"help.textual.{name}")
    except KeyError:
        return ""


class Palette(CommandPalette):
    """Textual's command palette, with its "No matches found" in the interface language (Textual writes it
    in English, inside ``_start_no_matches_countdown``: this is that method, the text from the catalogue)."""

    def _start_no_matches_countdown(self, search_value: str) -> None:
        from rich.align import Align
        from rich.text import Text
        from textual.command import CommandList
        from textual.widgets.option_list import Option

        self._stop_no_matches_countdown()

        def show_no_matches() -> None:
            if search_value:
                self.query_one(CommandList).add_option(Option(
                    Align.center(Text(t("app.palette_no_matches"), style="not bold")), disabled=True,
                    id=self._NO_MATCHES))
                self._list_visible = True
            else:  # discover mode: nothing to say
                self._list_visible = False

        self._no_matches_timer = self.set_timer(self._NO_MATCHES_COUNTDOWN, show_no_matches)


class TunedeckApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "tunedeck"
    # The palette lists our actions (see get_system_commands); Textual's own theme picker stays too.
    BINDINGS = [
        Binding("g", "section('gpus')", t("app.key.gpus"), id="mode.gpus"),
        Binding("m", "section('models')", t("app.key.models"), id="mode.models"),
        Binding("w", "section('wizard')", t("app.key.wizard"), id="mode.wizard"),
        Binding("r", "section('runs')", t("app.key.runs"), id="mode.runs"),
        Binding("question_mark", "help", t("app.key.help"), key_display="?", id="help"),
        Binding("f1", "help", t("app.key.help"), show=False, id="help.f1"),
        Binding("t", "next_theme", t("app.key.theme"), show=False, id="theme.next"),
        Binding("q", "quit", t("app.key.quit"), id="quit"),
        # Textual adds this binding itself when none is given, with an English "palette" in the footer.
        Binding("ctrl+p", "command_palette", t("app.key.palette_footer"), show=False, priority=True,
                tooltip=t("app.key.palette_tooltip")),
    ]

    def __init__(self, settings: Settings | None = None, monitor=None, persist_settings: bool = True,
                 open_run: str | None = None, announce_runs: bool = False) -> None:
        super().__init__()
        self.settings = settings or Settings()
        self.persist_settings = persist_settings
        self._monitor = monitor
        # At start: open this run's dashboard (id, prefix or directory); with announce_runs, also open the
        # active run's and announce runs that ended since the last visit (tui.screens.runs.on_app_start).
        self.open_run = open_run
        self.announce_runs = announce_runs
        self.previous_section: str | None = None
        # The latest dashboard asked for (tui.screens.runs.open_dashboard); a section key or any change of
        # the screen stack (help, the palette, a modal: _screen_changed) moves it on, so an answer still on
        # its way opens nothing (cancel_dashboard_open).
        self.dashboard_request = 0
        # The chat conversations left by leaving the chat screen, by run / model folder, taken back when it opens
        # again (tui.screens.chat.KeptChat): in memory, for this app session.
        self.chat_kept: dict = {}
        # The one GPU poll (see tui.gpu_poll): its history, latest snapshot, interval and watching screens.
        self.gpu_history = GpuHistory(HISTORY_SAMPLES)
        self.gpu_snapshot: BoxSnapshot | None = None
        self._gpu_interval_s = max(MIN_POLL_INTERVAL_S, self.settings.gpu_poll_interval_s)
        self._gpu_watchers: list[Screen] = []
        self._gpu_shown = False  # a watching screen is in the current screen stack
        self._gpu_wake = threading.Event()
        self._gpu_worker = None
        for theme in THEMES:
            self.register_theme(theme)
        names = {theme.name for theme in THEMES}
        self.theme = self.settings.theme if self.settings.theme in names else DEFAULT_THEME

    # --- shared services -------------------------------------------------------------------------
    @property
    def monitor(self):
        """The hardware monitor, opened on first use (NVML init happens in a worker, not here)."""
        if self._monitor is None:
            from core.hardware.monitor import open_monitor

            self._monitor = open_monitor()
        return self._monitor

    # --- the one GPU poll -------------------------------------------------------------------------
    @property
    def gpu_interval_s(self) -> float:
        """Seconds between polls while a watching screen is shown; never below MIN_POLL_INTERVAL_S."""
        return self._gpu_interval_s

    def set_gpu_interval(self, seconds: float) -> float:
        """A new interval, taking effect now (the poll waiting for the old one is woken); the one set."""
        self._gpu_interval_s = max(MIN_POLL_INTERVAL_S, float(seconds))
        self._gpu_wake.set()
        return self._gpu_interval_s

    def poll_gpus_now(self) -> None:
        """Poll at once rather than at the end of the interval (after a signal); from any thread."""
        self._gpu_wake.set()

    def watch_gpus(self, screen: Screen) -> None:
        """``screen`` gets ``SnapshotReady`` for every new snapshot (the latest at once, if there is one)
        until ``unwatch_gpus``; the poll runs while any screen watches."""
        if screen not in self._gpu_watchers:
            self._gpu_watchers.append(screen)
        if self.gpu_snapshot is not None:
            screen.post_message(SnapshotReady(self.gpu_snapshot))
        self.gpu_screens_changed()
        if self._gpu_worker is None or self._gpu_worker.is_finished:
            self._gpu_worker = self.run_worker(self._poll_gpus, thread=True, group="gpu-poll", exclusive=True,
                                               exit_on_error=False)

    def unwatch_gpus(self, screen: Screen) -> None:
        if screen in self._gpu_watchers:
            self._gpu_watchers.remove(screen)
        if not self._gpu_watchers and self._gpu_worker is not None:
            self._gpu_worker.cancel()  # nothing needs readings: the poll stops
            self._gpu_worker = None
            self._gpu_wake.set()
        self.gpu_screens_changed()

    def gpu_screens_changed(self) -> None:
        """A watching screen was shown or hidden (its ScreenResume / ScreenSuspend): the interval follows,
        and a screen shown again after the idle interval gets a reading at once."""
        shown = any(screen in self.screen_stack for screen in self._gpu_watchers)
        if shown and not self._gpu_shown:
            self._gpu_wake.set()
        self._gpu_shown = shown

    def _poll_gpus(self) -> None:
        """The poll worker: never two polls at once, rescheduled after each one whatever NVML's latency."""
        from textual.worker import get_current_worker

        from tui.gpu_poll import expected_errors
        from tui.screens.error_modal import report_unexpected

        worker = get_current_worker()
        while not worker.is_cancelled:
            started = time.monotonic()
            self._gpu_wake.clear()
            try:
                snapshot = self.monitor.poll()  # opened here on first use: NVML init in this thread
            except expected_errors() as exc:
                self.post_message(GpuPollFailed(exc, expected=True))  # tried again at the next interval
            except Exception as exc:
                report_unexpected(self, exc, "app.gpu_poll")
                self.post_message(GpuPollFailed(exc, expected=False))
                return  # a bug would say so every interval: once is enough
            else:
                self.post_message(GpuPolled(snapshot))
            while not worker.is_cancelled and not self._gpu_wake.is_set():
                interval = self._gpu_interval_s if self._gpu_shown else max(self._gpu_interval_s, IDLE_POLL_S)
                left = started + interval - time.monotonic()
                if left <= 0:
                    break
                self._gpu_wake.wait(min(0.05, left))

    def on_gpu_polled(self, message: GpuPolled) -> None:
        if not self.gpu_history.add(message.snapshot):
            return  # a snapshot already seen (the monitor's floor): no screen needs it twice
        self.gpu_snapshot = message.snapshot
        for screen in list(self._gpu_watchers):
            screen.post_message(SnapshotReady(message.snapshot))

    def on_gpu_poll_failed(self, message: GpuPollFailed) -> None:
        for screen in list(self._gpu_watchers):
            screen.post_message(GpuPollFailed(message.error, message.expected))

    def on_mount(self) -> None:
        from tui.screens.gpus import GpuScreen

        # Sections other than the first are imported when first opened: the first frame waits for
        # nothing but the GPU screen (the model browser alone pulls in a Markdown renderer).
        self.add_mode("gpus", GpuScreen)
        self.add_mode("models", _lazy_screen("tui.screens.models", "ModelsScreen"))
        from tui.screens.wizard import WizardScreen

        self.add_mode("wizard", WizardScreen)
        self.add_mode("runs", _lazy_screen("tui.screens.runs", "RunsScreen"))
        self.screen_change_signal.subscribe(self, self._screen_changed, immediate=True)
        # The start's dashboard opens unless the user goes to a section or opens a screen first (a key
        # pressed before the first refresh too): the request it answers is the one current once the first
        # section is shown.
        if self.open_run is not None:
            # A run asked for on the command line opens over the Runs section: no GPU screen first.
            self.switch_mode("runs")
            self._on_start(self.dashboard_request)
        else:
            self.switch_mode("gpus")
            if self.announce_runs:
                self.call_after_refresh(self._on_start, self.dashboard_request)

    def _on_start(self, request: int) -> None:
        from tui.screens.runs import on_app_start

        on_app_start(self, self.open_run, self.announce_runs, request)

    def cancel_dashboard_open(self) -> None:
        """The user went somewhere themselves (a section key, its palette entry): a dashboard asked for
        before (its folder still being read, or the start's run listing) opens nothing and says nothing."""
        self.dashboard_request += 1
        self.workers.cancel_group(self, "open-dashboard")

    def _screen_changed(self, _screen: Screen) -> None:
        """The screen stack changed (a screen pushed or popped, a section shown): a dashboard asked for
        before opens nothing, so help, the palette or a modal the user opened meanwhile stays on top. The
        dashboard's own push lands here too, after its request was answered."""
        self.cancel_dashboard_open()

    def on_watch_source_opened(self, message) -> None:
        """``tui.screens.runs.open_dashboard``'s worker read the directory: the dashboard, or why not."""
        from tui.screens.runs import show_dashboard

        show_dashboard(self, message)

    # --- the unexpected --------------------------------------------------------------------------
    def on_unexpected_error(self, message) -> None:
        """``tui.screens.error_modal.report_unexpected`` posted this: the error modal opens."""
        from tui.screens.error_modal import show_error

        show_error(self, message)

    def on_worker_state_changed(self, event) -> None:
        """A worker of the app's own (lifecycle jobs, the settings save) that ended in an exception
        nothing caught: the error modal, the traceback in the log (screens report theirs alike)."""
        from tui.screens.error_modal import report_failed_worker

        report_failed_worker(self, event)

    # --- actions ---------------------------------------------------------------------------------
    def on_key(self, event: events.Key) -> None:
        # Before the app's bindings: a key of a burst routed before an action focused a text field (the Runs
        # filter's f, the Models search's s) is the field's, not a section key (tui.widgets.burst_typing).
        hand_on_to_focused_input(self.focused, event)

    def action_section(self, section: str) -> None:
        # The user goes somewhere: a dashboard asked for before and still being read must not pull them away.
        self.cancel_dashboard_open()
        if section in SECTIONS and self.current_mode != section:
            # A screen that holds something while open (the chat: its model process, GPU memory) is left,
            # with whatever is over it, as its Esc leaves it, not kept behind the section shown now.
            while len(self.screen_stack) > 1 and any(getattr(screen, "CLOSES_ON_SECTION_JUMP", False)
                                                     for screen in self.screen_stack[1:]):
                self.pop_screen()
            # where Esc on the wizard's first step returns to
            self.previous_section = self.current_mode if self.current_mode in SECTIONS else None
            self.switch_mode(section)
        if section == "runs":
            # r is the Runs list from everywhere, a dashboard too: not the last dashboard opened over it
            while len(self.screen_stack) > 1:
                self.pop_screen()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The app's letter keys never act while letters are text (a text field has the focus, or the screen
        # sends typed keys to one): F1, Ctrl+P and Ctrl+Q still work. Refusing them here also keeps them out of
        # the footer meanwhile.
        if action in ("section", "next_theme") and typing(self.screen):
            return False
        return True

    def get_key_display(self, binding: Binding) -> str:
        # Help, footer and palette name keys in one style: Esc, Tab, F1, Ctrl+P (keys_footer.key_name).
        return binding.key_display or key_name(binding.key) or super().get_key_display(binding)

    def action_help_quit(self) -> None:
        """Ctrl+C (Textual's own binding: it copies, it no longer quits): how to quit, in the interface's language
        and the app's key style. Textual's note was English under zh too, and named "ctrl+q" alone."""
        keys = [key_name("ctrl+q")] if typing(self.screen) else ["q", key_name("ctrl+q")]
        self.notify(t("app.help_quit", keys=" / ".join(key for key in keys if key)), title=t("app.help_quit_title"))

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(self.key_table(self.screen)))

    def action_command_palette(self) -> None:
        # Textual's own palette, with its search prompt in the interface language.
        if self.use_command_palette and not CommandPalette.is_open(self):
            self.push_screen(Palette(id="--command-palette", placeholder=t("app.palette_placeholder")))

    def set_language_setting(self, language: str) -> None:
        """Remember ``language`` for the next start: bindings and screens are built in one language."""
        self.settings.language = language
        if self.persist_settings:
            self._save_settings()
        self.notify(t("app.language_saved", name=t(f"app.language.{language}")))

    def action_next_theme(self) -> None:
        names = [theme.name for theme in THEMES]
        current = names.index(self.theme) if self.theme in names else -1
        self.set_theme(names[(current + 1) % len(names)])

    def set_theme(self, name: str) -> None:
        self.theme = name

    def watch_theme(self, name: str) -> None:
        if name == self.settings.theme:
            return
        self.settings.theme = name
        if self.persist_settings:
            self._save_settings()

    def _save_settings(self) -> None:
        def save() -> None:
            try:
                save_settings(self.settings)
            except OSError as exc:  # said as the CLI says a write it cannot make: the file and what to do (the
                # error's own name may be the atomic write's temporary file)
                from core.paths import settings_path
                from core.runs.disk_space import cannot_write_message

                said = cannot_write_message(OSError(exc.errno, exc.strerror, str(settings_path())))
                self.call_from_thread(self.notify, t("app.settings_save_failed", error=said), severity="error")

        self.run_worker(save, thread=True, group="settings", exclusive=True, exit_on_error=False)

    # --- keys, help and palette, all from the bindings -------------------------------------------
    def key_table(self, screen: Screen) -> list[tuple[str, list[tuple[str, str]]]]:
        """Sections of (key display, description) rows, one row per action: this screen's keys,
        the app's, then those of the focused widget (lists, tables). Where letters are text (``typing``),
        only the keys that are not text are listed."""
        sections: dict[str, dict[str, list[str]]] = {"screen": {}, "app": {}, "widget": {}}
        descriptions: dict[str, str] = {}
        typed = typing(screen)
        for key, active in screen.active_bindings.items():
            binding = active.binding
            action = binding.action
            if not survives_ssh(key):
                continue  # Textual's super+c (Cmd+C) and alt+ twins of Ctrl keys: not reliably sent over SSH
            if not active.enabled:
                continue  # refused by the screen now (PgDn on the wizard's plan): the key does nothing here
            if typed and is_typed_key(key):
                continue  # a text field takes it as text here (q, e, ?), as the footer says too
            if action in ("command_palette", "app.command_palette"):
                section, action = "app", "command_palette"
                descriptions[action] = t("app.key.palette")
            else:
                section = "app" if active.node is self else "screen" if active.node is screen else "widget"
                descriptions.setdefault(action, _builtin_description(action) or binding.description or action)
            sections[section].setdefault(action, []).append(self.get_key_display(binding) or key)
        if field_focused(screen):
            sections["field"] = sections.pop("widget")  # a text field's keys, not a list's
        return [
            (name, [(" / ".join(dict.fromkeys(keys)), descriptions[action]) for action, keys in rows.items()])
            for name, rows in sections.items()
            if rows
        ]

    def _with_keys(self, screen: Screen, action: str, text: str) -> str:
        """``text`` and the keys of the app's ``action`` that work on ``screen`` now, as the screen's own
        entries name theirs ("… · Key: g"; "Key: ? / F1"): the palette is where a new user learns them."""
        keys = self._working_keys(screen, self, action)
        if not keys:
            return text
        return t("app.cmd.with_key", text=text, key=keys)

    def _working_keys(self, screen: Screen, node: object, action: str) -> str:
        """The keys of ``node``'s ``action`` that work on ``screen`` now ("e / F7"; "F7" where letters are
        text), as the footer and the help name them; '' if none does."""
        typed = typing(screen)
        # a modal binds the app's action itself (``app.help``: the app's own keys do not reach past it)
        keys = [self.get_key_display(active.binding) or key for key, active in screen.active_bindings.items()
                if (active.node is node and active.binding.action == action
                    or node is self and active.node is screen and active.binding.action == f"app.{action}")
                and active.enabled
                and survives_ssh(key) and not (typed and is_typed_key(key))]
        return " / ".join(dict.fromkeys(keys))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        seen: set[str] = set()
        # Over a modal (a question waiting for its answer, a panel) the sections are not offered, as their
        # keys do nothing there: a jump left the question behind, and Runs' own (r) took it off the stack
        # unanswered. The modal's own actions, help, quit, themes and languages are.
        for section in () if screen.is_modal else SECTIONS:
            seen.add(f"section('{section}')")
            yield SystemCommand(t(f"app.cmd.{section}"),
                                self._with_keys(screen, f"section('{section}')", t(f"app.cmd.{section}_help")),
                                partial(self.action_section, section))
        seen.update({"help", "app.help", "quit", "next_theme"})  # app.help: a modal's ? / F1 (KeyedModal)
        yield SystemCommand(t("app.cmd.help"), self._with_keys(screen, "help", t("app.cmd.help_help")),
                            self.action_help)
        yield SystemCommand(t("app.cmd.quit"), self._with_keys(screen, "quit", t("app.cmd.quit_help")), self.exit)
        yield SystemCommand(t("app.cmd.theme_next"),
                            self._with_keys(screen, "next_theme", t("app.cmd.theme_next_help")),
                            self.action_next_theme)
        for theme in THEMES:
            name = t(f"app.theme.{theme.name}")
            yield SystemCommand(t("app.cmd.theme_set", name=name), t("app.cmd.theme_set_help", name=name),
                                partial(self.set_theme, theme.name))
        for language in available_languages():
            name = t(f"app.language.{language}")
            yield SystemCommand(t("app.cmd.language", name=name), t("app.cmd.language_help", name=name),
                                partial(self.set_language_setting, language))
        # Every binding of the screen becomes a palette entry too, so no action is reachable by key alone
        # (a focused list's cursor keys stay out: they are movement, not actions).
        # An action the screen refuses now (shown greyed, or not at all) is left out, as the footer leaves it:
        # choosing it would do nothing. Its keys are those that work now: on the wizard's model step, where
        # letters are text, "Edit field" is F7 there, not e.
        for _key, active in screen.active_bindings.items():
            binding = active.binding
            if active.node is not screen or binding.action in seen or not binding.show and not binding.id:
                continue
            seen.add(binding.action)
            if not active.enabled:
                continue
            keys = self._working_keys(screen, screen, binding.action)
            title = binding.description
            if binding.id and hasattr(screen, "footer_label"):  # what it does now, as the footer says it
                title = screen.footer_label(binding.id, title) or title
            yield SystemCommand(title, t("app.cmd.binding_help", key=keys) if keys else "",
                                partial(active.node.run_action, binding.action))


def make_app(settings: Settings | None = None, monitor=None, persist_settings: bool = True,
             open_run: str | None = None, announce_runs: bool = False) -> TunedeckApp:
    """Build the app from its parts; the CLI, tests and benchmarks all come through here."""
    return TunedeckApp(settings=settings, monitor=monitor, persist_settings=persist_settings,
                       open_run=open_run, announce_runs=announce_runs)


def run_app(settings: Settings | None = None, open_run: str | None = None) -> int:
    """Run the app in this terminal; returns the exit code. ``open_run``: a run id, prefix or directory
    (tunedeck, ms-swift or LLaMA-Factory output) whose dashboard opens at start."""
    from tui.screens.chat import finish_reapers

    app = make_app(settings, open_run=open_run, announce_runs=True)
    try:
        app.run()
    finally:
        finish_reapers()  # a chat model closed just before the quit: its reaper's thread dies with the app
    return app.return_code or 0
