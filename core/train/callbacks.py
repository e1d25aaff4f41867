"""Trainer callbacks: metrics.jsonl records, events, graceful stop on SIGTERM, the heartbeat's steps, the
setup's objects out of the garbage collector's way, injected OOM and a hold at a step for tests."""

from __future__ import annotations

import gc
import logging
import math
import os
import signal
import threading
import time
from typing import Any

from transformers import TrainerCallback

from core.runs.heartbeat import RecentStepTimes, current_heartbeat
from core.runs.run_dir import METRICS_SCHEMA, RUNNING, STARTING, RunDirectory, utc_now_iso
from core.units import format_duration, format_rate

log = logging.getLogger("tunedeck.train")

INJECT_OOM_ENV = "TUNEDECK_INJECT_OOM_AT_STEP"
HOLD_ENV = "TUNEDECK_HOLD_AT_STEP"
MIN_STEPS_FOR_FIRST_ETA = 3  # a median of three step times is not the first step's warm-up


class StopFlag:
    """Set from the SIGTERM handler; read at the end of each optimizer step."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""

    def set(self, signal_name: str = "SIGTERM") -> None:
        self.signal_name = signal_name
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def _world_any(flag: bool) -> bool:
    """True if ``flag`` is true on any rank (so that every rank stops at the same step)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _gather_floats(values: list[float]) -> list[list[float]]:
    """Each rank's ``values`` (all ranks call this), rank order."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [values]
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def memory_figures_gib() -> dict[str, float] | None:
    """This rank's GPU memory now (GiB): allocated, reserved, peaks, and the device's free/total."""
    import torch

    if not torch.cuda.is_available():
        return None
    gib = 1024**3
    free, total = torch.cuda.mem_get_info()
    return {
        "allocated_gib": round(torch.cuda.memory_allocated() / gib, 3),
        "reserved_gib": round(torch.cuda.memory_reserved() / gib, 3),
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / gib, 3),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / gib, 3),
        "free_gib": round(free / gib, 3),
        "total_gib": round(total / gib, 3),
    }


class RunMetricsCallback(TrainerCallback):
    """Writes metrics.jsonl (rank 0) and a human progress line per logging step into the log."""

    def __init__(self, run: RunDirectory, header: dict[str, Any], resumed_from: str | None,
                 prior_elapsed_s: float, global_batch: int, is_main: bool) -> None:
        self.run = run
        self.header = header
        self.resumed_from = resumed_from
        self.prior_elapsed_s = prior_elapsed_s
        self.global_batch = global_batch
        self.is_main = is_main
        self.session_start = time.time()
        self.session_start_step = 0
        self.last_time = self.session_start
        self.last_step = 0
        self.last_tokens = 0
        self.ended_at: float | None = None  # the wall time the step of the next train log ended, if told
        # The ETA's step time: the mean over recent logged intervals of this session less the slowest tenth
        # (``RecentStepTimes.eta_step_s``), its first left out (it holds the model load, a resume's data skip):
        # neither that nor a rare pause is spread over the rest; steps often slowed (a busy CPU) are.
        self.step_times = RecentStepTimes()

    def step_ended(self, at: float) -> None:
        """The step the next train log reports ended at ``at`` (wall time), not when the log is written: the
        trainer writes a step's log at the end of the next step on a GPU (``AtomicCheckpointTrainer``)."""
        self.ended_at = at

    def elapsed_s(self) -> float:
        return self.prior_elapsed_s + (time.time() - self.session_start)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.time()
        self.session_start = now
        self.last_time = now
        self.session_start_step = state.global_step
        self.last_step = state.global_step
        self.last_tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        self.step_times = RecentStepTimes()
        if not self.is_main:
            return
        self.run.transition(RUNNING, "", only_from={STARTING})
        fresh = not self.run.metrics_path.exists() or self.run.metrics_path.stat().st_size == 0
        if fresh:
            self.run.append_metrics({"schema": METRICS_SCHEMA, "kind": "header", "time": utc_now_iso(),
                                     "total_steps": state.max_steps, **self.header})
        if self.resumed_from:
            self.run.append_metrics({"kind": "resumed", "step": state.global_step, "total_steps": state.max_steps,
                                     "checkpoint": self.resumed_from, "time": utc_now_iso()})
            self.run.append_event("resumed", step=state.global_step, checkpoint=self.resumed_from)
        log.info("training: %d steps (global batch %d sequences)", state.max_steps, self.global_batch)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        logs = logs or {}
        memory = memory_figures_gib()
        mem = [memory["peak_allocated_gib"], memory["peak_reserved_gib"]] if memory else [0.0, 0.0]
        per_rank = _gather_floats(mem) if memory is not None else None  # every rank takes part
        if not self.is_main:
            return
        if "eval_loss" in logs:
            self.run.append_metrics({"kind": "eval", "step": state.global_step, "epoch": _round(state.epoch, 4),
                                     "eval_loss": _num(logs.get("eval_loss")), "elapsed_s": round(self.elapsed_s(), 2)})
            log.info("step %d eval loss %.4f", state.global_step, logs["eval_loss"])
            return
        if "loss" not in logs:
            return  # the end-of-training summary
        now, self.ended_at = self.ended_at or time.time(), None
        tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        dt = max(1e-9, now - self.last_time)
        steps_done = state.global_step - self.last_step
        session_steps = state.global_step - self.session_start_step
        session_time = now - self.session_start
        remaining = max(0, state.max_steps - state.global_step)
        self.step_times.note(state.global_step, now)  # the first note of a session only sets where it starts
        step_s = self.step_times.eta_step_s()
        # The session's first log: the heartbeat's median of every step's time since it began, where a slow first
        # step (a warm-up, a data skip) weighs little; no heartbeat: the session's average, all there is to go by.
        # Not before its third step: a first step's warm-up (5-8x a step) made the demo's first ETA 2:34 for 20 s.
        if step_s is None and session_steps >= MIN_STEPS_FOR_FIRST_ETA:
            heartbeat = current_heartbeat()
            step_s = heartbeat.median_step_s() if heartbeat is not None else None
            if step_s is None:
                step_s = session_time / session_steps
        eta = step_s * remaining if step_s is not None else None
        loss = _num(logs.get("loss"))
        record = {
            "kind": "train",
            "step": state.global_step,
            "total_steps": state.max_steps,
            "epoch": _round(state.epoch, 4),
            "loss": loss,
            "learning_rate": _num(logs.get("learning_rate")),
            "grad_norm": _num(logs.get("grad_norm")),
            "tokens_per_s": round((tokens - self.last_tokens) / dt, 1),
            "samples_per_s": round(steps_done * self.global_batch / dt, 3),
            "elapsed_s": round(self.prior_elapsed_s + (now - self.session_start), 3),
            "eta_s": round(eta, 1) if eta is not None else None,
            "tokens_seen": tokens,
            "peak_allocated_gib": [r[0] for r in per_rank] if per_rank else None,
            "peak_reserved_gib": [r[1] for r in per_rank] if per_rank else None,
            "time": utc_now_iso(),
        }
        self.run.append_metrics(record)
        if loss is None or (isinstance(loss, float) and not math.isfinite(loss)):
            self.run.append_event("nan_loss", step=state.global_step, loss=str(logs.get("loss")))
            log.warning("step %d: the loss is %s (not a number)", state.global_step, logs.get("loss"))
        log.info(
            "step %d/%d | loss %s | lr %.3g | %s tok/s | eta %s",
            state.global_step, state.max_steps, f"{loss:.4f}" if loss is not None else "nan",
            logs.get("learning_rate") or 0.0, format_rate(record["tokens_per_s"]), format_duration(eta),
        )
        self.last_time = now
        self.last_step = state.global_step
        self.last_tokens = tokens


class GracefulStopCallback(TrainerCallback):
    """Turns a stop request into "save a checkpoint now and stop", at the same step on every rank.

    Also asks for a checkpoint at the very last step, so that a finished run always ends with one. Both
    steps are logged too, whatever ``logging_steps`` says: the run's last metrics record is the step it
    ended at (a run of 54 steps logged every 10 read "step 50/50", a stop at 307 "step 300").
    """

    def __init__(self, flag: StopFlag) -> None:
        self.flag = flag
        self.stopped_at: int | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step >= state.max_steps:
            control.should_save = True  # the last step: finish normally even if a stop came in now
            control.should_log = True
        elif _world_any(self.flag.is_set()):
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_log = True
            control.should_training_stop = True
            log.info("stop requested: saving a checkpoint at step %d and stopping", state.global_step)
        return control


class HeartbeatCallback(TrainerCallback):
    """Tells this process's heartbeat (``core.runs.heartbeat``) of every optimizer step, so that readers
    know the last step, its time and the median step time (from which they judge a stall)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from core.runs.heartbeat import current_heartbeat

        heartbeat = current_heartbeat()
        if heartbeat is not None:
            heartbeat.note_step(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from core.runs.heartbeat import current_heartbeat

        heartbeat = current_heartbeat()
        if heartbeat is not None:
            heartbeat.note_step(state.global_step)


class FreezeSetupObjectsCallback(TrainerCallback):
    """Takes what the setup made (imported modules, model, tokenizer, data: over a million objects in the
    trainer) out of the cyclic garbage collector's sweeps when the step loop begins.

    Left in, every full collection walks all of them: on the H200 box 0.3-0.6 s, every 15-20 steps
    (each step promotes many short-lived autograd objects, which triggers the next full sweep). That
    stalls a step loop that waits on the CPU (a small model's), and the GPU too once the kernels launched
    ahead run out, which a pause that long outlasts (bench/results/estimate_matrix/profile-3-probes.txt:
    0.5B at b1 x 1024 went from 0.255 to 0.206 s a step). Freezing leaves reference counting alone: only a
    reference cycle among the frozen objects that became garbage later would stay; the cycles the setup
    left are collected once first."""

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        gc.collect()
        gc.freeze()


class InjectedOomCallback(TrainerCallback):
    """Raises ``torch.cuda.OutOfMemoryError`` when step ``TUNEDECK_INJECT_OOM_AT_STEP`` begins (tests)."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    @classmethod
    def from_env(cls) -> InjectedOomCallback | None:
        value = os.environ.get(INJECT_OOM_ENV, "").strip()
        return cls(int(value)) if value.isdigit() else None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torch

        if state.global_step + 1 == self.at_step:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory (injected by {INJECT_OOM_ENV}={self.at_step} for testing)"
            )


class HoldAtStepCallback(TrainerCallback):
    """Stops this process (SIGSTOP) once step ``TUNEDECK_HOLD_AT_STEP`` is recorded, until a SIGCONT
    (tests): a signal sent while it is held meets a run that is surely mid-way, however fast the box
    trains and however slowly the test gets to send it. Added after the metrics callback, so the step's
    record is on disk first."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step
        self.held = False

    @classmethod
    def from_env(cls) -> HoldAtStepCallback | None:
        value = os.environ.get(HOLD_ENV, "").strip()
        return cls(int(value)) if value.isdigit() else None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.held or state.global_step < self.at_step or "loss" not in (logs or {}):
            return
        self.held = True
        log.info("held at step %d by %s=%d: continues on SIGCONT", state.global_step, HOLD_ENV, self.at_step)
        for handler in logging.getLogger().handlers + log.handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGSTOP)


def _num(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _round(value: Any, digits: int) -> float | None:
    return round(float(value), digits) if value is not None else None
