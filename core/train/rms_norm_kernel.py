"""``rms_norm_rows: true`` (default on GPUs): a frozen RMSNorm's backward one program a row.

Liger's RMSNorm (which the Trainer puts on Llama, Mistral and Qwen models) runs its backward as one program
an SM, each walking its share of the rows one after the other (248 rows each at b16 x 2048 on the H200's 132
SMs), and sums a weight gradient across them. With LoRA or QLoRA the norms' weights are frozen: no weight
gradient is wanted, and one row at a time leaves the memory idle while each row's reduction waits. Here the
backward is one program a row, as Liger's own forward already is (engine-speed-m's profile of the wizard's
7B plan: Liger's backward 0.356 ms a call over 56 calls a step, its forward 0.128 ms for two thirds of the
bytes). On the H200 at the plan's 32,768 x 3,584: forward + backward 0.467 ms a norm against Liger's 0.668
(step-parts-b); the plan +1.0% tokens/s, b4 x 2048 +0.4%, the same losses (engine-speed-p).

The arithmetic is Liger's "llama" casting (transformers' LlamaRMSNorm and Qwen2RMSNorm): forward
``y = round(x * rstd) * w`` with ``rstd = 1 / sqrt(mean(x^2) + eps)`` in fp32, the rounded product times the
weight rounded once; backward ``dx = rstd * (m - mean(m * x) * rstd^2 * x)`` with ``m = dy * w`` in fp32,
written over dy as Liger's ``in_place`` does. Only where Liger's module runs with that casting, no offset
and a frozen weight, on rows wider than 256 (narrower ones, Qwen3's per-head norms, Liger already runs a block
of rows a program); anything else keeps Liger's.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from core.train.lora_dropout_kernel import interpreted, row_strided

MIN_WIDTH = 257  # narrower rows: Liger's block kernel (several rows a program)


@triton.jit
def _rms_norm_rows_forward(x_ptr, w_ptr, y_ptr, rstd_ptr, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=ok, other=0.0)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=0) / n + eps)
    tl.store(rstd_ptr + row, rstd)
    y = (xf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)
    tl.store(y_ptr + row * n + cols, y.to(x.dtype), mask=ok)


@triton.jit
def _rms_norm_rows_backward(dy_ptr, dy_stride, dx_ptr, x_ptr, w_ptr, rstd_ptr, n, BLOCK: tl.constexpr):
    """dx (contiguous rows; dy's own memory where dy is contiguous) from dy (rows dy_stride apart)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    dy = tl.load(dy_ptr + row * dy_stride + cols, mask=ok, other=0.0)
    x = tl.load(x_ptr + row * n + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    m = dy.to(tl.float32) * w
    dx = rstd * m + rstd * (-(1.0 / n) * rstd * rstd * tl.sum(m * x, axis=0) * x)
    tl.store(dx_ptr + row * n + cols, dx.to(dy.dtype), mask=ok)


@triton.jit
def _add_rms_norm_rows_forward(a_ptr, b_ptr, h_ptr, w_ptr, y_ptr, rstd_ptr, n, eps, BLOCK: tl.constexpr):
    """``h = a + b`` rounded as torch's add rounds it, then ``_rms_norm_rows_forward`` of h."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    a = tl.load(a_ptr + row * n + cols, mask=ok, other=0.0)
    b = tl.load(b_ptr + row * n + cols, mask=ok, other=0.0)
    h = (a.to(tl.float32) + b.to(tl.float32)).to(a.dtype)
    tl.store(h_ptr + row * n + cols, h, mask=ok)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    hf = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / n + eps)
    tl.store(rstd_ptr + row, rstd)
    y = (hf * rstd).to(a.dtype).to(tl.float32) * w.to(tl.float32)
    tl.store(y_ptr + row * n + cols, y.to(a.dtype), mask=ok)


@triton.jit
def _add_rms_norm_rows_backward(dy_ptr, dy_stride, dh_ptr, dx_ptr, h_ptr, w_ptr, rstd_ptr, n, BLOCK: tl.constexpr,
                                HAS_DH: tl.constexpr):
    """The gradient of h: the norm's (``_rms_norm_rows_backward``, rounded to the dtype as that kernel returns it)
    plus h's own, ``dh``, rounded once, as autograd sums the two; it is the gradient of both a and b."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    dy = tl.load(dy_ptr + row * dy_stride + cols, mask=ok, other=0.0)
    h = tl.load(h_ptr + row * n + cols, mask=ok, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    m = dy.to(tl.float32) * w
    dx = (rstd * m + rstd * (-(1.0 / n) * rstd * rstd * tl.sum(m * h, axis=0) * h)).to(dy.dtype)
    if HAS_DH:
        dx = (dx.to(tl.float32) + tl.load(dh_ptr + row * n + cols, mask=ok, other=0.0).to(tl.float32)).to(dy.dtype)
    tl.store(dx_ptr + row * n + cols, dx, mask=ok)


def _launch_options(width: int) -> tuple[int, dict[str, int]]:
    block = triton.next_power_of_2(width)
    if interpreted():
        return block, {}
    return block, {"num_warps": 16 if block >= 8192 else 8 if block >= 2048 else 4}


class FrozenRMSNorm(torch.autograd.Function):
    """RMSNorm of ``x`` (..., width) with a frozen ``weight``: no gradient for it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        rows, width = x2.shape
        y = torch.empty_like(x2)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        block, options = _launch_options(width)
        _rms_norm_rows_forward[(rows,)](x2, weight, y, rstd, width, eps, BLOCK=block, **options)
        ctx.save_for_backward(x2, weight, rstd)
        return y.view(shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x2, weight, rstd = ctx.saved_tensors
        shape = grad.shape
        dy = row_strided(grad.reshape(-1, shape[-1]))
        # over dy where it is contiguous (Liger's in_place); rows of a wider gradient (lora_fold_dh) into a new one
        dx = dy if dy.is_contiguous() else torch.empty(x2.shape, dtype=dy.dtype, device=dy.device)
        block, options = _launch_options(x2.shape[1])
        _rms_norm_rows_backward[(x2.shape[0],)](dy, dy.stride(0), dx, x2, weight, rstd, x2.shape[1], BLOCK=block,
                                                **options)
        return dx.view(shape), None, None


class AddFrozenRMSNorm(torch.autograd.Function):
    """``h = a + b`` and the RMSNorm of h with a frozen ``weight`` in one pass each way (``rms_norm_residual``):
    returns (h, norm(h)). The same numbers as the add and ``FrozenRMSNorm`` apart, two reads and a write of the
    residual stream fewer (one forward, two in backward, where autograd summed h's two gradients in a kernel of
    its own)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        shape = a.shape
        a2, b2 = a.reshape(-1, shape[-1]).contiguous(), b.reshape(-1, shape[-1]).contiguous()
        rows, width = a2.shape
        h, y = torch.empty_like(a2), torch.empty_like(a2)
        rstd = torch.empty(rows, dtype=torch.float32, device=a.device)
        block, options = _launch_options(width)
        _add_rms_norm_rows_forward[(rows,)](a2, b2, h, weight, y, rstd, width, eps, BLOCK=block, **options)
        ctx.save_for_backward(h, weight, rstd)
        return h.view(shape), y.view(shape)

    @staticmethod
    def backward(ctx: Any, grad_h: torch.Tensor | None, grad_y: torch.Tensor | None) -> tuple[Any, ...]:
        h, weight, rstd = ctx.saved_tensors
        shape = (grad_y if grad_y is not None else grad_h).shape
        if grad_y is None:
            dx = grad_h
        else:
            dy = row_strided(grad_y.reshape(-1, shape[-1]))
            dh = None if grad_h is None else grad_h.reshape(-1, shape[-1]).contiguous()
            # over dy where it is contiguous (only this node reads it), else a new tensor
            dx = dy if dy.is_contiguous() else torch.empty(h.shape, dtype=dy.dtype, device=dy.device)
            block, options = _launch_options(h.shape[1])
            _add_rms_norm_rows_backward[(h.shape[0],)](dy, dy.stride(0), dy if dh is None else dh, dx, h, weight, rstd,
                                                       h.shape[1], BLOCK=block, HAS_DH=dh is not None, **options)
            dx = dx.view(shape)
        # the gradient of both summands, as autograd's add passes one tensor to both (their nodes only read it)
        return (dx if ctx.needs_input_grad[0] else None), (dx if ctx.needs_input_grad[1] else None), None, None


def usable(module: Any, x: torch.Tensor) -> bool:
    """Whether ``module`` (a norm Liger patched) runs here on ``x``: Liger's llama casting, no offset, a frozen
    weight in x's dtype, rows wider than 256, on CUDA (or Triton's CPU interpreter)."""
    weight = getattr(module, "weight", None)
    if weight is None or weight.requires_grad or weight.dtype != x.dtype or weight.dim() != 1:
        return False
    if getattr(module, "casting_mode", None) not in ("llama", 0) or float(getattr(module, "offset", 1.0)) != 0.0:
        return False
    if not getattr(module, "in_place", False) or x.shape[-1] < MIN_WIDTH or x.shape[-1] != weight.shape[0]:
        return False
    return x.is_cuda or (interpreted() and x.device.type == "cpu")


def _row_forward(module: Any, original: Any) -> Any:
    def forward(x: torch.Tensor) -> torch.Tensor:
        handed = getattr(module, "_tunedeck_handed", None)
        if handed is not None:  # the block before made this norm's output with its residual add (rms_norm_residual)
            module._tunedeck_handed = None
            if handed[0] is x:
                return handed[1]
        if usable(module, x):
            return FrozenRMSNorm.apply(x, module.weight, float(module.variance_epsilon))
        return original(x)

    forward.tunedeck_rms_rows = True  # type: ignore[attr-defined]
    return forward


def use_row_kernels(model: Any) -> int:
    """Put the row kernels over every RMSNorm of ``model`` that Liger patched (they check each call whether
    they apply; otherwise Liger's forward runs). Returns how many norms have them; idempotent."""
    count = 0
    for module in model.modules():
        if not hasattr(module, "casting_mode") or not hasattr(module, "variance_epsilon"):
            continue
        if not getattr(module.forward, "tunedeck_rms_rows", False):
            module.forward = _row_forward(module, module.forward)
        count += 1
    return count


def _checkpointed(block: Any) -> bool:
    return bool(getattr(block, "gradient_checkpointing", False))


def _residual_forward(block: Any, following: Any, original: Any) -> Any:
    """``block``'s forward with its residual adds inside the norms after them (``rms_norm_residual``): the
    attention's add with ``post_attention_layernorm``, the MLP's with ``following`` (the next block's
    ``input_layernorm`` or the model's last norm), whose output is handed to it (not where the next block is
    checkpointed: its recompute would make that output a second time). A checkpointed block runs its own forward,
    which is where transformers checkpoints it (``original``), as does anything the row kernels do not take."""

    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        post = block.post_attention_layernorm
        if args or _checkpointed(block) or not (block.training and torch.is_grad_enabled()
                                                 and usable(post, hidden_states)):
            return original(hidden_states, *args, **kwargs)
        normed = block.input_layernorm(hidden_states)
        attention, _ = block.self_attn(hidden_states=normed, **kwargs)
        if attention.dtype != hidden_states.dtype:  # a promoting add: torch's, and the rest as the block does it
            hidden_states = hidden_states + attention
            return hidden_states + block.mlp(post(hidden_states))
        hidden_states, normed = AddFrozenRMSNorm.apply(hidden_states, attention, post.weight,
                                                       float(post.variance_epsilon))
        mlp = block.mlp(normed)
        if following is None or _checkpointed(following[1]) or mlp.dtype != hidden_states.dtype \
                or not usable(following[0], hidden_states):
            return hidden_states + mlp
        norm = following[0]
        out, normed = AddFrozenRMSNorm.apply(hidden_states, mlp, norm.weight, float(norm.variance_epsilon))
        norm._tunedeck_handed = (out, normed)
        return out

    forward.tunedeck_residual = True  # type: ignore[attr-defined]
    return forward


def _final_norm(model: Any, first: Any) -> Any:
    """The norm after the decoder blocks: the ``norm`` of the module whose ``layers`` hold ``first``."""
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) and layers[0] is first:
            return getattr(module, "norm", None)
    return None


def fuse_residual_norms(model: Any) -> int:
    """``rms_norm_residual``: give each decoder block of a model whose blocks are ``x + attn(norm(x))`` then
    ``h + mlp(norm(h))`` (``core.estimate.plan.MLP_ENDS_BLOCK``: Llama, Mistral, Qwen2, Qwen3) the forward of
    ``_residual_forward``, over norms that have the row kernels (``use_row_kernels`` first). Returns how many
    blocks; idempotent. Each call still checks that the row kernels apply, else the block's own forward runs."""
    from core.train.engine_switches import decoder_layers, mlp_ends_block

    if not mlp_ends_block(model):
        return 0
    blocks = [b for b in decoder_layers(model)
              if all(hasattr(b, name) for name in ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp"))]
    if not blocks:
        return 0
    last = _final_norm(model, blocks[0])
    norms = [n for b in blocks for n in (b.input_layernorm, b.post_attention_layernorm)] + [last] * (last is not None)
    if not all(getattr(n.forward, "tunedeck_rms_rows", False) for n in norms):
        return 0  # the row kernels are not over this model's norms
    for i, block in enumerate(blocks):
        if not getattr(block.forward, "tunedeck_residual", False):
            following = (blocks[i + 1].input_layernorm, blocks[i + 1]) if i + 1 < len(blocks) else \
                None if last is None else (last, last)
            block.forward = _residual_forward(block, following, block.forward)
    return len(blocks)
