"""Walk the wizard with keys only: defaults to a saved YAML, overrides, alternatives, infeasible."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml
from textual import events

from core.config import load_run_config
from core.i18n import t
from tests.tui.conftest import fake_monitor, post_burst, quiet_settings, screen_text, wait_for
from tui.app import make_app
from tui.widgets.keys_footer import footer_entries


def run(coro):
    return asyncio.run(coro)


def wizard(app):
    from tui.screens.wizard import WizardScreen

    screen = app.screen
    assert isinstance(screen, WizardScreen)
    return screen


async def open_wizard(pilot, app):
    """The wizard (w, from another section), at its first step."""
    if app.current_mode == "wizard":
        assert wizard(app).step == 0
        return wizard(app)
    await pilot.press("w")
    await wait_for(pilot, lambda: app.current_mode == "wizard")
    return wizard(app)


async def to_dataset_step(pilot, app):
    """The wizard at its data step, the default model taken."""
    w = await open_wizard(pilot, app)
    await pilot.press("enter")  # model: the default
    await wait_for(pilot, lambda: w.step == 1)
    return w


async def to_hardware_step(pilot, app):
    """The wizard at its hardware step: the default model, the bundled sample, the fastest goal."""
    w = await to_dataset_step(pilot, app)
    await pilot.press("enter")  # dataset: the bundled sample (read in a worker)
    await wait_for(pilot, lambda: w.step == 2, timeout=30)
    await pilot.press("enter")  # goal: fastest
    await wait_for(pilot, lambda: w.step == 3)
    return w


async def to_result(pilot, app, keys_before_hardware=()):
    w = await to_hardware_step(pilot, app)
    for key in keys_before_hardware:
        await pilot.press(key)
    await pilot.press("enter")  # hardware: this box
    await wait_for(pilot, lambda: w.step == 4)
    return w


def test_enter_enter_enter_saves_a_valid_yaml_on_a_cpu_box(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_result(pilot, app)
            assert w.recommendation.feasible
            assert w.request.hardware.cpu_only
            assert w.recommendation.best.plan.precision == "fp32"
            await pilot.press("enter")  # save
            await wait_for(pilot, lambda: w.saved_path is not None)
            await pilot.pause()
            text = screen_text(app)
            assert "tunedeck train " + str(w.saved_path) in " ".join(text.split())
            return w.saved_path

    path = run(scenario())
    assert path.is_file() and str(path).startswith(str(private_home))
    data = yaml.safe_load(path.read_text())
    assert data["model"] == "tiny" and data["precision"] == "fp32" and data["max_seq_len"] == 128
    config = load_run_config(path)
    assert config.method in ("lora", "full")


def test_the_hardware_step_says_when_its_gpus_are_fake(private_home):
    """A fake-GPU recording (``$TUNEDECK_FAKE_GPUS`` left set in a shell) read "This box: 2 × H200" on the
    hardware step, with nothing to tell it from the box's own: it now says first that they are replayed,
    as the GPU screen does (at 80x24, two H200s from their recording)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_hardware_step(pilot, app)
            await wait_for(pilot, lambda: "This box" in str(w.query_one("#hardware-detected").render()))
            shown = " ".join(str(w.query_one("#hardware-detected").render()).split())
            assert shown.startswith("Fake GPUs replayed from h200x2.json This box: 2 × H200"), shown

    run(scenario())


def test_the_hardware_step_gives_the_free_disk_in_the_units_the_gpu_screen_uses(private_home):
    """The two-H200 recording's free disk read "128 GiB free disk" here and "disk free 137.2 GB" on the GPU
    screen and in 'tunedeck gpus': one disk, two numbers. Disks are in decimal units (core.units.format_disk)."""
    from core.hardware.snapshot import load_snapshot
    from core.units import format_disk

    recording = Path(__file__).resolve().parents[1] / "fixtures" / "gpus" / "h200x2.json"
    disk = format_disk(load_snapshot(recording).host.disk_free_bytes)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_hardware_step(pilot, app)
            await wait_for(pilot, lambda: "This box" in str(w.query_one("#hardware-detected").render()))
            shown = " ".join(str(w.query_one("#hardware-detected").render()).split())
            assert f"RAM, {disk} free disk." in shown and disk == "137.2 GB", shown

    run(scenario())


def test_the_hardware_step_names_a_hub_cache_on_another_disk(private_home, tmp_path):
    """The step gave the data root's free disk alone ("137.2 GB free disk"), while model downloads fill the
    ModelScope cache, here on another disk with 5.0 GB free: it now names that disk too (the two-H200 recording,
    given a cache disk as the live sampler reads one)."""
    import json

    from tests.tui.conftest import GPU_FIXTURES

    recording = json.loads((GPU_FIXTURES / "h200x2.json").read_text())
    recording["host"]["cache_disks"] = [{"hubs": ["modelscope"], "path": "/mnt/ms", "total_bytes": 10**12,
                                         "free_bytes": 5 * 10**9}]
    fake = tmp_path / "box.json"
    fake.write_text(json.dumps(recording))

    async def scenario():
        from core.hardware.fake_nvml import fake_monitor_from_recording
        from tests.tui.conftest import StepClock

        monitor = fake_monitor_from_recording(fake, clock=StepClock())
        app = make_app(quiet_settings(), monitor=monitor, persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_hardware_step(pilot, app)
            await wait_for(pilot, lambda: "This box" in str(w.query_one("#hardware-detected").render()))
            shown = " ".join(str(w.query_one("#hardware-detected").render()).split())
            assert "137.2 GB free disk. Model downloads go to another disk: ModelScope cache 5.0 GB free at " \
                   "/mnt/ms." in shown, shown

    run(scenario())


def test_the_hardware_step_says_what_other_processes_hold_on_the_gpus(private_home):
    """The h200x2 recording replayed with its memory moving (``animate``, at a fixed clock: GPU 0 holds 80.2 GiB,
    GPU 1 94.6 for other processes) read "This box: 2 × H200 (140 GiB each …)" alone, and the plan then took GPU 0
    as if empty; the step says what they hold, as the plan's memory line does."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2", animate=True), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_hardware_step(pilot, app)
            await wait_for(pilot, lambda: "This box" in str(w.query_one("#hardware-detected").render()))
            shown = " ".join(str(w.query_one("#hardware-detected").render()).split())
            assert "In use by other processes now: GPU 0 80.2, GPU 1 94.6 GiB" in shown, shown

    run(scenario())


def test_gpu_box_defaults_to_qwen_7b_and_overrides_update_as_typed(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(160, 50)) as pilot:
            w = await to_result(pilot, app)
            assert w.request.model == "Qwen/Qwen2.5-7B-Instruct"
            assert w.request.hardware.detected and w.request.hardware.count == 2
            assert w.request.hardware.gpu.name == "H200"
            first = w.recommendation.best.plan
            # Full fine-tuning fits one H200 (117 GiB with fused AdamW) but needs disk for its checkpoints.
            assert first.precision == "bf16" and first.method in ("full", "lora")
            other = "lora" if first.method == "full" else "full"
            await pilot.press("o")  # overrides panel, focus on the method field
            assert app.focused.id == "ov-method"

            async def planned() -> None:  # the plan is computed off the UI thread: wait for it, not for time
                await wait_for(pilot, lambda: not w.planning)

            for key in other:
                await pilot.press(key)
            await planned()
            assert w.overrides == {"method": other}
            assert w.recommendation.best.plan.method == other
            assert "set by you" in " ".join(screen_text(app).split())
            w.query_one("#ov-zero_stage").focus()
            await pilot.press("3")
            await planned()
            assert w.recommendation.best.plan.zero_stage == 3
            w.query_one("#ov-seq_len").focus()
            for key in "4096":
                await pilot.press(key)
            await planned()
            assert w.recommendation.best.plan.seq_len == 4096
            w.query_one("#ov-micro_batch_size").focus()
            await pilot.press("x")  # not a number: the error shows, the plan stays
            assert "whole number" in screen_text(app)
            assert not w.planning and w.recommendation.best.plan.seq_len == 4096
            await pilot.press("backspace")
            await planned()
            w.query_one("#result-body").focus()
            await pilot.press("x")  # clear overrides
            await planned()
            assert w.overrides == {}
            assert w.recommendation.best.plan.method == first.method
            listed = w.recommendation.alternatives[0][0]
            await pilot.press("1")  # take the first alternative
            await planned()
            alt_plan = w.recommendation.best.plan
            assert w.overrides["method"] == alt_plan.method
            # the plan taken is the one listed, to the figure, and its reasons say where its fields came from
            assert alt_plan == listed.plan and w.recommendation.best.peak_gib == listed.peak_gib
            assert "chosen from the alternatives" in " ".join(screen_text(app).split())
            await pilot.press("s")
            await wait_for(pilot, lambda: w.saved_path is not None)
            return w.saved_path, alt_plan

    path, plan = run(scenario())
    data = yaml.safe_load(path.read_text())
    assert data["method"] == plan.method and data["zero_stage"] == plan.zero_stage
    assert data["gpus"] == [0, 1][: plan.num_gpus]
    assert data["precision"] == "bf16"


def test_infeasible_case_says_so_and_offers_a_way_out(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await open_wizard(pilot, app)
            await pilot.press("e")  # into the model field
            assert app.focused.id == "model-input"
            model = w.query_one("#model-input")
            model.value = ""
            for key in "Qwen2.5-72B":
                await pilot.press(key)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 1)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 3)
            await pilot.press("enter")  # this box: CPU only, a few GiB of RAM
            await wait_for(pilot, lambda: w.step == 4)
            assert not w.recommendation.feasible
            text = " ".join(screen_text(app).split())
            assert "Nothing fits" in text
            # not "more GPUs" (there are none here), nor a ZeRO stage for a single GPU
            assert "a GPU instead of the CPU: one H200 fits" in text or "GPUs instead of the CPU: 2×H200" in text
            assert "more GPUs" not in text and "ZeRO-0" not in text
            # s, l and p only said that nothing fits: not offered (footer, palette); o (the overrides) is
            keys = {key for key, _ in footer_entries(w)}
            assert not keys & {"s", "l", "p"} and "o" in keys
            titles = {command.title for command in app.get_system_commands(w)}
            assert not titles & {t("wizard.key.save"), t("wizard.key.launch"), t("wizard.key.probe")}
            await pilot.press("s", "l", "p")
            await pilot.pause()
            assert w.saved_path is None and not w.busy and app.current_mode == "wizard"
            await pilot.press("enter")  # saving an infeasible plan is refused
            await pilot.pause()
            assert w.saved_path is None
            await pilot.press("pageup")
            assert w.step == 3

    run(scenario())


def test_a_bad_model_id_stays_on_the_first_step_with_the_reason(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await open_wizard(pilot, app)
            w.query_one("#model-input").value = "no/such-model-here"
            await pilot.press("enter")  # a hub id found nowhere here: its config.json asked of the hub (closed)
            await wait_for(pilot, lambda: "No config.json for 'no/such-model-here' on this box"
                           in " ".join(screen_text(app).split()))
            assert w.step == 0
            text = " ".join(screen_text(app).split())
            assert "type a model folder" in text and "--model" not in text  # the TUI's words, not the CLI's
            w.query_one("#model-input").value = "no-such-folder"  # not a hub id: no hub asked
            await pilot.press("enter")
            await wait_for(pilot, lambda: "No config.json found for 'no-such-folder'"
                           in " ".join(screen_text(app).split()))
            assert "Type a model folder" in " ".join(screen_text(app).split())

    run(scenario())


def test_a_typed_model_is_read_off_the_ui_thread(private_home, tmp_path, monkeypatch):
    """Enter on the model step read a typed folder's (or a cached hub id's, a bundled name's) config.json on the
    UI thread, only a hub id found nowhere went to a worker: a slow disk froze the app. Every model is read in
    a worker, which posts what it found; a refused one is said the same way. CPU box (fake)."""
    import json
    import threading

    import core.plan.planner as planner
    from tests.hubserver import tiny_config

    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    read_on: list[bool] = []
    real = planner.base_plan

    def base_plan(*args, **kwargs):
        read_on.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "base_plan", base_plan)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await open_wizard(pilot, app)
            w.query_one("#model-input").value = str(tmp_path / "nothing-here")
            await pilot.press("enter")
            await wait_for(pilot, lambda: "No config.json found" in " ".join(screen_text(app).split()))
            assert w.step == 0
            w.query_one("#model-input").value = str(folder)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 1)
            assert w.base_model == str(folder) and w.base.architecture.hidden_size == 64

    run(scenario())
    assert read_on == [False, False]  # both read in a worker


def test_after_a_refused_model_typing_starts_a_new_id_and_the_error_goes(private_home):
    """``nosuch/model-7b``, Enter: the error, and the field kept the focus, so that ``Qwen2.5-7B`` typed next made
    ``nosuch/model-7bQwen2.5-7B`` (every character typed on the step starts a new value, the README says). Enter
    hands the value to the step now; the new id replaces the refused one and the error goes as it is typed.
    The CLI keeps its own advice (--model). CPU box (fake)."""
    from core.estimate import ModelNotFoundError, load_model_config

    try:
        load_model_config("nosuch/model-7b")
    except ModelNotFoundError as exc:
        assert "--model" in str(exc) and exc.kind == "unknown_model"

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await open_wizard(pilot, app)
            field, info = w.query_one("#model-input"), w.query_one("#model-info")
            await pilot.press(*"nosuch/model-7b", "enter")
            await wait_for(pilot, lambda: "No config.json" in str(info.render()))  # the hub asked (closed)
            assert w.step == 0 and field.value == "nosuch/model-7b" and w.focused is not field
            await pilot.press(*"Qwen2.5-7B")
            await wait_for(pilot, lambda: field.value == "Qwen2.5-7B")
            assert "No config.json" not in " ".join(screen_text(app).split())
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 1)
            assert w.base_model == "Qwen2.5-7B"

    run(scenario())


def test_model_from_the_browser_is_the_default_and_app_keys_still_work(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            app.wizard_model = "Qwen2.5-0.5B"
            w = await open_wizard(pilot, app)
            assert w.query_one("#model-input").value == "Qwen2.5-0.5B"
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 1)
            assert "Qwen2.5-0.5B" in w.base_model
            await pilot.press("pagedown")  # the data step's default, the bundled sample (read in a worker)
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            await pilot.press("r")  # the goal step has no text field: an app key
            assert app.current_mode == "runs"

    run(scenario())


def test_typing_on_a_step_starts_a_new_value_in_its_field_even_with_the_app_keys(private_home):
    """On the model step the step has the focus (so that Enter takes the default): a character typed there went
    nowhere until e; then an unbound character started a new model id but a bound one did its job, so typing
    ``meta-llama/...`` opened the model browser and ``qwen...`` quit. Every character starts the value now, and
    the footer offers no letter key while they are text. CPU box (fake)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await open_wizard(pilot, app)
            field = w.query_one("#model-input")
            assert field.value == "tiny" and w.focused is not field
            await pilot.press(*"Qwen2.5-0.5B")
            assert field.value == "Qwen2.5-0.5B" and w.focused is field
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 1)
            assert "Qwen2.5-0.5B" in w.base_model
            await pilot.press("pageup")
            await wait_for(pilot, lambda: w.step == 0 and w.focused is not field)
            await pilot.press("f7")  # F7 (or Tab) goes into the field and keeps its value
            assert w.focused is field and field.value == "Qwen2.5-0.5B"
            await pilot.press("escape")
            # typed in one burst, as a fast typist or tmux sends it: every key was sent to the step before the
            # first moved the focus into the field
            post_burst(app, "Qwen2.5-7B")
            await wait_for(pilot, lambda: field.value == "Qwen2.5-7B")
            await pilot.press("escape")
            w.post_message(events.Paste("  Qwen2.5-1.5B\n"))  # pasted on the step, not in its field
            await wait_for(pilot, lambda: field.value == "Qwen2.5-1.5B" and w.focused is field)
            await pilot.press("escape")
            keys = {key for key, _ in footer_entries(w)}
            assert {"F1", "F7", "Esc"} <= keys and not {key for key in keys if len(key) == 1}
            await pilot.press(*"meta-llama/q")  # m (models), r (runs), q (quit) and e (edit) are text here
            assert app.current_mode == "wizard" and app.is_running
            assert field.value == "meta-llama/q" and w.focused is field
            await pilot.press("escape", "escape")  # out of the field, then out of the wizard
            await wait_for(pilot, lambda: app.current_mode != "wizard")
            await pilot.press("r")  # elsewhere r is the app's key again
            await wait_for(pilot, lambda: app.current_mode == "runs")

    run(scenario())


def test_help_on_a_text_step_lists_only_keys_that_are_not_text(private_home):
    """F1 on the model step listed "Ctrl+Q / q Quit", "? / F1 Help" and "e / F7 Edit field", where q, ? and e are
    typed into the model id. Help lists what the footer offers: keys that are not text; on the plan step, where
    letters are keys again, q is listed. CPU box (fake)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await open_wizard(pilot, app)

            def keys() -> set[str]:
                return {name for _, rows in app.key_table(w) for key, _ in rows for name in key.split(" / ")}

            assert {"Ctrl+Q", "F1", "F7", "Esc", "Ctrl+P"} <= keys()
            assert not {name for name in keys() if len(name) == 1 and name.isascii()}, keys()  # arrows stay
            await pilot.press("f1")
            await wait_for(pilot, lambda: "Ctrl+Q" in screen_text(app))
            assert "Ctrl+Q / q" not in screen_text(app) and "e / F7" not in screen_text(app)
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is w)
            await to_result(pilot, app)
            assert "q" in keys()  # off the text steps letters are keys again

    run(scenario())


def test_a_model_handed_over_again_replaces_the_model_line(private_home):
    """Plan Qwen2.5-72B, go to another screen, hand over Qwen2.5-7B (as Models' p does): the field said
    Qwen2.5-7B but the line under it still described the 72B (80 layers, hidden 8192). CPU box (fake)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            app.wizard_model = "Qwen2.5-72B"
            w = await to_dataset_step(pilot, app)
            info = w.query_one("#model-info")
            assert "80 layers" in str(info.render())
            await pilot.press("ctrl+p")  # letters are text on the data step: the palette goes elsewhere
            await pilot.press(*"Runs", "enter")
            await wait_for(pilot, lambda: app.current_mode == "runs")
            app.wizard_model = "Qwen2.5-7B"
            await pilot.press("w")
            await wait_for(pilot, lambda: app.current_mode == "wizard" and w.step == 0)
            assert w.query_one("#model-input").value == "Qwen2.5-7B"
            await wait_for(pilot, lambda: "28 layers" in str(info.render()))
            assert "80 layers" not in str(info.render()) and "8192" not in str(info.render())

    run(scenario())


def test_the_plan_keys_are_offered_only_on_the_plan_step(private_home):
    """Help and Ctrl+P offered Save YAML, Launch, Probe, Overrides, Clear overrides and Take alternative
    1-3 on steps 1-4, where they do nothing; a key that does not apply is not offered. CPU box (fake)."""
    from core.i18n import t
    from tui.screens.help import HelpScreen

    plan_keys = {t("wizard.key.save"), t("wizard.key.launch"), t("wizard.key.probe"), t("wizard.key.overrides"),
                 t("wizard.key.clear"), *(t("wizard.key.alternative", n=n) for n in (1, 2, 3))}

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await open_wizard(pilot, app)
            assert not plan_keys & {c.title for c in app.get_system_commands(w)}
            await pilot.press("f1")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
            text = " ".join(screen_text(app).split())
            assert t("wizard.key.next") in text
            assert not [key for key in plan_keys if key in text]
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is w)
            w = await to_result(pilot, app)
            titles = {c.title for c in app.get_system_commands(w)}
            assert {t("wizard.key.save"), t("wizard.key.launch"), t("wizard.key.overrides")} <= titles

    run(scenario())


def test_down_and_up_move_where_only_tab_did_and_a_bad_override_shows_at_80x24(private_home):
    """The dataset step's file list was reachable only with Tab, and the overrides panel moved between
    fields only with Tab; Down/Up move there too. An invalid override value (``2`` for method) was written
    at the end of the panel, out of view at 80x24: the status line says it. CPU box (fake)."""
    from core.plan.overrides import OverrideError, parse_override_value

    try:
        parse_override_value("method", "2")
    except OverrideError as exc:
        expected = str(exc)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            await pilot.press("f7")
            assert app.focused.id == "dataset-input"
            await pilot.press("down")
            assert app.focused.id == "dataset-files"
            assert w.query_one("#dataset-files").highlighted == 0
            await pilot.press("up")  # from the list's top, back to the field
            assert app.focused.id == "dataset-input"
            await pilot.press("escape", "pageup")
            await wait_for(pilot, lambda: w.step == 0)
            w = await to_result(pilot, app)
            await pilot.press("o")
            assert app.focused.id == "ov-method"
            await pilot.press("down")
            assert app.focused.id == "ov-precision"
            await pilot.press("down", "up", "up")
            assert app.focused.id == "ov-method"
            await pilot.press("2")
            await wait_for(pilot, lambda: expected[:40] in " ".join(screen_text(app).split()))
            await pilot.press("backspace")
            await wait_for(pilot, lambda: expected[:40] not in " ".join(screen_text(app).split()))

    run(scenario())


def test_a_path_being_typed_does_not_show_the_previous_files_statistics(private_home):
    """Typing a new path on the data step left the bundled sample's records, tokens and histogram under it, as if
    they were the new file's, until Enter read it. CPU box (fake)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            field, info = w.query_one("#dataset-input"), w.query_one("#dataset-info")
            sample = field.value
            w._summarise_if_needed()
            await wait_for(pilot, lambda: "records" in str(info.render()), timeout=30)
            await pilot.press(*"train.jsonl")
            await wait_for(pilot, lambda: field.value == "train.jsonl")
            assert "records" not in str(info.render()) and "Enter reads" in str(info.render())
            field.value = sample  # the file read before: its statistics again
            await wait_for(pilot, lambda: "records" in str(info.render()))

    run(scenario())


def test_dataset_file_picker_previews_the_picked_file(private_home, tmp_path, monkeypatch):
    data = tmp_path / "work" / "mine.jsonl"
    data.parent.mkdir()
    rows = [{"instruction": f"say {i}", "output": "word " * (i + 1)} for i in range(12)]
    data.write_text("\n".join(__import__("json").dumps(r) for r in rows) + "\n")
    monkeypatch.chdir(data.parent)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_dataset_step(pilot, app)
            w.query_one("#dataset-files").focus()
            await pilot.press("enter")  # the first file listed: ours
            await wait_for(pilot, lambda: w.summary is not None and w.summary_path == str(data), timeout=30)
            assert w.summary.records == 12 and w.summary.format == "alpaca"
            text = " ".join(screen_text(app).split())
            assert "format alpaca, 12 records" in text
            share = round(100 * w.summary.target_share())
            assert 30 < share < 100  # the outputs, against their instructions and the template's tokens
            assert f"{share}% of the tokens carry the loss: the LM head reads only those" in text
            assert w.step == 1
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 2)

    run(scenario())


def test_a_new_plan_clears_the_old_status_and_cpu_uses_this_box_ram(private_home):
    """Fake 2xH200 box (its recorded host: 251.8 GiB of RAM). A status about the GPU plan (a refused
    launch) goes when the plan is recomputed for ``cpu``; the CPU plan is sized against the box's RAM."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            assert not w.request.hardware.cpu_only
            w._status("[$error]gpus: index 0 asked for, 0 GPUs visible on this machine[/]")
            assert "0 GPUs visible" in screen_text(app)
            await pilot.press("pageup")
            await wait_for(pilot, lambda: w.step == 3)
            await pilot.press("e")
            w.query_one("#hardware-input").value = "cpu"
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 4 and not w.planning and w.request.hardware.cpu_only,
                           timeout=30)
            await pilot.pause()
            assert "0 GPUs visible" not in screen_text(app)
            ram = w.snapshot.host.memory_total_bytes / 1024**3
            assert w.request.hardware.host_ram_gib == ram
            assert abs(w.recommendation.best.estimate.capacity_gib - ram) < 0.5
            assert f"/ {ram:.1f} GiB" in screen_text(app)

    run(scenario())


def test_dataset_step_lists_and_names_the_formats_the_loader_reads(private_home, tmp_path, monkeypatch):
    """The hint and the file list both come from the data loader's table of suffixes: a file it reads is
    listed (plain .txt too: pre-training text), one it cannot read (.log, .md, .yaml) is not."""
    from core.data.readers import SUFFIXES

    work = tmp_path / "work"
    work.mkdir()
    for name in ("a.jsonl", "notes.txt", "run.log", "README.md", "config.yaml", "b.parquet"):
        (work / name).write_text("{}\n")
    monkeypatch.chdir(work)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_dataset_step(pilot, app)
            text = " ".join(screen_text(app).split())
            assert "/".join(SUFFIXES) in text and ".txt" in text
            files = w.query_one("#dataset-files")
            listed = [Path(str(files.get_option_at_index(i).id)).name for i in range(files.option_count)]
            assert listed[:3] == ["a.jsonl", "b.parquet", "notes.txt"]
            assert not {"run.log", "README.md", "config.yaml"} & set(listed)
            assert all(Path(name).suffix in SUFFIXES for name in listed)

    run(scenario())


def test_another_model_counts_the_dataset_again_with_its_own_tokenizer(private_home):
    """No GPU (fake monitor "none"). The bundled tiny model counts the sample with its tokenizer (exact); back on
    the model step, Qwen2.5-7B has no tokenizer on this box, so its counts are characters / 4 (approximate).
    The summary, and the plan's sequence length that follows it, must not keep the tiny tokenizer's counts."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await open_wizard(pilot, app)
            await pilot.press("enter")  # model: tiny
            await wait_for(pilot, lambda: w.step == 1)
            await pilot.press("enter")  # dataset: the bundled sample, counted by tiny's tokenizer
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            assert w.summary.exact and w.summary_model == "tiny"
            tiny_tokens = w.summary.total_tokens
            assert tiny_tokens > 1000 and f"{tiny_tokens:,} tokens (tokenizer)" in str(w.query_one("#dataset-info").content)
            await pilot.press("pageup", "pageup")
            await wait_for(pilot, lambda: w.step == 0)
            w.query_one("#model-input").value = "Qwen2.5-7B"
            w.query_one("#model-input").focus()
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 1)
            await pilot.press("enter")  # the same file: counted again for the new model before going on
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            assert w.summary_model == "Qwen2.5-7B"
            assert not w.summary.exact and w.summary.total_tokens != tiny_tokens

    run(scenario())


def test_enter_while_the_dataset_is_counted_waits_for_that_count(private_home, monkeypatch):
    """No GPU (fake monitor "none"). The model step starts counting the bundled sample; Enter on the dataset step
    before that count was done started a second count of the same file (a large file was tokenized twice). Now
    it waits for the first, and the step advances when it comes."""
    import threading

    import core.plan

    calls, release = [], threading.Event()
    real = core.plan.summarise_dataset

    def summarise_dataset(path, model=None, thinking=None):
        calls.append((path, model))
        release.wait(60)
        return real(path, model, thinking)

    monkeypatch.setattr(core.plan, "summarise_dataset", summarise_dataset)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await open_wizard(pilot, app)
            await pilot.press("enter")  # model: tiny; its count of the sample starts
            await wait_for(pilot, lambda: w.step == 1 and len(calls) == 1)
            await pilot.press("enter")  # the dataset step's Enter while that count is under way
            await pilot.pause()
            release.set()
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            assert len(calls) == 1 and w.summary is not None and w.summary_model == "tiny"

    try:
        run(scenario())
    finally:
        release.set()


def test_the_saved_status_goes_with_the_plan_when_the_inputs_are_changed(private_home):
    """s on the plan, then back to the data step: "Saved plans/tiny.yaml (l launches it now)" and its train
    command stayed at the bottom of the earlier steps, where l does nothing and the file no longer follows the
    inputs being changed. CPU box (fake)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            await pilot.press("s")
            await wait_for(pilot, lambda: w.saved_path is not None)
            assert "launches it now" in " ".join(screen_text(app).split())
            for step in (3, 2, 1):
                await pilot.press("pageup")
                await wait_for(pilot, lambda step=step: w.step == step)
                text = " ".join(screen_text(app).split())
                assert "launches it now" not in text and "tunedeck train" not in text

    run(scenario())


def test_save_keeps_a_plans_file_it_did_not_write(private_home):
    """s rewrote ``plans/<model>.yaml`` silently, losing hand edits (a changed learning rate, a comment), where
    ``tunedeck plan --save`` refuses without --force. A file the wizard did not write (or that changed since it
    did) is kept and the plan goes to ``<model>-2.yaml``, as the status line says; the wizard's own untouched
    file is rewritten, not copied again. CPU box (fake)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            await pilot.press("s")
            await wait_for(pilot, lambda: w.saved_path is not None)
            first = w.saved_path
            assert first.name == "tiny.yaml" and "kept" not in screen_text(app)
            w.saved_path = None
            await pilot.press("s")  # its own file, untouched: saved there again
            await wait_for(pilot, lambda: w.saved_path is not None)
            assert w.saved_path == first and not first.with_name("tiny-2.yaml").exists()
            edited = first.read_text().replace("learning_rate:", "# my rate\nlearning_rate: 0.000123 #")
            assert edited != first.read_text()
            first.write_text(edited)
            w.saved_path = None
            await pilot.press("s")
            await wait_for(pilot, lambda: w.saved_path is not None)
            assert w.saved_path == first.with_name("tiny-2.yaml")
            assert first.read_text() == edited
            text = " ".join(screen_text(app).split())
            assert "Kept plans/tiny.yaml (it differs: your edits?); saved plans/tiny-2.yaml" in text
            w.saved_path = None
            await pilot.press("s")  # tiny-2.yaml is the wizard's own now: no tiny-3
            await wait_for(pilot, lambda: w.saved_path is not None)
            assert w.saved_path == first.with_name("tiny-2.yaml")
            assert not first.with_name("tiny-3.yaml").exists() and first.read_text() == edited
            return first

    first = run(scenario())
    assert load_run_config(first.with_name("tiny-2.yaml")).model == "tiny"


def test_a_file_with_bad_rows_is_warned_of_on_the_data_step_and_its_launch_refusal_names_the_line(
        private_home, tmp_path):
    """A 20-line JSONL with invalid JSON on line 7 was taken with only "19 records, 1 problem rows" and the wizard
    went on; on the plan, l was refused with advice and a heading that filled the status line at 80x24, the
    ``file:7: invalid JSON`` line itself cut off. The data step now stays with a warning naming that line (Enter
    again goes on), and the refusal says the line first. CPU box (fake)."""
    import json

    data = tmp_path / "bad.jsonl"
    rows = [json.dumps({"instruction": f"say {i}", "output": "word " * (i + 1)}) for i in range(20)]
    rows[6] = '{"instruction": "say 6", "output": "word" "oops"}'
    data.write_text("\n".join(rows) + "\n")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            w.query_one("#dataset-input").value = str(data)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.summary is not None and w.summary_path == str(data), timeout=30)
            await wait_for(pilot, lambda: f"{data}:7: invalid JSON" in " ".join(screen_text(app).split()))
            text = " ".join(screen_text(app).split())
            assert w.step == 1 and "19 records, 1 problem row," in text
            assert "Training refuses this file until it is fixed" in text
            await pilot.press("enter")  # again: on, planned on the 19 rows that load
            await wait_for(pilot, lambda: w.step == 2)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 3)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 4)
            await pilot.press("l")
            await wait_for(pilot, lambda: "Not started" in screen_text(app), timeout=60)
            await wait_for(pilot, lambda: not w.busy)
            assert f"Not started: {data}:7: invalid JSON" in " ".join(screen_text(app).split())

    run(scenario())


def test_a_file_with_no_usable_record_is_refused_on_the_data_step_as_plan_refuses_it(private_home, tmp_path):
    """An empty file said "Training refuses this file", and Enter again went on to a plan of "< 1 min for 3
    epochs" while ``tunedeck plan`` refuses it with exit 2: the step now stays with plan's own words. CPU box
    (fake)."""
    data = tmp_path / "empty.jsonl"
    data.write_text("")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            w.query_one("#dataset-input").value = str(data)
            for _ in range(2):  # Enter, and Enter again
                await pilot.press("enter")
                await wait_for(pilot, lambda: w.summarising is None and "nothing to plan for" in " ".join(
                    screen_text(app).split()), timeout=30)
                await pilot.pause()
                assert w.step == 1 and w.summary is None
            assert f"{data}: the file is empty (no records)" in " ".join(screen_text(app).split())

    run(scenario())


def test_an_empty_file_among_the_data_is_a_problem_of_the_file_not_a_row(private_home, tmp_path):
    """A list of a good file and an empty one said "1 problem row": the empty file is a problem of the whole
    file, said as one, and named as ``data check`` names it ("the file is empty"). CPU box (fake)."""
    import json

    good, empty = tmp_path / "good.jsonl", tmp_path / "empty.jsonl"
    good.write_text("".join(json.dumps({"instruction": f"say {i}", "output": "word"}) + "\n" for i in range(5)))
    empty.write_text("")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            w.query_one("#dataset-input").value = f"{good},{empty}"
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.summary is not None, timeout=30)
            await wait_for(pilot, lambda: "file with a problem" in " ".join(screen_text(app).split()))
            text = " ".join(screen_text(app).split())
            assert "5 records, 1 file with a problem," in text and "problem row" not in text
            assert f"{empty}: the file is empty (no records)" in text

    run(scenario())


def test_the_alternatives_hint_and_keys_are_the_ones_listed(private_home):
    """The plan said "Alternatives: (1-3 take one)" over a single alternative, 2 did nothing, and after 1 was taken
    (none listed then) help still offered "Take alternative 1/2/3". The hint names the keys there are and help
    offers only those. CPU box (fake)."""
    from core.i18n import t

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)

            def offered() -> set[int]:
                rows = {description for _, section in app.key_table(w) for _, description in section}
                return {n for n in (1, 2, 3) if t("wizard.key.alternative", n=n) in rows}

            listed = len(w.recommendation.alternatives)
            assert 1 <= listed <= 3
            hint = "(1 takes it)" if listed == 1 else f"(1-{listed} take one)"
            assert f"Alternatives: {hint}" in screen_text(app)
            assert offered() == set(range(1, listed + 1))
            if listed < 3:
                before = w.plan_generation
                await pilot.press(str(listed + 1))  # not offered: nothing happens
                await pilot.pause()
                assert w.plan_generation == before and not w.overrides
            await pilot.press("1")
            await wait_for(pilot, lambda: w.overrides and not w.planning)
            assert offered() == set(range(1, len(w.recommendation.alternatives) + 1))
            if not w.recommendation.alternatives:
                assert "Alternatives:" not in screen_text(app) and not offered()

    run(scenario())


def test_the_alternatives_hint_says_the_keys_there_are():
    from tui.screens.wizard import alternatives_hint

    assert [alternatives_hint(n) for n in (1, 2, 3, 5)] == ["(1 takes it)", "(1-2 take one)", "(1-3 take one)",
                                                           "(1-3 take one)"]


def test_a_refused_launchs_error_goes_when_the_user_goes_back_to_change_the_inputs(private_home, monkeypatch):
    """After a refused launch, going back to the model step and typing another model kept the old refusal at the
    bottom of every step until a new plan came: it read as the new inputs' error. Leaving the plan clears it.
    CPU box (fake); the launch is refused (``start_run`` raising the RunError a refused check raises)."""
    import core.runs
    from core.runs import RunError

    def refused(path, allow_shared_gpus=False, warn=None, **_kwargs):
        raise RunError("the disk cannot hold the checkpoints", 2)

    monkeypatch.setattr(core.runs, "start_run", refused)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            await pilot.press("l")
            await wait_for(pilot, lambda: not w.busy and "cannot hold the checkpoints" in screen_text(app))
            await pilot.press("pageup")
            await wait_for(pilot, lambda: w.step == 3)
            assert "cannot hold the checkpoints" not in screen_text(app)
            await pilot.press("pageup", "pageup", "pageup")
            await wait_for(pilot, lambda: w.step == 0)
            await pilot.press(*"tin")
            await pilot.pause()
            assert w.query_one("#model-input").value == "tin"
            assert "cannot hold the checkpoints" not in screen_text(app)

    run(scenario())


def test_the_overrides_panel_hides_again(private_home):
    """After o nothing hid the overrides panel again: at 80x24 the plan kept 44 columns and its memory bar
    wrapped. o on the plan shows and hides it, Esc in one of its fields hides it too, the focus back on the plan,
    the values pinned kept. One H200 (fake)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            body, panel = w.query_one("#result-body"), w.query_one("#overrides")
            full = body.size.width
            await pilot.press("o")
            assert app.focused.id == "ov-method" and panel.display
            await wait_for(pilot, lambda: body.size.width < full)
            await pilot.press(*"lora")
            await wait_for(pilot, lambda: not w.planning and w.overrides == {"method": "lora"})
            await pilot.press("escape")  # out of the field: the panel goes with it
            assert app.focused is body and not panel.display and w.step == 4
            await wait_for(pilot, lambda: body.size.width == full)
            await pilot.press("o")
            assert app.focused.id == "ov-method" and panel.display
            await pilot.press("enter")  # the value taken: the plan has the focus, the panel stays
            assert app.focused is body and panel.display
            await pilot.press("o")  # o on the plan hides it
            assert app.focused is body and not panel.display
            assert w.overrides == {"method": "lora"}

    run(scenario())


def test_a_refused_override_left_in_its_field_keeps_the_plan_from_being_saved(private_home):
    """seq_len 8 typed in the overrides was refused (at least 16), stayed in its field, and was silently left out:
    after going back and forth the error was gone and s saved max_seq_len 128. Now the error comes back with the
    plan, and s (l) refuses to save until the field is mended, its field focused. One H200 (fake), 80x24."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            w.query_one("#ov-seq_len").value = "8"
            await wait_for(pilot, lambda: w.override_error)
            assert "seq_len" not in w.overrides
            await pilot.press("pageup")
            await wait_for(pilot, lambda: w.step == 3)
            assert "must be at least 16" not in screen_text(app)
            await pilot.press("pagedown")
            await wait_for(pilot, lambda: w.step == 4 and not w.planning)
            assert "must be at least 16" in " ".join(screen_text(app).split())
            await pilot.press("s")
            await wait_for(pilot, lambda: any("Not saved: an override's value is refused" in str(n.message)
                                              for n in app._notifications))
            assert w.saved_path is None and app.focused.id == "ov-seq_len"
            w.query_one("#ov-seq_len").value = ""
            await wait_for(pilot, lambda: not w.planning and not w.override_error)
            w.query_one("#result-body").focus()
            await pilot.press("s")
            await wait_for(pilot, lambda: w.saved_path is not None)

    run(scenario())


def test_gpu_indices_beside_another_hardware_are_said_to_go_unused(private_home):
    """Typed hardware and GPU indices together: the indices were dropped without a word (plan's --gpus and
    --hardware exclude each other). The hardware step says so; for this box they are taken. Two H200s (fake)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(100, 30)) as pilot:
            w = await to_hardware_step(pilot, app)
            w.query_one("#hardware-input").value = "2xA100-80GB"
            w.query_one("#gpus-input").value = "1"
            await wait_for(pilot, lambda: "they are not used" in " ".join(screen_text(app).split()))
            w.query_one("#hardware-input").value = w._detected().describe()
            await wait_for(pilot, lambda: "they are not used" not in " ".join(screen_text(app).split()))

    run(scenario())


def test_clear_overrides_is_offered_only_with_something_to_clear(private_home):
    """x (Clear overrides) was in the plan's footer, help and palette with nothing pinned or typed, and did
    nothing there. It is offered once an alternative is taken (or a field typed in), and gone again once it
    cleared them. CPU box (fake), 80x24."""
    def footer_keys(w) -> list[str]:
        return [key for key, _ in footer_entries(w)]

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            await pilot.pause()
            clear = t("wizard.key.clear")
            assert not w.overrides and "x" not in footer_keys(w)
            assert clear not in {command.title for command in app.get_system_commands(w)}
            await pilot.press("1")  # the first alternative, pinned in the overrides
            await wait_for(pilot, lambda: w.overrides and "x" in footer_keys(w))
            assert clear in {command.title for command in app.get_system_commands(w)}
            await pilot.press("x")
            await wait_for(pilot, lambda: not w.overrides and "x" not in footer_keys(w))

    run(scenario())


def test_d_leaves_long_samples_out_and_the_plan_and_saved_yaml_follow_as_plan_set_overlong_drop(private_home):
    """The wizard's overrides were the planner's fields alone: a user whose long records should be left out, not
    cut, could not say so there (only ``plan --set overlong=drop``). ``d`` on the plan now sets ``overlong: drop``:
    its field in the overrides panel, the plan's reasons and warnings, its samples, steps and time as the CLI
    counts them (the same core reading: ``request_fields``), and the saved YAML; ``d`` again cuts them. CPU box
    (fake: no GPU)."""
    from core.plan.planner import data_json

    data = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "overlong.jsonl"  # 8 samples, 2 long

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_dataset_step(pilot, app)
            w.query_one("#dataset-input").value = str(data)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 3)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 4 and not w.planning, timeout=30)
            w.query_one("#ov-seq_len").focus()
            for key in "64":
                await pilot.press(key)
            await wait_for(pilot, lambda: not w.planning and w.request.seq_len == 64)
            cut = data_json(w.request, w.recommendation.best)
            w.query_one("#result-body").focus()
            await pilot.press("d")
            await wait_for(pilot, lambda: w.request.overlong == "drop" and not w.planning)
            drop = data_json(w.request, w.recommendation.best)
            assert (cut["samples"], cut["overlong_dropped"]) == (8, 0)
            assert (drop["samples"], drop["overlong_dropped"]) == (6, 2)
            assert drop["tokens_per_epoch"] == cut["tokens_per_epoch"] - 2 * 64
            assert w.query_one("#ov-overlong").value == "drop"
            assert w.request.overrides == {"seq_len": 64}  # the planner's fields alone, as plan --set gives them
            text = " ".join(screen_text(app).split())
            assert "2 of 8 samples are longer than 64 tokens and will be left out" in text
            assert "overlong = drop: a sample longer than the sequence is left out whole" in text
            palette = [name for name, *_ in app.get_system_commands(w)]
            assert "Long samples: cut or drop" in " ".join(str(name) for name in palette)
            await pilot.press("s")
            await wait_for(pilot, lambda: w.saved_path is not None)
            saved = yaml.safe_load(w.saved_path.read_text())
            await pilot.press("d")  # cut again
            await wait_for(pilot, lambda: w.request.overlong == "cut" and not w.planning)
            assert data_json(w.request, w.recommendation.best)["samples"] == 8
            assert "left out" not in " ".join(screen_text(app).split())
            return saved

    saved = run(scenario())
    assert saved["overlong"] == "drop" and saved["max_seq_len"] == 64


def test_thinking_typed_in_the_overrides_counts_the_data_again_and_is_saved(private_home, tmp_path):
    """The wizard's overrides take the run key thinking as `plan --set thinking=false` does: the data's tokens
    were counted without it (a Qwen3-style template's empty think block before each answer left out), now they
    are counted again with it, the plan follows, and the saved YAML has it. No GPU (fake), 120x40."""
    import shutil

    from transformers import AutoTokenizer

    from tests.core.test_plan_cli import QWEN3_STYLE_TEMPLATE
    from tests.fixtures.lifecycle.finished_run import TINY

    model = tmp_path / "qwen3ish"
    shutil.copytree(TINY, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    tokenizer.save_pretrained(model)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        app.wizard_model = str(model)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_result(pilot, app)
            await wait_for(pilot, lambda: not w.planning and w.request is not None, timeout=30)
            before = w.request.dataset_tokens
            assert w.summary.exact and w.summary.thinking is None
            w.query_one("#ov-thinking").value = "false"
            await wait_for(pilot, lambda: w.summary.thinking is False and not w.planning
                           and w.request.thinking is False and w.request.dataset_tokens > before, timeout=60)
            w.query_one("#result-body").focus()
            await pilot.press("s")
            await wait_for(pilot, lambda: w.saved_path is not None)
            return w.saved_path

    path = run(scenario())
    assert yaml.safe_load(path.read_text())["thinking"] is False


def test_s_writes_the_plan_off_the_screen_a_hung_disk_does_not_freeze_the_app(private_home):
    """s wrote the plan on the screen's own thread: a plans folder on a disk that hangs (a dead NFS mount) froze
    the whole app until the write came back. The write is a worker's now. Made real, not timed: the plan's file
    is a FIFO, whose read blocks until a writer opens it; while it blocks, F1 opens the help (the app answers),
    and only then is the FIFO fed; its text is not the plan's, so the plan is kept beside it (tiny-2.yaml).
    Without the worker, F1 is answered only after the guard thread feeds the FIFO on its own (60 s), and the
    test says so. CPU box (fake)."""
    import os
    import threading

    from core.paths import data_root
    from tui.screens.help import HelpScreen

    plans = data_root() / "plans"
    plans.mkdir(parents=True, exist_ok=True)
    fifo = plans / "tiny.yaml"
    os.mkfifo(fifo)
    release, fed = threading.Event(), threading.Event()

    def feed() -> None:
        release.wait(60)
        with open(fifo, "w", encoding="utf-8") as writer:  # blocks until the plan's read opens it
            writer.write("model: other\n")
        fed.set()

    threading.Thread(target=feed, daemon=True).start()

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            await pilot.press("s")
            await pilot.press("f1")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
            answered_while_hung = not fed.is_set()
            release.set()
            await pilot.press("escape")
            await wait_for(pilot, lambda: w.saved_path is not None, timeout=60)
            return answered_while_hung, w.saved_path

    try:
        answered_while_hung, saved = run(scenario())
    finally:
        release.set()
    assert answered_while_hung, "the app answered F1 only once the plan's write came back"
    assert saved == plans / "tiny-2.yaml" and load_run_config(saved).model == "tiny"


def test_the_hardware_step_on_a_cpu_box_speaks_of_the_box_not_of_gpus(private_home):
    """On a box without a GPU (the fake ``none`` recording, 80x24) the hardware step asked for "GPUs of this box
    to use" and a "Price per GPU-hour", though the CPU trains and the cost is hours × that price (and its goal
    step offered the "fewest GPU-hours"): the indices field is gone there and the price is the box's per hour; typed GPUs (2xH100) bring the GPU-hour back, and a
    bad price is refused in the words of the label it was typed under."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_hardware_step(pilot, app)
            await wait_for(pilot, lambda: "This box" in str(w.query_one("#hardware-detected").render()))
            await pilot.pause()
            text = " ".join(screen_text(app).split())
            assert "GPUs of this box" not in text and "GPU-hour" not in text, text
            assert "Price per hour of the box" in text, text
            assert not w.query_one("#gpus-input").display
            goals = w.query_one("#goal-list")
            assert str(goals.get_option("lowest_cost").prompt) == "Lowest cost: fewest hours of the box"
            w.query_one("#hardware-input").value = "2xH100"
            await wait_for(pilot, lambda: "GPU-hour" in " ".join(screen_text(app).split()))
            w.query_one("#hardware-input").value = "cpu"
            w.query_one("#price-input").value = "-5"
            await wait_for(pilot, lambda: "Price per hour of the box" in " ".join(screen_text(app).split()))
            await pilot.press("enter")
            await wait_for(pilot, lambda: "Price per hour of the box:" in " ".join(screen_text(app).split()))
            assert w.step == 3

    run(scenario())


def test_the_hardware_step_on_a_gpu_box_keeps_its_gpu_fields(private_home):
    """The GPU wording stays where there are GPUs (two fake H200s): the indices field and the GPU-hour price;
    ``cpu`` typed there prices the box's hour."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_hardware_step(pilot, app)
            await wait_for(pilot, lambda: "This box" in str(w.query_one("#hardware-detected").render()))
            await pilot.pause()
            text = " ".join(screen_text(app).split())
            assert "GPUs of this box" in text and "Price per GPU-hour" in text, text
            assert w.query_one("#gpus-input").display
            assert str(w.query_one("#goal-list").get_option("lowest_cost").prompt) == "Lowest cost: fewest GPU-hours"
            w.query_one("#hardware-input").value = "cpu"
            await wait_for(pilot, lambda: "Price per hour of the box" in " ".join(screen_text(app).split()))

    run(scenario())
