"""Export a run's model: the merged safetensors folder, or a bitsandbytes-quantized copy of it.

bitsandbytes quantizes on CUDA only; on a machine without an NVIDIA GPU the quantized formats are
refused with a message that says so before anything is loaded.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.lifecycle.source import LifecycleError
from core.runs.run_dir import RunDirectory, utc_now_iso

FORMATS = ("merged", "bnb-4bit", "bnb-8bit")


def default_export_dir(run: RunDirectory, fmt: str, step: int) -> Path:
    return run.path / "export" / f"{fmt}-checkpoint-{step}"


def export_run(run: RunDirectory, fmt: str, checkpoint: int | None = None, out: Path | None = None,
               force: bool = False) -> dict[str, Any]:
    """Write the export; returns ``{"format", "out", "bytes", "seconds", "step", "reused"}``.

    The merged format's default folder is the one ``merge`` writes: one that already holds a whole merge of
    the same checkpoint is the export (``"reused": True``), not an error; ``force`` merges it again."""
    from core.errors import EXIT_USAGE
    from core.i18n import Message, t
    from core.lifecycle.merge import (
        MergeRunning,
        check_out_location,
        make_out_parent,
        merge_run,
        refuse_unless_replaceable,
    )
    from core.lifecycle.source import held, refuse_quantized_base, resolve_model_source

    if fmt not in FORMATS:
        # argparse refuses it in the CLI; the app or a caller of the API reaches it, in the interface's language
        raise LifecycleError(Message("lifecycle.export_unknown_format", format=str(fmt), formats=", ".join(FORMATS)),
                             exit_code=EXIT_USAGE)
    if fmt == "merged":
        # An export is recorded as "exported" with its format, written or reused: the events panel says what
        # was asked for, not "merged" for a fresh export and "exported" for a reused one.
        try:
            result = merge_run(run, checkpoint, out, force=force, reuse=True, record=False)
        except MergeRunning as exc:  # said as an export's, not "a merge into …" the user never started
            raise _export_running(exc.path) from None
        return _exported(run, fmt, result.out, result.bytes, result.seconds, result.step, result.reused,
                         result.adapter, result.method, result.dtype)
    started = time.monotonic()
    source = resolve_model_source(run, checkpoint)
    refuse_quantized_base(source)  # a *-bnb-4bit base: the merge before quantizing would quantize it twice
    if importlib.util.find_spec("bitsandbytes") is None:
        raise LifecycleError(t("lifecycle.export_needs_bnb", format=fmt))
    import torch

    if not torch.cuda.is_available():
        raise LifecycleError(t("lifecycle.export_needs_cuda", format=fmt))

    def checked_out(source: Any) -> Path:
        where = Path(out).expanduser() if out is not None else default_export_dir(run, fmt, source.step)  # as merge's
        # never into a run (bar its export/ folder), the data root or the checkpoint read
        check_out_location(where, run, source, quantized=default_export_dir(run, fmt, source.step))
        if os.path.lexists(where):
            refuse_unless_replaceable(where, force)  # only an empty folder or an earlier export, with force
        make_out_parent(where)  # a file in the way, a read-only filesystem: said before anything is loaded
        return where

    target = checked_out(source)  # before the pin: a refusal leaves the run's folders as they were
    # The checkpoint held against a live run's rotation to the end of its merge (``held``): one rotated away in
    # torch's import (seconds) is the newest chosen again, when no step was asked for.
    with held(run, source, checkpoint) as chosen:
        if chosen is not source:
            target = checked_out(chosen)
        source = chosen
        # Merge in full precision first, then quantize the merged weights while loading them. The staging copy
        # (the whole model in full precision) goes whatever happens: a quantization that fails (out of memory)
        # or is interrupted (Ctrl+C) left it in the run's export/ folder, tens of GB that nothing removed.
        staging = default_export_dir(run, "staging", source.step)
        # Both folders locked for the whole export, as a merge locks its OUT: two quantized exports of one
        # checkpoint (4-bit and 8-bit, or the same twice) wrote and deleted the one staging folder under each
        # other, one quantizing a half-written or vanished copy; two into one --out deleted each other's OUT.tmp.
        with _out_lock(target), _staging_lock(staging, run, source.step, fmt):
            return _export_quantized(run, fmt, source, target, staging, force, started)


def _export_running(out: Path) -> LifecycleError:
    """The refusal of an export into ``out`` while another export or a merge writes there (its lock is held)."""
    from core.i18n import Message
    from core.lifecycle.merge import MergeRunning

    return MergeRunning(Message("lifecycle.export_out_running", path=str(out)), out)


@contextmanager
def _out_lock(out: Path) -> Iterator[None]:
    """``merge_lock`` of ``out``; held by another, the refusal is an export's (``_export_running``)."""
    from contextlib import ExitStack

    from core.lifecycle.merge import MergeRunning, merge_lock

    with ExitStack() as stack:
        try:
            stack.enter_context(merge_lock(out))
        except MergeRunning:
            raise _export_running(out) from None
        yield


@contextmanager
def _staging_lock(staging: Path, run: RunDirectory, step: int, fmt: str) -> Iterator[None]:
    """``merge_lock`` of the run's staging folder for checkpoint ``step``: another quantized export of it
    under way is refused at once, saying so (not "a merge into staging-checkpoint-N", a folder the user
    never named)."""
    from contextlib import ExitStack

    from core.i18n import Message
    from core.lifecycle.merge import MergeRunning, merge_lock

    with ExitStack() as stack:
        try:
            stack.enter_context(merge_lock(staging))
        except MergeRunning:
            raise LifecycleError(Message("lifecycle.export_running", run=run.id, step=step, format=fmt,
                                         path=str(staging))) from None
        yield


def _export_quantized(run: RunDirectory, fmt: str, source: Any, out: Path, staging: Path, force: bool,
                      started: float) -> dict[str, Any]:
    """The quantized export proper, both its folders locked (``export_run``)."""
    import shutil

    import torch

    from core.lifecycle.merge import merged_model, save_model_dir_atomically

    try:
        model, tokenizer = merged_model(source, "cuda")
        dtype = str(next(model.parameters()).dtype).replace("torch.", "")  # merged in, before quantizing
        save_model_dir_atomically(model, tokenizer, staging, {"staging": True}, force=True)
        del model
        torch.cuda.empty_cache()
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        if fmt == "bnb-4bit":
            quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                       bnb_4bit_compute_dtype=torch.bfloat16)
        else:
            quant = BitsAndBytesConfig(load_in_8bit=True)
        quantized = AutoModelForCausalLM.from_pretrained(str(staging), quantization_config=quant, device_map={"": 0})
        size = save_model_dir_atomically(quantized, tokenizer, out,
                                         {"exported": utc_now_iso(), "format": fmt, **source.to_dict()},
                                         force=force)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _exported(run, fmt, out, size, time.monotonic() - started, source.step, False, source.is_adapter,
                     source.method, dtype)


def _exported(run: RunDirectory, fmt: str, out: Path, size: int, seconds: float, step: int,
              reused: bool, adapter: bool, method: str, dtype: str) -> dict[str, Any]:
    """The export's result (``seconds`` to 3 decimals, as ``merge``'s; the adapter merged in, the run's
    method and the dtype it was merged in: ``export_note``), recorded as the run's "exported" event."""
    result = {"format": fmt, "out": str(out), "bytes": size, "seconds": round(seconds, 3), "step": step,
              "reused": reused, "adapter": adapter, "method": method, "dtype": dtype}
    run.record_event("exported", **result)
    return result


def export_note(result: dict[str, Any]) -> str | None:
    """What an export of a QLoRA run says beside its result, as its merge says it (``qlora_note``): the
    adapter was merged into the unquantised base, before any quantizing. None for any other export."""
    from core.lifecycle.merge import qlora_note

    return qlora_note(bool(result.get("adapter")), str(result.get("method") or ""), str(result.get("dtype") or ""))
