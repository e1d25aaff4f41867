"""Fit the estimator's speed constants to the committed H200 measurements; report the fit (no GPU needed).

Fitted data: the current engine (``tunedeck train`` with its defaults of December 2026: Liger's fused
loss, bf16 LoRA inputs, fused AdamW, packing, the tiled MLP), one H200, read from the committed files:
- ``bench/results/engine-speed-{lora-a,lora-b,qlora,dropout0,full,full-b}.json`` (``bench/engine_speed.py``):
  the finished ``tunedeck`` rows, b4 x 2048 with checkpointing, the ``checkpoint_layers=auto`` and
  ``lora_input_upcast=true`` switch rows, dropout 0, and the wizard's plans (b8 x 2048, accumulation 2,
  no checkpointing); tokens/s = non-padding tokens over wall time from step 4 (every row is full length:
  the bench's conversations are longer than the sequence). Each row's plan is built from the config the
  JSON records (batch, accumulation, checkpointing and the layers the run checkpointed, dropout, upcast,
  pure bf16, optimizer, fused loss). ``compile_layers=true`` (one row, off by default, slower than eager)
  is a code path the estimator does not model: reported, not fitted;
- ``bench/results/engine-longctx-*.json`` (``bench/engine_longctx.py``): the finished rows, batch 1 from
  32k to 192k tokens, checkpointing with ``offload_activations`` and the tiled MLP (the † rows of the
  summary have a memory artefact only; their speed counts). The 393k row is one step with the warm-up in
  it, a lower bound: reported, not fitted. Failed and stopped rows are left out.
Repeated runs of one configuration (six of 7B QLoRA at 32k) share one configuration's weight in the fit,
and leave-one-out leaves the whole configuration out.

Other engine, reported only: the plain transformers + peft loop of ``estimate_matrix/estimate_matrix.json``
and the older engine's ``engine-*.json`` (1024-token rows, peft's fp32 LoRA inputs, no Liger RMSNorm/
SwiGLU, the first runs without Liger at all). They measured other code, so they no longer fit the
constants; their rows show how far the current constants are from that code. The data-parallel constants
(dp0-dp3) are still those solved on the older engine's 2-GPU rows (no current-engine multi-GPU row); the
dispatch constants (CPU launch time per layer) those fitted on its launch-bound 0.5B rows (every
current-engine row is a GPU-bound 7B/8B one and cannot tell them).

Fit: least squares on log(estimate / measured) over the free constants (Nelder-Mead in log space, pure
Python). "Before" is the estimator as committed before this refit (d674802: full s^2 attention at the
method's GEMM efficiency, constants of the older engine), recorded in ``BEFORE``.

    python bench/estimate_calibrate.py            # prints the table and the constants
    python bench/estimate_calibrate.py --write    # also writes bench/results/estimate_calibration.md
    python bench/estimate_calibrate.py --matrix   # a preview: the fit with the #19 matrix's rows too

``--matrix`` adds the finished rows of ``bench/results/estimate_matrix/calibration-part*.json`` (0.5B-7B,
``tunedeck train`` on the H200) to the fit and frees the CPU launch constants (their 0.5B rows identify
them); tiled rows and mixed-precision full rows (``bench/matrix_terms_fit.py`` fits the tiles' cost and the
fp32 model's on them) are reported, not fitted. It is never written: the committed fit stays the one
above until the matrix is complete; ``estimate_matrix/refit-preview.md`` is its output on the parts
measured so far.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.estimate import DEFAULT_CALIBRATION, Calibration, count_parameters, find_gpu, plan_for_model  # noqa: E402
from core.estimate.architecture import lora_parameter_count  # noqa: E402
from core.estimate.plan import TrainingPlan, normalise_optimizer  # noqa: E402
from core.estimate.speed import estimate_speed  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MATRIX_JSON = RESULTS / "estimate_matrix" / "estimate_matrix.json"
REPORT = RESULTS / "estimate_calibration.md"
SPEED_FILES = ("lora-a", "lora-b", "qlora", "dropout0", "full", "full-b")
CONFIGS = {"7b": ROOT / "bench" / "configs" / "qwen2.5-7b.json", "8b": ROOT / "bench" / "configs" / "llama-3-8b.json"}
MODEL_NAMES = {"7b": "Qwen2.5-7B", "8b": "Llama-3-8B"}
ENGINE_MODELS = {"qwen2.5-0.5b-random": "Qwen2.5-0.5B", "qwen2.5-7b-random": "Qwen2.5-7B"}
ENGINE_SIZES = {"qwen2.5-0.5b-random": "0.5b", "qwen2.5-7b-random": "7b"}
# Files written before the runner stopped hiding the carried wheels: liger-kernel was not importable.
ENGINE_PLAIN_CE_FILES = {"engine-0.5b.json", "engine-7b-a.json", "engine-multi.json"}
# The constants fitted (log-space), with their starting values. The big-GEMM efficiency of full
# fine-tuning is pinned (what large bf16 cuBLAS GEMMs reach on Hopper, ~700-750 of 989 TFLOPs): with two
# hidden sizes (3584, 4096) it trades off against hidden_half, which the full rows then fix; LoRA's is
# fitted under the same hidden term, the attention kernels' on their own.
FREE = ("eff_lora", "hidden_half", "attn")
# With --matrix (the #19 calibration matrix's rows, 0.5B to 7B) the CPU launch constants are identified too.
DISPATCH = ("disp_full", "disp_lora", "disp_dora", "disp_qlora")
PINNED = {"eff_full": 0.72}
# Kept as they are (see the module docstring): not identified by the current-engine rows.
KEPT = (*DISPATCH, "dp0", "dp1", "dp2", "dp3")
# The constants before this refit (d674802), for the report.
BEFORE_VALUES = {"eff_full": 0.72, "eff_lora": 0.497, "hidden_half": 3530.0, "attn": None}


@dataclass
class Row:
    """One measurement and the plan that describes it."""

    source: str
    name: str
    plan: TrainingPlan
    measured_tps: float  # tokens/s of all GPUs
    note: str = ""
    kind: str = "short"  # short / long: fitted; excluded: current engine, reported; other: another engine
    group: str = ""  # the configuration (repeated runs share it)

    @property
    def key(self) -> str:
        return f"{self.source} | {self.name}"

    @property
    def fitted(self) -> bool:
        return self.kind in ("short", "long", "cal")


def _engine_plan(model: str, method: str, config: dict[str, Any], result: dict[str, Any], seq: int) -> TrainingPlan:
    """The plan of one current-engine run, from what its JSON records."""
    checkpointing = bool(config.get("gradient_checkpointing"))
    layers = result.get("checkpoint_layers_run")  # what the trainer resolved (auto -> a number; None: all)
    options: dict[str, Any] = {
        "method": method,
        "precision": "pure-bf16" if method == "full" and config.get("pure_bf16") else "bf16",
        "micro_batch_size": int(config.get("micro_batch_size") or result.get("micro") or 1),
        "seq_len": seq,
        "grad_accum_steps": int(config.get("gradient_accumulation") or 1),
        "gradient_checkpointing": checkpointing and layers != 0,
        "checkpoint_layers": None if layers in (None, 0) else int(layers),
        "optimizer": normalise_optimizer(result.get("optimizer") or "auto"),
        "fused_ce": result.get("fused_ce") not in (None, "none"),
        "fused_ce_impl": "chunked" if result.get("fused_ce") == "chunked" else "liger",
        "offload_activations": bool(config.get("offload_activations")),
        "tiled_mlp": config.get("tiled_mlp") or result.get("tiled_mlp_run") or "auto",
    }
    if method != "full":
        options.update(lora_rank=16, lora_dropout=float(config.get("lora_dropout") or 0.0),
                       lora_input_upcast=bool(config.get("lora_input_upcast")))
    return plan_for_model(str(CONFIGS[model]), exact_count=False, **options)


def _label(plan: TrainingPlan, model: str) -> str:
    parts = [MODEL_NAMES[model], plan.method, f"b{plan.micro_batch_size}xs{plan.seq_len}"]
    if plan.grad_accum_steps > 1:
        parts.append(f"ga{plan.grad_accum_steps}")
    layers = plan.checkpointed_layers
    parts.append("ckpt" if layers == plan.architecture.num_layers else f"ckpt {layers}/{plan.architecture.num_layers}"
                 if layers else "nockpt")
    if plan.precision != "bf16":
        parts.append(plan.precision)
    if plan.uses_lora and plan.lora_dropout == 0:
        parts.append("dropout0")
    if plan.lora_input_upcast:
        parts.append("upcast")
    if plan.offload_activations:
        parts.append("offload")
    return " ".join(parts)


def _speed_rows() -> list[Row]:
    rows = []
    for name in SPEED_FILES:
        path = RESULTS / f"engine-speed-{name}.json"
        for result in json.loads(path.read_text())["results"]:
            engine = result["engine"]
            if not engine.startswith("tunedeck") or result.get("status") != "finished" or not result.get("tokens_per_s"):
                continue
            config = result["config"]
            plan = _engine_plan("7b", result["method"], config, result, int(result["seq"]))
            label = _label(plan, "7b") + (" (wizard plan)" if result.get("plan") else "")
            kind = "excluded" if config.get("compile_layers") else "short"
            if kind == "excluded":
                label += " compile_layers"
            note = f"{engine}, row {result['row']}"
            if kind == "excluded":
                note += "; compile_layers: not modelled"
            elif name == "lora-a":
                note += "; ran before lora_fused_add (+3.3% in the lora-b call), which the plan cannot say"
            rows.append(Row(path.name, label, plan, float(result["tokens_per_s"]), note, kind))
    return rows


def _longctx_rows() -> list[Row]:
    rows = []
    for path in sorted(RESULTS.glob("engine-longctx-*.json")):
        data = json.loads(path.read_text())
        recorder = "--memory-profile" in str(data["meta"].get("command", ""))
        for result in data["results"]:
            if result.get("status") != "finished" or not result.get("tokens_per_s"):
                continue
            model = result["model"]
            plan = _engine_plan(model, result["method"], result["config"], result, int(result["seq"]))
            one_step = result.get("rate_from") == "one step" or int(result.get("steps") or 0) < 2
            note = f"{result['steps']} steps" + ("; memory recorder on" if recorder else "")
            if one_step:
                note = "one step, warm-up included: a lower bound"
            rows.append(Row(path.name, _label(plan, model), plan, float(result["tokens_per_s"]), note,
                            "excluded" if one_step else "long"))
    return rows


def _calibration_rows() -> list[Row]:
    """The #19 calibration matrix's finished rows (``bench/calibration_matrix.py``, ``tunedeck train`` on the
    H200, packed rows: every token counts), each with the plan of what it ran (``plan_as_run``)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import calibration_matrix as cm

    rows = []
    for path in sorted((RESULTS / "estimate_matrix").glob("calibration-part*.json")):
        for result in json.loads(path.read_text())["results"]:
            ran = cm.plan_as_run(result)
            if ran is None or result.get("status") != "finished" or not result.get("tokens_per_s"):
                continue
            row, plan = ran
            kind, note = "cal", f"{result['steps']} steps"
            if plan.tiles_mlp:
                kind, note = "excluded", note + f"; tiled MLP ({plan.mlp_tiles(True)} tiles): bench/matrix_terms_fit.py fits its cost"
            elif row.method == "full" and not row.pure_bf16:
                kind, note = "excluded", note + "; mixed-precision full: bench/matrix_terms_fit.py fits its fp32 cost"
            rows.append(Row(path.name, row.name, plan, float(result["tokens_per_s"]), note, kind))
    return rows


def _matrix_rows() -> list[Row]:
    data = json.loads(MATRIX_JSON.read_text())
    rows = []
    for row in data["rows"]:
        measured = row.get("measured", {})
        if measured.get("status") != "ok":
            continue
        options = {k: v for k, v in row["config"].items() if k != "model"}
        # The matrix worker prepares QLoRA the plain way (fp32 upcast of the unquantised parameters), and
        # peft upcasts every LoRA input.
        plan = plan_for_model(row["config"]["model"], kbit_upcast=True, lora_input_upcast=True, **options)
        times = measured.get("step_times_s", [])[1:]
        spread = f"timed steps {', '.join(f'{t:.2f}' for t in times)} s" if times else ""
        rows.append(Row("matrix", row["name"], plan, float(measured["tokens_per_s"]), spread, "other"))
    return rows


# The settings of the older engine's runs (bench/engine_gpu.py's plans when they ran, commit 329c5a9).
SINGLE_GPU_PLANS: dict[str, dict[str, dict[str, Any]]] = {
    "0.5b": {
        "lora": {"micro_batch_size": 8, "gradient_checkpointing": False},
        "dora": {"micro_batch_size": 8, "gradient_checkpointing": False},
        "qlora": {"micro_batch_size": 8, "gradient_checkpointing": True},
        "full": {"micro_batch_size": 8, "gradient_checkpointing": False},
    },
    "7b": {
        "lora": {"micro_batch_size": 4, "gradient_checkpointing": True},
        "dora": {"micro_batch_size": 4, "gradient_checkpointing": True},
        "qlora": {"micro_batch_size": 4, "gradient_checkpointing": True},
        "full": {"micro_batch_size": 2, "gradient_checkpointing": True, "pure_bf16": True},
    },
}
MULTI_GPU_PLANS = {"ddp": {"zero_stage": 0}, "zero2": {"zero_stage": 2}, "zero3": {"zero_stage": 3}}


def _old_engine_rows() -> list[Row]:
    rows = []
    for path in sorted(RESULTS.glob("engine-*.json")):
        if path.name.startswith(("engine-speed-", "engine-longctx-")):
            continue  # the current engine's files (above)
        data = json.loads(path.read_text())
        seq = int(data["meta"]["seq_len"])
        for run in data["runs"]:
            if run.get("status") != "finished" or not run.get("samples_per_s"):
                continue
            model = ENGINE_MODELS[run["model"]]
            gpus = int(run.get("gpus") or 1)
            if gpus > 1:
                mode = run["name"].rsplit("-", 1)[-1]
                settings = {"micro_batch_size": 8, "gradient_checkpointing": False, **MULTI_GPU_PLANS[mode]}
            else:
                settings = dict(SINGLE_GPU_PLANS[ENGINE_SIZES[run["model"]]][run["method"]])
            precision = "pure-bf16" if settings.pop("pure_bf16", False) else "bf16"
            # These runs predate the engine's qlora_upcast and lora_input_upcast switches: peft upcast both.
            plan = plan_for_model(model, method=run["method"], precision=precision, seq_len=seq, num_gpus=gpus,
                                  kbit_upcast=True, lora_input_upcast=True, optimizer="adamw",
                                  fused_ce=path.name not in ENGINE_PLAIN_CE_FILES, **settings)
            padded = float(run["samples_per_s"]) * seq  # padded rows: the work the GPU does
            label = (f"{model} {run['method']} b{plan.micro_batch_size}xs{seq} "
                     f"{'ckpt' if plan.gradient_checkpointing else 'nockpt'} "
                     f"{'fusedCE' if plan.fused_ce else 'plainCE'}"
                     + (f" {precision}" if precision != "bf16" else "")
                     + (f" {gpus}GPU ZeRO-{plan.zero_stage}" if gpus > 1 else ""))
            rows.append(Row(path.name, label, plan, padded, f"{run['tokens_per_s']:.0f} non-padding tok/s", "other"))
    return rows


def _plan_key(plan: TrainingPlan) -> str:
    return repr(replace(plan, architecture=None, exact_total_params=None))


def load_rows(matrix: bool = False) -> list[Row]:
    """Every measurement: the current engine's (fitted, then the excluded ones), then the other engines';
    ``matrix``: with the #19 calibration matrix's rows (``--matrix``)."""
    current = _speed_rows() + _longctx_rows() + (_calibration_rows() if matrix else [])
    for row in current:
        row.group = _plan_key(row.plan) + row.plan.architecture.name
    return current + _matrix_rows() + _old_engine_rows()


# ----------------------------------------------------------------------------------------------------
# The calibration being fitted
# ----------------------------------------------------------------------------------------------------

def calibration_from(values: dict[str, float], base: Calibration = DEFAULT_CALIBRATION) -> Calibration:
    """A Calibration with the Hopper efficiencies, hidden term, attention and dispatch constants set to ``values``."""
    efficiency = {family: dict(table) for family, table in base.efficiency.items()}
    efficiency["hopper"] = {"full": values["eff_full"], "lora": values["eff_lora"],
                            "dora": values["eff_lora"], "qlora": values["eff_lora"]}
    attention = {**base.attention_efficiency, "hopper": values["attn"]}
    dispatch = {"full": values["disp_full"], "lora": values["disp_lora"], "dora": values["disp_dora"],
                "qlora": values["disp_qlora"]}
    data_parallel = dict(base.data_parallel_s_per_layer)
    for stage in (0, 1, 2, 3):
        if f"dp{stage}" in values:
            data_parallel[stage] = values[f"dp{stage}"]
    return replace(base, efficiency=efficiency, hidden_half_efficiency=values["hidden_half"],
                   attention_efficiency=attention, dispatch_s_per_layer_pass=dispatch,
                   data_parallel_s_per_layer=data_parallel)


def current_values(calibration: Calibration = DEFAULT_CALIBRATION) -> dict[str, float]:
    return {
        "eff_full": calibration.efficiency["hopper"]["full"], "eff_lora": calibration.efficiency["hopper"]["lora"],
        "hidden_half": calibration.hidden_half_efficiency, "attn": calibration.attention_efficiency["hopper"],
        **{f"disp_{m}": calibration.dispatch_s_per_layer_pass[m] for m in ("full", "lora", "dora", "qlora")},
        **{f"dp{s}": calibration.data_parallel_s_per_layer[s] for s in (0, 1, 2, 3)},
    }


def _trainable(plan: TrainingPlan) -> int:
    counts = count_parameters(plan.architecture)
    if plan.method == "full":
        return counts.total
    return lora_parameter_count(plan.architecture, plan.lora_rank, plan.lora_targets, dora=plan.method == "dora")


def predict(row: Row, calibration: Calibration) -> float:
    """The estimator's tokens/s (all GPUs) for one row."""
    arch = row.plan.architecture
    counts = count_parameters(arch)
    return estimate_speed(arch, counts, row.plan, find_gpu("H200"), calibration, trainable=_trainable(row.plan)).tokens_per_s


# ----------------------------------------------------------------------------------------------------
# Fitting
# ----------------------------------------------------------------------------------------------------

def _weights(rows: list[Row]) -> list[float]:
    """One configuration, one weight: repeated runs of a plan share it."""
    sizes: dict[str, int] = {}
    for row in rows:
        sizes[row.group] = sizes.get(row.group, 0) + 1
    return [1.0 / sizes[row.group] for row in rows]


def _loss(rows: list[Row], weights: list[float], values: dict[str, float]) -> float:
    calibration = calibration_from(values)
    return sum(w * math.log(predict(row, calibration) / row.measured_tps) ** 2
               for row, w in zip(rows, weights, strict=True))


def nelder_mead(func, start: list[float], step: float = 0.3, iterations: int = 1500, tol: float = 1e-10) -> list[float]:
    """Minimise ``func`` from ``start`` (the classic simplex method; enough for a handful of constants)."""
    n = len(start)
    simplex = [list(start)] + [[x + (step if i == j else 0.0) for j, x in enumerate(start)] for i in range(n)]
    scores = [func(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=scores.__getitem__)
        simplex, scores = [simplex[i] for i in order], [scores[i] for i in order]
        if abs(scores[-1] - scores[0]) < tol:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        r_score = func(reflected)
        if r_score < scores[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            e_score = func(expanded)
            simplex[-1], scores[-1] = (expanded, e_score) if e_score < r_score else (reflected, r_score)
        elif r_score < scores[-2]:
            simplex[-1], scores[-1] = reflected, r_score
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            c_score = func(contracted)
            if c_score < scores[-1]:
                simplex[-1], scores[-1] = contracted, c_score
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p, strict=True)] for p in simplex[1:]]
                scores = [scores[0]] + [func(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=scores.__getitem__)]


def fit(rows: list[Row], start: dict[str, float], free: tuple[str, ...] = FREE) -> dict[str, float]:
    """Weighted least squares in log space over the ``free`` constants (the others stay as in ``start``)."""
    weights = _weights(rows)

    def objective(x: list[float]) -> float:
        return _loss(rows, weights, {**start, **{k: math.exp(v) for k, v in zip(free, x, strict=True)}})

    x = [math.log(start[k]) for k in free]
    for _ in range(3):  # restarts: the simplex collapses early on ridges
        x = nelder_mead(objective, x)
    return {**start, **{k: math.exp(v) for k, v in zip(free, x, strict=True)}}


def leave_one_out(rows: list[Row], fitted: dict[str, float], free: tuple[str, ...] = FREE) -> dict[str, float]:
    """Each fitted row predicted by a fit without its configuration (its repeats left out with it)."""
    out: dict[str, float] = {}
    fitted_rows = [r for r in rows if r.fitted]
    for group in dict.fromkeys(r.group for r in fitted_rows):
        others = [r for r in fitted_rows if r.group != group]
        calibration = calibration_from(fit(others, fitted, free))
        for row in fitted_rows:
            if row.group == group:
                out[row.key] = predict(row, calibration)
    return out


# ----------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------

def _err(estimated: float, measured: float) -> float:
    return 100.0 * (estimated - measured) / measured


def _summary(errors: list[float]) -> str:
    if not errors:
        return "–"
    absolute = [abs(e) for e in errors]
    return f"median |err| {statistics.median(absolute):.0f} %, worst {max(errors, key=abs):+.0f} %"


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _errfmt(value: float | None, measured: float) -> str:
    return "–" if value is None else f"{_err(value, measured):+.0f}"


TITLES = {
    "short": "Current engine, short context (fitted)",
    "long": "Current engine, long context (fitted)",
    "cal": "Current engine, the #19 calibration matrix (fitted)",
    "excluded": "Current engine, not fitted",
    "other": "Other engines (reported, not fitted)",
}


def build_report(rows: list[Row], fitted: dict[str, float], loo: dict[str, float], free: tuple[str, ...] = FREE) -> str:
    new_cal = calibration_from(fitted)
    lines = [
        "# Speed calibration of the estimator (H200)",
        "",
        "Written by `bench/estimate_calibrate.py --write` from the committed measurements (nothing re-measured). "
        "Fitted: the current engine's rows, `engine-speed-*.json` (`tunedeck` rows, b4/b8 × 2048) and "
        "`engine-longctx-*.json` (batch 1, 32k–192k tokens, `offload_activations`, tiled MLP), all Qwen2.5-7B "
        "and Llama-3-8B on one H200. An interim fit on few rows of two models of one shape family, pending "
        "the #19 matrix (`bench/calibration_matrix.py`, not yet run on the GPU). Error = (estimate − measured) "
        "/ measured. Before: the estimator as committed before this refit (d674802: attention as the full "
        "s × s matrix at the method's GEMM efficiency, constants fitted on the older engine and the plain "
        "loop). LOO: predicted by a fit without the row's configuration (its repeats left out too).",
        "",
    ]
    errors: dict[str, dict[str, list[float]]] = {}
    number = 0
    for kind in ("short", "long", "cal", "excluded", "other"):
        chosen = [r for r in rows if r.kind == kind]
        if not chosen:
            continue
        lines += [f"## {TITLES[kind]}", "",
                  "| # | source | configuration | measured tok/s | before | before err % | after | after err % "
                  "| LOO | LOO err % | notes |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        bucket = errors.setdefault(kind, {"before": [], "after": [], "loo": []})
        for row in chosen:
            number += 1
            before = BEFORE.get(row.key)
            after = predict(row, new_cal)
            held = loo.get(row.key)
            if before is not None:
                bucket["before"].append(_err(before, row.measured_tps))
            bucket["after"].append(_err(after, row.measured_tps))
            if held is not None:
                bucket["loo"].append(_err(held, row.measured_tps))
            lines.append(
                f"| {number} | {row.source} | {row.name} | {row.measured_tps:,.0f} | {_fmt(before)} | "
                f"{_errfmt(before, row.measured_tps)} | {after:,.0f} | {_errfmt(after, row.measured_tps)} | "
                f"{_fmt(held)} | {_errfmt(held, row.measured_tps)} | {row.note} |")
        lines.append("")
    fitted_rows = [r for r in rows if r.fitted]
    groups = len({r.group for r in fitted_rows})
    lines += ["## Fit quality", "",
              f"Fitted rows: {len(fitted_rows)} ({groups} configurations), "
              f"{sum(r.kind == 'short' for r in fitted_rows)} short-context and "
              f"{sum(r.kind == 'long' for r in fitted_rows)} long-context.", ""]
    for kind in ("short", "long", "cal", "excluded", "other"):
        if kind not in errors:
            continue
        bucket = errors[kind]
        lines.append(f"- {TITLES[kind]}: before {_summary(bucket['before'])}; after {_summary(bucket['after'])}"
                     + (f"; leave-one-out {_summary(bucket['loo'])}" if bucket["loo"] else ""))
    lines += ["", "## Constants (Hopper)", "", "| constant | before | after | |", "|---|---|---|---|"]
    roles = {"eff_full": "pinned", "eff_lora": "fitted", "hidden_half": "fitted", "attn": "fitted (new term)"}
    committed = current_values()
    for key in ("eff_full", *FREE, *KEPT):
        before = BEFORE_VALUES.get(key, committed[key] if key in free else fitted[key])
        role = roles.get(key, "fitted" if key in free else "kept (not identified by these rows)")
        lines.append(f"| {key} | {'– (no such term)' if before is None else f'{before:.4g}'} | {fitted[key]:.4g} | {role} |")
    lines += [
        "",
        "eff_full / eff_lora: big-GEMM efficiency of the linear layers (full pinned); hidden_half stretches "
        "their time by (h + hidden_half)/h; attn: the causal flash/cuDNN attention kernels' efficiency for "
        "the FLOPs they compute (half the s² scores); disp_*: CPU seconds per layer and pass unit; dp*: "
        "seconds per layer per micro-step of data parallelism. Counted from the ops, not fitted: LoRA dropout "
        "(5 B per input element and pass on bf16, 9 on fp32), peft's fp32 upcast (12 B), NF4 dequantisation, "
        "the optimizer's traffic.",
        "",
        "## Reading the fit",
        "",
        "- Attention is now causal: the kernels compute half of the s² scores, at their own efficiency. At "
        "96k tokens attention is over half of the step's FLOPs; counting the full matrix at the LoRA GEMM "
        "efficiency is what made the long-context estimates ~3× slow.",
        "- The recomputation of checkpointing re-runs the decoder layers only, not the LM head; the tiled "
        "MLP adds no FLOPs (its forward is skipped in the block's recomputation and redone in its own "
        "backward). `offload_activations` is timed as free: its copies overlap the compute, and every "
        "long-context row has it on, so a cost could not be told from the attention efficiency.",
        "- LoRA dropout and `lora_input_upcast` are memory traffic counted from the ops; against the "
        "dropout-0 and upcast rows of the same calls they come within ~10 ms a step of the measured "
        "differences.",
        "- The worst fitted row is 7B QLoRA at b4 × 2048 (−9 %): its CPU launch term (disp_qlora, kept from "
        "the older engine, whose bitsandbytes path launched more) is what holds it back; the rows cannot "
        "separate it from the GEMM efficiency.",
        "- The other engines' rows read faster than they ran (median 19 %): the older engine upcast every "
        "LoRA input to fp32 (counted now), had no fused LoRA add, and the plain loop no Liger kernels. Its "
        "7B DoRA row is +36 % (+79 % before `dora_output_bytes_per_element`, peft DoRA's fp32 rescaling of "
        "every adapted output, which `bench/matrix_terms_fit.py` solves on the matrix's four current-engine "
        "DoRA rows, 0.5B-7B: those are within 5 % of it, `estimate_matrix/engine-matrix-now.md`).",
        "- What these rows cannot know: other model widths and depths (only h = 3584 and 4096; hidden_half "
        "rests on the two full-fine-tuning rows of one model), DoRA (its output term is fitted on the matrix's "
        "rows, not here), other GPUs (RELATIVE_TO_HOPPER ratios), multi-GPU (dp* from the older engine), "
        "small launch-bound models (disp_* from the older engine), `tiled_mlp` between 16k and 32k, "
        "`offload_activations` at short sequences, `lora_fused_add: false`, `compile_layers`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {REPORT.relative_to(ROOT)}")
    parser.add_argument("--no-loo", action="store_true", help="skip the leave-one-out fits (faster)")
    parser.add_argument("--matrix", action="store_true",
                        help="a preview (never written): fit the #19 calibration matrix's rows too, and the CPU "
                             "launch constants with them")
    args = parser.parse_args(argv)
    if args.matrix and args.write:
        parser.error("--matrix is a preview of the refit on a part of the matrix: it is not written")

    free = (*FREE, *DISPATCH) if args.matrix else FREE
    rows = load_rows(args.matrix)
    fitted = fit([r for r in rows if r.fitted], {**current_values(), **PINNED}, free)
    loo = {} if args.no_loo else leave_one_out(rows, fitted, free)
    report = build_report(rows, fitted, loo, free)
    print(report)
    print("# calibration.py values:")
    for key in ("eff_full", *free):
        print(f"{key} = {fitted[key]:.4g}")
    if args.write:
        REPORT.write_text(report)
        print(f"wrote {REPORT}", file=sys.stderr)
    return 0


# The estimator as committed before this refit (d674802), tokens/s per row key: bench/estimate_calibrate.py
# of that commit's formula and constants on these plans (lora_input_upcast did not exist: no effect).
BEFORE: dict[str, float] = {
    "engine-speed-lora-a.json | Qwen2.5-7B lora b4xs2048 ckpt": 5376.3,
    "engine-speed-lora-a.json | Qwen2.5-7B lora b4xs2048 ckpt upcast": 5376.3,
    "engine-speed-lora-a.json | Qwen2.5-7B lora b4xs2048 ckpt compile_layers": 5376.3,
    "engine-speed-lora-a.json | Qwen2.5-7B lora b8xs2048 ga2 nockpt (wizard plan)": 7992.7,
    "engine-speed-lora-b.json | Qwen2.5-7B lora b4xs2048 ckpt": 5376.3,
    "engine-speed-qlora.json | Qwen2.5-7B qlora b4xs2048 ckpt": 5286.1,
    "engine-speed-dropout0.json | Qwen2.5-7B lora b4xs2048 ckpt dropout0": 5376.3,
    "engine-speed-dropout0.json | Qwen2.5-7B lora b4xs2048 ckpt dropout0 upcast": 5376.3,
    "engine-speed-full-b.json | Qwen2.5-7B full b4xs2048 nockpt pure-bf16": 7788.4,
    "engine-speed-full-b.json | Qwen2.5-7B full b4xs2048 ckpt pure-bf16": 5879.1,
    "engine-speed-full-b.json | Qwen2.5-7B qlora b8xs2048 ga2 nockpt (wizard plan)": 7950.1,
    "engine-longctx-a.json | Qwen2.5-7B qlora b1xs32768 ckpt offload": 2594.9,
    "engine-longctx-b.json | Qwen2.5-7B qlora b1xs98304 ckpt offload": 1234.8,
    "engine-longctx-b.json | Llama-3-8B qlora b1xs98304 ckpt offload": 1049.9,
    "engine-longctx-b.json | Qwen2.5-7B qlora b1xs196608 ckpt offload": 691.1,
    "engine-longctx-c.json | Llama-3-8B qlora b1xs98304 ckpt offload": 1049.9,
    "engine-longctx-c.json | Llama-3-8B qlora b1xs196608 ckpt offload": 577.0,
    "engine-longctx-d.json | Qwen2.5-7B qlora b1xs32768 ckpt offload": 2594.9,
    "engine-longctx-d.json | Qwen2.5-7B lora b1xs65536 ckpt offload": 1674.2,
    "engine-longctx-f.json | Qwen2.5-7B qlora b1xs393216 ckpt offload": 367.5,
    "engine-longctx-h.json | Qwen2.5-7B lora b1xs98304 ckpt offload": 1235.0,
    "engine-longctx-h.json | Llama-3-8B lora b1xs65536 ckpt offload": 1444.8,
    "engine-longctx-i.json | Qwen2.5-7B qlora b1xs32768 ckpt offload": 2594.9,
    "engine-longctx-j.json | Qwen2.5-7B qlora b1xs32768 ckpt offload": 2594.9,
    "engine-longctx-k.json | Qwen2.5-7B qlora b1xs32768 ckpt offload": 2594.9,
    "engine-longctx-l.json | Qwen2.5-7B qlora b1xs32768 ckpt offload": 2594.9,
    "matrix | Qwen2.5-0.5B lora b4xs1024 ckpt fusedCE": 13116.7,
    "matrix | Qwen2.5-0.5B lora b4xs1024 ckpt plainCE": 13100.5,
    "matrix | Qwen2.5-0.5B lora b4xs1024 nockpt plainCE": 17525.7,
    "matrix | Qwen2.5-0.5B lora b4xs1024 nockpt fusedCE": 17547.7,
    "matrix | Qwen2.5-0.5B lora b4xs1024 nockpt fusedCE dropout0": 17547.7,
    "matrix | Qwen2.5-0.5B full b4xs1024 ckpt fusedCE": 22160.4,
    "matrix | Qwen2.5-0.5B full b4xs1024 nockpt plainCE": 29106.6,
    "matrix | Qwen2.5-0.5B full pure-bf16 b4xs1024 nockpt plainCE": 29362.4,
    "matrix | Qwen2.5-0.5B qlora b4xs1024 ckpt fusedCE": 7212.7,
    "matrix | Qwen2.5-0.5B qlora b4xs1024 nockpt plainCE": 9618.8,
    "engine-0.5b-qlora.json | Qwen2.5-0.5B qlora b8xs1024 ckpt fusedCE": 14233.4,
    "engine-0.5b.json | Qwen2.5-0.5B lora b8xs1024 nockpt plainCE": 31809.8,
    "engine-0.5b.json | Qwen2.5-0.5B dora b8xs1024 nockpt plainCE": 20296.7,
    "engine-0.5b.json | Qwen2.5-0.5B full b8xs1024 nockpt plainCE": 39622.5,
    "engine-7b-a.json | Qwen2.5-7B lora b4xs1024 ckpt plainCE": 5469.3,
    "engine-7b-b.json | Qwen2.5-7B dora b4xs1024 ckpt fusedCE": 2843.0,
    "engine-7b-b.json | Qwen2.5-7B qlora b4xs1024 ckpt fusedCE": 4856.4,
    "engine-7b-b.json | Qwen2.5-7B full b2xs1024 ckpt fusedCE pure-bf16": 5250.1,
    "engine-multi-zero.json | Qwen2.5-0.5B full b8xs1024 nockpt fusedCE 2GPU ZeRO-2": 40229.2,
    "engine-multi-zero.json | Qwen2.5-0.5B full b8xs1024 nockpt fusedCE 2GPU ZeRO-3": 19315.0,
    "engine-multi.json | Qwen2.5-0.5B full b8xs1024 nockpt plainCE 2GPU ZeRO-0": 53485.6,
}


if __name__ == "__main__":
    sys.exit(main())
