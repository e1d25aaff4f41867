"""The machine code of a fused LoRA kernel's main loop, counted: instructions by opcode, on a box without a GPU.

    python3 bench/sass_loop.py [--kernel down_backward|down_forward|backward:G|forward:G] [--plain-math]
                               [--maxnreg N] [--arch 90]

Triton compiles the kernel for the given architecture as the engine launches it at the wizard's 7B plan (bf16,
rank 16, dropout on, the module's tiles, the 16-divisible sizes and pointers Triton specialises on): the SwiGLU-down
kernels of ``core.train.lora_swiglu_kernel`` or ``core.train.lora_dropout_kernel``'s for a group of G linears
(3: q/k/v). ``cuobjdump`` (shipped with Triton) disassembles it, and the longest backward branch's body, the loop
over the tiles, is counted: instructions a tile a thread and an element, by opcode; then the registers a thread
and how many programs they let share a multiprocessor. ``--plain-math`` compiles the SwiGLU-down kernels without
``FAST``; ``--maxnreg`` caps the registers. Session 37 read the backward's 57 instructions an element here, session
38 the registers (bench/results/engine-speed-summary.md). Needs no GPU; Triton's version changes the code it makes.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = ("n", "n_rows", "dc_stride", "dx_stride", "width", "rows_per_split", "cols_per_split")  # multiples of 16 at the plan's shapes


KERNELS = ("down_backward", "down_forward", "backward:3", "backward:2", "backward:1", "forward:3", "forward:2",
           "forward:1")


def compile_kernel(name: str, fast: bool, arch: int, maxnreg: int | None = None) -> tuple[Any, int]:
    """The compiled kernel and the elements a thread handles in one turn of its loop: ``down_*``, the SwiGLU-down
    kernels; ``backward:G`` / ``forward:G``, ``core.train.lora_dropout_kernel``'s for a group of G linears (the
    tiles the engine takes for it)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import core.train.lora_dropout_kernel as dk
    import core.train.lora_swiglu_kernel as k

    if name.startswith("down_"):
        fn = {"down_backward": k._lora_swiglu_down_backward, "down_forward": k._lora_swiglu_down_forward}[name]
        tiles = dict(k.TILES[name])
        const = {"R": 16, "RP": 16, "RD": 16, "RDP": 16, "DROP": True, "FAST": fast,
                 **({"DB": True} if name == "down_backward" else {"STORE": True})}
        fp32 = {"part_ptr", "db_ptr", "hd_ptr"}
        rows, cols = "BM", "BN"
    else:
        kernel, groups = name.split(":")
        fn = {"backward": dk._backward, "forward": dk._forward}[kernel]
        tiles = dk._tiles(kernel, int(groups), None)
        const = {"G": int(groups), "R": 16, "RP": 16}
        fp32 = {"part_ptr"} | ({"h_ptr"} if tiles.get("SPLIT", 1) > 1 else set())
        rows, cols = "BN", "BK"
    warps, stages = tiles.pop("num_warps"), tiles.pop("num_stages", 3)
    own_cap = tiles.pop("maxnreg", None)  # the tiles' cap on the registers, unless --maxnreg sets another
    maxnreg = maxnreg or own_cap
    tiles.pop("RS", None)
    const.update(PREC="tf32", PAIRED=True, **tiles)
    names = fn.arg_names
    sig = {a: "constexpr" if a in const else ("*fp32" if a in fp32 else "*bf16") if a.endswith("_ptr")
           else "fp32" if a in ("sg", "su", "scale") else "i32" for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a.endswith("_ptr") or a in SIZES}
    src = ASTSource(fn, sig, constexprs={(names.index(a),): v for a, v in const.items()}, attrs=attrs)
    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    return compiled, tiles[rows] * tiles[cols] // (32 * warps)


def loop_opcodes(sass: str) -> tuple[int, int, collections.Counter]:
    """(start, end, opcodes) of the longest backward branch's body."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    loops = [(int(t.group(1), 16), at) for at, op, rest in ins if op.startswith("BRA")
             for t in [re.search(r"0x([0-9a-f]+)", rest)] if t and int(t.group(1), 16) < at]
    lo, hi = max(loops, key=lambda span: span[1] - span[0])
    return lo, hi, collections.Counter(op.split(".")[0] for at, op, _ in ins if lo <= at <= hi)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="down_backward", choices=KERNELS)
    parser.add_argument("--plain-math", action="store_true", help="without FAST (the SwiGLU-down kernels)")
    parser.add_argument("--maxnreg", type=int, help="cap the registers a thread (as the tiles' maxnreg does)")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    args = parser.parse_args()
    import triton

    compiled, per_thread = compile_kernel(args.kernel, not args.plain_math, args.arch, args.maxnreg)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], check=True, capture_output=True, text=True).stdout
        usage = subprocess.run([str(tool), "-res-usage", f.name], check=True, capture_output=True, text=True).stdout
    lo, hi, ops = loop_opcodes(sass)
    total = sum(ops.values())
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    threads = 32 * compiled.metadata.num_warps
    print(f"{args.kernel}{' (plain math)' if args.plain_math else ''}, sm_{args.arch}, Triton {triton.__version__}: "
          f"loop {lo:#x}-{hi:#x}, {total} instructions a tile a thread, {per_thread} elements: "
          f"{total / per_thread:.1f} an element")
    print(f"{regs} registers a thread ({stack} bytes spilled to its stack), {compiled.metadata.shared} bytes of "
          f"shared memory a program: {65536 // (-(-regs // 8) * 8 * threads)} programs of {threads} threads fit a "
          "multiprocessor's registers")
    for op, count in ops.most_common(25):
        print(f"{count:6d} {op}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
