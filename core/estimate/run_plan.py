"""A run's configuration as the estimator's ``TrainingPlan``: one mapping of run keys to plan fields, for
every place that estimates a run the engine is about to train (``checkpoint_layers: auto``, the host
memory ``offload_activations`` pins) rather than a plan the wizard is still choosing.

It resolves what the engine resolves at start the same way: the fused loss (Liger only where it is
installed and there is a GPU, else the chunked loss), the optimizer (``auto``: fused AdamW on CUDA),
the attention kernel, the LoRA targets.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def _value(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def plan_options_for_run(config: Any, num_gpus: int = 1, cuda: bool = True) -> dict[str, Any]:
    """``TrainingPlan`` fields for a run config (a ``RunConfig`` or its dict) on ``num_gpus`` GPUs of a box
    (``cuda``: False on a CPU). ``checkpoint_layers`` is kept as the run says (None for ``all``/``auto``)."""
    from core.estimate.architecture import normalise_lora_targets
    from core.estimate.plan import normalise_optimizer
    from core.train.fused_loss import resolve_fused_ce

    method = str(_value(config, "method", "lora"))
    precision = str(_value(config, "precision", "bf16"))
    fused = resolve_fused_ce(_value(config, "fused_ce", "auto"), cuda,
                             liger_installed=importlib.util.find_spec("liger_kernel") is not None)
    optimizer = str(_value(config, "optimizer", "auto"))
    if optimizer == "auto":
        optimizer = "adamw_fused" if cuda else "adamw"
    layers = _value(config, "checkpoint_layers", "all")
    tiled = _value(config, "tiled_mlp", "auto")
    chunk = _value(config, "ce_chunk_tokens", "auto")
    options: dict[str, Any] = {
        "method": method,
        "precision": "pure-bf16" if _value(config, "pure_bf16") and method == "full" else precision,
        "micro_batch_size": int(_value(config, "micro_batch_size", 1) or 1),
        "seq_len": int(_value(config, "max_seq_len", 2048) or 2048),
        "grad_accum_steps": int(_value(config, "gradient_accumulation", 1) or 1),
        "gradient_checkpointing": bool(_value(config, "gradient_checkpointing", True)),
        "checkpoint_layers": None if layers in (None, "all", "auto") else int(layers),
        "fused_ce": fused != "none",
        "fused_ce_impl": fused if fused in ("chunked", "triton") else "liger",
        "ce_chunk_tokens": None if chunk in (None, "auto") else int(chunk),
        "optimizer": normalise_optimizer(optimizer),
        "attention": "eager" if _value(config, "attn", "auto") == "eager" else "sdpa",
        "kbit_upcast": bool(_value(config, "qlora_upcast", False)),
        "offload_activations": bool(_value(config, "offload_activations", False)),
        "tiled_mlp": "false" if tiled in (False, "false") else tiled,
        "zero_stage": int(_value(config, "zero_stage", 0) or 0),
        "offload": str(_value(config, "offload", "none") or "none"),
        "num_gpus": max(1, int(num_gpus)),
    }
    if method != "full":
        options["lora_rank"] = int(_value(config, "lora_rank", 16) or 16)
        options["lora_dropout"] = float(_value(config, "lora_dropout", 0.05) or 0.0)
        options["lora_targets"] = normalise_lora_targets(_value(config, "lora_targets", "all-linear") or "all-linear")
        options["lora_input_upcast"] = bool(_value(config, "lora_input_upcast", False))
        # Only the key: the engine also runs ungrouped under lora_input_upcast and compile_layers, but the
        # speed fit's rows all ran ungrouped and are read as grouped (calibration.py), those switches' included.
        options["lora_grouped"] = bool(_value(config, "lora_grouped", True))
        # the fused dropout kernels run on GPUs (a CPU run takes torch's dropout)
        options["lora_dropout_fused"] = bool(_value(config, "lora_dropout_fused", True)) and cuda
        options["lora_swiglu_fused"] = bool(_value(config, "lora_swiglu_fused", True)) and cuda
        options["lora_swiglu_down"] = bool(_value(config, "lora_swiglu_down", True))
        options["lora_swiglu_db"] = bool(_value(config, "lora_swiglu_db", True))
        options["lora_fold_dh"] = bool(_value(config, "lora_fold_dh", True)) and cuda
        options["qlora_reuse_dequantised"] = bool(_value(config, "qlora_reuse_dequantised", True))
        options["recompute_skip_down"] = bool(_value(config, "recompute_skip_down", True))
        options["recompute_keep_lora_a"] = bool(_value(config, "recompute_keep_lora_a", False))
        options["rms_norm_rows"] = bool(_value(config, "rms_norm_rows", True)) and cuda
    return options


def plan_for_run(config: Any, num_gpus: int = 1, cuda: bool = True, **changes: Any) -> Any:
    """The ``TrainingPlan`` of a run config (``changes`` replace fields, e.g. ``checkpoint_layers``).
    Raises the estimator's errors for a model it cannot read."""
    from core.assets import resolve_model_name
    from core.estimate.estimator import plan_for_model

    options = {**plan_options_for_run(config, num_gpus, cuda), **changes}
    return plan_for_model(resolve_model_name(str(_value(config, "model", ""))), exact_count=False, **options)
