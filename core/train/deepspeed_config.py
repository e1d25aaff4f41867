"""The DeepSpeed JSON a run uses, generated from its configuration and kept in the run dir (readable).

Batch sizes, clipping and precision are written as concrete values (they must agree with the Trainer's,
which come from the same run config); bucket sizes stay ``"auto"`` so that transformers sizes them from
the model's hidden size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.atomic_file import write_atomic


def deepspeed_config(cfg: dict[str, Any], world_size: int, use_bf16: bool, use_fp16: bool) -> dict[str, Any]:
    """A ZeRO-1/2/3 config (with CPU offload of the optimizer, or of optimizer and parameters)."""
    stage = int(cfg.get("zero_stage") or 0)
    offload = str(cfg.get("offload") or "none")
    micro = int(cfg.get("micro_batch_size") or 1)
    accum = int(cfg.get("gradient_accumulation") or 1)
    zero: dict[str, Any] = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if stage in (1, 2):
        zero["allgather_bucket_size"] = 200_000_000
    if stage == 3:
        zero.update({
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_max_live_parameters": 1_000_000_000,
            "stage3_max_reuse_distance": 1_000_000_000,
            # Save whole 16-bit weights with the checkpoint so that merge/chat do not need DeepSpeed.
            "stage3_gather_16bit_weights_on_model_save": True,
        })
    if offload in ("optimizer", "all") and stage >= 2:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload == "all" and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    max_grad_norm = float(cfg.get("max_grad_norm") or 0.0)
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "train_batch_size": micro * accum * max(1, world_size),
        "gradient_clipping": max_grad_norm if max_grad_norm > 0 else 0.0,
        "bf16": {"enabled": bool(use_bf16)},
        "fp16": {"enabled": bool(use_fp16), "loss_scale": 0, "initial_scale_power": 16},
        "zero_optimization": zero,
        # The Trainer builds the optimizer; DeepSpeed accepts it under ZeRO.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    if "offload_optimizer" in zero:
        # CPU offload needs DeepSpeed's own CPU Adam: let DeepSpeed create it with the Trainer's values.
        config["optimizer"] = {
            "type": "AdamW",
            "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
        }
    return config


def write_deepspeed_config(path: Path, config: dict[str, Any]) -> Path:
    import json

    write_atomic(path, json.dumps(config, indent=2) + "\n")
    return path


# What the generated config says because the run configuration says it (the Trainer must agree): these
# keep tunedeck's value in a merge. Everything else in the user's JSON is kept as the user wrote it.
_OWNED = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
          "gradient_clipping", "bf16.enabled", "fp16.enabled", "zero_optimization.stage")


def merge_user_config(generated: dict[str, Any], user: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The user's DeepSpeed JSON over tunedeck's generated one, and one note per value tunedeck set.

    The user's keys win, except the owned ones (batch sizes, clipping, precision, ZeRO stage, an optimizer's
    betas and eps), which come
    from the run configuration; ``core.config.deepspeed_file`` has already brought the user's concrete
    values into it, so they differ only where the YAML said otherwise (named when the config was checked)
    or where the user wrote ``"auto"`` (filled in here). Offload sections follow ``offload``.
    """
    import copy

    merged = copy.deepcopy(user)
    notes: list[str] = []

    def fill(target: dict[str, Any], source: dict[str, Any], prefix: str) -> None:
        for key, value in source.items():
            if key not in target:
                target[key] = copy.deepcopy(value)
            elif isinstance(value, dict) and isinstance(target[key], dict):
                fill(target[key], value, f"{prefix}{key}.")

    fill(merged, generated, "")
    for dotted in _OWNED:
        *parents, leaf = dotted.split(".")
        ours: Any = generated
        theirs: Any = merged
        for part in parents:
            ours = ours.get(part, {}) if isinstance(ours, dict) else {}
            if not isinstance(theirs.get(part), dict):
                theirs[part] = {}
            theirs = theirs[part]
        if leaf not in ours:
            continue
        if theirs.get(leaf) != ours[leaf]:
            notes.append(f"{dotted}: {json.dumps(theirs.get(leaf))} -> {json.dumps(ours[leaf])}")
            theirs[leaf] = ours[leaf]
    params = merged.get("optimizer", {}).get("params") if isinstance(merged.get("optimizer"), dict) else None
    if isinstance(params, dict):
        # the Trainer fills "auto" with adam_beta1/adam_beta2/adam_epsilon, which took the JSON's values when
        # checked (core.config.deepspeed_file); a concrete value the YAML overrides would stop transformers
        for leaf in ("betas", "eps"):
            if leaf in params and params[leaf] != "auto":
                notes.append(f"optimizer.params.{leaf}: {json.dumps(params[leaf])} -> \"auto\"")
                params[leaf] = "auto"
    zero = merged.get("zero_optimization", {})
    for section in ("offload_optimizer", "offload_param"):
        wanted = generated.get("zero_optimization", {}).get(section)
        if wanted is None and isinstance(zero.get(section), dict) and \
                str(zero[section].get("device", "none")).lower() != "none":
            notes.append(f"zero_optimization.{section}: removed (offload)")
            del zero[section]
    return merged, notes
