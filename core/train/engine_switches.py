"""Speed switches applied to the model once the Trainer has set it up (each a run key, plain one value away).

- ``lora_input_upcast: false`` (default): peft casts every LoRA layer's input to the adapter's dtype
  (fp32) before its dropout and ``lora_A``; under bf16 autocast the matmul casts it straight back to bf16.
  That round trip is lossless (bf16 -> fp32 -> bf16) but costs a full-size fp32 copy of every LoRA
  input, seven per decoder block, forward and recompute. With the cast off the adapters stay fp32 (the
  optimizer's master weights and state are untouched) and autocast still does their matmuls in bf16, so
  the maths are those of the plain recipe; only the dropout runs on the bf16 tensor.
- ``lora_fused_add: true`` (default): each LoRA layer adds its scaled update inside the ``lora_B`` matmul
  (``addmm``: result + scaling x (h @ B^T) in the GEMM's epilogue) instead of a matmul, a multiply by the
  scale and an add, three full-size passes over the layer's output, forward and backward. The same sum,
  rounded once instead of three times. A base output wider than the autocast dtype (a 4-bit base on
  ``qlora_upcast``'s fp32 input returns fp32) takes peft's add in that dtype: autocast would round addmm's.
- ``checkpoint_layers: N``: gradient checkpointing on the first N decoder layers only (``all``: every
  layer, the plain behaviour). A layer that is not checkpointed keeps its activations and is not
  recomputed: each one costs its activation memory and saves its share of the recompute, so a card with
  room to spare runs faster. ``auto`` is resolved before launch by ``core.runs`` from the estimator.
- ``compile_layers: true``: ``torch.compile`` of each decoder layer (regional compilation: one graph
  shared by the identical layers, compiled once), fusing the element-wise work between the matmuls.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger("tunedeck.train")


def decoder_layers(model: Any) -> list[Any]:
    """The model's decoder blocks (transformers' checkpointable layers), in order."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer as block_type
    except ImportError:  # an older transformers: every module that carries the flag
        return [m for m in model.modules() if hasattr(m, "gradient_checkpointing") and hasattr(m, "self_attn")]
    return [m for m in model.modules() if isinstance(m, block_type)]


def mlp_ends_block(model: Any) -> bool:
    """Whether ``model``'s decoder blocks end ``residual + mlp(...)`` (``core.estimate.plan.MLP_ENDS_BLOCK``): then
    a checkpointed block's recomputation, which only refills what the block saved, need not compute the MLP's
    output (Gemma 2's post-MLP norm, for one, saves what it reads)."""
    from core.estimate.plan import MLP_ENDS_BLOCK

    return getattr(getattr(model, "config", None), "model_type", None) in MLP_ENDS_BLOCK


def in_backward() -> bool:
    """Whether this runs inside a backward pass (a checkpointed block's recomputation, a tiled MLP's tiles)."""
    import torch

    return torch._C._current_graph_task_id() != -1


def disable_lora_input_upcast(model: Any) -> int:
    """Keep LoRA inputs in the compute dtype under autocast (see the module docstring); returns how many
    layers. Without autocast (fp32 training, a bf16 model on a CPU) peft's cast stays: there the adapter's
    matmul needs its input in the adapter's dtype."""
    import torch

    count = 0
    for module in model.modules():
        if hasattr(module, "_cast_input_dtype") and hasattr(module, "lora_A") \
                and not getattr(module, "_tunedeck_bf16_inputs", False):
            original = module._cast_input_dtype

            def cast(x: Any, dtype: Any, original: Any = original) -> Any:
                if x is not None and torch.is_autocast_enabled(x.device.type):
                    return x  # autocast casts it back to the compute dtype for the matmul anyway
                return original(x, dtype)

            module._cast_input_dtype = cast
            module._tunedeck_bf16_inputs = True
            count += 1
    return count


FUSABLE = ("Linear", "Linear4bit", "Linear8bitLt")  # peft's LoRA layers over a linear base layer


def plain_lora_adapters(layer: Any, x: Any) -> list[str]:
    """The active adapters of a peft LoRA layer when all are plain LoRA that a faster path may run on ``x``
    (no DoRA or other variant, no ``lora_B`` bias, adapters not disabled or merged, and either autocast on or
    the adapters in ``x``'s dtype); else an empty list: peft's own forward must run."""
    import torch

    if layer.disable_adapters or layer.merged:
        return []
    adapters = [a for a in layer.active_adapters if a in layer.lora_A]
    if any(a in layer.lora_variant or layer.lora_B[a].bias is not None for a in adapters):
        return []
    if not torch.is_autocast_enabled(x.device.type) and any(layer.lora_A[a].weight.dtype != x.dtype for a in adapters):
        return []
    return adapters


def _fused_lora_forward(layer: Any, original: Any) -> Any:
    """``layer.forward`` with the LoRA update added by ``addmm`` (plain LoRA only; else ``original``)."""
    import torch

    def forward(x: Any, *args: Any, **kwargs: Any) -> Any:
        adapters = plain_lora_adapters(layer, x) if kwargs.get("adapter_names") is None else []
        if not adapters:
            return original(x, *args, **kwargs)
        result = layer.base_layer(x, *args, **kwargs)
        autocast = torch.is_autocast_enabled(x.device.type)
        # An fp32 base output under autocast (qlora_upcast: a 4-bit base returns its fp32 input's dtype): autocast
        # would round it to bf16 for addmm; peft adds the bf16 update to it in fp32, and so does this
        widened = autocast and result.dtype != torch.get_autocast_dtype(x.device.type)
        shape = result.shape
        flat = result.reshape(-1, shape[-1])
        for adapter in adapters:
            inputs = layer._cast_input_dtype(x, layer.lora_A[adapter].weight.dtype)  # lora_input_upcast
            hidden = layer.lora_A[adapter](layer.lora_dropout[adapter](inputs))
            if widened:
                result = result + layer.lora_B[adapter](hidden) * layer.scaling[adapter]
                continue
            weight = layer.lora_B[adapter].weight
            if not autocast:
                weight = weight.to(hidden.dtype)
            flat = torch.addmm(flat, hidden.reshape(-1, hidden.shape[-1]), weight.t(), alpha=layer.scaling[adapter])
        return result if widened else flat.view(shape)

    return forward


def fuse_lora_add(model: Any) -> int:
    """Give every LoRA linear layer the fused update (see the module docstring); returns how many."""
    count = 0
    for module in model.modules():
        if type(module).__name__ in FUSABLE and hasattr(module, "lora_A") and hasattr(module, "lora_variant") \
                and not getattr(module, "_tunedeck_fused_add", False):
            module.forward = _fused_lora_forward(module, module.forward)
            module._tunedeck_fused_add = True
            count += 1
    return count


def limit_checkpointed_layers(model: Any, count: int) -> int:
    """Checkpoint only the first ``count`` decoder layers; returns how many stay checkpointed."""
    kept = 0
    for index, layer in enumerate(decoder_layers(model)):
        if index >= count:
            layer.gradient_checkpointing = False
        kept += bool(getattr(layer, "gradient_checkpointing", False))
    return kept


def compile_decoder_layers(model: Any) -> int:
    """``torch.compile`` every decoder layer in place; returns how many."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile()
    return len(layers)


class EngineSwitchesCallback(TrainerCallback):
    """Applies ``checkpoint_layers``, ``lora_swiglu_fused``, ``rms_norm_rows``, ``lora_fold_dh``, ``tiled_mlp`` and
    ``compile_layers`` at train begin (the model on its device), after the Trainer has turned gradient
    checkpointing on and applied Liger's kernels (the fused SwiGLU goes back over Liger's MLP forward, the row
    kernels over Liger's norms, the tiled MLP wraps whichever), and before ``offload_activations`` reads which
    layers are checkpointed."""

    def __init__(self, checkpoint_layers: int | None, compile_layers: bool, tiled_mlp: Any = "false",
                 lora_swiglu: bool = False, rms_norm_rows: bool = False, lora_fold_dh: bool = False) -> None:
        self.checkpoint_layers = checkpoint_layers
        self.compile_layers = compile_layers
        self.tiled_mlp = tiled_mlp
        self.lora_swiglu = lora_swiglu
        self.rms_norm_rows = rms_norm_rows
        self.lora_fold_dh = lora_fold_dh

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            return
        if self.checkpoint_layers is not None and args_checkpointing(args):
            kept = limit_checkpointed_layers(model, self.checkpoint_layers)
            log.info("checkpoint_layers: %d of %d decoder layers checkpointed", kept, len(decoder_layers(model)))
        if self.lora_swiglu:  # over Liger's MLP forward, under the tiled MLP's
            from core.train.lora_group import fuse_lora_swiglu

            log.info("lora_swiglu_fused: the gate/up LoRA updates of %d MLPs inside the SwiGLU kernel",
                     fuse_lora_swiglu(model))
        if self.rms_norm_rows:  # over Liger's norm forwards
            from core.train.rms_norm_kernel import use_row_kernels

            log.info("rms_norm_rows: %d RMSNorms run their backward a row a program", use_row_kernels(model))
        if self.lora_fold_dh:
            from core.train.lora_group import home_lora_bases

            log.info("lora_fold_dh: %d base weights make their adapters' dh in their input-gradient matmul",
                     home_lora_bases(model))
        if self.tiled_mlp not in ("false", None):
            from core.train.tiled_mlp import AUTO_MIN_TOKENS, install_tiled_mlp

            count = install_tiled_mlp(model, self.tiled_mlp)
            if count:  # auto installs none where no block is checkpointed: nothing to say then
                log.info("tiled_mlp %s: the MLP of %d decoder layers runs over sequence tiles%s", self.tiled_mlp,
                         count, f" (micro-batches of {AUTO_MIN_TOKENS:,} tokens or more)" if self.tiled_mlp == "auto" else "")
        if self.compile_layers:
            log.info("compile_layers: %d decoder layers compiled", compile_decoder_layers(model))


def args_checkpointing(args: Any) -> bool:
    """Whether the TrainingArguments turn checkpointing on (under either name transformers uses)."""
    return bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", None))
