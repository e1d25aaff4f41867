"""The fused LoRA kernels with fewer registers a thread, so that more of their programs share a multiprocessor, timed.

    python3 bench/kernel_occupancy.py --out OUT.md      (GPU only; writes OUT.md, OUT.json and the two tile files)

Compiled for sm_90 (``python3 bench/sass_loop.py --kernel ... --maxnreg N`` counts it on a box without a GPU), the
SwiGLU-down backward takes 212 registers a thread and the q/k/v dropout backward 255: two programs of four warps a
multiprocessor, eight warps to hide the latency of kernels that wait on a barrier ~20 times a tile. Each variant
here changes only what a program holds (a cap on its registers, ``maxnreg``, which Triton hands to ptxas; fewer
rows a tile; fewer pipeline stages), not what it computes. At the wizard's 7B plan shape (32,768 rows; rank 16,
dropout 0.05) each kernel is timed as the engine launches it (``triton.testing.do_bench``, median): the dropout
backward for the q/k/v, gate/up and o groups (3,584 wide), the SwiGLU-down forward and backward (18,944 wide, with
the gate/up dB sums). Every variant's outputs are compared with the module's own tiles': the same bits where only
registers or stages change, fp32 sums in another order where the rows a tile change (within 1e-3 relative).

The fastest variant of each kernel (each group for the dropout backward) goes into ``OUT-dropout-tiles.json`` and
``OUT-swiglu-tiles.json`` as "overall" tiles: ``TUNEDECK_LORA_DROPOUT_TILES`` / ``TUNEDECK_LORA_SWIGLU_TILES``
pointed at them hand them to a run (``bench/engine_speed.py --engines tunedeck+env.NAME=PATH``), so one call
measures the plan's step with them against the module's own.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from results_files import write_results  # noqa: E402  (bench/ is not a package)

# What each variant changes over the module's tiles ({} = the module's own, the baseline). (sm_90, Triton 3.9, bench/sass_loop.py: registers a thread, then the programs of four warps that fit a
# multiprocessor's 64K registers; a cap below what a kernel wants spills the rest to local memory.) The modules' own
# tiles are session 38's choice (bench/results/occupancy/h200): each kernel's other variant here is its tiles before
# (a key set to None: taken out). Session 38's first call (an H100) also lost with q/k/v capped at 168 at 32 rows (+9%),
# gate/up at 128 at 32 rows (+10%), o at 16 rows (+15%), the SwiGLU-down backward with two stages (+0.6%).
VARIANTS = {
    # capped at 168 (3 programs; 11 loads from local memory a tile); uncapped 212 registers: 2
    "down_backward": [{}, {"maxnreg": None}],
    # 136 (3 programs, and its shared memory allows no more); two stages and 128: 4 (H200 +1.5%, H100 -2.3%)
    "down_forward": [{}, {"num_stages": 2, "maxnreg": 128}],
    # q/k/v 16 rows capped at 128 (4 programs); uncapped 168 (3); 32 rows uncapped 255 (2)
    "backward:3": [{}, {"maxnreg": None}, {"BN": 32, "maxnreg": None}],
    # gate/up 16 rows capped at 128 (4); 32 rows uncapped 174 (2)
    "backward:2": [{}, {"BN": 32, "maxnreg": None}],
    # o capped at 128 (4); uncapped 131 (3)
    "backward:1": [{}, {"maxnreg": None}],
}
GROUPS = (("q/k/v", 3), ("gate/up", 2), ("o", 1))
DEVICE = "cuda"
TOLERANCE = 1e-3


def _error(got: list, ref: list) -> tuple[bool, float]:
    """(bit for bit the same, largest |got - ref| / (|ref| + 1))."""
    import torch

    same = all(torch.equal(x, y) for x, y in zip(got, ref, strict=True))
    err = max(((x.double() - y.double()).abs() / (y.double().abs() + 1)).max().item() for x, y in zip(got, ref, strict=True))
    return same, err


def _time(fn) -> float:
    from triton.testing import do_bench

    return round(do_bench(fn, rep=300, return_mode="median"), 4)


def dropout_rows(rows: int, width: int, deadline: float) -> list[dict]:
    import torch

    import core.train.lora_dropout_kernel as dk

    out = []
    for name, groups in GROUPS:
        torch.manual_seed(0)
        x = torch.randn(rows, width, device=DEVICE, dtype=torch.bfloat16)
        a = (torch.randn(groups * 16, width, device=DEVICE) * width**-0.5).to(torch.bfloat16)
        dh = torch.randn(rows, groups * 16, device=DEVICE, dtype=torch.bfloat16)
        dx = torch.randn(rows, width, device=DEVICE, dtype=torch.bfloat16)
        ref = None
        for variant in VARIANTS[f"backward:{groups}"]:
            if time.monotonic() > deadline:
                break
            row = {"kernel": "backward", "group": name, "groups": groups, "variant": variant,
                   "tiles": dk._tiles("backward", groups, variant)}
            try:
                got_dx = dx.clone()
                got = [dk.backward(x, dh, a, got_dx, groups, 7, 0.05, tiles=variant), got_dx]
                ref = ref or got
                row["same_bits"], row["error"] = _error(got, ref)
                row["ms"] = _time(functools.partial(dk.backward, x, dh, a, dx.clone(), groups, 7, 0.05, tiles=variant))
            except Exception as exc:  # a variant that does not compile or launch here
                row["failed"] = f"{type(exc).__name__}: {exc}"[:200]
            out.append(row)
            print(row, flush=True)
    return out


def swiglu_rows(rows: int, width: int, deadline: float) -> list[dict]:
    import torch

    import core.train.lora_swiglu_kernel as sk
    from core.train.lora_dropout_kernel import launch_tiles as dk_launch_tiles

    torch.manual_seed(0)
    dev = {"device": DEVICE, "dtype": torch.bfloat16}
    gate, up, grad = (torch.randn(rows, width, **dev) for _ in range(3))
    hidden = torch.randn(rows, 32, **dev) * 0.1
    b = torch.randn(width, 32, **dev) * 0.1
    a = torch.randn(16, width, **dev) * 0.01
    dhd = torch.randn(rows, 16, **dev)
    g2, u2 = gate.clone(), up.clone()
    b_grad = torch.empty(width, 32, device=DEVICE, dtype=torch.float32)
    out = []
    for kernel in ("down_forward", "down_backward"):
        ref = None
        for variant in VARIANTS[kernel]:
            if time.monotonic() > deadline:
                break
            tiles = dk_launch_tiles({**sk.TILES[kernel], **variant})
            row = {"kernel": kernel, "variant": variant, "tiles": tiles}
            try:
                if kernel == "down_forward":
                    got = list(sk.forward_down(gate, up, hidden, b, a, 1.0, 1.0, 7, 0.05, tiles=tiles))
                    call = lambda t=tiles: sk.forward_down(gate, up, hidden, b, a, 1.0, 1.0, 7, 0.05, tiles=t)  # noqa: E731
                else:
                    dg, du, db = gate.clone(), up.clone(), torch.empty_like(b_grad)
                    got = [sk.backward_down(grad, dg, du, hidden, b, a, dhd, 1.0, 1.0, 7, 0.05, tiles=tiles, b_grad=db),
                           dg, du, db]
                    call = lambda t=tiles: sk.backward_down(grad, g2, u2, hidden, b, a, dhd, 1.0, 1.0, 7, 0.05,  # noqa: E731
                                                            tiles=t, b_grad=b_grad)
                ref = ref or got
                row["same_bits"], row["error"] = _error(got, ref)
                row["ms"] = _time(call)
            except Exception as exc:
                row["failed"] = f"{type(exc).__name__}: {exc}"[:200]
            out.append(row)
            print(row, flush=True)
    return out


def fastest(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Per tile key (``backward:G`` for the dropout backward, ``down_forward``, ``down_backward``), the tiles of
    the fastest variant whose outputs are within ``TOLERANCE`` of the module's own."""
    best: dict[str, dict] = {}
    for row in rows:
        if "ms" not in row or row["error"] > TOLERANCE:
            continue
        key = f"backward:{row['groups']}" if "groups" in row else row["kernel"]
        if key not in best or row["ms"] < best[key]["ms"]:
            best[key] = row
    return {key: row["tiles"] for key, row in best.items()}


def render(rows: list[dict], device: str, chosen: dict) -> str:
    lines = [f"# The fused LoRA kernels with fewer registers a thread, {device}", "",
             "32,768 rows, rank 16, dropout 0.05; ms a call (median, `triton.testing.do_bench`); outputs against the "
             "module's own tiles (the first row of each kernel). `python3 bench/kernel_occupancy.py`", "",
             "| kernel | group | change | ms | vs own | same bits | largest error |", "|---|---|---|---|---|---|---|"]
    own: dict = {}
    for r in rows:
        key = (r["kernel"], r.get("group"))
        if "ms" in r and not r["variant"]:
            own[key] = r["ms"]
        if "ms" not in r:
            lines.append(f"| {r['kernel']} | {r.get('group', '')} | {r['variant'] or 'own'} | failed: "
                         f"{r.get('failed', 'not run')} | | | |")
            continue
        ratio = f"{r['ms'] / own[key]:.3f}x" if key in own else ""
        lines.append(f"| {r['kernel']} | {r.get('group', '')} | {r['variant'] or 'own'} | {r['ms']} | {ratio} | "
                     f"{r['same_bits']} | {r['error']:.1e} |")
    lines += ["", f"Fastest within {TOLERANCE:g} of the own tiles' outputs (the tile files' \"overall\"): {chosen}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--budget-s", type=float, default=100, help="no new variant after this many seconds")
    args = parser.parse_args()
    import torch

    deadline = time.monotonic() + args.budget_s
    rows = swiglu_rows(args.rows, 18944, deadline) + dropout_rows(args.rows, 3584, deadline)
    chosen = fastest(rows)
    device = torch.cuda.get_device_name()
    out = Path(args.out)
    write_results(out, {"device": device, "rows": rows, "overall": chosen}, render(rows, device, chosen))
    stem = out.with_suffix("")
    for module, keys in (("dropout", lambda k: k.startswith("backward:")), ("swiglu", lambda k: k.startswith("down_"))):
        Path(f"{stem}-{module}-tiles.json").write_text(
            json.dumps({"overall": {k: v for k, v in chosen.items() if keys(k)}}, indent=1) + "\n", encoding="utf-8")
    print(render(rows, device, chosen))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
