"""The machine code of a fused LoRA kernel's main loop, counted: instructions by opcode, on a box without a GPU.

    python3 bench/sass_loop.py [--kernel down_backward|down_forward] [--plain-math] [--arch 90]

Triton compiles ``core.train.lora_swiglu_kernel``'s SwiGLU-down kernel for the given architecture as the engine
launches it at the wizard's 7B plan (bf16, rank 16, dropout on, the module's tiles, the 16-divisible sizes and
pointers Triton specialises on), ``cuobjdump`` (shipped with Triton) disassembles it, and the longest backward
branch's body, the loop over the tiles, is counted: instructions a tile a thread and an element, by opcode.
``--plain-math`` compiles it without ``FAST``. Session 37 read the backward's 57 instructions an element here
(bench/results/engine-speed-summary.md). Needs no GPU; Triton's version changes the code it makes.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIZES = ("n", "n_rows", "dc_stride", "rows_per_split", "cols_per_split")  # multiples of 16 at the plan's shapes


def compile_kernel(name: str, fast: bool, arch: int) -> tuple[bytes, int]:
    """The cubin of the kernel and the elements a thread handles in one turn of its loop."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import core.train.lora_swiglu_kernel as k

    fn = {"down_backward": k._lora_swiglu_down_backward, "down_forward": k._lora_swiglu_down_forward}[name]
    tiles = dict(k.TILES[name])
    warps, stages = tiles.pop("num_warps"), tiles.pop("num_stages", 3)
    tiles.pop("RS", None)
    const = {"R": 16, "RP": 16, "RD": 16, "RDP": 16, "PREC": "tf32", "DROP": True, "PAIRED": True, "FAST": fast,
             **({"DB": True} if name == "down_backward" else {"STORE": True}), **tiles}
    names = fn.arg_names
    fp32 = {"part_ptr", "db_ptr", "hd_ptr"}
    sig = {a: "constexpr" if a in const else ("*fp32" if a in fp32 else "*bf16") if a.endswith("_ptr")
           else "fp32" if a in ("sg", "su", "scale") else "i32" for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a.endswith("_ptr") or a in SIZES}
    src = ASTSource(fn, sig, constexprs={(names.index(a),): v for a, v in const.items()}, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps,
                                                                                 "num_stages": stages})
    return compiled.asm["cubin"], tiles["BM"] * tiles["BN"] // (32 * warps)


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
    parser.add_argument("--kernel", default="down_backward", choices=("down_backward", "down_forward"))
    parser.add_argument("--plain-math", action="store_true", help="without FAST")
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    args = parser.parse_args()
    import triton

    cubin, per_thread = compile_kernel(args.kernel, not args.plain_math, args.arch)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], check=True, capture_output=True, text=True).stdout
    lo, hi, ops = loop_opcodes(sass)
    total = sum(ops.values())
    print(f"{args.kernel}{' (plain math)' if args.plain_math else ''}, sm_{args.arch}, Triton {triton.__version__}: "
          f"loop {lo:#x}-{hi:#x}, {total} instructions a tile a thread, {per_thread} elements: "
          f"{total / per_thread:.1f} an element")
    for op, count in ops.most_common(25):
        print(f"{count:6d} {op}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
