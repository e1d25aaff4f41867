"""Probe: a few real steps of the top plans on this box, through the engine, to replace estimates.

Each probe is a short detached run (``max_steps`` few, no checkpoint) started the way ``tunedeck
train`` starts runs; its ``metrics.jsonl`` gives measured tokens/s and the per-rank peak reserved
memory. Results are cached per (model, hardware, plan) in ``<data root>/probe-cache.json`` so later
plans on the same box start from measurements.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.errors import TunedeckError
from core.i18n import t
from core.plan.candidates import Candidate
from core.plan.planner import Recommendation, plan_key
from core.plan.request import PlanRequest
from core.plan.run_config import run_config_values

PROBE_STEPS = 6
PROBE_TOP = 3
PROBE_TIMEOUT_S = 600.0
CACHE_NAME = "probe-cache.json"


class ProbeError(TunedeckError, RuntimeError):
    """A probe run that could not start or did not finish (the message says which and where its log is)."""


def cache_path() -> Path:
    from core.paths import data_root

    return data_root() / CACHE_NAME


def cache_key(request: PlanRequest, key: tuple[Any, ...]) -> str:
    """``model|hardware|plan``: what a measurement is valid for."""
    return "|".join([request.model, request.hardware.describe(), json.dumps(list(key))])


def load_cache() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_cache(cache: dict[str, dict[str, Any]]) -> None:
    from core.atomic_file import write_json_atomic

    cache_path().parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cache_path(), cache)


def cached_measurements(request: PlanRequest) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Measurements of earlier probes that apply to ``request`` (model and hardware), by plan key."""
    prefix = "|".join([request.model, request.hardware.describe()]) + "|"
    out = {}
    for key, value in load_cache().items():
        if key.startswith(prefix):
            out[tuple(json.loads(key[len(prefix):]))] = value
    return out


def measurements_from_metrics(metrics_path: Path, context_gib: float = 0.0) -> dict[str, Any]:
    """Median tokens/s over the train records (the first, warm-up step left out when there are more)
    and the highest per-rank peak reserved memory plus ``context_gib`` (the CUDA context the
    estimator counts and PyTorch does not)."""
    from core.runs.jsonl import iter_records

    records = [r for r in iter_records(metrics_path) if r.get("kind") == "train"]
    if not records:
        raise ProbeError(t("plan.probe.no_metrics", path=str(metrics_path)))
    speeds = [float(r["tokens_per_s"]) for r in records if r.get("tokens_per_s")]
    steady = speeds[1:] if len(speeds) > 1 else speeds
    peaks = [max(r["peak_reserved_gib"]) for r in records if r.get("peak_reserved_gib")]
    return {
        "tokens_per_s": round(statistics.median(steady), 1) if steady else None,
        "peak_gib": round(max(peaks) + context_gib, 3) if peaks else None,
        "steps": len(records),
        "measured_at": time.time(),
    }


def probe_config_values(candidate: Candidate, request: PlanRequest, steps: int) -> dict[str, Any]:
    values = run_config_values(candidate, request)
    values.update({
        # on a box with no GPU the probe trains on the CPU: its name said "1gpu" there (Runs list, status line)
        "name": f"probe-{candidate.plan.method}-"
                + ("cpu" if request.hardware.cpu_only else f"{candidate.plan.num_gpus}gpu"),
        "epochs": None, "max_steps": steps, "warmup_steps": 0, "logging_steps": 1,
        "save_steps": steps + 1, "eval_split": 0.0,
    })
    return values


def probe_one(candidate: Candidate, request: PlanRequest, steps: int = PROBE_STEPS,
              timeout_s: float = PROBE_TIMEOUT_S, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``steps`` real steps of ``candidate`` as a detached run and measure it."""
    from core.config import RunConfig
    from core.paths import data_root
    from core.runs import TERMINAL_STATES, RunError, RunState, effective_status, start_run, stop_run
    from core.runs.launch import PROBE_COMMAND

    config = RunConfig.from_dict(probe_config_values(candidate, request, steps), source="<probe>")
    folder = data_root() / "probes"
    folder.mkdir(parents=True, exist_ok=True)
    yaml_path = config.save(folder / f"{config.name}-{int(time.time() * 1000)}.yaml")
    try:
        run = start_run(yaml_path, command=PROBE_COMMAND)  # marked a probe: the Runs screen keeps it aside
    except RunError as exc:
        raise ProbeError(str(exc)) from exc
    deadline = time.monotonic() + timeout_s
    seen = -1

    def report_step() -> None:
        nonlocal seen
        if progress is None:
            return
        from core.runs.jsonl import last_record

        record = last_record(run.metrics_path, lambda r: r.get("kind") == "train")
        step = (record.get("step") if record else 0) or 0
        if step != seen:
            seen = step
            progress(t("plan.probe.progress", name=config.name, step=seen, steps=steps))

    while True:
        status = effective_status(run)
        if status.status in TERMINAL_STATES:
            report_step()  # the last steps may have come since the last look: say them before the result
            break
        if time.monotonic() > deadline:
            stop_run(run, force=True)
            raise ProbeError(t("plan.probe.timeout", seconds=int(timeout_s), path=str(run.path)))
        report_step()
        time.sleep(0.5)
    if status.status != RunState.FINISHED:
        from core.runs.states import state_label

        raise ProbeError(t("plan.probe.failed", status=state_label(status.status), reason=status.reason_text,
                           path=str(run.path)))
    context = candidate.estimate.breakdown.get("cuda_context", 0.0) if candidate.estimate else 0.0
    result = measurements_from_metrics(run.metrics_path, context if not request.hardware.cpu_only else 0.0)
    result["run_dir"] = str(run.path)
    return result


def probe_candidates(rec: Recommendation, request: PlanRequest, top: int = PROBE_TOP, steps: int = PROBE_STEPS,
                     timeout_s: float = PROBE_TIMEOUT_S, progress: Callable[[str], None] | None = None,
                     ) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Probe the best plan and the first alternatives (one after another: they share the GPUs),
    cache and return the measurements by plan key. Already cached plans are not run again."""
    if not request.hardware.detected:
        raise ProbeError(t("plan.probe.needs_box"))
    candidates = [c for c in [rec.best, *(c for c, _ in rec.alternatives)] if c is not None and c.feasible][:top]
    cache = load_cache()
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for index, candidate in enumerate(candidates, 1):
        key = plan_key(candidate.plan)
        ckey = cache_key(request, key)
        if ckey in cache:
            out[key] = cache[ckey]
            continue
        if progress is not None:
            progress(t("plan.probe.starting", index=index, total=len(candidates), method=candidate.plan.method))
        measured = probe_one(candidate, request, steps, timeout_s, progress)
        cache[ckey] = measured
        save_cache(cache)
        out[key] = measured
    return out
