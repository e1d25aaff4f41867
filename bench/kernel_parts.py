"""Where the fused LoRA kernels' time goes: each timed again with one part taken out.

The wizard's 7B LoRA plan spends ~180 ms of its ~1.75 s step in ``core.train.lora_swiglu_kernel``'s SwiGLU +
down-projection kernels and ``core.train.lora_dropout_kernel``'s dropout kernels (engine-speed-t/u's profiles),
1.5-3x what their memory traffic alone would take on the H200. This builds copies of the two modules with one
part replaced by its cheapest stand-in (text substitutions on their source, written to a temporary folder and
imported: nothing here is the engine's code path, and no result of a variant is right) and times each kernel at
the plan's shape (32,768 rows; the down projection's 18,944 columns, the q/k/v group's three linears over
3,584; rank 16; dropout 0.05; the gradients' rows strided as ``lora_fold_dh`` leaves them). A part whose removal
saves much is where a faster kernel must save.

Variants: ``as-is``; ``p0`` (dropout 0: no mask at all); ``no-mix`` (the mask's hash without its mixing, murmur's
finaliser gone); ``no-mix-unpaired`` (and one hash an element, no interleave); ``tanh-sigmoid`` (the SwiGLU's
sigmoid from one ``tanh.approx`` instead of an exponential and a division); ``no-lora-dots`` (the gate/up
adapters' rank-16 products left out); ``no-da`` (the down adapter's ``dA`` sum left out); ``aligned-rows``
(the gradients' rows 128-byte aligned, as ``lora_group`` pads the fold buffers now); ``per-sm-K`` (the dropout
backward's programs K a multiprocessor instead of ``PROGRAMS_PER_SM``, on aligned rows; kernel-parts-c's
``programs-N``, N programs in all, ran before that constant, when ~512 in all was the rule); and a ``traffic
floor``: torch's element-wise adds over about each kernel's reads and writes (the SwiGLU backward's: 4 reads and
2 writes, one read more than the kernel's).

    python3 bench/kernel_parts.py --out DIR [--tokens 32768] [--reps 20]

Writes DIR/kernel-parts.json and .md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lora_dropout_kernel import median_ms  # noqa: E402  (bench/ is not a package: run as a script)
from results_files import write_results  # noqa: E402  (bench/ is not a package)

HASH = "h = _fmix32(pairs.to(tl.uint32) ^ seed.to(tl.uint32))"
HASH_UNPAIRED = "return _fmix32(idx.to(tl.uint32) ^ seed.to(tl.uint32)) >= thr.to(tl.uint32)"
TANH = '''@triton.jit
def _tanh_sigmoid(x):
    t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [0.5 * x], dtype=tl.float32, is_pure=True,
                                  pack=1)
    return 0.5 * t + 0.5


@triton.jit
def _h_tiles('''

# variant: (substitutions in lora_dropout_kernel.py, substitutions in lora_swiglu_kernel.py, dropout p)
VARIANTS: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]], float]] = {
    "as-is": ([], [], 0.05),
    "p0": ([], [], 0.0),
    "no-mix": ([(HASH, "h = pairs.to(tl.uint32) ^ seed.to(tl.uint32)")], [], 0.05),
    "no-mix-unpaired": ([("\nPAIRED = True\n", "\nPAIRED = False\n"),
                         (HASH_UNPAIRED, "return (idx.to(tl.uint32) ^ seed.to(tl.uint32)) >= thr.to(tl.uint32)")],
                        [], 0.05),
    "tanh-sigmoid": ([], [("@triton.jit\ndef _h_tiles(", TANH), ("tl.sigmoid(gate)", "_tanh_sigmoid(gate)")], 0.05),
    "no-lora-dots": ([], [("lora_g = tl.dot(hg, bg, input_precision=PREC)", "lora_g = 0.0"),
                          ("lora_u = tl.dot(hu, bu, input_precision=PREC)", "lora_u = 0.0")], 0.05),
    "no-da": ([], [("acc += tl.dot(tl.trans(dhd), c, input_precision=PREC)", "acc += 0.0")], 0.05),
    "aligned-rows": ([], [], 0.05),  # the gradients' rows 128-byte aligned (lora_group.FOLD_ROW_BYTES)
    # the dropout backward's programs a multiprocessor (lora_dropout_kernel.PROGRAMS_PER_SM)
    **{f"per-sm-{k}": ([("\nPROGRAMS_PER_SM = 16\n", f"\nPROGRAMS_PER_SM = {k}\n")], [], 0.05) for k in (4, 8, 32)},
}


def load_variant(name: str, folder: Path) -> tuple[Any, Any]:
    """The variant's (dropout module, SwiGLU module)."""
    dropout_subs, swiglu_subs, _ = VARIANTS[name]
    tag = name.replace("-", "_")
    dropout_src = (ROOT / "core" / "train" / "lora_dropout_kernel.py").read_text(encoding="utf-8")
    swiglu_src = (ROOT / "core" / "train" / "lora_swiglu_kernel.py").read_text(encoding="utf-8")
    swiglu_subs = [("from core.train.lora_dropout_kernel import (", f"from tdk_{tag}_dropout import ("), *swiglu_subs]
    for src_subs, which in ((dropout_subs, "dropout"), (swiglu_subs, "swiglu")):
        src = dropout_src if which == "dropout" else swiglu_src
        for old, new in src_subs:
            if old not in src:
                raise SystemExit(f"variant {name}: {old!r} is not in lora_{which}_kernel.py any more")
            src = src.replace(old, new)
        (folder / f"tdk_{tag}_{which}.py").write_text(src, encoding="utf-8")
    return importlib.import_module(f"tdk_{tag}_dropout"), importlib.import_module(f"tdk_{tag}_swiglu")


def _parts(dropout: Any, swiglu: Any, p: float, gate: Any, up: Any, hidden: Any, b: Any, a_down: Any, dhd: Any,
           grad_wide: Any, x: Any, a_qkv: Any, dh_qkv: Any, dx_wide: Any, seed: int = 1234) -> dict[str, Any]:
    """The calls to time, by kernel."""
    import torch

    n, width = gate.shape[1], x.shape[1]
    g2, u2 = gate.clone(), up.clone()  # backward writes over them
    parts = {
        "swiglu_down forward": lambda: swiglu.forward_down(gate, up, hidden, b, a_down, 2.0, 2.0, seed, p),
        "swiglu_down backward": lambda: swiglu.backward_down(grad_wide[:, :n], g2, u2, hidden, b, a_down, dhd, 2.0,
                                                             2.0, seed, p),
    }
    if p > 0:  # the B gradients of gate and up: inside the backward (lora_swiglu_down), or torch's two matmuls
        b_grad = torch.empty(b.shape, dtype=torch.float32, device=b.device)
        rank = hidden.shape[1] // 2
        hs = [(hidden[:, :rank].float() * 2.0).to(hidden.dtype), (hidden[:, rank:].float() * 2.0).to(hidden.dtype)]
        parts["swiglu_down backward + dB"] = lambda: swiglu.backward_down(grad_wide[:, :n], g2, u2, hidden, b, a_down,
                                                                          dhd, 2.0, 2.0, seed, p, b_grad=b_grad)
        parts["dB matmuls"] = lambda: (torch.mm(g2.t(), hs[0]), torch.mm(u2.t(), hs[1]))
    if p > 0:  # the dropout kernels run only with dropout
        parts["dropout forward q/k/v"] = lambda: dropout.dropout_lora_a(x, a_qkv, 3, seed, p)
        parts["dropout backward q/k/v"] = lambda: dropout.backward(x, dh_qkv, a_qkv, dx_wide[:, :width], 3, seed, p)
    return parts


def _floor_parts(gate: Any, up: Any, grad_wide: Any, x: Any, dx_wide: Any) -> dict[str, Any]:
    """torch's element-wise adds over each kernel's own reads and writes: what moving its bytes alone takes."""
    import torch

    n, width = gate.shape[1], x.shape[1]
    c, g2, u2, row = torch.empty_like(gate), gate.clone(), up.clone(), torch.empty(x.shape[0], 1, device=x.device)
    return {
        "swiglu_down forward": lambda: torch.add(gate, up, out=c),  # gate, up in; c out
        "swiglu_down backward": lambda: (torch.add(grad_wide[:, :n], g2, out=g2), torch.add(g2, u2, out=u2)),
        "dropout forward q/k/v": lambda: torch.sum(x, dim=1, keepdim=True, out=row),  # x in
        "dropout backward q/k/v": lambda: dx_wide[:, :width].add_(x),  # x, dx in; dx out
    }


def measure(tokens: int, reps: int, names: list[str]) -> list[dict[str, Any]]:
    import torch

    rank, n, width = 16, 18944, 3584
    torch.manual_seed(0)
    dev = {"device": "cuda", "dtype": torch.bfloat16}
    gate, up = torch.randn(tokens, n, **dev), torch.randn(tokens, n, **dev)
    hidden, b = torch.randn(tokens, 2 * rank, **dev), torch.randn(n, 2 * rank, **dev) * 0.01
    a_down = torch.randn(rank, n, **dev) * 0.01
    dhd = torch.randn(tokens, rank, **dev)
    x = torch.randn(tokens, width, **dev)
    a_qkv = torch.randn(3 * rank, width, **dev) * 0.01
    dh_qkv = torch.randn(tokens, 3 * rank, **dev)
    wide = {  # lora_fold_dh's [dc | dhd] and [dx | dh_q | dh_k | dh_v]: rows as the buffers had them, and aligned
        False: (torch.randn(tokens, n + rank, **dev), torch.randn(tokens, width + 3 * rank, **dev)),
        True: (torch.randn(tokens, n + 64, **dev), torch.randn(tokens, width + 64, **dev)),
    }
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        for name in names:
            dropout, swiglu = load_variant(name, Path(tmp))
            grad_wide, dx_wide = wide[name == "aligned-rows" or name.startswith("per-sm-")]
            parts = _parts(dropout, swiglu, VARIANTS[name][2], gate, up, hidden, b, a_down, dhd, grad_wide, x, a_qkv,
                           dh_qkv, dx_wide)
            for part, fn in parts.items():
                ms = median_ms(fn, reps)
                out.append({"variant": name, "kernel": part, "ms": round(ms, 4)})
                print(json.dumps(out[-1]), flush=True)
        floor = _floor_parts(gate, up, *wide[False][:1], x, wide[False][1])
        for part, fn in floor.items():
            out.append({"variant": "traffic floor", "kernel": part, "ms": round(median_ms(fn, reps), 4)})
            print(json.dumps(out[-1]), flush=True)
    base = {r["kernel"]: r["ms"] for r in out if r["variant"] == "as-is"}
    for r in out:
        r["vs_as_is"] = round(r["ms"] / base[r["kernel"]] - 1, 4) if r["kernel"] in base else None
    return out


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    kernels = list(dict.fromkeys(r["kernel"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    cell = {(r["variant"], r["kernel"]): r for r in rows}
    lines = [f"# Where the fused LoRA kernels' time goes, {meta['gpu']}", "",
             f"{meta['tokens']} rows, rank 16, ms a call (median of {meta['reps']}); in brackets against as-is. "
             f"`{meta['command']}`", "", "| variant | " + " | ".join(kernels) + " |",
             "|---|" + "---|" * len(kernels)]
    for v in variants:
        cells = []
        for k in kernels:
            r = cell.get((v, k))
            cells.append("-" if r is None else f"{r['ms']:.3f}" + ("" if v == "as-is" else f" ({r['vs_as_is']:+.1%})"))
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    import torch

    rows = measure(args.tokens, args.reps, args.variants.split(","))
    meta = {"gpu": torch.cuda.get_device_name(), "tokens": args.tokens, "reps": args.reps,
            "command": "python3 bench/kernel_parts.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    write_results(args.out / "kernel-parts.md", {"meta": meta, "rows": rows}, render(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
