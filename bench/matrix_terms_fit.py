"""Four speed terms the committed fit lacked, solved on the calibration matrix's H200 rows (issue #19).

- ``Calibration.mlp_tile_s``: the tiled MLP's launch cost per tile and tiled layer. The engine's tiled MLP
  (``tiled_mlp``) runs its forward, recomputation and backward tile by tile, each tile's backward its own
  autograd call, so its cost grows with tiles x tiled layers, not with FLOPs: a 0.5B LoRA at 32k tokens
  per micro-batch in 37 tiles ran at 12k tokens/s where the estimate without that cost said 83k.
- ``Calibration.fp32_model_s_per_element``: full fine-tuning in mixed precision (fp32 weights under
  autocast) against pure bf16, a cost per token x hidden x layer: 80-100 ms a step on the 0.5B, 1.5B and
  3B rows, whose token x hidden x layer counts are all 300-350M.
- ``Calibration.dora_output_bytes_per_element``: peft DoRA's fp32 rescaling of every adapted output
  (``speed.dora_output_bytes``), bytes per token x out_feature of the adapted linears and micro-step: the
  profiles showed element-wise and copy kernels, not the weight norm, taking DoRA's extra time.
- ``Calibration.qlora_upcast_bytes_per_element``: ``qlora_upcast: true`` on the engine with the fused LoRA kernels,
  whose grouped node leaves fp32-input linears to peft (``speed.lora_input_bytes``): bytes per token x out_feature
  of the adapted linears and pass, solved on the ``calibration-kernels-*.json`` rows with it (the engine before
  ran every QLoRA row through peft, so the rows of then hold no such difference).

For each finished row of ``bench/results/estimate_matrix/calibration-part*.json`` that the term concerns
(tiled; mixed-precision full; DoRA; the upcast's rows as above), this solves (bisection) for the constant that makes the estimator's step
equal the measured one, the rest of the calibration as it is. Tiled rows whose estimate without the tile
cost is already within 10 % of the measurement are listed and not used: there the GPU's work hides the
launches and the solution only fits the rest of the model's error. Each constant is the median of the rows
used; DoRA has no tiled row and takes LoRA's tile cost, scaled as its per-layer launch time is. Writes
``bench/results/estimate_matrix/matrix-terms-fit.md`` and ``.json``; ``tests/core/test_estimate_engine_switches.py``
fails when ``core/estimate/calibration.py`` drifts from the JSON.

    python bench/matrix_terms_fit.py
"""

from __future__ import annotations

import glob
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import calibration_matrix as cm  # noqa: E402
from results_files import write_results  # noqa: E402  (bench/ is not a package)

from core.estimate import estimate, find_gpu  # noqa: E402
from core.estimate.calibration import DEFAULT_CALIBRATION, Calibration  # noqa: E402
from core.estimate.speed import lora_output_elements  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "estimate_matrix"
VISIBLE = 0.10  # tiled rows whose estimate without the tile cost is this much under the measurement are used


def _tile(value: float) -> Calibration:
    return replace(DEFAULT_CALIBRATION, mlp_tile_s={m: value for m in DEFAULT_CALIBRATION.mlp_tile_s})


def _fp32(value: float) -> Calibration:
    return replace(DEFAULT_CALIBRATION, fp32_model_s_per_element=value)


def _dora(value: float) -> Calibration:
    return replace(DEFAULT_CALIBRATION, dora_output_bytes_per_element=value)


def _upcast(value: float) -> Calibration:
    return replace(DEFAULT_CALIBRATION, qlora_upcast_bytes_per_element=value)


TERMS = {"mlp_tile_s": (_tile, 0.05), "fp32_model_s_per_element": (_fp32, 1e-8),
         "dora_output_bytes_per_element": (_dora, 5000.0), "qlora_upcast_bytes_per_element": (_upcast, 5000.0)}
UPCAST_FILES = "calibration-kernels-*.json"  # the engine with the fused kernels


def _step_s(plan: Any, calibration: Calibration) -> float:
    result = estimate(plan, find_gpu("H200"), calibration, tiles_by_fit=False)  # the tiles as the row ran them
    return plan.tokens_per_micro_batch / result.tokens_per_s


def solve(plan: Any, term: str, measured_step_s: float) -> float | None:
    """The term's value with which the estimated step equals ``measured_step_s`` (None: not reachable)."""
    make, high = TERMS[term]
    low = 0.0
    if _step_s(plan, make(high)) < measured_step_s or _step_s(plan, make(0.0)) > measured_step_s:
        return None
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if _step_s(plan, make(middle)) < measured_step_s else (low, middle)
    return high


def _records() -> list[tuple[str, dict[str, Any]]]:
    """(file name, record) of every row of the ``calibration-part*.json`` files and of the engine with the fused
    kernels' (``UPCAST_FILES``, read for the upcast's rows only)."""
    return [(Path(name).name, rec) for pattern in ("calibration-part*.json", UPCAST_FILES)
            for name in sorted(glob.glob(str(RESULTS / pattern)))
            for rec in json.loads(Path(name).read_text(encoding="utf-8"))["results"]]


def term_rows() -> list[dict[str, Any]]:
    out = []
    for name, rec in _records():
        ran = cm.plan_as_run(rec)
        if rec.get("status") != "finished" or ran is None:
            continue
        row, plan = ran
        fused_engine = cm.engine_generation(name) >= cm.KERNELS_GENERATION
        upcast = plan.qlora_upcast and fused_engine
        tiled = plan.tiles_mlp and not fused_engine
        fp32 = row.method == "full" and not row.pure_bf16 and not fused_engine
        dora = row.method == "dora" and not fused_engine
        if not (tiled or fp32 or dora or upcast):
            continue
        term = ("fp32_model_s_per_element" if fp32 else "dora_output_bytes_per_element" if dora
                else "qlora_upcast_bytes_per_element" if upcast else "mlp_tile_s")
        measured = plan.tokens_per_micro_batch / rec["tokens_per_s"]
        without = _step_s(plan, TERMS[term][0](0.0))
        value = solve(plan, term, measured)
        # what the term is per: token x hidden x layer; DoRA: token x adapted out_feature; the upcast: that x
        # pass (forward, backward and recompute)
        per_token = plan.architecture.hidden_size * plan.architecture.num_layers
        if dora:
            per_token = lora_output_elements(plan.architecture, plan)
        elif upcast:
            per_token = lora_output_elements(plan.architecture, plan) * (2 + plan.recompute_fraction)
        out.append({"row": rec["row"], "file": name, "method": row.method, "term": term,
                    "tiles": plan.mlp_tiles(True) if tiled else 1, "tiled_layers": plan.checkpointed_layers if tiled else 0,
                    "elements": plan.tokens_per_micro_batch * per_token,
                    "measured_step_s": round(measured, 4), "estimated_step_s_without": round(without, 4),
                    "value": None if value is None else float(f"{value:.4g}"),
                    "used": value is not None and (fp32 or dora or upcast or without < (1 - VISIBLE) * measured)})
    return out


def fit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tiles: dict[str, float] = {}
    for method in ("full", "lora", "qlora"):
        values = [r["value"] for r in rows if r["used"] and r["term"] == "mlp_tile_s" and r["method"] == method]
        if values:
            tiles[method] = round(statistics.median(values), 6)
    if "lora" in tiles:
        dispatch = DEFAULT_CALIBRATION.dispatch_s_per_layer_pass
        tiles["dora"] = round(tiles["lora"] * dispatch["dora"] / dispatch["lora"], 6)
    fp32 = [r["value"] for r in rows if r["used"] and r["term"] == "fp32_model_s_per_element"]
    dora = [r["value"] for r in rows if r["used"] and r["term"] == "dora_output_bytes_per_element"]
    upcast = [r["value"] for r in rows if r["used"] and r["term"] == "qlora_upcast_bytes_per_element"]
    return {"mlp_tile_s": tiles, "fp32_model_s_per_element": float(f"{statistics.median(fp32):.3g}") if fp32 else 0.0,
            "dora_output_bytes_per_element": round(statistics.median(dora), 1) if dora else 0.0,
            "qlora_upcast_bytes_per_element": round(statistics.median(upcast), 1) if upcast else 0.0}


def main() -> int:
    rows = term_rows()
    constants = fit(rows)
    lines = ["# Four speed terms solved on the calibration matrix (`Calibration.mlp_tile_s`, "
             "`fp32_model_s_per_element`, `dora_output_bytes_per_element`, `qlora_upcast_bytes_per_element`)", "",
             "`python bench/matrix_terms_fit.py` over the finished rows of `calibration-part*.json` (NVIDIA H200) "
             "that each term concerns: the tiled rows (the engine's `tiled_mlp: auto` of then: every "
             "checkpointed block of a micro-batch of 16,384 tokens or more, tiles of about `hidden_size` "
             "tokens), the mixed-precision full rows and the DoRA rows, and the `qlora_upcast: true` rows of "
             "`calibration-kernels-*.json` (the engine with the fused kernels). Per row: the value with which the estimated step "
             f"equals the measured one. Tiled rows are used where the estimate without the tile cost is more "
             f"than {VISIBLE:.0%} under the measurement.", "",
             "| row | term | method | tiles x tiled layers | elements (tokens x hidden x layers; DoRA: tokens x "
             "adapted out_features; the upcast: that x passes) | measured step s | "
             "estimated without s | value | used |", "|---|---|---|---|---|---|---|---|---|"]
    units = {"mlp_tile_s": lambda v: f"{v * 1e3:.3f} ms", "fp32_model_s_per_element": lambda v: f"{v * 1e12:.0f} ps",
             "dora_output_bytes_per_element": lambda v: f"{v:.0f} B", "qlora_upcast_bytes_per_element": lambda v: f"{v:.1f} B"}
    for r in rows:
        value = "-" if r["value"] is None else units[r["term"]](r["value"])
        lines.append(f"| {r['row']} | {r['term']} | {r['method']} | {r['tiles']} x {r['tiled_layers']} | "
                     f"{r['elements'] / 1e6:,.0f}M | {r['measured_step_s']} | {r['estimated_step_s_without']} | "
                     f"{value} | {'yes' if r['used'] else 'no'} |")
    lines += ["", "Fit (medians of the rows used; DoRA's tile cost: LoRA's, scaled by the per-layer launch times): "
              + ", ".join(f"tile {m} {v * 1e3:.3f} ms" for m, v in constants["mlp_tile_s"].items())
              + f"; fp32 model {constants['fp32_model_s_per_element'] * 1e12:.0f} ps per token x hidden x layer"
              + f"; DoRA outputs {constants['dora_output_bytes_per_element']:.0f} B per token x adapted out_feature "
              "and micro-step"
              + f"; the upcast's fp32 outputs {constants['qlora_upcast_bytes_per_element']:.1f} B per token x adapted "
              "out_feature and pass", ""]
    write_results(RESULTS / "matrix-terms-fit.md", {**constants, "rows": rows}, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
