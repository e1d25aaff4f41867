"""GPU memory of one training process, term by term, and the moment of the step where it peaks.

Each term is a small function of the plan that says what it models. The peak is the largest of three
moments of a step, each a sum of terms (all bytes, per GPU):

- ``loss``: the forward pass has ended: weights (+ autocast's bf16 weight copies), optimizer state,
  all saved activations and the logits/loss tensors;
- ``backward``: the last block back-propagates (recomputed first with gradient checkpointing) while
  the other blocks' activations (or inputs) are still kept and the first gradients exist;
- ``optimizer_step``: all gradients exist (activations are gone): the end of backward, where a tied
  embedding's gradient is added into the LM head's, and the update with its temporaries.

Gradients are freed after each step (``zero_grad(set_to_none=True)``), so with one micro-batch per step
they do not overlap the forward pass; with gradient accumulation they do.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.estimate.activations import ActivationSizes, activation_sizes
from core.estimate.architecture import ModelArchitecture, ParameterCounts, lora_parameter_count
from core.estimate.calibration import Calibration
from core.estimate.gpus import GIB, GpuSpec
from core.estimate.plan import TrainingPlan
from core.estimate.precision import PrecisionLayout, precision_layout
from core.train.fused_loss import fused_chunk_tokens  # light: torch only inside its functions

BREAKDOWN_KEYS = (
    "cuda_context",
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "logits_and_loss",
    "deepspeed_nccl_buffers",
    "allocator_slack",
)


@dataclass(frozen=True)
class ModelSizes:
    """Parameter numbers the memory terms share."""

    counts: ParameterCounts
    total: int  # exact when counted on the meta device, else analytic
    trainable: int
    lora: int  # adapter parameters (0 for full fine-tuning)

    @property
    def lm_head_matmul(self) -> int:
        """Weights of the LM head matmul (the embedding when tied)."""
        return self.counts.embedding


def model_sizes(arch: ModelArchitecture, counts: ParameterCounts, plan: TrainingPlan) -> ModelSizes:
    """Total, trainable and adapter parameter numbers for ``plan``."""
    total = plan.exact_total_params or counts.total
    lora = 0
    if plan.uses_lora:
        lora = lora_parameter_count(arch, plan.lora_rank, plan.lora_targets, dora=plan.method == "dora")
    trainable = total if plan.method == "full" else lora
    return ModelSizes(counts=counts, total=total, trainable=trainable, lora=lora)


def _data_parallel(plan: TrainingPlan) -> int:
    return plan.num_gpus


def cuda_context_bytes(gpu: GpuSpec, calibration: Calibration) -> float:
    """The CUDA context and library workspaces every process pays before allocating a tensor (none on the CPU)."""
    if gpu.family == "cpu":
        return 0.0
    return calibration.cuda_context_gib.get(gpu.family, 0.5) * GIB


def unsharded_weight_bytes(sizes: ModelSizes, plan: TrainingPlan, layout: PrecisionLayout,
                           calibration: Calibration) -> float:
    """All of the model's weights as one process would hold them without ZeRO-3."""
    if plan.method == "full":
        return sizes.total * layout.trainable_weight
    adapters = sizes.lora * layout.trainable_weight
    if plan.method == "qlora":
        quantised = sizes.counts.linear_in_layers
        rest = sizes.total - quantised
        return quantised * calibration.nf4_bytes_per_param + rest * layout.frozen_weight + adapters
    return sizes.total * layout.frozen_weight + adapters


def zero3_live_parameter_bytes(arch: ModelArchitecture, sizes: ModelSizes, layout: PrecisionLayout,
                               calibration: Calibration) -> float:
    """Parameters ZeRO-3 gathers in full while a module runs: the largest module plus the prefetch bucket."""
    per_layer = sizes.counts.per_layer_linear + sizes.counts.per_layer_norm
    largest = max(per_layer, sizes.lm_head_matmul)
    prefetch = calibration.zero3_prefetch_hidden_sq * arch.hidden_size**2
    return (largest + prefetch) * layout.compute


def weight_bytes(arch: ModelArchitecture, sizes: ModelSizes, plan: TrainingPlan, layout: PrecisionLayout,
                 calibration: Calibration) -> float:
    """Weights resident on one GPU: everything, or with ZeRO-3 a 1/N shard plus the gathered live params."""
    weights = unsharded_weight_bytes(sizes, plan, layout, calibration)
    if plan.zero_stage == 3:
        resident = 0.0 if plan.offload == "all" else weights / _data_parallel(plan)
        return resident + zero3_live_parameter_bytes(arch, sizes, layout, calibration)
    return weights


def autocast_cache_bytes(sizes: ModelSizes, plan: TrainingPlan, layout: PrecisionLayout) -> float:
    """Compute-dtype copies autocast keeps of fp32 matmul weights until the forward pass ends.

    Inside gradient-checkpointed blocks the casts are not kept (measured), so only the LM head's is.
    """
    if not layout.autocast_weight_cache:
        return 0.0
    in_blocks = 1.0 - plan.recompute_fraction
    if plan.method == "full":
        return layout.compute * (in_blocks * sizes.counts.linear_in_layers + sizes.lm_head_matmul)
    cached = in_blocks * sizes.lora
    if plan.method == "qlora" and layout.frozen_weight == 4.0:
        cached += sizes.lm_head_matmul  # the LM head upcast to fp32 by prepare_model_for_kbit_training
    return layout.compute * cached


def gradient_bytes(sizes: ModelSizes, plan: TrainingPlan, layout: PrecisionLayout) -> float:
    """Gradients of all trainable parameters on one GPU (1/N with ZeRO-2/3; on the CPU when offloaded)."""
    if plan.offload != "none" and plan.zero_stage >= 2:
        return 0.0
    grads = sizes.trainable * layout.gradient
    return grads / _data_parallel(plan) if plan.zero_stage >= 2 else grads


def first_gradients_bytes(arch: ModelArchitecture, sizes: ModelSizes, plan: TrainingPlan,
                          layout: PrecisionLayout) -> float:
    """Gradients that exist while the last block back-propagates: the LM head's and one block's."""
    if plan.method != "full":
        return 0.0
    per_layer = sizes.counts.per_layer_linear + sizes.counts.per_layer_norm
    grads = (sizes.lm_head_matmul + per_layer) * layout.gradient
    return grads / _data_parallel(plan) if plan.zero_stage >= 2 else grads


def optimizer_bytes(sizes: ModelSizes, plan: TrainingPlan, layout: PrecisionLayout) -> float:
    """Optimizer state (both moments) + fp32 master weights on one GPU: 1/N with ZeRO >= 1, 0 if offloaded."""
    if plan.offload != "none":
        return 0.0
    state = sizes.trainable * (layout.optimizer_state + layout.master_weight)
    if plan.method == "full" and plan.optimizer in ("adamw_8bit", "paged_adamw_8bit") and not plan.uses_deepspeed:
        # transformers' Trainer overrides bitsandbytes' 8-bit optimizers to 32-bit states (two fp32 moments)
        # for every nn.Embedding weight (the tied LM head with it): 233M parameters of Qwen2.5-1.5B.
        state += sizes.counts.embedding * (8.0 - layout.optimizer_state)
    return state / _data_parallel(plan) if plan.zero_stage >= 1 else state


def optimizer_step_temporary_bytes(sizes: ModelSizes, plan: TrainingPlan, layout: PrecisionLayout) -> float:
    """Temporaries of the update, on one GPU.

    torch's foreach AdamW (transformers' "adamw_torch") allocates sqrt(v) for a whole parameter group
    at once: one moment-sized tensor. Fused AdamW and bitsandbytes' 8-bit Adam update in place.
    DeepSpeed (ZeRO >= 1) also makes an fp32 copy of the gradient partition for the step.
    """
    if plan.offload != "none":
        return 0.0  # the update runs on the CPU
    shard = _data_parallel(plan) if plan.zero_stage >= 1 else 1
    temporary = 0.0
    if plan.optimizer == "adamw":
        moment = 4.0 if plan.uses_deepspeed else layout.optimizer_state / 2
        temporary += moment * sizes.trainable / shard
    if plan.zero_stage >= 1:
        temporary += 4.0 * sizes.trainable / shard
    return temporary


def tied_embedding_gradient_bytes(sizes: ModelSizes, plan: TrainingPlan, layout: PrecisionLayout) -> float:
    """The last op of backward when full fine-tuning trains a tied embedding: the lookup's dense vocab x hidden
    gradient, made while every other gradient exists, before it is added into the LM head's (measured: the
    optimizer-step rows of the tied 1.5B/3B models ran one embedding gradient above the step's tensors; the
    untied 7B did not)."""
    if plan.method != "full" or sizes.counts.lm_head:
        return 0.0
    return sizes.counts.embedding * layout.gradient


def fused_ce_chunk_tokens(arch: ModelArchitecture, tokens: int) -> int:
    """The fused linear cross-entropy's chunk (Liger's and ``fused_ce: triton``'s)."""
    return fused_chunk_tokens(tokens, arch.vocab_size, arch.hidden_size)


def logits_and_loss_bytes(arch: ModelArchitecture, plan: TrainingPlan, layout: PrecisionLayout,
                          calibration: Calibration) -> float:
    """Logits and cross-entropy tensors at the loss.

    Plain transformers materialises the logits of every token (bf16, fp32 upcast, log-softmax, its
    gradient). The fused linear cross-entropy computes the gradients during the forward pass: one
    chunk of logits at a time, the gradient of the hidden states, the loss per token, and, when the
    LM head trains, its weight gradient.
    """
    tokens = plan.tokens_per_micro_batch
    if not plan.fused_ce:
        return tokens * arch.vocab_size * calibration.plain_ce_bytes_per_logit
    if plan.chunked_ce:
        # core.train.fused_loss: one checkpointed chunk at a time holds the plain path's per-logit tensors
        # (compute-dtype logits, fp32 upcast, log-softmax, gradient); the hidden states' gradient and
        # the per-token loss exist for the whole batch; a trained LM head has its weight gradient.
        total = plan.ce_chunk * arch.vocab_size * calibration.plain_ce_bytes_per_logit
        total += tokens * arch.hidden_size * layout.compute + 4.0 * tokens
        if plan.method == "full":
            total += arch.vocab_size * arch.hidden_size * layout.gradient
        return total
    # Liger's holds a chunk's logits and a transient copy; tunedeck's kernel (``triton``) one chunk's, in the compute
    # dtype, freed before the next chunk's are made
    per_logit = layout.compute if plan.triton_ce else calibration.fused_ce_bytes_per_logit
    total = plan.ce_chunk * arch.vocab_size * per_logit
    total += tokens * arch.hidden_size * layout.compute + 4.0 * tokens
    if plan.method == "full":
        total += arch.vocab_size * arch.hidden_size * layout.gradient
    return total


def communication_buffer_bytes(arch: ModelArchitecture, sizes: ModelSizes, plan: TrainingPlan,
                               layout: PrecisionLayout, calibration: Calibration) -> float:
    """NCCL's buffers, DDP's gradient buckets, DeepSpeed's reduce/all-gather buckets."""
    total = calibration.nccl_base_gib * GIB if plan.num_gpus > 1 else 0.0
    if plan.zero_stage == 0:
        if plan.num_gpus > 1:
            # DDP copies gradients into its own buckets (gradient_as_bucket_view is off by default).
            total += sizes.trainable * layout.gradient
        return total
    bucket_cap = float(max(sizes.trainable, 1))
    reduce_bucket = min(calibration.zero_reduce_bucket_hidden_sq * arch.hidden_size**2, bucket_cap)
    total += reduce_bucket * 2.0 * calibration.zero_overlap_comm_factor
    if plan.zero_stage in (1, 2):
        total += min(calibration.zero_allgather_bucket_elements, bucket_cap) * 2.0
    return total


def allocator_slack_bytes(transient: dict[str, float], calibration: Calibration) -> float:
    """Memory the caching allocator reserves beyond live tensors: a floor, and a fraction of each kind of
    churn (``transient``: bytes by the keys of ``Calibration.allocator_slack_fraction``)."""
    fractions = calibration.allocator_slack_fraction
    return calibration.allocator_slack_floor_gib * GIB + sum(fractions[kind] * size for kind, size in transient.items())


def loading_ram_bytes(sizes: ModelSizes, plan: TrainingPlan, calibration: Calibration) -> float:
    """Host RAM while the model loads, for the whole box.

    Without a device map transformers materialises the whole model in host RAM (in the dtype it is
    loaded in: fp32 for mixed-precision full fine-tuning) before the trainer moves it to the GPU; every
    process does so. QLoRA loads with a device map, one checkpoint shard at a time; ZeRO-3 builds the
    model partitioned, so the box holds about one bf16 copy.
    """
    if plan.method == "qlora":
        return plan.num_gpus * calibration.checkpoint_shard_gib * GIB
    if plan.zero_stage == 3:
        return sizes.total * 2.0
    fp32_load = plan.precision == "fp32" or (plan.method == "full" and plan.precision != "pure-bf16")
    return plan.num_gpus * sizes.total * (4.0 if fp32_load else 2.0)


def cpu_ram_bytes(sizes: ModelSizes, plan: TrainingPlan, calibration: Calibration) -> float:
    """Host RAM for the whole box: each process's own, plus the larger of offloaded state and loading.

    Offloaded optimizer: fp32 master + Adam moments + fp32 gradients of every trainable parameter.
    Offloaded parameters (ZeRO-3): their bf16 partitions too. Offloaded activations: every checkpointed
    block's input, pinned (the whole time training runs, so on top of the rest).
    """
    processes = plan.num_gpus * calibration.cpu_ram_per_process_gib * GIB
    offloaded = 0.0
    if plan.offload != "none":
        offloaded += sizes.trainable * (4.0 + 8.0 + 4.0)
    if plan.offload == "all":
        offloaded += sizes.total * 2.0
    return processes + max(offloaded, loading_ram_bytes(sizes, plan, calibration)) + activation_host_bytes(plan)


def activation_host_bytes(plan: TrainingPlan) -> float:
    """Pinned host memory of ``offload_activations``: each checkpointed block's input, on every GPU."""
    if not plan.offloads_activations:
        return 0.0
    arch = plan.architecture
    width = 4.0 if plan.precision == "fp32" or plan.kbit_upcast else 2.0  # the residual stream's dtype
    return plan.num_gpus * plan.checkpointed_layers * plan.tokens_per_micro_batch * arch.hidden_size * width


@dataclass(frozen=True)
class MemoryPhases:
    """The breakdown (bytes) at each moment of the step, and which one is the peak."""

    phases: dict[str, dict[str, float]]
    cpu_ram: float
    sizes: ModelSizes
    churn: dict[str, dict[str, float]]  # per phase: what its allocator slack is a fraction of, by kind

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda name: sum(self.phases[name].values()))

    @property
    def peak(self) -> dict[str, float]:
        return self.phases[self.peak_phase]


def memory_phases(arch: ModelArchitecture, counts: ParameterCounts, plan: TrainingPlan, gpu: GpuSpec,
                  calibration: Calibration) -> MemoryPhases:
    """Memory at the loss, during checkpointed backward and at the optimizer step."""
    layout = precision_layout(plan, calibration.adam8bit_bytes_per_param)
    sizes = model_sizes(arch, counts, plan)
    context = cuda_context_bytes(gpu, calibration)
    weights = weight_bytes(arch, sizes, plan, layout, calibration)
    optimizer = optimizer_bytes(sizes, plan, layout)
    grads = gradient_bytes(sizes, plan, layout)
    buffers = communication_buffer_bytes(arch, sizes, plan, layout, calibration)
    activations: ActivationSizes = activation_sizes(arch, plan, layout, calibration)
    accumulated = grads if plan.grad_accum_steps > 1 else 0.0

    def phase(weights_now: float, grads_now: float, optimizer_now: float, acts: float, logits: float,
              transient: dict[str, float]) -> dict[str, float]:
        return {
            "cuda_context": context,
            "weights": weights_now,
            "gradients": grads_now,
            "optimizer": optimizer_now,
            "activations": acts,
            "logits_and_loss": logits,
            "deepspeed_nccl_buffers": buffers,
            "allocator_slack": allocator_slack_bytes(transient, calibration),
        }

    cache = autocast_cache_bytes(sizes, plan, layout)
    logits = logits_and_loss_bytes(arch, plan, layout, calibration)
    # All gradients exist: the end of backward (a tied embedding's gradient) or the update (its temporaries).
    step_temporary = optimizer_step_temporary_bytes(sizes, plan, layout)
    embedding_gradient = tied_embedding_gradient_bytes(sizes, plan, layout)
    if step_temporary >= embedding_gradient:
        grads_end, optimizer_end = grads, optimizer + step_temporary
    else:
        grads_end, optimizer_end = grads + embedding_gradient, optimizer
    # The churn behind the allocator's slack: activations (their blocks split and reused in backward; more
    # when offloaded ones come back from the host), the plain loss's logits, the gradients of full fine-tuning.
    # Offloaded: QLoRA's reserve is its own kind (a quarter of the churn on the H200, LoRA's three rows 0.53-0.75).
    acts_kind = ("activations" if not plan.offloads_activations
                 else "offloaded_activations_qlora" if plan.method == "qlora" else "offloaded_activations")
    churn = {
        "loss": {acts_kind: activations.at_loss + cache, "plain_ce_logits": logits} if not plan.fused_ce
        else {acts_kind: activations.at_loss + cache + logits},
        "optimizer_step": {"gradients": grads},
        "backward": {acts_kind: activations.in_backward},
    }
    first = max(accumulated, first_gradients_bytes(arch, sizes, plan, layout))
    phases = {
        "loss": phase(weights + cache, accumulated, optimizer, activations.at_loss, logits, churn["loss"]),
        "optimizer_step": phase(weights, grads_end, optimizer_end, 0.0, 0.0, churn["optimizer_step"]),
        "backward": phase(weights, first, optimizer, activations.in_backward, 0.0, churn["backward"]),
    }
    return MemoryPhases(phases=phases, cpu_ram=cpu_ram_bytes(sizes, plan, calibration), sizes=sizes, churn=churn)
