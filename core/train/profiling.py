"""Where a step's time goes: the torch profiler over a few steps of a real run (``TUNEDECK_PROFILE``).

``TUNEDECK_PROFILE=START:COUNT`` (e.g. ``5:2``) records steps START .. START+COUNT-1 and writes
``profile.txt`` into the run directory: the operators by self device time (CPU time on a CPU), and the
same grouped into families (matmuls, attention, element-wise, copies and casts, optimizer, …) as shares
of the recorded time. For benchmarks and bug reports; a run without the variable pays nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger("tunedeck.train")

FAMILIES = (  # (family, substrings of operator/kernel names), first match wins
    ("attention", ("flash", "attention", "sdpa", "fmha", "cudnn")),
    ("matmul", ("gemm", "matmul", "mm", "linear", "addmm", "bmm", "cutlass", "sm90", "nvjet")),
    ("optimizer", ("adam", "foreach", "multi_tensor", "fused_adam")),
    ("copy/cast", ("copy", "to_copy", "cast", "contiguous", "clone", "memcpy", "memset")),
    ("loss", ("cross_entropy", "log_softmax", "nll", "liger")),
    ("norm", ("rms", "norm")),
    ("dropout", ("dropout", "bernoulli")),
)


def parse_profile_env(value: str | None) -> tuple[int, int] | None:
    """``"5:2"`` -> (5, 2); anything else -> None (the run is not profiled)."""
    if not value:
        return None
    try:
        start, count = (int(part) for part in value.split(":", 1))
    except ValueError:
        return None
    return (start, count) if start >= 1 and count >= 1 else None


def family_of(name: str) -> str:
    lowered = name.lower()
    for family, needles in FAMILIES:
        if any(needle in lowered for needle in needles):
            return family
    return "element-wise/other"


class ProfileStepsCallback(TrainerCallback):
    """Records the steps ``TUNEDECK_PROFILE`` names with ``torch.profiler`` and writes the summary."""

    def __init__(self, run_dir: Path, start: int, count: int) -> None:
        self.path = Path(run_dir) / "profile.txt"
        self.start, self.count = start, count
        self.profiler: Any = None

    @classmethod
    def from_env(cls, run_dir: Path) -> ProfileStepsCallback | None:
        window = parse_profile_env(os.environ.get("TUNEDECK_PROFILE"))
        return cls(run_dir, *window) if window else None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is None and state.global_step + 1 == self.start:
            import torch
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.profiler = profile(activities=activities)
            self.profiler.__enter__()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None and state.global_step >= self.start + self.count - 1:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.profiler.__exit__(None, None, None)
            self.path.write_text(summarise(self.profiler, self.count), encoding="utf-8")
            log.info("profile of %d steps written to %s", self.count, self.path)
            self.profiler = None
            self.start = 1 << 60  # once


def summarise(profiler: Any, steps: int) -> str:
    """Top operators by self device time, and the families' shares."""
    events = list(profiler.key_averages())
    # On a GPU the kernels alone: an operator's self device time is that of the kernels it launched, so
    # counting both would count each kernel twice.
    kernels = [e for e in events if str(getattr(e, "device_type", "")).upper().endswith(("CUDA", "PRIVATEUSE1"))
               and getattr(e, "self_device_time_total", 0)]
    device = bool(kernels)
    events = kernels or events

    def self_time(event: Any) -> float:
        return float(getattr(event, "self_device_time_total", 0) if device else event.self_cpu_time_total)

    total = sum(self_time(e) for e in events) or 1.0
    families: dict[str, float] = {}
    for event in events:
        families[family_of(event.key)] = families.get(family_of(event.key), 0.0) + self_time(event)
    lines = [f"# {steps} steps, self {'device' if device else 'CPU'} time {total / 1e3 / steps:.1f} ms per step", "",
             "## by family", ""]
    for family, value in sorted(families.items(), key=lambda kv: -kv[1]):
        lines.append(f"{family:20s} {value / 1e3 / steps:9.1f} ms/step {100 * value / total:5.1f}%")
    lines += ["", "## top operators", ""]
    for event in sorted(events, key=self_time, reverse=True)[:40]:
        lines.append(f"{self_time(event) / 1e3 / steps:9.2f} ms/step {100 * self_time(event) / total:5.1f}% "
                     f"x{event.count // max(1, steps):<6d} {event.key[:110]}")
    return "\n".join(lines) + "\n"
