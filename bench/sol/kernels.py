"""The floor kernels of ``bench/sol/sitecustomize.py`` against the real ones, alone, at the wizard's 7B plan shape.

    TUNEDECK_SOL= python3 bench/sol/kernels.py --out OUT.md      (GPU only; writes OUT.md and OUT.json)

Times ``core.train.lora_swiglu_kernel``'s ``forward_down`` and ``backward_down`` (with the gate/up dB sums, as the
plan runs them) as they are, without ``FAST`` (``FAST_MATH`` off: the plain Triton ops for the round trips and the
sigmoid) and the floor stand-ins at 32,768 x 18,944, rank 16, dropout 0.05, and the bytes each must move over its
time: the floor kernels should run near the card's copy bandwidth, or the step they go into says less. The real
kernels' outputs with and without ``FAST`` are compared bit for bit (``same bits``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--width", type=int, default=18944)
    args = parser.parse_args()

    import importlib.util

    import torch
    from triton.testing import do_bench

    import core.train.lora_swiglu_kernel as real

    spec = importlib.util.spec_from_file_location("tunedeck_sol", Path(__file__).with_name("sitecustomize.py"))
    sol = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sol)  # TUNEDECK_SOL empty here: it patches nothing

    floor = type("Floor", (), {})()
    sol._swiglu_down(floor)
    rows, n, rank, device, dtype = args.rows, args.width, 16, "cuda", torch.bfloat16
    torch.manual_seed(0)
    gate, up = (torch.randn(rows, n, device=device, dtype=dtype) for _ in range(2))
    hidden = torch.randn(rows, 2 * rank, device=device, dtype=dtype) * 0.1
    b = torch.randn(n, 2 * rank, device=device, dtype=dtype) * 0.1
    a = torch.randn(rank, n, device=device, dtype=dtype) * 0.01
    grad = torch.randn(rows, n, device=device, dtype=dtype)
    dhd = torch.randn(rows, rank, device=device, dtype=dtype)
    b_grad = torch.empty(n, 2 * rank, device=device, dtype=torch.float32)
    g2, u2 = gate.clone(), up.clone()
    element = gate.element_size() * rows * n
    def outputs() -> list:
        dg, du, db = gate.clone(), up.clone(), torch.empty_like(b_grad)
        da = real.backward_down(grad, dg, du, hidden, b, a, dhd, 1.0, 1.0, 7, 0.05, b_grad=db)
        return [*real.forward_down(gate, up, hidden, b, a, 1.0, 1.0, 7, 0.05), dg, du, da, db]

    fast_math = real.FAST_MATH
    results, bits = [], {}
    for name, kernels, fast in (("real", real, True), ("real, plain math", real, False), ("floor", floor, True)):
        real.FAST_MATH = fast and fast_math
        if kernels is real:
            bits[fast] = outputs()
        fwd = do_bench(lambda k=kernels: k.forward_down(gate, up, hidden, b, a, 1.0, 1.0, 7, 0.05), rep=400)
        bwd = do_bench(lambda k=kernels: k.backward_down(grad, g2, u2, hidden, b, a, dhd, 1.0, 1.0, 7, 0.05,
                                                         b_grad=b_grad), rep=400)
        results.append({"kernels": name, "forward_ms": round(fwd, 3), "backward_ms": round(bwd, 3),
                        "forward_gb_s": round(3 * element / fwd / 1e6), "backward_gb_s": round(5 * element / bwd / 1e6)})
    real.FAST_MATH = fast_math
    same = all(torch.equal(x, y) for x, y in zip(bits[True], bits[False], strict=True))
    lines = [f"# The SwiGLU-down kernels against their floor, {torch.cuda.get_device_name()}", "",
             f"{rows} rows x {n}, rank 16, dropout 0.05; ms a call (triton.testing.do_bench) and the bytes each must "
             "move (forward: read gate and up, write the product; backward: read the gradient, gate and up, write two) "
             "over that time. `python3 bench/sol/kernels.py`", "",
             "| kernels | forward ms | backward ms (+ dB) | forward GB/s | backward GB/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['kernels']} | {r['forward_ms']} | {r['backward_ms']} | {r['forward_gb_s']:,} | {r['backward_gb_s']:,} |"
              for r in results]
    lines += ["", f"same bits (c, hd, d gate, d up, dAd, dB with and without FAST): {same}"]
    out = Path(args.out)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows, "width": n,
                                                    "results": results, "same_bits": same}, indent=1) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
