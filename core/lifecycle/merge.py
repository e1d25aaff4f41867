"""Merge a run's LoRA/DoRA adapter into its base weights and save a standalone model directory.

The result is written into ``OUT.tmp/`` and renamed to ``OUT/`` only once every file is written and
fsync'ed, so a failed or killed merge never leaves a directory that looks finished. The free disk space
is checked before the first byte is written.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.atomic_file import fsync_tree, umask_modes
from core.i18n import Message
from core.lifecycle.source import (
    LifecycleError,
    ModelSource,
    OutputExists,
    OutputNotReplaceable,
    held,
    refuse_quantized_base,
    resolve_model_source,
)
from core.runs.run_dir import RunDirectory, utc_now_iso

# Room left over after the merged weights: tokenizer files, the filesystem's own needs.
DEFAULT_HEADROOM_BYTES = 256 * 1024 * 1024
TMP_SUFFIX = ".tmp"
LOCK_SUFFIX = ".lock"
# What a merge or export writes into its folder: the folder's provenance, and the sign that a folder is one
# of tunedeck's own results (the only kind ``--force`` replaces, besides an empty folder).
PROVENANCE_FILE = "tunedeck_merge.json"
# Written first into ``OUT.tmp``: a leftover folder of that name holding it is a killed merge's, not the user's.
WRITING_MARKER = ".tunedeck_writing"
# Inside a run directory a merge or export may write only below these (the defaults are there).
RUN_OUTPUT_FOLDERS = ("merged", "export")
# The stages ``merge_run`` reports through its ``progress`` callback, in order ("merge" only when the run
# has an adapter to fold in: a full fine-tune goes from "load" to "write").
MERGE_STAGES = ("load", "merge", "write", "done")


class MergeCancelled(LifecycleError):
    """The caller cancelled the merge (its app is quitting); nothing was left behind."""


class MergeRunning(LifecycleError):
    """Another merge into ``path`` holds its lock (this app's, or another tunedeck's); the message gives the
    CLI's advice (--out), ``path`` lets the app word its own."""

    def __init__(self, message: object, path: Path) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class MergeResult:
    out: Path
    step: int
    bytes: int
    seconds: float
    dtype: str
    adapter: bool
    reused: bool = False  # a whole merge of the checkpoint was already there (``merge_run(reuse=True)``)
    method: str = ""  # the run's (lora, dora, qlora, full): a QLoRA merge is said to be into the unquantised base

    def qlora_note(self) -> str | None:
        """What a merge of a QLoRA adapter must say beside its result (CLI and app alike): the adapter was
        trained against the base's 4-bit (NF4) weights, merged into the base in ``dtype`` (the usual
        practice: 4-bit weights cannot take it), so the merged model's outputs may differ slightly from
        the model trained. None for any other merge."""
        return qlora_note(self.adapter, self.method, self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "step": self.step, "bytes": self.bytes, "seconds": round(self.seconds, 3),
                "dtype": self.dtype, "adapter": self.adapter, "reused": self.reused, "method": self.method}


def qlora_note(adapter: bool, method: str, dtype: str) -> str | None:
    """``MergeResult.qlora_note`` of a merge of an adapter (``adapter``) of a run of ``method`` into the base
    in ``dtype``: also what an export, merged or quantized, says (``export_note``)."""
    from core.i18n import t

    if not (adapter and method == "qlora"):
        return None
    return t("lifecycle.merged_qlora_note", dtype=dtype or "bf16")


def merge_words(result: MergeResult) -> str:
    """The line that reports a merge, written or reused, in the CLI and the app alike: its size in decimal
    units (``core.units.format_disk``: "15.0 GB"; the app said "15000.0 MB" of what the CLI called GB)."""
    from core.i18n import t
    from core.units import format_disk

    if result.reused:
        return t("lifecycle.merge_reused", out=str(result.out), size=format_disk(result.bytes), step=result.step)
    return t("lifecycle.merged", out=str(result.out), size=format_disk(result.bytes), seconds=result.seconds)


def default_merge_dir(run: RunDirectory, step: int) -> Path:
    return run.path / "merged" / f"checkpoint-{step}"


def complete_merge(run: RunDirectory, source: ModelSource) -> Path | None:
    """The run's default merged folder when it holds a whole merge of ``source``'s checkpoint, else None.

    Whole: renamed into place (a merge writes ``OUT.tmp`` first), its weights, config and provenance there,
    the provenance naming this very checkpoint, and written after the checkpoint's last file changed (a
    checkpoint rewritten since, e.g. by a resumed run saving that step again, is merged anew)."""
    out = default_merge_dir(run, source.step)
    provenance_path = out / "tunedeck_merge.json"
    try:
        provenance = json.loads(provenance_path.read_text(encoding="utf-8"))
        written = provenance_path.stat().st_mtime
        newest = max((p.stat().st_mtime for p in source.checkpoint.rglob("*") if p.is_file()), default=0.0)
    except (OSError, ValueError):
        return None
    if not isinstance(provenance, dict) or provenance.get("staging") or provenance.get("format"):
        return None  # a staging copy, or a quantized export (its format named) written there with --out
    same = provenance.get("checkpoint") == str(source.checkpoint) and provenance.get("step") == source.step \
        and provenance.get("base_model", source.base_model) == source.base_model  # merge --base: another base
    weights = (out / "model.safetensors").is_file() or (out / "model.safetensors.index.json").is_file()
    if not (same and weights and (out / "config.json").is_file()) or written < newest:
        return None
    return out


def saved_dtype(out: Path) -> str:
    """The dtype a saved model's config.json names ("bfloat16" …), "" when it names none."""
    try:
        config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    value = config.get("torch_dtype") or config.get("dtype") if isinstance(config, dict) else None
    return str(value) if value else ""


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def check_disk_space(directory: Path, model_size: int, headroom_bytes: int = 0) -> None:
    """Refuse (``LifecycleError``) when the filesystem of ``directory`` has less free than the model's
    ``model_size`` bytes plus ``headroom_bytes`` left free beside it; the message says the two apart (a model of a
    few MB is not said to need the headroom's 0.27 GB)."""
    from core.units import format_disk

    probe = directory
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < model_size + headroom_bytes:
        raise LifecycleError(Message("lifecycle.disk_full", path=str(probe), model=format_disk(model_size),
                                     headroom=format_disk(headroom_bytes),
                                     needed=format_disk(model_size + headroom_bytes), free=format_disk(free)))


def model_bytes(model: Any) -> int:
    """Bytes the model's tensors take once saved (parameters and buffers that are saved). A tensor the state
    dict names twice (tied weights: the embedding and lm_head of most small models) is saved once, and
    counted once: counted twice, the disk check said a Qwen2.5-0.5B merge was a quarter bigger than it is,
    and refused a disk with room for it."""
    seen: set[tuple[Any, ...]] = set()
    total = 0
    for tensor in model.state_dict().values():
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.data_ptr() and key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total


def merged_model(source: ModelSource, device: str = "cpu",
                 progress: Callable[[str], None] | None = None) -> tuple[Any, Any]:
    """(model with the adapter folded in, tokenizer); a full fine-tune's checkpoint is returned as it is."""
    from core.lifecycle.source import load_finetuned

    loaded = load_finetuned(source, device)
    if progress is not None and loaded.has_adapter:
        progress("merge")
    model = loaded.model.merge_and_unload() if loaded.has_adapter else loaded.model
    return model, loaded.tokenizer


def _absolute(path: Path) -> Path:
    """``path`` absolute, its symlinks resolved as far as it exists (``..`` and links cannot hide a run)."""
    return Path(os.path.abspath(Path(path).expanduser())).resolve()


def _local_model_dir(source: ModelSource) -> Path | None:
    """The run's base model folder when it is a local one (the bundled tiny, a path); None for a hub id."""
    from core.assets import resolve_model_name

    if not source.base_model:
        return None
    local = Path(resolve_model_name(source.base_model)).expanduser()
    return local if local.is_dir() else None


def check_out_location(out: Path, run: RunDirectory, source: ModelSource, quantized: Path | None = None) -> None:
    """Refuse (``LifecycleError``, exit 2; nothing touched) an output folder whose replacement or writing
    could destroy what tunedeck keeps or reads: one that is, holds or lies inside the data root (where
    runs live), a run directory (outside the run's own ``merged/`` and ``export/`` folders, where the
    defaults go), the checkpoint being merged or the local base model folder.

    ``--force`` used to rename whatever ``--out`` named aside and delete it: a run directory, the data
    root or the checkpoint being read went with it.

    ``quantized``: a bitsandbytes export's default folder (``export/FORMAT-checkpoint-N``). Such an export goes
    to the run's export/ folder only: in merged/ it would read as the run's full-precision merge of its
    checkpoint, which merge, serve and evaluate reuse (``complete_merge``)."""
    from core.errors import EXIT_USAGE
    from core.i18n import t
    from core.paths import data_root

    target = _absolute(out)
    root = _absolute(data_root())
    # where leaving --out out writes: a bitsandbytes export's export/ folder, else the merge's merged/ one
    default = str(quantized if quantized is not None else default_merge_dir(run, source.step))
    if root.is_relative_to(target):
        raise LifecycleError(t("lifecycle.out_data_root", path=str(out), root=str(root), default=default),
                             exit_code=EXIT_USAGE)
    run_path = _absolute(run.path)
    runs = [run_path] + [p for p in (target, *target.parents) if (p / "run.json").is_file()]
    for folder in runs:
        if folder.is_relative_to(target):  # the run directory itself, or a folder holding it
            raise LifecycleError(t("lifecycle.out_holds_run", path=str(out), run=str(folder), default=default),
                                 exit_code=EXIT_USAGE)
    for what, folder in (("checkpoint", source.checkpoint), ("model", _local_model_dir(source))):
        if folder is None:
            continue
        folder = _absolute(folder)
        if target.is_relative_to(folder) or folder.is_relative_to(target):
            raise LifecycleError(t("lifecycle.out_is_source", path=str(out), source=str(folder),
                                   what=t("lifecycle.out_source_" + what)), exit_code=EXIT_USAGE)
    inside = [p for p in runs if p in target.parents]
    if inside:
        parts = target.relative_to(inside[0]).parts
        if quantized is not None and (len(parts) < 2 or parts[0] != "export"):
            raise LifecycleError(t("lifecycle.out_inside_run_quantized", path=str(out), run=str(inside[0]),
                                   default=default), exit_code=EXIT_USAGE)
        if len(parts) < 2 or parts[0] not in RUN_OUTPUT_FOLDERS:
            raise LifecycleError(t("lifecycle.out_inside_run", path=str(out), run=str(inside[0]),
                                   default=default), exit_code=EXIT_USAGE)
        return
    if target.is_relative_to(root):
        raise LifecycleError(t("lifecycle.out_data_root", path=str(out), root=str(root), default=default),
                             exit_code=EXIT_USAGE)


def is_replaceable(folder: Path) -> bool:
    """Whether ``--force`` (or the TUI's y) may replace ``folder``: an empty folder, or one that is
    recognisably an earlier tunedeck merge or export (its ``tunedeck_merge.json`` is there). Anything
    else (the user's files, a run, a folder of folders) is never deleted by a merge."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        if not any(folder.iterdir()):
            return True
    except OSError:
        return False
    return (folder / PROVENANCE_FILE).is_file()


def _contents_words(folder: Path) -> str:
    """What a folder holds, for a message: "a file", or "3 entries: a.txt, data/, notes.md …"."""
    from core.i18n import t

    if folder.is_symlink():
        return t("lifecycle.holds_link", target=os.readlink(folder))
    if not folder.is_dir():
        return t("lifecycle.holds_file")
    try:
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    except OSError as exc:
        return t("lifecycle.holds_unreadable", error=str(exc))
    shown = ", ".join(names[:5]) + (" …" if len(names) > 5 else "")
    if len(names) == 1:
        return t("lifecycle.holds_entry", names=shown)
    return t("lifecycle.holds_entries", count=len(names), names=shown)


def _not_replaceable(folder: Path) -> OutputNotReplaceable:
    """The refusal of a folder in the way that a merge never replaces, saying what it holds (listed once)."""

    holds = _contents_words(folder)
    return OutputNotReplaceable(Message("lifecycle.out_not_replaceable", path=str(folder), holds=holds), folder,
                                holds)


def refuse_unless_replaceable(folder: Path, force: bool) -> None:
    """``folder`` is there: ``OutputNotReplaceable`` unless it is ``is_replaceable``; then, without
    ``force``, ``OutputExists`` (a caller may ask the user, then call again with ``force``)."""
    from core.i18n import t

    if not is_replaceable(folder):
        raise _not_replaceable(folder)
    if not force:
        raise OutputExists(t("lifecycle.out_exists", path=str(folder)), folder)


def _publish_modes(tmp: Path) -> None:
    """Give the finished ``tmp`` and everything in it the modes the umask gives (as a plain mkdir / open
    would): it was private while being written (0700), and safetensors writes its files 0600, so an
    export for a serving container running as another user could not be read (config.json could)."""
    folder, file = umask_modes(tmp)
    for path in tmp.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, folder if path.is_dir() else file)
    os.chmod(tmp, folder)


def save_model_dir_atomically(model: Any, tokenizer: Any, out: Path, provenance: dict[str, Any],
                              headroom_bytes: int = DEFAULT_HEADROOM_BYTES, force: bool = False) -> int:
    """Write model (safetensors) + tokenizer + chat template into ``out`` via ``out.tmp``; returns bytes.

    ``out.tmp`` is private (0700) while it is written; the finished folder and its files get the modes the
    umask gives (``_publish_modes``) before it is renamed into place."""

    if os.path.lexists(out):  # only an empty folder or an earlier merge is replaced, and only with force
        refuse_unless_replaceable(out, force)
    tmp = out.with_name(out.name + TMP_SUFFIX)
    if os.path.lexists(tmp):  # a leftover of a merge that was killed; anything else there is not ours
        if not (is_replaceable(tmp) or (tmp.is_dir() and not tmp.is_symlink() and (tmp / WRITING_MARKER).is_file())):
            raise _not_replaceable(tmp)
        # Removed before the free space is measured: a killed merge's half-written weights (as big as the
        # model) counted as taken, and the retry was refused for want of the room they would give back.
        shutil.rmtree(tmp)
    check_disk_space(out.parent, model_bytes(model), headroom_bytes)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(mode=0o700)
    try:
        (tmp / WRITING_MARKER).touch()
        model.config.use_cache = True  # the merged model is for inference
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
        (tmp / WRITING_MARKER).unlink()
        _publish_modes(tmp)  # private while written; the finished folder as the umask has it
        fsync_tree(tmp)
        if os.path.lexists(out):  # force: move the old one aside only once the new one is complete
            refuse_unless_replaceable(out, force)  # still an earlier merge (checked again: time has passed)
            # A fresh empty name to move it to (rename replaces an empty folder): never someone's OUT.old.
            old = Path(tempfile.mkdtemp(prefix=out.name + ".old-", dir=out.parent))
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def _unwritable(out: Path, exc: OSError) -> LifecycleError:
    """The one-line refusal for an ``--out`` whose folder cannot be made or written in (exit 2): a file
    where a folder is needed above it, a read-only or pseudo filesystem (/proc), no permission."""
    from core.errors import EXIT_USAGE

    for parent in reversed(out.parents):
        if os.path.lexists(parent) and not parent.is_dir():
            return LifecycleError(Message("lifecycle.out_below_file", path=str(out), file=str(parent)),
                                  exit_code=EXIT_USAGE)
    reason = exc.strerror or str(exc) or type(exc).__name__
    return LifecycleError(Message("lifecycle.out_unwritable", path=str(out), where=str(exc.filename or out.parent),
                                  reason=reason), exit_code=EXIT_USAGE)


def make_out_parent(out: Path) -> None:
    """Create the folder ``out`` goes into; one that cannot be made is ``_unwritable``, not a traceback."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _unwritable(out, exc) from None


@contextmanager
def merge_lock(out: Path) -> Iterator[None]:
    """Hold ``OUT.lock`` (flock) for a merge into ``out``; a second merge into it raises at once.

    Two merges into one folder would delete each other's ``OUT.tmp``, and both would fail. The lock file
    is removed on release; one found replaced after locking (its holder just removed it) is locked anew."""

    path = out.with_name(out.name + LOCK_SUFFIX)
    make_out_parent(out)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:  # a read-only or pseudo filesystem, no permission: before anything is loaded
            raise _unwritable(out, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise MergeRunning(Message("lifecycle.merge_running", path=str(out)), out) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(fd)


def merge_run(run: RunDirectory, checkpoint: int | None = None, out: Path | None = None,
              headroom_bytes: int = DEFAULT_HEADROOM_BYTES, force: bool = False,
              device: str | None = None, progress: Callable[[str], None] | None = None,
              cancelled: Callable[[], bool] | None = None, reuse: bool = False,
              record: bool = True, base: str | None = None,
              chosen: Callable[[ModelSource, Path], None] | None = None) -> MergeResult:
    """Merge the run's adapter (last complete checkpoint unless ``checkpoint``) into ``out``.

    ``progress`` (called from this thread) hears each stage of ``MERGE_STAGES`` as it begins.
    ``cancelled`` is asked before each stage: when it turns true the merge ends with ``MergeCancelled``
    and leaves nothing behind (a stage under way, e.g. loading, runs to its end first). ``reuse`` (with
    the default ``out``, without ``force``): a whole merge of this checkpoint already there
    (``complete_merge``) is the result as it is (``reused``), nothing loaded or written; another earlier
    merge (or an empty folder) in the way is ``OutputExists`` without ``force``, replaced with it.
    ``record``: a merge written is a "merged" event of the run (False: the caller records what it did, as
    ``export_run`` records its "exported").

    ``out`` is checked before anything is loaded (``check_out_location``): never a run directory (bar its
    merged/ and export/ folders), the data root, the checkpoint read or the base model folder; and a folder
    there that is neither empty nor an earlier merge is ``OutputNotReplaceable``, ``force`` or not.

    ``base``: the model to merge into in place of the run's (``with_base``: the full-precision model of a run trained
    on a ``*-bnb-4bit`` one).

    ``chosen`` hears the checkpoint merged and the folder written once it is held, before loading: without a
    ``checkpoint`` asked for, a live run's rotation may have taken the one first chosen, and the newest is
    merged instead (``held``)."""
    from core.lifecycle.source import default_device, with_base

    started = time.monotonic()
    source = resolve_model_source(run, checkpoint)
    if base:
        source = with_base(source, base)
    if reuse and out is None and not force:
        done = complete_merge(run, source)
        if done is not None:
            return MergeResult(done, source.step, folder_bytes(done), time.monotonic() - started,
                               saved_dtype(done), source.is_adapter, reused=True, method=source.method)
    refuse_quantized_base(source)  # before torch is imported, a folder locked or anything loaded
    device = device or default_device()  # imports torch: seconds, in which a live run's rotation may remove ...

    def checked_out(source: ModelSource) -> Path:
        # "~/models/x" (as --out=~/models/x reaches us: the shell leaves a ~ after "=") is the home folder's:
        # the checks looked there, and the merge was written into a folder named "~" in the current one
        where = Path(out).expanduser() if out is not None else default_merge_dir(run, source.step)
        check_out_location(where, run, source)
        if os.path.lexists(where):
            refuse_unless_replaceable(where, force)
        return where

    target = checked_out(source)  # before the pin: a refusal leaves the run's folders as they were
    # ... the checkpoint just chosen: the newest is chosen again, when no step was asked for (its folder
    # checked again), and held against the rotation throughout (``held``)
    with held(run, source, checkpoint, base) as holding:
        if holding is not source:
            target = checked_out(holding)
        if chosen is not None:
            chosen(holding, target)
        with merge_lock(target):
            return _merge_locked(run, holding, target, headroom_bytes, force, device, progress, cancelled, started,
                                 record)


def _merge_locked(run: RunDirectory, source: ModelSource, out: Path, headroom_bytes: int, force: bool,
                  device: str, progress: Callable[[str], None] | None, cancelled: Callable[[], bool] | None,
                  started: float, record: bool = True) -> MergeResult:
    from core.i18n import t

    def report(stage: str) -> None:
        if cancelled is not None and cancelled():
            raise MergeCancelled(t("lifecycle.merge_cancelled", run=run.id))
        if progress is not None:
            progress(stage)

    report("load")
    model, tokenizer = merged_model(source, device, report)
    provenance = {"merged": utc_now_iso(), **source.to_dict()}
    report("write")
    try:
        size = save_model_dir_atomically(model, tokenizer, out, provenance, headroom_bytes, force)
    except LifecycleError:
        raise
    except Exception as exc:  # OSError, safetensors' own I/O error …: the folder is gone either way
        raise LifecycleError(t("lifecycle.merge_write_failed", path=str(out), error=str(exc))) from exc
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    result = MergeResult(out, source.step, size, time.monotonic() - started, dtype, source.is_adapter,
                         method=source.method)
    if record:
        run.record_event("merged", **result.to_dict())
    if progress is not None:  # written: too late to cancel
        progress("done")
    return result
