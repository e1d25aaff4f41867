"""Atomic checkpoints: written into ``checkpoint-N.tmp/``, fsync'ed, renamed to ``checkpoint-N/``, and
only then marked with a ``COMPLETE`` file. A checkpoint without the marker is never resumed from."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from core.atomic_file import fsync_dir, fsync_tree

COMPLETE_MARKER = "COMPLETE"
TMP_SUFFIX = ".tmp"
_NAME = re.compile(r"^checkpoint-(\d+)(\.tmp)?$")


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


def finalize_checkpoint(tmp_dir: Path, step: int, info: dict | None = None) -> Path:
    """fsync everything in ``tmp_dir``, rename it to ``checkpoint-N`` and write the COMPLETE marker last."""
    final = final_path_for(tmp_dir.parent, step)
    fsync_tree(tmp_dir)
    if final.exists():  # a stale marker-less leftover from an earlier attempt at the same step
        shutil.rmtree(final)
    os.rename(tmp_dir, final)
    fsync_dir(final.parent)
    marker = final / COMPLETE_MARKER
    payload = json.dumps({"step": step, "time": time.time(), **(info or {})}, indent=2) + "\n"
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, payload.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(final)
    return final


def rotate_checkpoints(directory: Path, keep: int | None) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints; remove older ones and stale incomplete ones.

    Incomplete directories newer than the newest complete checkpoint are left alone (one may be being
    written right now by another rank); older incomplete ones are leftovers of a crash.
    """
    found = list_checkpoints(directory)
    complete = [c for c in found if c.complete]
    removed: list[Path] = []
    newest_complete = complete[-1].step if complete else -1
    doomed = [c for c in found if not c.complete and c.step < newest_complete]
    if keep is not None and keep > 0 and len(complete) > keep:
        doomed += complete[: len(complete) - keep]
    for ckpt in doomed:
        # Remove the marker first so that a half-deleted directory never looks complete.
        try:
            (ckpt.path / COMPLETE_MARKER).unlink()
        except FileNotFoundError:
            pass
        shutil.rmtree(ckpt.path, ignore_errors=True)
        removed.append(ckpt.path)
    return removed
