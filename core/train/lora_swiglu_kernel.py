"""``lora_swiglu_fused: true`` (the default on GPUs): the gate/up LoRA updates added inside the SwiGLU kernel.

A LoRA decoder MLP computes ``down(silu(gate) * up)`` with ``gate = x Wg^T + sg hg Bg^T`` and likewise ``up``
(``h = dropout(x) A^T``, rank r). The grouped engine (``core.train.lora_group``) adds each rank-r update in
the epilogue of a skinny ``lora_B`` matmul that reads and writes the whole base output once more: on a 7B
(intermediate 18,944) the gate/up adds are ~2 x 620 MB of traffic a block and pass at 8,192 tokens, about
21 ms of a checkpointed step on the H200 (engine-speed-ce-b's profile: 34.8 ms of such adds, gate/up
three quarters of it). The SwiGLU kernel reads gate and up anyway: here it computes the two rank-r products
for its tile itself (a 16-wide ``tl.dot`` each, from h and B, both tiny) and adds them in fp32 before the
activation, so the base outputs are written once, by their matmuls, and never read back for the add.

Backward recomputes the pre-activations the same way from the kept base outputs (as Liger's SwiGLU keeps
gate and up) and writes their gradient in place over them. The gradients of the grouped node's outputs are
those of the full pre-activations, so the adapters' and the input's gradients are computed as before
(``lora_group``).

The roundings are the plain path's: each sum is rounded to the compute dtype as the ``lora_B`` matmul's
epilogue rounds it, and silu's result before the product as Liger's SwiGLU does. This matters more than it
looks: early in training a LoRA update is a few units in the last place of a bf16 base output, and the first
H200 runs of this kernel, which took the activation of the unrounded fp32 sum, ended 10 steps of the 7B rows
0.08-0.10 below the plain recipe's loss (11.435 against 11.532; engine-speed-swiglu-b): not a bug, a
more exact forward, but another run than the one it replaces.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from core.train.lora_dropout_kernel import interpreted, load_tiles

MAX_RANK = 128
# Rows x columns a program and warps, by kernel: the fastest of bench/lora_swiglu_kernel.py's grid on the H200
# at 8,192 x 18,944, rank 16 (lora-swiglu-kernel): forward 0.366 ms against 0.791 for the two adds and Liger's
# forward; backward 0.613 against Liger's 0.420 (it recomputes the two rank-r products)
TILES = {"forward": {"BM": 16, "BN": 256, "num_warps": 4}, "backward": {"BM": 32, "BN": 128, "num_warps": 4}}
TILES_ENV = "TUNEDECK_LORA_SWIGLU_TILES"  # that bench's JSON: its "overall" tiles replace these

load_tiles(TILES, TILES_ENV)


def usable(x: torch.Tensor, elements: int, rank: int) -> bool:
    """Whether the kernels run on gate/up outputs of ``elements`` elements from input ``x`` at this rank: on
    CUDA (or Triton's CPU interpreter) in a float dtype, small enough for 32-bit offsets."""
    if not (x.is_cuda or (interpreted() and x.device.type == "cpu")):
        return False
    return x.dtype in (torch.bfloat16, torch.float16, torch.float32) and 0 < rank <= MAX_RANK and elements < 2**31


@triton.jit
def _pre_activations(g_ptr, u_ptr, h_ptr, b_ptr, rows, cols, n_rows, n, sg, su,
                     R: tl.constexpr, RP: tl.constexpr, PREC: tl.constexpr):
    """The gate and up of a tile: base outputs plus ``s h B^T`` of each (h: rows x 2R = [hg | hu],
    b: n x 2R = [Bg | Bu]), summed in fp32 and rounded to the outputs' dtype, as the ``lora_B`` matmul's
    epilogue rounds them (returned in fp32)."""
    rr = tl.arange(0, RP)
    row_ok = rows < n_rows
    col_ok = cols < n
    ok = row_ok[:, None] & col_ok[None, :]
    h_at = h_ptr + rows[:, None] * (2 * R) + rr[None, :]
    h_ok = row_ok[:, None] & (rr[None, :] < R)
    b_at = b_ptr + cols[None, :] * (2 * R) + rr[:, None]  # B^T tile (RP x BN)
    b_ok = (rr[:, None] < R) & col_ok[None, :]
    lora_g = tl.dot(tl.load(h_at, mask=h_ok, other=0.0), tl.load(b_at, mask=b_ok, other=0.0), input_precision=PREC)
    lora_u = tl.dot(tl.load(h_at + R, mask=h_ok, other=0.0), tl.load(b_at + R, mask=b_ok, other=0.0),
                    input_precision=PREC)
    at = rows[:, None] * n + cols[None, :]
    dtype = g_ptr.dtype.element_ty
    gate = (tl.load(g_ptr + at, mask=ok, other=0.0).to(tl.float32) + lora_g * sg).to(dtype).to(tl.float32)
    up = (tl.load(u_ptr + at, mask=ok, other=0.0).to(tl.float32) + lora_u * su).to(dtype).to(tl.float32)
    return gate, up, at, ok


@triton.jit
def _lora_swiglu_forward(g_ptr, u_ptr, h_ptr, b_ptr, c_ptr, n_rows, n, sg, su,
             R: tl.constexpr, RP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    gate, up, at, ok = _pre_activations(g_ptr, u_ptr, h_ptr, b_ptr, rows, cols, n_rows, n, sg, su, R, RP, PREC)
    silu = (gate * tl.sigmoid(gate)).to(c_ptr.dtype.element_ty).to(tl.float32)  # rounded as Liger's SwiGLU
    tl.store(c_ptr + at, (silu * up).to(c_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _lora_swiglu_backward(dc_ptr, g_ptr, u_ptr, h_ptr, b_ptr, n_rows, n, sg, su,
              R: tl.constexpr, RP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """d gate and d up written over the base outputs (their last use)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    gate, up, at, ok = _pre_activations(g_ptr, u_ptr, h_ptr, b_ptr, rows, cols, n_rows, n, sg, su, R, RP, PREC)
    dc = tl.load(dc_ptr + at, mask=ok, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    d_gate = dc * (silu * (1.0 - sig) + sig) * up  # Liger's order of the same products
    tl.store(g_ptr + at, d_gate.to(g_ptr.dtype.element_ty), mask=ok)
    tl.store(u_ptr + at, (dc * silu).to(u_ptr.dtype.element_ty), mask=ok)


def _launch(kernel: Any, tensors: tuple[torch.Tensor, ...], gate: torch.Tensor, rank: int, sg: float,
            su: float, tiles: dict[str, int]) -> None:
    rows, n = gate.shape
    tiles = dict(tiles)
    if interpreted():
        tiles = {"BM": 16, "BN": 32}
    grid = (triton.cdiv(rows, tiles["BM"]), triton.cdiv(n, tiles["BN"]))
    kernel[grid](*tensors, rows, n, sg, su, R=rank, RP=max(16, 1 << (rank - 1).bit_length()),
                 PREC="ieee" if gate.dtype == torch.float32 else "tf32", **tiles)


def forward(gate: torch.Tensor, up: torch.Tensor, hidden: torch.Tensor, b: torch.Tensor, sg: float,
            su: float, tiles: dict[str, int] | None = None) -> torch.Tensor:
    """``silu(gate + sg hg Bg^T) * (up + su hu Bu^T)``: gate, up (rows x n), hidden = [hg | hu] (rows x 2r),
    b = [Bg | Bu] (n x 2r), all contiguous in one dtype; returns rows x n in that dtype."""
    out = torch.empty_like(gate)
    _launch(_lora_swiglu_forward, (gate, up, hidden, b, out), gate, hidden.shape[1] // 2, sg, su,
            tiles or TILES["forward"])
    return out


def backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, hidden: torch.Tensor, b: torch.Tensor,
             sg: float, su: float, tiles: dict[str, int] | None = None) -> None:
    """The gradients of the full gate and up pre-activations for ``grad`` of the product, written in place
    over ``gate`` and ``up``."""
    _launch(_lora_swiglu_backward, (grad, gate, up, hidden, b), gate, hidden.shape[1] // 2, sg, su,
            tiles or TILES["backward"])


class LoRASwiGLU(torch.autograd.Function):
    """``silu(gate + lora_g) * (up + lora_u)`` where ``gate`` and ``up`` are the grouped node's outputs
    without their LoRA updates (``lora_group``'s ``defer``): the gradients returned are those of the full
    pre-activations, which is what that node's backward takes. ``hidden`` and ``b`` carry no gradient here
    (the grouped node computes the adapters' gradients from these)."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor, hidden: torch.Tensor, b: torch.Tensor,
                sg: float, su: float) -> torch.Tensor:
        shape = gate.shape
        gate2, up2 = gate.reshape(-1, shape[-1]), up.reshape(-1, shape[-1])
        ctx.save_for_backward(gate2, up2, hidden, b)
        ctx.scales = (sg, su)
        return forward(gate2, up2, hidden, b, sg, su).view(shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        gate, up, hidden, b = ctx.saved_tensors
        shape = grad.shape
        backward(grad.reshape(-1, shape[-1]).contiguous(), gate, up, hidden, b, *ctx.scales)
        return gate.view(shape), up.view(shape), None, None, None, None
