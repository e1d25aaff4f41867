"""Training speed: the time of one micro-step from FLOPs, memory traffic and kernel-launch overhead.

FLOPs per token (a matmul of an n-parameter weight costs 2n per token forward):
- full fine-tuning: forward 2N, backward 4N (gradients for inputs and weights) -> 6N;
- LoRA/QLoRA/DoRA: the frozen base needs input gradients only -> 2N + 2N = 4N, plus 6x the adapters;
- DoRA with dropout: peft runs the targeted base linears a second time on the dropped-out input
  (forward 2n, backward 2n more for the n targeted weights);
- attention scores and weighted sum, causal: a token attends to the ones before it, and the flash /
  cuDNN kernels behind SDPA skip the masked upper triangle, so they compute half of the s x s scores:
  4 x layers x q_dim x seq x 0.5 per token forward, twice that backward (``attention_flops_factor``, 0.5;
  eager attention computes every score and masks after: factor 1, the PaLM convention);
- gradient checkpointing runs the checkpointed decoder layers' forward again (about x4/3 for full, x3/2
  for LoRA; the LM head and the loss are outside the blocks and are not recomputed). The tiled MLP
  (``tiled_mlp``) skips its compute in the block's recomputation and redoes it tile by tile in its own
  backward, so the MLP still runs forward twice: no FLOPs beyond plain checkpointing.
N here is the parameters that take part in matmuls: the blocks' linears and the LM head (the embedding
lookup is not a matmul), the LM head only for the share of tokens that have a target where the engine's
loss reads only those rows (``TrainingPlan.lm_head_share``: a chat set whose prompts are half its tokens
halves the LM head's work).

Time of one micro-step on one GPU (see ``step_time``): the GPU's work is the linear layers' FLOPs at a
big-GEMM efficiency, stretched by the elementwise work that grows as hidden/(hidden + h_half) shrinks
(norms, rotary, activations, casts are memory-bound and scale with tokens x hidden, not hidden^2), the
attention FLOPs at the attention kernels' own efficiency (flash/cuDNN through SDPA: one fused kernel, not
the method's GEMMs), plus pure memory traffic at the GPU's bandwidth (QLoRA's NF4 dequantisation and
DoRA's weight norm per pass over the base weights and its fp32 rescaling of every adapted output, LoRA's
dropout and peft's fp32 upcast of every LoRA input, the plain loss's fp32 logits, the optimizer step over
the trainable parameters). What the fused kernels take away of the fit's rows' traffic comes off at the rate the
fitted base holds it (``base_bandwidth``), not at the card's own bandwidth.
``offload_activations`` adds no time: its copies to and from pinned host memory run on a side stream
behind the compute (the rows that measure it cannot tell an overlapped copy from slower kernels).
The CPU's work is eager PyTorch launching every kernel of every layer (fixed per layer and pass, by
method: peft's adapters and bitsandbytes add many small ops). The two run concurrently, so the step takes about the longer
of them (a soft maximum). Data parallelism adds per-layer hook/bucket overhead and the traffic not
hidden behind compute. The constants are in ``calibration.py``, fitted by ``bench/estimate_calibrate.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.estimate.architecture import ModelArchitecture, ParameterCounts, lora_parameter_count
from core.estimate.calibration import MEASURED_GPU, Calibration
from core.estimate.gpus import GpuSpec, find_gpu
from core.estimate.plan import TrainingPlan
from core.estimate.precision import precision_layout


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token, split into the forward pass and the rest; ``attention`` is the part of the
    total (forward, backward and recompute) that the attention kernels compute."""

    forward: float
    backward: float
    recompute: float
    attention: float = 0.0

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute


def targeted_weight_parameters(arch: ModelArchitecture, plan: TrainingPlan) -> int:
    """Weights of the base linears that carry an adapter (what DoRA re-runs and normalises)."""
    per_layer = sum(shape.weight_params for shape in arch.linear_shapes() if shape.name in plan.lora_targets)
    return per_layer * arch.num_layers


def attention_flops_per_token(arch: ModelArchitecture, seq_len: int, calibration: Calibration,
                              kernel: str = "sdpa") -> float:
    """Forward attention FLOPs per token: QK^T and the weighted sum of V, 2 x 2 x q_dim x seq per layer for
    every score, times the share of the s x s scores the kernel computes: a causal flash kernel (SDPA)
    skips the masked half (``attention_flops_factor``, 0.5); eager attention computes them all (1)."""
    share = 1.0 if kernel == "eager" else calibration.attention_flops_factor
    return 4.0 * arch.num_layers * arch.q_dim * seq_len * share


def flops_per_token(arch: ModelArchitecture, counts: ParameterCounts, plan: TrainingPlan,
                    calibration: Calibration) -> FlopsPerToken:
    """Training FLOPs per token for ``plan`` (see the module docstring). The LM head's count only for the share of
    tokens it reads (``plan.lm_head_share``): tunedeck's losses skip the rows without a target."""
    head = counts.embedding * plan.lm_head_share
    n = counts.linear_in_layers + head
    attention = attention_flops_per_token(arch, plan.seq_len, calibration, plan.attention)
    if plan.method == "full":
        forward = 2.0 * n + attention
        backward = 4.0 * n + 2.0 * attention
    else:
        adapters = lora_parameter_count(arch, plan.lora_rank, plan.lora_targets)
        forward = 2.0 * n + 2.0 * adapters + attention
        backward = 2.0 * n + 4.0 * adapters + 2.0 * attention
        if plan.method == "dora" and plan.lora_dropout > 0:
            targeted = targeted_weight_parameters(arch, plan)
            forward += 2.0 * targeted
            backward += 2.0 * targeted
    # The recomputation re-runs the checkpointed decoder layers only: not the LM head (2 x its weights), except
    # the chunked loss's, whose chunks run under checkpointing (core.train.fused_loss): its backward makes each
    # chunk's logits again.
    fraction = plan.recompute_fraction
    recompute = (forward - 2.0 * head) * fraction
    if plan.chunked_ce:
        recompute += 2.0 * head
    if plan.skips_down_recompute:  # recompute_skip_down: the frozen down projection is not recomputed
        down = next(shape for shape in arch.linear_shapes() if shape.name == "down_proj")
        recompute -= 2.0 * down.weight_params * arch.num_layers * fraction
    return FlopsPerToken(forward=forward, backward=backward, recompute=recompute,
                         attention=attention * (3.0 + fraction))


def model_flops_per_token(plan: TrainingPlan) -> float:
    """Forward + backward FLOPs per trained token, recomputation not counted and every attention score
    counted (the PaLM convention): the numerator of the MFU the dashboards and the speed bench report, the
    same for every engine. The estimator's own step time counts a causal kernel's half instead."""
    from dataclasses import replace

    from core.estimate.architecture import count_parameters
    from core.estimate.calibration import DEFAULT_CALIBRATION

    palm = replace(DEFAULT_CALIBRATION, attention_flops_factor=1.0)
    every_row = replace(plan, target_share=1.0)  # every token's LM head row, whatever an engine skips
    flops = flops_per_token(plan.architecture, count_parameters(plan.architecture), every_row, palm)
    return flops.forward + flops.backward


def gemm_efficiency(arch: ModelArchitecture, plan: TrainingPlan, gpu: GpuSpec, calibration: Calibration) -> float:
    """Fraction of the dense peak the matmul FLOPs get, the blocks' elementwise work included.

    The big-GEMM efficiency of the GPU family and method, times hidden / (hidden + h_half): the
    memory-bound work per token (norms, rotary, activations, casts, peft's dropout copies) grows like
    hidden while the matmul work grows like hidden^2, so narrow models reach less of the peak.
    """
    if plan.precision == "fp32":
        base = calibration.fp32_efficiency
    else:
        family = calibration.efficiency.get(gpu.family) or calibration.efficiency["ampere"]
        base = family[plan.method]
    return base * arch.hidden_size / (arch.hidden_size + calibration.hidden_half_efficiency)


def attention_efficiency(arch: ModelArchitecture, plan: TrainingPlan, gpu: GpuSpec, calibration: Calibration) -> float:
    """Fraction of the dense peak the attention FLOPs get: the flash/cuDNN kernels' own efficiency under
    SDPA (one fused kernel per layer and pass, whatever the method); eager attention is batched matmuls
    and a softmax between them, at the method's GEMM efficiency."""
    if plan.precision == "fp32":
        return calibration.fp32_efficiency
    if plan.attention == "eager":
        return gemm_efficiency(arch, plan, gpu, calibration)
    table = calibration.attention_efficiency
    return table.get(gpu.family) or table["ampere"]


def memory_bandwidth_bytes_per_s(gpu: GpuSpec, calibration: Calibration) -> float:
    """What memory-bound kernels reach: the GPU's HBM bandwidth x an achievable fraction."""
    # A GPU without a bandwidth figure (a pseudo-spec): HBM keeps roughly pace with the matmul peak.
    gbs = gpu.memory_bandwidth_gbs or max(gpu.bf16_tflops, gpu.fp32_tflops) * calibration.fallback_gbs_per_tflops
    return max(gbs, 1.0) * 1e9 * calibration.memory_bandwidth_efficiency


def base_bandwidth(arch: ModelArchitecture, plan: TrainingPlan, gpu: GpuSpec, calibration: Calibration) -> float:
    """The rate at which the terms against the fit's rows (``lora_saved_bytes``, ``norm_bytes``) take time off:
    the fit's rows made that traffic on the measured GPU, and the fitted base efficiency holds its time there,
    FLOP-based; so it is the measured GPU's bandwidth, scaled by this GPU's matmul rate against that GPU's.
    The H100 SXM (the H200's die and peak, 3.35 against 4.8 TB/s) then saves what the H200 saves; at its own
    bandwidth the savings came out 1.4x larger and the H100's LoRA rows 3-7% optimistic where the card runs
    them 0.5-2% slower than the H200 (bench/results/h100/README.md)."""
    measured = find_gpu(MEASURED_GPU)
    rate = gpu.peak_tflops(plan.precision) * gemm_efficiency(arch, plan, gpu, calibration)
    measured_rate = measured.peak_tflops(plan.precision) * gemm_efficiency(arch, plan, measured, calibration)
    return memory_bandwidth_bytes_per_s(measured, calibration) * rate / measured_rate


def weight_pass_bytes(counts: ParameterCounts, arch: ModelArchitecture, plan: TrainingPlan,
                      calibration: Calibration) -> float:
    """Bytes moved per micro-step over the base weights outside the matmuls.

    QLoRA dequantises every NF4 weight to bf16 in the forward pass, again in backward (the input
    gradient needs W) and in the recompute, which ``qlora_reuse_dequantised`` keeps for the backward;
    DoRA forms W + BA and its row norms in every forward pass.
    """
    if plan.method == "qlora":
        weights = (2 + plan.recompute_fraction) * counts.linear_in_layers
        if plan.reuses_dequantised:  # the adapted (grouped) linears of checkpointed blocks
            weights -= plan.recompute_fraction * targeted_weight_parameters(arch, plan)
        return weights * calibration.qlora_dequant_bytes_per_weight
    if plan.method == "dora":
        passes = 1 + plan.recompute_fraction
        return passes * targeted_weight_parameters(arch, plan) * calibration.dora_norm_bytes_per_weight
    return 0.0


def lora_input_elements(arch: ModelArchitecture, plan: TrainingPlan, names: tuple[str, ...] | None = None) -> int:
    """Input elements per token of the linears that carry an adapter (each has its own dropout and cast), of
    ``names`` only if given."""
    per_layer = sum(shape.in_features for shape in arch.linear_shapes()
                    if shape.name in plan.lora_targets and (names is None or shape.name in names))
    return per_layer * arch.num_layers


def lora_input_bytes(arch: ModelArchitecture, plan: TrainingPlan, calibration: Calibration) -> float:
    """Bytes moved per micro-step over the LoRA layers' inputs outside the matmuls (forward, backward and
    recompute alike): peft's dropout (a copy and a mask, the same back; with ``dropout_fused`` the fused
    kernels' time beyond plain ``lora_A`` matmuls instead) and, with ``lora_input_upcast``,
    its cast of the input to fp32 and autocast's cast back to bf16 for ``lora_A`` (the dropout then runs
    on the fp32 copy). Every adapted linear does its own, seven per block for all-linear targets.
    QLoRA with ``kbit_upcast`` (``qlora_upcast``: peft's ``prepare_model_for_kbit_training``) pays the same:
    its norms and residual stream are fp32, so the adapted linears get fp32 inputs that bitsandbytes and
    autocast cast to bf16 again (the 7B row at b4 x 2048: 7,979 tok/s against 10,197 without), and on its outputs
    what ``qlora_upcast_bytes_per_element`` counts, per output element of an adapted linear and pass."""
    if not plan.uses_lora:
        return 0.0
    fp32_inputs = plan.fp32_lora_inputs
    per_element = 0.0
    if plan.lora_dropout > 0 and not plan.dropout_fused:
        per_element += calibration.lora_dropout_bytes_per_element["fp32" if fp32_inputs else "bf16"]
    if fp32_inputs:
        per_element += calibration.lora_upcast_bytes_per_element
    passes = 2.0 + plan.recompute_fraction
    elements = lora_input_elements(arch, plan)
    moved = passes * per_element * elements
    if plan.dropout_fused:  # the kernels' hashing, as bytes at the memory-bound rate (forward, backward)
        fused = calibration.lora_fused_dropout_bytes_per_element
        forwards = 1.0 if plan.keeps_lora_a else 1.0 + plan.recompute_fraction  # (the recompute takes them kept)
        if plan.swiglu_down:  # the down projection's inside the SwiGLU kernels, which its memory traffic hides
            elements -= lora_input_elements(arch, plan, ("down_proj",))  # (H200: 2.2 against 2.8 ms, 16k rows)
        moved += (forwards * fused["forward"] + fused["backward"]) * elements
    if not plan.lora_grouped and plan.method != "dora":  # the fused add's copy of each output, forward passes
        moved += (1.0 + plan.recompute_fraction) * calibration.lora_output_copy_bytes_per_element \
            * lora_output_elements(arch, plan)
    if plan.qlora_upcast:  # the frozen 4-bit linears' outputs cast to fp32, peft's copy and add in fp32
        moved += passes * calibration.qlora_upcast_bytes_per_element * lora_output_elements(arch, plan)
    return moved * plan.tokens_per_micro_batch - lora_saved_bytes(arch, plan, calibration)


def lora_saved_bytes(arch: ModelArchitecture, plan: TrainingPlan, calibration: Calibration) -> float:
    """The LoRA outputs' traffic the fit's rows made and the fused kernels take away (``lora_input_bytes``
    subtracts it): time held in the fitted base efficiency, so ``step_time`` takes it off at ``base_bandwidth``."""
    if not plan.uses_lora:
        return 0.0
    saved = 0.0
    if plan.swiglu_fused:  # the gate/up adds the fit's rows made, gone into the SwiGLU kernel
        saved += (1.0 + plan.recompute_fraction) * calibration.lora_output_add_bytes_per_element \
            * lora_output_elements(arch, plan, ("gate_proj", "up_proj"))
    if plan.folded_dh:  # lora_fold_dh: the dh matmuls' read of the output gradients, made by the base matmuls
        saved += calibration.lora_dh_read_bytes_per_element * lora_output_elements(arch, plan, plan.folded_dh)
    if plan.swiglu_db:  # the gate/up dB matmuls' read of their output gradients, summed in the SwiGLU kernel
        saved += calibration.lora_swiglu_db_bytes_per_element * lora_output_elements(arch, plan,
                                                                                   ("gate_proj", "up_proj"))
    return saved * plan.tokens_per_micro_batch


def lora_output_elements(arch: ModelArchitecture, plan: TrainingPlan, names: tuple[str, ...] | None = None) -> int:
    """Output elements per token of the linears that carry an adapter (LoRA's or DoRA's), of ``names`` only
    if given."""
    per_layer = sum(shape.out_features for shape in arch.linear_shapes()
                    if shape.name in plan.lora_targets and (names is None or shape.name in names))
    return per_layer * arch.num_layers


def dora_output_bytes(arch: ModelArchitecture, plan: TrainingPlan, calibration: Calibration) -> float:
    """Bytes moved per micro-step over the DoRA layers' outputs outside the matmuls: peft rescales every
    adapted linear's output by magnitude / weight norm, an fp32 vector, so ``(m/n - 1) * base + m/n * lora
    * scaling`` and its gradient run as a chain of fp32 element-wise kernels and casts over tokens x
    out_features. The H200 profiles (``bench/results/estimate_matrix/profile-2-profiles.md``) put 850 ms a
    step in element-wise and copy kernels at 7B b4 x 2048 against LoRA's 91, 2.4x the 1.5B's: it follows
    tokens x out_features (2.2x), not the weights (5x). One figure per micro-step, forward and backward:
    the 7B rows with and without checkpointing solve to the same bytes per element (169 and 161), so the
    recomputation is not counted again."""
    if plan.method != "dora":
        return 0.0
    return calibration.dora_output_bytes_per_element * lora_output_elements(arch, plan) * plan.tokens_per_micro_batch


def norm_bytes(arch: ModelArchitecture, plan: TrainingPlan, calibration: Calibration) -> float:
    """Memory-bound time of the RMSNorms against the fit's rows, as bytes per micro-step: those ran Liger's norms,
    so this is zero, or below zero with ``rms_norm_rows`` (the backward's walk taken off: each block's two norms
    and the final one, once a micro-step; the recompute runs the forward only)."""
    if not plan.norm_rows:
        return 0.0
    return -calibration.liger_norm_walk_bytes_per_element * (2 * arch.num_layers + 1) * arch.hidden_size \
        * plan.tokens_per_micro_batch


def eager_kernel_bytes(arch: ModelArchitecture, plan: TrainingPlan, calibration: Calibration) -> float:
    """Memory traffic per micro-step of the model's own RMSNorm, rotary embedding and SwiGLU where Liger's kernels
    do not run (``TrainingPlan.liger_kernels``: ``fused_ce: false`` or ``chunked``), beyond Liger's, which the fit's
    rows ran (``Calibration.eager_*_bytes_per_element``). A checkpointed block's recompute runs the forward again
    (the final norm is outside the blocks); the SwiGLU only where tunedeck's LoRA SwiGLU kernel does not run."""
    if plan.liger_kernels:
        return 0.0
    forwards = 1.0 + plan.recompute_fraction
    layers = arch.num_layers

    def traffic(per_element: dict[str, float], elements_per_layer: int) -> float:
        return (forwards * per_element["forward"] + per_element["backward"]) * elements_per_layer * layers

    norm = calibration.eager_norm_bytes_per_element
    per_token = traffic(norm, 2 * arch.hidden_size) + (norm["forward"] + norm["backward"]) * arch.hidden_size
    per_token += traffic(calibration.eager_rope_bytes_per_element, arch.q_dim + arch.kv_dim)
    if not plan.swiglu_fused:
        per_token += traffic(calibration.eager_swiglu_bytes_per_element, arch.intermediate_size)
    return per_token * plan.tokens_per_micro_batch


def loss_bytes(arch: ModelArchitecture, plan: TrainingPlan, calibration: Calibration) -> float:
    """Memory traffic of the loss: the fp32 logits' upcast, log-softmax and its gradient, for the model's own loss
    and the chunked one (a chunk at a time, over the rows with a target); the fused kernels' (Liger's, tunedeck's)
    keep the logits on chip: none."""
    if plan.fused_ce and not plan.chunked_ce:
        return 0.0
    return plan.tokens_per_micro_batch * plan.lm_head_share * arch.vocab_size * calibration.plain_ce_traffic_bytes_per_logit


def optimizer_bytes(trainable: int, plan: TrainingPlan, calibration: Calibration) -> float:
    """Memory traffic of one optimizer step (weights, gradients, states, master copy; clipping included)."""
    layout = precision_layout(plan, calibration.adam8bit_bytes_per_param)
    per_param = layout.trainable_weight + layout.gradient + layout.optimizer_state + layout.master_weight
    factor = calibration.optimizer_traffic_factor.get(plan.optimizer, 3.0)
    return trainable * per_param * factor


def dispatch_seconds(arch: ModelArchitecture, plan: TrainingPlan, calibration: Calibration) -> float:
    """CPU time to launch one micro-step's kernels: per layer and pass unit (forward 1, backward 2, a checkpointed
    layer's recompute ``dispatch_recompute_passes``),
    plus the tiled MLP's per tile and tiled layer (its forward, recomputation and backward tile by tile, each
    tile's backward its own autograd call)."""
    passes = 3 + plan.recompute_fraction * calibration.dispatch_recompute_passes
    per_layer = calibration.dispatch_s_per_layer_pass[plan.method]
    return arch.num_layers * passes * per_layer + calibration.dispatch_s_per_step + mlp_tile_seconds(plan, calibration)


def mlp_tile_seconds(plan: TrainingPlan, calibration: Calibration) -> float:
    """CPU time the tiled MLP adds to a micro-step: tiles x tiled layers x a per-tile cost by method."""
    checkpointed = plan.checkpointed_layers
    kept = plan.architecture.num_layers - checkpointed
    tile_layers = sum(layers * tiles for layers, tiles in ((checkpointed, plan.mlp_tiles(True)), (kept, plan.mlp_tiles(False)))
                      if tiles > 1)
    return tile_layers * calibration.mlp_tile_s[plan.method]


def fp32_model_seconds(arch: ModelArchitecture, plan: TrainingPlan, calibration: Calibration) -> float:
    """What full fine-tuning in mixed precision (fp32 weights under autocast, no DeepSpeed) adds to a micro-step
    over pure bf16: on the H200 a cost per token x hidden x layer, the same for 0.5B, 1.5B and 3B models
    (80-100 ms a step at 300-350M such elements), whatever the optimizer. Measured; its cause is not yet
    profiled (a guess to check: norms and the residual stream in fp32 with the fp32 weights)."""
    if plan.method != "full" or not plan.mixed_precision or plan.uses_deepspeed:
        return 0.0
    return plan.tokens_per_micro_batch * arch.hidden_size * arch.num_layers * calibration.fp32_model_s_per_element


def data_parallel_seconds(arch: ModelArchitecture, counts: ParameterCounts, trainable: int, plan: TrainingPlan,
                          calibration: Calibration) -> float:
    """Per micro-step time data parallelism adds: per-layer hook/bucket overhead + traffic not overlapped.

    Gradients are all-reduced (DDP) or reduce-scattered (ZeRO) in their own dtype (the precision
    layout's: fp32 for LoRA adapters and for mixed-precision full fine-tuning, the compute dtype under
    DeepSpeed); ZeRO-3 also all-gathers the weights for the forward and the backward pass. A ring moves
    2(n-1)/n of an all-reduce's bytes per GPU and (n-1)/n of a gather's. DDP (stage 0, the Trainer runs
    the other micro-steps under ``no_sync``) and ZeRO-1 (DeepSpeed reduces at the accumulation boundary)
    synchronise once per optimizer step, so their cost is spread over the accumulation; ZeRO-2/3
    reduce-scatter in the backward hooks of every micro-step.
    """
    if plan.num_gpus <= 1:
        return 0.0
    n = plan.num_gpus
    gradient_size = precision_layout(plan, calibration.adam8bit_bytes_per_param).gradient
    traffic = 2.0 * (n - 1) / n * trainable * gradient_size
    if plan.zero_stage == 3:
        traffic += 2.0 * (n - 1) / n * counts.total * 2.0
    stage = plan.zero_stage if plan.zero_stage in calibration.data_parallel_s_per_layer else 3
    overhead = arch.num_layers * calibration.data_parallel_s_per_layer[stage]
    per_sync = overhead + traffic / (calibration.interconnect_gbs * 1e9)
    return per_sync / plan.grad_accum_steps if plan.zero_stage <= 1 else per_sync


def offload_factor(plan: TrainingPlan, calibration: Calibration) -> float:
    """Throughput kept with ZeRO-Offload (CPU Adam and PCIe transfers; parameters too for ``all``)."""
    if plan.offload == "optimizer":
        return calibration.offload_optimizer_speed
    if plan.offload == "all":
        return calibration.offload_all_speed
    return 1.0


@dataclass(frozen=True)
class StepTime:
    """Seconds of one micro-step on one GPU, by part."""

    matmul_s: float  # the linear layers' FLOPs (attention's are in attention_s)
    attention_s: float
    weight_pass_s: float  # memory traffic over the base weights: QLoRA dequantisation, DoRA norms
    lora_input_s: float  # memory traffic over the LoRA inputs: dropout, fp32 upcast
    dora_output_s: float  # memory traffic over the DoRA outputs: the magnitude rescaling in fp32
    fp32_model_s: float  # full fine-tuning of an fp32 model under autocast: per activation element, measured
    loss_s: float
    optimizer_s: float
    gpu_s: float  # the sum of the seven above and norm_s
    dispatch_s: float  # CPU-side kernel launches, concurrent with the GPU's work
    data_parallel_s: float
    total_s: float
    # the RMSNorms (and rotary, SwiGLU) against the fit's rows (Liger's): below zero with rms_norm_rows, above
    # where Liger's kernels do not run
    norm_s: float = 0.0

    @property
    def waits_on_cpu(self) -> bool:
        """Launching the step's kernels takes longer than running them: the step waits on the CPU."""
        return self.dispatch_s > self.gpu_s


def step_time(arch: ModelArchitecture, counts: ParameterCounts, trainable: int, plan: TrainingPlan, gpu: GpuSpec,
              calibration: Calibration) -> StepTime:
    """Time of one micro-step (see the module docstring); the optimizer step is spread over accumulation."""
    tokens = plan.tokens_per_micro_batch
    per_token = flops_per_token(arch, counts, plan, calibration)
    peak = gpu.peak_tflops(plan.precision) * 1e12
    if peak > 0:
        matmul = (per_token.total - per_token.attention) * tokens / (peak * gemm_efficiency(arch, plan, gpu, calibration))
        attention = per_token.attention * tokens / (peak * attention_efficiency(arch, plan, gpu, calibration))
    else:
        matmul = attention = float("inf")
    bandwidth = memory_bandwidth_bytes_per_s(gpu, calibration)
    weights = weight_pass_bytes(counts, arch, plan, calibration) / bandwidth
    base = base_bandwidth(arch, plan, gpu, calibration) if peak > 0 else bandwidth
    saved = lora_saved_bytes(arch, plan, calibration)
    inputs = (lora_input_bytes(arch, plan, calibration) + saved) / bandwidth - saved / base
    outputs = dora_output_bytes(arch, plan, calibration) / bandwidth
    loss = loss_bytes(arch, plan, calibration) / bandwidth
    norms = norm_bytes(arch, plan, calibration) / base + eager_kernel_bytes(arch, plan, calibration) / bandwidth
    # ZeRO shards the optimizer step across the GPUs; accumulation runs it once per several micro-steps.
    shards = plan.num_gpus if plan.zero_stage >= 1 else 1
    optimizer = optimizer_bytes(trainable, plan, calibration) / bandwidth / plan.grad_accum_steps / shards
    fp32_model = fp32_model_seconds(arch, plan, calibration)
    gpu_s = matmul + attention + weights + inputs + outputs + loss + optimizer + fp32_model + norms
    dispatch = dispatch_seconds(arch, plan, calibration)
    power = calibration.dispatch_overlap_power
    overlapped = (gpu_s**power + dispatch**power) ** (1.0 / power)
    parallel = data_parallel_seconds(arch, counts, trainable, plan, calibration)
    total = (overlapped + parallel) / offload_factor(plan, calibration)
    return StepTime(matmul_s=matmul, attention_s=attention, weight_pass_s=weights, lora_input_s=inputs,
                    dora_output_s=outputs, fp32_model_s=fp32_model, loss_s=loss,
                    optimizer_s=optimizer, gpu_s=gpu_s, dispatch_s=dispatch, data_parallel_s=parallel, total_s=total,
                    norm_s=norms)


@dataclass(frozen=True)
class SpeedEstimate:
    """Throughput of the whole job and what follows from it."""

    flops_per_token: float
    # FLOPs utilisation of one GPU: the FLOPs the step time counts (causal attention under SDPA, the
    # recomputation included) per second over the dense peak, every overhead included.
    efficiency: float
    tokens_per_s_per_gpu: float
    tokens_per_s: float  # all GPUs together
    seconds_per_step: float  # one optimizer step: micro-batch x accumulation x GPUs tokens
    epoch_hours: float | None
    epoch_cost: float | None
    step: StepTime | None = None


def estimate_speed(arch: ModelArchitecture, counts: ParameterCounts, plan: TrainingPlan, gpu: GpuSpec,
                   calibration: Calibration, trainable: int | None = None) -> SpeedEstimate:
    """Tokens/s from the micro-step time, then time per epoch and cost when the plan gives tokens and a price.

    ``trainable`` is the number of trained parameters (the optimizer's work); by default the whole
    model for full fine-tuning and the adapters otherwise.
    """
    if trainable is None:
        trainable = counts.total if plan.method == "full" else lora_parameter_count(
            arch, plan.lora_rank, plan.lora_targets, dora=plan.method == "dora")
    flops = flops_per_token(arch, counts, plan, calibration).total
    step = step_time(arch, counts, trainable, plan, gpu, calibration)
    per_gpu = plan.tokens_per_micro_batch / step.total_s if step.total_s > 0 else 0.0
    peak = gpu.peak_tflops(plan.precision) * 1e12
    efficiency = per_gpu * flops / peak if peak > 0 else 0.0
    total = per_gpu * plan.num_gpus
    step_tokens = plan.tokens_per_micro_batch * plan.grad_accum_steps * plan.num_gpus
    epoch_hours = None
    cost = None
    if plan.dataset_tokens is not None and total > 0:
        epoch_hours = plan.dataset_tokens / total / 3600.0
        if plan.price_per_gpu_hour is not None:
            cost = epoch_hours * plan.num_gpus * plan.price_per_gpu_hour
    return SpeedEstimate(
        flops_per_token=flops,
        efficiency=efficiency,
        tokens_per_s_per_gpu=per_gpu,
        tokens_per_s=total,
        seconds_per_step=step_tokens / total if total > 0 else float("inf"),
        epoch_hours=epoch_hours,
        epoch_cost=cost,
        step=step,
    )
