"""The fused LM head + cross-entropy (``fused_ce: triton``) at a plan's shape: chunk sizes, and every row against
the collator's ``target_rows`` only.

The wizard's 7B LoRA plan (Qwen2.5-7B: hidden 3,584, vocabulary 152,064; micro-batch 16 x 2048 = 32,768 rows)
spends ~122 ms of its step in the LM head's two matmuls and the loss rows (engine-speed-t's profile): the
logits of a 1,024-row chunk (Liger's rule, ``fused_chunk_tokens``) and their gradient times the head weight, which
cuBLAS runs split-K at that height (607 TFLOP/s against the logits' 672). This times
``core.train.linear_ce_kernel.linear_cross_entropy``, forward + backward, with CUDA events over ``--iters`` calls
after warm-up, for each chunk size, over every row and over the rows with a target (``--prompt`` of each
2048-token row masked, as the bench data's 5.3%), and records the allocator's peak above the inputs.

    python3 bench/lm_head_chunks.py --out DIR|FILE.md [--rows 32768] [--prompt 0.053] [--iters 10]

Writes DIR/lm-head-chunks.json and .md (or FILE.md and FILE.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # core, for results_files

from results_files import write_results  # noqa: E402  (bench/ is not a package)

HIDDEN, VOCAB, SEQ = 3584, 152_064, 2048  # Qwen2.5-7B


def measure(rows: int, prompt: float, chunks: list[int], iters: int) -> list[dict[str, Any]]:
    import torch

    from core.train.fused_loss import fused_chunk_tokens, target_rows
    from core.train.linear_ce_kernel import linear_cross_entropy

    torch.manual_seed(0)
    device = "cuda"
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False, device=device, dtype=torch.bfloat16).requires_grad_(False)
    hidden = (torch.randn(rows // SEQ, SEQ, HIDDEN, device=device, dtype=torch.bfloat16)).requires_grad_(True)
    labels = torch.randint(0, VOCAB, (rows // SEQ, SEQ))
    labels[:, :round(prompt * SEQ)] = -100
    taken = target_rows(labels)
    labels, taken_gpu = labels.to(device), taken.to(device)
    out = []
    reference: dict[str, float] = {}
    for chunk in [None, *chunks]:
        for mode, given in (("every row", None), ("target rows", taken_gpu)):
            def step(chunk: int | None = chunk, given: Any = given) -> Any:
                hidden.grad = None
                loss = linear_cross_entropy(hidden, labels, head, chunk=chunk, rows=given)
                loss.backward()
                return loss

            loss = step()  # warm-up (compiles the row kernel once)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                loss = step()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end) / iters
            grad_norm = float(hidden.grad.float().norm())
            key = f"{chunk}"
            if mode == "every row":
                reference[key] = float(loss)
            used = chunk or fused_chunk_tokens(rows, VOCAB, HIDDEN)  # the batch's positions (linear_ce_kernel)
            out.append({"chunk": used, "rule": chunk is None, "mode": mode, "rows": rows if given is None else taken.numel(),
                        "ms": round(ms, 3), "loss": float(loss), "loss_vs_every_row": float(loss) - reference[key],
                        "grad_norm": grad_norm,
                        "peak_above_inputs_gib": round((torch.cuda.max_memory_allocated() - base) / 2**30, 3),
                        "tflops": round(4 * HIDDEN * VOCAB * (rows if given is None else taken.numel()) / ms / 1e9, 1)})
            print(json.dumps(out[-1]), flush=True)
    return out


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# LM head + cross-entropy (fused_ce: triton), {meta['gpu']}", "",
             f"{meta['rows']} rows x {HIDDEN} -> {VOCAB}, bf16, {meta['prompt']:.3f} of each {SEQ}-token row without "
             f"a target; forward + backward, mean of {meta['iters']} calls (ms). `{meta['command']}`", "",
             "| chunk | rows taken | ms | TFLOP/s (the two matmuls) | peak above inputs GiB | loss | vs every row |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        chunk = f"{r['chunk']}" + (" (rule)" if r["rule"] else "")
        lines.append(f"| {chunk} | {r['mode']} ({r['rows']}) | {r['ms']:.3f} | {r['tflops']} | "
                     f"{r['peak_above_inputs_gib']:.3f} | {r['loss']:.5f} | {r['loss_vs_every_row']:+.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=16 * SEQ)
    parser.add_argument("--prompt", type=float, default=0.053)
    parser.add_argument("--chunks", default="2048,4096,8192")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args(argv)
    import torch

    rows = measure(args.rows, args.prompt, [int(c) for c in args.chunks.split(",") if c], args.iters)
    meta = {"gpu": torch.cuda.get_device_name(), "rows": args.rows, "prompt": args.prompt, "iters": args.iters,
            "command": "python3 bench/lm_head_chunks.py " + " ".join(sys.argv[1:] if argv is None else argv), "torch": torch.__version__,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out = args.out if args.out.suffix == ".md" else args.out / "lm-head-chunks.md"  # a file, or a folder for it
    write_results(out, {"meta": meta, "rows": rows}, render(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
