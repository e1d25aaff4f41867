"""Where a step's time goes: the torch profiler over a few steps of a real run (``TUNEDECK_PROFILE``).

``TUNEDECK_PROFILE=START:COUNT`` (e.g. ``5:2``) records steps START .. START+COUNT-1 and writes
``profile.txt`` into the run directory: the operators by self device time (CPU time on a CPU), and the
same grouped into families (matmuls, attention, element-wise, copies and casts, optimizer, …) as shares
of the recorded time, and on a GPU the host side too (operators and CUDA runtime calls by self CPU time:
what a launch-bound step waits on). For benchmarks and bug reports; a run without the variable pays nothing.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
import traceback
import warnings
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
        self.began = 0.0

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
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.began = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.profiler is not None and state.global_step >= self.start + self.count - 1:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.perf_counter() - self.began
            self.profiler.__exit__(None, None, None)
            text = summarise(self.profiler, self.count, wall)
            if torch.cuda.is_available():
                text += device_idle(self.profiler.events(), self.count)
            self.path.write_text(text, encoding="utf-8")
            log.info("profile of %d steps written to %s", self.count, self.path)
            self.profiler = None
            self.start = 1 << 60  # once


def summarise(profiler: Any, steps: int, wall_s: float | None = None) -> str:
    """Top operators by self device time, and the families' shares; with ``wall_s`` (the recorded steps'
    wall-clock time) also how busy the device was: kernel time far below the wall time means the step
    waits on the CPU (launches, Python), not on the GPU. The profiler's own overhead slows the CPU side,
    so the busy share is a lower bound for the same steps unprofiled."""
    everything = list(profiler.key_averages())
    # On a GPU the kernels alone: an operator's self device time is that of the kernels it launched, so
    # counting both would count each kernel twice.
    kernels = [e for e in everything if _is_kernel(e) and getattr(e, "self_device_time_total", 0)]
    device = bool(kernels)
    events = kernels or everything

    def self_time(event: Any) -> float:
        return float(getattr(event, "self_device_time_total", 0) if device else event.self_cpu_time_total)

    total = sum(self_time(e) for e in events) or 1.0
    families: dict[str, float] = {}
    for event in events:
        families[family_of(event.key)] = families.get(family_of(event.key), 0.0) + self_time(event)
    lines = [f"# {steps} steps, self {'device' if device else 'CPU'} time {total / 1e3 / steps:.1f} ms per step"]
    if wall_s:
        launched = sum(e.count for e in events) / steps
        lines.append(f"wall {wall_s * 1e3 / steps:.1f} ms per step; {'kernels' if device else 'operators'} "
                     f"{100 * total / 1e6 / wall_s:.0f}% of it; {launched:.0f} {'kernels' if device else 'operators'} "
                     f"per step")
    lines += ["", "## by family", ""]
    for family, value in sorted(families.items(), key=lambda kv: -kv[1]):
        lines.append(f"{family:20s} {value / 1e3 / steps:9.1f} ms/step {100 * value / total:5.1f}%")
    lines += ["", "## top operators", ""]
    lines += _top(events, self_time, total, steps, 40)
    if device:
        lines += _host_side(everything, steps)
    return "\n".join(lines) + "\n"


def _is_kernel(event: Any) -> bool:
    return str(getattr(event, "device_type", "")).upper().endswith(("CUDA", "PRIVATEUSE1"))


def _top(events: list[Any], time_of: Any, total: float, steps: int, count: int) -> list[str]:
    """The ``count`` events with the most ``time_of`` (µs), a line each: per step, share of ``total``, calls."""
    return [f"{time_of(event) / 1e3 / steps:9.2f} ms/step {100 * time_of(event) / total:5.1f}% "
            f"x{event.count // max(1, steps):<6d} {event.key[:110]}"
            for event in sorted(events, key=time_of, reverse=True)[:count]]


def _host_side(events: list[Any], steps: int) -> list[str]:
    """On a GPU, where the host's time goes: the operators and CUDA runtime calls by self CPU time. A step
    whose kernels fill little of its wall time waits on these; a long ``cudaStreamSynchronize`` or
    ``cudaMemcpyAsync`` is the CPU waiting for the GPU (an ``.item()``, a device-to-host copy), which
    serialises the two instead of overlapping them."""
    host = [e for e in events if not _is_kernel(e) and getattr(e, "self_cpu_time_total", 0) > 0]
    if not host:
        return []
    total = sum(e.self_cpu_time_total for e in host)
    return ["", f"## host side: self CPU time {total / 1e3 / steps:.1f} ms per step", "",
            *_top(host, lambda e: e.self_cpu_time_total, total, steps, 20)]


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def device_idle(events: Any, steps: int, top: int = 12) -> str:
    """Where the GPU waited between its kernels: the gaps of the recorded steps' timeline (``events``: the
    profiler's events, kernels and host calls on one clock), their total by size, the share that followed
    a host synchronisation (a gap during which a ``cudaStreamSynchronize`` or a blocking copy returned: the
    queue ran dry while the host waited, then the host had to launch again), and the largest gaps with the
    kernels either side. What a step with its kernels far below its wall time waits on."""
    kernels = sorted((float(e.time_range.start), float(e.time_range.end), e.name) for e in events if _is_kernel(e))
    syncs = sorted(float(e.time_range.end) for e in events
                   if not _is_kernel(e) and any(e.name.startswith(name) for name in SYNC_CALLS))
    gaps = []  # (start, end, kernel before, kernel after)
    busy_until, last = None, ""
    for start, end, name in kernels:
        if busy_until is not None and start > busy_until:
            gaps.append((busy_until, start, last, name))
        if busy_until is None or end > busy_until:
            busy_until, last = end, name
    if not gaps:
        return ""
    first = kernels[0][0]
    total = sum(end - start for start, end, *_ in gaps)

    def after_sync(gap: tuple[float, float, str, str]) -> bool:
        at = bisect.bisect_left(syncs, gap[0])
        return at < len(syncs) and syncs[at] <= gap[1]

    synced = [gap for gap in gaps if after_sync(gap)]
    lines = ["", f"## device idle: {total / 1e3 / steps:.1f} ms per step between kernels, in {len(gaps) / steps:.0f} "
                 f"gaps a step", ""]
    for low, high in ((1000.0, float("inf")), (100.0, 1000.0), (10.0, 100.0), (0.0, 10.0)):
        picked = [end - start for start, end, *_ in gaps if low <= end - start < high]
        label = f">= {low / 1e3:g} ms" if high == float("inf") else f"{low / 1e3:g}-{high / 1e3:g} ms"
        lines.append(f"{label:14s} {len(picked) / steps:7.1f} gaps a step {sum(picked) / 1e3 / steps:8.1f} ms/step")
    lines += [f"after a host synchronisation: {len(synced) / steps:.1f} gaps a step, "
              f"{sum(end - start for start, end, *_ in synced) / 1e3 / steps:.1f} ms/step", "",
              "largest gaps (ms; at: ms from the first kernel):", ""]
    for gap in sorted(gaps, key=lambda g: g[0] - g[1])[:top]:
        start, end, before, after = gap
        lines.append(f"{(end - start) / 1e3:7.2f} at {(start - first) / 1e3:8.1f}{' sync' if after_sync(gap) else '     '}"
                     f"  after {before[:45]}  before {after[:45]}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# Where the peak's memory goes: ``TUNEDECK_MEMORY_PROFILE=START[:COUNT]`` records CUDA allocations during
# steps START .. START+COUNT-1 and writes ``memory.txt``: the peak of those steps and the blocks live at it,
# grouped by the code that allocated them (or their sizes). Nothing is synchronised: the allocator's view
# is the CPU's, and a sync at the step boundary would hide a peak that comes from the next step starting
# while the last one still runs. For checking the estimator against the engine; free when unset.

_TORCH_INTERNAL = ("/torch/", "\\torch\\", "<frozen", "/contextlib.py", "/functools.py")


def parse_memory_profile_env(value: str | None) -> tuple[int, int] | None:
    """``"2"`` -> (2, 1), ``"2:2"`` -> (2, 2); anything else -> None."""
    start, _, count = (value or "").partition(":")
    try:
        window = (int(start), int(count or 1))
    except ValueError:
        return None
    return window if window[0] >= 1 and window[1] >= 1 else None


def _site(frames: list[dict[str, Any]], depth: int = 2) -> str:
    """The innermost ``depth`` frames outside torch itself: which code asked for the memory."""
    picked = [f for f in frames if not any(s in str(f.get("filename", "")) for s in _TORCH_INTERNAL)][:depth]
    if not picked:
        picked = frames[:1]
    return " < ".join(f"{Path(str(f.get('filename', '?'))).parent.name}/{Path(str(f.get('filename', '?'))).name}"
                      f":{f.get('line', '?')} {f.get('name', '?')}" for f in picked) or "(no stack)"


def reserved_breakdown(segments: list[dict[str, Any]], device: int, peak_reserved_gib: float) -> str:
    """What the caching allocator holds at the snapshot, by CUDA stream: its segments' size, what is allocated in
    them and the free blocks (how many, the largest): where reserved memory stands above allocated memory (a
    side stream's own pool, or free blocks too small for what is asked)."""
    gib = 1024 ** 3
    by_stream: dict[Any, dict[str, Any]] = {}
    for segment in segments:
        if segment.get("device", device) != device:
            continue
        entry = by_stream.setdefault(segment.get("stream", 0), {"segments": 0, "total": 0, "allocated": 0, "free": []})
        entry["segments"] += 1
        entry["total"] += int(segment.get("total_size", 0))
        entry["allocated"] += int(segment.get("allocated_size", 0))
        entry["free"] += [int(b.get("size", 0)) for b in segment.get("blocks", []) if b.get("state") == "inactive"]
    lines = [f"\n## reserved at the snapshot, by stream (torch max_memory_reserved {peak_reserved_gib:.2f} GiB; "
             f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r})\n"]
    for stream, entry in sorted(by_stream.items(), key=lambda item: -item[1]["total"]):
        free = sorted(entry["free"], reverse=True)
        lines.append(f"stream {stream}: {entry['total'] / gib:.2f} GiB in {entry['segments']} segments, "
                     f"{entry['allocated'] / gib:.2f} allocated, {sum(free) / gib:.2f} free in {len(free)} blocks "
                     f"(largest {', '.join(f'{b / 1024 ** 2:.0f}' for b in free[:6])} MiB)")
    return "\n".join(lines) + "\n"


def peak_breakdown(trace: list[dict[str, Any]], before_bytes: int, top: int = 25) -> str:
    """Replays a CUDA allocator trace (``torch.cuda.memory._snapshot()["device_traces"][d]``): the highest
    total of live blocks, and those live at that moment grouped by allocation site. A block counts until
    its free is requested, as torch's ``memory_allocated`` counts it (a block used on another stream is
    reusable only later, at ``free_completed``, but it is no longer allocated)."""
    frees = {"free_requested"} if any(e.get("action") == "free_requested" for e in trace) else {"free_completed"}
    live: dict[int, dict[str, Any]] = {}
    current = peak = before_bytes
    peak_index = -1
    for index, event in enumerate(trace):
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = event
            current += int(event["size"])
        elif action in frees and event.get("addr") in live:
            current -= int(live.pop(event["addr"])["size"])
        if current > peak:
            peak, peak_index = current, index
    live.clear()
    for event in trace[:peak_index + 1]:
        if event.get("action") == "alloc":
            live[event["addr"]] = event
        elif event.get("action") in frees:
            live.pop(event.get("addr"), None)
    sites: dict[str, list[int]] = {}
    for event in live.values():  # without stacks the sizes tell the tensors apart (tokens x hidden, ...)
        frames = event.get("frames") or []
        site = _site(frames) if frames else f"(no stack) blocks of {int(event['size']) / 2 ** 20:.1f} MiB"
        sites.setdefault(site, []).append(int(event["size"]))
    gib = 1024 ** 3
    lines = [f"peak of the steps {peak / gib:.2f} GiB = {before_bytes / gib:.2f} GiB allocated before them "
             f"(weights, adapters, optimizer state) + {(peak - before_bytes) / gib:.2f} GiB live at event "
             f"{peak_index + 1} of {len(trace)}", "", "## live at the peak, by allocation site", ""]
    for site, sizes in sorted(sites.items(), key=lambda kv: -sum(kv[1]))[:top]:
        lines.append(f"{sum(sizes) / gib:8.3f} GiB  x{len(sizes):<5d} largest {max(sizes) / 2 ** 20:9.1f} MiB  {site}")
    lines += ["", "## largest blocks live at the peak", ""]
    for event in sorted(live.values(), key=lambda e: -int(e["size"]))[:top]:
        lines.append(f"{int(event['size']) / 2 ** 20:9.1f} MiB  {_site(event.get('frames') or [], 4)}")
    return "\n".join(lines) + "\n"


class SyncTraceCallback(TrainerCallback):
    """``TUNEDECK_SYNC_TRACE=START:COUNT``: where steps START .. START+COUNT-1 make the host wait for the GPU.

    A synchronisation (an ``.item()``, a blocking copy, a ``nonzero``) empties the GPU's queue: the kernels
    after it wait for Python to launch them. torch's sync debug mode warns at each; this records the Python
    stack of every one and writes ``syncs.txt`` into the run directory: the sites by count, innermost frame
    last. The window opens at the end of the step before START, so a step's batch upload counts too. For
    benchmarks on a GPU; a run without the variable pays nothing."""

    MESSAGE = "synchronizing CUDA operation"

    def __init__(self, run_dir: Path, start: int, count: int) -> None:
        self.path = Path(run_dir) / "syncs.txt"
        self.start, self.count = start, count
        self.sites: dict[tuple[str, ...], int] = {}
        self.tracing = False
        self._saved: Any = None

    @classmethod
    def from_env(cls, run_dir: Path) -> SyncTraceCallback | None:
        window = parse_profile_env(os.environ.get("TUNEDECK_SYNC_TRACE"))
        if window is None:
            return None
        import torch

        if not torch.cuda.is_available():
            log.warning("TUNEDECK_SYNC_TRACE traces CUDA synchronisations; there is no GPU here: ignored")
            return None
        return cls(run_dir, *window)

    def _show(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None,
              line: Any = None) -> None:
        if self.MESSAGE not in str(message):
            return self._saved[0](message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-1] if "/warnings.py" not in f.filename]
        site = tuple(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-8:])
        self.sites[site] = self.sites.get(site, 0) + 1
        return None

    def _begin(self) -> None:
        import torch

        self._saved = (warnings.showwarning, warnings.filters[:])
        warnings.filterwarnings("always", message=f".*{self.MESSAGE}.*")
        warnings.showwarning = self._show
        torch.cuda.set_sync_debug_mode("warn")
        self.tracing = True

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step + 1 == self.start:
            self._begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.tracing:
            if state.global_step + 1 == self.start:
                self._begin()
            return
        if state.global_step < self.start + self.count - 1:
            return
        import torch

        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning, warnings.filters[:] = self._saved
        self.tracing = False
        self.start = 1 << 60  # once
        total = sum(self.sites.values())
        lines = [f"# {total} host synchronisations in {self.count} steps ({total / self.count:.1f} a step)", ""]
        for site, n in sorted(self.sites.items(), key=lambda kv: -kv[1]):
            lines += [f"{n / self.count:6.1f} a step", *(f"    {frame}" for frame in site), ""]
        self.path.write_text("\n".join(lines), encoding="utf-8")
        log.info("host synchronisations of %d steps written to %s", self.count, self.path)


class MemoryPeakCallback(TrainerCallback):
    """Records the CUDA allocations of the steps ``TUNEDECK_MEMORY_PROFILE`` names; writes ``memory.txt``."""

    def __init__(self, run_dir: Path, start: int, count: int = 1) -> None:
        self.path = Path(run_dir) / "memory.txt"
        self.start, self.count = start, count
        self.before = 0
        self.recording = False

    @classmethod
    def from_env(cls, run_dir: Path) -> MemoryPeakCallback | None:
        window = parse_memory_profile_env(os.environ.get("TUNEDECK_MEMORY_PROFILE"))
        if window is None:
            return None
        import torch

        if not torch.cuda.is_available():
            log.warning("TUNEDECK_MEMORY_PROFILE records CUDA allocations; there is no GPU here: ignored")
            return None
        return cls(run_dir, *window)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.recording and state.global_step + 1 == self.start:
            import torch

            self.before = torch.cuda.memory_allocated()
            # No tracebacks: capturing Python stacks at every allocation made autograd's custom functions
            # (the offload's and the tiled MLP's) fail with a SystemError on the H200 (torch 2.11).
            torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None)
            self.recording = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.recording and state.global_step >= self.start + self.count - 1:
            import torch

            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            self.recording = False
            self.start = 1 << 60  # once
            device = torch.cuda.current_device()
            trace = snapshot["device_traces"][device] if device < len(snapshot["device_traces"]) else []
            text = peak_breakdown(trace, self.before)
            text += f"\ntorch max_memory_allocated {torch.cuda.max_memory_allocated() / 1024 ** 3:.2f} GiB\n"
            text += reserved_breakdown(snapshot.get("segments", []), device,
                                       torch.cuda.max_memory_reserved() / 1024 ** 3)
            self.path.write_text(text, encoding="utf-8")
            log.info("memory at the peak of steps %d-%d written to %s", state.global_step - self.count + 1,
                     state.global_step, self.path)
