"""The model browser driven by keys only, against the local fake hub (no network)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from core import i18n
from core.hub.local import bundled_models
from core.i18n import t
from tests.hubserver import FakeHubServer, closed_port_url, standard_hub
from tests.tui.conftest import (
    assert_snapshot,
    fake_monitor,
    post_burst,
    quiet_settings,
    screen_text,
    wait_for,
)
from tui.app import make_app
from tui.screens.models import ModelsScreen


@pytest.fixture
def hub_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    for name in ("MODELSCOPE_API_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


BUNDLED = len(bundled_models())  # the Local tab lists them after the models on disk


def results(app):
    return app.screen.query_one("#models-results")


async def open_models(pilot, app) -> ModelsScreen:
    await pilot.press("m")
    await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
    await wait_for(pilot, lambda: results(app).row_count > 0)
    return app.screen


def test_search_details_fit_and_snapshot(hub_env):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_models(pilot, app)
            assert [str(k.value) for k in results(app).rows] == [
                "Qwen/Qwen2.5-7B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "Qwen/Qwen2.5-Tiny-Instruct",
                "meta/gated-model"]
            assert "meta/gated-model (gated)" in screen_text(app)
            await pilot.press("s", *"tiny", "enter")
            await wait_for(pilot, lambda: results(app).row_count == 1)
            assert screen.query_state.text == "tiny"
            await pilot.press("enter")  # the focus is back on the results: open the one found
            await wait_for(pilot, lambda: screen.details is not None)
            await wait_for(pilot, lambda: "model.safetensors" in screen_text(app))  # the details drawn
            text = screen_text(app)
            assert "Qwen2ForCausalLM" in text and "On this box" in text
            assert "full" in text and "qlora" in text and "fits" in text
            assert "model.safetensors" in text
            assert "138.3K" in str(results(app).get_row("Qwen/Qwen2.5-Tiny-Instruct"))  # counted, not guessed
            await assert_snapshot(pilot, app, "models_details_120x36")

    asyncio.run(scenario())


def test_narrow_terminal_snapshot(hub_env):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_models(pilot, app)
            # The tiny model: its estimate is mostly fixed overhead, so estimator tuning rarely moves it.
            await pilot.press("down", "down", "enter")
            await wait_for(pilot, lambda: screen.details is not None)
            await pilot.pause(0.3)
            assert "does not fit" in screen_text(app) or "fits" in screen_text(app)
            await assert_snapshot(pilot, app, "models_details_80x24")

    asyncio.run(scenario())


def test_filters_and_hub_toggle(hub_env):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("b")  # downloads -> likes
            await wait_for(pilot, lambda: str(next(iter(results(app).rows)).value).startswith("deepseek"))
            assert screen.query_state.sort == "likes"
            await pilot.press("z")  # size: any -> small
            await wait_for(pilot, lambda: results(app).row_count == 1)
            await pilot.press("h")
            await wait_for(pilot, lambda: screen.hub == "hf" and not screen.searching)
            assert "Hugging Face" in screen_text(app)
            assert [str(k.value) for k in results(app).rows] == ["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]

    asyncio.run(scenario())


def test_download_progress_then_local_delete_with_confirmation(hub_env):
    async def scenario():
        hub_env.hub.chunk_delay_s = 0.05
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_models(pilot, app)
            bar = screen.query_one("#download-bar")
            # QA: no download was "No download is running." over an empty 0% bar; the line alone now
            await wait_for(pilot, lambda: t("modelsscreen.no_download") in screen_text(app))
            assert not bar.display
            await pilot.press("down", "down", "enter")  # the tiny model
            await wait_for(pilot, lambda: screen.details is not None)
            assert screen.details.summary.model_id == "Qwen/Qwen2.5-Tiny-Instruct"
            assert "d downloads 4 files" in screen_text(app) and "pytorch_model.bin" in screen_text(app)
            await pilot.press("f")  # all files, then back to one weight format
            assert "d downloads 5 files" in screen_text(app)
            await pilot.press("f")
            await pilot.press("d")
            await wait_for(pilot, lambda: screen.job_dir is not None)
            await wait_for(pilot, lambda: bar.display)  # a download to measure: its bar
            await wait_for(pilot, lambda: "downloaded to" in screen_text(app), timeout=30)
            assert bar.progress == bar.total > 256 * 1024
            assert not (screen.local_models or [])  # the local tab was not opened yet
            await pilot.press("2")
            local = screen.query_one("#local-models")
            await wait_for(pilot, lambda: local.row_count == 1 + BUNDLED)
            path = screen.local_models[0].path
            assert path.is_dir()
            await pilot.press("x")
            await wait_for(pilot, lambda: "Delete Qwen/Qwen2.5-Tiny-Instruct?" in screen_text(app))
            await pilot.press("n")  # declined: nothing happens
            await wait_for(pilot, lambda: "Delete Qwen/Qwen2.5-Tiny-Instruct?" not in screen_text(app))
            assert path.is_dir()
            await pilot.press("x")  # the dialog opens once the check (off the UI thread) says it may go
            await wait_for(pilot, lambda: "Delete Qwen/Qwen2.5-Tiny-Instruct?" in screen_text(app))
            await pilot.press("y")
            await wait_for(pilot, lambda: not path.exists() and local.row_count == BUNDLED)
            assert "No models on disk" in screen_text(app)

    asyncio.run(scenario())


@pytest.mark.parametrize("language", ["en", "zh"])
def test_a_delete_that_would_be_refused_says_why_in_the_dialog_with_no_y_to_press(hub_env, tmp_path, language):
    """x on a model a live run trains on opened "Delete …? y/n", and only after y did a notice say it was
    refused. The dialog itself now says why and the way out (the run, tunedeck stop RUN), with no y/n; y
    there deletes nothing. It said "nothing was deleted" too, where nothing had been tried: the title says
    the delete cannot be done now, the text why (``models rm``, which was asked to delete, keeps the words).
    Fake GPUs: one H200 (fixture); the run is a live supervisor lock, no GPU used."""
    import signal

    from tests.core.test_hub_local import _live_run_of

    folder = tmp_path / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 5000)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    run, holder = _live_run_of("Qwen/Qwen2.5-0.5B")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("2")
            local = screen.query_one("#local-models")
            await wait_for(pilot, lambda: local.row_count == 1 + BUNDLED)
            await pilot.press("x")
            title = t("modelsscreen.delete_refused_title", model="Qwen/Qwen2.5-0.5B")
            await wait_for(pilot, lambda: title in screen_text(app))
            text = screen_text(app)
            assert f"tunedeck stop {run.id}" in text and "Delete Qwen/Qwen2.5-0.5B?" not in text
            said = app.screen.text  # the dialog's whole text (the screen's wraps it over lines)
            assert {"en": "nothing was deleted", "zh": "未删除任何内容"}[language] not in said, said
            assert {"en": "Stop the run first", "zh": "请先停止该任务"}[language] in said, said
            assert t("dashboard.confirm_keys") not in text  # no y/n offered
            await pilot.press("y")  # nothing to confirm: still the same dialog, nothing deleted
            await pilot.pause()
            assert title in screen_text(app) and folder.is_dir()
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is screen)
            assert folder.is_dir()

    try:
        i18n.set_language(language)
        asyncio.run(scenario())
    finally:
        i18n.set_language("en")
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_offline_hub_says_so_and_local_tab_works(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    (tmp_path / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B").mkdir(parents=True)
    (tmp_path / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B" / "config.json").write_text("{}")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, ModelsScreen))
            screen = app.screen
            await wait_for(pilot, lambda: "not reachable" in screen_text(app))
            await pilot.press("2")
            await wait_for(pilot, lambda: screen.query_one("#local-models").row_count == 1 + BUNDLED)
            await wait_for(pilot, lambda: "Qwen/Qwen2.5-0.5B" in screen_text(app))  # columns sized on refresh

    asyncio.run(scenario())


def test_wizard_key_hands_the_model_over(hub_env):
    """p on the Hub tab's card of a model not downloaded (and no bundled config): the wizard plans it from the
    config.json the card read from the hub, and says its weights come with the run. Fake H200 (h200x1), 80x24."""
    async def scenario():
        from core.hub.download import human_bytes

        tiny = "Qwen/Qwen2.5-Tiny-Instruct"
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_models(pilot, app)
            results(app).move_cursor(row=[str(k.value) for k in results(app).rows].index(tiny))
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.details is not None and screen.details.summary.model_id == tiny)
            await pilot.press("p")
            await wait_for(pilot, lambda: app.current_mode == "wizard")
            assert app.wizard_model == tiny
            wizard = app.screen
            assert wizard.query_one("#model-input").value == tiny
            await pilot.press("enter")  # model: taken (it was refused, "config.json … not in cache")
            await wait_for(pilot, lambda: wizard.step == 1)
            assert wizard.base.architecture.hidden_size == 64  # the hub's config.json (tests/hubserver tiny_config)
            await pilot.press("enter")  # dataset: the bundled sample (read in a worker)
            await wait_for(pilot, lambda: wizard.step == 2, timeout=30)
            await pilot.press("enter")  # goal: fastest
            await wait_for(pilot, lambda: wizard.step == 3)
            await pilot.press("enter")  # hardware: this box (the fake H200)
            await wait_for(pilot, lambda: wizard.step == 4 and wizard.recommendation is not None, timeout=60)
            assert wizard.recommendation.request.model == tiny and wizard.recommendation.feasible
            size = human_bytes(sum(len(data) for name, data in hub_env.hub.repos[tiny].files.items()
                                   if name != "pytorch_model.bin"))  # one weight format: what train fetches
            body = wizard.query_one("#result-text")
            await wait_for(pilot, lambda: "not on this box yet" in " ".join(
                str(child.render()) for child in body.children).replace("\n", " "))
            text = " ".join(" ".join(str(child.render()) for child in body.children).split())
            assert f"its weights are not on this box yet, tunedeck train downloads them at its start ({size})" in text

    asyncio.run(scenario())


def test_a_hub_id_typed_in_the_wizard_is_planned_from_its_config_read_from_the_hub(hub_env, monkeypatch):
    """A hub id typed on the Wizard's model step, never opened in Models nor downloaded: its config.json is read
    from the hub in a worker ("Reading …"), then the step goes on (it said "No config.json found"). With the hub
    out of reach the step says so and what to do. Fake H200 (h200x1), 80x24."""
    from tests.hubserver import closed_port_url

    tiny = "Qwen/Qwen2.5-Tiny-Instruct"

    async def scenario(reachable: bool):
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("w")
            await wait_for(pilot, lambda: app.current_mode == "wizard")
            wizard = app.screen
            wizard.query_one("#model-input").value = tiny
            await pilot.press("enter")
            if reachable:
                await wait_for(pilot, lambda: wizard.step == 1)
                assert wizard.base.architecture.hidden_size == 64  # the hub's config.json (tiny_config)
            else:
                info = wizard.query_one("#model-info")
                await wait_for(pilot, lambda: "cannot give it now" in str(info.render()).replace("\n", " "))
                assert wizard.step == 0

    asyncio.run(scenario(True))
    import shutil

    from core.hub.config_cache import cache_root

    shutil.rmtree(cache_root())  # nothing kept: the offline case asks the hub again
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    asyncio.run(scenario(False))


def test_scrolling_to_the_end_loads_the_next_page(hub_env):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_models(pilot, app)
            from core.hub.records import SearchQuery

            screen.query_state = SearchQuery(page_size=2)
            screen.run_search()
            await wait_for(pilot, lambda: results(app).row_count == 2 and not screen.searching)
            await pilot.press("down")  # onto the last row: the next page comes
            await wait_for(pilot, lambda: results(app).row_count == 4)
            assert screen.page.page == 2 and not screen.page.has_more

    asyncio.run(scenario())


def test_under_a_size_class_the_count_is_out_of_the_models_whose_sizes_were_read(hub_env):
    """Under a size filter the status line said "1 of 4 models": the hub's 4 are of every size (it has no size
    filter). It says how many of the size class are among the models read. Fake hub, fake H200 (h200x1)."""
    async def scenario():
        from core.hub.records import SearchPage, SearchQuery

        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_models(pilot, app)
            status = screen.query_one("#models-status")
            screen.query_state = SearchQuery(page_size=2, size_class="small")  # page 1: the 7B and the 1.5B
            screen.run_search()  # (the one row highlighted, the next page is read too: all 4 then)
            await wait_for(pilot, lambda: results(app).row_count == 1 and not screen.searching
                           and not screen.page.has_more)
            await wait_for(pilot, lambda: str(status.render()).endswith("\n1 small among the 4 models"))
            # pages left to read: the count is out of those read, not the hub's total
            assert screen._found_text(1, SearchPage((), total=67, page=1, page_size=20)) == \
                "1 small among the first 20 of 67 models"

    asyncio.run(scenario())


def test_reopening_reattaches_to_a_running_download(hub_env):
    """A download started elsewhere (the CLI, an earlier session) shows up with its progress."""
    async def scenario():
        from core.hub.download import plan_download, read_status, start_download
        from core.hub.source import open_hub

        # Chunks at least 0.3 s apart (more than the downloader's 0.25 s between state writes, so each shows),
        # and the body holds its last quarter until the test has seen the cancel land.
        hub_env.hub.chunk_delay_s = 0.3
        hub_env.hub.stall_at = 192 * 1024
        source = open_hub("modelscope")
        plan = plan_download(source, source.details("Qwen/Qwen2.5-Tiny-Instruct"), ["model.safetensors"])
        job = start_download(plan)
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: "Qwen/Qwen2.5-Tiny-Instruct:" in screen_text(app))
            await wait_for(pilot, lambda: 0 < screen.query_one("#download-bar").progress)
            await pilot.press("c")  # cancel it from here
            # The cancel is on disk, or already taken and gone: "c" can come before the stall, while chunks
            # still flow, and then the downloader stops at the next one and deletes the file before a slow
            # box's test ever sees it (how this failed in CI).
            await wait_for(pilot, lambda: (job / "cancel").exists() or read_status(job).status == "cancelled")
            hub_env.hub.stall_release.set()  # a stalled body's next chunk meets the cancel
            # No model open: d would not resume it, so the line says where it is instead.
            await wait_for(pilot, lambda: "Qwen/Qwen2.5-Tiny-Instruct on ModelScope: stopped at" in screen_text(app))
            assert "stopped; d resumes it" not in str(screen.query_one("#download-line").render())
            await pilot.press("down", "down", "enter")  # the stopped model open: now d resumes it
            await wait_for(pilot, lambda: "Qwen/Qwen2.5-Tiny-Instruct: stopped; d resumes it" in screen_text(app))

    asyncio.run(scenario())


def test_keys_typed_in_one_burst_after_s_go_to_the_search(hub_env):
    """s then "qwen" in one write (tmux, a paste, a slow SSH link) went on as keys before the search had the focus:
    q quit the app. They go to the search now, s not typed into it. No GPU needed (the fake H200's screen); the
    keys are posted to the app at once, as a terminal read delivers them."""

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_models(pilot, app)
            search = screen.query_one("#models-search")
            post_burst(app, "sqwen")
            await wait_for(pilot, lambda: search.value == "qwen")
            await pilot.pause()
            assert app.is_running and app.screen is screen and app.focused is search and search.value == "qwen"

    asyncio.run(scenario())


def test_the_details_fit_is_judged_by_what_other_processes_leave_free(hub_env):
    """Fake GPUs: the h200x8 recording as taken, each H200 (140.4 GiB) holding 115-117 GiB of other processes.
    The details pane read "full 119.5/140 GiB fits" for Qwen2.5-7B against the whole card; it says the card, not
    the memory free now, fits it (``core.hub.facts.fit_on_box``, as `models info`)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x8"), persist_settings=False)
        async with app.run_test(size=(160, 50)) as pilot:
            screen = await open_models(pilot, app)
            results(app).focus()
            await pilot.press("enter")  # the first row: Qwen/Qwen2.5-7B-Instruct
            await wait_for(pilot, lambda: screen.details is not None)
            await wait_for(pilot, lambda: "GiB free now" in screen_text(app) or "GiB fits" in screen_text(app))
            text = " ".join(screen_text(app).split())
            assert "full 119.5/140 GiB fits the card, not the" in text, text  # GPU 0: 115.2 held
            assert "18.1 GiB usable" in text and "of the 25.2 GiB free now" in text, text  # 25.2 less the margin
            assert "qlora 7.7/140 GiB fits" in text  # beside the others' memory

    asyncio.run(scenario())


def test_the_count_says_one_model_and_why_a_result_is_left_out(hub_env):
    """The status line read "1 of 1 models", and "4 of 5 models" where the hub listed a model whose id is no valid
    ModelScope id (left out of the list, unsaid). Fake hub with such a model beside the standard ones; fake H200."""
    from tests.hubserver import FakeRepo

    hub_env.hub.add(FakeRepo("qa/模型-7B", files={"config.json": b"{}"}, downloads=1))

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_models(pilot, app)
            status = screen.query_one("#models-status")
            await wait_for(pilot, lambda: "4 of 5 models" in str(status.render()))
            assert str(status.render()).endswith(
                "4 of 5 models · 1 left out: its id is not a valid ModelScope id"), str(status.render())
            await pilot.press("s", *"tiny", "enter")
            await wait_for(pilot, lambda: results(app).row_count == 1 and not screen.searching)
            await wait_for(pilot, lambda: str(status.render()).endswith("\n1 model"))

    asyncio.run(scenario())


def test_no_results_lists_its_filters_with_the_languages_separator(hub_env):
    """The zh "no results" line joined its filters with an ASCII ", " (组织 Qwen, 规模 …): 、 in Chinese."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_models(pilot, app)
            screen.query_state = replace(screen.query_state, owner="Qwen", task="", size_class="small")
            screen.page = None
            try:
                i18n.set_language("zh")
                chinese = screen._no_results_text()
            finally:
                i18n.set_language("en")
            assert "组织 Qwen、规模" in chinese and ", " not in chinese
            assert "org Qwen, size" in screen._no_results_text()

    asyncio.run(scenario())


def test_x_on_a_model_deleted_elsewhere_says_it_is_gone_and_drops_its_row(hub_env, tmp_path):
    """The Local tab still listed a model `tunedeck models rm` (another SSH window) had deleted; x on it said
    "… is not a model folder tunedeck lists" and the row stayed. It now says the model is no longer on disk,
    and the row leaves the list. Fake GPUs: one H200 (fixture)."""
    import shutil

    folder = tmp_path / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"x" * 5000)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("2")
            local = screen.query_one("#local-models")
            await wait_for(pilot, lambda: local.row_count == 1 + BUNDLED)
            shutil.rmtree(folder)  # models rm, elsewhere
            await pilot.press("x")
            title = t("modelsscreen.delete_refused_title", model="Qwen/Qwen2.5-0.5B")
            await wait_for(pilot, lambda: title in screen_text(app))
            said = app.screen.text
            assert "no longer on disk" in said and "not a model folder" not in said, said
            await wait_for(pilot, lambda: local.row_count == BUNDLED)  # its row went
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is screen)

    asyncio.run(scenario())


def test_the_local_tab_lists_a_download_that_starts_elsewhere_as_incomplete(hub_env, tmp_path):
    """A model deleted and downloaded again from a shell (`models rm`, `models download`) stayed on the Local tab
    as whole, its old size and date, for the whole download: the list was read again when a download ended, not
    when one started. Fake GPUs: one H200 (fixture); the fake hub holds the file body so the download runs."""
    import shutil

    from core.hub.download import plan_download, start_download, wait_for_download
    from core.hub.source import open_hub

    source = open_hub("modelscope")
    plan = plan_download(source, source.details("Qwen/Qwen2.5-Tiny-Instruct"))
    assert wait_for_download(start_download(plan), 60).status == "done"

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("2")
            local = screen.query_one("#local-models")
            await wait_for(pilot, lambda: local.row_count == 1 + BUNDLED)
            assert t("modelsscreen.incomplete") not in str(local.get_row_at(0))
            shutil.rmtree(plan.target_dir)  # elsewhere: models rm, then models download
            hub_env.hub.stall_at = 128 * 1024
            start_download(plan)
            await wait_for(pilot, lambda: screen.download_active, timeout=60)
            await wait_for(pilot, lambda: t("modelsscreen.incomplete") in str(local.get_row_at(0)))
            hub_env.hub.stall_release.set()
            await wait_for(pilot, lambda: not screen.download_active, timeout=60)

    try:
        asyncio.run(scenario())
    finally:
        hub_env.hub.stall_release.set()


def test_the_download_line_says_nothing_of_a_finished_download_whose_folder_was_deleted_by_hand(hub_env):
    """A model downloaded, then its folder deleted by hand (rm -rf): the Models screen opened saying
    "Qwen/Qwen2.5-Tiny-Instruct: downloaded to <the deleted folder>". A finished download whose folder is gone
    is no news: the line says no download is running. Fake GPUs: one H200 (fixture)."""
    import shutil

    from core.hub.download import plan_download, start_download, wait_for_download
    from core.hub.source import open_hub

    source = open_hub("modelscope")
    plan = plan_download(source, source.details("Qwen/Qwen2.5-Tiny-Instruct"))
    assert wait_for_download(start_download(plan), 60).status == "done"
    shutil.rmtree(plan.target_dir)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await open_models(pilot, app)
            await wait_for(pilot, lambda: t("modelsscreen.no_download") in screen_text(app))
            assert "downloaded to" not in screen_text(app)

    asyncio.run(scenario())


def test_d_resume_is_not_offered_on_a_local_row_whose_download_runs(hub_env):
    """The Local tab offered "d Resume" on the row of a model being downloaded (its folder incomplete while the
    download runs), and its details said "d resumes the download". d is offered once the download has stopped.
    Fake GPUs: one H200 (fixture); the fake hub holds the file body so the download runs."""
    from core.hub.download import (
        cancel_download,
        plan_download,
        read_status,
        start_download,
        wait_for_download,
    )
    from core.hub.source import open_hub

    source = open_hub("modelscope")
    plan = plan_download(source, source.details("Qwen/Qwen2.5-Tiny-Instruct"))
    hub_env.hub.stall_at = 128 * 1024
    job = start_download(plan)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: screen.download_active, timeout=60)
            await pilot.press("2")
            local = screen.query_one("#local-models")
            await wait_for(pilot, lambda: t("modelsscreen.incomplete") in str(local.get_row_at(0)))
            await pilot.press("enter")  # its details
            await wait_for(pilot, lambda: "Being downloaded now" in screen_text(app))
            assert screen.check_action("download", ()) is False
            assert "Resume" not in screen_text(app) and "d resumes" not in screen_text(app)
            assert cancel_download(job)
            hub_env.hub.stall_release.set()
            await wait_for(pilot, lambda: not screen.download_active, timeout=60)
            assert read_status(job).status == "cancelled"
            await wait_for(pilot, lambda: screen.check_action("download", ()) is True)
            await wait_for(pilot, lambda: "Resume" in screen_text(app))

    try:
        asyncio.run(scenario())
    finally:
        cancel_download(job)
        hub_env.hub.stall_release.set()
        wait_for_download(job, 30)


def test_a_download_record_with_a_malformed_number_shows_unreadable_and_e_says_why(hub_env):
    """A download record edited by hand (a byte count that is no number): each half-second poll of the download
    line raised, the app showed an unexpected-error dialog and the line stayed on "No download". The line now
    says the record is unreadable, and e shows which file and key, and the way out. Fake GPUs: one H200."""
    from tests.core.test_hub_download import unreadable_download_record

    unreadable_download_record("modelscope")

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x1"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: "record unreadable" in screen_text(app))
            assert screen.is_current  # no error dialog over it
            await pilot.press("e")
            await wait_for(pilot, lambda: "bytes_done" in screen_text(app) and "state.json" in screen_text(app))

    asyncio.run(scenario())
