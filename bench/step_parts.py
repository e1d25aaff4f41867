"""Candidate savings in a 7B LoRA step outside the big matmuls, timed alone on the GPU (one H200):

- ``ce``: the LM head and loss (``core.train.linear_cross_entropy``, forward and backward) over one micro-batch's
  rows, at the chunk the rule picks (``fused_chunk_tokens``: 512 rows for Qwen2.5-7B) and at larger chunks, whose
  logits take more memory (rows x 152,064 x 2 bytes) but whose input-gradient matmul needs no split-K;
- ``norm``: a decoder block's residual add and RMSNorm, as two kernels (torch's add, Liger's RMSNorm: what runs
  today, twice a block) against Liger's fused add + RMSNorm, forward and backward; and the RMSNorm alone with a
  frozen weight, Liger's in place against ``core.train.rms_norm_kernel``'s row kernels (``rms_norm_rows``);
- ``gemm`` (``--gemm``): the frozen matmuls of a Qwen2.5-7B block at these rows, each timed alone (forward
  ``x W^T``, backward ``dy W``), in TFLOP/s: what cuBLAS gives these shapes outside a training step;
- ``swiglu`` (``--old-swiglu FILE``): ``lora_swiglu_down``'s kernels, forward and backward at their tiles, from
  ``core.train.lora_swiglu_kernel`` against the same module as FILE has it (another version of the kernels).

Each line is a median over repeated calls (CUDA events); the per-step figure multiplies by the calls a step of
the wizard's 7B plan makes (2 micro-steps; 56 norms a micro-step). Each variant's result is checked against
the first's (``max_err``), so a faster one that computes something else shows::

    python bench/step_parts.py --rows 16384 --out bench/results/step-parts.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lora_dropout_kernel import median_ms  # noqa: E402  (bench/ is not a package: run as a script)

HIDDEN, VOCAB = 3584, 152064  # Qwen2.5-7B
MICRO_STEPS, NORMS = 2, 56  # the wizard's 7B plan then: b8 x 2 accumulation (--micro-steps); 2 RMSNorms a block, 28
INTERMEDIATE, KV, LAYERS = 18944, 512, 28


def _max_err(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def measure_ce(rows: int, chunks: list[int], reps: int) -> list[dict]:
    import torch

    from core.train.fused_loss import fused_chunk_tokens
    from core.train.linear_ce_kernel import linear_cross_entropy

    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    hidden = (torch.randn(1, rows, HIDDEN, device="cuda", dtype=torch.bfloat16)).requires_grad_(True)
    labels = torch.randint(0, VOCAB, (1, rows), device="cuda")
    out, ref = [], None
    for chunk in [fused_chunk_tokens(rows, VOCAB, HIDDEN), *chunks]:
        def step(chunk=chunk):
            hidden.grad = None
            linear_cross_entropy(hidden, labels, head, chunk=chunk).backward()
        step()
        grad = hidden.grad.clone()
        ref = grad if ref is None else ref
        ms = median_ms(step, reps, calls=2)
        out.append({"part": "ce", "variant": f"chunk {chunk}", "ms": round(ms, 3),
                    "per_step_ms": round(ms * MICRO_STEPS, 1), "max_err": _max_err(grad, ref),
                    "logits_mib": round(chunk * VOCAB * 2 / 2**20)})
        del grad
    return out


def measure_norm(rows: int, reps: int) -> list[dict]:
    import torch
    from liger_kernel.ops import LigerFusedAddRMSNormFunction
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    torch.manual_seed(0)
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=False)
    dy = torch.randn_like(x)
    ds = torch.randn_like(x)

    def separate():
        s = x + r
        # (not in place: the engine's Liger module writes its input gradient over dy, which the next call reads;
        # the recorded step-parts run did so, and its 3.92 difference to the fused variant is that, not maths)
        y = LigerRMSNormFunction.apply(s, w, 1e-6, 0.0, "llama", False)
        torch.autograd.backward((y, s), (dy, ds))

    def fused():
        y, s = LigerFusedAddRMSNormFunction.apply(x, r, w, 1e-6, 0.0, "llama", False)
        torch.autograd.backward((y, s), (dy, ds))

    out, ref = [], None
    for name, fn in (("add + RMSNorm (today)", separate), ("fused add + RMSNorm", fused)):
        x.grad = r.grad = None
        fn()
        grad = x.grad.clone()
        ref = grad if ref is None else ref
        ms = median_ms(fn, reps)
        out.append({"part": "norm", "variant": name, "ms": round(ms, 3),
                    "per_step_ms": round(ms * MICRO_STEPS * NORMS, 1), "max_err": _max_err(grad, ref)})
    return out + measure_frozen_norm(x, w, dy, reps)


def measure_frozen_norm(x, w, dy, reps: int) -> list[dict]:
    """RMSNorm alone, frozen weight, its gradient written over the incoming one (as the engine runs both): the
    incoming gradient is copied in each call, and that copy's time taken off."""
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    from core.train.rms_norm_kernel import FrozenRMSNorm

    def liger():
        LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", True).backward(dy.clone())

    def rows():
        FrozenRMSNorm.apply(x, w, 1e-6).backward(dy.clone())

    copy_ms = median_ms(dy.clone, reps)
    out, ref = [], None
    for name, fn in (("RMSNorm, Liger in place", liger), ("RMSNorm, row kernels (rms_norm_rows)", rows)):
        x.grad = None
        fn()
        grad = x.grad.clone()
        ref = grad if ref is None else ref
        ms = median_ms(fn, reps) - copy_ms
        out.append({"part": "norm", "variant": name, "ms": round(ms, 3),
                    "per_step_ms": round(ms * MICRO_STEPS * NORMS, 1), "max_err": _max_err(grad, ref)})
    return out


def measure_gemm(rows: int, reps: int) -> list[dict]:
    """Each frozen matmul of a block alone: forward ``x W^T`` (F.linear) and backward ``dy W`` (mm)."""
    import torch

    shapes = (("q", HIDDEN, HIDDEN), ("k", HIDDEN, KV), ("o", HIDDEN, HIDDEN), ("gate", HIDDEN, INTERMEDIATE),
              ("down", INTERMEDIATE, HIDDEN))
    out = []
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    for name, k, n in shapes:
        weight = torch.randn(n, k, **bf16) / k**0.5
        x, dy = torch.randn(rows, k, **bf16), torch.randn(rows, n, **bf16)
        flop = 2 * rows * k * n
        for direction, fn in (("forward", lambda x=x, w=weight: torch.nn.functional.linear(x, w)),
                              ("backward dx", lambda dy=dy, w=weight: torch.mm(dy, w))):
            ms = median_ms(fn, reps)
            count = {"q": 1, "k": 2, "o": 1, "gate": 2, "down": 1}[name] * LAYERS * MICRO_STEPS
            out.append({"part": "gemm", "variant": f"{name} {direction} ({rows} x {k} -> {n})", "ms": round(ms, 3),
                        "per_step_ms": round(ms * count, 1), "max_err": 0.0, "tflops": round(flop / ms / 1e9)})
    a = torch.randn(8192, 8192, **bf16)
    ms = median_ms(lambda: torch.mm(a, a), reps)
    out.append({"part": "gemm", "variant": "8192 x 8192 x 8192", "ms": round(ms, 3), "per_step_ms": 0.0,
                "max_err": 0.0, "tflops": round(2 * 8192**3 / ms / 1e9)})
    return out


def measure_swiglu(rows: int, reps: int, old_file: str) -> list[dict]:
    """``forward_down`` and ``backward_down`` at their tiles, this tree's kernels against FILE's."""
    import importlib.util

    import torch

    import core.train.lora_swiglu_kernel as new

    spec = importlib.util.spec_from_file_location("old_lora_swiglu_kernel", old_file)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    torch.manual_seed(0)
    rank, s, seed, p = 16, 2.0, 1234, 0.05
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    gate, up = torch.randn(rows, INTERMEDIATE, **bf16), torch.randn(rows, INTERMEDIATE, **bf16)
    hidden, b = torch.randn(rows, 2 * rank, **bf16), torch.randn(INTERMEDIATE, 2 * rank, **bf16) * 0.01
    a = torch.randn(rank, INTERMEDIATE, **bf16) / INTERMEDIATE**0.5
    grad, dhd = torch.randn(rows, INTERMEDIATE, **bf16), torch.randn(rows, rank, **bf16)
    copies_ms = median_ms(lambda: (gate.clone(), up.clone()), reps, 1)
    out, ref = [], {}
    for name, module in (("old", old), ("new", new)):
        c, hd = module.forward_down(gate, up, hidden, b, a, s, s, seed, p)
        dg, du = gate.clone(), up.clone()
        grad_a = module.backward_down(grad, dg, du, hidden, b, a, dhd, s, s, seed, p)
        results = {"forward": (c, hd), "backward": (grad_a, dg, du)}
        fwd = median_ms(lambda m=module: m.forward_down(gate, up, hidden, b, a, s, s, seed, p), reps, 1)
        bwd = median_ms(lambda m=module: m.backward_down(grad, gate.clone(), up.clone(), hidden, b, a, dhd, s, s,
                                                         seed, p), reps, 1) - copies_ms
        for kernel, ms in (("forward", fwd), ("backward", bwd)):
            ref.setdefault(kernel, results[kernel])
            err = max(_max_err(x, r) for x, r in zip(results[kernel], ref[kernel], strict=True))
            out.append({"part": "swiglu", "variant": f"{kernel}_down, {name} kernels {module.TILES['down_' + kernel]}",
                        "ms": round(ms, 3), "per_step_ms": round(ms * LAYERS * MICRO_STEPS, 1), "max_err": err})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16384, help="tokens a micro-step (the plan: 8 x 2048)")
    parser.add_argument("--chunks", default="1024,2048,4096")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--micro-steps", type=int, default=MICRO_STEPS, help="micro-steps a plan step")
    parser.add_argument("--gemm", action="store_true", help="time the block's frozen matmuls alone too")
    parser.add_argument("--old-swiglu", help="a lora_swiglu_kernel.py to time the SwiGLU kernels against")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    globals()["MICRO_STEPS"] = args.micro_steps  # the per-step figures of every part
    import torch

    if not torch.cuda.is_available():
        print("step_parts.py times GPU kernels: no CUDA device here", file=sys.stderr)
        return 2
    rows = measure_ce(args.rows, [int(c) for c in args.chunks.split(",") if c], args.reps)
    rows += measure_norm(args.rows, args.reps)
    if args.gemm:
        rows += measure_gemm(args.rows, args.reps)
    if args.old_swiglu:
        rows += measure_swiglu(args.rows, args.reps, args.old_swiglu)
    lines = [f"# Step parts at {args.rows} rows ({torch.cuda.get_device_name()})", "",
             "| part | variant | ms a call | ms a plan step | max abs diff to the first | note |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        note = f"logits {r['logits_mib']} MiB" if "logits_mib" in r else f"{r['tflops']} TFLOP/s" if "tflops" in r \
            else ""
        lines.append(f"| {r['part']} | {r['variant']} | {r['ms']} | {r['per_step_ms']} | {r['max_err']:.3g} | {note} |")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    Path(args.out).with_suffix(".json").write_text(json.dumps({"rows": args.rows, "results": rows}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
