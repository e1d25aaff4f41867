"""``lora_dropout_fused: true`` (default): LoRA dropout inside the ``lora_A`` matmul, its mask never stored.

peft's LoRA dropout makes, for every adapted linear, a dropped-out copy of the input and a 1-byte mask, keeps
both for backward, runs ``lora_A`` over the copy, and in backward multiplies the gradient by the mask again:
7 bytes moved and 3 kept per input element and linear, q, k and v each their own. On the 7B at b4 x 2048
that was 46 ms of dropout kernels a step on the H200 (engine-speed-lora-c), the copies' reads in the
skinny ``lora_A`` matmuls on top, and 121 KB a token and block of saved tensors, more than the block's own
activations.

Here three Triton kernels do a group's dropout and ``lora_A`` work (the linears that read one input:
q/k/v, gate/up, o, down; ``core.train.lora_group``) from the input alone, which backward keeps once:

- forward: ``h_g = dropout_g(x) @ A_g^T`` for every linear g of the group, reading x once;
- backward, input: ``dx += sum_g (dh_g @ A_g) * mask_g * scale``, added in place to the base's gradient;
- backward, adapters: ``dA_g = dh_g^T @ dropout_g(x)``, in fp32 partial sums over row blocks.

Each mask is drawn again wherever it is needed from a counter-based hash of (the element's index, the
linear's seed): murmur3's 32-bit finaliser, which mixes every input bit into every output bit, so masks of
neighbouring elements and of the group's linears are independent. One hash serves a pair of neighbouring
elements (``PAIRED``): its low 16 bits decide the even element, its high 16 bits the odd one, so each is kept
when its half is at least ``round(p * 2**16)``: p is rounded to 1/65536 and the scale is 1 / the keep rate
this gives, so dropout keeps the mean exactly. Hashing is what bounds these kernels (integer work, not memory),
so the pairs halve it. The seed is drawn per call from the CPU generator (no device synchronisation);
gradient checkpointing restores that generator before it recomputes a block, so the recomputed forward draws
the same masks. The masks are not ``torch.native_dropout``'s (another generator), so with dropout a run's loss
differs from peft's as two seeds do; at dropout 0 this path never runs.

The arithmetic differs from peft's under autocast only in rounding: the kept inputs enter the matmul
unscaled and the 1 / keep-rate scale multiplies the fp32 product (peft rounds ``x * scale`` to the compute
dtype first); the adapter gradients accumulate in fp32; the input gradient's adapter terms are summed in
fp32 and rounded once, where peft rounds each.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

from core.estimate.plan import FUSED_DROPOUT_MAX_P as MAX_P

MAX_GROUP = 3  # q/k/v
MAX_RANK = 128
_SEED_STEP = 0x9E3779B9  # the seeds of a group's linears, golden-ratio apart


def interpreted() -> bool:
    """The kernels may run on CPU tensors in Triton's interpreter: ``TUNEDECK_TRITON_INTERPRET=1``, with
    ``TRITON_INTERPRET=1`` set before Triton was first imported (the CPU tests; slow, for checking)."""
    return os.environ.get("TUNEDECK_TRITON_INTERPRET") == "1" and os.environ.get("TRITON_INTERPRET") == "1"


def row_strided(t: torch.Tensor) -> torch.Tensor:
    """``t`` (rows x n) itself where only its rows are strided (the kernels that take a row stride read it in
    place: ``lora_fold_dh``'s gradients are the first columns of a wider tensor), else a dense copy."""
    return t if t.stride(-1) == 1 and t.stride(0) >= t.shape[1] else t.contiguous()


def usable(x: torch.Tensor, ranks: list[int], ps: list[float], rows: int, width: int) -> bool:
    """Can the kernels run this group: on CUDA (or Triton's CPU interpreter), one dropout p in (0, MAX_P),
    one rank, small enough indices for 32-bit counters."""
    if not (x.is_cuda or (interpreted() and x.device.type == "cpu")):
        return False
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if not ranks or len(ranks) > MAX_GROUP or len(set(ranks)) != 1 or ranks[0] > MAX_RANK:
        return False
    if len(set(ps)) != 1 or not 0.0 < ps[0] < MAX_P:
        return False
    return rows * width < 2**31 and (width % 2 == 0 or not PAIRED)


def seeds_for(seed: int, count: int) -> list[int]:
    """The per-linear seeds of a group, as the kernels take them (below 2**31)."""
    return [(seed + i * _SEED_STEP) % 2**31 for i in range(count)] + [0] * (MAX_GROUP - count)


# Masks from one hash per pair of neighbouring elements (its low 16 bits for the even one, its high 16 bits for
# the odd one): half the hashing, which bounds the kernels (integer work), for p rounded to 1/65536. False: one
# 32-bit hash per element (bench/lora_dropout_kernel.py --unpaired times it).
PAIRED = True


def _hash_bits() -> int:
    """The bits of hash that decide an element: 16 paired, else 32."""
    return 16 if PAIRED else 32


def threshold(p: float) -> int:
    """An element is kept when its hash is at least this."""
    bits = _hash_bits()
    return min(int(round(p * 2**bits)), 2**(bits - 1) - 1)


def keep_scale(p: float) -> float:
    """1 / the keep rate the threshold gives (p rounded to 1 / 2**bits), so that dropout keeps the mean."""
    return 1.0 / (1.0 - threshold(p) / 2**_hash_bits())


def _padded_rank(rank: int) -> int:
    return max(16, 1 << (rank - 1).bit_length())


# Triton compiles an integer argument equal to 1 as a constant (and 16-divisible ones apart): a seed or a
# threshold is any number, so none of them may pick another compilation (a seed of 1 would not compile)
_RANDOM_ARGS = ["s0", "s1", "s2", "thr"]


@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _keep(rows, first, width, seed, thr, BK: tl.constexpr, PAIRED: tl.constexpr):
    """The keep mask of ``rows`` x columns ``first`` .. ``first + BK - 1`` (``first`` and ``width`` even when
    paired)."""
    if PAIRED:
        pairs = rows[:, None] * (width // 2) + (first // 2 + tl.arange(0, BK // 2))[None, :]
        h = _fmix32(pairs.to(tl.uint32) ^ seed.to(tl.uint32))
        return tl.interleave(h & 0xFFFF, h >> 16) >= thr.to(tl.uint32)
    else:
        idx = rows[:, None] * width + (first + tl.arange(0, BK))[None, :]
        return _fmix32(idx.to(tl.uint32) ^ seed.to(tl.uint32)) >= thr.to(tl.uint32)


@triton.jit(do_not_specialize=_RANDOM_ARGS)
def _forward(x_ptr, a_ptr, h_ptr, n_rows, width, cols_per_split, s0, s1, s2, thr, scale,
             G: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             PREC: tl.constexpr, SPLIT: tl.constexpr, PAIRED: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    first_col = tl.program_id(1) * cols_per_split  # SPLIT > 1: this program's share of the width
    rr = tl.arange(0, RP)
    row_ok = rows < n_rows
    acc0 = tl.zeros((BN, RP), dtype=tl.float32)
    acc1 = tl.zeros((BN, RP), dtype=tl.float32)
    acc2 = tl.zeros((BN, RP), dtype=tl.float32)
    for k0 in range(0, cols_per_split, BK):
        first = first_col + k0
        cols = first + tl.arange(0, BK)
        col_ok = cols < width
        x = tl.load(x_ptr + rows[:, None] * width + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        a_at = a_ptr + rr[None, :] * width + cols[:, None]  # A^T tile (BK x RP) of the first linear
        a_ok = (rr[None, :] < R) & col_ok[:, None]
        a0 = tl.load(a_at, mask=a_ok, other=0.0)
        acc0 += tl.dot(tl.where(_keep(rows, first, width, s0, thr, BK, PAIRED), x, 0.0).to(x.dtype), a0,
                       input_precision=PREC)
        if G > 1:
            a1 = tl.load(a_at + R * width, mask=a_ok, other=0.0)
            acc1 += tl.dot(tl.where(_keep(rows, first, width, s1, thr, BK, PAIRED), x, 0.0).to(x.dtype), a1,
                           input_precision=PREC)
        if G > 2:
            a2 = tl.load(a_at + 2 * R * width, mask=a_ok, other=0.0)
            acc2 += tl.dot(tl.where(_keep(rows, first, width, s2, thr, BK, PAIRED), x, 0.0).to(x.dtype), a2,
                           input_precision=PREC)
    # SPLIT > 1: fp32 partial sums, one rows x G*R slice per share of the width (the host adds them)
    out = h_ptr + tl.program_id(1) * n_rows * (G * R) + rows[:, None] * (G * R) + rr[None, :]
    out_ok = row_ok[:, None] & (rr[None, :] < R)
    tl.store(out, (acc0 * scale).to(h_ptr.dtype.element_ty), mask=out_ok)
    if G > 1:
        tl.store(out + R, (acc1 * scale).to(h_ptr.dtype.element_ty), mask=out_ok)
    if G > 2:
        tl.store(out + 2 * R, (acc2 * scale).to(h_ptr.dtype.element_ty), mask=out_ok)


@triton.jit(do_not_specialize=_RANDOM_ARGS)
def _input_grad(dh_ptr, a_ptr, dx_ptr, dx_stride, n_rows, width, s0, s1, s2, thr, scale,
                G: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                PREC: tl.constexpr, PAIRED: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    first = tl.program_id(1) * BK
    cols = first + tl.arange(0, BK)
    rr = tl.arange(0, RP)
    row_ok = rows < n_rows
    col_ok = cols < width
    dh_at = dh_ptr + rows[:, None] * (G * R) + rr[None, :]
    dh_ok = row_ok[:, None] & (rr[None, :] < R)
    a_at = a_ptr + rr[:, None] * width + cols[None, :]
    a_ok = (rr[:, None] < R) & col_ok[None, :]
    dh = tl.load(dh_at, mask=dh_ok, other=0.0)
    a = tl.load(a_at, mask=a_ok, other=0.0)
    acc = tl.where(_keep(rows, first, width, s0, thr, BK, PAIRED), tl.dot(dh, a, input_precision=PREC), 0.0)
    if G > 1:
        dh = tl.load(dh_at + R, mask=dh_ok, other=0.0)
        a = tl.load(a_at + R * width, mask=a_ok, other=0.0)
        acc += tl.where(_keep(rows, first, width, s1, thr, BK, PAIRED), tl.dot(dh, a, input_precision=PREC), 0.0)
    if G > 2:
        dh = tl.load(dh_at + 2 * R, mask=dh_ok, other=0.0)
        a = tl.load(a_at + 2 * R * width, mask=a_ok, other=0.0)
        acc += tl.where(_keep(rows, first, width, s2, thr, BK, PAIRED), tl.dot(dh, a, input_precision=PREC), 0.0)
    ok = row_ok[:, None] & col_ok[None, :]
    at = dx_ptr + rows[:, None] * dx_stride + cols[None, :]
    dx = tl.load(at, mask=ok, other=0.0)
    tl.store(at, (dx.to(tl.float32) + acc * scale).to(dx_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=_RANDOM_ARGS)
def _adapter_grad(x_ptr, dh_ptr, part_ptr, n_rows, width, rows_per_split, s0, s1, s2, thr, scale,
                  G: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  PREC: tl.constexpr, PAIRED: tl.constexpr):
    first = tl.program_id(0) * BK
    cols = first + tl.arange(0, BK)
    split = tl.program_id(1)
    rr = tl.arange(0, RP)
    col_ok = cols < width
    acc0 = tl.zeros((RP, BK), dtype=tl.float32)
    acc1 = tl.zeros((RP, BK), dtype=tl.float32)
    acc2 = tl.zeros((RP, BK), dtype=tl.float32)
    start = split * rows_per_split
    for n0 in range(0, rows_per_split, BN):
        rows = start + n0 + tl.arange(0, BN)
        row_ok = rows < n_rows
        x = tl.load(x_ptr + rows[:, None] * width + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        dh_at = dh_ptr + rows[:, None] * (G * R) + rr[None, :]
        dh_ok = row_ok[:, None] & (rr[None, :] < R)
        dh = tl.load(dh_at, mask=dh_ok, other=0.0)
        acc0 += tl.dot(tl.trans(dh), tl.where(_keep(rows, first, width, s0, thr, BK, PAIRED), x, 0.0).to(x.dtype),
                       input_precision=PREC)
        if G > 1:
            dh = tl.load(dh_at + R, mask=dh_ok, other=0.0)
            acc1 += tl.dot(tl.trans(dh), tl.where(_keep(rows, first, width, s1, thr, BK, PAIRED), x,
                                                  0.0).to(x.dtype), input_precision=PREC)
        if G > 2:
            dh = tl.load(dh_at + 2 * R, mask=dh_ok, other=0.0)
            acc2 += tl.dot(tl.trans(dh), tl.where(_keep(rows, first, width, s2, thr, BK, PAIRED), x,
                                                  0.0).to(x.dtype), input_precision=PREC)
    out = part_ptr + split * (G * R * width) + rr[:, None] * width + cols[None, :]
    out_ok = (rr[:, None] < R) & col_ok[None, :]
    tl.store(out, acc0 * scale, mask=out_ok)
    if G > 1:
        tl.store(out + R * width, acc1 * scale, mask=out_ok)
    if G > 2:
        tl.store(out + 2 * R * width, acc2 * scale, mask=out_ok)


@triton.jit(do_not_specialize=_RANDOM_ARGS)
def _backward(x_ptr, dh_ptr, a_ptr, dx_ptr, dx_stride, part_ptr, n_rows, width, rows_per_split, s0, s1, s2, thr,
              scale,
              G: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              PREC: tl.constexpr, PAIRED: tl.constexpr):
    """``_input_grad`` and ``_adapter_grad`` in one pass: each mask is drawn once for both (the hash bounds
    these kernels). A program owns a column block of a share of the rows: it adds the input gradient of each
    row block in place and sums the adapters' gradient over its rows (fp32 partial sums, as _adapter_grad)."""
    first = tl.program_id(0) * BK
    cols = first + tl.arange(0, BK)
    split = tl.program_id(1)
    rr = tl.arange(0, RP)
    col_ok = cols < width
    a_at = a_ptr + rr[:, None] * width + cols[None, :]
    a_ok = (rr[:, None] < R) & col_ok[None, :]
    a0 = tl.load(a_at, mask=a_ok, other=0.0)
    a1 = tl.load(a_at + R * width, mask=a_ok & (G > 1), other=0.0)
    a2 = tl.load(a_at + 2 * R * width, mask=a_ok & (G > 2), other=0.0)
    acc0 = tl.zeros((RP, BK), dtype=tl.float32)
    acc1 = tl.zeros((RP, BK), dtype=tl.float32)
    acc2 = tl.zeros((RP, BK), dtype=tl.float32)
    start = split * rows_per_split
    for n0 in range(0, rows_per_split, BN):
        rows = start + n0 + tl.arange(0, BN)
        row_ok = rows < n_rows
        ok = row_ok[:, None] & col_ok[None, :]
        x = tl.load(x_ptr + rows[:, None] * width + cols[None, :], mask=ok, other=0.0)
        dh_at = dh_ptr + rows[:, None] * (G * R) + rr[None, :]
        dh_ok = row_ok[:, None] & (rr[None, :] < R)
        dh = tl.load(dh_at, mask=dh_ok, other=0.0)
        keep = _keep(rows, first, width, s0, thr, BK, PAIRED)
        grad = tl.where(keep, tl.dot(dh, a0, input_precision=PREC), 0.0)
        acc0 += tl.dot(tl.trans(dh), tl.where(keep, x, 0.0).to(x.dtype), input_precision=PREC)
        if G > 1:
            dh = tl.load(dh_at + R, mask=dh_ok, other=0.0)
            keep = _keep(rows, first, width, s1, thr, BK, PAIRED)
            grad += tl.where(keep, tl.dot(dh, a1, input_precision=PREC), 0.0)
            acc1 += tl.dot(tl.trans(dh), tl.where(keep, x, 0.0).to(x.dtype), input_precision=PREC)
        if G > 2:
            dh = tl.load(dh_at + 2 * R, mask=dh_ok, other=0.0)
            keep = _keep(rows, first, width, s2, thr, BK, PAIRED)
            grad += tl.where(keep, tl.dot(dh, a2, input_precision=PREC), 0.0)
            acc2 += tl.dot(tl.trans(dh), tl.where(keep, x, 0.0).to(x.dtype), input_precision=PREC)
        at = dx_ptr + rows[:, None] * dx_stride + cols[None, :]
        dx = tl.load(at, mask=ok, other=0.0)
        tl.store(at, (dx.to(tl.float32) + grad * scale).to(dx_ptr.dtype.element_ty), mask=ok)
    out = part_ptr + split * (G * R * width) + rr[:, None] * width + cols[None, :]
    out_ok = (rr[:, None] < R) & col_ok[None, :]
    tl.store(out, acc0 * scale, mask=out_ok)
    if G > 1:
        tl.store(out + R * width, acc1 * scale, mask=out_ok)
    if G > 2:
        tl.store(out + 2 * R * width, acc2 * scale, mask=out_ok)


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # tf32 is ignored for 16-bit inputs


# Tiles by kernel (rows x columns a program, warps, pipeline stages; the forward's SPLIT shares the width
# among that many programs a row block, for more programs than SMs): the fastest over a 7B block's groups in
# the H200 sweep of ``bench/lora_dropout_kernel.py --sweep`` (bench/results/engine-speed-summary.md, session
# 14: 0.333 + 0.354 + 0.393 ms a block, forward + backward 1.07 ms against 1.68 in session 13's kernels and
# tiles); the interpreter takes the smallest.
TILES: dict[str, dict[str, int]] = {
    "forward": {"BN": 32, "BK": 64, "num_warps": 4, "num_stages": 3, "SPLIT": 4},
    "input_grad": {"BN": 32, "BK": 128, "num_warps": 8, "num_stages": 1},
    "adapter_grad": {"BN": 64, "BK": 64, "num_warps": 4, "num_stages": 3},
    "backward": {"BN": 32, "BK": 128, "num_warps": 4, "num_stages": 3},  # lora-dropout-kernel-d's sweep
    # By group size (``_tiles``), with the registers a thread capped (``maxnreg``) so that four programs share a
    # multiprocessor, not two (q/k/v, gate/up: 255 and 174 registers at 32 rows) or three (o: 131): on the H200 at the
    # plan's 32,768 rows (bench/results/occupancy/h200) q/k/v 0.513 -> 0.482 ms, gate/up 0.368 -> 0.337, o 0.234 ->
    # 0.229; on an H100 -3.8%, -2.9%, -1.1%. 16 rows a tile sum dA's fp32 partials over other rows (1.5e-4 relative).
    "backward:3": {"BN": 16, "BK": 128, "num_warps": 4, "num_stages": 3, "maxnreg": 128},
    "backward:2": {"BN": 16, "BK": 128, "num_warps": 4, "num_stages": 3, "maxnreg": 128},
    "backward:1": {"BN": 32, "BK": 128, "num_warps": 4, "num_stages": 3, "maxnreg": 128},
}
# The one-kernel backward pays where a group's input is at most this wide: on the H200 (lora-dropout-kernel-d)
# it took q/k/v 0.179 ms against the two kernels' 0.184, gate/up 0.130 against 0.181, o 0.101 against 0.120,
# but the 18,944-wide input of down 0.387 against 0.327.
BACKWARD_MAX_WIDTH = 8192
TILES_ENV = "TUNEDECK_LORA_DROPOUT_TILES"  # a sweep's JSON: its "overall" tiles replace these


def load_tiles(tiles: dict[str, dict[str, int]], env: str) -> None:
    """Replace ``tiles`` (by kernel) with the "overall" tiles of the bench JSON that ``env`` names, if set. A key
    ``kernel:G`` is that kernel's tiles for groups of G linears (``_tiles``); ``maxnreg`` (a cap on the registers
    a thread, so that more programs share a multiprocessor) is taken where the JSON has it."""
    path = os.environ.get(env)
    if path:
        overall = json.loads(Path(path).read_text(encoding="utf-8"))["overall"]
        for key, chosen in overall.items():
            own = tiles.get(key) or tiles[key.split(":")[0]]
            tiles[key] = {k: int(chosen[k]) for k in own if k != "maxnreg"}
            if chosen.get("maxnreg"):
                tiles[key]["maxnreg"] = int(chosen["maxnreg"])


load_tiles(TILES, TILES_ENV)


def _random_args(seed: int, groups: int, p: float) -> tuple[Any, ...]:
    """The kernels' (s0, s1, s2, thr, scale)."""
    return (*seeds_for(seed, groups), threshold(p), keep_scale(p))


def launch_tiles(tiles: dict[str, int | None]) -> dict[str, int]:
    """``tiles`` as a launch takes them, in a new dict the caller may change: a key set to None taken out (an
    override's way to drop the module's ``maxnreg``), and ``maxnreg`` not under ROCm (an option of Triton's NVIDIA
    backend only: its AMD one refuses the keyword)."""
    hip = torch.version.hip is not None
    return {key: value for key, value in tiles.items() if value is not None and not (hip and key == "maxnreg")}


def _tiles(kernel: str, groups: int, override: dict[str, int] | None) -> dict[str, int]:
    """The kernel's tiles for a group of ``groups`` linears: ``TILES["kernel:groups"]`` where set, else
    ``TILES[kernel]``, with ``override``'s keys over them (a key set to None: taken out)."""
    tiles = launch_tiles(dict(TILES.get(f"{kernel}:{groups}", TILES[kernel]), **(override or {})))
    if interpreted():
        tiles.update(BN=16, BK=64)
        for compiled_only in ("num_warps", "num_stages", "maxnreg"):
            tiles.pop(compiled_only, None)
    return tiles


def dropout_lora_a(x: torch.Tensor, a: torch.Tensor, groups: int, seed: int, p: float,
                   tiles: dict[str, int] | None = None) -> torch.Tensor:
    """``[dropout_g(x) @ A_g^T for g]`` side by side: x (rows x width, contiguous), a (groups*rank x width,
    the group's ``lora_A`` weights stacked, x's dtype); returns rows x groups*rank in x's dtype."""
    rows, width = x.shape
    rank = a.shape[0] // groups
    tiles = _tiles("forward", groups, tiles)
    cols_per_split = triton.cdiv(triton.cdiv(width, tiles["SPLIT"]), tiles["BK"]) * tiles["BK"]
    split = tiles["SPLIT"] = triton.cdiv(width, cols_per_split)  # whole BK blocks a share: maybe fewer shares
    if split == 1:
        out = torch.empty(rows, groups * rank, dtype=x.dtype, device=x.device)
    else:
        out = torch.empty(split, rows, groups * rank, dtype=torch.float32, device=x.device)
    _forward[(triton.cdiv(rows, tiles["BN"]), split)](
        x, a, out, rows, width, cols_per_split, *_random_args(seed, groups, p),
        G=groups, R=rank, RP=_padded_rank(rank), PREC=_precision(x.dtype), PAIRED=PAIRED, **tiles)
    return out if split == 1 else out.sum(0).to(x.dtype)


def add_input_grad(grad_x: torch.Tensor, dh: torch.Tensor, a: torch.Tensor, groups: int, seed: int,
                   p: float, tiles: dict[str, int] | None = None) -> None:
    """``grad_x += sum_g (dh_g @ A_g) * mask_g / (1 - p)``, in place (grad_x rows x width, its rows maybe strided:
    ``lora_fold_dh``)."""
    rows, width = grad_x.shape
    rank = a.shape[0] // groups
    tiles = _tiles("input_grad", groups, tiles)
    grid = (triton.cdiv(rows, tiles["BN"]), triton.cdiv(width, tiles["BK"]))
    _input_grad[grid](
        dh, a, grad_x, grad_x.stride(0), rows, width, *_random_args(seed, groups, p),
        G=groups, R=rank, RP=_padded_rank(rank), PREC=_precision(a.dtype), PAIRED=PAIRED, **tiles)


def adapter_grads(x: torch.Tensor, dh: torch.Tensor, groups: int, rank: int, seed: int, p: float,
                  tiles: dict[str, int] | None = None) -> torch.Tensor:
    """``[dh_g^T @ dropout_g(x) for g]`` stacked (groups*rank x width), fp32."""
    rows, width = x.shape
    tiles = _tiles("adapter_grad", groups, tiles)
    col_blocks, splits, rows_per_split = _row_splits(rows, width, tiles, x.device)
    parts = torch.empty(splits, groups * rank, width, dtype=torch.float32, device=x.device)
    _adapter_grad[(col_blocks, splits)](
        x, dh, parts, rows, width, rows_per_split, *_random_args(seed, groups, p),
        G=groups, R=rank, RP=_padded_rank(rank), PREC=_precision(x.dtype), PAIRED=PAIRED, **tiles)
    return parts.sum(0) if splits > 1 else parts[0]


# The backward kernels' programs (column blocks x row shares) a streaming multiprocessor: enough that the last
# wave is a small part of the work. ~512 programs in all (532 over a 7B's 3,584 columns) left the H200's 132 SMs
# a tail: the q/k/v backward at 32,768 rows took 0.630 ms, 0.558 at ~8 an SM, 0.525 at ~16, 0.544 at ~32
# (bench/results/kernel-parts-c.md); the fp32 partial sums of dA this makes (52 MB there) are read once.
PROGRAMS_PER_SM = 16


@functools.cache
def _sm_count(device: Any) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _row_splits(rows: int, width: int, tiles: dict[str, int], device: Any = None) -> tuple[int, int, int]:
    """(column blocks, row shares, rows a share): enough programs to fill the GPU (column blocks x shares ~
    ``PROGRAMS_PER_SM`` a multiprocessor; 512 off CUDA, the interpreter), each share whole row blocks."""
    block = tiles["BN"]
    col_blocks = triton.cdiv(width, tiles["BK"])
    programs = PROGRAMS_PER_SM * _sm_count(device) if device is not None and device.type == "cuda" else 512
    splits = max(1, min(triton.cdiv(rows, block), triton.cdiv(programs, col_blocks)))
    rows_per_split = triton.cdiv(triton.cdiv(rows, splits), block) * block
    return col_blocks, triton.cdiv(rows, rows_per_split), rows_per_split


def backward(x: torch.Tensor, dh: torch.Tensor, a: torch.Tensor, grad_x: torch.Tensor, groups: int, seed: int,
             p: float, tiles: dict[str, int] | None = None) -> torch.Tensor:
    """``add_input_grad`` and ``adapter_grads`` in one kernel (each mask drawn once): adds the input gradient
    to grad_x (its rows maybe strided) in place and returns the adapters' gradients (groups*rank x width, fp32)."""
    rows, width = x.shape
    rank = a.shape[0] // groups
    tiles = _tiles("backward", groups, tiles)
    col_blocks, splits, rows_per_split = _row_splits(rows, width, tiles, x.device)
    parts = torch.empty(splits, groups * rank, width, dtype=torch.float32, device=x.device)
    _backward[(col_blocks, splits)](
        x, dh, a, grad_x, grad_x.stride(0), parts, rows, width, rows_per_split, *_random_args(seed, groups, p),
        G=groups, R=rank, RP=_padded_rank(rank), PREC=_precision(x.dtype), PAIRED=PAIRED, **tiles)
    return parts.sum(0) if splits > 1 else parts[0]


def masks(rows: int, width: int, groups: int, seed: int, p: float, device: Any = "cpu") -> torch.Tensor:
    """The keep masks the kernels draw (groups x rows x width, bool), computed with torch's integer ops from
    the same hash: the tests' reference, and a check of the kernels' keep rate."""
    idx = torch.arange(rows * width, dtype=torch.int64, device=device).view(rows, width)
    out = []
    for s in seeds_for(seed, groups)[:groups]:
        h = ((idx >> 1 if PAIRED else idx) ^ s) & 0xFFFFFFFF
        h = h ^ (h >> 16)
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h = h ^ (h >> 13)
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        h = h ^ (h >> 16)
        if PAIRED:
            h = torch.where(idx % 2 == 1, h >> 16, h & 0xFFFF)
        out.append(h >= threshold(p))
    return torch.stack(out)
