"""The decoder's MLP over tiles of the sequence (``tiled_mlp``), so long sequences fit.

At long sequences the MLP's intermediate tensors set the peak: for a 7B (intermediate 18,944) at 96k
tokens each one is 3.6 GB in bf16, and the backward of one block holds several (gate, up, their
gradients, the product). Arctic Long Sequence Training (Snowflake, built on DeepSpeed) computes the MLP
tile by tile along the sequence instead; the MLP works token by token, so the result is the same.

``TiledMLP`` is an autograd function: its forward runs the MLP on each tile without keeping anything
but the MLP's input; its backward recomputes one tile at a time with autograd on and back-propagates
it, so at most one tile's intermediates exist at once. The gradients of the MLP's weights (LoRA's or
all of them) accumulate over the tiles. The RNG state of the forward is replayed for the recomputation,
so LoRA dropout draws the same masks.

Inside a checkpointed decoder block the block's forward is run a second time in backward only to refill
the tensors it saved; the tiled MLP saves only its input, so in that recomputation it skips its own
compute (``skip_in_recompute``, set for non-reentrant checkpointing only, in blocks whose MLP output only
ends the block) and the tiled MLP costs no more MLP forwards than plain checkpointing: one forward, one
recomputation. Where something after the MLP saves what it reads (Gemma 2's post-MLP norm) the recomputation
computes the MLP's output: left uninitialised, it made the gradients NaN (a CPU test).

Run key ``tiled_mlp``: ``false`` (plain), ``auto`` (the default: in checkpointed blocks, tiles of about
``hidden_size`` tokens once a micro-batch holds ``AUTO_MIN_TOKENS`` tokens or more, else plain; the
launcher makes it ``false`` where the run fits its GPU untiled, ``core.estimate.checkpointing``) or a tile
count (every block). A block that is not checkpointed pays one more MLP forward for its tiles (the
backward's recomputation), which is why ``auto`` leaves those alone.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

log = logging.getLogger("tunedeck.train")

AUTO_MIN_TOKENS = 16_384  # below this the MLP's intermediates are small next to the weights


def tiles_for(setting: Any, tokens: int, hidden_size: int) -> int:
    """How many tiles the MLP of a micro-batch of ``tokens`` tokens runs in (1: not tiled)."""
    if setting in (None, False, "false", 0, 1) or tokens <= 0:
        return 1
    if setting in (True, "auto", "true"):
        if tokens < AUTO_MIN_TOKENS:
            return 1
        return max(1, math.ceil(tokens / max(1, hidden_size)))
    return max(1, min(int(setting), tokens))


def _autocast_state(device_type: str) -> tuple[bool, Any]:
    import torch

    return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


@functools.cache
def _function() -> Any:
    """The autograd function, built on first use (torch is imported only by the engine)."""
    import torch

    from core.train.engine_switches import in_backward

    class TiledMLP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, mlp: Any, tiles: int, skip_in_recompute: bool, x: Any) -> Any:
            device_type = x.device.type
            ctx.mlp, ctx.tiles = mlp, tiles
            ctx.autocast = _autocast_state(device_type)
            ctx.devices = [x.device] if x.is_cuda else []
            ctx.cpu_rng = torch.get_rng_state()
            ctx.device_rng = [torch.cuda.get_rng_state(d) for d in ctx.devices]
            ctx.save_for_backward(x)
            if skip_in_recompute and in_backward():
                # A checkpointed block's recomputation: only the saved input matters, the output is dropped.
                return torch.empty_like(x)
            flat = x.reshape(-1, x.shape[-1])
            with torch.no_grad():
                out = torch.cat([mlp(tile) for tile in flat.tensor_split(tiles)], dim=0)
            return out.view(*x.shape[:-1], out.shape[-1])

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            (x,) = ctx.saved_tensors
            flat = x.reshape(-1, x.shape[-1])
            grads = grad_out.reshape(-1, grad_out.shape[-1]).tensor_split(ctx.tiles)
            grad_x = torch.empty_like(flat) if x.requires_grad else None
            enabled, dtype = ctx.autocast
            start = 0
            with torch.random.fork_rng(devices=ctx.devices):
                torch.set_rng_state(ctx.cpu_rng)
                for device, state in zip(ctx.devices, ctx.device_rng, strict=True):
                    torch.cuda.set_rng_state(state, device)
                for tile, grad in zip(flat.tensor_split(ctx.tiles), grads, strict=True):
                    leaf = tile.detach().requires_grad_(x.requires_grad)
                    with torch.enable_grad(), torch.autocast(x.device.type, dtype=dtype, enabled=enabled):
                        out = ctx.mlp(leaf)
                    torch.autograd.backward(out, grad)  # the weights' gradients accumulate tile by tile
                    if grad_x is not None:
                        grad_x[start:start + tile.shape[0]].copy_(leaf.grad)
                    start += tile.shape[0]
            return None, None, None, (grad_x.view_as(x) if grad_x is not None else None)

    return TiledMLP


def tiled_forward(mlp_forward: Any, x: Any, tiles: int, skip_in_recompute: bool) -> Any:
    """``mlp_forward(x)`` over ``tiles`` tiles of the flattened tokens (plain when 1 or no grad)."""
    import torch

    if tiles <= 1 or not torch.is_grad_enabled():
        return mlp_forward(x)
    return _function().apply(mlp_forward, tiles, skip_in_recompute, x)


def install_tiled_mlp(model: Any, setting: Any, skip_in_recompute: bool | None = None) -> int:
    """Tile the MLP of the decoder blocks (``auto``: the checkpointed ones; each call picks its tile count
    from its own token count, see ``tiles_for``); returns how many blocks. ``skip_in_recompute`` needs non-reentrant checkpointing
    (the engine's) and a block that reads the MLP's output only to end (default: whether the model's type is one
    of ``core.estimate.plan.MLP_ENDS_BLOCK``; Gemma 2's post-MLP norm saves what it reads)."""
    from core.train.engine_switches import decoder_layers, mlp_ends_block

    if skip_in_recompute is None:
        skip_in_recompute = mlp_ends_block(model)

    layers = [layer for layer in decoder_layers(model) if hasattr(layer, "mlp")
              and (setting != "auto" or getattr(layer, "gradient_checkpointing", False))]
    if not layers or tiles_for(setting, 1 << 40, 1) <= 1:
        return 0
    hidden = int(getattr(getattr(model, "config", None), "hidden_size", 0) or layers[0].mlp.gate_proj.in_features)
    for layer in layers:
        mlp = layer.mlp
        if not hasattr(mlp, "_tunedeck_tiled"):
            original = mlp.forward

            def forward(x: Any, *args: Any, _mlp: Any = mlp, _original: Any = original, **kwargs: Any) -> Any:
                tiles = tiles_for(_mlp._tunedeck_tiled, x.numel() // max(1, x.shape[-1]), hidden)
                if args or kwargs:
                    return _original(x, *args, **kwargs)
                return tiled_forward(_original, x, tiles, skip_in_recompute)

            mlp.forward = forward
        mlp._tunedeck_tiled = setting
    return len(layers)
