"""Disk space for runs: how big a checkpoint will be, whether the ones a run keeps fit, and full disks.

Checkpoint size (``estimate_checkpoint_size``), from the model's parameter count (``core.estimate``) and
the run's method; deliberately simple, and a little on the generous side:

* weights: full fine-tuning saves every parameter in the dtype it trains in (4 bytes: fp32 master
  weights, or 2 with ``pure_bf16``); LoRA / DoRA / QLoRA save the adapter only (fp32, 4 bytes per
  adapter parameter: small);
* optimizer state per trained parameter: AdamW keeps two fp32 moments (8 bytes), the 8-bit AdamWs two
  8-bit ones (2 bytes), Adafactor and plain SGD next to nothing (0); DeepSpeed ZeRO adds its fp32 master
  copy (4 bytes);
* the rest (scheduler, RNG state, trainer_state.json, the tokenizer files saved with every checkpoint):
  the tokenizer files' size when the model is a local folder, plus 1 MiB.

A run keeps ``save_total_limit`` checkpoints, and the next one is written before the oldest is rotated
away, so ``save_total_limit + 1`` checkpoints stand on the disk at the peak; the last of them is the final
save (0 = keep all: every save of ``max_steps`` when known, else just the final save). A run that makes
fewer saves than that (``max_steps`` / ``save_steps``, the final one included) has only those at its
peak. A stop's save is not planned: ``resume`` counts the checkpoints already on the disk.

Full disks: ``is_disk_full`` recognises ENOSPC in an ``OSError`` and in what torch and safetensors raise
when a write comes up short. Every run directory holds a 1 MiB ``.reserve`` file (created by the
supervisor); whoever meets a full disk deletes it, so that the final status, the ``disk_full`` event and
the last log lines can still be written.
"""

from __future__ import annotations

import errno
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import TunedeckError
from core.i18n import Message
from core.paths import nearest_existing_dir

RESERVE_NAME = ".reserve"
RESERVE_BYTES = 1024 * 1024
# Refuse below the estimate; warn when less than this much more than the estimate is free.
WARN_MARGIN = 0.2
OTHER_FILES_BYTES = 1024 * 1024
ADAPTER_BYTES_PER_PARAM = 4
OPTIMIZER_BYTES_PER_PARAM = {"adamw_8bit": 2, "paged_adamw_8bit": 2, "adafactor": 0, "sgd": 0}
ADAM_BYTES_PER_PARAM = 8
ZERO_MASTER_BYTES_PER_PARAM = 4
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                    "special_tokens_map.json", "chat_template.jinja")
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# What only a write raises when the disk cannot take it (a permission error could be a read, too).
UNWRITABLE_ERRNOS = DISK_FULL_ERRNOS | {errno.EROFS}
# torch.save on a full disk: "[enforce fail at inline_container.cc:672] unexpected pos N vs M", or
# "PytorchStreamWriter failed writing file ...: file write failed"; safetensors: "... StorageFull ...".
_FULL_DISK_TEXTS = ("no space left on device", "unexpected pos", "file write failed", "storagefull",
                    "disk quota exceeded")


def is_disk_full(exc: BaseException | None) -> bool:
    """True if ``exc`` (or an exception it was raised from) says the disk is full."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, DiskFullError):
            return True
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        if isinstance(exc, (RuntimeError, OSError)) or type(exc).__name__ == "SafetensorError":
            text = str(exc).lower()
            if any(marker in text for marker in _FULL_DISK_TEXTS):
                return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def is_unwritable(exc: BaseException) -> bool:
    """True for an ``OSError`` that means "this disk cannot be written now" (full or read-only)."""
    return isinstance(exc, OSError) and exc.errno in UNWRITABLE_ERRNOS


# The attribute ``core.cli`` sets on an OSError of a write to standard output or error: "stdout" or "stderr".
OUTPUT_STREAM = "tunedeck_output_stream"


def output_stream(exc: BaseException) -> str | None:
    """``stdout`` or ``stderr`` when ``exc`` is a failed write of the command's own output (marked by
    ``core.cli`` while a command runs), else None. Such an error has no file name to say."""
    stream = getattr(exc, OUTPUT_STREAM, None)
    return stream if stream in ("stdout", "stderr") else None


def cannot_write_message(exc: OSError) -> str:
    """``cannot write FILE: No space left on device; free space there ...`` for an unwritable disk, and
    ``cannot write standard output: ...`` for the command's output (``tunedeck runs > /dev/full``)."""
    from core.i18n import t

    error = exc.strerror or str(exc)
    stream = output_stream(exc)
    if stream is not None:
        name = t("cli.standard_output") if stream == "stdout" else t("cli.standard_error")
        return t("cli.cannot_write_output", stream=name, error=error)
    filename = _filename(exc)
    if exc.errno == errno.EISDIR:
        # a folder where the file goes (made by hand, or by a tool that took the name for a folder): no space or
        # rights to fix, the folder to move; named as the file it stands in for (an os.replace's target)
        target = os.fsdecode(exc.filename2) if isinstance(exc.filename2, (str, bytes, os.PathLike)) else filename
        return t("cli.cannot_write_is_dir", path=target or "?")
    if filename and _holds_data_root(Path(filename)):
        # tunedeck's folder could not be made at all (a read-only or full home on a fresh box): nothing of
        # tunedeck's is there yet, so another folder is the way on, not only space or rights where it is
        from core.paths import data_root

        return t("cli.cannot_write_home", path=filename, error=error, root=str(data_root()))
    return t("cli.cannot_write", path=filename or "?", error=error)


def _filename(exc: OSError) -> str:
    """The file an ``OSError`` names, as text: a bytes name (``os.makedirs(b"...")``, a name that is no
    UTF-8) decoded as the file system spells it, never a ``TypeError`` from ``Path(b"...")``; "" when none."""
    name = exc.filename
    if isinstance(name, (str, bytes, os.PathLike)):
        return os.fsdecode(name)
    return "" if name is None else str(name)


def _holds_data_root(path: Path) -> bool:
    """``path`` is the data root or one of the folders above it."""
    from core.paths import data_root

    root = data_root().expanduser().absolute()
    path = path.expanduser().absolute()
    return path == root or path in root.parents


def free_bytes(path: Path) -> int | None:
    """Bytes free for an unprivileged writer on the filesystem holding ``path`` (None if unknown)."""
    try:
        stats = os.statvfs(nearest_existing_dir(path))
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def format_size(value: float) -> str:
    """Sizes in messages: decimal (as df -H and the clouds count), ``core.units.format_disk``."""
    from core.units import format_disk

    return format_disk(value)


class DiskFullError(OSError, TunedeckError):
    """The disk filled up while the trainer wrote ``path``; carries the figures for the final status."""

    def __init__(self, path: Path, needed_bytes: int | None, free: int | None, step: int | None = None,
                 weights_kept: Path | None = None, error: str = "") -> None:
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        self.path = Path(path)
        self.needed_bytes = needed_bytes
        self.free = free
        self.step = step
        self.weights_kept = weights_kept
        self.error = error


def disk_full_reason(path: Path, needed_bytes: int | None, free: int | None, run_id: str,
                     kept: Path | None = None, kept_step: int | None = None) -> Message:
    """``disk full (needed X GB, Y GB free on PATH)`` and what to do, as a message record; ``kept``: the
    checkpoint that holds the trained weights after all."""
    free_text = format_size(free) if free is not None else "?"
    kept_text: Message | str = ""
    if kept is not None:
        kept_text = Message("runs.disk_full_weights_kept", step=kept_step if kept_step is not None else "?",
                            path=str(kept), id=run_id)
    if needed_bytes and free is not None and free >= 2 * needed_bytes:
        # Room for the save twice over, measured after the half-written files went: not the disk but a
        # limit on this process refused the write. "disk full (needed 12 MB, 29 GB free)" sent the user to
        # free space that was there.
        return Message("runs.reason_disk_full_limit", needed=format_size(needed_bytes), free=free_text,
                       path=str(path), limit=write_limit(), id=run_id, kept=kept_text)
    if needed_bytes:
        return Message("runs.reason_disk_full", needed=format_size(needed_bytes), free=free_text, path=str(path),
                       id=run_id, kept=kept_text)
    return Message("runs.reason_disk_full_unsized", free=free_text, path=str(path), id=run_id, kept=kept_text)


def write_limit() -> Message:
    """What can refuse a write on a disk with room: this process's file size limit (``ulimit -f``, which
    Python turns from SIGXFSZ into a failed write), else, most likely, a disk quota."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY:
        return Message("runs.disk_limit_fsize", size=format_size(soft))
    return Message("runs.disk_limit_quota")


# -- the reserve file ------------------------------------------------------------------------------------
def create_reserve(run_path: Path, size: int = RESERVE_BYTES) -> bool:
    """Write ``RUN_DIR/.reserve`` (real blocks, not a sparse file); False when the disk has no room."""
    path = Path(run_path) / RESERVE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return False
    try:
        block = b"\0" * 65536
        written = 0
        while written < size:
            written += os.write(fd, block[: size - written])
        os.fsync(fd)
        return True
    except OSError:
        os.close(fd)
        fd = -1
        try:
            path.unlink()
        except OSError:
            pass
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def release_reserve(run_path: Path) -> bool:
    """Delete the reserve file to make room for the last records; True if there was one."""
    try:
        (Path(run_path) / RESERVE_NAME).unlink()
        return True
    except OSError:
        return False


# -- checkpoint sizes ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointSize:
    """Bytes of one checkpoint by part (see the module docstring for the rule)."""

    weights: int
    optimizer: int
    other: int
    params: int
    trainable: int

    @property
    def total(self) -> int:
        return self.weights + self.optimizer + self.other


def checkpoint_size(params: int, trainable: int, method: str, optimizer: str = "adamw", pure_bf16: bool = False,
                    zero_stage: int = 0, other: int = OTHER_FILES_BYTES) -> CheckpointSize:
    """One checkpoint of a model of ``params`` parameters of which ``trainable`` are trained."""
    if method == "full":
        weights = params * (2 if pure_bf16 else 4)
    else:
        weights = trainable * ADAPTER_BYTES_PER_PARAM
    per_param = OPTIMIZER_BYTES_PER_PARAM.get(optimizer, ADAM_BYTES_PER_PARAM)
    if method == "full" and pure_bf16 and zero_stage == 0 and optimizer not in OPTIMIZER_BYTES_PER_PARAM:
        per_param //= 2  # torch's AdamW keeps its moments in the parameters' dtype: bf16 (measured: 45.7 GB for 7B)
    if zero_stage > 0:
        per_param += ZERO_MASTER_BYTES_PER_PARAM
    return CheckpointSize(weights, trainable * per_param, other, params, trainable)


def _tokenizer_bytes(model_dir: Path) -> int:
    total = 0
    for name in _TOKENIZER_FILES:
        try:
            total += (model_dir / name).stat().st_size
        except OSError:
            pass
    return total


def estimate_checkpoint_size(cfg: dict[str, Any]) -> CheckpointSize | None:
    """The size of one checkpoint of the run configured by ``cfg`` (a resolved config as a dict), or None
    when the model cannot be sized (not a decoder we know, no config.json to be found offline)."""
    from core.assets import resolve_model_name
    from core.estimate import (
        ArchitectureError,
        ModelNotFoundError,
        count_parameters,
        load_model_config,
        lora_parameter_count,
        normalise_lora_targets,
    )

    model = resolve_model_name(str(cfg.get("model") or ""))
    if not model:
        return None
    try:
        arch = load_model_config(model).architecture()
        params = count_parameters(arch).total
        method = str(cfg.get("method") or "lora")
        if method == "full":
            trainable = params
        else:
            targets = normalise_lora_targets(cfg.get("lora_targets") or "all-linear")
            trainable = lora_parameter_count(arch, int(cfg.get("lora_rank") or 16), targets, dora=method == "dora")
    except (ArchitectureError, ModelNotFoundError, OSError, ValueError, TypeError):
        return None
    model_dir = Path(model).expanduser()
    other = OTHER_FILES_BYTES + (_tokenizer_bytes(model_dir) if model_dir.is_dir() else 0)
    pure = bool(cfg.get("pure_bf16")) and str(cfg.get("precision", "bf16")) == "bf16"
    return checkpoint_size(params, trainable, method, str(cfg.get("optimizer") or "adamw"), pure,
                           int(cfg.get("zero_stage") or 0), other)


def checkpoints_kept(cfg: dict[str, Any]) -> int:
    """How many checkpoints stand on the disk at the peak, the final save included (module docstring)."""
    limit = int(cfg.get("save_total_limit", 2) or 0)
    max_steps = int(cfg.get("max_steps") or 0)
    save_steps = max(1, int(cfg.get("save_steps") or 500))
    # every save the run can make: one per save_steps, the final one included (unknown without max_steps)
    saves = max(1, math.ceil(max_steps / save_steps)) if max_steps > 0 else None
    if limit > 0:
        return min(limit + 1, saves) if saves is not None else limit + 1
    return saves or 1


@dataclass(frozen=True)
class SpaceCheck:
    """What ``check_space`` concluded: ``verdict`` is ``ok``, ``close`` (warn) or ``short`` (refuse)."""

    verdict: str
    needed_bytes: int
    free_bytes: int
    checkpoints: int  # before the final save
    path: Path
    size: CheckpointSize

    @property
    def message(self) -> Message:
        from core.units import plural_key

        key = plural_key("runs.space_short" if self.verdict == "short" else "runs.space_close", self.checkpoints)
        return Message(key, needed=format_size(self.needed_bytes), checkpoints=self.checkpoints,
                       each=format_size(self.size.total), free=format_size(self.free_bytes), path=str(self.path))

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "needed_bytes": self.needed_bytes, "free_bytes": self.free_bytes,
                "checkpoints": self.checkpoints, "path": str(self.path), "checkpoint_bytes": self.size.total,
                "weights_bytes": self.size.weights, "optimizer_bytes": self.size.optimizer}


def check_space(cfg: dict[str, Any], path: Path, existing_checkpoints: int = 0) -> SpaceCheck | None:
    """Will the checkpoints the run keeps fit on the filesystem of ``path``? None when it cannot tell.

    ``existing_checkpoints`` already on that disk (a resume) count as written.
    """
    size = estimate_checkpoint_size(cfg)
    free = free_bytes(path)
    if size is None or free is None:
        return None
    total = checkpoints_kept(cfg)
    to_write = max(1, total - max(0, existing_checkpoints))
    needed = to_write * size.total + RESERVE_BYTES
    if free < needed:
        verdict = "short"
    elif free < needed * (1 + WARN_MARGIN):
        verdict = "close"
    else:
        verdict = "ok"
    return SpaceCheck(verdict, needed, free, max(0, to_write - 1), nearest_existing_dir(path), size)

