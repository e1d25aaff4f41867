"""Every tunable constant of the estimator, in one table.

These start from first principles and published behaviour (sources in the comments) and are meant to be
fitted against measurements: ``bench/estimate_matrix.py`` records real peaks and throughput on a GPU and
reports the estimator's error per configuration; adjust the values here, not in the formulas. ``estimate``
takes a ``Calibration`` argument so a fit can try alternatives without editing this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _default_context_gib() -> dict[str, float]:
    # CUDA context + cuBLAS/cuDNN workspaces with lazy module loading, as NVML shows it for a process
    # that has run a bf16 matmul: ~0.5-0.6 GiB on Hopper, a little less on older parts.
    return {"hopper": 0.60, "ampere": 0.50, "ampere_ga10x": 0.45, "ada": 0.45, "volta": 0.40}


def _default_efficiency() -> dict[str, dict[str, float]]:
    # Model FLOPs utilisation (fraction of dense peak) of a large, well-fed step, before the size
    # terms below; per GPU family and method. QLoRA pays for NF4 dequantisation, DoRA for the weight
    # norms and extra elementwise work. To be calibrated.
    return {
        "hopper": {"full": 0.55, "lora": 0.50, "dora": 0.36, "qlora": 0.34},
        "ampere": {"full": 0.60, "lora": 0.55, "dora": 0.40, "qlora": 0.38},
        "ampere_ga10x": {"full": 0.50, "lora": 0.46, "dora": 0.33, "qlora": 0.32},
        "ada": {"full": 0.50, "lora": 0.46, "dora": 0.33, "qlora": 0.32},
        "volta": {"full": 0.45, "lora": 0.42, "dora": 0.30, "qlora": 0.28},
    }


def _default_multi_gpu_scaling() -> dict[int, float]:
    # Per-GPU throughput kept when data-parallel over several GPUs of one host, by ZeRO stage
    # (0 = plain DDP): communication not hidden behind compute.
    return {0: 0.95, 1: 0.93, 2: 0.90, 3: 0.80}


@dataclass(frozen=True)
class Calibration:
    """The estimator's constants. Memory terms are in bytes unless the name says GiB."""

    # --- fixed costs -------------------------------------------------------------------------------
    cuda_context_gib: dict[str, float] = field(default_factory=_default_context_gib)
    # NCCL's own buffers (channels x peers x NCCL_BUFFSIZE) once a process group exists.
    nccl_base_gib: float = 0.5

    # --- activations -------------------------------------------------------------------------------
    # How many blocks' worth of activations exist while a checkpointed block is recomputed and
    # back-propagated (its activations plus their gradients), by method. Measured on CPU with
    # torch's MemTracker on small Qwen2 blocks: ~1.6 for LoRA (fp32 adapter-input grads), ~1.25 full.
    checkpoint_recompute_layers: dict[str, float] = field(default_factory=lambda: {
        "full": 1.25, "lora": 1.6, "dora": 1.6, "qlora": 1.6})
    # Without checkpointing, backward of the last block starts while every activation is still kept:
    # its gradient temporaries, in bytes per token per intermediate (MLP) unit (same measurements).
    backward_working_bytes_per_intermediate: dict[str, float] = field(default_factory=lambda: {
        "full": 2.0, "lora": 6.0, "dora": 6.0, "qlora": 6.0})
    # SDPA expands GQA keys/values to all heads when an attention mask is passed (padded batches);
    # with no mask (packed or equal-length sequences) it uses native GQA. We assume no mask.
    sdpa_expands_kv: bool = False
    # Eager attention keeps the softmax in fp32 (4 B) and its bf16 copy (2 B) per head per s^2.
    eager_attention_bytes_per_score: float = 6.0

    # --- logits and loss ---------------------------------------------------------------------------
    # Plain transformers: bf16 logits (2 B), the fp32 upcast for the loss (4 B), log-softmax saved
    # for backward (4 B) and its fp32 gradient (4 B) overlap around the loss: ~12 B per token per
    # vocabulary entry at the worst moment.
    plain_ce_bytes_per_logit: float = 12.0
    # Fused linear cross-entropy (Liger's, which the engine uses): logits exist for one chunk of
    # next_pow2(tokens / ceil(vocab / hidden)) tokens at a time, in bf16 plus a transient copy.
    fused_ce_bytes_per_logit: float = 4.0

    # --- allocator ---------------------------------------------------------------------------------
    # PyTorch's caching allocator reserves more than it hands out: blocks freed during backward are
    # split/reused imperfectly. Modelled as a fraction of the transient memory plus a floor.
    allocator_slack_fraction: float = 0.10
    allocator_slack_floor_gib: float = 0.25

    # --- quantisation ------------------------------------------------------------------------------
    # NF4: 0.5 B per weight + absmax per 64-weight block; with double quantisation the absmax is 8-bit
    # with fp32 constants per 256 blocks: 1/64 + 4/(64*256) B per weight.
    nf4_bytes_per_param: float = 0.5 + 1 / 64 + 4 / (64 * 256)
    # bitsandbytes 8-bit Adam: two uint8 states + an fp32 absmax per 256-value block for each.
    adam8bit_bytes_per_param: float = 2.0 + 2 * 4 / 256

    # --- DeepSpeed ---------------------------------------------------------------------------------
    # transformers' "auto" values: reduce bucket = hidden^2, stage-3 prefetch = 0.9 hidden^2 elements.
    zero_reduce_bucket_hidden_sq: float = 1.0
    zero3_prefetch_hidden_sq: float = 0.9
    # Stage 1/2 all-gather bucket (elements) of the usual configs; doubled with overlap_comm.
    zero_allgather_bucket_elements: float = 2e8
    zero_overlap_comm_factor: float = 2.0

    # --- CPU memory ----------------------------------------------------------------------------------
    # A training process's own resident memory (Python, torch, CUDA libraries, tokenizer, data).
    cpu_ram_per_process_gib: float = 4.0
    # Size of one safetensors shard (QLoRA loads shard by shard onto the GPU).
    checkpoint_shard_gib: float = 5.0

    # --- speed ---------------------------------------------------------------------------------------
    efficiency: dict[str, dict[str, float]] = field(default_factory=_default_efficiency)
    # Full-precision (fp32) training reaches a larger fraction of the small fp32 peak.
    fp32_efficiency: float = 0.65
    # Small matmuls underuse the GPU: efficiency x hidden/(hidden + this) x tokens/(tokens + that).
    hidden_half_efficiency: float = 512.0
    tokens_half_efficiency: float = 512.0
    # Attention FLOPs per token = 12 x layers x q_dim x seq x this factor (1.0: count the full s^2,
    # as the usual MFU accounting does; flash kernels skip the masked half, ~0.5).
    attention_flops_factor: float = 1.0
    multi_gpu_scaling: dict[int, float] = field(default_factory=_default_multi_gpu_scaling)
    # Throughput kept with ZeRO-Offload (CPU Adam, PCIe transfers) and with parameter offload too.
    offload_optimizer_speed: float = 0.45
    offload_all_speed: float = 0.25

    # --- verdict -------------------------------------------------------------------------------------
    # A plan fits when peak + margin <= capacity; margin = max(fraction x capacity, floor).
    fit_margin_fraction: float = 0.05
    fit_margin_floor_gib: float = 1.0


DEFAULT_CALIBRATION = Calibration()
