"""The frozen matmuls of the wizard's 7B LoRA plan under cuBLAS and under cuBLASLt, held long enough that the
H200 sits at its power cap, as it does through a training step.

A step of the plan (Qwen2.5-7B, 16 x 2048 rows, no checkpointing) runs at the 700 W cap (session 21), where a
matmul's time follows the energy it takes, not its FLOPs alone. torch picks cuBLAS for bf16 matmuls unless told
otherwise (``torch.backends.cuda.preferred_blas_library``, or ``TORCH_BLAS_PREFER_CUBLASLT=1`` for a whole
process); cuBLASLt has its own heuristics and tiles. This bench runs each of a block's matmuls, forward
(``x W^T``) and backward (``dy W``, with the fold columns ``lora_fold_dh`` adds), for ``--seconds`` under each
library, and then the whole block's set back to back (the mix a step runs), A B B A, and reports for each
TFLOP/s, the mean power and SM clock (NVML, sampled every 20 ms) and the energy per TFLOP (NVML's total-energy
counter). Each library's result is checked against the other's (``max_diff``)::

    python bench/gemm_backends.py --out bench/results/gemm-backends.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results_files import write_results  # noqa: E402  (bench/ is not a package: run as a script)

HIDDEN, INTERMEDIATE, KV = 3584, 18944, 512  # Qwen2.5-7B
RANK, ALIGN = 16, 64  # the fold slots (rank a linear of the group), rows aligned to 128 bytes
LIBRARIES = ("cublas", "cublaslt")


def _fold(width: int, linears: int) -> int:
    return -(-(width + RANK * linears) // ALIGN) * ALIGN


# (name, k, n, calls a block, fold width of the backward's output): forward x[rows, k] W[n, k]^T,
# backward dy[rows, n] W[n, fold]
SHAPES = (("q", HIDDEN, HIDDEN, 1, _fold(HIDDEN, 3)), ("k/v", HIDDEN, KV, 2, _fold(HIDDEN, 3)),
          ("o", HIDDEN, HIDDEN, 1, _fold(HIDDEN, 1)), ("gate/up", HIDDEN, INTERMEDIATE, 2, _fold(HIDDEN, 2)),
          ("down", INTERMEDIATE, HIDDEN, 1, _fold(INTERMEDIATE, 1)))


class PowerMeter:
    """NVML's energy counter across a window, and the power and SM clock sampled every 20 ms inside it."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)

    def __enter__(self) -> PowerMeter:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self.energy_mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.samples.append((self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000,
                                 self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)))

    def __exit__(self, *exc) -> None:
        self.joules = (self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) - self.energy_mj) / 1000
        self._stop.set()
        self._thread.join()
        self.watts = statistics.mean(p for p, _ in self.samples) if self.samples else None
        self.mhz = statistics.median(c for _, c in self.samples) if self.samples else None


def held(fn, seconds: float, meter: PowerMeter) -> dict:
    """``fn`` called back to back for about ``seconds`` (after a second to reach the cap): ms a call, W, MHz, J."""
    import torch

    until = time.monotonic() + 1.0
    while time.monotonic() < until:
        fn()
        torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    calls = max(1, int(seconds * 1000 / max(start.elapsed_time(end), 1e-3)))
    with meter:
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
    return {"ms": start.elapsed_time(end) / calls, "calls": calls, "watts": meter.watts, "mhz": meter.mhz,
            "joules": meter.joules}


def operands(rows: int) -> dict:
    import torch

    torch.manual_seed(0)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    out = {}
    for name, k, n, _, fold in SHAPES:
        weight = torch.randn(n, max(k, fold), **bf16) * 0.02  # the fold buffer: the base weight in its first k columns
        out[name] = {"w": weight[:, :k], "w_fold": weight[:, :fold], "x": torch.randn(rows, k, **bf16),
                     "dy": torch.randn(rows, n, **bf16) * 0.01, "k": k, "n": n, "fold": fold}
    return out


def block_calls(ops: dict) -> list[tuple[str, object, float]]:
    """(label, call, FLOPs) for each matmul of one block, forward then backward, as many times as a block runs it."""
    import torch

    calls = []
    for name, _, _, count, _ in SHAPES:
        o = ops[name]
        rows = o["x"].shape[0]
        for direction, fn, flop in (
                ("forward", lambda o=o: torch.nn.functional.linear(o["x"], o["w"]), 2 * rows * o["k"] * o["n"]),
                ("backward", lambda o=o: torch.mm(o["dy"], o["w_fold"]), 2 * rows * o["n"] * o["fold"])):
            calls += [(f"{name} {direction}", fn, flop)] * count
    return calls


def set_library(name: str) -> None:
    import torch

    torch.backends.cuda.preferred_blas_library(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results markdown (X.json beside it)")
    parser.add_argument("--rows", type=int, default=32768, help="tokens a micro-step (the plan: 16 x 2048)")
    parser.add_argument("--seconds", type=float, default=1.5, help="held time of each matmul under each library")
    parser.add_argument("--mix-seconds", type=float, default=4.0, help="held time of the block's whole set")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gemm_backends.py times GPU matmuls: no CUDA device here", file=sys.stderr)
        return 2
    meter = PowerMeter()
    ops = operands(args.rows)
    calls = block_calls(ops)
    results: list[dict] = []
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": args.rows,
            "seconds": args.seconds, "power_limit_w": meter.nvml.nvmlDeviceGetEnforcedPowerLimit(meter.handle) / 1000}

    def save() -> None:
        write_results(Path(args.out), {"meta": meta, "results": results}, render(results, meta))

    seen: set[str] = set()
    for label, fn, flop in calls:
        if label in seen:
            continue
        seen.add(label)
        values = {}
        for library in LIBRARIES:
            set_library(library)
            values[library] = fn().float()
            row = held(fn, args.seconds, meter)
            results.append({"what": label, "library": library, **row, "tflops": flop / row["ms"] / 1e9,
                            "joules_per_tflop": row["joules"] / (flop * row["calls"] / 1e12)})
        results[-1]["max_diff"] = float((values["cublas"] - values["cublaslt"]).abs().max())
        save()
    mix_flop = sum(f for _, _, f in calls)

    def mix() -> None:
        for _, fn, _ in calls:
            fn()

    for library in ("cublas", "cublaslt", "cublaslt", "cublas"):
        set_library(library)
        row = held(mix, args.mix_seconds, meter)
        results.append({"what": "the block's set", "library": library, **row, "tflops": mix_flop / row["ms"] / 1e9,
                        "joules_per_tflop": row["joules"] / (mix_flop * row["calls"] / 1e12)})
        save()
    set_library("cublas")
    print(render(results, meta))
    return 0


def render(results: list[dict], meta: dict) -> str:
    lines = [f"# Frozen matmuls of the 7B LoRA plan, cuBLAS against cuBLASLt ({meta['device']}, torch {meta['torch']})",
             "", f"{meta['rows']} rows, each held {meta['seconds']} s after 1 s to reach the cap (power limit "
             f"{meta['power_limit_w']:.0f} W); energy from NVML's counter, W and MHz sampled every 20 ms.", "",
             "| matmul | library | ms a call | TFLOP/s | W | SM MHz | J per PFLOP | max diff |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        diff = f"{r['max_diff']:.3g}" if "max_diff" in r else ""
        lines.append(f"| {r['what']} | {r['library']} | {r['ms']:.3f} | {r['tflops']:.0f} | {r['watts'] or 0:.0f} | "
                     f"{r['mhz'] or 0:.0f} | {r['joules_per_tflop'] * 1000:.0f} | {diff} |")
    mix = {}
    for r in results:
        if r["what"] == "the block's set":
            mix.setdefault(r["library"], []).append(r["ms"])
    if len(mix) == 2:
        ratio = statistics.mean(mix["cublas"]) / statistics.mean(mix["cublaslt"])
        lines += ["", f"The block's set under cuBLASLt: {ratio:.3f}x cuBLAS's speed (mean of the A B B A runs)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
