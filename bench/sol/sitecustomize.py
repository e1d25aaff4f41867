"""Floors for the wizard's plan: stand-ins for parts of the engine, for bench runs on the GPU only.

With this folder first on PYTHONPATH every Python process imports this module at start-up (``site``); it does
nothing unless ``TUNEDECK_SOL`` names parts (comma-separated; ``bench/engine_speed.py``'s
``tunedeck+env.TUNEDECK_SOL=NAME`` hands it to one run's processes):

- ``swiglu_down``: ``core.train.lora_swiglu_kernel``'s ``forward_down`` and ``backward_down`` (the SwiGLU with the
  down projection's dropout and ``lora_A``, 1.15 and 2.58 ms a block at the plan's 32,768 rows on the H200 alone,
  kernel-parts-d) replaced by kernels that move only the bytes those must move and compute nothing: forward
  reads gate and up and writes their product, backward reads the product's gradient, gate and up and writes
  two. The down adapter's ``lora_A`` product and the adapters' gradients they make are zeros. **The training is
  then wrong**: the run's step time is the floor a perfect pair of such kernels would reach in the
  power-capped step, which is what says whether a new design of them can be worth its work.
- ``plain_math``: ``core.train.lora_swiglu_kernel``'s kernels without ``FAST`` (``FAST_MATH`` off): the plain
  Triton ops for the round trips to bf16 and the sigmoid, as before session 37; the same bits, more instructions.
- ``lm_head_8192``: the fused loss's LM-head chunks 8,192 rows instead of Liger's rule (1,024 at the plan's
  32,768 tokens of a 7B): a real variant, the same maths in fewer, larger matmuls, 4.1 GiB more at the peak
  (bench/results/lm-head-chunks.md measured its kernels alone).

A bench tool for the GPU machine, as ``bench/hostprobe``: nothing in the product imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

PARTS = {part.strip() for part in os.environ.get("TUNEDECK_SOL", "").split(",") if part.strip()}


def _swiglu_down(module: Any) -> None:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _product(g_ptr, u_ptr, c_ptr, n_rows, n, BM: tl.constexpr, BN: tl.constexpr):
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        ok = (rows < n_rows)[:, None] & (cols < n)[None, :]
        at = rows[:, None] * n + cols[None, :]
        g = tl.load(g_ptr + at, mask=ok, other=0.0)
        u = tl.load(u_ptr + at, mask=ok, other=0.0)
        tl.store(c_ptr + at, g * u, mask=ok)

    @triton.jit
    def _gradients(dc_ptr, dc_stride, g_ptr, u_ptr, n_rows, n, BM: tl.constexpr, BN: tl.constexpr):
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        cols = tl.program_id(1) * BN + tl.arange(0, BN)
        ok = (rows < n_rows)[:, None] & (cols < n)[None, :]
        at = rows[:, None] * n + cols[None, :]
        dc = tl.load(dc_ptr + rows[:, None] * dc_stride + cols[None, :], mask=ok, other=0.0)
        g = tl.load(g_ptr + at, mask=ok, other=0.0)
        u = tl.load(u_ptr + at, mask=ok, other=0.0)
        tl.store(g_ptr + at, dc * u, mask=ok)
        tl.store(u_ptr + at, dc * g, mask=ok)

    def grid(rows: int, n: int) -> tuple[int, int]:
        return triton.cdiv(rows, 16), triton.cdiv(n, 256)

    def forward_down(gate: Any, up: Any, hidden: Any, b: Any, a: Any, sg: float, su: float, seed: int, p: float,
                     store: bool = True, tiles: Any = None) -> tuple[Any, Any]:
        rows, n = gate.shape
        c = torch.empty_like(gate)
        _product[grid(rows, n)](gate, up, c, rows, n, BM=16, BN=256, num_warps=4)
        return c, torch.zeros(rows, a.shape[0], dtype=gate.dtype, device=gate.device)

    def backward_down(grad: Any, gate: Any, up: Any, hidden: Any, b: Any, a: Any, dhd: Any, sg: float, su: float,
                      seed: int, p: float, tiles: Any = None, b_grad: Any = None) -> Any:
        rows, n = gate.shape
        _gradients[grid(rows, n)](grad, grad.stride(0), gate, up, rows, n, BM=16, BN=256, num_warps=4)
        if b_grad is not None:
            b_grad.zero_()
        return torch.zeros(a.shape[0], n, dtype=torch.float32, device=gate.device)

    module.forward_down, module.backward_down = forward_down, backward_down


def _plain_math(module: Any) -> None:
    module.FAST_MATH = False


def _lm_head_8192(module: Any) -> None:
    module.fused_chunk_tokens = lambda tokens, vocab, hidden: min(tokens, 8192)


PATCHES: dict[str, tuple[str, Callable[[Any], None]]] = {
    "swiglu_down": ("core.train.lora_swiglu_kernel", _swiglu_down),
    "plain_math": ("core.train.lora_swiglu_kernel", _plain_math),
    "lm_head_8192": ("core.train.linear_ce_kernel", _lm_head_8192),
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch on a module right after it is first executed."""

    def __init__(self, patches: dict[str, list[tuple[str, Callable[[Any], None]]]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in self.patches:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        run, patches = spec.loader.exec_module, self.patches.pop(name)

        def exec_module(module: Any) -> None:
            run(module)
            for part, patch in patches:
                patch(module)
                print(f"[sol] {part} in place in {name}", file=sys.stderr, flush=True)

        spec.loader.exec_module = exec_module
        return spec


def _install() -> None:
    unknown = PARTS - set(PATCHES)
    if unknown:
        raise SystemExit(f"TUNEDECK_SOL: unknown part(s) {', '.join(sorted(unknown))}; known: {', '.join(PATCHES)}")
    wanted: dict[str, list[tuple[str, Callable[[Any], None]]]] = {}
    for part in sorted(PARTS):
        module, patch = PATCHES[part]
        wanted.setdefault(module, []).append((part, patch))
    if wanted:
        sys.meta_path.insert(0, _AfterImport(wanted))


_install()
