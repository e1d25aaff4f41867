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
