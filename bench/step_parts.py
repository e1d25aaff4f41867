"""Candidate savings in a 7B LoRA step outside the big matmuls, timed alone on the GPU (one H200):

- ``ce``: the LM head and loss (``core.train.linear_cross_entropy``, forward and backward) over one micro-batch's
  rows, at the chunk the rule picks (``fused_chunk_tokens``: 512 rows for Qwen2.5-7B) and at larger chunks, whose
  logits take more memory (rows x 152,064 x 2 bytes) but whose input-gradient matmul needs no split-K;
- ``norm``: a decoder block's residual add and RMSNorm, as two kernels (torch's add, Liger's RMSNorm: what runs
  today, twice a block) against Liger's fused add + RMSNorm, forward and backward.

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
MICRO_STEPS, NORMS = 2, 56  # the wizard's 7B plan: b8 x 2 accumulation; 2 RMSNorms a block, 28 blocks


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
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=16384, help="tokens a micro-step (the plan: 8 x 2048)")
    parser.add_argument("--chunks", default="1024,2048,4096")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("step_parts.py times GPU kernels: no CUDA device here", file=sys.stderr)
        return 2
    rows = measure_ce(args.rows, [int(c) for c in args.chunks.split(",") if c], args.reps)
    rows += measure_norm(args.rows, args.reps)
    lines = [f"# Step parts at {args.rows} rows ({torch.cuda.get_device_name()})", "",
             "| part | variant | ms a call | ms a plan step | max abs diff to the first | note |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        note = f"logits {r['logits_mib']} MiB" if "logits_mib" in r else ""
        lines.append(f"| {r['part']} | {r['variant']} | {r['ms']} | {r['per_step_ms']} | {r['max_err']:.3g} | {note} |")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    Path(args.out).with_suffix(".json").write_text(json.dumps({"rows": args.rows, "results": rows}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
