"""An adapted linear's forward in the two orders of ``core.train.lora_group._adapted`` (``TUNEDECK_LORA_B_FIRST``), at
a plan's rows: the frozen matmul, then the lora_B matmul reading and writing its output again (``addmm_``, as before),
against the update first (``s h B^T`` plus the bias) and the frozen matmul adding into it in its epilogue (beta 1, the default).

The wizard's 7B LoRA plan on the H200 (Qwen2.5-7B, 16 x 2048 = 32,768 rows) spent ~16 ms of its step in the first
order's adds (engine-speed-x's profile), at ~57% of the memory's bandwidth; the second order writes each output once
instead of reading and writing it. gate/up are not here: their updates are made inside the SwiGLU kernels. Each
shape's weight lives in a wider buffer, as ``lora_group.home_lora_bases`` keeps it (rows of ``FOLD_ROW_BYTES``),
the rank-16 ``h`` in bf16. CUDA events over ``--iters`` calls after a warm-up, the median of ``--repeats``,
the three taken in turns.

    python3 bench/lora_b_first.py --out DIR|FILE.md [--rows 32768] [--iters 20] [--repeats 5]

Writes DIR/lora-b-first.json and .md (or FILE.md and FILE.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # core, for results_files

from attention_kernels import timed  # noqa: E402  (bench/ is not a package)
from results_files import write_results  # noqa: E402

# Qwen2.5-7B's adapted linears whose update lora_group adds: (name, in, out, bias, slots: the group's ranks in the
# input-gradient fold buffer beside the weight)
SHAPES = [("q_proj", 3584, 3584, True, 3), ("k_proj", 3584, 512, True, 3), ("v_proj", 3584, 512, True, 3),
          ("o_proj", 3584, 3584, False, 1), ("down_proj", 18944, 3584, False, 1)]
LAYERS, RANK, SCALING = 28, 16, 2.0


def _linear(fan_in: int, fan_out: int, bias: bool, slots: int) -> Any:
    import torch

    from core.train.lora_group import FOLD_ROW_BYTES

    linear = torch.nn.Linear(fan_in, fan_out, bias=bias, device="cuda", dtype=torch.bfloat16).requires_grad_(False)
    step = FOLD_ROW_BYTES // 2
    width = -(-(fan_in + slots * RANK) // step) * step
    home = torch.zeros(fan_out, width, device="cuda", dtype=torch.bfloat16)
    home[:, :fan_in] = linear.weight
    linear.weight = torch.nn.Parameter(home[:, :fan_in], requires_grad=False)  # rows of the wider buffer
    return linear


def _ms(fns: dict[str, Any], iters: int, repeats: int) -> dict[str, float]:
    """Each of ``fns``' median ms a call, taken in turns (the capped clock drifts: no order gets a better stretch)."""
    import torch

    times: dict[str, list[float]] = {name: [] for name in fns}
    for name in fns:
        fns[name]()
    torch.cuda.synchronize()
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn, iters))
    return {name: round(statistics.median(t), 4) for name, t in times.items()}


def _shape(name: str, fan_in: int, fan_out: int, bias: bool, slots: int, rows: int, iters: int,
           repeats: int) -> dict[str, Any]:
    import torch

    from core.train import lora_group

    base = _linear(fan_in, fan_out, bias, slots)
    x = torch.randn(rows, fan_in, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(rows, RANK, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(fan_out, RANK, device="cuda", dtype=torch.bfloat16) * 0.05
    row: dict[str, Any] = {"linear": name, "in": fan_in, "out": fan_out, "bias": bias, "rows": rows}
    reference = torch.nn.functional.linear(x.float(), base.weight.float(), None if base.bias is None else
                                           base.bias.float()) + SCALING * h.float() @ b.float().t()
    scale = float(reference.abs().max())
    def adapted(first: bool) -> Any:
        lora_group.B_FIRST = first
        return lora_group._adapted(base, x, h, b, SCALING)

    for order, first in (("base first", False), ("update first", True)):
        row[f"{order}: max error / max"] = float((adapted(first).float() - reference).abs().max()) / scale
    row.update(_ms({"base first": lambda: adapted(False), "update first": lambda: adapted(True),
                    "frozen alone": lambda: base(x)}, iters, repeats))
    lora_group.B_FIRST = False
    row["adds, base first (ms)"] = round(row["base first"] - row["frozen alone"], 4)
    row["adds, update first (ms)"] = round(row["update first"] - row["frozen alone"], 4)
    row["bytes of the output (GB)"] = rows * fan_out * 2 / 1e9
    return row


def measure(rows: int, iters: int, repeats: int) -> list[dict[str, Any]]:
    import torch

    torch.manual_seed(0)
    out = []
    for shape in SHAPES:
        out.append(_shape(*shape, rows, iters, repeats))
        print(json.dumps(out[-1]), flush=True)
    return out


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"# An adapted linear's forward, base first against update first, {meta['gpu']}", "",
             f"{meta['rows']} rows, bf16, rank {RANK}; median of {meta['repeats']} x {meta['iters']} calls (ms). "
             f"`{meta['command']}`", "",
             "| linear | in -> out | frozen alone | base first | update first | adds: base first / update first | "
             "max error / max (base first, update first) |",
             "|---|---|---|---|---|---|---|"]
    block = {"base first": 0.0, "update first": 0.0}
    for r in rows:
        for order in block:
            block[order] += r[order]
        lines.append(f"| {r['linear']} | {r['in']} -> {r['out']}{' + bias' if r['bias'] else ''} | {r['frozen alone']:.4f} | "
                     f"{r['base first']:.4f} | {r['update first']:.4f} | {r['adds, base first (ms)']:.4f} / "
                     f"{r['adds, update first (ms)']:.4f} | {r['base first: max error / max']:.1e}, "
                     f"{r['update first: max error / max']:.1e} |")
    saved = block["base first"] - block["update first"]
    lines += ["", f"A block's five: {block['base first']:.3f} ms base first, {block['update first']:.3f} update first: "
              f"{saved:+.3f} ms a block, {saved * LAYERS:+.1f} ms over {LAYERS} blocks (one forward of the plan's "
              "micro-batch)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import torch

    rows = measure(args.rows, args.iters, args.repeats)
    meta = {"gpu": torch.cuda.get_device_name(), "rows": args.rows, "iters": args.iters, "repeats": args.repeats,
            "command": "python3 bench/lora_b_first.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "torch": torch.__version__, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out = args.out if args.out.suffix == ".md" else args.out / "lora-b-first.md"  # a file, or a folder for it
    write_results(out, {"meta": meta, "rows": rows}, render(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
