"""The LoRA B product inside the base matmul ("wide" weights) against an add after it, per group of one block.

A LoRA linear's output is ``x W^T + s (h B^T)`` with ``h = dropout(x) A^T`` (rank r). The grouped engine adds
the second term in the epilogue of the ``lora_B`` matmul (``addmm_`` into the base output): a skinny matmul
that reads and writes the whole base output again. Concatenated along the reduction, ``[x | h] [W | s B]^T``
is one matmul: r more columns of reduction (under 1% more FLOPs at r = 16 on a 3,584-wide input) and no
second pass over the output. In backward the same wide weight gives ``g [W | s B] = [dx | dh]``: the input's
gradient and the adapters' ``dh`` from one read of g, where now ``dh = g (s B)`` reads g again per linear.
The price: ``[x | h]`` must be built (a copy of x, per forward) and the base weight must live in a buffer r
columns wider per linear of its group.

For the groups whose linears share an input (q/k/v and gate/up of a Qwen2.5-7B) at ``--tokens`` rows, times
on one CUDA GPU (CUDA events, median of ``--reps``) forward and backward both ways, and checks the wide
results against the current ones (bf16 tolerance). Writes Markdown (``--out``) and JSON beside it.

    python bench/lora_wide_gemm.py --out bench/results/lora-wide-gemm.md [--tokens 8192,16384]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lora_dropout_kernel import median_ms  # (bench/ is not a package: run as a script)
from results_files import write_results  # noqa: E402  (after lora_dropout_kernel, which puts the repository on the path)

# (name, output widths, bias, input width) of a Qwen2.5-7B block's groups that share an input
GROUPS_7B = (("q/k/v", (3584, 512, 512), True, 3584), ("gate/up", (18944, 18944), False, 3584))


def _group(name: str, outs: tuple[int, ...], bias: bool, width: int, tokens: int, rank: int, reps: int) -> dict:
    import torch

    dev, dt = "cuda", torch.bfloat16
    torch.manual_seed(0)
    g_count, s = len(outs), 2.0
    x = torch.randn(tokens, width, device=dev, dtype=dt)
    ws = [torch.randn(o, width, device=dev, dtype=dt) / width ** 0.5 for o in outs]
    bs = [torch.randn(o, device=dev, dtype=dt) if bias else None for o in outs]
    b_ad = [torch.randn(o, rank, device=dev, dtype=dt) / rank for o in outs]
    h = torch.randn(tokens, g_count * rank, device=dev, dtype=dt)
    hs = list(h.split(rank, dim=1))
    gs = [torch.randn(tokens, o, device=dev, dtype=dt) for o in outs]
    # the wide weight: each linear's rows [W_i | 0 .. s B_i .. 0], one buffer for the group
    wide = torch.zeros(sum(outs), width + g_count * rank, device=dev, dtype=dt)
    rows = list(wide.split(list(outs), dim=0))
    for i, (w, b) in enumerate(zip(ws, b_ad, strict=True)):
        rows[i][:, :width] = w
        rows[i][:, width + i * rank:width + (i + 1) * rank] = b * s

    def fwd_now():
        out = []
        for w, bias_i, hi, b in zip(ws, bs, hs, b_ad, strict=True):
            o = torch.addmm(bias_i, x, w.t()) if bias_i is not None else torch.mm(x, w.t())
            o.addmm_(hi, b.t(), alpha=s)
            out.append(o)
        return out

    def fwd_wide():
        buf = torch.empty(tokens, width + g_count * rank, device=dev, dtype=dt)
        buf[:, :width].copy_(x)
        buf[:, width:].copy_(h)
        return [torch.addmm(bias_i, buf, r.t()) if bias_i is not None else torch.mm(buf, r.t())
                for r, bias_i in zip(rows, bs, strict=True)]

    def bwd_now():
        dx = torch.mm(gs[0], ws[0])
        for g, w in zip(gs[1:], ws[1:], strict=True):
            dx.addmm_(g, w)
        dh = [torch.mm(g, b * s) for g, b in zip(gs, b_ad, strict=True)]
        return dx, torch.cat(dh, dim=1)

    def bwd_wide():
        dxw = torch.mm(gs[0], rows[0])
        for g, r in zip(gs[1:], rows[1:], strict=True):
            dxw.addmm_(g, r)
        return dxw[:, :width], dxw[:, width:].contiguous()

    def bwd_wide_contiguous():  # the input gradient made contiguous too (a copy the dropout kernel could fold)
        dx, dh = bwd_wide()
        return dx.contiguous(), dh

    a, b = fwd_now(), fwd_wide()
    fwd_err = max(((p - q).abs().max() / p.abs().max()).item() for p, q in zip(a, b, strict=True))
    (dx0, dh0), (dx1, dh1) = bwd_now(), bwd_wide()
    bwd_err = max(((dx0 - dx1).abs().max() / dx0.abs().max()).item(), ((dh0 - dh1).abs().max() / dh0.abs().max()).item())
    row = {"group": name, "tokens": tokens, "rank": rank,
           "forward_now_ms": median_ms(fwd_now, reps, 1), "forward_wide_ms": median_ms(fwd_wide, reps, 1),
           "backward_now_ms": median_ms(bwd_now, reps, 1), "backward_wide_ms": median_ms(bwd_wide, reps, 1),
           "backward_wide_contiguous_ms": median_ms(bwd_wide_contiguous, reps, 1),
           "forward_rel_err": fwd_err, "backward_rel_err": bwd_err}
    row["ok"] = fwd_err < 2e-2 and bwd_err < 2e-2
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default="8192,16384")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("lora_wide_gemm: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = [_group(name, outs, bias, width, int(t), args.rank, args.reps)
            for t in args.tokens.split(",") for name, outs, bias, width in GROUPS_7B]
    lines = [f"# LoRA B inside the base matmul, {torch.cuda.get_device_name()}", "",
             "| group | tokens | fwd now ms | fwd wide ms | bwd now ms | bwd wide ms | bwd wide, dx contiguous ms | "
             "rel err fwd / bwd | ok |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['group']} | {r['tokens']} | {r['forward_now_ms']:.3f} | {r['forward_wide_ms']:.3f} | "
                     f"{r['backward_now_ms']:.3f} | {r['backward_wide_ms']:.3f} | {r['backward_wide_contiguous_ms']:.3f} | "
                     f"{r['forward_rel_err']:.1e} / {r['backward_rel_err']:.1e} | {'ok' if r['ok'] else 'MISMATCH'} |")
    write_results(args.out, {"device": torch.cuda.get_device_name(), "rows": rows}, "\n".join(lines))
    print("\n".join(lines))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
