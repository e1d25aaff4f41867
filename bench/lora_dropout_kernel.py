"""LoRA dropout's own cost per group, torch's (``lora_dropout_fused: false``) against the Triton kernels.

For the LoRA groups of one decoder block (q/k/v, gate/up, o, down of a Qwen2.5-7B by default) at
``--tokens`` rows, times on one CUDA GPU (CUDA events, median of ``--reps`` after warm-up) what each way does
besides the base matmuls:

- ``torch``: per linear ``native_dropout`` (copy + mask) and ``lora_A`` over the copy; backward the
  ``lora_A`` input gradient, dropout's backward, the add into the input's gradient, ``lora_A``'s weight
  gradient over the kept copy (the grouped node's dropout path);
- ``fused``: ``lora_dropout_kernel``'s forward, input-gradient and adapter-gradient kernels;
- ``no dropout``: the concatenated ``lora_A`` matmul and its two gradients, the floor.

Also checks that the fused results equal torch's maths on the kernels' own masks (bf16 tolerance), and the
bytes each way keeps for backward. Writes Markdown (``--out``) and JSON beside it.

``--sweep`` instead times each kernel over a grid of tiles (rows and columns a program, warps, pipeline
stages) for every group and reports the fastest, which ``lora_dropout_kernel.TILES`` takes.

    python bench/lora_dropout_kernel.py --out bench/results/lora-dropout-kernel.md [--sweep]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from results_files import write_results  # noqa: E402  (bench/ is not a package)

# (name, linears in the group, input width) of a Qwen2.5-7B block
GROUPS_7B = (("q/k/v", 3, 3584), ("gate/up", 2, 3584), ("o", 1, 3584), ("down", 1, 18944))


def median_ms(fn, reps: int, calls: int = 5) -> float:
    """Median ms a call, each sample ``calls`` calls back to back (a lone call would time its launch too)."""
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def measure(tokens: int, rank: int, p: float, reps: int) -> list[dict]:
    return [_group(name, groups, width, tokens, rank, p, reps) for name, groups, width in GROUPS_7B]


def _group(name: str, groups: int, width: int, tokens: int, rank: int, p: float, reps: int) -> dict:
    import torch

    from core.train import lora_dropout_kernel as kernels

    device = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(tokens, width, device=device, dtype=torch.bfloat16)
    a = (torch.randn(groups * rank, width, device=device) * width**-0.5).to(torch.bfloat16)
    a_list = list(a.split(rank))
    dh = torch.randn(tokens, groups * rank, device=device, dtype=torch.bfloat16)
    dh_list = list(dh.split(rank, dim=1))
    dx = torch.zeros(tokens, width, device=device, dtype=torch.bfloat16)
    scale = 1.0 / (1.0 - p)
    seed = 1234

    saved: dict[str, list] = {}

    def torch_forward():
        pairs = [torch.native_dropout(x, p, True) for _ in range(groups)]
        saved["pairs"] = pairs
        return [torch.mm(xd, ag.t()) for (xd, _), ag in zip(pairs, a_list, strict=True)]

    torch_forward()

    def torch_backward():
        for (xd, mask), ag, dhg in zip(saved["pairs"], a_list, dh_list, strict=True):
            part = torch.mm(dhg, ag)
            dx.add_(torch.ops.aten.native_dropout_backward(part, mask, scale))
            torch.mm(dhg.t(), xd)

    def fused_forward():
        return kernels.dropout_lora_a(x, a, groups, seed, p)

    def separate_backward():  # the two backward kernels, each drawing the masks
        kernels.add_input_grad(dx, dh, a, groups, seed, p)
        kernels.adapter_grads(x, dh, groups, rank, seed, p)

    def fused_backward():  # what the grouped node runs: one kernel for both
        kernels.backward(x, dh, a, dx, groups, seed, p)

    def plain_forward():
        return torch.mm(x, a.t())

    def plain_backward():
        dx.addmm_(dh, a)
        torch.mm(dh.t(), x)

    row = {"group": name, "linears": groups, "width": width, "tokens": tokens}
    for label, forward, backward in (("torch", torch_forward, torch_backward),
                                     ("fused", fused_forward, fused_backward),
                                     ("no_dropout", plain_forward, plain_backward)):
        row[f"{label}_forward_ms"] = round(median_ms(forward, reps), 4)
        row[f"{label}_backward_ms"] = round(median_ms(backward, reps), 4)
    row["separate_backward_ms"] = round(median_ms(separate_backward, reps), 4)
    # kept for backward beyond lora_A's outputs: torch a copy + a mask per linear, fused the input once
    row["torch_kept_mb"] = round(groups * tokens * width * 3 / 1e6, 1)
    row["fused_kept_mb"] = round(tokens * width * 2 / 1e6, 1)

    # the fused results against torch's maths on the kernels' masks
    masks = kernels.masks(tokens, width, groups, seed, p, device=device)
    kept_scale = kernels.keep_scale(p)  # the kernels' (p rounded as their threshold rounds it)
    want = torch.cat([(x.float() * masks[g] * kept_scale).to(torch.bfloat16).float() @ a_list[g].float().t()
                      for g in range(groups)], dim=1)
    got = fused_forward().float()
    row["forward_max_rel_err"] = round(((got - want).abs().max() / want.abs().max()).item(), 5)
    row["keep_rate"] = round(masks.float().mean().item(), 5)
    return row


SWEEP = {  # the tiles tried, by kernel (the forward's SPLIT shares a row block's width among programs)
    "forward": [{"BN": bn, "BK": bk, "num_warps": 4, "num_stages": 3, "SPLIT": split}
                for bn in (16, 32, 64) for bk in (64, 128) for split in (1, 2, 4)]
    + [{"BN": 64, "BK": 128, "num_warps": 8, "num_stages": 3, "SPLIT": split} for split in (2, 4)],
    "input_grad": [{"BN": bn, "BK": bk, "num_warps": w, "num_stages": 1}
                   for bn in (32, 64, 128) for bk in (64, 128) for w in (4, 8)],
    "adapter_grad": [{"BN": bn, "BK": bk, "num_warps": w, "num_stages": 3}
                     for bn in (32, 64) for bk in (64, 128) for w in (4, 8)]
    + [{"BN": 128, "BK": 64, "num_warps": 8, "num_stages": 3}],
    "backward": [{"BN": bn, "BK": bk, "num_warps": w, "num_stages": st}
                 for bn in (32, 64) for bk in (64, 128) for w in (4, 8) for st in (2, 3)],
}


def sweep(tokens: int, rank: int, p: float, reps: int, budget_s: float, kernels_wanted: tuple[str, ...] = tuple(SWEEP),
          groups_wanted: tuple[str, ...] | None = None) -> dict:
    """Median ms of each kernel, tile of ``SWEEP`` and group (None where a tile does not compile or run); no
    new tile after ``budget_s`` seconds (every timed tile has all its groups). ``groups_wanted``: only these of
    ``GROUPS_7B`` (with ``lora_swiglu_down`` the down projection's work runs in the SwiGLU kernels instead)."""
    import torch

    from core.train import lora_dropout_kernel as kernels

    device = torch.device("cuda")
    began = time.monotonic()
    out: dict = {"timings": [], "best": {}}
    calls: dict = {kernel: [] for kernel in kernels_wanted}
    block = [g for g in GROUPS_7B if groups_wanted is None or g[0] in groups_wanted]
    for name, groups, width in block:
        torch.manual_seed(0)
        x = torch.randn(tokens, width, device=device, dtype=torch.bfloat16)
        a = (torch.randn(groups * rank, width, device=device) * width**-0.5).to(torch.bfloat16)
        dh = torch.randn(tokens, groups * rank, device=device, dtype=torch.bfloat16)
        dx = torch.zeros(tokens, width, device=device, dtype=torch.bfloat16)
        every = {"forward": lambda t, x=x, a=a, g=groups: kernels.dropout_lora_a(x, a, g, 1, p, tiles=t),
                 "input_grad": lambda t, dx=dx, dh=dh, a=a, g=groups: kernels.add_input_grad(dx, dh, a, g, 1, p, tiles=t),
                 "adapter_grad": lambda t, x=x, dh=dh, g=groups: kernels.adapter_grads(x, dh, g, rank, 1, p, tiles=t),
                 "backward": lambda t, x=x, dh=dh, a=a, dx=dx, g=groups: kernels.backward(x, dh, a, dx, g, 1, p, tiles=t)}
        for kernel in calls:
            calls[kernel].append((name, every[kernel]))
    for kernel, group_calls in calls.items():
        for tiles in SWEEP[kernel]:
            if time.monotonic() - began > budget_s:
                print(f"sweep: budget of {budget_s:.0f} s spent, {kernel} {tiles} and later tiles not timed")
                break
            for name, call in group_calls:
                try:
                    ms = round(median_ms(lambda call=call, tiles=tiles: call(tiles), reps), 4)
                except Exception as exc:  # a tile too large for the registers or shared memory
                    ms, why = None, type(exc).__name__
                else:
                    why = ""
                out["timings"].append({"group": name, "kernel": kernel, **tiles, "ms": ms, "error": why})
                best = out["best"].get(f"{kernel} {name}")
                if ms is not None and (best is None or ms < best["ms"]):
                    out["best"][f"{kernel} {name}"] = {**tiles, "ms": ms}
        print(kernel, {k: v for k, v in out["best"].items() if k.startswith(kernel)}, flush=True)
    # one tile per kernel: the least total over a block's groups
    totals: dict = {}
    for t in out["timings"]:
        if t["ms"] is None:
            continue
        tiles = tuple((k, v) for k, v in t.items() if k not in ("group", "kernel", "ms", "error"))
        totals.setdefault((t["kernel"], tiles), []).append(t["ms"])
    out["overall"] = {}
    for kernel in calls:
        complete = {k: sum(v) for k, v in totals.items() if k[0] == kernel and len(v) == len(block)}
        if complete:
            k = min(complete, key=complete.get)
            out["overall"][kernel] = {**dict(k[1]), "block_ms": round(complete[k], 4)}
    return out


def render(rows: list[dict], meta: dict) -> str:
    lines = [f"# LoRA dropout per group: torch's against the fused kernels ({meta['gpu']})", "",
             f"Qwen2.5-7B block, {meta['tokens']} tokens, rank {meta['rank']}, p {meta['p']}, median of "
             f"{meta['reps']} (ms). `python bench/lora_dropout_kernel.py {meta['args']}`", "",
             "| group | torch fwd | torch bwd | fused fwd | fused bwd (one kernel; two) | no-dropout fwd | "
             "no-dropout bwd | torch / fused | kept MB torch / fused | fwd max rel err | keep rate |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    total = {"torch": 0.0, "fused": 0.0, "no_dropout": 0.0}
    for r in rows:
        t = r["torch_forward_ms"] + r["torch_backward_ms"]
        f = r["fused_forward_ms"] + r["fused_backward_ms"]
        total["torch"] += t
        total["fused"] += f
        total["no_dropout"] += r["no_dropout_forward_ms"] + r["no_dropout_backward_ms"]
        lines.append(f"| {r['group']} | {r['torch_forward_ms']} | {r['torch_backward_ms']} | {r['fused_forward_ms']} | "
                     f"{r['fused_backward_ms']}; {r.get('separate_backward_ms')} | {r['no_dropout_forward_ms']} | {r['no_dropout_backward_ms']} | "
                     f"{t / f:.2f}x | {r['torch_kept_mb']} / {r['fused_kept_mb']} | {r['forward_max_rel_err']} | "
                     f"{r['keep_rate']} |")
    lines += ["", f"A block, forward + backward: torch {total['torch']:.3f} ms, fused {total['fused']:.3f} ms, "
              f"no dropout {total['no_dropout']:.3f} ms (with checkpointing the forward runs twice)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--p", type=float, default=0.05)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sweep", action="store_true", help="time each kernel over a grid of tiles")
    parser.add_argument("--budget-s", type=float, default=300.0, help="the sweep times no new tile after this")
    parser.add_argument("--kernels", default=",".join(SWEEP), help="the kernels the sweep times (comma-separated)")
    parser.add_argument("--groups", help="the sweep's groups of a 7B block (comma-separated; default all: "
                        + ", ".join(g[0] for g in GROUPS_7B) + ")")
    parser.add_argument("--unpaired", action="store_true",
                        help="masks from one 32-bit hash an element (lora_dropout_kernel.PAIRED = False)")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("lora_dropout_kernel: needs a CUDA GPU", file=sys.stderr)
        return 2
    from core.train import lora_dropout_kernel as kernels

    kernels.PAIRED = not args.unpaired
    if args.sweep:
        result = sweep(args.tokens, args.rank, args.p, args.reps, args.budget_s, tuple(args.kernels.split(",")),
                       tuple(args.groups.split(",")) if args.groups else None)
        result["meta"] = {"gpu": torch.cuda.get_device_name(0), "tokens": args.tokens, "rank": args.rank,
                          "p": args.p, "reps": args.reps, "args": " ".join(sys.argv[1:])}
        lines = [f"# LoRA dropout kernels: tile sweep ({result['meta']['gpu']}, {args.tokens} tokens, rank {args.rank})",
                 "", f"`python bench/lora_dropout_kernel.py {result['meta']['args']}`", "",
                 "| kernel / group | fastest tile | ms |", "|---|---|---|"]
        for key, best in result["best"].items():
            tile = "-" if best is None else {k: v for k, v in best.items() if k != "ms"}
            lines.append(f"| {key} | {tile} | {best and best['ms']} |")
        lines += ["", "One tile per kernel, least total over a block's groups:", ""]
        lines += [f"- {kernel}: {tile}" for kernel, tile in result["overall"].items()]
        write_results(args.out, result, "\n".join(lines))
        print(args.out.read_text(encoding="utf-8"))
        return 0
    rows = measure(args.tokens, args.rank, args.p, args.reps)
    meta = {"gpu": torch.cuda.get_device_name(0), "tokens": args.tokens, "rank": args.rank, "p": args.p,
            "reps": args.reps, "args": " ".join(sys.argv[1:]), "torch": torch.__version__,
            "paired": kernels.PAIRED, "tiles": kernels.TILES}
    bad = [r["group"] for r in rows if r["forward_max_rel_err"] > 2e-2 or abs(r["keep_rate"] - (1 - args.p)) > 1e-3]
    write_results(args.out, {"meta": meta, "rows": rows}, render(rows, meta))
    print(args.out.read_text(encoding="utf-8"))
    if bad:
        print(f"lora_dropout_kernel: the fused results differ from torch's maths for {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
