"""Atomic checkpoints: written into ``checkpoint-N.tmp/``, fsync'ed, renamed to ``checkpoint-N/``, and
only then marked with a ``COMPLETE`` file. A checkpoint without the marker is never resumed from.

The marker is JSON and lists every file it vouches for with its size (``"files": {"model.safetensors":
123, ...}``). Resume does not trust it blindly: ``verify_checkpoint`` checks the sizes, that
``trainer_state.json`` parses and that every safetensors header parses and covers the file exactly (cheap:
stat calls and a few kilobytes read, never a hash of tens of GB). Markers of older versions (plain text,
or JSON without ``files``) are read as legacy: only the structural checks apply.

Pins: a checkpoint being read (a merge, export, chat, serve or evaluate loading it: ``pin_checkpoint``)
holds a pin file ``checkpoints/.pins/checkpoint-N.<pid>.<n>``, and rotation (``save_total_limit``) passes
a pinned checkpoint over, removing it at a later save once the pin is gone. Pins are made and rotation
removes under one lock (flock on the checkpoints folder), so a checkpoint is never removed between a
reader's pin and its look that the checkpoint is still there. A pin whose process is gone (same host) or
older than ``PIN_MAX_AGE_S`` is stale: ignored and removed by the next rotation."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from core.atomic_file import fsync_dir, fsync_tree
from core.i18n import Message

COMPLETE_MARKER = "COMPLETE"
MARKER_FORMAT = 2  # 2: the marker lists its files and sizes; older markers are "legacy"
TMP_SUFFIX = ".tmp"
_NAME = re.compile(r"^checkpoint-(\d+)(\.tmp)?$")
PINS_DIR = ".pins"
# A pin older than this is stale even when its process cannot be seen (another host of a shared
# filesystem): no read of a checkpoint takes a day, and a stale pin must not keep a checkpoint forever.
PIN_MAX_AGE_S = 24 * 3600
_PIN_SERIAL = itertools.count()


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    complete: bool


def list_checkpoints(directory: Path) -> list[Checkpoint]:
    """Every ``checkpoint-N[.tmp]`` under ``directory``, sorted by step (tmp ones are incomplete)."""
    found: list[Checkpoint] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        match = _NAME.match(entry.name)
        if not match or not entry.is_dir():
            continue
        complete = match.group(2) is None and (Path(entry.path) / COMPLETE_MARKER).is_file()
        found.append(Checkpoint(int(match.group(1)), Path(entry.path), complete))
    found.sort(key=lambda c: (c.step, c.complete))
    return found


def tmp_path_for(directory: Path, step: int) -> Path:
    return directory / f"checkpoint-{step}{TMP_SUFFIX}"


def final_path_for(directory: Path, step: int) -> Path:
    return directory / f"checkpoint-{step}"


def checkpoint_files(directory: Path) -> dict[str, int]:
    """Every file under ``directory`` (relative path → size in bytes), the marker itself left out."""
    files: dict[str, int] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.name != COMPLETE_MARKER:
            files[path.relative_to(directory).as_posix()] = path.stat().st_size
    return files


def finalize_checkpoint(tmp_dir: Path, step: int, info: dict | None = None,
                        on_remove: Callable[[Path, str], None] | None = None) -> Path:
    """fsync everything in ``tmp_dir``, rename it to ``checkpoint-N`` and write the COMPLETE marker last.

    The marker lists the files and sizes it vouches for. An old ``checkpoint-N`` in the way (a leftover
    of an earlier attempt at the same step) is removed, and ``on_remove(path, "replaced")`` told first.
    """
    final = final_path_for(tmp_dir.parent, step)
    fsync_tree(tmp_dir)
    files = checkpoint_files(tmp_dir)
    if final.exists():  # a leftover from an earlier attempt at the same step
        if on_remove is not None:
            on_remove(final, "replaced")
        shutil.rmtree(final)
    os.rename(tmp_dir, final)
    fsync_dir(final.parent)
    marker = final / COMPLETE_MARKER
    payload = json.dumps({"step": step, "time": time.time(), "format": MARKER_FORMAT, "files": files,
                          **(info or {})}, indent=2) + "\n"
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, payload.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(final)
    return final


@contextmanager
def _checkpoints_lock(directory: Path) -> Iterator[None]:
    """flock on the checkpoints folder itself: pins are made, and rotation removes, one at a time. Where
    the folder cannot be locked (gone, a filesystem without flock) it goes on unlocked: the pin is a help
    against rotation, never a reason for a read or a save to fail."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _pin_is_stale(pin: Path) -> bool:
    try:
        record = json.loads(pin.read_text(encoding="utf-8"))
        pid, host, made = int(record["pid"]), str(record["host"]), float(record["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return True  # pins are written whole under the lock: one that does not parse is no one's
    if time.time() - made > PIN_MAX_AGE_S:
        return True
    return host == socket.gethostname() and not _pid_alive(pid)


def pinned_steps(directory: Path) -> set[int]:
    """The steps of the checkpoints under ``directory`` a live reader has pinned; stale pins are removed.
    Called under ``_checkpoints_lock``."""
    pins = directory / PINS_DIR
    steps: set[int] = set()
    try:
        entries = list(pins.iterdir())
    except OSError:
        return steps
    for pin in entries:
        match = re.match(r"^checkpoint-(\d+)\.", pin.name)
        if match is None:
            continue
        if _pin_is_stale(pin):
            try:
                pin.unlink()
            except OSError:
                pass
            continue
        steps.add(int(match.group(1)))
    return steps


@contextmanager
def pin_checkpoint(checkpoint: Path) -> Iterator[bool]:
    """Keep rotation (``rotate_checkpoints``) from removing ``checkpoint`` while the caller reads it; yields
    whether the checkpoint folder is still there, looked at once the pin is made (rotation removes under
    the same lock, so it is there whole or not at all): False means rotation removed it before the pin,
    and the caller says so. A folder that is no ``checkpoint-N`` of a run, or a run the caller cannot
    write to (another user's), is read unpinned."""
    match = _NAME.match(checkpoint.name)
    if match is None or match.group(2):
        yield checkpoint.is_dir()
        return
    directory = checkpoint.parent
    pins = directory / PINS_DIR
    pin: Path | None = pins / f"{checkpoint.name}.{os.getpid()}.{next(_PIN_SERIAL)}"
    with _checkpoints_lock(directory):
        try:
            pins.mkdir(exist_ok=True)
            pin.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}),
                           encoding="utf-8")
        except OSError:
            pin = None
        there = checkpoint.is_dir()
    try:
        yield there
    finally:
        if pin is not None:
            with _checkpoints_lock(directory):
                try:
                    pin.unlink()
                    pins.rmdir()  # the last pin gone: no folder left behind (another pin keeps it)
                except OSError:
                    pass


def rotate_checkpoints(directory: Path, keep: int | None,
                       on_remove: Callable[[Path, str], None] | None = None,
                       left_behind: dict[int, int] | None = None) -> list[Path]:
    """Keep the newest ``keep`` sound checkpoints; remove older ones and stale incomplete ones.

    Sound: complete, and its weights pass ``verify_checkpoint`` (what resume, merge and export check). A
    damaged checkpoint does not count toward ``keep``: with a limit, one older than the newest sound
    checkpoint is removed (superseded: nothing loads from it), a newer one is left alone. So rotation
    never removes a sound checkpoint and keeps a damaged one in its place. Incomplete directories newer
    than the newest complete checkpoint are left alone (one may be being written right now by another
    rank); older incomplete ones are leftovers of a crash. Before each removal ``on_remove(path, why)`` is
    told (why: ``"rotated"``, ``"left_behind"``, ``"damaged"`` or ``"incomplete"``), so that nothing
    disappears without a record.
    A checkpoint a reader has pinned (``pin_checkpoint``: a merge, chat … of it under way) is left for a
    later rotation: removed under it, the read failed as if the checkpoint were damaged.

    ``left_behind`` (``RunDirectory.left_behind``: step → the step a resume went back to) are checkpoints
    of a branch the run went away from: they count toward ``keep`` but go first (why ``"left_behind"``),
    oldest first, and no checkpoint of the current branch is rotated away while one of them stands (a
    pinned one included): the user would lose the checkpoint a resume needs and keep one it passes over.
    """
    found = list_checkpoints(directory)
    complete = [c for c in found if c.complete]
    removed: list[Path] = []
    newest_complete = complete[-1].step if complete else -1
    doomed = [c for c in found if not c.complete and c.step < newest_complete]
    why = {c.path: "incomplete" for c in doomed}
    if keep is not None and keep > 0:
        usable = {c.path: verify_checkpoint(c).weights_usable for c in complete}
        sound = [c for c in complete if usable[c.path]]
        newest_sound = sound[-1].step if sound else -1
        for c in complete:
            if not usable[c.path] and c.step < newest_sound:
                doomed.append(c)
                why[c.path] = "damaged"
        behind = [c for c in sound if c.step in (left_behind or {})]
        excess = max(0, len(sound) - keep)
        for c in behind[:excess]:
            doomed.append(c)
            why[c.path] = "left_behind"
        for c in [c for c in sound if c not in behind][: max(0, excess - len(behind))]:
            doomed.append(c)
            why[c.path] = "rotated"
    if not doomed:
        return removed
    first = {"incomplete": 0, "damaged": 0, "left_behind": 1, "rotated": 2}
    with _checkpoints_lock(directory):
        pinned = pinned_steps(directory)
        behind_stands = False
        for ckpt in sorted(doomed, key=lambda c: (first[why[c.path]], c.step)):
            if ckpt.complete and ckpt.step in pinned:
                behind_stands = behind_stands or why[ckpt.path] == "left_behind"
                continue  # being read right now: a later rotation removes it
            if why[ckpt.path] == "rotated" and behind_stands:
                continue  # never a checkpoint of the current branch while a left-behind one stands
            if on_remove is not None:
                on_remove(ckpt.path, why[ckpt.path])
            # Remove the marker first so that a half-deleted directory never looks complete.
            try:
                (ckpt.path / COMPLETE_MARKER).unlink()
            except FileNotFoundError:
                pass
            shutil.rmtree(ckpt.path, ignore_errors=True)
            removed.append(ckpt.path)
    return removed


# -- verification --------------------------------------------------------------------------------------
# Files whose loss costs the optimizer's and the schedule's state (and the RNG streams), not the weights:
# a checkpoint without them can still be resumed "weights only".
_STATE_FILES = re.compile(r"^(optimizer\.(pt|bin)|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth|"
                          r"global_step\d+/.*optim_states\.pt)$")
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the format's own limit


@dataclass(frozen=True)
class CheckpointProblem:
    """One thing wrong with a checkpoint: the file (relative to the checkpoint) and what is wrong."""

    file: str
    message: Message
    state_only: bool = False  # only optimizer / scheduler / RNG state is lost; the weights are fine


@dataclass
class CheckpointCheck:
    """What ``verify_checkpoint`` found. ``resumable``: everything there; ``weights_usable``: the model
    (and trainer_state.json) are sound, only optimizer / scheduler state is missing or damaged."""

    checkpoint: Checkpoint
    problems: list[CheckpointProblem] = field(default_factory=list)
    legacy: bool = False  # an old marker that lists no files: sizes could not be checked

    @property
    def resumable(self) -> bool:
        return not self.problems

    @property
    def weights_usable(self) -> bool:
        return all(p.state_only for p in self.problems)

    @property
    def first_problem(self) -> CheckpointProblem | None:
        damage = [p for p in self.problems if not p.state_only]
        return (damage or self.problems or [None])[0]


def read_marker(checkpoint: Path) -> dict | None:
    """The COMPLETE marker as a dict; ``{}`` for a legacy marker (plain text, or JSON without a file
    list); None when there is no marker."""
    try:
        text = (checkpoint / COMPLETE_MARKER).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) and isinstance(value.get("files"), dict) else {}


def written_at(checkpoint: Path) -> float | None:
    """When ``checkpoint`` was completed: its marker's ``time`` (the marker's mtime for a legacy one), None
    without a marker."""
    marker = read_marker(checkpoint)
    if marker is None:
        return None
    value = marker.get("time")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return (checkpoint / COMPLETE_MARKER).stat().st_mtime
    except OSError:
        return None


def left_behind_steps(checkpoints: list[Checkpoint], resumes: list[tuple[float, int, float | None]],
                      written: Callable[[Path], float | None] = written_at) -> dict[int, int]:
    """The checkpoints of a branch the run went back from: step → the step of the resume that left it.

    ``resumes``: each resume's (time, checkpoint step, when that checkpoint was written, or None when not
    known). The run's branches are followed back from the newest: the last resume's own branch (what was
    written after it), then the branch its checkpoint was written in, up to that checkpoint (the
    checkpoints written before the resume with a step past it are the abandoned branch: ``resume
    --checkpoint 921`` with checkpoint-1193 kept), and so on to the run's start. A resume that took a
    left-behind checkpoint explicitly (``--checkpoint 1193``) makes it, and what led to it, current again,
    and leaves the branch it went away from behind. Only checkpoints past the lowest resume's step are read
    (one small marker each); a checkpoint without a marker time is never left behind."""
    points = sorted(resumes)
    if not points:
        return {}
    floor = min(step for _ts, step, _from in points)
    times: dict[int, float] = {}
    for checkpoint in checkpoints:
        if checkpoint.step > floor:
            when = written(checkpoint.path)
            if when is not None:
                times[checkpoint.step] = when
    if not times:
        return {}
    current: set[int] = set()
    chain: list[tuple[float, int]] = []  # the resumes the current branch went through
    bound_time, bound_step = float("inf"), float("inf")
    index = len(points) - 1
    while True:
        start = points[index][0] if index >= 0 else float("-inf")
        current.update(step for step, when in times.items()
                       if start <= when <= bound_time and step <= bound_step)
        if index < 0:
            break
        ts, step, parent = points[index]
        chain.append((ts, step))
        bound_time = parent if parent is not None and parent < ts else ts  # unknown: the branch before it
        bound_step = step
        index = max((i for i in range(index) if points[i][0] <= bound_time), default=-1)
    chain.sort()
    return {step: next((back for ts, back in chain if ts > when), chain[-1][1])
            for step, when in times.items() if step not in current}


def safetensors_problem(path: Path) -> Message | None:
    """Why ``path`` is not a whole safetensors file (header unreadable, or data shorter or longer than
    the header says), or None. Reads the header only."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if length < 0 or length > min(size - 8, _MAX_SAFETENSORS_HEADER):
                return Message("checkpoints.safetensors_header", size=size)
            header = json.loads(handle.read(length))
    except OSError as exc:
        return Message("checkpoints.file_unreadable", error=str(exc))
    except ValueError:
        return Message("checkpoints.safetensors_header", size=size)
    if not isinstance(header, dict):
        return Message("checkpoints.safetensors_header", size=size)
    end = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(tensor["data_offsets"][1]))
        except (KeyError, IndexError, TypeError, ValueError):
            return Message("checkpoints.safetensors_header", size=size)
    expected = 8 + length + end
    if expected != size:
        return Message("checkpoints.file_size", size=size, expected=expected)
    return None


def _has(directory: Path, pattern: str) -> bool:
    return any(directory.glob(pattern))


def verify_checkpoint(checkpoint: Checkpoint | Path) -> CheckpointCheck:
    """Cheap checks that a complete checkpoint can really be resumed from (see the module docstring)."""
    if isinstance(checkpoint, Path):
        match = _NAME.match(checkpoint.name)
        checkpoint = Checkpoint(int(match.group(1)) if match else -1, checkpoint,
                                (checkpoint / COMPLETE_MARKER).is_file())
    path = checkpoint.path
    check = CheckpointCheck(checkpoint)
    marker = read_marker(path)
    if marker is None:
        check.problems.append(CheckpointProblem(COMPLETE_MARKER, Message("checkpoints.no_marker")))
        return check
    check.legacy = not marker

    def problem(file: str, message: Message) -> None:
        if not any(p.file == file for p in check.problems):
            check.problems.append(CheckpointProblem(file, message, bool(_STATE_FILES.match(file))))

    for name, expected in (marker.get("files") or {}).items():
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            problem(name, Message("checkpoints.file_missing"))
            continue
        except OSError as exc:
            problem(name, Message("checkpoints.file_unreadable", error=str(exc)))
            continue
        if isinstance(expected, int) and size != expected:
            problem(name, Message("checkpoints.file_size", size=size, expected=expected))
    for tensors in sorted(path.glob("*.safetensors")):
        found = safetensors_problem(tensors)
        if found is not None:
            problem(tensors.name, found)
    deepspeed = any(p.is_dir() for p in path.glob("global_step*"))
    weights = ("*.safetensors", "pytorch_model*.bin", "adapter_model.bin")
    if not deepspeed and not any(_has(path, pattern) for pattern in weights):
        problem("model.safetensors", Message("checkpoints.no_weights"))
    try:
        state = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        if not isinstance(state, dict) or "global_step" not in state:
            raise ValueError("not a trainer state")
    except FileNotFoundError:
        problem("trainer_state.json", Message("checkpoints.file_missing"))
    except (OSError, ValueError):
        problem("trainer_state.json", Message("checkpoints.json_invalid"))
    if deepspeed:
        if not _has(path, "global_step*/*optim_states.pt"):
            problem("optimizer.pt", Message("checkpoints.file_missing"))
    else:
        if not (path / "optimizer.pt").is_file() and not (path / "optimizer.bin").is_file():
            problem("optimizer.pt", Message("checkpoints.file_missing"))
        if not (path / "scheduler.pt").is_file():
            problem("scheduler.pt", Message("checkpoints.file_missing"))
    return check


def resume_candidates(directory: Path) -> list[CheckpointCheck]:
    """Every complete checkpoint under ``directory``, newest first, each verified."""
    return [verify_checkpoint(c) for c in reversed(list_checkpoints(directory)) if c.complete]
