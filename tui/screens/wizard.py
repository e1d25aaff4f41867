"""The wizard (``w``): model → dataset → goal → hardware → recommendation, keyboard only.

Every step has a default, so Enter-Enter-Enter-Enter reaches a recommendation and one more Enter saves
it as a run YAML. On the recommendation, every field can be pinned in the overrides panel and the
estimate follows as you type; 1-3 take an alternative; launch starts the run through the engine's
``tunedeck train`` path and opens its dashboard. The planning itself lives in ``core.plan``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.markup import escape
from textual.message import Message
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Header, Input, OptionList, Static
from textual.widgets.option_list import Option

from core.data.readers import SUFFIXES as DATA_SUFFIXES
from core.data.readers import is_data_file_name
from core.errors import TunedeckError
from core.i18n import t
from core.plan.request import GOALS, OVERRIDABLE, RUN_KEYS
from core.units import format_count, format_disk, plural_key
from tui.gpu_poll import replay_note
from tui.screens.error_modal import describe, report_failed_worker, report_unexpected
from tui.widgets.bar import bar
from tui.widgets.burst_typing import type_into
from tui.widgets.keys_footer import KeysFooter

STEPS = ("model", "dataset", "goal", "hardware", "result")
# The text field typing on a step goes to (the goal step's is a list; its epochs field takes e alone).
STEP_FIELDS = {"model": "#model-input", "dataset": "#dataset-input", "hardware": "#hardware-input"}
DEFAULT_GPU_MODEL = "Qwen/Qwen2.5-7B-Instruct"
TINY_MODEL = "tiny"
BAR_WIDTH = 40
ALTERNATIVE_KEYS = 3  # 1-3 take an alternative (the bindings below)
# The overrides panel's fields: the planner's (OVERRIDABLE), then the run keys the plan follows (``overlong``,
# ``thinking``), as ``plan --set`` takes them all.
FIELDS = OVERRIDABLE + RUN_KEYS
# The colour of each part of the memory bar (theme variables, so every theme applies).
PART_COLOURS = {
    "cuda_context": "$foreground-muted", "weights": "$primary", "gradients": "$secondary",
    "optimizer": "$accent", "activations": "$warning", "logits_and_loss": "$error",
    "deepspeed_nccl_buffers": "$success", "allocator_slack": "$foreground-muted",
}


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def _short(path: Path) -> str:
    """A plans file as ``plans/<name>.yaml``: its folder is the saved file's, said in full beside it."""
    return f"{path.parent.name}/{path.name}"


class DatasetSummarised(Message):
    def __init__(self, path: str, model: str | None, summary: Any, error: str | None,
                 thinking: bool | None = None) -> None:
        super().__init__()
        self.path, self.model, self.summary, self.error = path, model, summary, error
        self.thinking = thinking  # the run key the tokens were counted with


class ModelFetched(Message):
    """A model's config.json read in a worker, from this box or the hub (``base`` its plan), or why it could not
    be (``error``); ``after`` what the step does with a model taken: ``next`` (go on), ``plan`` (plan, the step
    it was asked from), ``stay``."""

    def __init__(self, model: str, base: Any, error: str | None, after: str, token: object) -> None:
        super().__init__()
        self.model, self.base, self.error, self.after, self.token = model, base, error, after, token


class ModelFetching(Message):
    """The model is found nowhere on this box: its config.json is being read from the hub."""

    def __init__(self, model: str, token: object) -> None:
        super().__init__()
        self.model, self.token = model, token


class BoxRead(Message):
    def __init__(self, snapshot: Any) -> None:
        super().__init__()
        self.snapshot = snapshot


class PlanSaved(Message):
    """The plan written (``path``, where it went: ``wanted`` or the name kept beside it), or why not (``error``);
    ``launch``: ``l`` saved it to launch it next."""

    def __init__(self, path: Path | None, wanted: Path, error: str | None, launch: bool) -> None:
        super().__init__()
        self.path, self.wanted, self.error, self.launch = path, wanted, error, launch


class LaunchDone(Message):
    """A launch's run directory, or its error and the few lines of it a notification shows. ``in_use``: the
    launch was refused because live runs use its GPUs (``GpusInUse.runs``), ``over_memory``: because the run's
    estimated peak is past its GPUs' free memory; the screen asks whether to start it anyway."""

    def __init__(self, run_path: str | None, error: str | None, summary: str = "",
                 in_use: list[tuple[str, str, list[int]]] | None = None, warnings: list[str] | None = None,
                 over_memory: bool = False, shared: bool = False) -> None:
        super().__init__()
        self.run_path, self.error = run_path, error
        self.summary = summary or (error or "").split("\n", 1)[0]
        self.in_use = in_use
        self.warnings = warnings or []  # what the start warned of (the CLI's stderr lines): notified
        # Refused because the estimated peak is past the GPUs' free memory (``GpuMemoryShort``): the screen asks
        # whether to start it anyway; ``shared``: this launch was already told to share its GPUs (asked again so)
        self.over_memory, self.shared = over_memory, shared


class PlanReady(Message):
    """A recommendation computed off the UI thread (or why it could not be), for inputs of ``generation``."""

    def __init__(self, generation: int, rec: Any, error: str | None, advance: bool) -> None:
        super().__init__()
        self.generation, self.rec, self.error, self.advance = generation, rec, error, advance


class ProbeProgress(Message):
    def __init__(self, text: str, measured: dict | None = None, done: bool = False) -> None:
        super().__init__()
        self.text, self.measured, self.done = text, measured, done


class WizardScreen(Screen[None]):
    """Five steps in one screen; the recommendation is recomputed whenever an input changes."""

    DEFAULT_CSS = """
    WizardScreen #wizard-steps { height: 1; padding: 0 1; }
    WizardScreen ContentSwitcher { height: 1fr; }
    WizardScreen .step { padding: 0 1; height: 1fr; }
    WizardScreen .step-title { text-style: bold; color: $primary; margin-top: 1; }
    WizardScreen .step-hint { color: $foreground-muted; }
    WizardScreen .step-error { color: $error; }
    WizardScreen Input { width: 1fr; max-width: 90; }
    WizardScreen #goal-list { height: auto; max-height: 6; max-width: 60; }
    WizardScreen #dataset-files { height: auto; max-height: 6; max-width: 90; }
    WizardScreen #result-body { width: 1fr; padding: 0 1; }
    WizardScreen #result-text { height: auto; }
    WizardScreen #result-text .item { padding-left: 2; }
    WizardScreen #overrides { width: 34; padding: 0 1; border-left: solid $primary; display: none; }
    WizardScreen #overrides.shown { display: block; }
    WizardScreen #overrides Input { width: 100%; height: 1; border: none; padding: 0; }
    WizardScreen #overrides .ov-label { color: $foreground-muted; }
    WizardScreen #wizard-status { height: auto; max-height: 5; padding: 0 1; color: $foreground-muted; }
    """

    BINDINGS = [
        # Priority: the step's scrolling container, the goal list and the plan have their own page keys,
        # which would otherwise take PageUp/PageDown (and hide them from the footer and the help).
        Binding("pagedown", "next_step", t("wizard.key.next"), key_display="PgDn", priority=True,
                id="wizard.next"),
        Binding("pageup", "previous_step", t("wizard.key.back"), key_display="PgUp", priority=True,
                id="wizard.back"),
        # Esc leaves a text field first (Enter then takes the step's value), then goes back a step.
        Binding("escape", "escape", t("wizard.key.escape"), key_display="Esc", id="wizard.escape"),
        Binding("enter", "enter", t("wizard.key.enter"), show=False, id="wizard.enter"),
        Binding("e", "edit", t("wizard.key.edit"), id="wizard.edit"),
        Binding("f7", "edit", t("wizard.key.edit"), show=False, id="wizard.edit.f7"),
        Binding("s", "save", t("wizard.key.save"), id="wizard.save"),
        Binding("f2", "save", t("wizard.key.save"), show=False, id="wizard.save.f2"),
        Binding("l", "launch", t("wizard.key.launch"), id="wizard.launch"),
        Binding("f5", "launch", t("wizard.key.launch"), show=False, id="wizard.launch.f5"),
        Binding("p", "probe", t("wizard.key.probe"), id="wizard.probe"),
        Binding("f6", "probe", t("wizard.key.probe"), show=False, id="wizard.probe.f6"),
        Binding("o", "overrides", t("wizard.key.overrides"), id="wizard.overrides"),
        Binding("f4", "overrides", t("wizard.key.overrides"), show=False, id="wizard.overrides.f4"),
        Binding("x", "clear_overrides", t("wizard.key.clear"), id="wizard.clear"),
        Binding("f3", "clear_overrides", t("wizard.key.clear"), show=False, id="wizard.clear.f3"),
        # what a run does with a sample longer than its sequence: cut it (the default) or leave it out (overlong)
        Binding("d", "toggle_overlong", t("wizard.key.overlong"), show=False, id="wizard.overlong"),
        Binding("1", "alternative(1)", t("wizard.key.alternative", n=1), show=False, id="wizard.alt1"),
        Binding("2", "alternative(2)", t("wizard.key.alternative", n=2), show=False, id="wizard.alt2"),
        Binding("3", "alternative(3)", t("wizard.key.alternative", n=3), show=False, id="wizard.alt3"),
    ]

    def __init__(self) -> None:
        super().__init__(name="wizard")
        self.step = 0
        self.snapshot: Any = None
        self.summary: Any = None
        self.summary_path: str | None = None
        self.summary_model: str | None = None  # whose tokenizer counted the summary's tokens
        # the (file, model, thinking) a worker is counting now
        self.summarising: tuple[str, str | None, bool | None] | None = None
        self.advance_after_summary = False
        self.base: Any = None
        self.base_model: str | None = None
        self.goal = "fastest"
        self.request: Any = None
        self.recommendation: Any = None
        self.overrides: dict[str, Any] = {}
        self.chosen: set[str] = set()  # the overrides an alternative set (1-3), until typed over or cleared
        self.measured: dict[tuple, dict] = {}
        self.saved_path: Path | None = None
        self.kept_path: Path | None = None  # the plans file the last save left alone (it held something else)
        self.written: dict[Path, str] = {}  # the files this screen saved, and what: its own, rewritten freely
        self.busy = False
        self.saving = False  # a plan being written (write_plan): s and l do nothing until it is
        self.plan_generation = 0  # bumped by each recompute: a result for older inputs is dropped
        self.planning = False  # a recommendation is being computed for the current inputs
        self.override_error = False  # the status line shows an override value's error
        self.model_error: str | None = None  # the model id the line under the field says is wrong
        # The read of a model's config.json the step waits for (``_check_model``): the model and a token of its
        # own, so that the answer of a read asked before (Enter twice) is for no one; None once answered or when
        # another id is typed
        self.model_read: tuple[str, object] | None = None
        self.launch_path: str | None = None  # the plan file the last launch started (asked again on shared GPUs)

    # --- layout --------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="wizard-steps")
        with ContentSwitcher(initial="step-model"):
            with VerticalScroll(id="step-model", classes="step"):
                yield Static(t("wizard.model.title"), classes="step-title")
                yield Static(t("wizard.model.hint"), classes="step-hint")
                yield Input(id="model-input")
                yield Static(id="model-info")
            with VerticalScroll(id="step-dataset", classes="step"):
                yield Static(t("wizard.dataset.title"), classes="step-title")
                # The formats the data loader reads, from its own table (not a list of the wizard's).
                yield Static(t("wizard.dataset.hint", formats="/".join(DATA_SUFFIXES)), classes="step-hint")
                yield Input(id="dataset-input")
                yield Static(t("wizard.dataset.files"), classes="step-hint")
                yield OptionList(id="dataset-files")
                yield Static(id="dataset-info")
            with VerticalScroll(id="step-goal", classes="step"):
                yield Static(t("wizard.goal.title"), classes="step-title")
                yield OptionList(*[Option(t(f"wizard.goal.{g}"), id=g) for g in GOALS], id="goal-list")
                yield Static(t("wizard.goal.epochs"), classes="step-hint")
                yield Input("3", id="epochs-input")
                yield Static(id="goal-info", classes="step-error")
            with VerticalScroll(id="step-hardware", classes="step"):
                yield Static(t("wizard.hardware.title"), classes="step-title")
                yield Static(id="hardware-detected")
                yield Static(t("wizard.hardware.spec"), classes="step-hint")
                yield Input(id="hardware-input")
                yield Static(t("wizard.hardware.gpus"), id="gpus-label", classes="step-hint")
                yield Input(id="gpus-input")
                yield Static(t("wizard.hardware.price"), id="price-label", classes="step-hint")
                yield Input(id="price-input")
                yield Static(id="hardware-info", classes="step-error")
            with Horizontal(id="step-result"):
                with VerticalScroll(id="result-body"):
                    yield Vertical(id="result-text")
                with VerticalScroll(id="overrides"):
                    yield Static(t("wizard.overrides.title"), classes="step-title")
                    for name in FIELDS:
                        yield Static(t(f"wizard.field.{name}"), classes="ov-label")
                        yield Input(id=f"ov-{name}", placeholder=t("wizard.auto"))
                    yield Static(id="ov-error", classes="step-error")
        yield Static(id="wizard-status")
        yield KeysFooter()

    def on_mount(self) -> None:
        model = getattr(self.app, "wizard_model", None)
        self.query_one("#model-input", Input).value = model or TINY_MODEL
        from core.data.samples import sample_dataset_path

        self.query_one("#dataset-input", Input).value = str(sample_dataset_path())
        files = self.query_one("#dataset-files", OptionList)
        for path in data_files_nearby(sample_dataset_path()):
            files.add_option(Option(_escape(str(path)), id=str(path)))
        files.highlighted = 0
        self.query_one("#goal-list", OptionList).highlighted = 0
        self._show_step(0)
        self.read_box()

    def on_screen_resume(self) -> None:
        self.title = t("app.title")
        self.sub_title = t("app.mode.wizard")
        model = getattr(self.app, "wizard_model", None)
        if model and model != self.query_one("#model-input", Input).value:
            self.query_one("#model-input", Input).value = model
            # the line under the field describes this model, not the one planned before (a bundled config
            # or the local cache: read from disk in a worker, as Enter does)
            self._check_model(after="stay")
            self._show_step(0)

    # --- steps ---------------------------------------------------------------------------------------
    def _show_step(self, step: int) -> None:
        leaving_result = STEPS[self.step] == "result"
        self.step = max(0, min(len(STEPS) - 1, step))
        name = STEPS[self.step]
        if leaving_result and name != "result":
            # It spoke of the plan: an error read as the inputs' error at the bottom of every step, and "Saved X
            # (l launches it now)" offered l where it does nothing, and X's command while the inputs changed.
            self._status("")
        if name == "result" and not leaving_result and (refused := self._override_problem()) is not None:
            self._status(f"[$error]{_escape(refused[1])}[/]")  # back on the plan: its field still holds it
        self.query_one(ContentSwitcher).current = f"step-{name}"
        parts = []
        for i, s in enumerate(STEPS):
            label = f"{i + 1} {t(f'wizard.step.{s}')}"
            parts.append(f"[b reverse] {label} [/]" if i == self.step else f"[$foreground-muted]{label}[/]")
        self.query_one("#wizard-steps", Static).update(" › ".join(parts))
        # The step itself takes the focus, not its text field, so that Enter takes the default the field shows;
        # on the model, data and hardware steps the first character typed starts a new value there
        # (``_type_into_field``), and F7 (or Tab) goes into the field to change the value it has.
        focus = {"goal": "#goal-list", "result": "#result-body"}.get(name, f"#step-{name}")
        self.query_one(focus).focus()
        self.refresh_bindings()

    def footer_priority(self) -> tuple[str, ...]:
        """Binding ids in the order the footer keeps them when the line is short."""
        if STEPS[self.step] == "result":
            return ("wizard.back", "wizard.save", "wizard.launch", "wizard.overrides", "wizard.probe",
                    "wizard.escape", "wizard.clear")
        return ("wizard.next", "wizard.back", "wizard.escape", "wizard.edit", "wizard.edit.f7")

    def footer_label(self, binding_id: str, description: str) -> str:
        """``e`` names the field it goes into on this step (on the goal step: Epochs, not the goal)."""
        if binding_id in ("wizard.edit", "wizard.edit.f7") and STEPS[self.step] != "result":
            return t(f"wizard.key.edit_{STEPS[self.step]}")
        return description

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        on_result = STEPS[self.step] == "result"
        if action == "alternative":  # 1-3: only those the plan lists (after one is taken there may be none)
            index = parameters[0] if parameters else 0
            listed = len(self.recommendation.alternatives) if self.recommendation is not None else 0
            return on_result and isinstance(index, int) and index <= listed
        if action == "clear_overrides":  # with nothing pinned or typed, x had nothing to clear and did nothing
            return on_result and self._has_overrides()
        if action in ("save", "launch", "probe"):
            # where nothing fits there is nothing to save, launch or measure: not offered (footer, ?, Ctrl+P), as
            # they only said so; the way out, the overrides (o) and the steps back (PgUp) are what helps there
            rec = self.recommendation
            return on_result and rec is not None and rec.feasible
        if action in ("overrides", "toggle_overlong"):
            return on_result  # the plan's keys: not offered at all before there is a plan (footer, ?, Ctrl+P)
        if action == "edit":
            return None if on_result else True
        if action == "next_step":  # the last step: Enter or s saves, l launches; PgDn has nowhere to go
            return None if on_result else True
        return True

    def action_enter(self) -> None:
        self._submit_step()

    def action_edit(self) -> None:
        """Focus the first text field of this step (the overrides panel on the recommendation)."""
        if STEPS[self.step] == "result":
            self._show_overrides()
            return
        first = {**STEP_FIELDS, "goal": "#epochs-input"}[STEPS[self.step]]
        self.query_one(first, Input).focus()

    def action_next_step(self) -> None:
        self._submit_step()

    def action_previous_step(self) -> None:
        if self.step > 0:
            self._show_step(self.step - 1)

    def action_escape(self) -> None:
        """Leave the text field (the step keeps the focus); without one, back a step; on the first, out."""
        focused = self.focused
        if isinstance(focused, Input):
            if focused.id and focused.id.startswith("ov-"):
                self._hide_overrides()  # the panel goes with the field (o shows it again)
            else:
                name = STEPS[self.step]
                self.query_one({"goal": "#goal-list"}.get(name, f"#step-{name}")).focus()
            return
        if self.step > 0:
            self._show_step(self.step - 1)
        else:
            self.app.action_section(getattr(self.app, "previous_section", None) or "gpus")

    def on_key(self, event: Any) -> None:
        """Down and Up move as Tab does where Tab was the only way: from the data file field into the list of
        files found (Up from the list's top comes back), and between the override fields. On a step with a text
        field, any character starts a new value in it (``_type_into_field``)."""
        if self._type_into_field(event):
            return
        if event.key not in ("down", "up"):
            return
        focused = self.focused
        focused_id = (focused.id or "") if focused is not None else ""
        target: Any = None
        if focused_id == "dataset-input" and event.key == "down":
            files = self.query_one("#dataset-files", OptionList)
            if files.option_count:
                target = files
        elif focused_id == "dataset-files" and event.key == "up" and not self.query_one(
                "#dataset-files", OptionList).highlighted:
            target = self.query_one("#dataset-input", Input)
        elif focused_id.startswith("ov-") and isinstance(focused, Input):
            index = FIELDS.index(focused_id[3:]) + (1 if event.key == "down" else -1)
            if 0 <= index < len(FIELDS):
                target = self.query_one(f"#ov-{FIELDS[index]}", Input)
        if target is not None:
            event.stop()
            event.prevent_default()
            target.focus()

    def _step_field(self) -> Input | None:
        """The text field a step's typing goes to (None on the goal and plan steps)."""
        field_id = STEP_FIELDS.get(STEPS[self.step])
        return self.query_one(field_id, Input) if field_id else None

    def takes_typing(self) -> bool:
        """Whether a printable key is text here (the footer and the app's letter keys follow it): on a step with a
        text field, every character starts or goes on with its value, letters too. Model ids and file names
        start with the app's keys (meta-llama, mistralai, train.jsonl): with those keys acting, typing
        ``meta-llama/...`` opened the model browser and ``qwen...`` quit. Esc, F-keys and Ctrl+P still act."""
        return self._step_field() is not None

    def _type_into_field(self, event: Any) -> bool:
        """The step's field takes ``event``'s character as the start of a new value when the step (or the data
        step's file list) has the focus: any printable character, the app's letter keys and ``e`` included
        (``takes_typing``). Keys typed in one burst were all sent to the step before the first moved the focus:
        those that follow go on to the field (a printable key that reaches the screen while the field has the
        focus never came from the field, which keeps its own)."""
        field = self._step_field()
        if field is None or not event.is_printable or not event.character:
            return False
        if self.focused is not field:
            if isinstance(self.focused, Input):
                return False
            field.value = ""
            self.set_focus(field)  # now: the keys after this one go to the field
        type_into(field, event)  # typed by the field, after its focus
        return True

    def on_paste(self, event: events.Paste) -> None:
        """Text pasted on a step (not in its field) becomes the field's value, as typing there does."""
        field = self._step_field()
        if field is None or isinstance(self.focused, Input):
            return
        event.stop()
        field.value = ""
        self.set_focus(field)
        field.post_message(events.Paste(" ".join(event.text.split())))  # pasted by the field, after its focus

    @on(Input.Submitted)
    def _input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if event.input.id and event.input.id.startswith("ov-"):
            self.query_one("#result-body").focus()
            return
        if event.input is self._step_field():
            # Enter hands the value to the step: the step has the focus again, so that a value refused (an
            # unknown model, a missing file) is replaced by the next one typed, not appended to (F7 edits it).
            self.query_one(f"#step-{STEPS[self.step]}").focus()
        self._submit_step()

    @on(OptionList.OptionSelected, "#dataset-files")
    def _file_picked(self, event: OptionList.OptionSelected) -> None:
        """A file from the list goes into the field and is previewed; Enter again goes on."""
        event.stop()
        self.query_one("#dataset-input", Input).value = event.option.id or ""
        self._summarise_if_needed(force=True)
        self.query_one("#step-dataset").focus()

    @on(OptionList.OptionSelected, "#goal-list")
    def _goal_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.goal = event.option.id or "fastest"
        self._submit_step()

    def _submit_step(self) -> None:
        name = STEPS[self.step]
        if name == "model":
            self._check_model(after="next")  # read in a worker: ModelFetched goes on
        elif name == "dataset":
            path = self.query_one("#dataset-input", Input).value.strip()
            if not path:
                self.summary, self.summary_path = None, ""
                self._show_step(2)
            elif self._summary_is_current(path):
                self._show_step(2)
            else:
                self.advance_after_summary = True
                self._summarise_if_needed(force=True)
        elif name == "goal":
            highlighted = self.query_one("#goal-list", OptionList).highlighted
            if highlighted is not None:
                self.goal = GOALS[highlighted]
            if self._read_epochs() is not None:
                self._show_step(3)
        elif name == "hardware":
            if self._fill_hardware_defaults():
                self.recompute(advance=True)  # the result step shows once the plan is there
        elif name == "result":
            self.action_save()

    # --- model ---------------------------------------------------------------------------------------
    def _check_model(self, after: str) -> None:
        """Read the typed model's config.json in a worker (a folder, a hub cache, a bundled or kept config: disk
        reads; a hub id found nowhere here, from the hub); ``ModelFetched`` takes it or says why not, then does
        ``after`` (see there)."""
        model = self.query_one("#model-input", Input).value.strip()
        info = self.query_one("#model-info", Static)
        if not model:
            info.update(f"[$error]{t('wizard.model.empty')}[/]")
            return
        info.update(t("wizard.model.reading", model=_escape(model)))
        token = object()  # the answer of a check asked before (Enter twice) is for no one
        self.model_read = (model, token)
        self.fetch_model(model, after, token)

    @staticmethod
    def _model_error_text(exc: Exception) -> str:
        """The command line's advice (pass --model …) said as what to type here, where the step has its words."""
        from core.estimate import ModelNotFoundError

        if isinstance(exc, ModelNotFoundError) and exc.kind in ("unknown_model", "no_config_in_dir", "hub_not_found",
                                                                "hub_config_unavailable", "hub_no_config"):
            return t(f"wizard.model.{exc.kind}", **exc.params)
        return str(exc)

    def _model_refused(self, model: str, text: str) -> None:
        self.query_one("#model-info", Static).update(f"[$error]{_escape(text)}[/]")
        self.model_error = model

    def _model_taken(self, model: str, base: Any) -> None:
        self.base = base
        self.model_error = None
        self.base_model = model
        arch = self.base.architecture
        self.query_one("#model-info", Static).update(t("wizard.model.info", name=_escape(arch.name),
                                                       layers=arch.num_layers, hidden=arch.hidden_size))

    @work(thread=True, exclusive=True, group="wizard-model", exit_on_error=False)
    def fetch_model(self, model: str, after: str, token: object) -> None:
        """``model``'s config.json from this box, else for a hub id found nowhere here from the hub
        (``base_plan(fetch=True)``: kept for the next plan)."""
        from core.estimate import ArchitectureError, ModelNotFoundError
        from core.hub.records import is_hub_id
        from core.plan.planner import base_plan
        from core.plan.request import PlanRequest

        request = PlanRequest(model=model, hardware=None)  # type: ignore[arg-type]
        try:
            try:
                base = base_plan(request)
            except ModelNotFoundError as exc:
                if exc.kind != "unknown_model" or not is_hub_id(model):
                    raise
                self.post_message(ModelFetching(model, token))
                base = base_plan(request, fetch=True)
        except (ModelNotFoundError, ArchitectureError) as exc:
            self.post_message(ModelFetched(model, None, self._model_error_text(exc), after, token))
            return
        except Exception as exc:  # a bug: the error modal and the log, and the step says it failed too
            report_unexpected(self.app, exc, "wizard.fetch_model")
            self.post_message(ModelFetched(model, None, describe(exc), after, token))
            return
        self.post_message(ModelFetched(model, base, None, after, token))

    def on_model_fetching(self, message: ModelFetching) -> None:
        if self.model_read == (message.model, message.token):
            self.query_one("#model-info", Static).update(t("wizard.model.fetching", model=_escape(message.model)))

    def on_model_fetched(self, message: ModelFetched) -> None:
        if (message.after != "plan" and STEPS[self.step] != "model") or self.model_read != (message.model, message.token):
            return  # the user went on, or typed another model: this answer is for no one
        self.model_read = None
        if message.error is not None:
            self._model_refused(message.model, message.error)
            return
        self._model_taken(message.model, message.base)
        if message.after == "next":
            self._show_step(1)
            self._summarise_if_needed()
        elif message.after == "plan":
            self.recompute(advance=True)  # the result step shows if it was asked from the hardware step

    # --- dataset -------------------------------------------------------------------------------------
    def _summary_is_current(self, path: str) -> bool:
        """The summary is of this file, its tokens counted for the model chosen now (another model's
        tokenizer counts other lengths: the plan's sequence length and speed follow them) and with the
        ``thinking`` pinned now (a Qwen3 template's empty think block before each answer counts)."""
        return (self.summary is not None and self.summary_path == path and self.summary_model == self.base_model
                and getattr(self.summary, "thinking", None) == self.overrides.get("thinking"))

    def _summarise_if_needed(self, force: bool = False) -> None:
        """Count the dataset's tokens in a worker, unless the summary is current (``force``: read it again) or
        a worker is counting this file for this model already (its answer comes: a large file is not counted
        twice because Enter came before the first count was done)."""
        path = self.query_one("#dataset-input", Input).value.strip()
        thinking = self.overrides.get("thinking")
        if not path or (not force and self._summary_is_current(path)) or self.summarising == (path, self.base_model,
                                                                                             thinking):
            return
        self.query_one("#dataset-info", Static).update(t("wizard.dataset.reading", path=_escape(path)))
        self.summarising = (path, self.base_model, thinking)
        self.summarise(path, self.base_model, thinking)

    @work(thread=True, exclusive=True, group="wizard-data", exit_on_error=False)
    def summarise(self, path: str, model: str | None, thinking: bool | None = None) -> None:
        from core.data import DataError
        from core.plan import summarise_dataset

        try:
            summary = summarise_dataset(path, model, thinking)
        except (TunedeckError, OSError) as exc:  # a DataError, an unreadable file: shown, never fatal
            # a DataError in its own words ("x.jsonl: file not found; …"), no heading above them
            self.post_message(DatasetSummarised(path, model, None, exc.brief() if isinstance(exc, DataError)
                                                else str(exc), thinking))
            return
        except Exception as exc:  # a bug: the error modal and the log, and the step says it failed too
            report_unexpected(self.app, exc, "wizard.summarise")
            self.post_message(DatasetSummarised(path, model, None, describe(exc), thinking))
            return
        # an empty file, or not one row that loads: refused here as plan refuses it (planned, it took "< 1 min")
        refused = summary.nothing_to_plan(path)
        self.post_message(DatasetSummarised(path, model, None if refused else summary, refused, thinking))

    def on_dataset_summarised(self, message: DatasetSummarised) -> None:
        if self.summarising == (message.path, message.model, message.thinking):
            self.summarising = None
        if (message.path != self.query_one("#dataset-input", Input).value.strip() or message.model != self.base_model
                or message.thinking != self.overrides.get("thinking")):
            return  # an answer for another file, another model's tokenizer or thinking: a newer one is coming
        info = self.query_one("#dataset-info", Static)
        if message.error is not None:
            self.summary, self.summary_path = None, None
            self.advance_after_summary = False
            info.update(f"[$error]{_escape(message.error)}[/]")
            return
        self.summary, self.summary_path, self.summary_model = message.summary, message.path, message.model
        info.update(self._dataset_text(message.summary))
        if STEPS[self.step] == "result" and self.base is not None:  # counted again for thinking: the plan follows
            self.recompute(keep_status=True)
        if self.advance_after_summary and STEPS[self.step] == "dataset":
            self.advance_after_summary = False
            # the step stays, its warning (or the note that hub data is not read) in view; Enter again goes on
            if message.summary.issues or not message.summary.measured:
                step = self.query_one("#step-dataset", VerticalScroll)
                self.call_after_refresh(step.scroll_to_widget, info, animate=False)
                return
            self._show_step(2)

    def _dataset_path_changed(self, path: str) -> None:
        """Under a path being typed, the statistics of the file read before passed for this one's until Enter read
        it: the line says Enter reads it (the same path again shows its statistics; one being read keeps its
        "Reading")."""
        if self.summarising is not None and self.summarising[0] == path:
            return
        info = self.query_one("#dataset-info", Static)
        if self.summary is not None and self._summary_is_current(path):
            info.update(self._dataset_text(self.summary))
        else:
            info.update(t("wizard.dataset.unread") if path else "")

    def _dataset_text(self, summary: Any) -> str:
        if not summary.measured:  # hub data: planned without statistics, and said so
            return f"[$warning]{_escape(t('wizard.dataset.on_hub', entries=', '.join(summary.on_hub)))}[/]"
        # a whole file's problem (an empty entry of a folder or list) is not a row's: said as a file's, named below
        rows, files = summary.issues - summary.file_issues, summary.file_issues
        said = []
        if rows or not files:
            said.append(t(plural_key("wizard.dataset.problem_rows", rows), count=format_count(rows)))
        if files:
            said.append(t(plural_key("wizard.dataset.problem_files", files), count=format_count(files)))
        problems = ", ".join(said)
        lines = [t("wizard.dataset.info", format=summary.format or "?", records=format_count(summary.records),
                   problems=problems, tokens=format_count(summary.total_tokens),
                   p95=format_count(summary.p95),
                   kind=t("wizard.dataset.exact") if summary.exact else t("wizard.dataset.approx"))]
        if summary.issues:
            # said here, before the plan: launch refuses a file with rows that do not load (``data check``)
            first = summary.problems[0] if summary.problems else summary.path
            more = _more_problems(summary.issues - 1)
            lines.append(f"[$warning]{_escape(t('wizard.dataset.refused', problem=first, more=more))}[/]")
            if summary.records:
                lines.append(t("wizard.dataset.refused_hint", records=format_count(summary.records)))
        if summary.left_out:  # a folder's test / validation files: not trained on, and said
            lines.append(_escape(t("data.left_out_splits", files=", ".join(Path(p).name for p in summary.left_out))))
        share = summary.target_share()
        if share is not None:
            lines.append(t("wizard.dataset.targets", share=f"{100 * share:.0f}"))
        histogram = summary.histogram()
        peak = max((c for _, _, c in histogram), default=1) or 1
        for low, high, count in histogram:
            lines.append(f"  {low:>6}-{high:<6} {bar(count / peak, 24)} {count}")
        return "\n".join(lines)

    # --- goal ----------------------------------------------------------------------------------------
    def _read_epochs(self) -> float | None:
        """The epochs field, checked as ``plan --epochs`` is (a run config's limits: ``inf``, ``nan`` or 1e308
        epochs have no count of tokens); a wrong one is said on the goal step, and None returned."""
        import argparse

        from core.plan.request import read_epochs

        text = self.query_one("#epochs-input", Input).value.strip() or "3"
        info = self.query_one("#goal-info", Static)
        try:
            epochs = read_epochs(text)
        except argparse.ArgumentTypeError as exc:
            info.update(f"[$error]{_escape(t('wizard.goal.bad_epochs', problem=str(exc)))}[/]")
            return None
        info.update("")
        return epochs

    # --- hardware ------------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="wizard-box", exit_on_error=False)
    def read_box(self) -> None:
        self.post_message(BoxRead(self._snapshot_or_none()))

    def _snapshot_or_none(self) -> Any:
        """This box's snapshot; None when it cannot be read (then the plan is for hardware typed by hand).
        The monitor reports NVML's absence in the snapshot itself: an exception here is unexpected."""
        try:
            return self.app.monitor.snapshot()  # type: ignore[attr-defined]
        except TunedeckError:  # a fake-GPU recording that cannot be read: the GPUs screen says so
            return None
        except Exception as exc:
            report_unexpected(self.app, exc, "wizard.read_box")
            return None

    def on_box_read(self, message: BoxRead) -> None:
        self.snapshot = message.snapshot
        self._fill_hardware_defaults()

    def _detected(self) -> Any:
        from core.plan import target_from_snapshot

        if self.snapshot is None:
            return None
        return target_from_snapshot(self.snapshot)

    def _fill_hardware_defaults(self) -> bool:
        """Show what the box has and put it in the inputs (once); True when the step can go on."""
        if self.snapshot is None:
            self.snapshot = self._snapshot_or_none()
        detected = self._detected()
        hw_input = self.query_one("#hardware-input", Input)
        if detected is not None:
            ram = f"{detected.host_ram_gib:.0f}" if detected.host_ram_gib else "?"
            # Decimal units, as the GPU screen's header and 'tunedeck gpus' give the same disk (core.units).
            disk = format_disk(detected.disk_free_gib * 2**30) if detected.disk_free_gib is not None else "?"
            if detected.cpu_only:
                text = t("wizard.hardware.detected_cpu", ram=ram, disk=disk)
            else:
                text = t("wizard.hardware.detected", count=detected.count, gpu=detected.gpu.name,
                         memory=round(detected.gpu.memory_gib), ram=ram, disk=disk,
                         indices=",".join(map(str, detected.gpu_indices or ())))
                in_use = in_use_words(detected)
                if in_use:  # what the plan must fit beside (core.plan.rules.warn_busy_gpus)
                    text += " " + in_use
            caches = cache_disk_words(detected)
            if caches:  # the disk free above is the data root's (checkpoints); downloads fill these
                text += " " + caches
            note = replay_note(self.app.monitor, self.snapshot)  # type: ignore[attr-defined]
            # fake GPUs are no plan for this box: say so first, in the warning colour, as the GPU screen does
            self.query_one("#hardware-detected", Static).update(
                escape(text) if note is None else f"[b $warning]{escape(note)}[/]  {escape(text)}")
            if not hw_input.value:
                hw_input.value = detected.describe()
                if not detected.cpu_only and self.query_one("#model-input", Input).value == TINY_MODEL \
                        and not getattr(self.app, "wizard_model", None) and STEPS[self.step] == "model":
                    self.query_one("#model-input", Input).value = DEFAULT_GPU_MODEL
        elif not hw_input.value:
            hw_input.value = "1xH200"
        self._label_hardware_fields()
        return True

    def _plans_cpu(self) -> bool:
        """Whether the hardware field names a CPU plan: this box without a GPU as shown, or ``cpu`` typed."""
        from core.plan import HardwareError, parse_target

        text = self.query_one("#hardware-input", Input).value.strip()
        detected = self._detected()
        if detected is not None and (not text or text == detected.describe()):
            return bool(detected.cpu_only)
        try:
            return parse_target(text).gpu is None
        except (HardwareError, ValueError):  # half typed: the GPU wording until it reads as a plan
            return False

    def _label_hardware_fields(self) -> None:
        """On a box without a GPU there are no GPU indices to pick (the field goes) and the cheapest plan takes the
        fewest hours of the box, not GPU-hours; on a CPU plan the price is the whole box's per hour (the cost is
        hours × price there), not a GPU-hour's."""
        detected = self._detected()
        no_gpus = detected is not None and detected.cpu_only
        self.query_one("#gpus-label", Static).display = not no_gpus
        self.query_one("#gpus-input", Input).display = not no_gpus
        self.query_one("#goal-list", OptionList).replace_option_prompt(
            "lowest_cost", t("wizard.goal.lowest_cost_cpu" if no_gpus else "wizard.goal.lowest_cost"))
        self.query_one("#price-label", Static).update(
            t("wizard.hardware.price_host" if self._plans_cpu() else "wizard.hardware.price"))

    def _target(self) -> Any:
        """The HardwareTarget the inputs describe (raises HardwareError / ValueError). The price is checked as
        ``plan --price-per-gpu-hour`` checks it: -5 made a negative cost, ``nan`` none."""
        import argparse

        from core.plan import HardwareError, parse_gpu_indices, parse_target, target_from_snapshot
        from core.plan.hardware import read_price

        text = self.query_one("#hardware-input", Input).value.strip()
        gpus = self.query_one("#gpus-input", Input).value.strip()
        price_text = self.query_one("#price-input", Input).value.strip()
        try:
            price = read_price(price_text) if price_text else None
        except argparse.ArgumentTypeError as exc:
            key = "wizard.hardware.bad_price_host" if self._plans_cpu() else "wizard.hardware.bad_price"
            raise HardwareError(t(key, problem=str(exc))) from None
        detected = self._detected()
        if detected is not None and (not text or text == detected.describe()):
            indices = parse_gpu_indices(gpus) if gpus and gpus != "all" else None
            return target_from_snapshot(self.snapshot, indices, price)
        from core.plan.hardware import on_this_host

        return on_this_host(parse_target(text, price), detected)

    def _gpus_ignored(self) -> str:
        """The line saying the GPU indices go unused, when another hardware than this box is typed beside them
        (``_target`` takes them for this box only, as plan's --gpus and --hardware exclude each other); else ""."""
        text = self.query_one("#hardware-input", Input).value.strip()
        gpus = self.query_one("#gpus-input", Input).value.strip()
        detected = self._detected()
        if not gpus or gpus == "all" or not text or (detected is not None and text == detected.describe()):
            return ""
        return f"[$warning]{_escape(t('wizard.hardware.gpus_ignored', hardware=text))}[/]"

    # --- recommendation ------------------------------------------------------------------------------
    def _build_request(self) -> Any:
        from core.plan import PlanRequest
        from core.plan.overrides import request_fields

        model = self.base_model or self.query_one("#model-input", Input).value.strip()
        # the fields as ``plan --set`` reads them: the planner's pinned, ``overlong`` the request's own
        return PlanRequest(
            model=model, hardware=self._target(), goal=self.goal, epochs=self._read_epochs() or 3.0,
            dataset=self.summary_path or None, chosen=frozenset(self.chosen & set(self.overrides)),
            **request_fields(self.overrides),
        ).with_dataset(self.summary)

    def recompute(self, advance: bool = False, keep_status: bool = False) -> None:
        """Plan again from the inputs, off the UI thread (weighing hundreds of plans takes a while on a
        small box); the result, or why the inputs cannot be read, arrives as ``PlanReady``.

        The status line spoke of the plan before (a refused launch, a saved file): it is cleared, unless
        ``keep_status`` (a probe's outcome, whose measurements are what the plan is recomputed with)."""
        from core.estimate import ArchitectureError, ModelNotFoundError
        from core.plan import HardwareError

        if not keep_status:
            self._status("")
        if self.base is None:  # no model taken yet: read it (in a worker), then plan
            self._check_model(after="plan")
            return
        try:
            self.request = self._build_request()
        except (HardwareError, ModelNotFoundError, ArchitectureError, ValueError) as exc:
            self.query_one("#hardware-info", Static).update(_escape(str(exc)))
            return
        self.plan_generation += 1
        self.planning = True
        self.plan_in_background(self.plan_generation, self.request, self.base, dict(self.measured), advance)

    @work(thread=True, exclusive=True, group="wizard-plan", exit_on_error=False)
    def plan_in_background(self, generation: int, request: Any, base: Any, measured: dict, advance: bool) -> None:
        from core.estimate import ArchitectureError, ModelNotFoundError
        from core.plan import HardwareError, recommend

        try:
            if request.hardware.detected:
                from core.plan.probe import cached_measurements

                measured = {**cached_measurements(request), **measured}
            self.post_message(PlanReady(generation, recommend(request, base, measured), None, advance))
        except (HardwareError, ModelNotFoundError, ArchitectureError, ValueError) as exc:
            self.post_message(PlanReady(generation, None, str(exc), advance))

    def on_plan_ready(self, message: PlanReady) -> None:
        if message.generation != self.plan_generation:
            return  # the inputs changed since: a newer plan is on its way
        self.planning = False
        if message.error is not None:
            self.query_one("#hardware-info", Static).update(_escape(message.error))
            return
        self.recommendation = message.rec
        self.query_one("#hardware-info", Static).update(self._gpus_ignored())
        self._render_result()
        self.refresh_bindings()  # the alternatives' keys follow the plan's list
        if message.advance and STEPS[self.step] == "hardware":
            self._show_step(4)

    def _render_result(self) -> None:
        rec = self.recommendation
        if rec is None:
            return
        body = self.query_one("#result-text", Vertical)
        with self.app.batch_update():
            body.remove_children()
            body.mount_all(Static(text, classes="item" if item else "") for text, item in render_recommendation(rec))
        best = rec.best
        if best is not None and best.estimate is not None:
            plan = best.estimate.plan
            for name in OVERRIDABLE:
                value = plan.get(name)
                if isinstance(value, bool):
                    value = t("plan.gc_on") if value else t("plan.gc_off")
                elif value is None:  # e.g. the LoRA rank of a full fine-tuning plan
                    value = "–"
                self.query_one(f"#ov-{name}", Input).placeholder = t("wizard.auto_value", value=value)
        for name in RUN_KEYS:  # not the planner's: the request's value (its default until set)
            value = getattr(rec.request, name)
            if value is None:  # thinking unset: the chat template's own default decides
                value = t("wizard.template_default")
            elif isinstance(value, bool):  # as the field takes it (true, false)
                value = str(value).lower()
            self.query_one(f"#ov-{name}", Input).placeholder = t("wizard.auto_value", value=value)

    @on(Input.Changed)
    def _input_changed(self, event: Input.Changed) -> None:
        input_id = event.input.id or ""
        if input_id == "dataset-input":
            self._dataset_path_changed(event.value.strip())
            return
        if input_id in ("hardware-input", "gpus-input"):
            self.query_one("#hardware-info", Static).update(self._gpus_ignored())
            if input_id == "hardware-input":
                self._label_hardware_fields()
            return
        if input_id == "model-input":
            if self.model_error is not None and event.value.strip() != self.model_error:
                self.model_error = None  # a new id: the old one's error goes
                self.query_one("#model-info", Static).update("")
            if self.model_read is not None and event.value.strip() != self.model_read[0]:
                self.model_read = None  # a new id: the config being read is no longer asked for
                self.query_one("#model-info", Static).update("")
            return
        if not input_id.startswith("ov-") or STEPS[self.step] != "result":
            return
        self.refresh_bindings()  # x (clear) is offered once a field holds something, a refused value too
        from core.plan.overrides import OverrideError, parse_override_value

        name = input_id[3:]
        error = self.query_one("#ov-error", Static)
        try:
            value = parse_override_value(name, event.value)
        except OverrideError as exc:
            # under the fields, and on the status line: at 80x24 the end of the panel is out of view
            error.update(_escape(str(exc)))
            self._status(f"[$error]{_escape(str(exc))}[/]")
            self.override_error = True
            return
        error.update("")
        if self.override_error:
            self.override_error = False
            self._status("")
        self.chosen.discard(name)  # typed: the user's own now
        if value is None:
            self.overrides.pop(name, None)
        else:
            self.overrides[name] = value
        if name == "thinking":  # the data's tokens are counted again with it; the plan follows when they come
            self._summarise_if_needed()
        self.recompute()

    def _override_problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) of the first override field whose value is refused: its value is not in the
        plan (the plan keeps the field's last good value, or none), though the field still shows it."""
        from core.plan.overrides import OverrideError, parse_override_value

        for name in FIELDS:
            try:
                parse_override_value(name, self.query_one(f"#ov-{name}", Input).value)
            except OverrideError as exc:
                return name, str(exc)
        return None

    def action_overrides(self) -> None:
        """Show the overrides panel, its first field focused; hide it again (``o`` / F4 on the plan, Esc in a
        field), the focus back on the plan: shown, it takes 34 of 80 columns from the plan. Pinned values stay."""
        if self.query_one("#overrides").has_class("shown"):
            self._hide_overrides()
        else:
            self._show_overrides()

    def _show_overrides(self) -> None:
        self.query_one("#overrides").add_class("shown")
        self.set_focus(self.query_one("#ov-method", Input))  # now: keys typed right after o go to the field

    def _hide_overrides(self) -> None:
        self.query_one("#overrides").remove_class("shown")
        self.set_focus(self.query_one("#result-body"))

    def _has_overrides(self) -> bool:
        """Something for x to clear: a value pinned (typed or an alternative taken) or typed, even refused."""
        if self.overrides or self.chosen:
            return True
        return self.is_mounted and any(field.value.strip() for field in self.query("#overrides Input").results(Input))

    def action_clear_overrides(self) -> None:
        self.overrides.clear()
        self.chosen.clear()
        for name in FIELDS:
            with self.prevent(Input.Changed):
                self.query_one(f"#ov-{name}", Input).value = ""
        self._summarise_if_needed()  # counted with a thinking now cleared: again without it
        self.recompute()

    def action_toggle_overlong(self) -> None:
        """``d``: a sample longer than the sequence is left out of the run (``overlong: drop``) instead of cut, or
        cut again: its field in the overrides panel takes the value, and the plan follows as it does when typed
        (its samples, steps, time and warnings as ``plan --set overlong=drop`` gives them; the saved YAML too)."""
        field = self.query_one("#ov-overlong", Input)
        field.value = "cut" if self.overrides.get("overlong") == "drop" else "drop"  # Input.Changed plans again
        self.notify(t("wizard.overlong_drop" if field.value == "drop" else "wizard.overlong_cut"))

    def action_alternative(self, index: int) -> None:
        rec = self.recommendation
        if rec is None or index > len(rec.alternatives):
            return
        from core.plan.planner import alternative_overrides

        pinned = alternative_overrides(rec.alternatives[index - 1][0].plan)
        self.overrides.update(pinned)
        self.chosen |= set(pinned)
        for name, value in pinned.items():
            with self.prevent(Input.Changed):
                text = ("on" if value else "off") if isinstance(value, bool) else str(value)
                self.query_one(f"#ov-{name}", Input).value = text
        self.recompute()
        self.notify(t("wizard.alternative_taken", n=index))

    # --- save and launch -----------------------------------------------------------------------------
    def _status(self, text: str) -> None:
        # What it says (a refused launch, a failed probe, an override's value, a saved file) is about the plan on
        # the result step: ``_show_step`` clears it when the user goes back to change the inputs.
        self.query_one("#wizard-status", Static).update(text)

    def action_save(self) -> None:
        self._save(launch=False)

    def _save(self, launch: bool) -> None:
        """Save the plan shown (``s``; ``l`` saves, then launches what was saved): what the screen can refuse
        is refused here, the file is written in a worker (a slow or network disk must not hold the screen)
        and ``on_plan_saved`` says where it went."""
        from core.plan import default_config_path

        if self.saving or (launch and self.busy):  # a save under way, or a launch (a probe may run beside s)
            return
        rec = self.recommendation
        if rec is None or rec.best is None or rec.best.estimate is None:
            return
        if not rec.feasible:
            self.notify(t("wizard.cannot_save"), severity="warning")
            return
        if not self.request.dataset:  # planned without data: a run needs some; its step is where to give it
            self.notify(t("wizard.save_needs_dataset"), severity="warning")
            self._show_step(STEPS.index("dataset"))
            return
        refused = self._override_problem()
        if refused is not None:  # the plan shown leaves that field's value out: saving it would too
            name, problem = refused
            self._status(f"[$error]{_escape(problem)}[/]")
            self.notify(t("wizard.override_unfixed", problem=problem), severity="warning", markup=False)
            self.query_one("#overrides").add_class("shown")
            self.set_focus(self.query_one(f"#ov-{name}", Input))
            return
        self.saving = True
        self.write_plan(rec.best, self.request, default_config_path(self.request), launch)

    @work(thread=True, exclusive=True, group="wizard-save", exit_on_error=False)
    def write_plan(self, candidate: Any, request: Any, wanted: Path, launch: bool) -> None:
        from core.config import ConfigError
        from core.plan import save_run_config_keeping

        try:
            # A file there that this screen did not write (hand edits, an earlier session's plan) is kept:
            # the plan goes to <model>-2.yaml … and the status says so. Not a y/n question: l saves then
            # launches in one key, and nothing needs deciding when nothing is lost.
            path = save_run_config_keeping(candidate, request, wanted, self.written)
        except (ConfigError, OSError) as exc:
            # a disk that cannot be written is said as the CLI says it (which folder, what to do), not
            # as "[Errno 30] Read-only file system: '…'"; on the status line too, where a launch's refusal shows
            self.post_message(PlanSaved(None, wanted, _save_error(exc, wanted), launch))
            return
        self.post_message(PlanSaved(path, wanted, None, launch))

    def on_plan_saved(self, message: PlanSaved) -> None:
        from core.plan import equivalent_command

        self.saving = False
        if message.error is not None:
            self._status(f"[$error]{_escape(message.error)}[/]")
            self.notify(_escape(message.error), severity="error")
            return
        path, wanted = message.path, message.wanted
        self.saved_path = path
        self.kept_path = None if path == wanted else wanted
        command = _escape(equivalent_command(path))
        if self.kept_path is None:
            self._status(t("wizard.saved", path=_escape(str(path)), command=command))
        else:
            # the two names short (the folder is the command's), so that the line fits 80 columns
            self._status(t("wizard.saved_kept", path=_escape(_short(path)), kept=_escape(_short(wanted)),
                           command=command))
        if message.launch:
            self._launch_saved(path)

    def action_launch(self) -> None:
        self._save(launch=True)

    def _launch_saved(self, path: Path) -> None:
        self.busy = True
        self._status(t("wizard.launching", path=_escape(str(path))))
        if self.kept_path is not None:  # the dashboard opens next: the status line goes with this screen
            self.notify(t("wizard.kept", kept=_escape(_short(self.kept_path)), path=_escape(str(path))))
        self.launch_path = str(path)
        self.launch(str(path))

    @work(thread=True, exclusive=True, group="wizard-launch", exit_on_error=False)
    def launch(self, path: str, allow_shared_gpus: bool = False, allow_over_memory: bool = False) -> None:
        from core.runs import GpuMemoryShort, GpusInUse, RunError, SupervisorDidNotStart, start_run

        warnings: list[str] = []  # a second CPU run, GPUs shared as asked, precision or host memory: said
        try:
            run = start_run(path, allow_shared_gpus=allow_shared_gpus, allow_over_memory=allow_over_memory,
                            warn=warnings.append)
            self.post_message(LaunchDone(str(run.path), None, warnings=warnings))
        except GpusInUse as exc:  # the screen asks: start it anyway (y) or not
            self.post_message(LaunchDone(None, str(exc), in_use=exc.runs))
        except GpuMemoryShort as exc:  # the screen asks, the refusal's figures in the question: start anyway (y) or not
            self.post_message(LaunchDone(None, str(exc), warnings=warnings, over_memory=True, shared=allow_shared_gpus))
        except SupervisorDidNotStart as exc:  # the notification says why, not only where the log is
            self.post_message(LaunchDone(None, str(exc), exc.summary()))
        except RunError as exc:
            self.post_message(LaunchDone(None, *_launch_error(exc)))

    def on_worker_state_changed(self, event: Any) -> None:
        # A worker that ended in an exception nothing caught: reported, and a launch or probe no longer
        # holds the screen busy, nor a plan the screen as planning.
        if not report_failed_worker(self.app, event):
            return
        if event.worker.group == "wizard-save":
            self.saving = False
            self._status(f"[$error]{_escape(describe(event.worker.error))}[/]")
        elif event.worker.group in ("wizard-launch", "wizard-probe"):
            self.busy = False
            self._status(f"[$error]{_escape(describe(event.worker.error))}[/]")
        elif event.worker.group == "wizard-plan":
            self.planning = False

    def on_launch_done(self, message: LaunchDone) -> None:
        self.busy = False
        for text in message.warnings:  # app notifications: they stay in sight as the dashboard opens
            self.app.notify(text, severity="warning", markup=False, timeout=10)
        if message.in_use:
            self._ask_shared_gpus(message.in_use)
            return
        if message.over_memory and message.error is not None:
            self._ask_over_memory(message.error, message.shared)
            return
        if message.error is not None:
            self._status(f"[$error]{_escape(message.error)}[/]")
            self.notify(_escape(message.summary), severity="error")
            return
        self._status(t("wizard.launched", path=_escape(message.run_path or "")))
        from tui.screens.runs import open_dashboard

        open_dashboard(self.app, message.run_path)

    def _ask_shared_gpus(self, in_use: list[tuple[str, str, list[int]]]) -> None:
        """A live run uses the plan's GPUs (launching twice, or beside a run started elsewhere): y starts this one
        anyway, anything else leaves it unstarted and says why on the status line."""
        from core.runs import state_label
        from tui.widgets.confirm import ConfirmScreen

        run_id, status, gpus = in_use[0]
        shared = ",".join(map(str, gpus))
        path = self.launch_path

        def answered(ok: bool | None) -> None:
            if not ok or path is None:
                self._status(f"[$error]{_escape(t('wizard.gpus_in_use_kept', id=run_id, gpus=shared))}[/]")
                return
            self.busy = True
            self._status(t("wizard.launching", path=_escape(path)))
            self.launch(path, allow_shared_gpus=True)

        body = t("wizard.gpus_in_use_body", id=run_id, status=state_label(status), gpus=shared)
        self.app.push_screen(ConfirmScreen(t("wizard.gpus_in_use_title", gpus=shared), body), answered)

    def _ask_over_memory(self, refusal: str, shared: bool) -> None:
        """The run's estimated peak is past its GPUs' free memory (a card another process holds, settings changed
        since the plan): the refusal's figures and way out, y starts it anyway (``--allow-over-memory``), anything
        else leaves it unstarted with the refusal on the status line."""
        from tui.widgets.confirm import ConfirmScreen

        path = self.launch_path

        def answered(ok: bool | None) -> None:
            if not ok or path is None:
                self._status(f"[$error]{_escape(refusal)}[/]")
                self.notify(_escape(t("wizard.over_memory_kept")), severity="error")
                return
            self.busy = True
            self._status(t("wizard.launching", path=_escape(path)))
            self.launch(path, allow_shared_gpus=shared, allow_over_memory=True)

        self.app.push_screen(ConfirmScreen(t("wizard.over_memory_title"), t("wizard.over_memory_body", text=refusal)),
                             answered)

    # --- probe ---------------------------------------------------------------------------------------
    def action_probe(self) -> None:
        if self.busy or self.recommendation is None or self.request is None:
            return
        if not self.request.hardware.detected:
            self.notify(t("wizard.probe_needs_box"), severity="warning")
            return
        self.busy = True
        self._status(t("wizard.probe_start"))
        self.probe(self.recommendation, self.request)

    @work(thread=True, exclusive=True, group="wizard-probe", exit_on_error=False)
    def probe(self, rec: Any, request: Any) -> None:
        from core.plan.probe import probe_candidates

        try:
            results = probe_candidates(rec, request,
                                       progress=lambda text: self.post_message(ProbeProgress(text)))
            self.post_message(ProbeProgress(t("wizard.probe_done", n=len(results)), results, done=True))
        except TunedeckError as exc:  # a ProbeError: a failed probe run; say why, keep the estimates
            self.post_message(ProbeProgress(f"[$error]{_escape(str(exc))}[/]", None, done=True))
        except Exception as exc:  # a bug: the error modal and the log; the estimates stay
            report_unexpected(self.app, exc, "wizard.probe")
            self.post_message(ProbeProgress(f"[$error]{_escape(describe(exc))}[/]", None, done=True))

    def on_probe_progress(self, message: ProbeProgress) -> None:
        self._status(message.text)
        if message.done:
            self.busy = False
            if message.measured:
                self.measured.update(message.measured)
                self.recompute(keep_status=True)


def _save_error(exc: Exception, plan: Path) -> str:
    """Why the plan (to be saved at ``plan``) could not be saved: a configuration problem in its own words, a
    disk that cannot be written with its folder or file and the remedy (``core.runs.disk_space.
    cannot_write_message``). An error of a file in the plan's folder (the atomic write's temporary file, its
    mode probe) or of none (a full disk's write) is said of the plan file: those names mean nothing to the user."""
    from core.runs.disk_space import cannot_write_message, is_unwritable

    if isinstance(exc, OSError) and is_unwritable(exc):
        if not exc.filename or Path(exc.filename).parent == plan.parent:
            exc = OSError(exc.errno, exc.strerror, str(plan))
        return cannot_write_message(exc)
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


def _launch_error(exc: Exception) -> tuple[str, str]:
    """A refused launch as the status line says it, and as its notification does. Data that does not load is
    said by its first problem (``file:line: what``) first: the engine's message leads with advice and a heading,
    and the lines the status has at 80x24 ended before the file and line. A configuration problem (the model
    not in the cache and no network…) is said by its first problem's own words, which end with the remedy: under
    "The run configuration has a problem:" and the plan file's path, the remedy was cut off. The notification
    has the whole message (every problem, with its file and line)."""
    from core.config import ConfigError
    from core.data import DataError

    cause = exc.__cause__
    if isinstance(cause, DataError) and cause.issues:
        first = cause.issues[0]
        text = t("wizard.launch_bad_data", problem=str(first),
                 more=_more_problems(len(cause.issues) - 1 + cause.more))
        return text, text.split("\n", 1)[0]
    if isinstance(cause, ConfigError) and cause.errors:
        first = cause.errors[0]
        # the key, unless the words start with it ("model 'Qwen/…' is not in the local hub cache")
        key = f"{first.key}: " if first.key and not first.message.startswith(first.key) else ""
        text = t("wizard.launch_bad_config", problem=key + first.message, more=_more_problems(len(cause.errors) - 1))
        return text, str(exc)
    return str(exc), str(exc)


def _more_problems(count: int) -> str:
    """`` (and 3 more)`` after a first problem; empty when it is the only one."""
    if count <= 0:
        return ""
    return t(plural_key("wizard.more_problems", count), count=format_count(count))


MAX_LISTED_FILES = 20


def data_files_nearby(sample: Path) -> list[Path]:
    """Data files in the current directory and its ``data/`` folder, then the bundled sample: the files
    the data loader reads (``core.data.readers.SUFFIXES``, the list the step's hint shows), nothing else."""
    found: list[Path] = []
    for folder in (Path.cwd(), Path.cwd() / "data"):
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        found += [p for p in entries if p.is_file() and is_data_file_name(p)]
    return [*found[:MAX_LISTED_FILES], sample]


# --- rendering ----------------------------------------------------------------------------------------
def memory_bar(best: Any, width: int = BAR_WIDTH, note: str = "") -> list[str]:
    """The per-GPU memory as one stacked bar against capacity (with ``note``, the error band, after it),
    and a legend of the parts."""
    est = best.estimate
    capacity = max(est.capacity_gib, 1e-9)
    cells: list[str] = []
    used = 0
    legend = []
    for key, gib in est.breakdown.items():
        if gib <= 0.005:
            continue
        n = max(1, round(gib / capacity * width)) if gib / capacity * width >= 0.5 else 0
        n = min(n, width - used)
        colour = PART_COLOURS.get(key, "$foreground")
        if n:
            cells.append(f"[{colour}]{'█' * n}[/]")
            used += n
        legend.append(f"[{colour}]■[/] {t(f'estimate.breakdown.{key}')} {gib:.1f}")
    cells.append("[$foreground-muted]" + "·" * max(0, width - used) + "[/]")
    verdict_colour = "$success" if est.fits else ("$warning" if est.verdict == "tight" else "$error")
    head = f"{''.join(cells)} [{verdict_colour}]{best.peak_gib:.1f}[/] / {est.capacity_gib:.1f} GiB"
    if note:
        head += f" [$foreground-muted]{_escape(note)}[/]"
    return [head, "  ".join(legend)]


def cache_disk_words(detected: Any) -> str:
    """``Downloads go to another disk: ModelScope cache 1.2 TB free at /mnt/ms.``: the hub caches on other disks
    than the data root's (whose free disk the hardware line gives: the checkpoints'); empty where there are none."""
    from core.hub.problems import HUB_NAMES
    from core.i18n import join_words

    if not detected.cache_disks:
        return ""
    return t("wizard.hardware.cache_disks", disks=t("wizard.hardware.in_use_sep").join(
        t("wizard.hardware.cache_disk", hubs=join_words(HUB_NAMES.get(hub, hub) for hub in disk.hubs),
          free=format_disk(disk.free_bytes), path=disk.path or t("hardware.cli.na")) for disk in detected.cache_disks))


def in_use_words(detected: Any) -> str:
    """``In use by other processes now: GPU 0 80.2, GPU 1 94.6 GiB.``: the memory this box's GPUs hold for others,
    by index, when one holds more than an idle GPU does (``BUSY_FLOOR_GIB``); empty otherwise."""
    from core.plan.hardware import BUSY_FLOOR_GIB

    pairs = sorted(zip(detected.gpu_indices or (), detected.in_use_gib or (), strict=False))
    if not any(used >= BUSY_FLOOR_GIB for _, used in pairs):
        return ""
    return t("wizard.hardware.in_use", gpus=t("wizard.hardware.in_use_sep").join(
        t("wizard.hardware.in_use_gpu", index=index, used=used) for index, used in pairs))


def alternatives_hint(listed: int) -> str:
    """The keys that take an alternative, as many as are listed (the bindings are 1 to ``ALTERNATIVE_KEYS``)."""
    keys = min(listed, ALTERNATIVE_KEYS)
    return t(plural_key("wizard.alternatives_hint", keys), last=keys)


def render_recommendation(rec: Any) -> list[tuple[str, bool]]:
    """The recommendation as lines of markup, from the lines ``tunedeck plan`` prints (core.plan.view): the
    memory line drawn as the bar, speed and time on one line, sections coloured by their tone. Each comes with
    whether it is an item under a section: drawn indented, its wrapped lines too (at 80 columns most reasons
    wrap, and a continuation at the left edge reads as the next heading)."""
    from core.plan.view import recommendation_view

    view = recommendation_view(rec)
    if not any(line.kind == "headline" for line in view):
        return [(t("wizard.nothing"), False)]
    lines: list[str] = []
    items: set[int] = set()
    for line in view:
        text = _escape(line.text)
        if line.kind == "title":
            continue  # the wizard's steps already say the model, the box and the goal
        if line.kind == "weights":  # planned from a hub's config.json: the weights come when the run starts
            lines.append(f"[$warning]{text}[/]")
        elif line.kind == "infeasible":
            lines.append(f"[b $error]{text}[/]")
        elif line.kind == "way_out":
            items.add(len(lines))
            lines.append(f"[$warning]→[/] {text}")
        elif line.kind == "headline":
            lines.append(f"[b]{text}[/]")
        elif line.kind == "memory":
            lines += memory_bar(rec.best, note=line.note)
        elif line.kind == "speed":
            lines.append(text + (" " + t(f"wizard.{line.tone}") if line.tone in ("measured", "scaled") else ""))
        elif line.kind == "eta":
            lines[-1] += " · " + text
        elif line.kind == "section":
            hint = " " + alternatives_hint(len(rec.alternatives)) if line.section == "alternatives" else ""
            lines.append(f"[b ${line.tone}]{line.text}[/]{hint}")
        else:  # item, alternative
            items.add(len(lines))
            lines.append(text)
    return [(line, index in items) for index, line in enumerate(lines)]
