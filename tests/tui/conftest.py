"""Pilot helpers: the app built through ``make_app`` with fake GPUs replayed from recordings."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from core.hardware.fake_nvml import fake_monitor_from_recording
from core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
GPU_FIXTURES = ROOT / "tests" / "fixtures" / "gpus"
SNAPSHOTS = Path(__file__).parent / "snapshots"


class StepClock:
    """A monotonic clock the test moves by hand, so fake readings and the poll floor are exact."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fake_monitor(recording: str, clock: StepClock | None = None, **options):
    return fake_monitor_from_recording(GPU_FIXTURES / f"{recording}.json", clock=clock or StepClock(), **options)


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNEDECK_FAKE_GPUS", raising=False)
    # Screens that reach a hub (the model browser searches on open) stay on this machine: a closed
    # port answers at once, and caches live in the test's own directory.
    closed = "http://127.0.0.1:9"
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed)
    monkeypatch.setenv("HF_ENDPOINT", closed)
    for var, sub in (("MODELSCOPE_CACHE", "ms-cache"), ("MODELSCOPE_HOME", "ms-home"), ("HF_HOME", "hf-home")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    return tmp_path / "home"


def quiet_settings(**values) -> Settings:
    """Settings for tests: a long poll interval, so only the polls a test makes itself happen."""
    values.setdefault("gpu_poll_interval_s", 3600.0)
    return Settings(**values)


async def wait_for(pilot, predicate, timeout: float = 30.0) -> None:
    """Let the app run until ``predicate()`` holds (workers post messages asynchronously).

    The timeout is a ceiling for a state that must come, not a speed: generous, so that a loaded 2-core
    box (CI, other tests' trainers beside it) passes too; a passing wait returns as soon as it holds."""
    from textual.css.query import NoMatches

    def holds() -> bool:
        try:
            return bool(predicate())
        except NoMatches:  # a screen pushed but not composed yet (a loaded box): a state still to come
            return False

    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not holds():
        if loop.time() > end:
            raise AssertionError(f"condition not reached within {timeout:.1f}s")
        await pilot.pause(0.02)


async def _still(pilot, frame, quiet_frames: int, timeout: float, what: str) -> str:
    """``frame()`` once it has returned the same for ``quiet_frames`` pauses in a row."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    last, same = None, 0
    while same < quiet_frames:
        if loop.time() > end:
            raise AssertionError(f"{what} kept changing for {timeout:.1f}s")
        await pilot.pause(0.05)
        current = frame()
        same = same + 1 if current == last else 0
        last = current
    return last


async def wait_screen_stable(pilot, app, quiet_frames: int = 3, timeout: float = 15.0) -> None:
    """Let pending layout, scrolling and late messages land: the screen unchanged for a few pauses."""
    await _still(pilot, lambda: screen_text(app), quiet_frames, timeout, "screen")


async def palette_search(pilot, app, query: str, title: str) -> None:
    """Open the command palette, type ``query`` and wait until the command ``title`` is highlighted.

    The palette searches in a worker: an Enter pressed before its results are in does nothing."""
    from textual.command import CommandList, CommandPalette

    await pilot.press("ctrl+p")
    await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
    await pilot.press(*query)

    def highlighted() -> bool:
        if not isinstance(app.screen, CommandPalette):
            return False
        commands = app.screen.query_one(CommandList)
        index = commands.highlighted
        return index is not None and title in str(commands.get_option_at_index(index).prompt)

    await wait_for(pilot, highlighted)


def screen_text(app) -> str:
    """The visible characters of the current screen, row by row."""
    strips = app.screen._compositor.render_strips()
    return "\n".join(strip.text.rstrip() for strip in strips)


async def assert_snapshot(pilot, app, name: str, quiet_frames: int = 3, timeout: float = 30.0) -> None:
    """Compare the screen's SVG with ``tests/tui/snapshots/<name>.svg`` once the screen holds still.

    A loaded box lands layout passes, scrollbars and late messages over several frames, so the rendering
    is taken when it is the same for ``quiet_frames`` pauses in a row (colours and styles included, not
    only the text); text cursors stop blinking first, drawn, so that a frame never catches one half-way.
    ``TUNEDECK_UPDATE_SNAPSHOTS=1`` rewrites the file after an intended change of the look; a mismatch
    leaves the new rendering beside the old one as ``<name>.new.svg`` for a look in a browser.
    """
    from textual.widgets import Input, TextArea

    for field in [*app.screen.query(Input), *app.screen.query(TextArea)]:
        field.cursor_blink = False
    svg = await _still(pilot, lambda: app.export_screenshot(title=name), quiet_frames, timeout,
                       f"snapshot {name}: the screen")
    path = SNAPSHOTS / f"{name}.svg"
    new = SNAPSHOTS / f"{name}.new.svg"
    if os.environ.get("TUNEDECK_UPDATE_SNAPSHOTS") == "1" or not path.exists():
        if not path.exists() and os.environ.get("CI"):
            raise AssertionError(f"snapshot {path} is missing; create it with TUNEDECK_UPDATE_SNAPSHOTS=1")
        path.write_text(svg, encoding="utf-8")
        new.unlink(missing_ok=True)
        return
    if path.read_text(encoding="utf-8") != svg:
        new.write_text(svg, encoding="utf-8")
        raise AssertionError(f"screen differs from snapshot {path}; see {new}")
    new.unlink(missing_ok=True)


def post_burst(app, text: str) -> None:
    """``text``'s keys posted to the app at once, as one terminal read delivers them (a paste, tmux send-keys,
    a slow SSH link): none waits for what the one before it does."""
    from textual import events

    for key in text:
        app.post_message(events.Key(key, key))
