"""The ``output`` key: a folder that receives the trained model when the run finishes.

``tunedeck train`` makes the path absolute (from the current directory), refuses a folder that holds
files already (a finished model is never overwritten) and creates it empty, so that a path that cannot
be written is refused before hours of training. When the run finishes, the trainer copies the result of
its last checkpoint into it: the adapter (LoRA methods) or the model weights (full fine-tune), their
configs and the tokenizer with its chat template, plus ``tunedeck_output.json`` (run, step, base model,
method, precision). Optimizer, scheduler and RNG state stay in the run directory with the checkpoints,
which resume and ``merge``/``serve`` go on using.

The copy is made in a hidden sibling folder and renamed into place, so the folder is either empty or
complete. A failure (a full disk) does not fail the run: its weights are in the run directory; the
failure is an event and a log line that say what to do.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import Message

OUTPUT_INFO = "tunedeck_output.json"
# What a checkpoint holds besides the trained model: resumable state and bookkeeping, not copied.
NOT_COPIED = frozenset({"optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "training_args.bin",
                        "tunedeck_state.json", "COMPLETE", "zero_to_fp32.py", "latest"})
NOT_COPIED_PREFIXES = ("rng_state", "global_step")


class OutputError(TunedeckError, ValueError):
    """The ``output`` folder cannot be used; the message names it and says what to do (``problem``: the
    same as a ``Message``)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: Message) -> None:
        super().__init__(message.text())
        self.problem = message


def resolve_output(value: str, base: Path | None = None) -> Path:
    """``output`` as an absolute path (a relative one is taken from ``base``, default the current dir)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base or Path.cwd()) / path


def output_problem(path: Path) -> Message | None:
    """Why ``path`` cannot take a run's finished model (a file, unreadable, not empty: a finished model is
    never overwritten), or None. Reads only: ``train --check`` asks it too."""
    if path.exists() and not path.is_dir():
        return Message("output.not_a_folder", path=str(path))
    if path.is_dir():
        try:
            entries = sorted(p.name for p in path.iterdir())
        except OSError as exc:
            return Message("output.unusable", path=str(path), reason=str(exc))
        if entries:
            return Message("output.not_empty", path=str(path), count=len(entries), first=", ".join(entries[:3]))
    return None


def prepare_output(path: Path) -> Path:
    """Check ``path`` before a run starts and create it (empty); raises ``OutputError``."""
    problem = output_problem(path)
    if problem is not None:
        raise OutputError(problem)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".tunedeck-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputError(Message("output.unusable", path=str(path), reason=exc.strerror or str(exc))) from None
    return path


def model_files(checkpoint: Path) -> list[Path]:
    """The files of a checkpoint that make up the trained model (weights, configs, tokenizer)."""
    return sorted(p for p in checkpoint.iterdir()
                  if p.is_file() and p.name not in NOT_COPIED and not p.name.startswith(NOT_COPIED_PREFIXES))


def publish_output(path: Path, checkpoint: Path, info: dict[str, Any]) -> int:
    """Copy the model of ``checkpoint`` into ``path`` (empty or absent), all at once; returns the bytes.

    Raises ``OutputError`` when ``path`` holds files by now, ``OSError`` when the copy fails (nothing is
    left behind then)."""
    from core.atomic_file import fsync_tree

    if path.is_dir() and any(path.iterdir()):
        raise OutputError(Message("output.not_empty_at_end", path=str(path), checkpoint=str(checkpoint)))
    staging = path.with_name(f".{path.name}.tunedeck-partial")
    shutil.rmtree(staging, ignore_errors=True)  # a copy that died half-way
    try:
        staging.mkdir(parents=True)
        size = 0
        for source in model_files(checkpoint):
            shutil.copy2(source, staging / source.name)
            size += source.stat().st_size
        (staging / OUTPUT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        fsync_tree(staging)
        if path.is_dir():
            path.rmdir()  # empty (checked above): the folder created at launch
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return size


def publish_run_output(run: Any, cfg: dict[str, Any]) -> Path | None:
    """At the end of a finished run: the last checkpoint's model into ``cfg["output"]``, recorded as an
    event (``output_saved`` or ``output_failed`` with the reason and what to do); never raises."""
    import logging

    log = logging.getLogger("tunedeck.train")
    value = cfg.get("output")
    if not value:
        return None
    path = resolve_output(str(value), run.path)
    last = run.last_sound_checkpoint()
    if last is None:
        _event(run, "output_failed", path=str(path), reason="no complete checkpoint")
        log.error("output %s: no complete checkpoint to copy", path)
        return None
    info = {"run_id": run.id, "run_dir": str(run.path), "step": last.step, "checkpoint": str(last.path),
            "base_model": cfg.get("model"), "method": cfg.get("method"), "precision": cfg.get("precision")}
    try:
        size = publish_output(path, last.path, info)
    except Exception as exc:  # the weights are safe in the run directory: a failed copy fails nothing
        reason = str(exc) if isinstance(exc, OutputError) else f"{type(exc).__name__}: {exc}"
        log.error("could not copy the trained model to output %s: %s; it is in %s (copy it from there, or "
                  "tunedeck export %s --out DIR)", path, reason, last.path, run.id)
        _event(run, "output_failed", path=str(path), checkpoint=str(last.path), reason=reason)
        return None
    _event(run, "output_saved", path=str(path), step=last.step, bytes=size)
    log.info("trained model copied to %s (%.1f MB, step %d)", path, size / 1e6, last.step)
    return path


def _event(run: Any, name: str, **data: Any) -> None:
    try:
        run.append_event(name, **data)
    except OSError:  # a full disk under the run directory too: the log line above is the record
        pass
