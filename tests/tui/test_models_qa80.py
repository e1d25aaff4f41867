"""The Models screen at 80×24 after a QA pass (fake GPUs: two H200 recorded, no GPU needed): the download line
speaks of what ``d`` would do, forgets a deleted model, fits its line; the card follows the list; the tables
cut no number or date; an unfinished download in the Local tab says how to resume it.

Hubs: the local fake hub (``tests.hubserver``) through the real SDKs; downloads are written as the downloader
leaves them (``job.json`` and ``state.json``), no process runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from core.hub.download import DownloadStatus, job_dir_for
from core.i18n import t
from core.text_width import cell_len
from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tests.tui.test_models_offline import footer_keys, offered, region_text
from tests.tui.test_models_screen import BUNDLED, hub_env, open_models, results  # noqa: F401  (hub_env: a fixture)
from tui.app import make_app

SIZE = (80, 24)
TINY = "Qwen/Qwen2.5-Tiny-Instruct"
DEEPSEEK = "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"


def stopped_download(hub: str, model_id: str, target: Path, done: int = 16_000_000,
                     total: int = 100_000_000) -> Path:
    """A download stopped part way (c, or the process gone), as its job folder holds it."""
    job = job_dir_for(hub, model_id)
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({
        "hub": hub, "model_id": model_id, "revision": "master", "target_dir": str(target),
        "files": [{"path": "model.safetensors", "size": total}]}))
    (job / "state.json").write_text(json.dumps({
        "status": "cancelled", "bytes_done": done, "bytes_total": total, "updated": time.time()}))
    return job


def modelscope_folder(root: Path, model_id: str, files: dict[str, bytes]) -> Path:
    owner, name = model_id.split("/")
    folder = root / "ms" / "models" / owner / name.replace(".", "___")
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def flat(widget) -> str:
    """What ``widget`` renders, its wrapping undone."""
    return " ".join(str(widget.render()).split())


def line(app) -> str:
    return region_text(app, app.screen.query_one("#download-line")).strip()


def card(app) -> str:
    return str(app.screen.query_one("#details-facts").render())


def app_80():
    return make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)


async def highlight(pilot, app, model_id: str) -> None:
    keys = [str(key.value) for key in results(app).rows]
    results(app).move_cursor(row=keys.index(model_id))
    await pilot.pause()


async def local_tab(pilot, screen):
    """The Local tab (2), once it lists the one model each test made beside the bundled ones."""
    await pilot.press("2")
    local = screen.query_one("#local-models")
    await wait_for(pilot, lambda: local.row_count == 1 + BUNDLED)
    return local


def test_d_resumes_it_only_while_d_would(hub_env, tmp_path):  # noqa: F811
    """The QA saw "Tiny: stopped; d resumes it" (a Hugging Face download) while browsing ModelScope with
    another row open: d downloaded that row. The hint now names the hub until that very model is open."""
    async def scenario():
        stopped_download("hf", TINY, tmp_path / "hf-target")
        (tmp_path / "hf-target").mkdir()
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: "on Hugging Face: stopped at 16.0 MB / 100.0 MB" in line(app))
            assert "d resumes" not in line(app)
            await highlight(pilot, app, DEEPSEEK)
            await pilot.press("enter")  # another model open: d is for it, the hint does not claim d
            await wait_for(pilot, lambda: screen.details is not None)
            assert "d" in offered(app) and "d resumes" not in line(app)
            await highlight(pilot, app, TINY)  # the same model on the other hub is not the stopped one
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.details is not None and screen.details.summary.model_id == TINY)
            assert "d resumes" not in line(app)
            await pilot.press("h")
            await wait_for(pilot, lambda: screen.hub == "hf" and not screen.searching and results(app).row_count)
            await highlight(pilot, app, TINY)
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.details is not None)
            await wait_for(pilot, lambda: line(app) == f"{TINY}: stopped; d resumes it")
            await pilot.press("up")  # the cursor leaves it: so do the card and the claim
            await wait_for(pilot, lambda: screen.details is None)
            assert "d resumes" not in line(app) and "d" not in offered(app)

    asyncio.run(scenario())


def test_the_card_follows_the_list(hub_env):  # noqa: F811
    """The QA's card kept DeepSeek's facts once a search no longer listed it, and read "ModelScope" after h."""
    async def scenario():
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await highlight(pilot, app, DEEPSEEK)
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.details is not None and "ModelScope ·" in card(app))
            await pilot.press("s", *"tiny", "enter")
            await wait_for(pilot, lambda: results(app).row_count == 1)
            assert screen.details is None and card(app) == t("modelsscreen.pick_model")
            assert "d" not in offered(app)
            await pilot.press("enter")  # the one listed
            await wait_for(pilot, lambda: screen.details is not None and "ModelScope ·" in card(app))
            await pilot.press("h")  # at once, before Hugging Face answers
            assert screen.details is None and "ModelScope" not in card(app)
            await wait_for(pilot, lambda: screen.hub == "hf" and not screen.searching)
            assert card(app) == t("modelsscreen.pick_model")

    asyncio.run(scenario())


def test_a_deleted_models_download_leaves_the_line(hub_env, tmp_path):  # noqa: F811
    """After x, y on a model the bar kept "stopped; d resumes it … 16%" for it. Its record goes with it (core);
    the line then shows the newest other download, not "no download" while one is there to resume."""
    async def scenario():
        older = stopped_download("hf", TINY, tmp_path / "hf-target")
        (tmp_path / "hf-target").mkdir()
        state = json.loads((older / "state.json").read_text())
        (older / "state.json").write_text(json.dumps({**state, "updated": time.time() - 3600}))
        folder = modelscope_folder(tmp_path, "qa/Big-Slow-7B", {"config.json": b"{}", "model.safetensors.part": b"x"})
        stopped_download("modelscope", "qa/Big-Slow-7B", folder)
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: "qa/Big-Slow-7B on ModelScope: stopped at" in line(app))
            local = await local_tab(pilot, screen)
            await pilot.press("x")
            await wait_for(pilot, lambda: "Delete qa/Big-Slow-7B?" in screen_text(app))
            await pilot.press("y")
            await wait_for(pilot, lambda: not folder.exists() and local.row_count == BUNDLED)
            await wait_for(pilot, lambda: f"{TINY} on Hugging Face: stopped at" in line(app))
            assert screen.job_dir == older

    asyncio.run(scenario())


def test_a_failed_download_into_an_old_cache_leaves_the_line_to_the_whole_model(hub_env, tmp_path):  # noqa: F811
    """A download of qa/Big-Slow-7B failed into a ModelScope cache since moved (MODELSCOPE_CACHE changed); the model
    is whole in the cache of now. The line showed the old failure beside it; the whole model wins, and the line
    shows the newest other download (a stopped one of the tiny model)."""
    async def scenario():
        older = stopped_download("hf", TINY, tmp_path / "hf-target")
        state = json.loads((older / "state.json").read_text())
        (older / "state.json").write_text(json.dumps({**state, "updated": time.time() - 3600}))
        failed = stopped_download("modelscope", "qa/Big-Slow-7B", tmp_path / "old-ms" / "models" / "qa" / "Big-Slow-7B")
        (failed / "state.json").write_text(json.dumps({"status": "failed", "error": "HTTP 500", "bytes_done": 1,
                                                       "bytes_total": 100, "updated": time.time()}))
        modelscope_folder(tmp_path, "qa/Big-Slow-7B", {"config.json": b"{}", "model.safetensors": b"x"})
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: f"{TINY} on Hugging Face: stopped at" in line(app))
            assert screen.job_dir == older and "failed" not in line(app)

    asyncio.run(scenario())


def test_hub_columns_fit_80_columns_without_cutting_numbers(hub_env):  # noqa: F811
    """The QA saw "Pa" for Params and "7." for 7.0B: the model name is cut instead, the columns whole."""
    async def scenario():
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            await open_models(pilot, app)
            shown = [text.strip() for text in region_text(app, results(app)).splitlines()]
            assert shown[0].split()[:3] == ["Model", "Params", "Downloads"], shown[0]
            for model_id, params, downloads in ((DEEPSEEK, "1.5B", "300.0K"), ("Qwen/Qwen2.5-7B-Instruct", "7.0B",
                                                                                "900.0K")):
                row = next(text for text in shown if text.startswith(model_id[:12]))
                assert row.split()[-2:] == [params, downloads], row  # whole, the name cut instead
                assert row.split()[0].endswith("…") or row.split()[0] == model_id

    asyncio.run(scenario())


def test_local_columns_fit_80_columns_with_the_whole_date(hub_env, tmp_path):  # noqa: F811
    """The QA saw "2026-12-" under Last used: the name and the path give way, the date is whole."""
    async def scenario():
        folder = modelscope_folder(tmp_path, DEEPSEEK, {"config.json": b"{}", "model.safetensors": b"w" * 1000})
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            local = await local_tab(pilot, screen)
            await pilot.pause()
            date = time.strftime("%Y-%m-%d", time.localtime(screen.local_models[0].last_used))
            table = region_text(app, local)
            assert "Last used" in table.splitlines()[0] and date in table, table
            assert all(cell_len(text) <= SIZE[0] for text in table.splitlines())
            assert folder.exists()
            # a bundled model's size and date are unknown: "–", as every unknown figure (units.UNKNOWN), not "—"
            bundled = next(row for row in table.splitlines() if row.strip().startswith("tiny"))
            assert " – " in bundled and "—" not in table, bundled

    asyncio.run(scenario())


def test_an_unfinished_downloads_id_is_whole_at_80_columns(hub_env, tmp_path):  # noqa: F811
    """ " (incomplete)" after the id took 13 of its cells: "Qwen/Qw… (incomplete)". The state is said in
    the Last used column now (a model not whole was never used), the id keeps its cells, whole at 80."""
    model = "Qwen/Qwen2.5-7B-Instruct"

    async def scenario():
        modelscope_folder(tmp_path, model, {"config.json": b"{}", "model.safetensors.part": b"x" * 100})
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            local = await local_tab(pilot, screen)
            await pilot.pause()
            lines = region_text(app, local).splitlines()
            header, row = lines[0], next(line for line in lines if model in line)
            cells = row.split()
            assert cells[0] == model and t("modelsscreen.incomplete") == "incomplete", row
            at = header.index(t("modelsscreen.col_used"))
            assert row[at:].split()[0] == "incomplete", (header, row)  # in its column, under Last used
            assert all(cell_len(text) <= SIZE[0] for text in lines)
            assert " incomplete " not in next(line for line in lines if line.split()[:1] == ["tiny"])
            # The count above the list: it read "1 model on disk, 100 B in all" where `tunedeck models list`
            # says "No models on disk" and lists the folder as incomplete.
            summary = flat(screen.query_one("#local-summary"))
            assert summary.startswith("No finished model on disk · 1 incomplete (102 B), not trainable"), summary
            modelscope_folder(tmp_path, TINY, {"config.json": b"{}", "model.safetensors": b"w" * 1000})
            await pilot.press("f5")
            await wait_for(pilot, lambda: flat(screen.query_one("#local-summary")).startswith(
                "1 model on disk, 1.0 kB in all · 1 incomplete (102 B)"))

    asyncio.run(scenario())


def status(**changes) -> DownloadStatus:
    values = dict(job_dir=Path("/nowhere"), hub="modelscope", model_id="qa/Big-Slow-7B", target_dir="",
                  status="running", bytes_done=25_600_000, bytes_total=31_500_000, current_file=None,
                  rate_bps=1_600_000.0, eta_s=3.0, files_done=1, files_total=3, error=None, pid=None,
                  updated=0.0)
    values.update(changes)
    return DownloadStatus(**values)


def test_the_download_line_drops_whole_parts_and_cuts_a_path_in_its_middle(hub_env):  # noqa: F811
    async def scenario():
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            width = SIZE[0] - 2  # the line's padding
            text = screen._download_text(status(), width)
            assert text == "qa/Big-Slow-7B: 25.6 MB / 31.5 MB · 1.6 MB/s · ETA 0:03", text  # no dangling "·"
            text = screen._download_text(status(current_file="model-00001-of-00004.safetensors"), width)
            assert text.endswith("ETA 0:03") and "·" not in text[-3:], text  # the file name left out whole
            # An ETA past an hour reads as `tunedeck models download` prints it, not wrapped to its minutes
            # ("%M:%S" showed 1:05:00 as 05:00); an unknown one as every unknown figure.
            assert screen._download_text(status(eta_s=3900.0), width).endswith("ETA 1:05:00")
            assert screen._download_text(status(eta_s=None), width).endswith("ETA –")
            # While the downloader tries a dropped link again: no rate or ETA of before the drop, as if live.
            text = screen._download_text(status(retry_attempt=3, retry_reason="Connection refused"), width)
            assert text == "qa/Big-Slow-7B: 25.6 MB / 31.5 MB · retrying (attempt 3) · Connection refused", text
            target = "/home/qa/.cache/modelscope/hub/models/deepseek-ai/DeepSeek-R1-Distill-Qwen-1___5B"
            text = screen._download_text(status(status="done", model_id=DEEPSEEK, target_dir=target), width)
            assert text.startswith(f"{DEEPSEEK}: downloaded to /home") and text.endswith("-Qwen-1___5B"), text
            assert "…" in text and cell_len(text) <= width

    asyncio.run(scenario())


def test_an_unfinished_download_in_the_local_tab_says_how_to_resume(hub_env, tmp_path):  # noqa: F811
    """Needs core's weights flag (core.hub.local.LocalModel.weights): .part files make a model incomplete."""
    async def scenario():
        modelscope_folder(tmp_path, TINY, {"config.json": b"{}", "model.safetensors.part": b"x" * 100})
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            local = await local_tab(pilot, screen)
            await wait_for(pilot, lambda: " incomplete " in region_text(app, local))
            assert "d" in offered(app)
            assert "p" not in offered(app)  # the wizard would plan on weights that are not there
            row = next(line for line in region_text(app, local).splitlines() if " incomplete " in line)
            assert len(str(tmp_path)) > 30 and "…" in row  # the path's middle gives way, its end stays:
            assert row.rstrip(" │▁▂▃▄▅▆▇█").endswith("-Instruct")  # the model's own folder (was "/tmp/pytest-…")
            await pilot.press("enter")
            details = screen.query_one("#local-details")
            await wait_for(pilot, lambda: f"d resumes the download of {TINY} from ModelScope" in flat(details))
            assert "Download not finished" in str(details.render())
            await pilot.press("down")  # a bundled model: nothing to resume, d is not offered
            assert "d" not in offered(app) and "p" in offered(app)
            await pilot.press("up", "d")  # no record of its download: the hub's listing, one weight format
            await wait_for(pilot, lambda: " incomplete " not in region_text(app, local) and screen.local_models
                           and screen.local_models[0].complete, timeout=60)
            assert (screen.local_models[0].path / "model.safetensors").stat().st_size == 256 * 1024

    asyncio.run(scenario())


def test_d_on_a_failed_download_in_the_local_tab_resumes_it_with_its_file_choice(hub_env):  # noqa: F811
    """The QA's download failed (the hub went away on its first file: README.md, so no config.json came);
    on the Local tab the footer offered "d Download", and d only said how to go and find it on the Hub tab.
    d resumes it now, from its record: its hub, its id and the files chosen (f: all of them), with the
    progress a download from the Hub tab shows; done, its row is a whole model."""
    from core.hub.download import read_status

    async def scenario():
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await highlight(pilot, app, TINY)
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.details is not None)
            await pilot.press("f")  # every file, pytorch_model.bin too
            readme = hub_env.hub.repos[TINY].files.pop("README.md")  # the hub fails the first file
            await pilot.press("d")
            await wait_for(pilot, lambda: screen.job_dir is not None and read_status(screen.job_dir).status == "failed")
            hub_env.hub.repos[TINY].files["README.md"] = readme  # the hub is back
            await pilot.press("f")  # the Hub tab's choice is one weight format again: d on Local keeps the record's
            hub_env.hub.stall_at = 128 * 1024  # the weights hold half-way: progress seen while it runs
            local = await local_tab(pilot, screen)
            await wait_for(pilot, lambda: " incomplete " in region_text(app, local))
            assert not screen.local_models[0].has_config
            assert "d" in offered(app) and ("d", "Resume") in app.screen.query_one("KeysFooter").shown()
            assert "d" in footer_keys(app)
            await pilot.press("d")
            bar = screen.query_one("#download-bar")
            await wait_for(pilot, lambda: screen.download_active and 0 < bar.progress < bar.total
                           and line(app).startswith(f"{TINY}: ") and " / " in line(app))
            assert any(f"Downloading {TINY}" in str(n.message) for n in app._notifications)
            hub_env.hub.stall_release.set()
            await wait_for(pilot, lambda: read_status(screen.job_dir).status == "done", timeout=60)
            await wait_for(pilot, lambda: " incomplete " not in region_text(app, local) and screen.local_models
                           and screen.local_models[0].complete)
            folder = screen.local_models[0].path
            assert (folder / "pytorch_model.bin").stat().st_size == 4096  # the file choice of the record
            assert (folder / "README.md").read_bytes() == readme

    asyncio.run(scenario())


# What the downloader stored when the QA stopped the hub on the first file (a real run's reason, port aside).
REFUSED = ("Gave up on README.md after 6 attempts without progress: HTTPConnectionPool(host='127.0.0.1', port=44345): "
           "Max retries exceeded with url: /api/v1/models/deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B/repo?Revision="
           "master&FilePath=README.md (Caused by NewConnectionError(\"HTTPConnection(host='127.0.0.1', port=44345): "
           "Failed to establish a new connection: [Errno 111] Connection refused\")). Run the download again to resume.")


def test_the_whole_reason_a_download_failed_can_be_read_at_80x24(hub_env, tmp_path):  # noqa: F811
    """The QA read "…: download failed: Gave up on README…" on the status line, with no way to read the rest.
    The line says "e: why", and e shows it whole; the Local tab's details of the model begin it and say so too."""
    from tui.widgets.text_modal import TextModal

    async def scenario():
        target = modelscope_folder(tmp_path, DEEPSEEK, {})  # it failed before its first file: empty
        job = stopped_download("modelscope", DEEPSEEK, target)
        (job / "state.json").write_text(json.dumps({"status": "failed", "bytes_done": 0, "bytes_total": 1000,
                                                    "error": REFUSED, "updated": time.time()}))
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: line(app).startswith(f"{DEEPSEEK}: download failed (e: why): Gave up"))
            assert line(app).endswith("…") and "e" in offered(app)
            await pilot.press("e")
            await wait_for(pilot, lambda: isinstance(app.screen, TextModal))
            shown = "".join(screen_text(app).replace("│", " ").split())  # a long URL wraps mid-word: no spaces
            assert "".join(REFUSED.split()) in shown, shown  # whole, on screen at 80×24
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is screen)
            local = await local_tab(pilot, screen)
            await pilot.press("enter")
            details = screen.query_one("#local-details")
            await wait_for(pilot, lambda: "Download failed (e: why): Gave up on README.md" in flat(details))
            on_screen = " ".join(region_text(app, details).split())
            assert "…" in on_screen and f"d resumes the download of {DEEPSEEK} from ModelScope" in on_screen, on_screen
            assert "e" in offered(app)  # the highlighted row's reason, whole
            await pilot.press("e")
            await wait_for(pilot, lambda: isinstance(app.screen, TextModal))
            assert "".join(REFUSED.split()) in "".join(screen_text(app).replace("│", " ").split())
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is screen)
            await pilot.press("down")  # a bundled model: no download of its own; e is still the line's
            assert "e" in offered(app)
            assert local.row_count == 1 + BUNDLED

    asyncio.run(scenario())


def test_the_local_details_follow_the_highlighted_row_and_a_download_that_ends(hub_env, tmp_path):  # noqa: F811
    """The QA's Local details kept saying "Download not finished … d resumes … x deletes the folder" of one
    model while another row was highlighted (d and x act on that one), and after d had finished the download
    (the row then whole, p offered). Another row highlighted, they go, as the Hub tab's card does; the model
    they show listed again, they are read again."""
    async def scenario():
        modelscope_folder(tmp_path, TINY, {"config.json": b"{}", "model.safetensors.part": b"x" * 100})
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            local = await local_tab(pilot, screen)
            await wait_for(pilot, lambda: " incomplete " in region_text(app, local))
            details = screen.query_one("#local-details")
            await pilot.press("enter")
            await wait_for(pilot, lambda: "Download not finished" in flat(details))
            await pilot.press("down")  # the bundled tiny: the details of the download are not its own
            await wait_for(pilot, lambda: not details.display)
            await pilot.press("up", "enter")
            await wait_for(pilot, lambda: details.display and "Download not finished" in flat(details))
            await pilot.press("d")
            await wait_for(pilot, lambda: screen.local_models and screen.local_models[0].complete, timeout=60)
            await wait_for(pilot, lambda: t("modelsscreen.facts_title") in flat(details))
            assert details.display and "Download not finished" not in flat(details)
            assert screen._selected_local().path == screen.local_models[0].path

    asyncio.run(scenario())


def test_a_long_model_id_leaves_the_download_line_its_numbers(hub_env):  # noqa: F811
    """The QA's 115-character id filled the line at 80 columns: "org-with-a-…-extr…", no sizes, no "stopped;
    d resumes it". The id gives way in its middle (its owner and its end stay); what the line says stays whole."""
    long_id = ("org-with-a-rather-long-name/Qwen2.5-Coder-32B-Instruct-GPTQ-Int4-with-an-extremely-long-suffix"
               "-for-testing-widths")

    async def scenario():
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            width = SIZE[0] - 2
            lines = {state: screen._download_text(status(model_id=long_id, **changes), width) for state, changes in {
                "running": {}, "cancelled": {"status": "cancelled"}, "interrupted": {"status": "interrupted"},
                "failed": {"status": "failed", "error": "HTTP 503 from the hub"},
                "done": {"status": "done", "target_dir": "/root/.cache/modelscope/models/org/Qwen2___5-Coder"}}.items()}
            for text in lines.values():
                assert cell_len(text) <= width and text.startswith("org-with-a-") and "…" in text, text
            assert lines["running"].endswith(": 25.6 MB / 31.5 MB · 1.6 MB/s · ETA 0:03"), lines["running"]
            assert "-for-testing-widths: 25.6 MB / 31.5 MB" in lines["running"]  # the id's end: which model
            assert lines["interrupted"].endswith(" on ModelScope: stopped at 25.6 MB / 31.5 MB"), lines
            assert lines["failed"].split(": ", 1)[1].startswith("download failed (e: why)"), lines  # e: the rest
            assert ": downloaded to /root" in lines["done"], lines["done"]
            # A short id is left whole, as it was.
            assert screen._download_text(status(status="cancelled"), width).startswith("qa/Big-Slow-7B on ModelScope:")

    asyncio.run(scenario())


def test_not_enough_disk_in_the_app_says_what_the_app_can_do(hub_env, monkeypatch):  # noqa: F811
    """The QA's d on a disk too small read "… or pick fewer files with --include": the app has no --include.
    The numbers stay; the advice is the app's (x on the Local tab)."""
    import core.hub.download

    monkeypatch.setattr(core.hub.download, "free_bytes_at", lambda path: 1000)

    async def scenario():
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await highlight(pilot, app, TINY)
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.details is not None)
            await pilot.press("d")
            await wait_for(pilot, lambda: any("Not enough disk" in str(n.message) for n in app._notifications))
            said = next(str(n.message) for n in app._notifications if "Not enough disk" in str(n.message))
            assert "1.0 kB is free" in said and "x on the Local tab" in said and "--include" not in said, said

    asyncio.run(scenario())


def test_a_size_class_on_a_later_page_is_found_and_a_scan_cut_short_says_so(hub_env, monkeypatch):  # noqa: F811
    """The QA's z to "large" said "No models match these filters" off a first page without a large model, the
    hub's page 4 holding one (the hubs cannot filter by size). The search reads on until a page has one; a
    scan that stops with pages left says which pages it read, not that nothing matches."""
    import core.hub.records
    from tests.core.test_hub_client import _many_then_large

    _many_then_large(hub_env.hub)

    async def scenario():
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("z", "z", "z")  # any → small → medium → large
            await wait_for(pilot, lambda: screen.query_state.size_class == "large" and not screen.searching
                           and screen.page is not None and screen.page.page > 1)
            assert [str(key.value) for key in results(app).rows] == ["acme/Coder-32B"]
            monkeypatch.setattr(core.hub.records, "SIZE_SCAN_PAGES", 2)
            await pilot.press("f5")
            await wait_for(pilot, lambda: not screen.searching and results(app).row_count == 0
                           and "No large model on pages 1-2" in screen_text(app).replace("\n", " "))
            assert "No models match" not in screen_text(app)

    asyncio.run(scenario())


def test_the_local_summary_is_whole_at_80x24_beside_an_unfinished_download(hub_env, tmp_path):  # noqa: F811
    """With a model on disk and an unfinished download, the Local tab's summary takes four lines at 80 columns
    (the counts, then the bundled models and what Enter and p do), and its box held three: "Enter shows a
    model's facts, p plans it." was cut off. Every line of it is on the screen now."""
    async def scenario():
        modelscope_folder(tmp_path, "Qwen/Qwen2.5-7B-Instruct", {"config.json": b"{}",
                                                                 "model.safetensors.part": b"x" * 100})
        modelscope_folder(tmp_path, TINY, {"config.json": b"{}", "model.safetensors": b"w" * 1000})
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("2")
            summary = screen.query_one("#local-summary")
            await wait_for(pilot, lambda: " incomplete " in flat(summary))
            await pilot.pause()
            shown = " ".join(region_text(app, summary).split())
            assert shown.endswith("p plans it."), shown
            assert shown.startswith("1 model on disk"), shown

    asyncio.run(scenario())


def test_a_download_started_from_a_terminal_while_the_screen_is_open_takes_the_line(hub_env, tmp_path):  # noqa: F811
    """The screen followed only the download it picked on opening: a `tunedeck models download` started in
    another terminal since ran unseen ("stopped at 16%" of the old one stayed, c offered nothing to cancel).
    A download running takes the line, and c cancels it. (The test holds the job's lock as its downloader does.)"""
    import fcntl

    async def scenario():
        stopped_download("hf", TINY, tmp_path / "hf-target")
        (tmp_path / "hf-target").mkdir()
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: "on Hugging Face: stopped at 16.0 MB / 100.0 MB" in line(app))
            assert "c" not in offered(app)
            job = stopped_download("modelscope", DEEPSEEK, tmp_path / "ms-target")  # from the terminal, since
            (tmp_path / "ms-target").mkdir()
            with open(job / "lock", "a+") as downloader:
                fcntl.flock(downloader, fcntl.LOCK_EX)
                (job / "state.json").write_text(json.dumps({
                    "status": "running", "bytes_done": 30_000_000, "bytes_total": 100_000_000, "rate_bps": 2e6,
                    "eta_s": 35.0, "current_file": "model.safetensors", "updated": time.time(), "pid": 1}))
                await wait_for(pilot, lambda: "30.0 MB / 100.0 MB" in line(app) and "Distill" in line(app))
                assert screen.job_dir == job and "c" in offered(app)
                (job / "state.json").write_text(json.dumps({
                    "status": "done", "bytes_done": 100_000_000, "bytes_total": 100_000_000,
                    "updated": time.time()}))
            await wait_for(pilot, lambda: "Distill" in line(app) and "30.0 MB" not in line(app))
            assert screen.job_dir == job and "c" not in offered(app)

    asyncio.run(scenario())


def test_a_finished_downloads_folder_deleted_by_hand_leaves_the_line(hub_env, tmp_path):  # noqa: F811
    """`rm -rf` of a downloaded model's folder while the screen was open: the line kept "downloaded to" that
    folder. The newest other download takes the line (here a stopped one), or none when there is none."""
    import shutil

    async def scenario():
        older = stopped_download("hf", DEEPSEEK, tmp_path / "hf-target")
        (tmp_path / "hf-target").mkdir()
        state = json.loads((older / "state.json").read_text())
        (older / "state.json").write_text(json.dumps({**state, "updated": time.time() - 3600}))
        folder = modelscope_folder(tmp_path, TINY, {"config.json": b"{}", "model.safetensors": b"x"})
        job = stopped_download("modelscope", TINY, folder, done=100_000_000)
        (job / "state.json").write_text(json.dumps({
            "status": "done", "bytes_done": 100_000_000, "bytes_total": 100_000_000, "updated": time.time()}))
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: "downloaded to" in line(app) and "Tiny" in line(app))
            shutil.rmtree(folder)
            await wait_for(pilot, lambda: "Distill" in line(app) and "stopped at 16.0 MB" in line(app))
            assert screen.job_dir == older
            shutil.rmtree(older)
            await wait_for(pilot, lambda: "downloaded to" not in line(app) and "Distill" not in line(app))

    asyncio.run(scenario())


def test_the_download_line_says_a_stall_and_a_checksum_check_instead_of_the_speed_of_before(hub_env, tmp_path):  # noqa: F811
    """While the hub held a transfer (no byte for many seconds, the retry 15 s on) the line kept "2.0 MB/s ·
    ETA 0:35" of before; while a shard's checksum was read, the same. It says which, without a speed.
    (The test holds the job's lock as its downloader does, and writes its state.json as it would.)"""
    import fcntl

    async def scenario():
        job = stopped_download("modelscope", TINY, tmp_path / "ms-target")
        (tmp_path / "ms-target").mkdir()
        running = {"status": "running", "bytes_done": 30_000_000, "bytes_total": 100_000_000, "rate_bps": 2e6,
                   "eta_s": 35.0, "current_file": "model.safetensors", "pid": 1}
        with open(job / "lock", "a+") as downloader:
            fcntl.flock(downloader, fcntl.LOCK_EX)
            (job / "state.json").write_text(json.dumps({**running, "updated": time.time() - 20}))
            app = app_80()
            async with app.run_test(size=SIZE) as pilot:
                await open_models(pilot, app)
                await wait_for(pilot, lambda: "no data for" in line(app))
                assert "30.0 MB / 100.0 MB" in line(app) and "MB/s" not in line(app) and "ETA" not in line(app)
                (job / "state.json").write_text(json.dumps({**running, "updated": time.time() - 20,
                                                            "verifying": True}))
                await wait_for(pilot, lambda: "verifying (sha256)" in line(app))
                assert "MB/s" not in line(app) and "no data" not in line(app)
                (job / "state.json").write_text(json.dumps({**running, "updated": time.time() + 3600}))
                await wait_for(pilot, lambda: "2.0 MB/s" in line(app))

    asyncio.run(scenario())


def test_d_on_a_model_already_whole_or_already_downloading_says_so_and_starts_nothing(hub_env):  # noqa: F811
    """d on a model already downloaded started a downloader that fetched nothing and said "Downloading … in the
    background"; d (after f: all files) on a model whose download ran dropped that choice without a word. As
    `tunedeck models download` says them: already downloaded (where), or already under way with its own files."""
    import fcntl

    from core.hub.download import SPAWNED_FILE, plan_download, start_download, wait_for_download
    from core.hub.source import open_hub

    source = open_hub("modelscope")
    plan = plan_download(source, source.details(TINY))
    job = start_download(plan)
    assert wait_for_download(job, 60).status == "done"
    spawned = (job / SPAWNED_FILE).read_bytes()

    def said(app, text):
        return any(text in str(n.message) for n in app._notifications)

    async def scenario():
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await highlight(pilot, app, TINY)
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen.details is not None)
            await pilot.press("d")
            await wait_for(pilot, lambda: said(app, f"Already downloaded: {TINY} is in {plan.target_dir}"))
            assert not said(app, "Downloading") and (job / SPAWNED_FILE).read_bytes() == spawned
            job_before = (job / "job.json").read_bytes()
            with open(job / "lock", "a+") as downloader:  # a download of it runs (from a terminal)
                fcntl.flock(downloader, fcntl.LOCK_EX)
                (job / "state.json").write_text(json.dumps({
                    "status": "running", "bytes_done": 1, "bytes_total": plan.total_bytes, "updated": time.time()}))
                await pilot.press("f", "d")
                await wait_for(pilot, lambda: said(app, f"{TINY} is already being downloaded"))
                assert not said(app, "Downloading") and (job / "job.json").read_bytes() == job_before

    asyncio.run(scenario())


def test_reading_the_downloads_never_holds_the_screen(hub_env, tmp_path):  # noqa: F811
    """The download line's state is read in a worker: on the UI thread, every half second (and as the screen
    opened) every download record was read, so a home on a slow or network disk held each frame. Here one
    record is a FIFO whose read waits for a writer: the screen must go on answering keys while it waits (the
    writer comes once the test has seen it answer, or, were the screen held, at a deadline that fails it)."""
    import os
    import threading

    async def scenario():
        stopped_download("hf", TINY, tmp_path / "hf-target")
        slow = job_dir_for("modelscope", DEEPSEEK)
        slow.mkdir(parents=True)
        record = json.dumps({"hub": "modelscope", "model_id": DEEPSEEK, "revision": "master",
                             "target_dir": str(tmp_path / "ms-target"),
                             "files": [{"path": "model.safetensors", "size": 100}]})
        os.mkfifo(slow / "job.json")
        answered, released = threading.Event(), {}

        def release() -> None:
            released["by"] = "the test" if answered.wait(120) else "the deadline"
            fifo = os.open(slow / "job.json", os.O_WRONLY)  # meets the reader waiting in open()
            (slow / "job.tmp").write_text(record)
            os.replace(slow / "job.tmp", slow / "job.json")  # later reads find a plain file
            os.write(fifo, record.encode())
            os.close(fifo)

        writer = threading.Thread(target=release, daemon=True)
        writer.start()
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await pilot.press("2")
            await wait_for(pilot, lambda: screen.tab == "local")
            answered.set()
            writer.join(150)
            await wait_for(pilot, lambda: "Distill" in line(app) or "Tiny" in line(app))
        assert released["by"] == "the test"

    asyncio.run(scenario())


def test_a_poll_that_raises_leaves_the_line_updating(hub_env, tmp_path):  # noqa: F811
    """The download line's poll runs one at a time; one that raised (a state.json read half written or edited by
    hand: ``"bytes_done": "lots"``) posted nothing, so the screen took it for still under way and never polled
    again: the line stayed as it was for good. Here state.json is a FIFO the test writes the bad record into, so
    the test knows the poll read it; the good record written after must reach the line. Such a record now reads
    "unreadable" (``read_status``), no error dialog: the poll after it still reaches the line."""
    import os
    import threading

    from tui.screens.error_modal import ErrorModal

    async def scenario():
        job = stopped_download("modelscope", DEEPSEEK, tmp_path / "ms-target")
        (tmp_path / "ms-target").mkdir()
        good = (job / "state.json").read_text()
        (job / "state.json").unlink()
        os.mkfifo(job / "state.json")
        read = threading.Event()

        def bad_record() -> None:
            fifo = os.open(job / "state.json", os.O_WRONLY)  # meets the poll waiting in open()
            (job / "state.tmp").write_text(good.replace("16000000", "42000000"))
            os.replace(job / "state.tmp", job / "state.json")  # later reads find a plain file
            os.write(fifo, json.dumps({"status": "cancelled", "bytes_done": "lots"}).encode())
            os.close(fifo)
            read.set()

        writer = threading.Thread(target=bad_record, daemon=True)
        writer.start()
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("m")
            await wait_for(pilot, read.is_set)
            await wait_for(pilot, lambda: "stopped at 42.0 MB / 100.0 MB" in line(app))
            assert not isinstance(app.screen, ErrorModal)  # the bad record read "unreadable": no error dialog

    asyncio.run(scenario())


def test_a_poll_begun_before_d_restarted_the_lines_download_does_not_hand_the_line_to_another(hub_env, tmp_path):  # noqa: F811
    """The line showed a stopped download; a poll found it not running and looked for one that runs (here one
    started from a terminal). Meanwhile d started the stopped one again: the poll's answer, asked of the same
    folder, was taken as news of now and handed the line, and c, to the terminal's download for good; the
    user's own ran unseen. A poll begun before d's pick is dropped. (The test holds both jobs' locks as their
    downloaders do; the terminal's record is a FIFO, so the test knows the poll is under way, and when it ends.)"""
    import fcntl
    import os
    import threading

    from tui.screens.models import DownloadStarted

    async def scenario():
        mine = stopped_download("modelscope", TINY, tmp_path / "ms-target")
        (tmp_path / "ms-target").mkdir()
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await wait_for(pilot, lambda: "stopped at 16.0 MB / 100.0 MB" in line(app) and "Tiny" in line(app))
            other = job_dir_for("hf", DEEPSEEK)
            other.mkdir(parents=True)
            (tmp_path / "hf-target").mkdir()
            record = json.dumps({"hub": "hf", "model_id": DEEPSEEK, "revision": "main",
                                 "target_dir": str(tmp_path / "hf-target"),
                                 "files": [{"path": "model.safetensors", "size": 100_000_000}]})
            running = {"status": "running", "bytes_total": 100_000_000, "rate_bps": 2e6, "eta_s": 35.0,
                       "current_file": "model.safetensors", "pid": 1}
            (other / "state.json").write_text(json.dumps({**running, "bytes_done": 50_000_000,
                                                          "updated": time.time()}))
            met, go = threading.Event(), threading.Event()

            def terminal_record() -> None:
                fifo = os.open(other / "job.json", os.O_WRONLY)  # meets the poll waiting in open()
                met.set()
                go.wait(120)
                (other / "job.tmp").write_text(record)
                os.replace(other / "job.tmp", other / "job.json")  # later reads find a plain file
                os.write(fifo, record.encode())
                os.close(fifo)

            with open(other / "lock", "a+") as theirs, open(mine / "lock", "a+") as ours:
                fcntl.flock(theirs, fcntl.LOCK_EX)
                os.mkfifo(other / "job.json")
                writer = threading.Thread(target=terminal_record, daemon=True)
                writer.start()
                try:
                    await wait_for(pilot, met.is_set)  # a poll under way, looking for a running download
                    fcntl.flock(ours, fcntl.LOCK_EX)  # d: its downloader runs
                    # written before the terminal's, as if read by the poll before d: the terminal's, newer, is
                    # the running one the poll finds first (a stall of 30 s is said of it, its bytes too)
                    (mine / "state.json").write_text(json.dumps({**running, "bytes_done": 30_000_000,
                                                                 "updated": time.time() - 30}))
                    screen.post_message(DownloadStarted(mine, None, TINY))
                    await wait_for(pilot, lambda: any("Downloading" in str(n.message) for n in app._notifications))
                finally:
                    go.set()
                    writer.join(60)
                await wait_for(pilot, lambda: "Tiny" in line(app) and "30.0 MB / 100.0 MB" in line(app))
                assert screen.job_dir == mine

    asyncio.run(scenario())


def test_an_unreadable_download_record_is_said_unreadable_not_a_failure_at_80x24(hub_env, tmp_path):  # noqa: F811
    """A download record edited by hand (a byte count that is no number) reads "unreadable": the Local tab's
    details of its model said "Download failed (e: why): The record of this download cannot be read …", and e's
    title "Why the download of … failed", of a download that had been stopped, not failed. Both now say the record
    cannot be read. Fake GPUs: two H200s (app_80)."""
    from tui.widgets.text_modal import TextModal

    async def scenario():
        target = modelscope_folder(tmp_path, DEEPSEEK, {})
        job = stopped_download("modelscope", DEEPSEEK, target)
        (job / "state.json").write_text(json.dumps({"status": "cancelled", "bytes_done": "12x",
                                                    "updated": time.time()}))
        app = app_80()
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_models(pilot, app)
            await local_tab(pilot, screen)
            await pilot.press("enter")
            details = screen.query_one("#local-details")
            said = t("modelsscreen.unreadable_reason", error="").strip()
            await wait_for(pilot, lambda: said in flat(details))
            assert t("modelsscreen.failed_reason", error="").strip() not in flat(details)
            await pilot.press("e")
            await wait_for(pilot, lambda: isinstance(app.screen, TextModal))
            shown = screen_text(app)
            assert t("modelsscreen.why_title_unreadable", model=DEEPSEEK) in shown, shown
            assert "bytes_done" in shown

    asyncio.run(scenario())
