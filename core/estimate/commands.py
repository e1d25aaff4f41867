"""``tunedeck estimate``: per-GPU peak memory with a breakdown, fit verdict and speed of a plan."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from core.i18n import t
from core.units import format_cost, format_duration

BAR_WIDTH = 30
LABEL_WIDTH = 28
GPU_ONLY_ROWS = ("cuda_context", "deepspeed_nccl_buffers")  # always 0 on the CPU: not shown there


def register(subparsers: Any) -> None:
    """Add the ``estimate`` command."""
    from core.config.checks import cli_number, cli_value
    from core.estimate.plan import ATTENTIONS, METHODS, OFFLOADS, OPTIMIZERS, PRECISIONS, normalise_optimizer

    parser = subparsers.add_parser("estimate", help=t("estimate.help"), description=t("estimate.help"))
    parser.add_argument("--model", required=True, help=t("estimate.help.model"))
    parser.add_argument("--method", choices=METHODS, default="lora", help=t("estimate.help.method"))
    parser.add_argument("--batch-size", type=cli_value("micro_batch_size"), default=1, help=t("estimate.help.batch_size"))
    parser.add_argument("--seq-len", type=cli_value("max_seq_len"), default=2048, help=t("estimate.help.seq_len"))
    parser.add_argument("--no-gradient-checkpointing", action="store_true", help=t("estimate.help.no_gc"))
    parser.add_argument("--checkpoint-layers", type=cli_value("checkpoint_layers"), default=None, help=t("estimate.help.checkpoint_layers"))
    parser.add_argument("--lora-rank", type=cli_value("lora_rank"), default=16, help=t("estimate.help.lora_rank"))
    parser.add_argument("--lora-targets", default="all-linear", help=t("estimate.help.lora_targets"))
    parser.add_argument("--lora-dropout", type=cli_value("lora_dropout", float), default=0.05, help=t("estimate.help.lora_dropout"))
    parser.add_argument("--precision", choices=PRECISIONS, default=None, help=t("estimate.help.precision"))
    parser.add_argument("--no-fused-ce", action="store_true", help=t("estimate.help.no_fused_ce"))
    parser.add_argument("--chunked-ce", action="store_true", help=t("estimate.help.chunked_ce"))
    # the run key plan writes when it widens the LM head's chunks: the same shape estimates the same here
    parser.add_argument("--ce-chunk-tokens", type=_ce_chunk_tokens, default=None, help=t("estimate.help.ce_chunk_tokens"))
    parser.add_argument("--qlora-upcast", action="store_true", help=t("estimate.help.qlora_upcast"))
    parser.add_argument("--offload-activations", action="store_true", help=t("estimate.help.offload_activations"))
    parser.add_argument("--optimizer", type=normalise_optimizer, choices=OPTIMIZERS, default="adamw_fused",
                        help=t("estimate.help.optimizer"))
    parser.add_argument("--gpus", type=_gpu_count, default=None, help=t("estimate.help.gpus"))
    parser.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help=t("estimate.help.zero"))
    parser.add_argument("--offload", choices=OFFLOADS, default="none", help=t("estimate.help.offload"))
    parser.add_argument("--grad-accum", type=cli_value("gradient_accumulation"), default=1, help=t("estimate.help.grad_accum"))
    parser.add_argument("--attention", choices=ATTENTIONS, default="sdpa", help=t("estimate.help.attention"))
    # --hardware: the name plan takes for the same thing ("8xA100-80GB")
    parser.add_argument("--gpu", "--hardware", dest="gpu", default="H200", help=t("estimate.help.gpu"))
    parser.add_argument("--dataset-tokens", type=cli_number(int, minimum=1), default=None, help=t("estimate.help.dataset_tokens"))
    parser.add_argument("--target-share", type=_share, default=1.0, help=t("estimate.help.target_share"))
    parser.add_argument("--price-per-gpu-hour", type=cli_number(float, minimum=0), default=None, help=t("estimate.help.price"))
    parser.add_argument("--exact", action="store_true", default=None, help=t("estimate.help.exact"))
    parser.add_argument("--json", action="store_true", help=t("estimate.help.json"))
    parser.set_defaults(handler=run_estimate)


def _gpu_count(text: str) -> int:
    """``--gpus``: a count (``2``), or GPU indices as ``plan --gpus`` takes them (``0,1``: 2 GPUs), the count held
    to ``MAX_GPU_COUNT``; one line saying both forms for anything else."""
    from core.config.checks import cli_number
    from core.estimate.gpus import MAX_GPU_COUNT

    count = cli_number(int, minimum=1, maximum=MAX_GPU_COUNT)
    if "," not in text:
        return count(text)
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts) or len(set(map(int, parts))) != len(parts):
        raise argparse.ArgumentTypeError(t("estimate.error.gpus_form", value=text))
    return count(str(len(parts)))


def _ce_chunk_tokens(text: str) -> int | None:
    """``--ce-chunk-tokens``: ``auto`` (None: the loss's own rule) or a count held to the run key's limits."""
    from core.config.checks import cli_value

    return None if text.strip().lower() == "auto" else cli_value("ce_chunk_tokens")(text)


def _share(text: str) -> float:
    """A fraction in (0, 1] (``--target-share``)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(t("estimate.error.share", value=text))
    return value


def run_estimate(args: argparse.Namespace) -> int:
    """Handler of ``tunedeck estimate``."""
    from core.errors import CliError
    from core.estimate import (
        estimate,
        normalise_lora_targets,
        plan_for_model,
    )

    target = estimate_target(args.gpu, args.gpus)
    if target.cpu_only and (args.method == "qlora" or (args.zero or 0) > 0):  # not a precision to change
        raise CliError(t("estimate.error.qlora_cpu" if args.method == "qlora" else "estimate.error.zero_cpu",
                         zero=args.zero), 2)
    if args.method == "qlora" and args.zero == 3:  # plan and the run refuse it: an estimate said "fits"
        raise CliError(t("estimate.error.qlora_zero3"), 2)
    gpu = target.spec()
    num_gpus = target.count
    from core.assets import resolve_model_name

    plan = plan_for_model(
        resolve_model_name(args.model),  # the bundled ``tiny`` as plan takes it
        exact_count=args.exact,
        fetch=True,  # a hub id found nowhere here: its config.json from the hub, kept for the next time
        method=args.method,
        precision=args.precision or ("fp32" if target.cpu_only else "bf16"),  # as plan picks it
        micro_batch_size=args.batch_size,
        seq_len=args.seq_len,
        gradient_checkpointing=not args.no_gradient_checkpointing,
        checkpoint_layers=args.checkpoint_layers,
        lora_rank=args.lora_rank,
        lora_targets=normalise_lora_targets(args.lora_targets),
        lora_dropout=args.lora_dropout,
        fused_ce=not args.no_fused_ce,
        fused_ce_impl="chunked" if args.chunked_ce else "triton",
        ce_chunk_tokens=args.ce_chunk_tokens,
        kbit_upcast=args.qlora_upcast,
        offload_activations=args.offload_activations,
        optimizer=args.optimizer,
        num_gpus=num_gpus,
        zero_stage=args.zero,
        offload=args.offload,
        grad_accum_steps=args.grad_accum,
        attention=args.attention,
        dataset_tokens=args.dataset_tokens,
        target_share=args.target_share,
        price_per_gpu_hour=args.price_per_gpu_hour,
    )
    if target.cpu_only:  # the kernels of a CPU run, as the planner weighs it
        from core.plan.candidates import on_the_cpu

        plan = on_the_cpu(plan)
    from core.estimate.domain import domain_json

    result = estimate(plan, gpu)
    # What the wizard says of each figure's footing: its measured band, or why it was not measured.
    domain = domain_json(plan, None if target.cpu_only else gpu, result.waits_on_cpu)  # as plan says the CPU's
    from core.hub.config_cache import source_json, weights_not_here

    weights = weights_not_here(plan.architecture.source)  # sized from a hub's config.json: train downloads them
    if weights:
        print(weights, file=sys.stderr)
    from core.plan.rules import past_positions

    # as plan warns of the same plan (a sequence past the model's trained positions), its JSON's "warnings" too
    warnings = past_positions(plan)
    if args.json:
        print(json.dumps({**result.to_json(), "domain": domain, "model_source": source_json(plan.architecture.source),
                          "warnings": [w.to_json() for w in warnings]}, indent=2, ensure_ascii=False))
        return 0
    print(format_estimate(result, domain, target.cpu_only))
    for note in result.notes:
        print(t(f"estimate.note.{note}"), file=sys.stderr)
    for warning in warnings:
        print(warning.text(), file=sys.stderr)
    return 0


def estimate_target(hardware: str, gpus: int | None) -> Any:
    """The hardware ``--hardware`` (``--gpu``) and ``--gpus`` describe, read as ``plan --hardware`` reads it
    (``H200``, ``8xH200``, ``cpu``: this box's CPU, sized against its RAM). ``--gpus`` gives the count where
    the hardware names none; a count in both that differs is refused (raises ``CliError``, exit 2), not one
    of them taken quietly."""
    import re
    from dataclasses import replace

    from core.errors import CliError
    from core.plan.hardware import on_this_host, parse_target

    target = parse_target(hardware)  # a HardwareError (exit 2) names the GPUs it knows
    if target.cpu_only:
        from core.plan.commands import detect_target

        if gpus not in (None, 1):
            raise CliError(t("estimate.error.gpus_cpu", gpus=gpus), 2)
        return on_this_host(target, detect_target(None, None))
    # 8xH200, or H200x8 (a count after the name, as rental sites write it)
    counted = re.match(r"\s*\d+\s*[xX×*]", hardware) is not None or target.count != 1
    if gpus is None or gpus == target.count:
        return target
    if counted:
        raise CliError(t("estimate.error.gpus_conflict", hardware=hardware, count=target.count, gpus=gpus), 2)
    return replace(target, count=gpus)


def _bar(fraction: float) -> str:
    filled = max(0, min(BAR_WIDTH, round(fraction * BAR_WIDTH)))
    return "█" * filled + "·" * (BAR_WIDTH - filled)


def format_estimate(result: Any, domain: dict[str, Any] | None = None, cpu_only: bool = False) -> str:
    """The human form: title, breakdown table with bars, peak, verdict, params, RAM and speed; with ``domain``
    (``core.estimate.domain.domain_json``) the peak and the speed carry their band, as the wizard's do.
    ``cpu_only``: said of the CPU and its RAM, without the rows and figures only GPUs have (CUDA context,
    NCCL buffers, per GPU, MFU)."""
    from core.plan.view import figure_notes
    from core.text_width import pad

    memory_note, speed_note = figure_notes({"domain": domain, "measured": False}) if domain else ("", "")

    plan = result.plan
    lines = [
        t("estimate.title_cpu" if cpu_only else "estimate.title", model=result.model, gpus=plan["num_gpus"],
          gpu=result.gpu, method=plan["method"], precision=plan["precision"], batch=plan["micro_batch_size"],
          seq=plan["seq_len"]),
        "",
    ]
    peak = result.peak_gib or 1.0
    for key, gib in result.breakdown.items():
        if cpu_only and key in GPU_ONLY_ROWS:
            continue
        label = pad(t(f"estimate.breakdown.{key}"), LABEL_WIDTH)
        lines.append(f"  {label} {gib:8.2f} GiB  {_bar(gib / peak)}")
    lines.append("")
    phase = result.peak_phase
    if phase == "backward" and not plan["gradient_checkpointing"]:
        phase = "backward_plain"  # nothing recomputed: "checkpointed backward" was said of every plan
    peak_line = t("estimate.peak_cpu" if cpu_only else "estimate.peak", peak=result.peak_gib,
                  capacity=result.capacity_gib, phase=t(f"estimate.phase.{phase}"))
    lines.append(t("plan.with_note", text=peak_line, note=t("plan.band_note", band=memory_note))
                 if memory_note else peak_line)
    lines.append(t(f"estimate.verdict.{result.verdict}", headroom=result.headroom_gib, margin=result.margin_gib,
                   short=-result.headroom_gib))
    if not result.fits:
        lines.append(t(f"estimate.hint.{result.peak_phase}"))
    lines.append(t("estimate.params", total=f"{result.total_params:,}", trainable=f"{result.trainable_params:,}",
                   source=t(f"estimate.param_count.{result.param_count}")))
    lines.append(t("estimate.cpu_ram", cpu=result.cpu_ram_gib))
    speed_line = t("estimate.speed_cpu" if cpu_only else "estimate.speed", tps=result.tokens_per_s,
                   per_gpu=result.tokens_per_s_per_gpu, mfu=result.efficiency, step=result.seconds_per_step)
    lines.append(t("plan.with_note", text=speed_line, note=speed_note) if speed_note else speed_line)
    if result.epoch_hours is not None:
        tokens = plan["dataset_tokens"]
        # Like every duration in the app (a clock: "0:12", "2:08:36"): "{hours:.2f} h" said "0.00 h" for an
        # epoch of seconds.
        duration = format_duration(result.epoch_hours * 3600.0)
        if result.epoch_cost is not None:
            lines.append(t("estimate.epoch_cost", tokens=tokens, duration=duration,
                           cost=format_cost(result.epoch_cost)))
        else:
            lines.append(t("estimate.epoch", tokens=tokens, duration=duration))
    lines.append(t("estimate.speed_note"))
    return "\n".join(lines)
