"""The wizard's fields are checked as ``tunedeck plan`` checks its options, and said on their own step."""

from __future__ import annotations

import asyncio

from tests.tui.conftest import fake_monitor, quiet_settings, wait_for
from tests.tui.test_wizard_flow import to_dataset_step, to_hardware_step
from tui.app import make_app


def run(coro):
    return asyncio.run(coro)


def test_epochs_without_a_count_of_tokens_are_refused_on_the_goal_step(private_home):
    """``inf`` and 1e400 epochs crashed to the error modal (no integer count of tokens), ``nan`` reached the
    hardware step as "cannot convert float NaN to integer". Each is refused on the goal step, where the
    field is, in the words of ``plan --epochs`` (a CPU-only box, the bundled sample)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            await pilot.press("enter")  # dataset: the bundled sample
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            said = {}
            for text in ("inf", "1e400", "nan", "1e308", "0"):
                w.query_one("#epochs-input").value = text
                await pilot.press("enter")
                await pilot.pause()
                assert w.step == 2, text
                said[text] = " ".join(str(w.query_one("#goal-info").render()).split())
            w.query_one("#epochs-input").value = "2"
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 3)
            return said

    said = run(scenario())
    assert said == {"inf": "Epochs: got 'inf'; expected a number",
                    "1e400": "Epochs: got '1e400'; expected a number",
                    "nan": "Epochs: got 'nan'; expected a number",
                    "1e308": "Epochs: got 1e+308; must be at most 1000000",
                    "0": "Epochs: got 0.0; must be more than 0"}


def test_a_price_below_zero_or_not_a_number_is_refused_on_the_hardware_step(private_home):
    """A price of -5 was planned with a cost of -0.17, ``nan`` with a cost of "–", where ``plan
    --price-per-gpu-hour`` refuses both: the hardware step now says so, in the command's words, and stays
    (a CPU-only box, the bundled sample)."""
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_hardware_step(pilot, app)
            said = {}
            for text in ("-5", "nan"):
                w.query_one("#price-input").value = text
                await pilot.press("enter")
                await wait_for(pilot, lambda: "Price" in str(w.query_one("#hardware-info").render()))
                said[text] = " ".join(str(w.query_one("#hardware-info").render()).split())
                w.query_one("#hardware-info").update("")
                assert w.step == 3 and w.recommendation is None, text
            w.query_one("#price-input").value = "2.5"
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 4)
            return said, w.request.hardware.price_per_gpu_hour

    said, price = run(scenario())
    # a CPU box: the price is the box's per hour (its field says so), not a GPU-hour's
    assert said == {"-5": "Price per hour of the box: got -5.0; must be at least 0",
                    "nan": "Price per hour of the box: got 'nan'; expected a number"}
    assert price == 2.5


def test_a_plan_without_data_sends_save_and_launch_back_to_the_data_step(private_home):
    """A plan made without data ("empty: plan without data statistics") could be neither saved nor launched,
    and said so only as "<plan>: dataset: is required". s and l now say they need a dataset and go back to
    the data step; nothing is written (a CPU-only box)."""
    from tui.screens.wizard import STEPS

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            w.query_one("#dataset-input").value = ""
            await pilot.press("enter")  # dataset: none
            await wait_for(pilot, lambda: w.step == 2)
            await pilot.press("enter")  # goal: fastest
            await wait_for(pilot, lambda: w.step == 3)
            await pilot.press("enter")  # hardware: this box
            await wait_for(pilot, lambda: w.step == 4)
            assert w.recommendation.feasible and w.request.dataset is None
            seen = []
            for key in ("s", "l"):
                await pilot.press(key)
                await wait_for(pilot, lambda: STEPS[w.step] == "dataset")
                seen.append([n.message for n in app._notifications])
                app.clear_notifications()
                for _ in range(3):  # back to the plan for the next key
                    await pilot.press("enter")
                await wait_for(pilot, lambda: w.step == 4)
            return seen, w.saved_path, w.busy

    seen, saved, busy = run(scenario())
    said = "Saving or launching needs a dataset: give one on the data step, then Enter."
    assert seen == [[said], [said]]
    assert saved is None and not busy
    assert not (private_home / "plans").exists()


def test_the_data_step_reads_a_folder_and_plans_a_hub_id_without_statistics(private_home, tmp_path):
    """The step's hint says "a file or folder", then refused a folder ("this is a folder; give one data
    file"), and a hub id got "file not found … (or a hub dataset id owner/name)". A folder is now read as train
    reads it, all its files counted; a hub id is said to be planned without statistics (the step stays for
    the note to be read, Enter goes on) and the saved plan names it (a CPU-only box)."""
    import yaml

    from core.plan import summarise_dataset

    sample = summarise_dataset("core/data/samples/tiny_skills.jsonl")
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (folder / name).write_text(open("core/data/samples/tiny_skills.jsonl").read())

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            w.query_one("#dataset-input").value = str(folder)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            records = w.summary.records
            await pilot.press("pageup")
            await wait_for(pilot, lambda: w.step == 1)
            w.query_one("#dataset-input").value = "owner/name"
            await pilot.press("enter")
            await wait_for(pilot, lambda: "hub data" in str(w.query_one("#dataset-info").render()))
            note = " ".join(str(w.query_one("#dataset-info").render()).split())
            assert w.step == 1
            await pilot.press("enter")  # the note read: on
            await wait_for(pilot, lambda: w.step == 2)
            await pilot.press("enter")  # goal
            await wait_for(pilot, lambda: w.step == 3)
            await pilot.press("enter")  # hardware: this box
            await wait_for(pilot, lambda: w.step == 4)
            await pilot.press("s")
            await wait_for(pilot, lambda: w.saved_path is not None)
            return records, note, w.saved_path

    records, note, saved = run(scenario())
    assert records == 2 * sample.records
    assert note.startswith("owner/name: hub data, not downloaded here: the plan is made without data statistics")
    assert yaml.safe_load(saved.read_text())["dataset"] == "owner/name"


def test_a_folder_with_a_test_file_is_measured_without_it_and_the_step_says_so(private_home, tmp_path):
    """A dataset folder with train.jsonl beside test.jsonl: the wizard counted both files' records and tokens
    (so the plan's steps, time and cost) as training data. It now measures the train split, as the run reads
    it, and the dataset step names the file left out (a CPU-only box, the bundled sample's rows)."""
    sample = open("core/data/samples/tiny_skills.jsonl").read()
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_text(sample)
    (folder / "test.jsonl").write_text(sample)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_dataset_step(pilot, app)
            w.query_one("#dataset-input").value = str(folder)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 2, timeout=30)
            await pilot.press("pageup")
            await wait_for(pilot, lambda: w.step == 1)
            return w.summary.records, " ".join(str(w.query_one("#dataset-info").render()).split())

    records, info = run(scenario())
    assert records == len(sample.splitlines())
    assert "left out (named for another split; DIR:SPLIT reads them): test.jsonl" in info, info
