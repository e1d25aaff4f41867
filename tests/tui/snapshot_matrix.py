"""The snapshot matrix of issue #18: every screen in each state that applies to it, at 80×24 in English
and Chinese, and every screen at 160×50 in English and Chinese.

Most cells are the snapshots of each screen's own tests (``COVERED``: the dashboard's, the GPU screen's,
the models', the runs', the wizard's, and the Chinese ones in ``i18n_zh_scenarios.py``). The cells none
of them draws are drawn here, one scenario per screen and state (``SCENARIOS``), in English by
``test_snapshot_matrix.py`` (``EN``) and in Chinese by ``i18n_zh_scenarios.py`` (``ZH``), under the same
names (``zh_`` in front). ``test_snapshot_matrix.py`` also checks that every cell of ``MATRIX`` has its
file. Runs are built on disk by ``run_builder``; the hub is the local stub server (``hub_env``) or the
closed port of ``conftest`` (offline): no scenario reaches the network.

The chat screen is drawn on a folder of the bundled tiny model with its random weights (a model folder,
as ``tunedeck chat --model-dir`` opens it), loaded in its worker process: a run's chat shows the run's id, which changes with every
training (``test_chat_screen.py`` drives that one without a snapshot).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from core.paths import runs_dir
from tests.fixtures.watch.run_builder import SupervisorStandIn, build_run
from tests.tui.conftest import (
    SNAPSHOTS,
    assert_snapshot,
    fake_monitor,
    quiet_settings,
    screen_text,
    wait_for,
    wait_screen_stable,
)

SWIFT_OUTPUT = Path(__file__).parents[1] / "fixtures" / "watch" / "swift_output"
TINY = Path(__file__).parents[2] / "core" / "assets" / "tiny"
SMALL, LARGE = (80, 24), (160, 50)

# screen -> the states that apply to it, each the stem of its snapshots (<stem>_80x24.svg, zh_<stem>_80x24.svg)
MATRIX: dict[str, dict[str, str]] = {
    "gpus": {"running": "gpus_h200x2", "fresh (no GPU)": "gpus_none"},
    "models": {"fresh": "models_details", "empty result": "models_empty", "offline hub": "models_offline"},
    "wizard": {"fresh": "wizard", "finished": "wizard_result"},
    "runs": {"fresh": "runs_empty", "running, finished, crashed": "runs_three"},
    "dashboard": {"fresh": "dashboard_fresh", "running": "dashboard_healthy", "finished": "dashboard_finished",
                  "failed": "dashboard_failed", "read-only source": "dashboard_readonly"},
    "help": {"fresh": "help_gpus"},
    "chat": {"ready": "chat_ready"},
}
# every screen at 160x50 in English: one stem per screen at least
LARGE_EN = {"gpus": "gpus_h200x2", "models": "models_details", "wizard": "wizard", "runs": "runs_three",
            "dashboard": "dashboard_healthy", "help": "help_gpus", "chat": "chat_ready"}

# every screen at 160x50 in Chinese (the dashboard's and the GPU screen's are drawn by i18n_zh_scenarios.py)
LARGE_ZH = {"gpus": "gpus_h200x2", "models": "models_details", "wizard": "wizard", "runs": "runs_empty",
            "dashboard": "dashboard_healthy", "help": "help_gpus", "chat": "chat_ready"}

# the cells drawn here (stem, size); the others are the screens' own tests' (COVERED)
EN = [("dashboard_fresh", SMALL), ("dashboard_fresh", LARGE), ("dashboard_readonly", SMALL),
      ("dashboard_readonly", LARGE), ("runs_empty", SMALL), ("wizard", SMALL), ("wizard", LARGE),
      ("help_gpus", SMALL), ("help_gpus", LARGE), ("models_details", LARGE), ("chat_ready", SMALL),
      ("chat_ready", LARGE)]
ZH = [("dashboard_fresh", SMALL), ("dashboard_readonly", SMALL), ("dashboard_finished", SMALL),
      ("runs_empty", SMALL), ("wizard_result", SMALL), ("runs_empty", LARGE), ("wizard", LARGE),
      ("help_gpus", LARGE), ("models_details", LARGE), ("chat_ready", SMALL), ("chat_ready", LARGE)]
COVERED = ("test_dashboard_render.py", "test_gpu_screen.py", "test_models_screen.py", "test_models_offline.py",
           "test_runs_screen.py", "test_wizard_snapshots.py", "i18n_zh_scenarios.py")
NEEDS_HUB = {"models_details"}  # scenarios that search the local hub stub (the hub_env fixture)


def snapshot_name(stem: str, size: tuple[int, int], language: str) -> str:
    return f"{'zh_' if language == 'zh' else ''}{stem}_{size[0]}x{size[1]}"


def missing_cells() -> list[str]:
    """The files of the matrix that do not exist (an empty list: the matrix is complete)."""
    wanted = [snapshot_name(stem, SMALL, language) for states in MATRIX.values() for stem in states.values()
              for language in ("en", "zh")]
    wanted += [snapshot_name(stem, LARGE, "en") for stem in LARGE_EN.values()]
    wanted += [snapshot_name(stem, LARGE, "zh") for stem in LARGE_ZH.values()]
    return [name for name in wanted if not (SNAPSHOTS / f"{name}.svg").exists()]


def _app(monitor: str = "h200x2", **options):
    from tui.app import make_app

    return make_app(quiet_settings(), monitor=fake_monitor(monitor), persist_settings=False, **options)


async def _settled_dashboard(pilot, app, status: str, with_steps: bool) -> None:
    from tui.screens.dashboard import DashboardScreen, EventsTable
    from tui.widgets.log_pane import LogPane

    await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
    screen = app.screen
    await wait_for(pilot, lambda: screen.status == status and screen.backfilled
                   and (screen.series.train_records > 0) == with_steps)
    if not screen.source.read_only:  # the run's GPUs: their first reading drawn
        await wait_for(pilot, lambda: screen.gpu_version > 0)
    await wait_for(pilot, lambda: screen.query_one("#dash-events", EventsTable).at_newest)  # the newest in view
    await wait_for(pilot, lambda: screen.query_one("#dash-log", LogPane).at_newest)  # (the tick puts it right)
    screen._redraw()
    app.clear_notifications()
    await wait_screen_stable(pilot, app)


async def dashboard_fresh(size, name) -> None:
    """A run that has just started: running, its metrics header written, no step logged yet."""
    path = build_run(runs_dir(), "20261129-2100-fresh", status="running", steps=0, log_lines=0)
    with SupervisorStandIn(path):
        app = _app(open_run=str(path))
        async with app.run_test(size=size) as pilot:
            await _settled_dashboard(pilot, app, "running", with_steps=False)
            assert "Qwen/Qwen2.5-7B-Instruct" in screen_text(app)
            await assert_snapshot(pilot, app, name)


async def dashboard_finished(size, name) -> None:
    from tests.tui.test_dashboard_render import add_checkpoint

    path = build_run(runs_dir(), "20261129-2100-finished", status="finished", steps=600)
    add_checkpoint(path, 600)  # a finished run ends with one: its footer offers merge, chat, serve …
    app = _app(open_run=str(path))
    async with app.run_test(size=size) as pilot:
        await _settled_dashboard(pilot, app, "finished", with_steps=True)
        assert "600/600" in screen_text(app)
        await assert_snapshot(pilot, app, name)


async def dashboard_readonly(size, name) -> None:
    """Another trainer's output (ms-swift), watched read-only; finished, on a box without GPUs."""
    app = _app("none", open_run=str(SWIFT_OUTPUT))
    async with app.run_test(size=size) as pilot:
        await _settled_dashboard(pilot, app, "finished", with_steps=True)
        assert "ms-swift" in screen_text(app)
        await assert_snapshot(pilot, app, name)


async def runs_empty(size, name) -> None:
    from tests.tui.test_runs_screen import open_runs

    app = _app()
    async with app.run_test(size=size) as pilot:
        await open_runs(pilot, app)
        await assert_snapshot(pilot, app, name)


async def wizard(size, name) -> None:
    """The wizard as it opens: its first step (the model)."""
    from tests.tui.test_wizard_flow import wizard as wizard_screen

    app = _app()
    async with app.run_test(size=size) as pilot:
        await pilot.press("w")
        await wait_for(pilot, lambda: app.current_mode == "wizard" and wizard_screen(app).step == 0)
        await assert_snapshot(pilot, app, name)


async def wizard_result(size, name) -> None:
    from tests.tui.test_wizard_flow import to_result

    app = _app("none")
    async with app.run_test(size=size) as pilot:
        await to_result(pilot, app)
        await assert_snapshot(pilot, app, name)


async def help_gpus(size, name) -> None:
    from tests.tui.test_gpu_screen import open_gpus
    from tui.screens.help import HelpScreen

    app = _app("h200x1")
    async with app.run_test(size=size) as pilot:
        await open_gpus(pilot, app)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await assert_snapshot(pilot, app, name)


async def models_details(size, name) -> None:
    """The search the screen opens with (the local hub stub), the third result's details."""
    from tests.tui.test_models_screen import open_models

    app = _app("h200x1")
    async with app.run_test(size=size) as pilot:
        screen = await open_models(pilot, app)
        await pilot.press("down", "down", "enter")
        await wait_for(pilot, lambda: screen.details is not None)
        await assert_snapshot(pilot, app, name)


async def chat_ready(size, name) -> None:
    """The chat on a folder of the bundled tiny model with weights, once its worker process has loaded it."""
    import shutil

    import torch

    from core.train.model_setup import materialize_random_weights
    from tui.screens.chat import ChatScreen

    model_dir = runs_dir().parent / "models" / "tiny"  # a fixed name: the screen shows the folder's
    if not model_dir.exists():
        shutil.copytree(materialize_random_weights(TINY, 1, torch.float32), model_dir)
    app = _app("none")
    async with app.run_test(size=size) as pilot:
        screen = ChatScreen(model_dir=model_dir)
        app.push_screen(screen)
        await wait_for(pilot, lambda: screen.ready, timeout=120)
        await wait_screen_stable(pilot, app)
        assert "tiny" in screen_text(app)
        await assert_snapshot(pilot, app, name)


SCENARIOS: dict[str, Callable[[tuple[int, int], str], Awaitable[None]]] = {
    "dashboard_fresh": dashboard_fresh, "dashboard_finished": dashboard_finished,
    "dashboard_readonly": dashboard_readonly, "runs_empty": runs_empty, "wizard": wizard,
    "wizard_result": wizard_result, "help_gpus": help_gpus, "models_details": models_details,
    "chat_ready": chat_ready,
}


def draw(stem: str, size: tuple[int, int], language: str, request) -> None:
    """Draw one cell (``request``: the test's, for the hub stub where the scenario needs it)."""
    import asyncio

    if stem in NEEDS_HUB:
        request.getfixturevalue("hub_env")
    asyncio.run(SCENARIOS[stem](size, snapshot_name(stem, size, language)))
