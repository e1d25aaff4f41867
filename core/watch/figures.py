"""Figures the dashboard derives: durations, MFU, cost so far, the disk a run directory takes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from core import units

# Dense BF16 tensor-core peak per GPU (FLOP/s), by a substring of the NVML name; first match wins.
PEAK_BF16_FLOPS = (
    ("H200", 989e12), ("H100", 989e12), ("H800", 989e12), ("H20", 148e12), ("B200", 2250e12),
    ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L40", 181e12), ("A10", 125e12),
    ("4090", 165e12), ("3090", 71e12), ("V100", 125e12), ("T4", 65e12),
)


def format_duration(seconds: float | None) -> str | None:
    """``core.units.format_duration``, or None when unknown (callers pick their own placeholder)."""
    text = units.format_duration(seconds)
    return None if text == units.UNKNOWN else text


def format_count(value: float | None) -> str | None:
    """``core.units.format_compact`` (chart axes: "12.3k"), or None when unknown."""
    text = units.format_compact(value)
    return None if text == units.UNKNOWN else text


def format_value(value: float | None) -> str:
    """A metric value in at most ~7 characters."""
    if value is None:
        return "–"
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-3 or magnitude >= 1e6):
        return f"{value:.1e}"
    if magnitude >= 1e4:
        return f"{value / 1e3:.1f}k"
    if magnitude >= 100:
        return f"{value:,.0f}"  # 9,309: the thousands separator of every other count
    return f"{value:.4g}"


def peak_flops(gpu_name: str | None) -> float | None:
    if not gpu_name:
        return None
    for needle, flops in PEAK_BF16_FLOPS:
        if needle in gpu_name:
            return flops
    return None


def model_parameters(header: dict[str, Any]) -> float | None:
    """Parameters from the metrics header: recorded, or estimated from a decoder's shape (12·L·h² + V·h)."""
    for key in ("parameters", "num_parameters", "total_parameters"):
        value = header.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    hidden, layers, vocab = header.get("hidden_size"), header.get("num_hidden_layers"), header.get("vocab_size")
    if isinstance(hidden, int) and isinstance(layers, int) and hidden > 0 and layers > 0:
        return 12.0 * layers * hidden * hidden + float(vocab or 0) * hidden
    return None


def mfu(latest: dict[str, Any], header: dict[str, Any], gpu_count: int, gpu_name: str | None) -> float | None:
    """Model FLOPs utilisation: as recorded, else FLOPs per token x tokens/s over the GPUs' dense BF16 peak.

    FLOPs per token: what a tunedeck run's header records (``model_flops_per_token``: forward + backward of
    its method, every attention score, no recomputation: the convention of ``bench/engine_speed.py``), else
    6·params (full fine-tuning's count, for runs of other tools whose method is not known)."""
    recorded = latest.get("mfu")
    if isinstance(recorded, (int, float)):
        return float(recorded)
    tokens = latest.get("tokens_per_s")
    per_token = header.get("model_flops_per_token")
    if not isinstance(per_token, (int, float)) or per_token <= 0:
        params = model_parameters(header)
        per_token = 6.0 * params if params is not None else None
    peak = peak_flops(gpu_name or next(iter(header.get("gpu_names") or []), None))
    if not isinstance(tokens, (int, float)) or per_token is None or peak is None or gpu_count <= 0:
        return None
    return per_token * tokens / (peak * gpu_count)


def steady_tokens_per_s(first: dict[str, Any] | None, latest: dict[str, Any]) -> float | None:
    """Tokens/s over the run's steady steps so far: the tokens trained since the first logged train record
    over the time they took, from the running totals every tunedeck train record carries (``tokens_seen``,
    ``elapsed_s``). The first interval holds the warm-up (compilation, the allocator growing), and one
    interval's rate swings with a busy CPU or a checkpoint save: this is the figure a run list, ``tunedeck
    status`` and the dashboard's header show; the chart keeps every interval's ``tokens_per_s``.

    Until a second interval is logged, and for records without those totals (another trainer's, or a
    resume that went back before ``first``), the latest interval's ``tokens_per_s``."""
    tokens, elapsed = latest.get("tokens_seen"), latest.get("elapsed_s")
    tokens0, elapsed0 = (first or {}).get("tokens_seen"), (first or {}).get("elapsed_s")
    numbers = (tokens, elapsed, tokens0, elapsed0)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers) \
            and elapsed > elapsed0 and tokens >= tokens0:  # type: ignore[operator]
        return (tokens - tokens0) / (elapsed - elapsed0)  # type: ignore[operator]
    rate = latest.get("tokens_per_s")
    return float(rate) if isinstance(rate, (int, float)) and not isinstance(rate, bool) else None


def cost_so_far(elapsed_s: float | None, gpu_count: int, price_per_gpu_hour: float) -> float | None:
    if not price_per_gpu_hour or elapsed_s is None or gpu_count <= 0:
        return None
    return elapsed_s / 3600.0 * gpu_count * price_per_gpu_hour


def directory_size(path: Path | str) -> int:
    """Bytes used by the files under ``path`` (not following links)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def format_bytes(value: int) -> str:
    """A size on disk: ``core.units.format_disk``."""
    return units.format_disk(value)
