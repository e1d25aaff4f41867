"""Causal attention, forward and backward, at a plan's shape: PyTorch's SDPA backends against FlashAttention-4.

The wizard's 7B LoRA plan (Qwen2.5-7B, micro-batch 16 x 2048, no checkpointing) spends ~128 ms of its 1.75 s
step in cuDNN's attention (engine-speed-r's profile). FlashAttention-4 (``flash-attn-4``: CuTe DSL kernels,
forward and backward for SM90 among others) is pip-installable, unlike FlashAttention-3: this measures whether it
would pay before anything wires it in. Each backend runs the same q, k, v (GQA: 28 query heads over 4 key/value
heads, head dim 128, bf16) in its own layout, forward alone and forward + backward, timed with CUDA events over
``--iters`` calls after warm-up (FA4 compiles its kernels on the first call; that time is recorded apart), and
its output and gradients are compared with cuDNN's and with an fp32 reference on the first batch row.

    python3 bench/attention_kernels.py --out DIR [--shapes 16x2048,4x2048] [--iters 20]

Writes DIR/attention-kernels.json and .md. TFLOP/s count causal attention's FLOPs (half the square): forward
4·b·h·s²·d / 2, backward 2.5 times that.

On the H200 (bench/results/attention-kernels.md, session 23) FA4 ran forward + backward 6% faster than cuDNN
(3.65 against 3.90 ms a layer at 16 x 2048): 7 ms of the plan's 1.75 s step, for ~100 MB of wheels (its CuTe DSL
compiler alone is 92 MB), so tunedeck keeps cuDNN. FA4 reached the GPU machine as its wheels (flash-attn-4
4.0.0b40, nvidia-cutlass-dsl 4.8.1 with libs-base, libs-core and libs-cu13, quack-kernels, apache-tvm-ffi,
torch-c-dlpack-ext) installed with ``pip --target``, the libs-cu13 wheel's files extracted over them after
(pip will not merge into its existing folder) and ``<target>/nvidia_cutlass_dsl/dsl_packages`` first on
PYTHONPATH (the wheel's .pth file is not read outside site-packages).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # core, for results_files

from results_files import write_results  # noqa: E402  (bench/ is not a package)

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 28, 4, 128, 28  # Qwen2.5-7B


def sdpa(backend_name: str) -> Callable[..., Any]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)

    def run(q: Any, k: Any, v: Any) -> Any:  # [b, s, h, d] in and out, as the model's layout
        with sdpa_kernel([backend]):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
        return out.transpose(1, 2)

    return run


def fa4() -> Callable[..., Any]:
    from flash_attn.cute import flash_attn_func

    def run(q: Any, k: Any, v: Any) -> Any:
        out = flash_attn_func(q, k, v, causal=True)
        return out[0] if isinstance(out, tuple) else out

    return run


def reference(q: Any, k: Any, v: Any) -> Any:
    """fp32 attention of one batch row, the plain way."""
    import torch

    q, k, v = (t[:1].float().transpose(1, 2) for t in (q, k, v))
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    s = q.shape[2]
    scores = (q @ k.transpose(-1, -2)) / HEAD_DIM ** 0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


def timed(fn: Callable[[], Any], iters: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def measure(name: str, fn: Callable[..., Any], shape: tuple[int, int], iters: int,
            baseline: dict[str, Any] | None) -> dict[str, Any]:
    import torch

    batch, seq = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, seq, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(batch, seq, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(batch, seq, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    dout = torch.randn(batch, seq, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    first = time.perf_counter()
    out = fn(*leaves)
    out.backward(dout)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - first
    grads = [t.grad.clone() for t in leaves]
    for _ in range(3):
        fn(*leaves).backward(dout)
    with torch.no_grad():
        timed(lambda: fn(q, k, v), 3)  # a backend may build another graph without autograd: not timed
        forward_ms = timed(lambda: fn(q, k, v), iters)

    def step() -> None:
        for t in leaves:
            t.grad = None
        fn(*leaves).backward(dout)

    both_ms = timed(step, iters)
    flops = 4 * batch * HEADS * seq * seq * HEAD_DIM / 2
    row: dict[str, Any] = {
        "backend": name, "batch": batch, "seq": seq, "first_call_s": round(first_s, 2),
        "forward_ms": round(forward_ms, 3), "forward_backward_ms": round(both_ms, 3),
        "backward_ms": round(both_ms - forward_ms, 3),
        "forward_tflops": round(flops / forward_ms / 1e9, 1),
        "backward_tflops": round(2.5 * flops / max(1e-9, both_ms - forward_ms) / 1e9, 1),
        "plan_step_ms": round(both_ms * LAYERS, 1),
    }
    ref = reference(q, k, v)
    row["max_abs_vs_fp32_row0"] = round(float((out[:1].detach().float() - ref).abs().max()), 5)
    if baseline is not None:
        row["max_abs_out_vs_cudnn"] = round(float((out.float() - baseline["out"].float()).abs().max()), 5)
        row["max_abs_grad_vs_cudnn"] = [round(float((g.float() - b.float()).abs().max()), 5)
                                        for g, b in zip(grads, baseline["grads"], strict=True)]
        row["max_abs_grad"] = [round(float(b.float().abs().max()), 4) for b in baseline["grads"]]
    row["_out"], row["_grads"] = out.detach(), grads
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="16x2048,4x2048")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    import torch

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    backends: list[tuple[str, Callable[[], Callable[..., Any]]]] = [
        ("sdpa-cudnn", lambda: sdpa("CUDNN_ATTENTION")), ("sdpa-flash", lambda: sdpa("FLASH_ATTENTION")),
        ("fa4", fa4)]
    rows: list[dict[str, Any]] = []
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        baseline = None
        for name, make in backends:
            try:
                row = measure(name, make(), shape, args.iters, baseline)
            except Exception as exc:  # noqa: BLE001 - a backend that cannot run this shape is a result too
                rows.append({"backend": name, "batch": shape[0], "seq": shape[1],
                             "error": f"{type(exc).__name__}: {exc}"[:400]})
                continue
            if name == "sdpa-cudnn":
                baseline = {"out": row["_out"], "grads": row["_grads"]}
            rows.append({k: v for k, v in row.items() if not k.startswith("_")})
            torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "iters": args.iters}
    try:
        from importlib.metadata import version

        meta["flash_attn_4"] = version("flash-attn-4")
    except Exception:  # noqa: BLE001
        meta["flash_attn_4"] = None
    lines = [f"# Causal attention, forward + backward ({meta['device']}, torch {meta['torch']}, "
             f"flash-attn-4 {meta['flash_attn_4']})", "",
             "| backend | b x s | fwd ms | fwd+bwd ms | fwd TF/s | bwd TF/s | x28 layers ms | first call s | "
             "out vs cuDNN | dq/dk/dv vs cuDNN (max |grad|) | vs fp32 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['backend']} | {r['batch']}x{r['seq']} | {r['error']} |||||||||")
            continue
        lines.append(f"| {r['backend']} | {r['batch']}x{r['seq']} | {r['forward_ms']} | {r['forward_backward_ms']} | "
                     f"{r['forward_tflops']} | {r['backward_tflops']} | {r['plan_step_ms']} | {r['first_call_s']} | "
                     f"{r.get('max_abs_out_vs_cudnn', '-')} | {r.get('max_abs_grad_vs_cudnn', '-')} "
                     f"({r.get('max_abs_grad', '-')}) | {r['max_abs_vs_fp32_row0']} |")
    write_results(out_dir / "attention-kernels.md", {"meta": meta, "rows": rows}, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
