"""``transformers.Trainer`` with tunedeck's atomic checkpoints.

Every rank writes its share into ``checkpoints/checkpoint-N.tmp/``; after a barrier the main process
fsyncs the tree, renames it to ``checkpoint-N/`` and writes the ``COMPLETE`` marker last, then keeps the
newest ``save_total_limit``. A crash at any moment leaves either a complete checkpoint or one that resume
ignores. ``tunedeck_state.json`` in each checkpoint carries what the Trainer does not (elapsed time).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from transformers import Trainer
from transformers.trainer_callback import ExportableState

from core.runs.checkpoints import finalize_checkpoint, rotate_checkpoints, tmp_path_for
from core.runs.disk_space import is_disk_full
from core.runs.heartbeat import current_heartbeat
from core.runs.run_dir import RunDirectory

log = logging.getLogger("tunedeck.train")
TUNEDECK_STATE = "tunedeck_state.json"
# What a checkpoint holds beyond the weights: optimizer, schedule, scaler and RNG state (DeepSpeed's
# global_stepN/ folder too). Dropped when the disk fills up while they are written.
_STATE_FILE = re.compile(r"^(optimizer\.(pt|bin)|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth|global_step\d+)$")


class _LoggedStep(NamedTuple):
    """A step's log values on their way from the device: copied without blocking into pinned ``host``
    (loss sum, grad norm, tokens), ``ready`` recorded after the copy (a timing CUDA event; None on a CPU:
    already there), ``ended`` the wall time the step ended where the host knows it (a CPU), else None."""
    host: Any
    ready: Any
    ended: float | None
    step: int
    epoch: float | None
    steps: int  # optimizer steps the loss sum covers
    learning_rate: float
    grad_norm: bool  # whether there is one
    start_time: float | None


_LOG_SIGNATURE = inspect.signature(Trainer._maybe_log_save_evaluate)


def defers_logs(cuda: bool) -> bool:
    """Whether a step's log is written at the end of the next step (``_maybe_log_save_evaluate``): on a GPU, or as
    TUNEDECK_DEFER_LOGS=1/0 says (the tests defer on a CPU, where nothing runs ahead). The metrics header says
    which (``logs_deferred``); a record carries its own step's end either way (``step_ended``)."""
    wanted = os.environ.get("TUNEDECK_DEFER_LOGS")
    return wanted == "1" if wanted in ("0", "1") else cuda


def rebase_learning_rate(scheduler: Any, base_lrs: list[float]) -> None:
    """Carry on ``scheduler``'s schedule (its step and shape, as restored from a checkpoint) from the base
    rates ``base_lrs`` instead of those it was saved with: a resume with another ``learning_rate``.

    The optimizer's param groups get the new ``initial_lr`` and the rate the schedule gives at its current
    step (a ``LambdaLR``: base × factor; any other scheduler: the rate scaled by new base / old base)."""
    old = list(scheduler.base_lrs)
    if len(old) != len(base_lrs) or old == list(base_lrs):
        return
    groups = scheduler.optimizer.param_groups
    factors = getattr(scheduler, "lr_lambdas", None)
    for index, (group, before, after) in enumerate(zip(groups, old, base_lrs, strict=True)):
        if factors is not None:
            group["lr"] = after * factors[index](scheduler.last_epoch)
        elif before:
            group["lr"] = group["lr"] * after / before
        group["initial_lr"] = after
    scheduler.base_lrs = list(base_lrs)
    scheduler._last_lr = [group["lr"] for group in groups]  # what the Trainer logs until the next step


def untied_missing_keys(model: Any, missing: list[str]) -> list[str]:
    """The keys of ``missing`` (a ``load_state_dict`` result's) the model really lacks.

    A checkpoint stores a tied weight once (safetensors refuses shared tensors: the tiny model's
    ``lm_head.weight`` is its ``embed_tokens.weight``), so loading it reports the other name missing
    although its tensor was loaded under the first. A key is left out only where its very parameter is
    also under a name that did load; every other missing key stays, to be reported."""
    if not missing:
        return list(missing)
    tensors = model.state_dict(keep_vars=True)  # tied parameters appear under each of their names
    names: dict[int, list[str]] = {}
    for name, tensor in tensors.items():
        names.setdefault(id(tensor), []).append(name)
    gone = set(missing)
    return [key for key in missing
            if key not in tensors or all(other in gone for other in names[id(tensors[key])])]


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


class AtomicCheckpointTrainer(Trainer):
    """A Trainer whose checkpoints appear atomically (see the module docstring)."""

    def __init__(self, *args: Any, run: RunDirectory, keep_checkpoints: int, elapsed_fn: Any,
                 own_loss: str | None = None, weights_only: bool = False, step_ended: Any = None,
                 chunk_tokens: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run = run
        self.keep_checkpoints = keep_checkpoints
        self.elapsed_fn = elapsed_fn
        # told the wall time a logged step ended before its log (RunMetricsCallback.step_ended): a deferred
        # record is written a step later, and its times (elapsed, tokens/s, ETA) are the step's, not the writing's
        self.step_ended = step_ended
        self._gpu_clock: tuple[Any, float] | None = None  # (a CUDA event, the wall time it ran at)
        self.own_loss = own_loss  # "chunked" or "triton" (core.train.fused_loss); None: the model's own
        self.chunk_tokens = chunk_tokens  # its chunk (``ce_chunk_tokens``); None: the loss's own rule
        self.weights_only = weights_only  # resume: load the weights and the step, restart optimizer + schedule
        self._tokens_pending: Any = None  # non-padding tokens counted on the device since the last flush
        self.defer_logs = defers_logs(self.args.device.type == "cuda")
        self._logged: _LoggedStep | None = None
        self._eval_sums: Any = None  # (loss summed over targets, targets) while evaluation_loop runs

    def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        """Counts the batch's non-padding tokens on the device; ``_flush_tokens`` reads the sum.

        The Trainer's own count calls ``.item()`` at every micro-step: a host synchronisation that empties the
        GPU's queue, so the next kernels wait for Python to launch them. Here the count stays on the device
        until a step logs or saves, where the Trainer synchronises anyway.
        """
        if self.args.include_num_input_tokens_seen == "no" or "input_ids" not in inputs:
            return super()._track_num_input_tokens(inputs)
        mask = inputs.get("attention_mask")
        pad = getattr(self.processing_class, "pad_token_id", None)
        if mask is not None:
            count = mask.sum()
        elif pad is not None:  # packed batches carry position_ids, no attention mask
            count = (inputs["input_ids"] != pad).sum()
        else:
            count = inputs["input_ids"].numel()
        self._tokens_pending = count if self._tokens_pending is None else self._tokens_pending + count

    def _flush_tokens(self) -> None:
        """Adds the tokens counted since the last flush to ``state.num_input_tokens_seen`` (every rank calls
        this at the same steps: the sum is gathered over ranks)."""
        tokens = self._take_tokens()
        if tokens is not None:
            self.state.num_input_tokens_seen += int(tokens.item())

    def _take_tokens(self) -> Any:
        """The tokens counted since the last take, summed over ranks on the device (None if none counted)."""
        pending, self._tokens_pending = self._tokens_pending, None
        return None if pending is None else self.accelerator.gather(pending.reshape(1)).sum()

    def prediction_step(self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> Any:
        """The Trainer's, counting each batch's loss over its targets (``evaluation_loop``)."""
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        targets = inputs.get("labels")
        if loss is not None and targets is not None and self._eval_sums is not None:
            count = (targets[..., 1:] != -100).sum()  # the model's loss shifts its labels one to the left
            summed = torch.where(count > 0, loss.detach().float() * count, torch.zeros_like(loss, dtype=torch.float))
            self._eval_sums += torch.stack([summed.reshape(()), count.to(summed.dtype)]).to(self._eval_sums.device)
        return loss, logits, labels

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> Any:
        """The Trainer's, with the loss taken over the held-out targets, each counted once: the Trainer's
        mean of its batches' means weighs a short example's tokens more (with batches of 8 and 6 the
        dashboard's eval loss read 1.519 where ``tunedeck evaluate`` of the same checkpoint read 1.472).
        Summed on the device over the batches and the ranks; one read at the end."""
        self._eval_sums = torch.zeros(2, dtype=torch.float64, device=self.args.device)
        try:
            output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                             metric_key_prefix)
            sums = self.accelerator.reduce(self._eval_sums, reduction="sum") if self.accelerator.num_processes > 1 \
                else self._eval_sums
            total, count = (float(x) for x in sums.tolist())
        finally:
            self._eval_sums = None
        key = f"{metric_key_prefix}_loss"
        if count > 0 and key in output.metrics:
            output.metrics[key] = total / count
        return output

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        self._emit_logged()  # a step's log before anything logged after it (evaluation, the summary)
        self._flush_tokens()
        super().log(logs, *args, **kwargs)

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> None:
        """The Trainer's log reads the loss and the grad norm with ``.item()``: the host waits for the GPU to
        finish the step, the GPU's queue runs dry, and the next step's first kernels wait for Python to launch
        them. Here the step's values are gathered on the device and copied to pinned memory without blocking;
        on a GPU (``defer_logs``) they are logged at the end of the next step, when the GPU is long past them,
        with the step, epoch and learning rate they belong to (before a checkpoint, an evaluation or the
        summary if one comes first). Nothing is lost: the record is the one the Trainer would write."""
        self._emit_logged()  # the previous step's: the GPU finished it while this step was launched
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            called = _LOG_SIGNATURE.bind_partial(self, tr_loss, grad_norm, *args, **kwargs).arguments
            self._log_without_waiting(tr_loss, grad_norm, called.get("learning_rate"), called.get("start_time"))
            self.control.should_log = False  # the Trainer's own log is done
            if not self.defer_logs:
                self._emit_logged()
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    def _log_without_waiting(self, tr_loss: Any, grad_norm: Any, learning_rate: float | None,
                             start_time: float | None) -> None:
        import torch

        device = tr_loss.device
        loss = self.accelerator.gather(tr_loss.detach().reshape(1)).mean()  # every rank's mean, as the Trainer
        tokens = self._take_tokens()
        if tokens is None:
            tokens = torch.zeros((), device=device)
        if grad_norm is None:
            norm = torch.zeros((), device=device)
        else:
            norm = grad_norm.detach().reshape(()) if torch.is_tensor(grad_norm) else \
                torch.full((), float(grad_norm), device=device)  # filled there: no copy from the host
        values = torch.stack([loss.double(), norm.to(device, torch.float64), tokens.to(torch.float64)])
        tr_loss -= tr_loss  # after the gather in stream order
        cuda = device.type == "cuda"
        host = torch.empty(3, dtype=torch.float64, pin_memory=cuda)
        host.copy_(values, non_blocking=cuda)
        ready = None
        if cuda:
            ready = torch.cuda.Event(enable_timing=True)
            ready.record()
        self._logged = _LoggedStep(host, ready, None if cuda else time.time(), self.state.global_step, self.state.epoch,
                                   self.state.global_step - self._globalstep_last_logged,
                                   learning_rate if learning_rate is not None else self._get_learning_rate(),
                                   grad_norm is not None, start_time)
        self._globalstep_last_logged = self.state.global_step
        self.store_flos()

    def _emit_logged(self) -> None:
        """Logs the step ``_log_without_waiting`` kept (waits for its copy if the GPU is not past it yet)."""
        logged, self._logged = self._logged, None
        if logged is None:
            return
        if logged.ready is not None:
            logged.ready.synchronize()
        ended = logged.ended if logged.ready is None else self._gpu_wall_time(logged.ready)
        if self.step_ended is not None and ended is not None:
            self.step_ended(ended)
        loss_sum, norm, tokens = logged.host.tolist()
        self.state.num_input_tokens_seen += int(tokens)
        self._total_loss_scalar += loss_sum
        logs = {"loss": loss_sum / logged.steps}
        if logged.grad_norm:
            logs["grad_norm"] = norm
        logs["learning_rate"] = logged.learning_rate
        # the step, epoch and log flag of now: the callbacks' on_log clears should_log, which this step may need
        now = self.state.global_step, self.state.epoch, self.control.should_log
        self.state.global_step, self.state.epoch = logged.step, logged.epoch
        try:
            super().log(logs, logged.start_time)
        finally:
            self.state.global_step, self.state.epoch, self.control.should_log = now

    def _start_gpu_clock(self) -> None:
        """Pairs a CUDA event with the wall time it ran at (the GPU idle, so they coincide): a step's end on
        the GPU in wall time is then this time plus the GPU's time from this event to the step's."""
        import torch

        if self.args.device.type != "cuda":
            return
        torch.cuda.synchronize()
        mark = torch.cuda.Event(enable_timing=True)
        mark.record()
        mark.synchronize()
        self._gpu_clock = (mark, time.time())

    def _gpu_wall_time(self, event: Any) -> float | None:
        """The wall time ``event`` (a completed timing event) ran at, from the GPU's clock; None without one."""
        if self._gpu_clock is None:
            return None
        mark, wall = self._gpu_clock
        try:
            return wall + mark.elapsed_time(event) / 1000.0
        except RuntimeError:  # not comparable (another device): the record takes the time it is written
            return None

    def train(self, *args: Any, **kwargs: Any) -> Any:
        self._start_gpu_clock()
        try:
            return super().train(*args, **kwargs)
        finally:
            try:
                self._emit_logged()  # the last step's log, also when training failed after it
            except Exception as exc:  # a failed GPU cannot give it back: the failure is the news
                log.warning("the last step's log could not be read from the GPU: %s", exc)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Resume's weights loaded: the Trainer warns of missing keys, a tied weight's among them (the tiny
        model's ``lm_head.weight`` on every resume, read as a damaged checkpoint); those are left out."""
        missing = untied_missing_keys(self.model, list(load_result.missing_keys))
        if len(missing) != len(load_result.missing_keys):
            load_result = load_result._replace(missing_keys=missing)
        super()._issue_warnings_after_load(load_result)

    def _init_training_state(self, max_steps: int, *args: Any, **kwargs: Any) -> Any:
        """Resume's trainer state comes from the checkpoint's trainer_state.json, its save, logging and eval
        intervals with it: those of the run's configuration now (``tunedeck resume RUN save_steps=N``) are
        put back, or the checkpoints would go on landing at the old interval."""
        result = super()._init_training_state(max_steps, *args, **kwargs)
        kept = {kind: getattr(self.state, f"{kind}_steps", None) for kind in ("save", "logging", "eval")}
        self.state.compute_steps(self.args, max_steps)
        changed = {kind: (old, getattr(self.state, f"{kind}_steps", None)) for kind, old in kept.items()
                   if old != getattr(self.state, f"{kind}_steps", None)}
        if changed:  # the Trainer has just warned of the mismatch: say which side holds
            log.info("the run's configuration holds over the checkpoint's trainer state: %s",
                     ", ".join(f"{kind}_steps {old} → {new}" for kind, (old, new) in changed.items()))
        return result

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if self.weights_only:
            return  # 'tunedeck resume --weights-only': a fresh optimizer and LR schedule, as announced
        # The schedule built from this run's config carries its learning_rate; the checkpoint's state
        # carries the rate the run had when it was saved (`tunedeck resume RUN learning_rate=...`).
        fresh = list(getattr(self.lr_scheduler, "base_lrs", None) or []) if checkpoint else []
        super()._load_optimizer_and_scheduler(checkpoint)
        if fresh:
            rebase_learning_rate(self.lr_scheduler, fresh)

    def _load_scaler(self, checkpoint: str | None) -> None:
        if self.weights_only:
            return
        super()._load_scaler(checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if self.weights_only:
            return  # RNG files count as state too: one may be what is missing
        super()._load_rng_state(checkpoint)

    def _record_removal(self, path: Path, why: str, back: int | None = None) -> None:
        """Nothing under checkpoints/ disappears without an event naming it (and a line in train.log).
        ``back``: for a left-behind checkpoint, the step the resume that left it went back to."""
        try:
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        except OSError:
            size = None
        extra = {"back": back} if back is not None else {}
        self.run.append_event("checkpoint_removed", path=str(path), why=why, bytes=size, **extra)
        if back is not None:
            log.info("checkpoint removed (%s: the run went back to step %d after it was saved): %s (%.1f MB)",
                     why, back, path.name, (size or 0) / 1e6)
        else:
            log.info("checkpoint removed (%s): %s (%.1f MB)", why, path.name, (size or 0) / 1e6)

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        """The chunked cross-entropy (``fused_ce: chunked``) or the fused kernel's (``fused_ce: triton``) for
        training steps; else the Trainer's loss (the model's own: Liger's where its kernels are applied).

        Evaluation (``return_outputs``) keeps the standard path: it runs without gradients, so its
        logits are freed as soon as the loss is taken.
        """
        from core.train.fused_loss import (
            TARGET_ROWS,
            causal_lm_of,
            forward_chunked_loss,
            supports_chunked_loss,
        )

        rows = inputs.get(TARGET_ROWS)  # the collator's; the model does not take them
        inputs = {key: value for key, value in inputs.items() if key != TARGET_ROWS}
        causal_lm = causal_lm_of(self.accelerator.unwrap_model(model)) if self.own_loss else None
        if self.own_loss and not supports_chunked_loss(causal_lm):
            log.warning("fused_ce: %s does not fit this model's head (logit soft-capping or scaling); "
                        "using the model's own loss", self.own_loss)
            self.own_loss = None
        if self.own_loss == "triton":
            from core.train.linear_ce_kernel import usable

            if not usable(causal_lm.get_output_embeddings(), causal_lm.config.hidden_size):
                log.info("fused_ce: triton takes a frozen, plain LM head; this run's is trained or wrapped: "
                         "using the model's own loss (Liger's where installed)")
                self.own_loss = None
        if not self.own_loss or return_outputs or "labels" not in inputs:
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        if not self.model_accepts_loss_kwargs:
            num_items_in_batch = None  # the Trainer then divides by the accumulation steps itself
        # The LM head runs outside the model's forward, where accelerate's autocast does not reach: enter it
        # here too, so that mixed-precision runs make their logits in bf16/fp16 as the model's own head does.
        with self.accelerator.autocast():
            loss = forward_chunked_loss(model, self.accelerator.unwrap_model(model), inputs, num_items_in_batch,
                                        chunk_tokens=self.chunk_tokens, kernel=self.own_loss == "triton", rows=rows)
        if self.args.average_tokens_across_devices and self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            # As Trainer.compute_loss: num_items_in_batch counts every rank's tokens, DDP averages gradients.
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        return loss

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        self._emit_logged()  # the saved trainer state holds the step's log
        self._flush_tokens()  # the saved trainer state counts every token trained so far
        step = self.state.global_step
        root = Path(self.args.output_dir)
        tmp = tmp_path_for(root, step)
        started = time.time()
        if self.args.should_save and tmp.exists():
            self._record_removal(tmp, "incomplete")
            shutil.rmtree(tmp)  # a leftover of an attempt that died while saving this same step
        _barrier()
        self.store_flos()
        heartbeat = current_heartbeat()
        if heartbeat is not None:
            heartbeat.phase("saving")  # a long write may hold the interpreter: not a stall
        # The weights first (small for an adapter), then the resumable state: a disk that fills up during
        # the state keeps the weights (see _disk_full_while_saving).
        try:
            self.save_model(str(tmp), _internal_call=True)
        except Exception as exc:
            self._disk_full_while_saving(exc, tmp, step, weights_saved=False)
            raise
        try:
            if not self.args.save_only_model:
                self._save_optimizer_and_scheduler(str(tmp))
                self._save_scaler(str(tmp))
                self._save_rng_state(str(tmp))
            if self.args.should_save:
                self._save_state_files(tmp, step)
        except Exception as exc:
            self._disk_full_while_saving(exc, tmp, step, weights_saved=True)
            raise
        _barrier()
        if self.args.should_save:
            final = finalize_checkpoint(tmp, step, on_remove=self._record_removal)
            behind = self.run.left_behind()  # a branch an earlier resume went back from: rotated first
            rotate_checkpoints(root, self.keep_checkpoints if self.keep_checkpoints > 0 else None,
                               on_remove=lambda path, why: self._record_removal(
                                   path, why, back=behind.get(_step_of(path)) if why == "left_behind" else None),
                               left_behind=behind)
            seconds = round(time.time() - started, 2)
            size = sum(p.stat().st_size for p in final.rglob("*") if p.is_file())
            self.run.append_event("checkpoint_saved", step=step, path=str(final), seconds=seconds, bytes=size)
            log.info("checkpoint saved: %s (%.1f MB, %.1f s)", final.name, size / 1e6, seconds)
        _barrier()
        if heartbeat is not None:
            heartbeat.phase("training")

    def _save_state_files(self, tmp: Path, step: int) -> None:
        """trainer_state.json (with the stateful callbacks) and tunedeck_state.json into ``tmp``."""
        for callback in [*self.callback_handler.callbacks, self.control]:
            if isinstance(callback, ExportableState):
                name = callback.__class__.__name__
                self.state.stateful_callbacks[name] = callback.state()
        self.state.save_to_json(str(tmp / "trainer_state.json"))
        (tmp / TUNEDECK_STATE).write_text(
            json.dumps({"step": step, "elapsed_s": self.elapsed_fn()}, indent=2) + "\n", encoding="utf-8"
        )

    def _disk_full_while_saving(self, exc: BaseException, tmp: Path, step: int, weights_saved: bool) -> None:
        """If ``exc`` is a full disk, raise ``DiskFullError`` with the figures (else return: the caller
        re-raises). Written weights are kept: the half-written state files go, and what is left becomes a
        complete, weights-only checkpoint (its marker says so; resume refuses it without --weights-only,
        merge/chat/export use it). Weights that did not fit go, to give the disk back."""
        from core.runs.disk_space import DiskFullError, estimate_checkpoint_size, free_bytes

        if not is_disk_full(exc):
            return
        kept: Path | None = None
        if self.args.should_save:
            if weights_saved:
                for path in list(tmp.iterdir()) if tmp.is_dir() else []:
                    if _STATE_FILE.match(path.name):
                        _discard(path)
                try:
                    self._save_state_files(tmp, step)
                    kept = finalize_checkpoint(tmp, step, {"weights_only": True, "why": "disk_full"})
                except OSError as again:
                    log.error("disk full while saving step %d: the weights could not be kept either (%s)", step, again)
                    _discard(tmp)
                else:
                    log.warning("disk full while saving step %d: the weights are kept in %s (no optimizer state)",
                                step, kept)
            else:
                _discard(tmp)
        size = estimate_checkpoint_size(self.run.config())
        root = Path(self.args.output_dir)
        raise DiskFullError(root, size.total if size else None, free_bytes(root), step, kept,
                            f"{type(exc).__name__}: {exc}"[:500]) from exc


def _step_of(path: Path) -> int | None:
    """N of a ``checkpoint-N`` folder, or None."""
    name = path.name.removeprefix("checkpoint-")
    return int(name) if name.isdigit() else None


def _discard(path: Path) -> None:
    """Delete a half-written file or folder and give its blocks back now: truncated first, because the
    writer that failed (torch's zip writer, kept alive by the traceback) may still hold it open, and an
    unlinked open file keeps its blocks."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    for file in files:
        try:
            os.truncate(file, 0)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def read_tunedeck_state(checkpoint: Path) -> dict[str, Any]:
    try:
        value = json.loads((checkpoint / TUNEDECK_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
