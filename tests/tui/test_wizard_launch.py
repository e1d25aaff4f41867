"""Launch from the wizard starts a real detached run and opens its dashboard; probe reads the cache."""

from __future__ import annotations

import asyncio
import json

from tests.tui.conftest import fake_monitor, quiet_settings, screen_text, wait_for
from tests.tui.test_wizard_flow import to_result
from tui.app import make_app


def test_launch_starts_the_run_and_opens_its_dashboard(private_home):
    from core.runs import list_runs
    from core.runs.control import request_stop, wait_for_end
    from core.runs.listing import resolve_run
    from tui.screens.dashboard import DashboardScreen

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_result(pilot, app)
            await pilot.press("l")
            # Mounted, not only pushed: leaving the app while the screen composes tears it down half-built.
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.is_mounted,
                           timeout=60)
            assert app.current_mode == "runs"
            assert w.saved_path is not None and w.saved_path.is_file()

    try:
        run_result = asyncio.run(scenario())
    finally:
        for summary in list_runs():
            run = resolve_run(summary.run_dir)
            request_stop(run, force=True)
            wait_for_end(run, timeout_s=30)
    runs = list_runs()
    assert len(runs) == 1 and runs[0].model == "tiny"
    assert run_result is None


def test_probe_uses_cached_measurements_and_shows_them(private_home):
    from core.plan.planner import plan_key
    from core.plan.probe import cache_key, cache_path

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_result(pilot, app)
            rec = w.recommendation
            top = [rec.best, *(c for c, _ in rec.alternatives)][:3]
            cache_path().parent.mkdir(parents=True, exist_ok=True)
            cache_path().write_text(json.dumps({
                cache_key(w.request, plan_key(c.plan)): {"tokens_per_s": 0.9 * c.tokens_per_s, "peak_gib": None,
                                                         "steps": 3}
                for c in top}))
            await pilot.press("p")
            await wait_for(pilot, lambda: not w.busy and not w.planning and "Probe done" in screen_text(app), timeout=30)
            best = w.recommendation.best
            assert best.measured is not None and not best.measured.get("scaled")
            text = " ".join(screen_text(app).split())
            # measured: not also "(not measured: CPU)", as the CPU box's speed line read after a probe
            assert f"Speed: {best.tokens_per_s:,.0f} tokens/s (measured by probe) ·" in text
            assert "not measured" not in text.split("Speed:")[1].split("·")[0]

    asyncio.run(scenario())


def test_probe_refuses_planned_hardware(private_home):
    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_result(pilot, app, keys_before_hardware=())
            await pilot.press("pageup")
            w.query_one("#hardware-input").value = "2xH200"
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 4)
            assert not w.request.hardware.detected
            await pilot.press("p")
            await pilot.pause()
            assert not w.busy
            assert any("this box" in n.message for n in app._notifications)

    asyncio.run(scenario())


def test_a_launch_whose_supervisor_exits_at_once_says_why_in_its_notification(private_home, monkeypatch):
    """The notification showed only the error's first line, "the run's supervisor exited at once; see
    <supervisor.log>:", and not why. It ends with the log's last line now (a reason the supervisor printed, or
    a traceback's error); the status line keeps the whole text. The supervisor here is a real process that
    writes its reason and exits 1, as the supervisor's refusals do."""
    import sys

    from core.runs import launch

    reason = "run.json cannot be read (it has no [gpus] list): no trainer was started"
    monkeypatch.setattr(launch, "supervisor_command", lambda run, resume_from=None: [
        sys.executable, "-c", f"import sys; print('starting'); print({reason!r}, file=sys.stderr); sys.exit(1)"])

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            w = await to_result(pilot, app)
            await pilot.press("l")
            await wait_for(pilot, lambda: not w.busy and any(
                n.severity == "error" for n in app._notifications), timeout=60)
            said = [n.message for n in app._notifications if n.severity == "error"]
            assert len(said) == 1 and said[0].startswith("the run's supervisor exited at once; see ") and \
                said[0].endswith("\n" + reason.replace("[", "\\[")), said
            assert "starting" in " ".join(screen_text(app).split())  # the whole log's tail on the status line

    asyncio.run(scenario())


def test_launching_on_the_gpus_of_a_live_run_asks_first(private_home, monkeypatch):
    """l, then w and l again, started a second run of the same plan on the same GPUs, which runs both out of
    memory. The launch is refused while a live run uses the plan's GPUs, and the wizard asks: n leaves it
    unstarted and says why, y starts it anyway (``allow_shared_gpus``). A box of one GPU as far as the run's
    start can tell (``visible_gpu_count`` made to say 1 on this CPU box; the wizard's box is the fake CPU
    recording); the live run is a run directory whose lock a child process holds."""
    import core.runs
    from core.runs import gpus as run_gpus
    from tests.core.test_runs_gpus_in_use import _end, _live_run
    from tui.widgets.confirm import ConfirmScreen

    monkeypatch.setattr(run_gpus, "visible_gpu_count", lambda nvml=None: 1)
    real_start = core.runs.start_run
    asked: list[bool] = []

    def start_run(path, allow_shared_gpus=False, warn=None, **_kwargs):
        asked.append(allow_shared_gpus)
        if allow_shared_gpus:  # as far as this test goes: nothing is trained on the fake GPU; what the start
            # warns of (the CLI's stderr) is notified, not lost on the app's stderr
            warn(f"warning: GPU 0 is in use by run {live.id} too (started anyway, as asked)")
            return live
        return real_start(path, allow_shared_gpus=allow_shared_gpus, warn=warn)

    monkeypatch.setattr(core.runs, "start_run", start_run)
    live, holder = _live_run([0])

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            await pilot.press("l")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=60)
            text = " ".join(screen_text(app).split())
            assert f"Run {live.id} (running) is training on GPU 0" in text
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen is w)
            assert f"Not started: GPU 0 is in use by run {live.id}" in " ".join(screen_text(app).split())
            assert asked == [False] and not w.busy
            await pilot.press("l")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=60)
            await pilot.press("y")
            await wait_for(pilot, lambda: any("(started anyway, as asked)" in str(n.message)
                                              for n in app._notifications), timeout=60)
            assert asked == [False, False, True]

    try:
        asyncio.run(scenario())
    finally:
        _end(holder)
    from core.runs.listing import iter_run_dirs

    assert [r.id for r in iter_run_dirs()] == [live.id]  # the refused launches created no run


def test_a_launch_past_the_gpus_free_memory_asks_with_the_refusal_and_starts_it_only_on_y(private_home, monkeypatch):
    """start_run refuses a run whose estimated peak is past its GPUs' free memory (another process holds the
    card since the plan was made): the wizard showed a bare error. It asks now, the refusal's figures and way out
    in the question, as it asks about shared GPUs: n leaves it unstarted with the refusal on the status line,
    y starts it with allow_over_memory. At 80x24; core's start stood in for (the refusal is core's
    ``GpuMemoryShort`` with its text; y returns a queued run directory), the box the fake CPU recording."""
    import core.runs
    from core.runs import GpuMemoryShort
    from core.runs.launch import create_run
    from tests.core.test_runs_unit import _Config
    from tui.screens.dashboard import DashboardScreen
    from tui.widgets.confirm import ConfirmScreen

    refusal = ("This run needs about 86.5 GiB per GPU by the estimate, and GPU 0 (NVIDIA H100 80GB HBM3) has 9.6 GiB "
               "free (79.6 GiB, 70.0 GiB of it in use by other processes): it would load the model, then run out of "
               "GPU memory. Not even micro_batch_size=1 fits at this config. To start it anyway: --allow-over-memory")
    asked: list[tuple[bool, bool]] = []

    def start_run(path, allow_shared_gpus=False, allow_over_memory=False, warn=None, **_kwargs):
        asked.append((allow_shared_gpus, allow_over_memory))
        if not allow_over_memory:
            raise GpuMemoryShort(refusal, None)
        warn("warning: starting anyway (--allow-over-memory): as asked")
        return create_run(_Config(name="over", model="tiny"), ["tunedeck", "train", path], gpus=[0])

    monkeypatch.setattr(core.runs, "start_run", start_run)

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            await pilot.press("l")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=60)
            text = " ".join(screen_text(app).split())
            assert "has 9.6 GiB free" in text and "y starts it anyway" in text, text
            await pilot.press("n")
            await wait_for(pilot, lambda: app.screen is w)
            assert any("does not fit the GPUs' free memory" in str(n.message) for n in app._notifications)
            assert "70.0 GiB of it in use" in " ".join(screen_text(app).split()) and not w.busy
            await pilot.press("l")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), timeout=60)
            await pilot.press("y")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.is_mounted,
                           timeout=60)
            assert any("starting anyway" in str(n.message) for n in app._notifications)

    asyncio.run(scenario())
    assert asked == [(False, False), (False, False), (False, True)]


def test_a_launch_refused_for_its_model_says_the_problem_and_its_remedy_at_80x24(private_home, monkeypatch):
    """Qwen2.5-7B planned on one H200 with no network and the model not downloaded: l was refused with "The run
    configuration has a problem:", the plan file's path and the model's problem, and the status line's three lines
    at 80x24 ended before the remedy ("download it … or give its local folder"); the notification said only the
    heading. The status line says the problem's own words first, remedy included, and the notification has the
    whole message (file and line too). Fake GPUs (the two-H200 recording), no network (the hub reported out of
    reach, under its real name)."""
    from core.data import loading

    monkeypatch.setattr(loading, "network_reachable", lambda hub, **_: False)
    monkeypatch.setattr(loading, "hub_address", lambda hub: ("www.modelscope.cn", 443))
    model = "Qwen/Qwen2.5-7B-Instruct"

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("h200x2"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("w")
            await wait_for(pilot, lambda: app.current_mode == "wizard")
            w = app.screen
            await wait_for(pilot, lambda: w.snapshot is not None)
            w.query_one("#model-input").value = model
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 1)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 2, timeout=60)
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 3)
            w.query_one("#hardware-input").value = "1xH200"
            await pilot.press("enter")
            await wait_for(pilot, lambda: w.step == 4, timeout=60)
            await pilot.press("l")
            await wait_for(pilot, lambda: not w.busy and any(n.severity == "error" for n in app._notifications),
                           timeout=60)
            await pilot.pause()
            text = " ".join(screen_text(app).split())
            assert (f"Not started: model '{model}' is not in the local hub cache and www.modelscope.cn cannot be "
                    f"reached (no network?): download it where there is a network (tunedeck models download "
                    f"{model}) or give its local folder") in text
            said = [n.message for n in app._notifications if n.severity == "error"]
            assert len(said) == 1 and said[0].startswith("The run configuration has a problem:")
            assert f"{w.saved_path}:2: model:" in said[0] and said[0].endswith("or give its local folder")

    asyncio.run(scenario())


def test_a_launch_on_a_read_only_data_root_says_which_folder_and_what_to_do(private_home):
    """l on a data root that turned read-only: the wizard's plan file could not be written and the notification
    read "[Errno 30] Read-only file system: '…/plans'", the status line nothing. Both say it now as the CLI does:
    the folder, the error, what to do. A real read-only tmpfs (root mounts it; skipped where it cannot);
    no GPU (the fake recording of none)."""
    from tests.fixtures.disk import remount, tmpfs

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            remount(private_home, "ro")
            await pilot.press("l")
            await wait_for(pilot, lambda: any(n.severity == "error" for n in app._notifications))
            await pilot.pause()
            said = [n.message for n in app._notifications if n.severity == "error"]
            expected = (f"cannot write {private_home / 'plans'}: Read-only file system; free space there "
                        f"(or make it writable) and try again")
            assert said == [expected], said
            assert expected in " ".join(screen_text(app).split())
            assert w.saved_path is None and not w.busy

    with tmpfs(private_home, size="50m"):
        asyncio.run(scenario())


def test_a_launch_into_a_read_only_plans_folder_names_the_plan_file_not_a_temporary_one(private_home):
    """The same with the plans folder there already (any plan saved before): the error came from the atomic
    write's temporary file (or the mode probe beside it), and the wizard said "cannot write
    …/plans/.Qwen2.5-0.5B-Instruct.yaml.k2x9.tmp", a file the user never heard of (the settings save said its
    temporary name alike, fixed in 23677e9). It names the plan file now. A real read-only tmpfs (root mounts
    it; skipped where it cannot); no GPU (the fake recording of none)."""
    from core.plan.run_config import default_config_path
    from tests.fixtures.disk import remount, tmpfs

    async def scenario():
        app = make_app(quiet_settings(), monitor=fake_monitor("none"), persist_settings=False)
        async with app.run_test(size=(80, 24)) as pilot:
            w = await to_result(pilot, app)
            plan = default_config_path(w.request)
            plan.parent.mkdir(parents=True, exist_ok=True)
            remount(private_home, "ro")
            await pilot.press("l")
            await wait_for(pilot, lambda: any(n.severity == "error" for n in app._notifications))
            said = [n.message for n in app._notifications if n.severity == "error"]
            assert said == [f"cannot write {plan}: Read-only file system; free space there "
                            f"(or make it writable) and try again"], said
            assert w.saved_path is None and not w.busy

    with tmpfs(private_home, size="50m"):
        asyncio.run(scenario())
