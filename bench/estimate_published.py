"""Run the estimator on the configurations of two published fine-tuning tables and compare (no GPU needed).

Sources (numbers transcribed; their setups summarised in our words):
- Qwen (Qwen-1) README, section "Profiling of Memory and Speed" (finetuning), github.com/QwenLM/Qwen at
  commit 712d922eceea9a9388375fc51ee97ec971eb13bb (README.md): A100-SXM4-80G, flash-attention 2, batch 1
  x gradient accumulation 8, memory (GB) and s/iter at sequence lengths 256-8192, for LoRA, LoRA (emb),
  Q-LoRA and full-parameter; the recipe is the repo's finetune.py + finetune/*.sh (LoRA r=64 on all
  linears, dropout 0.05, gradient checkpointing, AdamW, rows padded to the max length; Q-LoRA on the
  GPTQ Int4 chat model in fp16 under DeepSpeed ZeRO-2; full-parameter under ZeRO-3).
- torchtune README, section "Memory and training speed", github.com/pytorch/torchtune at commit
  bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1 (README.md), recipe settings from recipes/configs/llama3_1/*.yaml
  at the same commit: Llama 3.1, batch 2, packed 2048-token rows, torch.compile, peak memory per GPU
  and tokens/s.

Qwen-1 is not a transformers architecture (QWenLMHeadModel, custom code): bench/configs/qwen1-*.json
describe it as qwen2 with the same dimensions (parameter counts match the published 1.8/7.7/14.2/72.3B).

    python bench/estimate_published.py          # writes bench/results/estimate_published.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from core.estimate import PlanError, estimate, find_gpu, plan_for_model  # noqa: E402

CONFIGS = ROOT / "bench" / "configs"
OUT = ROOT / "bench" / "results" / "estimate_published.md"
QWEN_URL = "https://github.com/QwenLM/Qwen/blob/712d922eceea9a9388375fc51ee97ec971eb13bb/README.md#profiling-of-memory-and-speed"
TORCHTUNE_URL = "https://github.com/pytorch/torchtune/blob/bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1/README.md#memory-and-training-speed"
SEQS = (256, 512, 1024, 2048, 4096, 8192)


@dataclass
class Published:
    """One cell of a published table and the plan we read it as."""

    group: str
    label: str
    model: str  # config path or bundled name
    gpu: str
    options: dict[str, Any]
    memory_gib: float | None  # per GPU
    tokens_per_s: float | None  # all GPUs
    memory_note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _qwen_cells() -> list[Published]:
    """Qwen README profiling table; memory there is summed over the GPUs (139.2G > one 80 GB A100)."""
    lora = {"method": "lora", "lora_rank": 64, "lora_dropout": 0.05, "precision": "bf16", "fused_ce": False,
            "micro_batch_size": 1, "grad_accum_steps": 8, "gradient_checkpointing": True, "optimizer": "adamw"}
    qlora = {**lora, "method": "qlora", "precision": "fp16", "zero_stage": 2, "kbit_upcast": True}
    full = {**lora, "method": "full", "zero_stage": 3}
    # (model, method label, options, GPUs, cells "GB / s/it" per sequence length)
    table: list[tuple[str, str, dict[str, Any], int, list[tuple[float, float] | None]]] = [
        ("qwen1-1.8b", "LoRA", lora, 1, [(6.7, 1.0), (7.4, 1.0), (8.4, 1.1), (11.0, 1.7), (16.2, 3.3), (21.8, 6.8)]),
        ("qwen1-1.8b", "Q-LoRA", qlora, 1, [(5.8, 1.4), (6.0, 1.4), (6.6, 1.4), (7.8, 2.0), (10.2, 3.4), (15.8, 6.5)]),
        ("qwen1-1.8b", "Full-parameter", full, 1,
         [(43.5, 2.1), (43.5, 2.2), (43.5, 2.2), (43.5, 2.3), (47.1, 2.8), (48.3, 5.6)]),
        ("qwen1-7b", "LoRA", lora, 1, [(20.1, 1.2), (20.4, 1.5), (21.5, 2.8), (23.8, 5.2), (29.7, 10.1), (36.6, 21.3)]),
        ("qwen1-7b", "Q-LoRA", qlora, 1, [(11.5, 3.0), (11.5, 3.0), (12.3, 3.5), (13.9, 7.0), (16.9, 11.6), (23.5, 22.3)]),
        ("qwen1-7b", "Full-parameter", full, 2, [(139.2, 4.0), (148.0, 4.0), (162.0, 4.5), None, None, None]),
        ("qwen1-14b", "LoRA", lora, 1, [(34.6, 1.6), (35.1, 2.4), (35.3, 4.4), (37.4, 8.4), (42.5, 17.0), (55.2, 36.0)]),
        ("qwen1-14b", "Q-LoRA", qlora, 1,
         [(18.7, 5.3), (18.4, 6.3), (18.9, 8.2), (19.9, 11.8), (23.0, 20.1), (27.9, 38.3)]),
        ("qwen1-72b", "LoRA + ZeRO-3", {**lora, "zero_stage": 3}, 4,
         [(215.4, 17.6), (217.7, 20.5), (222.6, 29.4), (228.8, 45.7), (249.0, 83.4), (289.2, 161.5)]),
        ("qwen1-72b", "Q-LoRA", qlora, 1,
         [(61.4, 27.4), (61.4, 31.5), (62.9, 41.4), (64.1, 59.5), (68.0, 97.7), (75.6, 179.8)]),
    ]
    cells = []
    for model, method, options, gpus, values in table:
        for seq, value in zip(SEQS, values, strict=True):
            if value is None:
                continue
            memory, seconds = value
            tokens = seq * options["micro_batch_size"] * options["grad_accum_steps"] * gpus
            cells.append(Published(
                group=f"Qwen README: {model.replace('qwen1-', 'Qwen-').upper().replace('QWEN', 'Qwen')} {method}",
                label=f"{method} s{seq}" + (f" {gpus}xGPU" if gpus > 1 else ""),
                model=str(CONFIGS / f"{model}.json"), gpu="A100-80GB",
                options={**options, "seq_len": seq, "num_gpus": gpus},
                memory_gib=memory / gpus, tokens_per_s=tokens / seconds,
                memory_note="per GPU = table / GPUs" if gpus > 1 else ""))
    return cells


def _torchtune_cells() -> list[Published]:
    """torchtune README table (Llama 3.1, batch 2, packed 2048, torch.compile)."""
    base = {"micro_batch_size": 2, "seq_len": 2048, "gradient_checkpointing": True, "fused_ce": True,
            "precision": "pure-bf16", "lora_dropout": 0.0}
    targets = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    lora8 = {**base, "method": "lora", "lora_rank": 8, "lora_targets": targets, "precision": "bf16"}
    lora16 = {**lora8, "lora_rank": 16}
    full_single = {**base, "method": "full", "optimizer": "paged_adamw_8bit"}
    full70 = {**base, "method": "full", "optimizer": "adamw_fused", "num_gpus": 8, "zero_stage": 3, "offload": "all"}
    llama8, llama70, llama405 = "Meta-Llama-3-8B", str(CONFIGS / "llama-3.1-70b.json"), str(CONFIGS / "llama-3.1-405b.json")
    rows = [
        ("Llama 3.1 8B full", "1x RTX 4090", llama8, "RTX-4090", full_single, 18.9, 1650),
        ("Llama 3.1 8B full", "1x A6000", llama8, "RTX-A6000", full_single, 37.4, 2579),
        ("Llama 3.1 8B LoRA", "1x RTX 4090", llama8, "RTX-4090", lora8, 16.2, 3083),
        ("Llama 3.1 8B LoRA", "1x A6000", llama8, "RTX-A6000", lora8, 30.3, 4699),
        ("Llama 3.1 8B QLoRA", "1x RTX 4090", llama8, "RTX-4090", {**lora8, "method": "qlora", "kbit_upcast": False},
         7.4, 2413),
        ("Llama 3.1 70B full", "8x A100 (FSDP CPU offload)", llama70, "A100-80GB", full70, 13.9, 1568),
        ("Llama 3.1 70B LoRA", "8x A100 (FSDP)", llama70, "A100-80GB", {**lora16, "num_gpus": 8, "zero_stage": 3},
         27.6, 3497),
        ("Llama 3.1 405B QLoRA", "8x A100 (FSDP)", llama405, "A100-80GB",
         {**lora16, "method": "qlora", "kbit_upcast": False, "micro_batch_size": 1, "grad_accum_steps": 8,
          "num_gpus": 8, "zero_stage": 3}, 44.8 * 1e9 / 1024**3, 653),
    ]
    return [Published(group=f"torchtune README: {group}", label=hw, model=model, gpu=gpu, options=options,
                      memory_gib=memory, tokens_per_s=tps) for group, hw, model, gpu, options, memory, tps in rows]


WHY = {
    "Qwen README": [
        "Memory: their rows are padded to the full length and use flash-attention 2 as we assume; their "
        "GB are probably torch's peak allocated (no CUDA context), ours include ~0.5 GiB context and "
        "allocator slack. LoRA (emb) rows are left out: we do not model trainable embedding/LM-head "
        "copies (peft modules_to_save).",
        "Q-LoRA: they quantise with GPTQ (Int4 chat model) in fp16 under DeepSpeed ZeRO-2, we model "
        "bitsandbytes NF4; GPTQ's training path dequantises to fp16 with slower kernels, which is why "
        "their Q-LoRA is 1.3-3x slower than their LoRA while ours is close to LoRA at long sequences.",
        "Speed: s/iter covers 8 micro-steps of one sequence, so short sequences are launch-bound (1.0 s/it "
        "at 256 and 512 tokens for 1.8B) — the regime our dispatch term models, fitted on an H200 box's "
        "CPU; their 2023 stack (PyTorch 2.0, CUDA 11.8) launches more slowly. At 4k-8k tokens the GPU "
        "term dominates and A100 efficiency (not measured by us: Hopper's fit x the first-principles "
        "Ampere ratio) decides.",
        "Full-parameter and 72B LoRA run under DeepSpeed ZeRO-3 (1, 2 and 4 GPUs); our ZeRO-3 overhead "
        "constant comes from one 0.5B run on 2 H200s. Our 7B full-parameter peak (89 GiB per GPU) says "
        "it does not fit where they ran it (70-81 GB per GPU): ZeRO-3 shards the fp32 master weights "
        "and Adam states over the 2 GPUs as we model, so the gap is in what we keep unsharded (bf16 "
        "gradients and the prefetch/bucket buffers at DeepSpeed's auto sizes) — worth a measurement.",
        "Overall our speed is 0.94 of theirs at the median, since the constants were fitted on the H200 "
        "calibration matrix (0.5B-32B, transformers 5, peft 0.21, eager): slower where their rows are short "
        "(0.36-0.58 at 256-1024 tokens: every decoder layer costs us ~3.3 ms of kernel launches per pass "
        "on the H200 box's shared CPU, against ~1.2 ms implied by their short-sequence rows), faster where "
        "their stack is slower than ours: ZeRO-3 full-parameter on one GPU (1.8B, 1.5-1.6x: its gathers "
        "and releases, which we model from one 2-GPU 0.5B run) and the 72B's GPTQ Q-LoRA (1.3-2.3x, "
        "above). Calibrating per software stack (or the wizard's probe: a few real steps on the target "
        "box) closes the rest.",
    ],
    "torchtune README": [
        "Full fine-tuning on one GPU: torchtune runs the optimizer step inside backward "
        "(optimizer_in_bwd), so a parameter's gradient is freed as soon as it is applied; we hold all "
        "gradients until the step (bf16 8B: +15 GiB), hence our no-fit on the 4090. Their A6000 rows "
        "(37.4 and 30.3 GiB, about twice the 4090's with the same batch) must use other settings, most "
        "likely activation checkpointing off; the README does not say, so we keep the config files' "
        "settings (checkpointing on) for both GPUs.",
        "LoRA/QLoRA: torchtune keeps adapters in bf16 (we: fp32, as peft does), LoRA on q/v/o + MLP "
        "(not k), rank 8 (8B) or 16 (70B/405B), chunked linear cross-entropy, torch.compile (fewer "
        "launches and fused elementwise kernels: our launch-overhead term, fitted on eager PyTorch, "
        "over-charges compiled runs).",
        "70B full: FSDP with CPU offload of parameters, gradients and optimizer (our offload=all on "
        "ZeRO-3, a flat speed factor). 405B QLoRA: batch 1 (as their config), FSDP over 8 GPUs.",
        "Tokens/s are read as the whole job's (all GPUs): per GPU, the 70B numbers would exceed the "
        "A100's peak. The 4090 LoRA figure implies ~90 % of its dense bf16 peak under the 6N-per-token "
        "count with checkpointing — higher than any eager or compiled PyTorch run we know of, so part of "
        "that gap is in their counting, not in our model.",
    ],
}


def compare(cells: list[Published]) -> list[dict[str, Any]]:
    """Our estimate for each published cell."""
    out = []
    for cell in cells:
        row: dict[str, Any] = {"cell": cell}
        try:
            plan = plan_for_model(cell.model, **cell.options)
            result = estimate(plan, find_gpu(cell.gpu))
        except PlanError as exc:
            row["error"] = str(exc)
            out.append(row)
            continue
        row.update(peak=result.peak_gib, tensors=result.peak_gib - result.breakdown["cuda_context"]
                   - result.breakdown["allocator_slack"], tps=result.tokens_per_s, verdict=result.verdict)
        out.append(row)
    return out


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or not theirs:
        return "–"
    return f"{ours / theirs:.2f}"


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Estimator vs published fine-tuning tables",
        "",
        "Written by `bench/estimate_published.py`. Ratio = ours / theirs. `ours GiB` is our per-GPU peak "
        "(CUDA context and allocator slack included; `tensors` without them); tokens/s are the whole job's. "
        "Sources:",
        "",
        f"- Qwen README, \"Profiling of Memory and Speed\": {QWEN_URL}",
        f"- torchtune README, \"Memory and training speed\": {TORCHTUNE_URL} "
        "(recipe settings from recipes/configs/llama3_1/ at the same commit)",
        "",
    ]
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["cell"].group, []).append(row)
    summary: dict[str, dict[str, list[float]]] = {}
    for group, members in groups.items():
        lines += [f"## {group}", "",
                  "| configuration | GPU | theirs GiB | ours GiB | tensors GiB | ratio | theirs tok/s | ours tok/s | ratio | our verdict |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        source = group.split(":")[0]
        for row in members:
            cell = row["cell"]
            if "error" in row:
                lines.append(f"| {cell.label} | {cell.gpu} | {cell.memory_gib:.1f} | – | – | – | "
                             f"{cell.tokens_per_s:,.0f} | – | – | {row['error']} |")
                continue
            memory_ratio = row["peak"] / cell.memory_gib if cell.memory_gib else None
            speed_ratio = row["tps"] / cell.tokens_per_s if cell.tokens_per_s else None
            bucket = summary.setdefault(source, {"memory": [], "speed": []})
            if memory_ratio is not None:
                bucket["memory"].append(memory_ratio)
            if speed_ratio is not None:
                bucket["speed"].append(speed_ratio)
            note = f" ({cell.memory_note})" if cell.memory_note else ""
            lines.append(
                f"| {cell.label} | {cell.gpu} | {cell.memory_gib:.1f}{note} | {row['peak']:.1f} | {row['tensors']:.1f} | "
                f"{_ratio(row['peak'], cell.memory_gib)} | {cell.tokens_per_s:,.0f} | {row['tps']:,.0f} | "
                f"{_ratio(row['tps'], cell.tokens_per_s)} | {row['verdict']} |")
        lines.append("")
    lines += ["## Summary (median ratio ours/theirs, range)", "",
              "| source | memory median | memory range | speed median | speed range | cells |", "|---|---|---|---|---|---|"]
    for source, values in summary.items():
        mem, spd = values["memory"], values["speed"]
        lines.append(f"| {source} | {statistics.median(mem):.2f} | {min(mem):.2f}–{max(mem):.2f} | "
                     f"{statistics.median(spd):.2f} | {min(spd):.2f}–{max(spd):.2f} | {len(mem)} |")
    lines += ["", "## Why they differ", ""]
    for source, reasons in WHY.items():
        lines.append(f"### {source}")
        lines.append("")
        lines += [f"- {reason}" for reason in reasons]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(OUT), help="markdown file to write")
    args = parser.parse_args(argv)
    rows = compare(_qwen_cells() + _torchtune_cells())
    text = render(rows)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())


