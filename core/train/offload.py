"""Gradient checkpointing whose kept block inputs live in host memory (``offload_activations: true``).

With checkpointing a decoder keeps one tensor per block for backward: the block's input (tokens x
hidden in the compute dtype). At long sequences these dominate what stays on the GPU — 28 blocks x
32k tokens x 3584 x 2 bytes = 6.6 GB for a 7B model. Here each block's input is copied to the CPU before
the checkpointed block runs; the block (and its recomputation in backward) copies it back, so only the
block being computed has its input on the GPU. The price is PCIe traffic (about five copies of each
block input per step), small against the compute of a long sequence, not against short ones: the
switch is off by default.

transformers' checkpointed layers call ``module._gradient_checkpointing_func(forward, hidden, ...)``;
``install_offloaded_checkpointing`` replaces that function on every checkpointed module after the
Trainer has enabled checkpointing (``OffloadedCheckpointingCallback``, at train begin).
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

log = logging.getLogger("tunedeck.train")


def offloaded_checkpoint(function: Any, *args: Any, park_device: str = "cpu", force: bool = False) -> Any:
    """``torch.utils.checkpoint`` (non-reentrant) of ``function(*args)`` with ``args[0]`` kept on
    ``park_device``; ``force`` takes the parking path even when the input is already there (tests)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    if not args or not torch.is_tensor(args[0]) or (args[0].device.type == park_device and not force):
        return checkpoint(function, *args, use_reentrant=False)
    hidden, rest = args[0], args[1:]
    device = hidden.device
    parked = hidden.to(park_device)  # differentiable: the input's gradient comes back to ``device``

    def run(parked_input: Any, _anchor: Any, *more: Any) -> Any:
        return function(parked_input.to(device), *more)

    # checkpoint saves and restores the RNG state only of the devices its tensor arguments live on: with
    # the parked (CPU) input alone it would leave the GPU's out, and the recomputation's dropout masks
    # (LoRA dropout) would differ from the forward's. An empty tensor on ``device`` puts that device in.
    return checkpoint(run, parked, hidden.new_empty(0), *rest, use_reentrant=False)


def install_offloaded_checkpointing(model: Any, **kwargs: Any) -> int:
    """Use ``offloaded_checkpoint`` in every checkpointed decoder block; returns how many."""
    from functools import partial

    try:
        from transformers.modeling_layers import GradientCheckpointingLayer as block_type
    except ImportError:  # an older transformers: every module that carries the flag
        block_type = object
    count = 0
    for module in model.modules():
        if (isinstance(module, block_type) and getattr(module, "gradient_checkpointing", False)
                and hasattr(module, "_gradient_checkpointing_func")):
            module._gradient_checkpointing_func = partial(offloaded_checkpoint, **kwargs) if kwargs else offloaded_checkpoint
            count += 1
    return count


class OffloadedCheckpointingCallback(TrainerCallback):
    """Installs the offloaded checkpoint once the Trainer has turned gradient checkpointing on."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            return
        count = install_offloaded_checkpointing(model)
        log.info("offload_activations: %d checkpointed blocks keep their input in host memory", count)
