"""The tiled MLP's launch cost per tile and layer (``Calibration.mlp_tile_s``), from the calibration matrix.

The engine's tiled MLP (``tiled_mlp``) runs its forward, recomputation and backward tile by tile, each
tile's backward its own autograd call, so its cost grows with tiles x tiled layers, not with FLOPs. On the
H200 the matrix's first parts measured it: a 0.5B LoRA at 32k tokens per micro-batch in 37 tiles ran at
12k tokens/s where the estimate without that cost said 83k.

For every finished row of ``bench/results/estimate_matrix/calibration-part*.json`` that ran tiled, this
solves (bisection) for the per-tile cost that makes the estimator's step time equal the measured one,
with the rest of the calibration as it is. Rows where the estimate without the tile cost is already
within 10 % of the measurement are listed and not used: there the GPU's work hides the launches and the
solution only fits the rest of the model's error. The constant per method is the median of the rows used;
DoRA has no tiled row and takes LoRA's, scaled as its per-layer launch time is. Writes
``bench/results/estimate_matrix/mlp-tile-fit.md`` and ``.json``; ``tests/core/test_estimate_engine_switches.py``
fails when ``core/estimate/calibration.py`` drifts from the JSON.

    python bench/mlp_tile_fit.py
"""

from __future__ import annotations

import glob
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import calibration_matrix as cm  # noqa: E402

from core.estimate import estimate, find_gpu, plan_for_model  # noqa: E402
from core.estimate.calibration import DEFAULT_CALIBRATION  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "estimate_matrix"
VISIBLE = 0.10  # rows whose estimate without the tile cost is this much under the measurement are used


def _step_s(plan, gpu, per_tile: float) -> float:
    calibration = replace(DEFAULT_CALIBRATION, mlp_tile_s={m: per_tile for m in DEFAULT_CALIBRATION.mlp_tile_s})
    result = estimate(plan, gpu, calibration, tiles_by_fit=False)  # these rows ran tiled: the engine's rule
    return plan.tokens_per_micro_batch / result.tokens_per_s


def solve(plan, gpu, measured_step_s: float) -> float | None:
    """The per-tile seconds with which the estimated step equals ``measured_step_s`` (None: not reachable)."""
    low, high = 0.0, 0.05
    if _step_s(plan, gpu, high) < measured_step_s:
        return None
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if _step_s(plan, gpu, middle) < measured_step_s else (low, middle)
    return high


def tiled_rows() -> list[dict]:
    rows = {r.name: r for r in cm.ROWS}
    gpu = find_gpu("H200")
    out = []
    for name in sorted(glob.glob(str(RESULTS / "calibration-part*.json"))):
        for rec in json.loads(Path(name).read_text(encoding="utf-8"))["results"]:
            if rec.get("status") != "finished" or (rec.get("estimate") or {}).get("mlp_tiles", 1) <= 1:
                continue
            row = rows[rec["row"]]
            layers = rec.get("checkpoint_layers_run")
            options = cm.plan_options(row, "H200", rec.get("fused_ce_run"), layers if isinstance(layers, int) else None)
            plan = plan_for_model(str(cm.MODELS[row.model][1]), exact_count=False, **options)
            measured = plan.tokens_per_micro_batch / rec["tokens_per_s"]
            without = _step_s(plan, gpu, 0.0)
            used = without < (1 - VISIBLE) * measured
            out.append({"row": rec["row"], "file": Path(name).name, "method": row.method,
                        "tiles": plan.mlp_tiles(True), "tiled_layers": plan.checkpointed_layers,
                        "measured_step_s": round(measured, 4), "estimated_step_s_without": round(without, 4),
                        "per_tile_ms": None if (c := solve(plan, gpu, measured)) is None else round(c * 1e3, 3),
                        "used": used})
    return out


def fit(rows: list[dict]) -> dict[str, float]:
    per_method: dict[str, float] = {}
    for method in ("full", "lora", "qlora"):
        values = [r["per_tile_ms"] for r in rows if r["used"] and r["method"] == method and r["per_tile_ms"]]
        if values:
            per_method[method] = round(statistics.median(values) * 1e-3, 6)
    if "lora" in per_method:
        dispatch = DEFAULT_CALIBRATION.dispatch_s_per_layer_pass
        per_method["dora"] = round(per_method["lora"] * dispatch["dora"] / dispatch["lora"], 6)
    return per_method


def main() -> int:
    rows = tiled_rows()
    constants = fit(rows)
    (RESULTS / "mlp-tile-fit.json").write_text(json.dumps({"mlp_tile_s": constants, "rows": rows}, indent=1) + "\n",
                                               encoding="utf-8")
    lines = ["# The tiled MLP's launch cost per tile and layer (`Calibration.mlp_tile_s`)", "",
             "`python bench/mlp_tile_fit.py` over the finished tiled rows of `calibration-part*.json` (NVIDIA H200, "
             "the engine's `tiled_mlp: auto` of then: every checkpointed block of a micro-batch of 16,384 tokens or "
             "more, tiles of about `hidden_size` tokens). Per row: the per-tile seconds with which the estimated "
             f"step equals the measured one. Used: rows whose estimate without it is more than {VISIBLE:.0%} under "
             "the measurement.", "",
             "| row | method | tiles x tiled layers | measured step s | estimated without s | per tile ms | used |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['row']} | {r['method']} | {r['tiles']} x {r['tiled_layers']} | {r['measured_step_s']} | "
                     f"{r['estimated_step_s_without']} | {r['per_tile_ms']} | {'yes' if r['used'] else 'no'} |")
    lines += ["", "Fit (median of the rows used; DoRA: LoRA's, scaled by the per-layer launch times): "
              + ", ".join(f"{m} {v * 1e3:.3f} ms" for m, v in constants.items()), ""]
    (RESULTS / "mlp-tile-fit.md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
