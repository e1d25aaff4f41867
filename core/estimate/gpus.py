"""The GPUs the estimator knows: memory as NVML reports it and published dense peak throughput.

Memory is the ``memory.total`` NVML reports (MiB), which is what a process can fill before the CUDA
context and the allocator are counted. TFLOPs are NVIDIA's dense (no sparsity) tensor-core figures for
bf16/fp16 with fp32 accumulation (what PyTorch uses) and the plain fp32 (non-TF32) figure, since PyTorch
leaves TF32 matmuls off by default. Memory bandwidth is NVIDIA's published figure (the speed model's
memory-bound terms).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import t

MIB = 1024**2
GIB = 1024**3


class UnknownGpuError(TunedeckError, ValueError):
    """A GPU name that is not in the table."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model."""

    name: str
    memory_mib: int
    bf16: bool
    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    family: str  # hopper | ampere | ampere_ga10x | ada | volta: picks calibration constants
    aliases: tuple[str, ...] = ()
    memory_bandwidth_gbs: float = 0.0  # published memory bandwidth, GB/s (0: unknown)

    @property
    def memory_gib(self) -> float:
        return self.memory_mib * MIB / GIB

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for the matmul dtype of ``precision`` (bf16, pure-bf16, fp16, fp32)."""
        if precision == "fp32":
            return self.fp32_tflops
        if precision == "fp16":
            return self.fp16_tflops
        return self.bf16_tflops


GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("H200", 143771, True, 989.4, 989.4, 66.9, "hopper", ("h200 141gb", "h200 sxm", "h200 nvl"),
            memory_bandwidth_gbs=4800),
    GpuSpec("H100-80GB-SXM", 81559, True, 989.4, 989.4, 66.9, "hopper",
            ("h100", "h100 sxm", "h100 80gb", "h100 80gb hbm3", "h100 sxm5 80gb"), memory_bandwidth_gbs=3350),
    GpuSpec("H100-80GB-PCIe", 81559, True, 756.5, 756.5, 51.2, "hopper", ("h100 pcie", "h100 80gb pcie"),
            memory_bandwidth_gbs=2000),
    GpuSpec("A100-80GB", 81920, True, 312.0, 312.0, 19.5, "ampere",
            ("a100", "a100 sxm4 80gb", "a100 80gb pcie", "a100 sxm 80gb"), memory_bandwidth_gbs=2039),
    GpuSpec("A100-40GB", 40960, True, 312.0, 312.0, 19.5, "ampere",
            ("a100 sxm4 40gb", "a100 pcie 40gb", "a100 40gb pcie"), memory_bandwidth_gbs=1555),
    GpuSpec("L40S", 46068, True, 362.05, 362.05, 91.6, "ada", ("l40s 48gb",), memory_bandwidth_gbs=864),
    # A10G: AWS's variant of the A10; NVIDIA publishes the A10's figures, used here.
    GpuSpec("A10G", 23028, True, 125.0, 125.0, 31.2, "ampere_ga10x", ("a10g 24gb", "a10"),
            memory_bandwidth_gbs=600),
    GpuSpec("RTX-4090", 24564, True, 165.2, 165.2, 82.6, "ada", ("4090", "geforce rtx 4090", "rtx4090"),
            memory_bandwidth_gbs=1008),
    GpuSpec("RTX-A6000", 49140, True, 154.8, 154.8, 38.7, "ampere_ga10x", ("a6000", "rtx a6000", "a6000 48gb"),
            memory_bandwidth_gbs=768),
    GpuSpec("RTX-3090", 24576, True, 71.0, 71.0, 35.6, "ampere_ga10x", ("3090", "geforce rtx 3090", "rtx3090"),
            memory_bandwidth_gbs=936),
    GpuSpec("V100", 32768, False, 0.0, 125.0, 15.7, "volta", ("v100 32gb", "v100 sxm2 32gb", "tesla v100 sxm2 32gb"),
            memory_bandwidth_gbs=900),
    GpuSpec("V100-16GB", 16384, False, 0.0, 125.0, 15.7, "volta", ("v100 sxm2 16gb", "tesla v100 sxm2 16gb"),
            memory_bandwidth_gbs=900),
)


def _normalise(name: str) -> str:
    name = name.lower().replace("nvidia", "").replace("geforce", "").replace("tesla", "")
    return re.sub(r"[^a-z0-9]", "", name)


# The most GPUs a plan or an estimate is made for: 128 nodes of 8 (a run's ``gpus`` key counts one node's).
MAX_GPU_COUNT = 1024


def known_gpu_names() -> list[str]:
    return [gpu.name for gpu in GPUS]


def find_gpu(name: str) -> GpuSpec:
    """The table entry for ``name`` (case, spaces, dashes and an ``NVIDIA`` prefix do not matter)."""
    wanted = _normalise(name)
    for gpu in GPUS:
        if wanted == _normalise(gpu.name) or any(wanted == _normalise(alias) for alias in gpu.aliases):
            return gpu
    raise UnknownGpuError(t("estimate.error.unknown_gpu", gpu=name, known=", ".join(known_gpu_names())))


def parse_hardware(text: str) -> tuple[int, GpuSpec]:
    """``"2xA100-80GB"`` / ``"8 X H200"`` / ``"H200"`` -> (count, GpuSpec); the count is 1 to
    ``MAX_GPU_COUNT`` (nodes x GPUs of a multi-node run)."""
    match = re.fullmatch(r"\s*(?:(\d+)\s*[xX×*]\s*)?(.+?)\s*", text)
    if match is None or not text.strip():
        raise UnknownGpuError(t("estimate.error.unknown_gpu", gpu=text, known=", ".join(known_gpu_names())))
    count, name = int(match.group(1) or 1), match.group(2)
    trailing = re.fullmatch(r"(.+?)\s*[xX×*]\s*(\d+)", name) if match.group(1) is None else None
    if trailing is not None:  # "H100x8", as rental sites write it; "RTX4090" stays a name (it is one)
        try:
            find_gpu(name)
        except UnknownGpuError:
            count, name = int(trailing.group(2)), trailing.group(1)
    if not 1 <= count <= MAX_GPU_COUNT:
        raise UnknownGpuError(t("estimate.error.gpu_count_range", count=count, maximum=MAX_GPU_COUNT))
    return count, find_gpu(name)
