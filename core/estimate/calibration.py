"""Every tunable constant of the estimator, in one table.

These start from first principles and published behaviour (sources in the comments) and are meant to be
fitted against measurements: ``bench/estimate_matrix.py`` records real peaks and throughput on a GPU and
reports the estimator's error per configuration; adjust the values here, not in the formulas. ``estimate``
takes a ``Calibration`` argument so a fit can try alternatives without editing this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Fitted by bench/estimate_calibrate.py on H200 runs of the current engine (see
# bench/results/estimate_calibration.md). Full's big-GEMM efficiency is pinned (what large bf16 cuBLAS
# GEMMs reach on Hopper), not fitted: with two model widths (3584, 4096) it trades off against
# HIDDEN_HALF_EFFICIENCY, which the full rows fix under it.
HOPPER_FULL_EFFICIENCY = 0.72
HOPPER_LORA_EFFICIENCY = 0.6797
HIDDEN_HALF_EFFICIENCY = 858.7
# The causal flash/cuDNN attention kernels behind SDPA, as a fraction of the dense peak for the FLOPs they
# compute (half the s x s scores): fitted on the long-context rows, where attention is most of the step.
HOPPER_ATTENTION_EFFICIENCY = 0.4704
# Other GPU families: not measured; they keep the ratio to Hopper of the first-principles table this
# started from (the Qwen README's A100 runs suggest Ampere's real ratio is higher:
# bench/results/estimate_published.md).
RELATIVE_TO_HOPPER = {"hopper": 1.0, "ampere": 1.09, "ampere_ga10x": 0.91, "ada": 0.91, "volta": 0.82}


# Memory constants fitted by bench/memory_fit.py on the H200 calibration matrix, each row as the newest engine
# measured it (issue #19: bench/results/estimate_matrix/memory-fit.md); tests/core/test_estimate_memory.py fails
# when these drift from its JSON. The CUDA context: NVML's peak above torch's reserved memory (torch 2.11, CUDA 13).
HOPPER_CUDA_CONTEXT_GIB = 0.74
# Blocks' worth of activations while a checkpointed block is recomputed and back-propagated (its
# activations and their gradients), by method: solved per row on torch's allocated peak, the median.
# Full: one row (0.5B at 32k tokens); DoRA: no row identifies it (its weight-norm transient sets the
# recomputation's peak), it keeps the CPU MemTracker value. LoRA and QLoRA by path (activations.recompute_key):
# peft's own linears (the rows before the fused kernels, qlora_upcast's, and the CPU's MemTracker) hold 1.12-1.30
# blocks' worth, the engine's grouped node and kernels 1.39-1.97 of their smaller per-block activations.
RECOMPUTE_LAYERS = {"full": 1.76, "lora": 1.26, "lora_fused": 1.46, "dora": 1.6, "qlora": 1.18, "qlora_fused": 1.45}
# The caching allocator's slack: a floor and fractions of the churn at the peak, by kind (memory.py). Offloaded
# activations: the three LoRA rows after the prefetch's fix (calibration-offload-d) 0.53-0.75 of their churn,
# the one QLoRA row 0.25 (its own constant, from that row alone).
SLACK_FLOOR_GIB = 0.18
SLACK_FRACTION = {"activations": 0.0, "offloaded_activations": 0.6032, "offloaded_activations_qlora": 0.2506,
                  "plain_ce_logits": 0.2434, "gradients": 0.1789}


# --- what the fit above was measured on, and how well it matches (#19: the plan shows this band) ------
@dataclass(frozen=True)
class MeasuredError:
    """|estimate - measured| / measured over the rows the constants were fitted or checked on, in %."""

    median_pct: float
    worst_pct: float
    rows: int


# Speed: the leave-one-model-out errors of bench/results/estimate_calibration.md (bench/estimate_calibrate.py
# --write: every fitted row predicted by a fit made without its model's rows), split by what the row's step
# waits on; tests/core/test_estimate_domain.py parses the report and fails when these disagree with it. A
# step waits on the CPU where launching its kernels takes longer than running them (small models, few
# tokens a micro-step): those rows are the noisy ones (the rented box's shared CPUs ran the same row up to a
# third faster or slower from call to call), so a plan shows the band of its own kind.
SPEED_ERROR_GPU_BOUND = MeasuredError(median_pct=3.0, worst_pct=25.0, rows=44)
SPEED_ERROR_CPU_BOUND = MeasuredError(median_pct=16.0, worst_pct=51.0, rows=15)
SPEED_ERROR = MeasuredError(  # all 59 fitted rows: the worst of either kind; median the larger one
    median_pct=max(SPEED_ERROR_GPU_BOUND.median_pct, SPEED_ERROR_CPU_BOUND.median_pct),
    worst_pct=max(SPEED_ERROR_GPU_BOUND.worst_pct, SPEED_ERROR_CPU_BOUND.worst_pct),
    rows=SPEED_ERROR_GPU_BOUND.rows + SPEED_ERROR_CPU_BOUND.rows)
# Peak memory (estimate against the NVML peak), the same engine on the same H200: the 77 finished rows of
# the calibration matrix (0.5B-32B) the fit takes, each estimated with the memory constants fitted without its model's
# rows (bench/memory_fit.py, "Leave one model out", all): a band for shapes the fit did not see. The fit
# itself is closer on its own rows (median 1.1%, worst 5.9%).
MEMORY_ERROR = MeasuredError(median_pct=1.1, worst_pct=11.9, rows=77)
# Where each band holds: one H200 (Hopper), one GPU, no ZeRO offload, and per figure the shapes and settings
# its rows cover.
MEASURED_GPU = "H200"
MEASURED_GPU_FAMILY = "hopper"
MEASURED_NUM_GPUS = 1


@dataclass(frozen=True)
class MeasuredDomain:
    """The model widths, methods with their precisions and sequence lengths one figure's rows cover."""

    hidden_sizes: tuple[int, int]
    precision: dict[str, tuple[str, ...]]  # method -> the precisions measured
    seq_len: tuple[int, int]


# Speed: the committed fit's rows, the calibration matrix's and the long-context runs': Qwen2.5-0.5B to
# Qwen2.5-32B and Llama-3-8B shapes, LoRA/QLoRA/DoRA in bf16 mixed precision, full fine-tuning in pure bf16
# (fitted) and mixed (its fp32 cost solved on its own rows), 512 to 192k tokens a sequence.
SPEED_DOMAIN = MeasuredDomain(hidden_sizes=(896, 5120), seq_len=(512, 196608),
                              precision={"lora": ("bf16",), "qlora": ("bf16",), "dora": ("bf16",),
                                         "full": ("bf16", "pure-bf16")})
# Peak memory: the calibration matrix's rows the fit takes, Qwen2.5-0.5B to Qwen2.5-32B (LoRA and QLoRA up from 8B),
# LoRA/QLoRA/DoRA in bf16 mixed precision, full fine-tuning mixed and pure bf16, 512 to 64k tokens a sequence (its
# 128k rows were offloaded before the prefetch's fix, which changed their reserve, and are not in the fit).
MEMORY_DOMAIN = MeasuredDomain(hidden_sizes=(896, 5120), seq_len=(512, 65536),
                               precision={"lora": ("bf16",), "qlora": ("bf16",), "dora": ("bf16",),
                                          "full": ("bf16", "pure-bf16")})


def _default_context_gib() -> dict[str, float]:
    # CUDA context + cuBLAS/cuDNN workspaces with lazy module loading, as NVML shows it for a process
    # that has run a bf16 matmul: a little less on older parts than on Hopper.
    # Measured on the H200 (HOPPER_CUDA_CONTEXT_GIB); the other families are not measured and keep their
    # first-principles values, moved by Hopper's measured offset over its own (0.60): the workspaces that
    # offset stands for belong to the CUDA and torch versions, not to the GPU.
    first_principles = {"hopper": 0.60, "ampere": 0.50, "ampere_ga10x": 0.45, "ada": 0.45, "volta": 0.40}
    offset = HOPPER_CUDA_CONTEXT_GIB - first_principles["hopper"]
    return {family: round(value + offset, 3) for family, value in first_principles.items()}


def _default_efficiency() -> dict[str, dict[str, float]]:
    # Fraction of the dense peak the matmul FLOPs of a wide model reach (the hidden-size term below
    # stretches it for narrow ones), per GPU family and method. LoRA's rank-r
    # matmuls and adapter bookkeeping make it lower than full fine-tuning's; QLoRA and DoRA share LoRA's
    # value: their extra work is modelled as memory traffic (``qlora_dequant_bytes_per_weight``,
    # ``dora_norm_bytes_per_weight``, ``lora_dropout_bytes_per_element``) and extra FLOPs. Hopper: fitted
    # by bench/estimate_calibrate.py on H200 measurements (bench/results/estimate_calibration.md). Other
    # families: RELATIVE_TO_HOPPER.
    hopper = {"full": HOPPER_FULL_EFFICIENCY, "lora": HOPPER_LORA_EFFICIENCY}
    return {
        family: {"full": hopper["full"] * scale, "lora": hopper["lora"] * scale,
                 "dora": hopper["lora"] * scale, "qlora": hopper["lora"] * scale}
        for family, scale in RELATIVE_TO_HOPPER.items()
    }


def _default_attention_efficiency() -> dict[str, float]:
    return {family: HOPPER_ATTENTION_EFFICIENCY * scale for family, scale in RELATIVE_TO_HOPPER.items()}


def _default_dispatch() -> dict[str, float]:
    # CPU seconds eager PyTorch spends launching one decoder layer's kernels per pass unit (forward 1,
    # backward 2, recompute ``dispatch_recompute_passes``), by method: peft adds ~10 small ops per adapted
    # linear (the engine's grouped LoRA node and kernels fewer), bitsandbytes its dequantisation calls, DoRA
    # its weight norms. Fitted by bench/estimate_calibrate.py on the H200 calibration matrix's rows whose
    # steps wait on the CPU (24-48 layers; LoRA and QLoRA on the engine with the fused kernels): the box's
    # CPU is a shared server core, and these rows vary by up to a third a call.
    return {"full": 0.001075, "lora": 0.001989, "dora": 0.003746, "qlora": 0.002714}


def _default_mlp_tile() -> dict[str, float]:
    # Seconds one MLP tile of one tiled layer adds per micro-step (forward, recomputation and backward, each
    # tile's backward its own autograd call; peft's adapters on gate/up/down add their small ops per tile).
    # Fitted by bench/matrix_terms_fit.py on the tiled rows of the H200 calibration matrix
    # (matrix-terms-fit.json; DoRA has no tiled row: LoRA's, scaled by the per-layer launch times).
    return {"full": 0.000845, "lora": 0.002754, "dora": 0.005187, "qlora": 0.003637}


def _default_data_parallel() -> dict[int, float]:
    # Seconds per decoder layer per micro-step that data parallelism adds on top of the traffic
    # (DDP's bucket hooks; DeepSpeed's per-parameter hooks, ZeRO-3's gathers and releases), by ZeRO
    # stage (0 = DDP). Fitted on one 2xH200 run each of a 0.5B model (24 layers); stage 1 assumed as 2.
    return {0: 0.0036, 1: 0.0085, 2: 0.0085, 3: 0.0266}


def _default_optimizer_traffic() -> dict[str, float]:
    # Memory traffic of an optimizer step in multiples of (weight + gradient + states + master) bytes:
    # torch's foreach AdamW makes several passes with temporaries, the fused kernel about one read and
    # one write, bitsandbytes' 8-bit kernel one pass; gradient clipping adds a read and a write.
    return {"adamw": 3.0, "adamw_fused": 1.6, "adamw_8bit": 2.0, "paged_adamw_8bit": 2.0}


@dataclass(frozen=True)
class Calibration:
    """The estimator's constants. Memory terms are in bytes unless the name says GiB."""

    # --- fixed costs -------------------------------------------------------------------------------
    cuda_context_gib: dict[str, float] = field(default_factory=_default_context_gib)
    # NCCL's own buffers (channels x peers x NCCL_BUFFSIZE) once a process group exists.
    nccl_base_gib: float = 0.5

    # --- activations -------------------------------------------------------------------------------
    # How many blocks' worth of activations exist while a checkpointed block is recomputed and
    # back-propagated (its activations plus their gradients), by method: RECOMPUTE_LAYERS (the H200 fit;
    # first measured on CPU with torch's MemTracker on small Qwen2 blocks: 1.6 LoRA, 1.25 full).
    checkpoint_recompute_layers: dict[str, float] = field(default_factory=lambda: dict(RECOMPUTE_LAYERS))
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
    # split/reused imperfectly. A floor plus a fraction of each kind of churn at the peak (memory.py),
    # fitted by bench/memory_fit.py on torch's reserved - allocated of the H200 matrix rows.
    allocator_slack_fraction: dict[str, float] = field(default_factory=lambda: dict(SLACK_FRACTION))
    allocator_slack_floor_gib: float = SLACK_FLOOR_GIB

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

    # --- speed (see core/estimate/speed.py for the step-time model) -------------------------------------
    efficiency: dict[str, dict[str, float]] = field(default_factory=_default_efficiency)
    # Full-precision (fp32) training reaches a larger fraction of the small fp32 peak.
    fp32_efficiency: float = 0.65
    # Elementwise work per token grows like hidden, matmul work like hidden^2: the matmul time is
    # stretched by (hidden + this) / hidden. Fitted.
    hidden_half_efficiency: float = HIDDEN_HALF_EFFICIENCY
    # Attention FLOPs per token = 12 x layers x q_dim x seq x this factor under SDPA: the share of the
    # s x s scores a causal flash/cuDNN kernel computes (it skips the masked half: 0.5). 1.0 counts every
    # score, the PaLM MFU convention (bench/engine_speed.py's MFU column); eager attention always does.
    attention_flops_factor: float = 0.5
    # What the attention kernels reach of the dense peak for those FLOPs, per GPU family (fitted, Hopper).
    attention_efficiency: dict[str, float] = field(default_factory=_default_attention_efficiency)
    # Memory-bound kernels reach this fraction of the HBM bandwidth in the GPU table.
    memory_bandwidth_efficiency: float = 0.75
    # For a GPU spec without a bandwidth figure: GB/s per dense TFLOP (H100 SXM: 3350/989).
    fallback_gbs_per_tflops: float = 3.4
    # bitsandbytes NF4 dequantisation per base weight and pass: read 0.5 B + absmax, write 2 B bf16.
    qlora_dequant_bytes_per_weight: float = 2.6
    # peft DoRA per targeted weight and forward pass: B@A (2 B), W + sBA (read 4, write 2), row norms
    # in fp32 (read 2, write 4); the norm is detached, so the backward pass does not repeat it.
    dora_norm_bytes_per_weight: float = 14.0
    # peft DoRA per token, output element of an adapted linear and micro-step (speed.dora_output_bytes):
    # the rescaling by magnitude / norm in fp32 and its gradient. Fitted by bench/matrix_terms_fit.py on
    # the 4 DoRA rows of the H200 matrix (0.5B-7B, with and without checkpointing; 180-239 B a row, the
    # median).
    dora_output_bytes_per_element: float = 206.0
    # peft's LoRA dropout per input element of an adapted linear and pass: forward reads the input and
    # writes the dropped copy and a 1-byte mask, backward reads the gradient and the mask and writes the
    # input's gradient; on bf16 inputs 2+2+1, on peft's fp32 upcast 4+4+1. Counted from the ops, not
    # fitted (the dropout-0 call measures 40 ms a step for it at b4 x 2048 on 7B; this gives 39).
    lora_dropout_bytes_per_element: dict[str, float] = field(default_factory=lambda: {"bf16": 5.0, "fp32": 9.0})
    # lora_dropout_fused: the fused kernels' time beyond plain lora_A matmuls on the same input, per input
    # element of an adapted linear, forward pass (recomputed ones too) and backward, as bytes at the
    # memory-bound rate (the kernels are bound by hashing, not traffic). From bench/lora_dropout_kernel.py on
    # the H200 (lora-dropout-kernel-c, a 7B block at 8,192 tokens: 0.234 ms forward, 0.132 ms backward more
    # than no dropout over 331 M elements).
    lora_fused_dropout_bytes_per_element: dict[str, float] = field(
        default_factory=lambda: {"forward": 2.5, "backward": 1.4})
    # lora_input_upcast: the cast of the input to fp32 (read 2, write 4) and autocast's back to bf16 for
    # lora_A (read 4, write 2), the same in backward. From the ops, not fitted (the dropout-0 call measures
    # +107 ms a step at b4 x 2048 on 7B; this gives 93).
    lora_upcast_bytes_per_element: float = 12.0
    # lora_grouped: false with the fused add (``torch.addmm`` out of place copies the base output before the
    # GEMM adds to it): read 2, write 2 per output element of an adapted linear and forward pass. From the
    # ops, not fitted: the H200 profile of the 7B at b4 x 2048 checkpointed shows 20.6 ms of device-to-device
    # copies a step without grouping and none with it (engine-speed-lora-c); this gives 19-24 ms. The fit's
    # rows ran before grouping and are read as grouped: for the default engine that errs 1-3% slow.
    lora_output_copy_bytes_per_element: float = 4.0
    # qlora_upcast: true (speed.lora_input_bytes): the adapted linears' outputs in fp32, per output element and pass
    # (forward, backward, recompute). bitsandbytes casts each 4-bit linear's bf16 output back to its fp32 input's
    # dtype, peft clones it and adds the adapter's product in fp32, all of it outside the engine's grouped node,
    # and the SwiGLU between runs in fp32 (the ops count ~24 B an output element and pass, the SwiGLU's included).
    # Fitted by bench/matrix_terms_fit.py on the H200's one such row of the fused-kernels engine (7B QLoRA b4 x
    # 2048, 7,819 tok/s, ~9,570 estimated without it); the same row on an H100 (qlora-upcast/calibration-upcast-b:
    # 6,940 tok/s, 6,793 estimated) checks it.
    qlora_upcast_bytes_per_element: float = 21.7
    # The grouped node's add of each LoRA update inside its lora_B matmul: the matmul reads and writes the
    # base output, 2 + 2 bytes per output element and forward pass. The fit's rows all made it, so the fitted
    # constants hold it; ``lora_swiglu_fused`` takes the gate/up ones away (speed.lora_input_bytes). From the
    # ops: the H200 profile of the 7B at b4 x 2048 checkpointed shows 34.8 ms of these adds a step
    # (engine-speed-ce-b), this gives 25 ms (19 of them gate/up).
    lora_output_add_bytes_per_element: float = 4.0
    # lora_fold_dh: the skinny ``dh = g (s B)`` matmuls read each adapted linear's output gradient once more in
    # backward, 2 bytes an element; the fit's rows all ran them, so the fitted constants hold them and the fold
    # takes them away (speed.lora_input_bytes). From the ops: the H200 profile of the wizard's 7B plan puts 22 ms a
    # step in them (engine-speed-r: 196 calls of 32x256 NNN matmuls, o's among them); this gives 23 ms for six of
    # the seven linears at 4,800 GB/s x 0.75.
    lora_dh_read_bytes_per_element: float = 2.0
    # lora_swiglu_db: the gate/up adapters' ``dB`` summed in the SwiGLU backward kernel from the gradients it
    # writes, where two skinny matmuls read d gate and d up again (2 bytes an element each, held by the fitted
    # constants as above). The kernel's dots cost most of that back: alone at the wizard's 7B plan shape the
    # kernel takes 0.18 ms a block more where the matmuls took 0.59 (bench/results/kernel-parts-d.md), but inside
    # the power-capped step 0.55 more (engine-speed-y's profile: 88.9 ms a step against 72-74 without), and the
    # plan's step is 4 ms shorter (1.770 against 1.774 s, engine-speed-y and -y-ab): 0.4 bytes an element.
    lora_swiglu_db_bytes_per_element: float = 0.4
    # rms_norm_rows: Liger's RMSNorm backward walks each SM's share of the rows one after another; the row
    # kernels (core.train.rms_norm_kernel) take that walk's time off, per input element of a norm and
    # micro-step, as bytes at the memory-bound rate. The fit's rows all ran Liger's norms, so this is a saving
    # from them. From bench/step_parts.py on the H200 (step-parts-b, 32,768 x 3,584: forward + backward 0.668
    # ms with Liger's, 0.467 with the rows'): 0.201 ms over 117 M elements at 4,800 GB/s x 0.75 = 6.2 bytes.
    liger_norm_walk_bytes_per_element: float = 6.2
    # Where Liger's kernels do not run (``fused_ce: false`` or ``chunked``: ``TrainingPlan.liger_kernels``), the model's
    # own RMSNorm, rotary embedding and SwiGLU run as transformers writes them; the fit's rows all ran Liger's, so
    # these are the bytes beyond Liger's, per element and pass, counted from the ops (speed.eager_kernel_bytes).
    # RMSNorm, per input element: forward the fp32 cast (read 2, write 4), pow (4, 4), mean (4), the scaling (4, 4),
    # the cast back (4, 2) and the weight (2, 2), 36 bytes against Liger's 4; backward autograd's chain of the same
    # (the weight's product 4, the cast 6, the scaling 8 and its reduction 16, pow 12, the sum of the two 12, the cast
    # back 6), 60 against Liger's 6.
    eager_norm_bytes_per_element: dict[str, float] = field(default_factory=lambda: {"forward": 32.0, "backward": 54.0})
    # Rotary embedding, per element of q and k: forward q * cos (2, 2), the negated half (1, 1), the concatenation
    # (2, 2), * sin (2, 2), the sum (4, 2), 20 against Liger's in-place 4; backward the two products (4 each), the
    # negation (2), the halves' zero-filled copies (8), their sum (6), 24 against 4.
    eager_rope_bytes_per_element: dict[str, float] = field(default_factory=lambda: {"forward": 16.0, "backward": 20.0})
    # SwiGLU ``silu(gate) * up``, per intermediate element, where tunedeck's LoRA SwiGLU kernel does not run (full
    # fine-tuning, ``lora_swiglu_fused: false``): forward silu (2, 2) and the product (4, 2), 10 against Liger's 6;
    # backward the product's two gradients (6 each) and silu's (6), 18 against 10.
    eager_swiglu_bytes_per_element: dict[str, float] = field(default_factory=lambda: {"forward": 4.0, "backward": 8.0})
    # Plain transformers loss: fp32 upcast of the logits (read 2, write 4), log-softmax (read 4,
    # write 4), its gradient (read 4, write 4) and the bf16 gradient of the logits (write 2).
    plain_ce_traffic_bytes_per_logit: float = 24.0
    optimizer_traffic_factor: dict[str, float] = field(default_factory=_default_optimizer_traffic)
    # CPU launch time: per layer and pass unit by method, plus a fixed part per micro-step (loss,
    # optimizer and scheduler calls, logging). Fitted.
    dispatch_s_per_layer_pass: dict[str, float] = field(default_factory=_default_dispatch)
    dispatch_s_per_step: float = 0.0
    # A checkpointed layer's recompute, in those pass units (a forward is 1): the checkpoint's own work (its
    # saved-tensor hooks, the generator states it saves and restores) on top of the forward it runs again.
    # Fitted with them.
    dispatch_recompute_passes: float = 2.527
    # The tiled MLP's CPU time per tile and tiled layer, by method (see _default_mlp_tile).
    mlp_tile_s: dict[str, float] = field(default_factory=_default_mlp_tile)
    # Mixed-precision full fine-tuning (fp32 weights under autocast): GPU seconds per token x hidden x layer
    # over pure bf16 (speed.fp32_model_seconds). Fitted by bench/matrix_terms_fit.py on the 5 mixed-precision
    # full rows of the H200 matrix (0.5B-3B; 214-420 ps a row).
    fp32_model_s_per_element: float = 3.08e-10
    # CPU launches and GPU work overlap: step = (gpu^p + cpu^p)^(1/p); large p = perfect overlap.
    dispatch_overlap_power: float = 4.0
    data_parallel_s_per_layer: dict[int, float] = field(default_factory=_default_data_parallel)
    # Effective per-GPU NCCL bus bandwidth (GB/s) for the traffic not hidden behind compute; NVLink
    # boxes. PCIe-only boxes are several times slower: not modelled.
    interconnect_gbs: float = 150.0
    # Throughput kept with ZeRO-Offload (CPU Adam, PCIe transfers) and with parameter offload too.
    offload_optimizer_speed: float = 0.45
    offload_all_speed: float = 0.25

    # --- verdict -------------------------------------------------------------------------------------
    # A plan fits when peak + margin <= capacity; margin = max(fraction x capacity, floor).
    fit_margin_fraction: float = 0.05
    fit_margin_floor_gib: float = 1.0


DEFAULT_CALIBRATION = Calibration()
