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

With ``lora_swiglu_down`` the same kernels also do the down projection's LoRA input work (``forward_down``,
``backward_down``, ``LoRASwiGLUDown``): forward, each program sums ``dropout(c) Ad^T`` over the product's columns
it makes (``core.train.lora_dropout_kernel``'s masks and roundings); backward, each program owns a column block
of a share of the rows, adds ``(dhd Ad) * mask * scale`` to the product's gradient before the SwiGLU's, and sums
``dAd`` over its rows from the product it recomputes (fp32 partial sums, one per share).

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

from core.train.lora_dropout_kernel import (
    PAIRED,
    _keep,
    _padded_rank,
    _precision,
    interpreted,
    keep_scale,
    launch_tiles,
    load_tiles,
    row_strided,
    seeds_for,
    threshold,
)

MAX_RANK = 128
# Rows x columns a program and warps, by kernel: the fastest of bench/lora_swiglu_kernel.py's grid on the H200
# at 8,192 x 18,944, rank 16 (lora-swiglu-kernel): forward 0.366 ms against 0.791 for the two adds and Liger's
# forward; backward 0.613 against Liger's 0.420 (it recomputes the two rank-r products)
TILES = {"forward": {"BM": 16, "BN": 256, "num_warps": 4}, "backward": {"BM": 32, "BN": 128, "num_warps": 4},
         # lora_swiglu_down's, the fastest of bench/lora_swiglu_kernel.py --down's grid summed over 8,192 and 32,768
         # rows (the b4 rows and the wizard's b16 plan) on the H200 (lora-swiglu-down-kernel-b): forward 1.253 ms
         # at 32,768 rows against 1.808 for the SwiGLU and dropout kernels it replaces, backward 2.277 against 3.472
         # (session 20's tiles, SPLIT 4 and RS 256, took 1.286 and 2.304 there; the same at 8,192)
         "down_forward": {"BM": 64, "BN": 64, "num_warps": 4, "SPLIT": 2, "num_stages": 3},
         # maxnreg: 212 registers a thread left two programs a multiprocessor, 168 three (bench/kernel_occupancy.py;
         # 11 reloads from local memory a tile): the same bits, 2.290 -> 2.180 ms on the H200, -2.3% on an H100
         "down_backward": {"BM": 16, "BN": 128, "num_warps": 4, "RS": 512, "num_stages": 3, "maxnreg": 168}}
TILES_ENV = "TUNEDECK_LORA_SWIGLU_TILES"  # that bench's JSON: its "overall" tiles replace these

load_tiles(TILES, TILES_ENV)


def usable(x: torch.Tensor, elements: int, rank: int) -> bool:
    """Whether the kernels run on gate/up outputs of ``elements`` elements from input ``x`` at this rank: on
    CUDA (or Triton's CPU interpreter) in a float dtype, small enough for 32-bit offsets."""
    if not (x.is_cuda or (interpreted() and x.device.type == "cpu")):
        return False
    return x.dtype in (torch.bfloat16, torch.float16, torch.float32) and 0 < rank <= MAX_RANK and elements < 2**31


# ``FAST`` (bf16 on a GPU, ``fast_math``): the same roundings and the same sigmoid in fewer instructions. The
# SwiGLU-down backward's loop, compiled for sm_90, issued 57 instructions an element (914 a 16 x 128 tile a
# thread), the same order as its bytes need at the H200's bandwidth: three of them were single fp32-to-bf16
# conversions (``F2F``, the round trips below) and six the fix-ups of the non-flushing ``ex2`` and ``div.full``
# for results below 2**-126. The round trip here converts two elements in one packed instruction (``F2FP``) and
# the sigmoid takes ``ex2`` and ``rcp`` with subnormals flushed: 795 a tile (the forward's 1,144 -> 1,013 for 32
# elements); the loads widen a packed pair of bf16 in two instructions where Triton's conversion takes three
# (``_widen``): 777 (981). The bits are the same wherever the sigmoid is at least 2**-126 (inputs above -87.3;
# below, the plain path's ~1e-38 becomes 0, in a product of ~1e-36 that bf16 training never feels). The down
# forward / backward alone (bench/results/fast-math, before ``_widen``): -2.2% / -10.0% on the H200, -2.8% / -3.6%
# on an H100, whose bandwidth these kernels wait on more; the plan's step on the H100 did not move measurably
# (~0.2% expected).
FAST_MATH = True


def fast_math(dtype: torch.dtype) -> bool:
    """Whether the kernels take the packed round trips and the flushing sigmoid (``FAST``): bf16 on an NVIDIA GPU
    (the PTX is NVIDIA's: not under ROCm, nor in Triton's interpreter), unless ``FAST_MATH`` is off (``bench/sol``'s
    ``plain_math``)."""
    return FAST_MATH and dtype == torch.bfloat16 and torch.version.hip is None and not interpreted()


@triton.jit
def _round(x, dtype: tl.constexpr, FAST: tl.constexpr):
    """fp32 ``x`` rounded to ``dtype`` (nearest, ties to even) and back to fp32: ``x.to(dtype).to(tl.float32)``;
    ``FAST`` (bf16 only): two elements a ``cvt.rn.bf16x2.f32``, the same bits."""
    if FAST:
        bits = tl.inline_asm_elementwise(
            "{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $3, $2; shl.b32 $0, t, 16; and.b32 $1, t, 0xffff0000; }",
            "=r,=r,r,r", [x.to(tl.uint32, bitcast=True)], dtype=tl.uint32, is_pure=True, pack=2)
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(dtype).to(tl.float32)


@triton.jit
def _widen(x, FAST: tl.constexpr):
    """bf16 ``x`` in fp32: ``x.to(tl.float32)``; ``FAST``: a packed pair's two halves each in one instruction."""
    if FAST:
        return tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [x],
                                         dtype=tl.uint32, is_pure=True, pack=2).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _sigmoid(x, FAST: tl.constexpr):
    """``tl.sigmoid`` (``1 / (1 + 2**(-x log2 e))``); ``FAST``: its ``ex2`` and reciprocal with subnormals flushed."""
    if FAST:
        return tl.inline_asm_elementwise(
            "{ .reg .f32 t; mul.f32 t, $1, 0fBFB8AA3B; ex2.approx.ftz.f32 t, t; add.f32 t, t, 0f3F800000; "
            "rcp.approx.ftz.f32 $0, t; }", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.sigmoid(x)


@triton.jit
def _h_tiles(h_ptr, rows, n_rows, R: tl.constexpr, RP: tl.constexpr):
    """The rows' ``hg`` and ``hu`` (h: rows x 2R = [hg | hu]), each rows x RP."""
    rr = tl.arange(0, RP)
    h_at = h_ptr + rows[:, None] * (2 * R) + rr[None, :]
    h_ok = (rows < n_rows)[:, None] & (rr[None, :] < R)
    return tl.load(h_at, mask=h_ok, other=0.0), tl.load(h_at + R, mask=h_ok, other=0.0)


@triton.jit
def _b_tiles(b_ptr, cols, n, R: tl.constexpr, RP: tl.constexpr):
    """The columns' ``Bg^T`` and ``Bu^T`` (b: n x 2R = [Bg | Bu]), each RP x columns."""
    rr = tl.arange(0, RP)
    b_at = b_ptr + cols[None, :] * (2 * R) + rr[:, None]
    b_ok = (rr[:, None] < R) & (cols < n)[None, :]
    return tl.load(b_at, mask=b_ok, other=0.0), tl.load(b_at + R, mask=b_ok, other=0.0)


@triton.jit
def _pre_activations(g_ptr, u_ptr, hg, hu, bg, bu, rows, cols, n_rows, n, sg, su, PREC: tl.constexpr,
                     FAST: tl.constexpr):
    """The gate and up of a tile: base outputs plus ``s h B^T`` of each (``_h_tiles`` of the rows,
    ``_b_tiles`` of the columns, loaded by the caller: once a program where its loop keeps them), summed in
    fp32 and rounded to the outputs' dtype, as the ``lora_B`` matmul's epilogue rounds them (returned in
    fp32)."""
    ok = (rows < n_rows)[:, None] & (cols < n)[None, :]
    lora_g = tl.dot(hg, bg, input_precision=PREC)
    lora_u = tl.dot(hu, bu, input_precision=PREC)
    at = rows[:, None] * n + cols[None, :]
    dtype = g_ptr.dtype.element_ty
    gate = _round(_widen(tl.load(g_ptr + at, mask=ok, other=0.0), FAST) + lora_g * sg, dtype, FAST)
    up = _round(_widen(tl.load(u_ptr + at, mask=ok, other=0.0), FAST) + lora_u * su, dtype, FAST)
    return gate, up, at, ok


@triton.jit
def _lora_swiglu_forward(g_ptr, u_ptr, h_ptr, b_ptr, c_ptr, n_rows, n, sg, su,
             R: tl.constexpr, RP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr,
             FAST: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    hg, hu = _h_tiles(h_ptr, rows, n_rows, R, RP)
    bg, bu = _b_tiles(b_ptr, cols, n, R, RP)
    gate, up, at, ok = _pre_activations(g_ptr, u_ptr, hg, hu, bg, bu, rows, cols, n_rows, n, sg, su, PREC, FAST)
    silu = _round(gate * _sigmoid(gate, FAST), c_ptr.dtype.element_ty, FAST)  # rounded as Liger's SwiGLU
    tl.store(c_ptr + at, (silu * up).to(c_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _lora_swiglu_backward(dc_ptr, g_ptr, u_ptr, h_ptr, b_ptr, n_rows, n, sg, su,
              R: tl.constexpr, RP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr,
              FAST: tl.constexpr):
    """d gate and d up written over the base outputs (their last use)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    hg, hu = _h_tiles(h_ptr, rows, n_rows, R, RP)
    bg, bu = _b_tiles(b_ptr, cols, n, R, RP)
    gate, up, at, ok = _pre_activations(g_ptr, u_ptr, hg, hu, bg, bu, rows, cols, n_rows, n, sg, su, PREC, FAST)
    dc = tl.load(dc_ptr + at, mask=ok, other=0.0).to(tl.float32)
    sig = _sigmoid(gate, FAST)
    silu = gate * sig
    d_gate = dc * (silu * (1.0 - sig) + sig) * up  # Liger's order of the same products
    tl.store(g_ptr + at, d_gate.to(g_ptr.dtype.element_ty), mask=ok)
    tl.store(u_ptr + at, (dc * silu).to(u_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["seed", "thr"])
def _lora_swiglu_down_forward(g_ptr, u_ptr, h_ptr, b_ptr, a_ptr, c_ptr, hd_ptr, n_rows, n, cols_per_split, sg, su,
                              seed, thr, scale,
                              R: tl.constexpr, RP: tl.constexpr, RD: tl.constexpr, RDP: tl.constexpr,
                              BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, DROP: tl.constexpr,
                              PAIRED: tl.constexpr, STORE: tl.constexpr, SPLIT: tl.constexpr,
                              FAST: tl.constexpr):
    """The product of a row block over a share of the columns, column block by column block, and the down
    projection's ``lora_A`` product of its dropped-out part (``hd = dropout(c) @ Ad^T``, summed in fp32 over
    the share; ``SPLIT`` > 1: fp32 partial sums, one per share, which the host adds). ``STORE`` false: the
    product is not written (nothing reads it)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    start = tl.program_id(1) * cols_per_split
    rd = tl.arange(0, RDP)
    dtype = c_ptr.dtype.element_ty
    acc = tl.zeros((BM, RDP), dtype=tl.float32)
    hg, hu = _h_tiles(h_ptr, rows, n_rows, R, RP)  # the program's rows: loaded once
    for k0 in range(0, cols_per_split, BN):
        first = start + k0
        cols = first + tl.arange(0, BN)
        bg, bu = _b_tiles(b_ptr, cols, n, R, RP)
        gate, up, at, ok = _pre_activations(g_ptr, u_ptr, hg, hu, bg, bu, rows, cols, n_rows, n, sg, su, PREC, FAST)
        silu = _round(gate * _sigmoid(gate, FAST), dtype, FAST)
        c = (silu * up).to(dtype)
        if STORE:
            tl.store(c_ptr + at, c, mask=ok)
        if DROP:
            c = tl.where(_keep(rows, first, n, seed, thr, BN, PAIRED), c, 0.0).to(dtype)
        a = tl.load(a_ptr + rd[None, :] * n + cols[:, None], mask=(rd[None, :] < RD) & (cols[:, None] < n), other=0.0)
        acc += tl.dot(c, a, input_precision=PREC)
    out_ok = (rows[:, None] < n_rows) & (rd[None, :] < RD)
    out = hd_ptr + tl.program_id(1) * n_rows * RD + rows[:, None] * RD + rd[None, :]
    tl.store(out, (acc * scale).to(hd_ptr.dtype.element_ty), mask=out_ok)


@triton.jit(do_not_specialize=["seed", "thr"])
def _lora_swiglu_down_backward(dc_ptr, dc_stride, g_ptr, u_ptr, h_ptr, b_ptr, a_ptr, dhd_ptr, part_ptr, db_ptr, n_rows,
                               n, rows_per_split, sg, su, seed, thr, scale,
                               R: tl.constexpr, RP: tl.constexpr, RD: tl.constexpr, RDP: tl.constexpr,
                               BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, DROP: tl.constexpr,
                               PAIRED: tl.constexpr, DB: tl.constexpr, FAST: tl.constexpr):
    """A column block of a share of the rows: the product's gradient gets the down adapter's input term
    (``(dhd @ Ad) * mask * scale``, rounded into it as the unfused kernel adds it), then d gate and d up are
    written over the base outputs; ``dAd`` is summed over the rows in fp32 from the recomputed product (partial
    sums, one per share). ``DB``: the gate/up adapters' ``dB = d gate^T (s hg)`` (and up's) too, from the rounded
    gradients just written and ``s h`` rounded as the grouped node's matmul takes it (partial sums, one per
    share): nothing reads d gate and d up again for them."""
    first = tl.program_id(0) * BN
    cols = first + tl.arange(0, BN)
    split = tl.program_id(1)
    rd = tl.arange(0, RDP)
    col_ok = cols < n
    dtype = g_ptr.dtype.element_ty
    a = tl.load(a_ptr + rd[:, None] * n + cols[None, :], mask=(rd[:, None] < RD) & col_ok[None, :], other=0.0)
    bg, bu = _b_tiles(b_ptr, cols, n, R, RP)  # the program's columns: loaded once
    acc = tl.zeros((RDP, BN), dtype=tl.float32)
    acc_bg = tl.zeros((RP, BN), dtype=tl.float32)  # dB^T of the program's columns: (s h)^T d gate, as dAd's dot
    acc_bu = tl.zeros((RP, BN), dtype=tl.float32)
    start = split * rows_per_split
    for m0 in range(0, rows_per_split, BM):
        rows = start + m0 + tl.arange(0, BM)
        hg, hu = _h_tiles(h_ptr, rows, n_rows, R, RP)
        gate, up, at, ok = _pre_activations(g_ptr, u_ptr, hg, hu, bg, bu, rows, cols, n_rows, n, sg, su, PREC, FAST)
        dhd = tl.load(dhd_ptr + rows[:, None] * RD + rd[None, :], mask=(rows[:, None] < n_rows) & (rd[None, :] < RD),
                      other=0.0)
        lora = tl.dot(dhd, a, input_precision=PREC)
        sig = _sigmoid(gate, FAST)
        silu = gate * sig
        c = (_round(silu, dtype, FAST) * up).to(dtype)
        if DROP:
            keep = _keep(rows, first, n, seed, thr, BN, PAIRED)
            lora = tl.where(keep, lora, 0.0)
            c = tl.where(keep, c, 0.0).to(dtype)
        acc += tl.dot(tl.trans(dhd), c, input_precision=PREC)
        dc = tl.load(dc_ptr + rows[:, None] * dc_stride + cols[None, :], mask=ok, other=0.0)
        dc = _round(_widen(dc, FAST) + lora * scale, dtype, FAST)
        d_gate = (dc * (silu * (1.0 - sig) + sig) * up).to(dtype)
        d_up = (dc * silu).to(dtype)
        tl.store(g_ptr + at, d_gate, mask=ok)
        tl.store(u_ptr + at, d_up, mask=ok)
        if DB:
            acc_bg += tl.dot(tl.trans((hg.to(tl.float32) * sg).to(dtype)), d_gate, input_precision=PREC)
            acc_bu += tl.dot(tl.trans((hu.to(tl.float32) * su).to(dtype)), d_up, input_precision=PREC)
    tl.store(part_ptr + split * (RD * n) + rd[:, None] * n + cols[None, :], acc * scale,
             mask=(rd[:, None] < RD) & col_ok[None, :])
    if DB:
        rr = tl.arange(0, RP)
        db_at = db_ptr + split * (n * 2 * R) + cols[None, :] * (2 * R) + rr[:, None]
        db_ok = col_ok[None, :] & (rr[:, None] < R)
        tl.store(db_at, acc_bg, mask=db_ok)
        tl.store(db_at + R, acc_bu, mask=db_ok)


def _launch(kernel: Any, tensors: tuple[torch.Tensor, ...], gate: torch.Tensor, rank: int, sg: float,
            su: float, tiles: dict[str, int]) -> None:
    rows, n = gate.shape
    tiles = launch_tiles(tiles)
    if interpreted():
        tiles = {"BM": 16, "BN": 32}
    grid = (triton.cdiv(rows, tiles["BM"]), triton.cdiv(n, tiles["BN"]))
    kernel[grid](*tensors, rows, n, sg, su, R=rank, RP=_padded_rank(rank), PREC=_precision(gate.dtype),
                 FAST=fast_math(gate.dtype), **tiles)


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


def _down_args(seed: int, p: float) -> tuple[int, int, float, bool]:
    """(seed, threshold, scale, dropout on) of the down projection's dropout: the fused dropout kernels' own
    (``core.train.lora_dropout_kernel``: the same hash, so the same masks as its kernels draw for this seed)."""
    if p <= 0:
        return 0, 0, 1.0, False
    return seeds_for(seed, 1)[0], threshold(p), keep_scale(p), True


def forward_down(gate: torch.Tensor, up: torch.Tensor, hidden: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                 sg: float, su: float, seed: int, p: float, store: bool = True,
                 tiles: dict[str, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``forward``'s product c and the down projection's ``lora_A`` product of its dropped-out input,
    ``dropout(c) @ a^T`` (a: rank x n, c's dtype; dropout p with the fused dropout kernels' masks of ``seed``,
    none for p = 0): (c, hd), hd rows x rank in c's dtype. ``store`` false leaves c unwritten."""
    rows, n = gate.shape
    rank = a.shape[0]
    tiles = launch_tiles(tiles or TILES["down_forward"])
    if interpreted():
        tiles = {"BM": 16, "BN": 32, "SPLIT": 2}
    cols_per_split = triton.cdiv(triton.cdiv(n, tiles["SPLIT"]), tiles["BN"]) * tiles["BN"]
    split = tiles["SPLIT"] = triton.cdiv(n, cols_per_split)  # whole column blocks a share: maybe fewer shares
    s, thr, scale, drop = _down_args(seed, p)
    c = torch.empty_like(gate)
    hd = torch.empty(split, rows, rank, dtype=gate.dtype if split == 1 else torch.float32, device=gate.device)
    _lora_swiglu_down_forward[(triton.cdiv(rows, tiles["BM"]), split)](
        gate, up, hidden, b, a, c, hd, rows, n, cols_per_split, sg, su, s, thr, scale,
        R=hidden.shape[1] // 2, RP=_padded_rank(hidden.shape[1] // 2), RD=rank, RDP=_padded_rank(rank),
        PREC=_precision(gate.dtype), DROP=drop, PAIRED=PAIRED, STORE=store, FAST=fast_math(gate.dtype), **tiles)
    return c, hd[0] if split == 1 else hd.sum(0).to(gate.dtype)


def backward_down(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, hidden: torch.Tensor, b: torch.Tensor,
                  a: torch.Tensor, dhd: torch.Tensor, sg: float, su: float, seed: int, p: float,
                  tiles: dict[str, int] | None = None, b_grad: torch.Tensor | None = None) -> torch.Tensor:
    """``backward`` with the down adapter's input term added to ``grad`` first (``dhd`` the gradient of hd):
    d gate and d up written over ``gate`` and ``up``; returns the gradient of ``a`` (rank x n, fp32). ``grad``'s
    rows may be strided (``lora_fold_dh``: the first n columns of the down node's wider gradient). ``b_grad``
    (n x 2r, fp32): filled with the gradient of ``b`` = [Bg | Bu] (the adapters' ``d gate^T (sg hg)``, up's),
    summed from the gradients the kernel writes (``LoRASwiGLUDown`` asks for it, ``lora_swiglu_db``): the grouped
    node's two dB matmuls would read d gate and d up again. At the wizard's 7B plan shape on the H200 the kernel
    alone takes 2.583 ms with them against 2.400 + 0.590 for the kernel and the matmuls (kernel-parts-d), but in
    the power-capped step 3.17 against ~2.6 + 0.59 (engine-speed-y): the plan's step 0.2% shorter. Its dots take
    the gradient tile as the second operand, as dAd's (the other way round they cost more, engine-speed-x)."""
    rows, n = gate.shape
    rank = a.shape[0]
    tiles = launch_tiles(tiles or TILES["down_backward"])
    if interpreted():
        tiles = {"BM": 16, "BN": 32, "RS": 32}
    col_blocks = triton.cdiv(n, tiles["BN"])
    rows_per_split = triton.cdiv(min(tiles.pop("RS"), rows), tiles["BM"]) * tiles["BM"]  # whole row blocks a share
    splits = triton.cdiv(rows, rows_per_split)
    parts = torch.empty(splits, rank, n, dtype=torch.float32, device=gate.device)
    b_parts = parts if b_grad is None else torch.empty(splits, n, hidden.shape[1], dtype=torch.float32,
                                                         device=gate.device)
    s, thr, scale, drop = _down_args(seed, p)
    _lora_swiglu_down_backward[(col_blocks, splits)](
        grad, grad.stride(0), gate, up, hidden, b, a, dhd, parts, b_parts, rows, n, rows_per_split, sg, su, s, thr,
        scale, R=hidden.shape[1] // 2, RP=_padded_rank(hidden.shape[1] // 2), RD=rank, RDP=_padded_rank(rank),
        PREC=_precision(gate.dtype), DROP=drop, PAIRED=PAIRED, DB=b_grad is not None, FAST=fast_math(gate.dtype),
        **tiles)
    if b_grad is not None:
        torch.sum(b_parts, 0, out=b_grad)
    return parts.sum(0) if splits > 1 else parts[0]


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


class LoRASwiGLUDown(torch.autograd.Function):
    """``LoRASwiGLU`` with the down projection's LoRA input work inside (``lora_swiglu_down``): returns the
    product c and ``hd = dropout(c) @ Ad^T``, which the down projection's node (``lora_group._GivenLoRA``) takes
    instead of keeping c and running the dropout kernels over it. Only gate and up are kept (as ``LoRASwiGLU``
    keeps them): backward recomputes c from them, adds the down adapter's input term to c's gradient, and returns
    the gradient of ``a_weight`` (the down's ``lora_A`` weight, cast to the compute dtype here as the grouped node
    casts it) and, where ``b`` (= [Bg | Bu]) wants one, of ``b``, summed in the same kernel from the gate and up
    gradients it writes (the grouped node, given B detached, then makes none; ``backward_down`` says what it
    saves). The dropout seed is drawn from the CPU generator where the down projection's node would draw it, so
    the masks (and a checkpoint's recompute) are the same as without this switch."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor, hidden: torch.Tensor, b: torch.Tensor,
                a_weight: torch.Tensor, sg: float, su: float, p: float, store: bool) -> tuple[torch.Tensor, ...]:
        shape = gate.shape
        gate2, up2 = gate.reshape(-1, shape[-1]), up.reshape(-1, shape[-1])
        a = a_weight.to(gate.dtype).contiguous()
        ctx.seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if p > 0 else 0  # the CPU generator: no sync
        c, hd = forward_down(gate2, up2, hidden, b, a, sg, su, ctx.seed, p, store)
        ctx.save_for_backward(gate2, up2, hidden, b, a)
        ctx.args = (sg, su, p, a_weight.dtype, shape)
        return c.view(shape), hd

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None, grad_hd: torch.Tensor | None) -> tuple[Any, ...]:
        gate, up, hidden, b, a = ctx.saved_tensors
        sg, su, p, a_dtype, shape = ctx.args
        grad2 = torch.zeros_like(gate) if grad is None else row_strided(grad.reshape(-1, gate.shape[-1]))
        dhd = torch.zeros(gate.shape[0], a.shape[0], dtype=gate.dtype, device=gate.device) if grad_hd is None \
            else grad_hd.to(gate.dtype).contiguous()
        b_grad = torch.empty(b.shape, dtype=torch.float32, device=b.device) if ctx.needs_input_grad[3] else None
        grad_a = backward_down(grad2, gate, up, hidden, b, a, dhd, sg, su, ctx.seed, p, b_grad=b_grad)
        return (gate.view(shape), up.view(shape), None, None if b_grad is None else b_grad.to(b.dtype),
                grad_a.to(a_dtype), None, None, None, None)
