"""The estimator's memory constants fitted on the calibration matrix's H200 rows (issue #19).

Each finished row of ``bench/results/estimate_matrix/calibration-*.json`` (``tunedeck train`` on one H200), as
the newest engine measured it, measured three numbers at its peak: NVML's (the whole process), torch's reserved and torch's allocated
memory. Each measures one part of the estimate on its own, so each constant is fitted on its own part,
in this order (a later step uses the earlier ones):

1. ``cuda_context_gib["hopper"]``: NVML above torch's reserved memory, the median over the rows;
2. ``checkpoint_recompute_layers`` (by method, LoRA and QLoRA by path too: ``activations.recompute_key``): how many blocks' worth of activations a checkpointed
   block's recomputation and backward hold. Per row (full checkpointing, the peak in backward) the
   value that makes the estimated tensors (the estimate less context and slack) equal torch's allocated
   peak, found by bisection; the median of each method's rows. A row where the value does not move the
   peak (another phase sets it, or DoRA's weight-norm transient does) tells nothing and is left out;
   a method with no such row keeps its value before the first fit (``BEFORE``);
3. the allocator's slack, torch's reserved above its allocated memory: a floor (the median of the rows
   whose churn is under 5 GiB) and, per kind of churn (``memory.py``: activations, offloaded activations,
   the plain loss's logits, full fine-tuning's gradients), the median of (slack - floor) / churn over the
   rows whose peak churn is that kind alone. The logits share their rows with activations, which are
   taken off first.

The tensors themselves are counted, not fitted (``activations.py``, ``memory.py``): the fit cannot hide a
missing tensor in a constant. Then every row is estimated again with the fitted constants and checked
against the targets of #19 (median |error| <= 4%, worst <= 12%, never more than 5% under NVML's peak).
Writes ``bench/results/estimate_matrix/memory-fit.json`` and ``.md``; ``tests/core/test_estimate_memory.py``
fails when ``core/estimate/calibration.py`` drifts from the JSON.

    python bench/memory_fit.py
"""

from __future__ import annotations

import glob
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import calibration_matrix as cm  # noqa: E402
from results_files import write_results  # noqa: E402

from core.estimate import find_gpu  # noqa: E402
from core.estimate.activations import recompute_key  # noqa: E402
from core.estimate.architecture import count_parameters  # noqa: E402
from core.estimate.calibration import DEFAULT_CALIBRATION, Calibration  # noqa: E402
from core.estimate.gpus import GIB  # noqa: E402
from core.estimate.memory import MemoryPhases, memory_phases  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "estimate_matrix"
SMALL_CHURN_GIB = 5.0  # rows whose peak churn is under this set the slack's floor
TARGETS = {"median_pct": 4.0, "worst_pct": 12.0, "under_pct": -5.0}
# The constants before the first fit (first principles and CPU measurements), for the report's "before".
BEFORE = {"cuda_context_gib_hopper": 0.60, "checkpoint_recompute_layers": {
              "full": 1.25, "lora": 1.6, "lora_fused": 1.6, "dora": 1.6, "qlora": 1.6, "qlora_fused": 1.6},
          "allocator_slack_floor_gib": 0.25, "allocator_slack_fraction": {
              "activations": 0.10, "offloaded_activations": 0.10, "offloaded_activations_qlora": 0.10,
              "plain_ce_logits": 0.10, "gradients": 0.10}}


def unmodelled(plan: Any) -> str | None:
    """Why the estimate does not model what this row ran on the engine of its file (None: it does). Such a row is
    reported and left out of the fit, and the plan's memory domain should say how far off it was (``domain.py``).
    None today: the last such rows, ``qlora_upcast: true``'s, are counted since its fp32 MLP tensors are."""
    return None


def measured_rows() -> list[dict[str, Any]]:
    """The finished rows with all three peaks, each with the plan it ran: of every calibration file, each row as
    the newest engine measured it (``calibration_matrix.merged_records``). Offloaded rows measured before the
    prefetch's fix are left out: their reserve came from a stream pool the engine no longer keeps (the engine
    with the fused kernels measured four of them again, ``calibration-offload-d``)."""
    rows = []
    for rec in cm.merged_records(sorted(glob.glob(str(RESULTS / "calibration-*.json")))):
        ran = cm.plan_as_run(rec)
        if (rec.get("status") != "finished" or ran is None
                or rec.get("peak_source") != "nvml" or not rec.get("torch_peak_allocated_gib")):
            continue
        if ran[1].offloads_activations and cm.engine_generation(rec["file"]) < cm.PREFETCH_GENERATION:
            continue
        rows.append({"row": rec["row"], "file": rec["file"], "plan": ran[1], "nvml_gib": rec["peak_gib"],
                     "allocated_gib": max(rec["torch_peak_allocated_gib"]),
                     "reserved_gib": max(rec["torch_peak_reserved_gib"]), "unmodelled": unmodelled(ran[1])})
    return rows


def phases(plan: Any, calibration: Calibration) -> MemoryPhases:
    arch = plan.architecture
    return memory_phases(arch, count_parameters(arch), plan, find_gpu("H200"), calibration)


def tensors_gib(memory: MemoryPhases) -> float:
    peak = memory.peak
    return (sum(peak.values()) - peak["cuda_context"] - peak["allocator_slack"]) / GIB


def _recompute(calibration: Calibration, key: str, value: float) -> Calibration:
    return replace(calibration, checkpoint_recompute_layers={**calibration.checkpoint_recompute_layers, key: value})


def solve_recompute(row: dict[str, Any], calibration: Calibration, low: float = 1.0, high: float = 3.0) -> float | None:
    """The recompute factor with which the row's estimated tensors equal its allocated peak (None: it does not
    set the peak there, or cannot reach it)."""
    plan = row["plan"]
    if plan.checkpointed_layers != plan.architecture.num_layers:
        return None
    key = recompute_key(plan)

    def tensors(value: float) -> float:
        return tensors_gib(phases(plan, _recompute(calibration, key, value)))

    target = row["allocated_gib"]
    if not tensors(low) < target < tensors(high) or tensors(low + 0.05) == tensors(low):
        return None  # out of reach, or the factor does not move the peak where the search starts
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if tensors(middle) < target else (low, middle)
    return round(high, 3)


def churn_gib(row: dict[str, Any], calibration: Calibration) -> dict[str, float]:
    memory = phases(row["plan"], calibration)
    return {kind: size / GIB for kind, size in memory.churn[memory.peak_phase].items() if size > 0}


def fit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    base = DEFAULT_CALIBRATION
    context = round(statistics.median(r["nvml_gib"] - r["reserved_gib"] for r in rows), 2)
    recompute = dict(BEFORE["checkpoint_recompute_layers"])  # a key without a usable row keeps its first value
    for r in rows:
        r["recompute_solved"] = solve_recompute(r, base)
    for key in recompute:
        values = [r["recompute_solved"] for r in rows if recompute_key(r["plan"]) == key and r["recompute_solved"]]
        if values:
            recompute[key] = round(statistics.median(values), 2)
    calibration = replace(base, checkpoint_recompute_layers=recompute)
    for r in rows:
        r["slack_gib"] = r["reserved_gib"] - r["allocated_gib"]
        r["churn_gib"] = churn_gib(r, calibration)
    floor = round(statistics.median(r["slack_gib"] for r in rows if sum(r["churn_gib"].values()) < SMALL_CHURN_GIB), 2)
    fractions: dict[str, float] = dict(BEFORE["allocator_slack_fraction"])
    for kind in ("activations", "offloaded_activations", "offloaded_activations_qlora", "gradients", "plain_ce_logits"):
        # Rows whose churn is this kind alone; the logits come with activations, whose part is taken off.
        alone = {kind, "activations"} if kind == "plain_ce_logits" else {kind}
        values = [(r["slack_gib"] - floor - sum(fractions[k] * v for k, v in r["churn_gib"].items() if k != kind))
                  / r["churn_gib"][kind] for r in rows if kind in r["churn_gib"] and set(r["churn_gib"]) <= alone]
        if values:
            fractions[kind] = round(max(0.0, statistics.median(values)), 4)
    return {"cuda_context_gib_hopper": context, "checkpoint_recompute_layers": recompute,
            "allocator_slack_floor_gib": floor, "allocator_slack_fraction": fractions}


def calibration_of(constants: dict[str, Any]) -> Calibration:
    base = DEFAULT_CALIBRATION
    return replace(base, cuda_context_gib={**base.cuda_context_gib, "hopper": constants["cuda_context_gib_hopper"]},
                   checkpoint_recompute_layers=constants["checkpoint_recompute_layers"],
                   allocator_slack_floor_gib=constants["allocator_slack_floor_gib"],
                   allocator_slack_fraction=constants["allocator_slack_fraction"])


def check(rows: list[dict[str, Any]], calibration: Calibration, estimated: bool = False) -> dict[str, Any]:
    """Each row's estimate and error with ``calibration`` (``estimated``: the errors the rows carry already)."""
    errors = []
    for r in rows:
        if not estimated:
            memory = phases(r["plan"], calibration)
            r["estimate_gib"] = round(sum(memory.peak.values()) / GIB, 2)
            r["peak_phase"] = memory.peak_phase
            r["error_pct"] = round(100 * (r["estimate_gib"] - r["nvml_gib"]) / r["nvml_gib"], 1)
        errors.append(r["error_pct"])
    median = statistics.median(abs(e) for e in errors)
    worst = max(abs(e) for e in errors)
    under = min(errors)
    return {"rows": len(errors), "median_pct": round(median, 1), "worst_pct": round(worst, 1),
            "most_under_pct": round(under, 1),
            "met": median <= TARGETS["median_pct"] and worst <= TARGETS["worst_pct"] and under >= TARGETS["under_pct"]}


def model_of(row: dict[str, Any]) -> str:
    return row["row"].split("-")[0]


def leave_one_model_out(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each model's rows estimated with constants fitted on the other models' rows alone."""
    out, every = {}, []
    for model in sorted({model_of(r) for r in rows}, key=lambda m: float(m.rstrip("b"))):
        others = [dict(r) for r in rows if model_of(r) != model]
        held = [dict(r) for r in rows if model_of(r) == model]
        out[model] = check(held, calibration_of(fit(others)))
        every += held
    out["all"] = check(every, DEFAULT_CALIBRATION, estimated=True)  # every row, each from the fit without its model
    return out


def render(rows: list[dict[str, Any]], constants: dict[str, Any], quality: dict[str, Any], before: dict[str, Any],
           loo: dict[str, dict[str, Any]], aside: list[dict[str, Any]]) -> str:
    lines = ["# Memory constants fitted on the calibration matrix (`bench/memory_fit.py`, issue #19)", "",
             f"{len(rows)} finished rows of `calibration-*.json` (`tunedeck train`, NVIDIA H200; each row as the newest engine "
             "measured it, offloaded rows from the prefetch's fix on), each with NVML's, "
             "torch's reserved and torch's allocated peak. The method is in the script's docstring: the context from "
             "NVML - reserved, the recompute factors from the allocated peak, the slack from reserved - allocated.", "",
             "## Constants", "",
             f"- CUDA context (Hopper): {constants['cuda_context_gib_hopper']} GiB",
             "- checkpoint recompute layers: " + ", ".join(f"{m} {v}" for m, v in constants["checkpoint_recompute_layers"].items()),
             f"- allocator slack: floor {constants['allocator_slack_floor_gib']} GiB; fractions "
             + ", ".join(f"{k} {v}" for k, v in constants["allocator_slack_fraction"].items()), "",
             "## Peak memory against NVML, all rows", "",
             f"- before (these tensor counts with the constants before the first fit): median |error| {before['median_pct']}%, worst "
             f"{before['worst_pct']}%, most under {before['most_under_pct']}%",
             f"- after: median |error| {quality['median_pct']}%, worst {quality['worst_pct']}%, most under "
             f"{quality['most_under_pct']}% (targets: <= {TARGETS['median_pct']:.0f}%, <= {TARGETS['worst_pct']:.0f}%, "
             f"never under {TARGETS['under_pct']:.0f}%): {'met' if quality['met'] else 'NOT met'}", "",
             "## Leave one model out", "",
             "Each model's rows estimated with the constants fitted on the other models' rows (validation, not the fit):", "",
             "| model | rows | median abs error | worst | most under |", "|---|---|---|---|---|"]
    lines += [f"| {m} | {q['rows']} | {q['median_pct']}% | {q['worst_pct']}% | {q['most_under_pct']}% |" for m, q in loo.items()]
    if aside:
        lines += ["", "## Rows the estimate does not model (reported, not fitted)", "",
                  "| row | NVML GiB | allocated | recompute solved | estimate GiB | error | why |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['row']} | {r['nvml_gib']:.2f} | {r['allocated_gib']:.2f} | {r['recompute_solved'] or '-'} | "
                  f"{r['estimate_gib']:.2f} | {r['error_pct']:+.1f}% | {r['unmodelled']} |" for r in aside]
    lines += ["", "## Rows", "",
             "| row | NVML GiB | reserved | allocated | recompute solved | slack measured | churn GiB by kind | "
             "estimate GiB | phase | error |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        churn = ", ".join(f"{k} {v:.1f}" for k, v in r["churn_gib"].items())
        lines.append(f"| {r['row']} | {r['nvml_gib']:.2f} | {r['reserved_gib']:.2f} | {r['allocated_gib']:.2f} | "
                     f"{r['recompute_solved'] or '-'} | {r['slack_gib']:.2f} | {churn} | {r['estimate_gib']:.2f} | "
                     f"{r['peak_phase']} | {r['error_pct']:+.1f}% |")
    return "\n".join(lines) + "\n"


def domain_of(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The fitted rows' model widths and sequence lengths (``calibration.MEMORY_DOMAIN``)."""
    widths = [r["plan"].architecture.hidden_size for r in rows]
    seqs = [r["plan"].seq_len for r in rows]
    return {"hidden_sizes": [min(widths), max(widths)], "seq_len": [min(seqs), max(seqs)]}


def main() -> int:
    every = measured_rows()
    rows = [r for r in every if not r["unmodelled"]]
    aside = [dict(r) for r in every if r["unmodelled"]]
    before = check([dict(r) for r in rows], calibration_of(BEFORE))
    constants = fit(rows)
    fitted = calibration_of(constants)
    loo = leave_one_model_out(rows)
    quality = check(rows, fitted)
    if aside:
        check(aside, fitted)
        for r in aside:
            r["churn_gib"] = churn_gib(r, fitted)
            r["slack_gib"], r["recompute_solved"] = r["reserved_gib"] - r["allocated_gib"], solve_recompute(
                r, fitted, high=4.0)
    public = [{k: v for k, v in r.items() if k != "plan"} for r in rows]
    unmodelled = [{k: v for k, v in r.items() if k != "plan"} for r in aside]
    text = render(rows, constants, quality, before, loo, aside)
    write_results(RESULTS / "memory-fit.md", {**constants, "quality": quality, "before": before,
                                              "leave_one_model_out": loo, "domain": domain_of(rows), "rows": public,
                                              "unmodelled": unmodelled}, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
