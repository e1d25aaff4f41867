"""Activation memory: the tensors autograd saves for the backward pass of a Llama-style block.

Counted tensor by tensor from what PyTorch's autograd formulas keep for transformers' Llama/Qwen code
(bytes per token unless noted), for SDPA/flash attention that never materialises the s x s matrix:

- RMSNorm: ``x.float().pow(2)`` keeps the fp32 input (4h) and the fp32 reciprocal RMS (4); when the
  norm weight trains, the multiply keeps the normalised input too (residual dtype x h).
- A linear keeps its input only when its weight trains (full fine-tuning). Under autocast an fp32
  input is cast separately for each linear, so each keeps its own copy; a same-dtype input is shared.
- A LoRA-targeted linear: peft casts the input to the adapter dtype (fp32), dropout keeps a 1-byte
  mask, lora_A keeps its (autocast) input copy and lora_B keeps lora_A's output (r values). The engine's
  grouped linears (``lora_input_kept_once``: no dropout, or the fused dropout kernels) keep a group's input
  once and lora_A's outputs.
- Attention: the roped q, k, v and the output are kept by SDPA. Flash and memory-efficient kernels
  write the output in (batch, seq, heads, dim) order, so making its transpose contiguous for o_proj
  copies nothing: o_proj's input costs nothing more unless a cast (LoRA under autocast) copies it.
- Gated MLP: SiLU keeps the gate output, the product keeps silu(gate) and up: 3 x f values.
- DoRA keeps the base and LoRA outputs for its magnitude scaling (2 x out per target); with dropout
  it recomputes the base output from a dropped-out input, and on peft's fp32 inputs (``lora_input_upcast``)
  keeps a compute-dtype weight copy for it.

With ``fused_ce`` the engine turns on Liger's kernels together (it passes ``use_liger_kernel`` to the
Trainer): its RMSNorm keeps only the input and one fp32 scale per row, its SwiGLU keeps gate and up and
recomputes SiLU in backward, and its fused linear cross-entropy needs no saved LM-head input.
The chunked cross-entropy (``fused_ce_impl="chunked"``) changes only the loss: its checkpointed chunks
keep the final norm's output (the LM head's input) and nothing else.

With gradient checkpointing only each block's input is kept, plus the block being recomputed and
its gradients. Backward of a block also needs gradient temporaries (calibrated, see calibration.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.estimate.architecture import LinearShape, ModelArchitecture
from core.estimate.calibration import Calibration
from core.estimate.plan import TrainingPlan
from core.estimate.precision import PrecisionLayout


@dataclass(frozen=True)
class BlockActivations:
    """Activation bytes of one decoder block: per token, plus a part that does not scale with tokens."""

    per_token: float
    per_block: float = 0.0

    def total(self, tokens: int) -> float:
        return self.per_token * tokens + self.per_block


def rmsnorm_saved_bytes(width: int, input_bytes: float, weight_trains: bool, fused: bool = False,
                        rows: int = 1) -> float:
    """Bytes per token an RMSNorm keeps: the fp32 input for pow and one fp32 reciprocal RMS per row
    (``rows`` > 1 for per-head norms), + the normalised input if its weight trains.

    Liger's fused RMSNorm keeps the input as it is and the reciprocal RMS.
    """
    if fused:
        return input_bytes * width + 4.0 * rows
    saved = 4.0 * width + 4.0 * rows
    if weight_trains:
        saved += input_bytes * width
    return saved


def linear_group_saved_bytes(
    shapes: list[LinearShape],
    input_bytes: float,
    plan: TrainingPlan,
    layout: PrecisionLayout,
    input_already_kept: bool = False,
) -> float:
    """Bytes per token kept for the inputs of linears that read the same tensor (q/k/v, or gate/up).

    ``input_already_kept``: another op keeps this very tensor (o_proj's input is SDPA's output), so
    sharing it costs nothing; casts and dropout still make new tensors.
    """
    width = shapes[0].in_features
    autocast = plan.precision != "fp32"
    saved = 0.0
    shared_input_kept = False
    for shape in shapes:
        if plan.method == "full":
            if autocast and input_bytes != layout.compute:
                saved += layout.compute * width  # a separate autocast copy per linear
            else:
                shared_input_kept = True
        elif shape.name in plan.lora_targets:
            saved += (layout.compute if autocast else 4.0) * plan.lora_rank  # lora_A's output, kept by lora_B
            if plan.lora_input_kept_once:  # grouped: no dropout, or the fused kernels' masks drawn again
                shared_input_kept = True
                continue
            if plan.lora_dropout > 0:
                saved += 1.0 * width  # dropout mask
            if autocast:
                saved += layout.compute * width  # lora_A's autocast copy of the fp32 input
            elif plan.lora_dropout > 0:
                saved += 4.0 * width  # the dropped-out fp32 input itself
            else:
                shared_input_kept = True
    if shared_input_kept and not input_already_kept:
        saved += input_bytes * width
    return saved


def dora_saved_bytes(shapes: list[LinearShape], plan: TrainingPlan, layout: PrecisionLayout) -> BlockActivations:
    """DoRA's extra saved tensors for the targeted linears of one block."""
    per_token = 0.0
    per_block = 0.0
    for shape in shapes:
        if shape.name not in plan.lora_targets:
            continue
        per_token += 2 * layout.compute * shape.out_features
        if plan.lora_dropout > 0 and plan.lora_input_upcast and plan.precision != "fp32":
            # F.linear(dropout(x), W.to(x.dtype)) for the base output: on peft's fp32 input W becomes an fp32
            # copy that autocast casts back and keeps for backward (per block). On the engine's bf16 input
            # W is kept as it is: nothing more (measured: 12 GiB less on a 7B without checkpointing).
            per_block += layout.compute * shape.weight_params
    return BlockActivations(per_token, per_block)


def dora_transient_bytes(arch: ModelArchitecture, plan: TrainingPlan) -> float:
    """DoRA's weight-norm computation, one linear at a time: copies of the targeted weight, and the in x in
    identity (in the adapters' fp32, + autocast's bf16 cast) peft pushes through lora_A/lora_B to get B @ A."""
    sizes = [12.0 * shape.weight_params + 6.0 * shape.in_features**2
             for shape in arch.linear_shapes() if shape.name in plan.lora_targets]
    return max(sizes) if sizes else 0.0


def upcast_gradient_bytes(arch: ModelArchitecture, plan: TrainingPlan, recomputed: bool) -> float:
    """Bytes per token fp32 inputs to the adapted linears (``lora_input_upcast``'s cast, ``qlora_upcast``'s fp32
    residual stream: ``TrainingPlan.fp32_lora_inputs``) add to a block's backward, per element of the widest
    adapted input: its fp32 gradient (4 B), and in a recomputed block the fp32 input made again (4 B more).
    Measured: +1.15 GiB at 8k tokens on a checkpointed 7B (widest: the down projection's 18,944) on the H200
    with ``lora_input_upcast``, 4 B per element without checkpointing on the CPU's tiny blocks (MemTracker);
    with ``qlora_upcast`` the same row's peak (memory.txt) held four fp32 tokens x 18,944 tensors, two of them
    gate and up (``mlp_core_bytes``)."""
    if not (plan.uses_lora and plan.fp32_lora_inputs and plan.precision != "fp32"):
        return 0.0
    widths = [shape.in_features for shape in arch.linear_shapes() if shape.name in plan.lora_targets]
    return (8.0 if recomputed else 4.0) * max(widths) if widths else 0.0


def attention_core_bytes(arch: ModelArchitecture, plan: TrainingPlan, layout: PrecisionLayout,
                         calibration: Calibration) -> float:
    """Bytes per token kept by rotary embedding + attention (q, k, v, output, log-sum-exp)."""
    c = layout.compute
    kv_width = arch.q_dim if calibration.sdpa_expands_kv else arch.kv_dim
    saved = c * arch.q_dim + 2 * c * kv_width + c * arch.q_dim + 4.0 * arch.num_heads
    if arch.qk_norm:
        # Qwen3 normalises q and k per head before RoPE: fp32 inputs, + normalised inputs if training.
        saved += rmsnorm_saved_bytes(arch.q_dim + arch.kv_dim, c, plan.method == "full", plan.liger_kernels,
                                     rows=arch.num_heads + arch.num_kv_heads)
    if plan.attention == "eager":
        saved += calibration.eager_attention_bytes_per_score * arch.num_heads * plan.seq_len
    return saved


def mlp_core_bytes(arch: ModelArchitecture, plan: TrainingPlan, layout: PrecisionLayout) -> float:
    """Bytes per token kept by SiLU(gate) x up: gate output, its SiLU and up output (Liger: gate and up). Under
    ``qlora_upcast`` they are fp32: bitsandbytes returns a 4-bit linear's output in its input's dtype, the fp32 of
    the upcast residual stream (memory.txt of the 7B row at b4 x 2048: four fp32 tokens x intermediate tensors
    live at the peak)."""
    kept = 2 if plan.liger_kernels else 3
    width = layout.residual if plan.qlora_upcast else layout.compute
    return kept * width * arch.intermediate_size


def mlp_saved_bytes(arch: ModelArchitecture, plan: TrainingPlan, layout: PrecisionLayout) -> float:
    """Bytes per token the MLP (gate/up, the gated product, down) keeps for backward."""
    shapes = {shape.name: shape for shape in arch.linear_shapes()}
    norm_out = max(layout.norm_weight, layout.residual)
    # lora_swiglu_down: lora_A's output only; backward recomputes the product from gate and up
    down = layout.compute * plan.lora_rank if plan.swiglu_down else \
        linear_group_saved_bytes([shapes["down_proj"]], layout.compute, plan, layout)
    return (linear_group_saved_bytes([shapes["gate_proj"], shapes["up_proj"]], norm_out, plan, layout)
            + mlp_core_bytes(arch, plan, layout) + down)


def block_activations(arch: ModelArchitecture, plan: TrainingPlan, layout: PrecisionLayout,
                      calibration: Calibration, tiles: int = 1) -> BlockActivations:
    """All activations one decoder block keeps for backward, without checkpointing. With the MLP over
    ``tiles`` tiles (``tiled_mlp``) the block keeps only the MLP's input; one tile's share of the MLP's
    tensors exists only while that tile is back-propagated (``activation_sizes`` adds it there)."""
    shapes = {shape.name: shape for shape in arch.linear_shapes()}
    full = plan.method == "full"
    norm_out = max(layout.norm_weight, layout.residual)
    per_token = 0.0
    per_token += rmsnorm_saved_bytes(arch.hidden_size, layout.residual, full, plan.liger_kernels)
    per_token += linear_group_saved_bytes([shapes["q_proj"], shapes["k_proj"], shapes["v_proj"]], norm_out, plan, layout)
    per_token += attention_core_bytes(arch, plan, layout, calibration)
    per_token += linear_group_saved_bytes([shapes["o_proj"]], layout.compute, plan, layout,
                                          input_already_kept=plan.attention == "sdpa")
    per_token += rmsnorm_saved_bytes(arch.hidden_size, layout.residual, full, plan.liger_kernels)
    per_token += mlp_saved_bytes(arch, plan, layout) if tiles <= 1 else norm_out * arch.hidden_size
    block = BlockActivations(per_token)
    if plan.method == "dora":
        extra = dora_saved_bytes(list(shapes.values()), plan, layout)
        block = BlockActivations(block.per_token + extra.per_token, extra.per_block)
    return block


def head_activation_bytes(arch: ModelArchitecture, plan: TrainingPlan, layout: PrecisionLayout) -> float:
    """Bytes per token kept after the last block: the final norm, and the LM head's input if it trains.

    The fused cross-entropy computes its gradients in the forward pass and keeps no input.
    """
    full = plan.method == "full"
    saved = rmsnorm_saved_bytes(arch.hidden_size, layout.residual, full, plan.liger_kernels)
    if plan.fused_ce and not plan.liger_kernels:
        saved += max(layout.norm_weight, layout.residual) * arch.hidden_size  # the chunks' checkpointed input
    elif full and not plan.fused_ce:
        norm_out = max(layout.norm_weight, layout.residual)
        lm_input_cast = plan.precision != "fp32" and norm_out != layout.compute
        saved += (layout.compute if lm_input_cast else norm_out) * arch.hidden_size
    return saved


@dataclass(frozen=True)
class ActivationSizes:
    """Activation bytes at the two moments that can set the peak (per GPU, one micro-batch)."""

    at_loss: float  # everything saved when the forward pass ends and the loss is computed
    in_backward: float  # while the last block is recomputed and back-propagated (checkpointing)


def recompute_key(plan: TrainingPlan) -> str:
    """The key of ``Calibration.checkpoint_recompute_layers`` for a plan: its method, and for LoRA and QLoRA
    whether the engine's grouped node runs them (``_fused``: its input kept once, the fused kernels). On the H200
    the grouped rows' recompute held 1.39-1.97 blocks' worth of their (smaller) activations, peft's own 1.20-1.30."""
    return f"{plan.method}_fused" if plan.lora_input_kept_once else plan.method


def recompute_layers(plan: TrainingPlan, calibration: Calibration) -> float:
    """Blocks' worth of activations a checkpointed block's recomputation and backward hold, for this plan."""
    return calibration.checkpoint_recompute_layers[recompute_key(plan)]


def activation_sizes(arch: ModelArchitecture, plan: TrainingPlan, layout: PrecisionLayout,
                     calibration: Calibration) -> ActivationSizes:
    """Saved activations at the loss, and the working set of backward under checkpointing."""
    tokens = plan.tokens_per_micro_batch
    checkpointed = plan.checkpointed_layers
    tiles_kept, tiles_recomputed = plan.mlp_tiles(False), plan.mlp_tiles(True)
    kept_block = block_activations(arch, plan, layout, calibration, tiles_kept)  # layers not checkpointed
    head = head_activation_bytes(arch, plan, layout) * tokens
    dora_transient = dora_transient_bytes(arch, plan) if plan.method == "dora" else 0.0
    # The backward's gradient temporaries scale with the MLP's width, over one tile when it is tiled; so
    # does the tile being back-propagated.
    working_per_token = calibration.backward_working_bytes_per_intermediate[plan.method] * arch.intermediate_size
    if not checkpointed:
        tile = mlp_saved_bytes(arch, plan, layout) * tokens / tiles_kept if tiles_kept > 1 else 0.0
        at_loss = arch.num_layers * kept_block.total(tokens) + head + dora_transient
        working = (working_per_token / tiles_kept + upcast_gradient_bytes(arch, plan, False)) * tokens
        if plan.attention == "eager":
            # the last block's softmax backward: the scores' fp32 gradient and its bf16 cast, as many bytes per
            # score as the forward keeps (checkpointing counts them in the recomputed block's factor)
            working += calibration.eager_attention_bytes_per_score * arch.num_heads * plan.seq_len * tokens
        return ActivationSizes(at_loss=at_loss, in_backward=at_loss + tile + working)
    # offload_activations parks the kept block inputs in host memory: two stay on the GPU, the input of the
    # block being recomputed and the next one's, prefetched (core.train.offload).
    kept_inputs = min(checkpointed, 2 if plan.offloads_activations else checkpointed) * layout.residual \
        * arch.hidden_size * tokens
    if plan.keeps_lora_a:  # each checkpointed block's lora_A products, kept from its forward to its recompute
        keepers = len(plan.lora_targets) - (1 if plan.swiglu_down else 0)  # (the down's are made in the SwiGLU)
        kept_inputs += checkpointed * plan.lora_rank * keepers * layout.compute * tokens
    block = block_activations(arch, plan, layout, calibration, tiles_recomputed)
    if tiles_recomputed > 1:
        block = BlockActivations(block.per_token + mlp_saved_bytes(arch, plan, layout) / tiles_recomputed,
                                 block.per_block)
    working = working_per_token * tokens / tiles_recomputed
    # DoRA's weight norms run during the block's recomputation, before its backward: they overlap the part of
    # the block recomputed by then, not the backward's gradients.
    recompute = max(recompute_layers(plan, calibration) * block.total(tokens),
                    block.total(tokens) + dora_transient) + upcast_gradient_bytes(arch, plan, True) * tokens
    if plan.reuses_dequantised:  # the recomputed block's adapted weights, dequantised, kept for its backward
        recompute += layout.compute * sum(shape.weight_params for shape in arch.linear_shapes()
                                          if shape.name in plan.lora_targets)
    # checkpoint_layers < all: the last layers keep everything and are back-propagated first (their
    # activations freed as it goes), the checkpointed first ones are recomputed after.
    kept_whole = (arch.num_layers - checkpointed) * kept_block.total(tokens)
    at_loss = kept_inputs + kept_whole + head
    in_backward = kept_inputs + recompute if not kept_whole else max(at_loss + working, kept_inputs + recompute)
    return ActivationSizes(at_loss=at_loss, in_backward=in_backward)
