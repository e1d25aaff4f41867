"""Long context (issue #16): the longest sequence that trains within 24 / 48 / 80 GiB, its speed, and the
estimator's estimate of each row, on one GPU.

Each row is the real ``tunedeck train`` (``bench/engine_speed.py``'s runner: a detached run on a
random-initialised model built from the published ``config.json``) at batch 1, gradient checkpointing
with ``offload_activations: true`` and the engine's defaults (``tiled_mlp: auto`` tiles the MLP above
32k tokens), LoRA r16 all-linear, on data whose every row is at least the sequence long. A length counts
when its steps complete; per row: status, peak GiB (NVML, all processes; torch's max allocated and
reserved), tokens/s (between the first step and the last), MFU (model FLOPs with attention at that
length, recomputation not counted, over the GPU's dense bf16 peak), and the estimator's peak and tokens/s
for the same plan with the error against the measurement.

    python bench/engine_longctx.py --out bench/results/engine-longctx-a.md \\
        --series 7b-qlora:32768,98304,131072 --series 8b-qlora:98304 --budget-s 560

``--series MODEL-METHOD:LENGTH,...`` (models 7b = Qwen2.5-7B, 8b = Llama-3-8B; methods qlora, lora) runs
the lengths in order and stops the series at the first that fails (out of memory) or passes 80 GiB.
``--engines`` as in engine_speed (``tunedeck+tiled_mlp=false`` measures a switch against the defaults).
The report ends with the longest measured length per budget and, for 80 GiB, the estimator's longest
(checked against the measured rows: the error band is in the table). ``--tiny --cpu``: the pipeline on
the bundled tiny model (the test).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import engine_speed as es  # noqa: E402  (bench/ is not a package)
from results_files import write_results  # noqa: E402  (bench/ is not a package)

BUDGETS_GIB = (24, 48, 80)
MODELS = {"7b": "Qwen2.5-7B", "8b": "Llama-3-8B", "tiny": "tiny"}


def log(text: str) -> None:
    print(f"[engine_longctx {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def parse_series(text: str) -> tuple[str, str, list[int]]:
    """``7b-qlora:32768,98304`` -> ("7b", "qlora", [32768, 98304])."""
    head, _, lengths = text.partition(":")
    model, _, method = head.partition("-")
    if model not in es.CONFIGS or method not in ("qlora", "lora") or not lengths:
        raise ValueError(f"--series {text!r}: write MODEL-METHOD:LENGTH,... with MODEL in 7b, 8b and METHOD qlora or lora")
    return model, method, [int(v) for v in lengths.split(",") if v.strip()]


def estimate_row(model: str, method: str, seq: int, overrides: dict[str, Any], lora_dropout: float,
                 gpu_name: str | None) -> dict[str, Any]:
    """The estimator on the row's plan (its defaults are the engine's: tiled MLP auto, Liger, fused AdamW)."""
    from core.estimate import estimate, find_gpu, plan_for_model

    options: dict[str, Any] = {"method": method, "micro_batch_size": 1, "seq_len": seq, "gradient_checkpointing": True,
                               "offload_activations": bool(overrides.get("offload_activations", True)),
                               "lora_rank": 16, "lora_dropout": lora_dropout}
    if "tiled_mlp" in overrides:
        options["tiled_mlp"] = "false" if overrides["tiled_mlp"] in (False, "false") else overrides["tiled_mlp"]
    try:
        plan = plan_for_model(str(es.CONFIGS[model]), exact_count=False, **options)
        result = estimate(plan, find_gpu(gpu_name or "H200"))
    except Exception as exc:  # an estimator that cannot judge the row is reported, not fatal
        return {"error": str(exc)}
    return {"peak_gib": round(result.peak_gib, 2), "tokens_per_s": round(result.tokens_per_s, 1),
            "cpu_ram_gib": round(result.cpu_ram_gib, 1), "tiles": plan.mlp_tiles(True)}


def longest_by_estimate(model: str, method: str, budget: float, lora_dropout: float, gpu_name: str | None,
                        step: int = 8192, limit: int = 1 << 20) -> int:
    """The longest multiple of ``step`` tokens the estimator puts within ``budget`` GiB (batch 1). Every
    length is tried: the peak is not monotonic where ``tiled_mlp: auto`` starts tiling (a shorter
    untiled sequence can need more than a longer tiled one)."""
    best = 0
    for seq in range(step, limit + 1, step):
        est = estimate_row(model, method, seq, {}, lora_dropout, gpu_name)
        if "peak_gib" in est and est["peak_gib"] <= budget:
            best = seq
    return best


def _error(estimated: float | None, measured: float | None) -> float | None:
    return round((estimated - measured) / measured, 3) if estimated and measured else None


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = ["# Long context: the longest sequence per memory budget (issue #16)", "",
             f"{meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}, {meta['date']}; "
             f"batch 1, LoRA r16 all-linear (dropout {meta['lora_dropout']}), checkpointing + offload_activations, "
             f"{meta['steps']} steps per length. Command: `{meta['command']}`", "",
             "| model | method | engine | tokens | status | peak GiB (NVML) | torch alloc / reserved | tok/s | MFU "
             "| est. GiB | err | est. tok/s | err | host RAM est. | MLP tiles |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        est = r.get("estimate") or {}
        lines.append("| " + " | ".join(es._fmt(v) if not isinstance(v, str) else v for v in (
            MODELS[r["model"]], r["method"], r["engine"], f"{r['seq']:,}", r.get("status") or "-",
            max(r["peak_gib"]) if r.get("peak_gib") else None,
            f"{es._fmt(r.get('torch_peak_allocated_gib'))} / {es._fmt(r.get('torch_peak_reserved_gib'))}",
            f"{es._fmt(r.get('tokens_per_s'))}{' (1 step)' if r.get('rate_from') == 'one step' else ''}",
            r.get("mfu"), est.get("peak_gib"),
            f"{r['peak_error']:+.1%}" if r.get("peak_error") is not None else "-", est.get("tokens_per_s"),
            f"{r['speed_error']:+.1%}" if r.get("speed_error") is not None else "-", est.get("cpu_ram_gib"),
            est.get("tiles"))) + " |")
    lines += ["", "## Longest within each budget", ""]
    series: dict[tuple[str, str, str], dict[int, int]] = {}
    for r in results:
        key = (r["model"], r["method"], r["engine"])
        fits = series.setdefault(key, {})
        if r.get("status") == "finished" and r.get("peak_gib"):
            for budget in BUDGETS_GIB:
                if max(r["peak_gib"]) <= budget:
                    fits[budget] = max(fits.get(budget, 0), r["seq"])
    for (model, method, engine), fits in series.items():
        measured = ", ".join(f"{b} GiB: {fits.get(b, 0):,}" if fits.get(b) else f"{b} GiB: none measured"
                             for b in BUDGETS_GIB)
        lines.append(f"- {MODELS[model]} {method} ({engine}), measured: {measured}")
    for key, longest in (meta.get("estimated_longest") or {}).items():
        model, _, method = key.partition("|")
        text = ", ".join(f"{b} GiB: {v:,}" for b, v in longest.items())
        lines.append(f"- {MODELS[model]} {method}, by the estimator (steps of 8,192): {text}")
    errors = [abs(r["peak_error"]) for r in results if r.get("peak_error") is not None]
    if errors:
        lines.append(f"- estimator peak error over the {len(errors)} measured rows: worst {max(errors):.1%}, "
                     f"median {sorted(errors)[len(errors) // 2]:.1%} (target: every row within 10%)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--series", action="append", default=[], help="MODEL-METHOD:LENGTH,... (repeatable)")
    parser.add_argument("--engines", default="tunedeck")
    parser.add_argument("--steps", type=int, default=3, help="steps per length (the rate is from the first to the last)")
    parser.add_argument("--budget-s", type=float, default=560.0)
    parser.add_argument("--lora-dropout", type=float, default=0.05)
    parser.add_argument("--home", default=None)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--memory-profile", default="", metavar="START[:COUNT]",
                        help="record the CUDA allocations of these steps of every row: what is live at its peak "
                             "(written next to --out as NAME-memory-MODEL-METHOD-LENGTH.txt)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    import torch
    import transformers

    cuda = torch.cuda.is_available() and not args.cpu
    if args.cpu:
        import os

        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        series = [parse_series(s) for s in args.series] if not args.tiny else [("tiny", "lora", [256, 512])]
    except ValueError as exc:
        parser.error(str(exc))
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    for engine in engines:
        if es.parse_engine(engine)[0] != "tunedeck":
            parser.error(f"{engine}: this bench measures tunedeck's engine (tunedeck or tunedeck+key=value)")
    home = Path(args.home or tempfile.mkdtemp(prefix="tunedeck-longctx-"))
    home.mkdir(parents=True, exist_ok=True)
    gpu_name = torch.cuda.get_device_name(0) if cuda else None
    datasets: dict[int, Path] = {}

    def dataset(seq: int) -> Path:
        if seq not in datasets:
            datasets[seq] = es.make_long_dataset(home, seq, args.steps + 3)
        return datasets[seq]

    ctx = {"home": home, "cpu": not cuda, "steps": args.steps, "warmup": 1, "dataset": dataset,
           "model_dirs": {m: es.make_model_dir(home, m) for m in {s[0] for s in series}},
           "peak_flops": es.gpu_peak_flops() if cuda else None, "profile": "", "drop_checkpoints": True,
           "lora_dropout": args.lora_dropout, "memory_profile": args.memory_profile}
    meta = {"device": f"{gpu_name} x 1" if cuda else "CPU", "torch": torch.__version__,
            "transformers": transformers.__version__, "steps": args.steps, "lora_dropout": args.lora_dropout,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python bench/engine_longctx.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "estimated_longest": {}}
    out_md = Path(args.out)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []

    def record(result: dict[str, Any]) -> None:
        results.append(result)
        write_results(out_md, {"meta": meta, "results": results}, render(results, meta))

    if cuda:
        for model, method, _ in series:
            meta["estimated_longest"][f"{model}|{method}"] = {
                b: longest_by_estimate(model, method, b, args.lora_dropout, gpu_name) for b in BUDGETS_GIB}
    for model, method, lengths in series:
        spec = {"model": model, "method": method, "micro": 1, "seq": 0, "gpus": 1, "ckpt": True, "maxseq": True,
                "name": f"longctx-{model}-{method}"}
        for engine in engines:
            overrides = es.parse_engine(engine)[1]
            for seq in lengths:
                base = {"model": model, "method": method, "engine": engine, "seq": seq,
                        "estimate": estimate_row(model, method, seq, overrides, args.lora_dropout, gpu_name)}
                left = args.budget_s - (time.monotonic() - started)
                if left < (60 if cuda else 15):
                    record({**base, "status": "skipped", "reason": f"budget: {left:.0f} s left"})
                    continue
                log(f"{model}-{method} {engine} {seq} tokens ({left:.0f} s left)")
                result = {**base, **es.run_engine(ctx, engine, spec, seq, left - 10)}
                if result.get("memory_profile"):
                    Path(f"{out_md.with_suffix('')}-memory-{model}-{method}-{seq}.txt").write_text(
                        result["memory_profile"], encoding="utf-8")
                peak = max(result["peak_gib"]) if result.get("peak_gib") else None
                if cuda:
                    result["peak_error"] = _error(base["estimate"].get("peak_gib"), peak)
                    result["speed_error"] = _error(base["estimate"].get("tokens_per_s"), result.get("tokens_per_s"))
                record(result)
                log(f"  -> {result.get('status')} {result.get('tokens_per_s')} tok/s, peak {peak} GiB")
                if result.get("status") != "finished" or (peak and peak > max(BUDGETS_GIB)):
                    break  # longer ones will not fit either
    print(out_md.read_text())
    return 0 if results and all(r.get("status") in ("finished", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
