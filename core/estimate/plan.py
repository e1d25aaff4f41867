"""A training plan: what the estimator is asked about (model shape, method, batch, parallelism)."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import EXIT_USAGE, TunedeckError
from core.estimate.architecture import LINEAR_NAMES, ModelArchitecture
from core.i18n import t

# lora_dropout_fused takes 0 < p < this (core.train.lora_dropout_kernel: its keep threshold is a signed argument)
FUSED_DROPOUT_MAX_P = 0.5
# Decoder blocks (model_type) that end ``residual + mlp(norm(h))``: nothing after the MLP's down projection
# reads its output but the block's, so a checkpointed block's recompute need not compute it
# (``recompute_skip_down``, core.train.lora_group).
MLP_ENDS_BLOCK = ("llama", "mistral", "qwen2", "qwen3")
# Adapted linears that read one input and run as one grouped node (core.train.lora_group), the rest alone
LORA_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))

METHODS = ("full", "lora", "dora", "qlora")
# bf16: mixed precision (fp32 trainable weights, bf16 autocast); pure-bf16: everything in bf16;
# fp16: mixed precision with fp16 autocast (GPUs without bf16); fp32: no autocast.
PRECISIONS = ("bf16", "pure-bf16", "fp16", "fp32")
# adamw: torch.optim.AdamW as transformers' "adamw_torch" builds it (foreach: one moment-sized
# temporary during the step); adamw_fused: "adamw_torch_fused" (updates in place).
OPTIMIZERS = ("adamw", "adamw_fused", "adamw_8bit", "paged_adamw_8bit")
# The engine's / transformers' spellings of the same optimizers.
OPTIMIZER_ALIASES = {
    "auto": "adamw_fused",
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw_fused",
    "adamw_bnb_8bit": "adamw_8bit",
}


def normalise_optimizer(name: str) -> str:
    """The estimator's name for an optimizer spelled the engine's or transformers' way."""
    key = name.strip().lower()
    return OPTIMIZER_ALIASES.get(key, key)
OFFLOADS = ("none", "optimizer", "all")
ATTENTIONS = ("sdpa", "eager")


class PlanError(TunedeckError, ValueError):
    """A plan that cannot run as stated (the message says which option to change)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class TrainingPlan:
    """One training configuration. Sizes are per GPU (micro-batch) unless the name says otherwise."""

    architecture: ModelArchitecture
    method: str = "lora"
    precision: str = "bf16"
    micro_batch_size: int = 1
    seq_len: int = 2048
    gradient_checkpointing: bool = True
    # With checkpointing: how many decoder layers are checkpointed (the first N); None = all of them.
    checkpoint_layers: int | None = None
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = LINEAR_NAMES
    lora_dropout: float = 0.05
    fused_ce: bool = True
    # Which fused cross-entropy: "liger" (Liger's kernels: fused linear CE + RMSNorm + SwiGLU, CUDA),
    # "triton" (core.train.linear_ce_kernel: the same chunks and memory as Liger's fused CE, with Liger's other
    # kernels) or "chunked" (tunedeck's own, core.train.fused_loss: checkpointed chunks of logits, no other
    # kernels).
    fused_ce_impl: str = "triton"  # the engine's auto on a GPU with Liger installed
    # The tokens a chunk of tunedeck's fused losses makes logits for (run key ``ce_chunk_tokens``); None: the loss's
    # own rule (``ce_chunk`` says which applies).
    ce_chunk_tokens: int | None = None
    # The engine's default ("auto") on a GPU is the fused AdamW: plans are for GPUs, so that is the default.
    optimizer: str = "adamw_fused"
    num_gpus: int = 1
    zero_stage: int = 0
    offload: str = "none"
    grad_accum_steps: int = 1
    attention: str = "sdpa"
    # QLoRA's plain recipe (peft.prepare_model_for_kbit_training) upcasts every non-quantised
    # parameter (embedding, LM head, norms) to fp32; the engine's default (qlora_upcast: false) keeps
    # them, and so the activations, in bf16.
    kbit_upcast: bool = False
    # peft's cast of every LoRA layer's input to the adapter's dtype (fp32) before its dropout and lora_A
    # (run key ``lora_input_upcast``, core.train.engine_switches); the engine's default keeps it in bf16.
    # The plain peft recipe upcasts. Speed only: a full-size fp32 copy per LoRA input and pass.
    lora_input_upcast: bool = False
    # The LoRA linears that share an input run as one autograd node (run key ``lora_grouped``,
    # core.train.lora_group; the engine's default for LoRA and QLoRA). Speed only: with ``false`` the fused
    # add copies every adapted linear's output (core.estimate.speed.lora_input_bytes).
    lora_grouped: bool = True
    # A group's LoRA dropout inside its lora_A kernels, the masks hashed again in backward (run key
    # ``lora_dropout_fused``, core.train.lora_dropout_kernel; the engine's default on GPUs): no dropped-out
    # copy or mask is kept, and the kernels' work replaces peft's dropout traffic. ``dropout_fused`` says
    # when it applies.
    lora_dropout_fused: bool = True
    # The gate/up LoRA updates added inside the SwiGLU kernel instead of the lora_B matmuls (run key
    # ``lora_swiglu_fused``, core.train.lora_swiglu_kernel; GPUs only). Speed only: the
    # adds' read and write of the gate and up outputs go (``swiglu_fused`` says when it applies).
    lora_swiglu_fused: bool = True
    # The down projection's LoRA input work (dropout, lora_A, their gradients) inside those SwiGLU kernels (run key
    # ``lora_swiglu_down``, core.train.lora_group): the down projection keeps no input, and the fused dropout
    # kernels never run over it (``swiglu_down`` says when it applies).
    lora_swiglu_down: bool = True
    # With it, the gate/up adapters' B gradients summed in the SwiGLU backward kernel instead of two skinny matmuls
    # that read d gate and d up again (run key ``lora_swiglu_db``; ``swiglu_db`` says when it applies).
    lora_swiglu_db: bool = True
    # LoRA: the adapters' dh of q/k/v, gate/up and a down projection in the SwiGLU kernels made by the base's
    # input-gradient matmul, each base weight in a buffer with a slot for its group's s B (run key ``lora_fold_dh``,
    # core.train.lora_group): the separate skinny matmuls' read of each output gradient goes (``folded_dh``).
    lora_fold_dh: bool = True
    # QLoRA: checkpointed blocks keep the weights their recompute dequantises for backward (run key
    # ``qlora_reuse_dequantised``, core.train.lora_group): one dequantisation pass less, one
    # block's weights in the compute dtype more at the peak (``reuses_dequantised`` says when it applies).
    qlora_reuse_dequantised: bool = True
    # LoRA/QLoRA: a checkpointed block's recompute skips the frozen down-projection matmul, whose output only
    # the discarded block output reads (run key ``recompute_skip_down``, core.train.lora_group;
    # ``skips_down_recompute`` says when it applies).
    recompute_skip_down: bool = True
    # LoRA/QLoRA with the fused dropout kernels: checkpointed blocks keep the kernels' lora_A products of the
    # first forward for the recompute (run key ``recompute_keep_lora_a``, core.train.lora_group): the forward
    # kernels run once, for tokens x ranks kept a block (``keeps_lora_a`` says when it applies).
    recompute_keep_lora_a: bool = False
    # LoRA/QLoRA with Liger's norms (the fused loss on a GPU): the frozen RMSNorms' backward one program a row
    # (run key ``rms_norm_rows``, core.train.rms_norm_kernel; ``norm_rows`` says when it applies).
    rms_norm_rows: bool = True
    # Gradient checkpointing with the kept block inputs in host memory (core.train.offload).
    offload_activations: bool = False
    # The MLP over sequence tiles (core.train.tiled_mlp): "auto" (checkpointed blocks, long micro-batches),
    # "false", or a tile count (every block).
    tiled_mlp: str | int = "auto"
    dataset_tokens: int | None = None
    # The share of the data's tokens that have a target (core.plan.dataset.DatasetSummary.target_share): the
    # engine's own fused losses ("triton", "chunked") send only those rows through the LM head
    # (core.train.fused_loss.target_rows); ``lm_head_share`` says what the LM head reads.
    target_share: float = 1.0
    price_per_gpu_hour: float | None = None
    # Set when the parameter count was checked on the meta device (then it wins over the analytic one).
    exact_total_params: int | None = field(default=None, compare=False)

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch_size * self.seq_len

    @property
    def checkpointed_layers(self) -> int:
        """Decoder layers whose activations are recomputed in backward (0 without checkpointing)."""
        if not self.gradient_checkpointing:
            return 0
        layers = self.architecture.num_layers
        return layers if self.checkpoint_layers is None else max(0, min(layers, self.checkpoint_layers))

    def mlp_tiles(self, checkpointed: bool) -> int:
        """Tiles the MLP of a block runs in (1: plain); ``auto`` tiles checkpointed blocks only."""
        from core.train.tiled_mlp import tiles_for  # light: no torch at import

        if (self.tiled_mlp == "auto" and not checkpointed) or self.num_gpus > 1 or self.zero_stage > 0:
            return 1  # the engine tiles one-GPU runs without ZeRO only
        return tiles_for(self.tiled_mlp, self.tokens_per_micro_batch, self.architecture.hidden_size)

    @property
    def tiles_mlp(self) -> bool:
        """Whether any decoder block runs its MLP in tiles (checkpointed ones and the others, as above)."""
        checkpointed = self.checkpointed_layers
        return (checkpointed > 0 and self.mlp_tiles(True) > 1) or \
            (checkpointed < self.architecture.num_layers and self.mlp_tiles(False) > 1)

    @property
    def recompute_fraction(self) -> float:
        """Share of the decoder layers recomputed in backward: 1 with full checkpointing, 0 without."""
        return self.checkpointed_layers / max(1, self.architecture.num_layers)

    @property
    def offloads_activations(self) -> bool:
        """Kept block inputs parked in host memory: ``offload_activations`` does so only with checkpointing."""
        return self.offload_activations and self.gradient_checkpointing

    @property
    def chunked_ce(self) -> bool:
        """The chunked cross-entropy (``core.train.fused_loss``): checkpointed chunks of fp32 logits, no Liger."""
        return self.fused_ce and self.fused_ce_impl == "chunked"

    @property
    def triton_ce(self) -> bool:
        """tunedeck's fused LM head and loss kernel (``core.train.linear_ce_kernel``) runs: ``fused_ce_impl``
        "triton" with a frozen LM head; a trained one (full fine-tuning) takes the model's own loss, Liger's."""
        return self.fused_ce and self.fused_ce_impl == "triton" and self.method != "full"

    @property
    def ce_chunk(self) -> int:
        """Tokens a chunk of the fused loss makes logits for: ``ce_chunk_tokens`` under tunedeck's own losses
        (``triton_ce``, ``chunked_ce``), else (and by default) the loss's rule: Liger's (about the hidden states' size of
        logits) or the chunked loss's (``core.train.fused_loss``); at most the micro-batch's tokens."""
        from core.train.fused_loss import chunk_tokens_for, fused_chunk_tokens  # light: no torch at import

        tokens = self.tokens_per_micro_batch
        if self.ce_chunk_tokens and (self.triton_ce or self.chunked_ce):
            return max(1, min(tokens, self.ce_chunk_tokens))
        if self.chunked_ce:
            return min(tokens, chunk_tokens_for(self.architecture.vocab_size))
        return fused_chunk_tokens(tokens, self.architecture.vocab_size, self.architecture.hidden_size)

    @property
    def liger_kernels(self) -> bool:
        """Liger's fused RMSNorm/SwiGLU come with its fused CE; the chunked CE changes only the loss."""
        return self.fused_ce and not self.chunked_ce

    @property
    def lm_head_share(self) -> float:
        """The share of the tokens the LM head reads: those with a target under tunedeck's fused losses, every
        one under Liger's loss and the model's own."""
        if self.fused_ce and self.fused_ce_impl in ("triton", "chunked"):
            return min(1.0, max(0.0, self.target_share))
        return 1.0

    @property
    def uses_lora(self) -> bool:
        return self.method in ("lora", "dora", "qlora")

    @property
    def fp32_lora_inputs(self) -> bool:
        """Whether the adapted linears get fp32 inputs under autocast: peft's cast (``lora_input_upcast``), or
        QLoRA's fp32 residual stream (``qlora_upcast``). The engine's grouped node, its kernels and its fused
        add leave such a linear to peft (``core.train.lora_group``, ``engine_switches``)."""
        return self.lora_input_upcast or self.qlora_upcast

    @property
    def qlora_upcast(self) -> bool:
        """QLoRA with peft's fp32 upcast of the non-quantised weights (run key ``qlora_upcast``)."""
        return self.method == "qlora" and bool(self.kbit_upcast)

    @property
    def dropout_fused(self) -> bool:
        """Whether this plan's LoRA dropout runs in the fused kernels, as ``core.train.model_setup``'s
        ``lora_dropout_fusing`` decides (grouped LoRA/QLoRA, no input upcast, 0 < p < 0.5)."""
        return (self.method in ("lora", "qlora") and self.lora_grouped and self.lora_dropout_fused
                and not self.fp32_lora_inputs and 0.0 < self.lora_dropout < FUSED_DROPOUT_MAX_P)

    @property
    def swiglu_fused(self) -> bool:
        """Whether this plan's gate/up LoRA updates are added in the SwiGLU kernel, as ``core.train.model_setup``'s
        ``lora_swiglu_fusing`` decides (grouped LoRA/QLoRA without the input upcast, both projections adapted)."""
        return (self.method in ("lora", "qlora") and self.lora_grouped and self.lora_swiglu_fused
                and not self.fp32_lora_inputs and {"gate_proj", "up_proj"} <= set(self.lora_targets))

    @property
    def swiglu_down(self) -> bool:
        """Whether this plan's down projection takes its ``lora_A`` product from the fused SwiGLU kernels, as
        ``core.train.lora_group``'s ``given_spec`` decides (the SwiGLU fused, ``down_proj`` adapted, its dropout
        none or the fused kernels')."""
        return (self.swiglu_fused and self.lora_swiglu_down and "down_proj" in self.lora_targets
                and (self.lora_dropout == 0 or self.dropout_fused))

    @property
    def swiglu_db(self) -> bool:
        """Whether the SwiGLU backward kernel sums the gate/up adapters' B gradients (``lora_swiglu_db``): where the
        down projection's LoRA input work is inside it (``core.train.lora_group``'s ``swiglu``)."""
        return self.swiglu_down and self.lora_swiglu_db

    @property
    def folded_dh(self) -> tuple[str, ...]:
        """The adapted linears whose adapters' dh the base matmul makes, as ``core.train.lora_group``'s
        ``home_lora_bases`` decides (grouped LoRA on a GPU's engine: q/k/v and gate/up where two or more of a group
        are adapted, down where ``swiglu_down``); () where it does not run."""
        if not (self.method == "lora" and self.lora_fold_dh and self.lora_grouped and not self.fp32_lora_inputs):
            return ()
        targets = set(self.lora_targets)
        names = [name for group in LORA_SIBLINGS if len(targets & set(group)) > 1 for name in group if name in targets]
        return tuple(names + (["down_proj"] if self.swiglu_down else []))

    @property
    def reuses_dequantised(self) -> bool:
        """Whether this plan's checkpointed blocks keep their dequantised weights for backward, as
        ``core.train.model_setup``'s ``dequantised_reusing`` decides (grouped QLoRA, checkpointing)."""
        return (self.method == "qlora" and self.qlora_reuse_dequantised and self.lora_grouped
                and not self.fp32_lora_inputs and self.checkpointed_layers > 0)

    @property
    def skips_down_recompute(self) -> bool:
        """Whether this plan's checkpointed blocks recompute without the down projection's frozen matmul, as
        ``core.train.model_setup``'s ``down_skipping`` decides (grouped LoRA/QLoRA, an adapted ``down_proj``,
        checkpointing, a block that ends with its MLP)."""
        return (self.method in ("lora", "qlora") and self.recompute_skip_down and self.lora_grouped
                and not self.fp32_lora_inputs and "down_proj" in self.lora_targets and self.checkpointed_layers > 0
                and self.architecture.model_type in MLP_ENDS_BLOCK)

    @property
    def keeps_lora_a(self) -> bool:
        """Whether this plan's checkpointed blocks keep the fused dropout kernels' lora_A products for their
        recompute, as ``core.train.model_setup``'s ``lora_a_keeping`` decides (the fused kernels, checkpointing)."""
        return self.recompute_keep_lora_a and self.dropout_fused and self.checkpointed_layers > 0

    @property
    def norm_rows(self) -> bool:
        """Whether this plan's RMSNorms run ``core.train.rms_norm_kernel``'s row kernels, as ``core.train.model_setup``'s
        ``rms_norm_rows_using`` decides (LoRA/QLoRA with Liger's norms: the fused loss, on a GPU) for the blocks
        Liger gives its Llama casting (Llama, Mistral, Qwen2, Qwen3)."""
        return (self.method in ("lora", "qlora") and self.rms_norm_rows and self.liger_kernels
                and self.architecture.model_type in MLP_ENDS_BLOCK)

    @property
    def lora_input_kept_once(self) -> bool:
        """Whether a group of adapted linears keeps its input once for backward (``core.train.lora_group``'s
        node without dropout, or with the fused dropout kernels) instead of a copy (and a mask) each."""
        return (self.method in ("lora", "qlora") and self.lora_grouped and not self.fp32_lora_inputs
                and (self.lora_dropout == 0 or self.dropout_fused))

    @property
    def uses_deepspeed(self) -> bool:
        return self.zero_stage >= 1

    @property
    def mixed_precision(self) -> bool:
        return self.precision in ("bf16", "fp16")

    def validate(self, gpu_bf16: bool | None = None) -> None:
        """Raise ``PlanError`` for an impossible combination; ``gpu_bf16`` checks bf16 support."""
        checks: list[tuple[bool, str, dict[str, object]]] = [
            (self.method in METHODS, "estimate.error.choice", {"option": "--method", "value": self.method, "choices": ", ".join(METHODS)}),
            (self.precision in PRECISIONS, "estimate.error.choice", {"option": "--precision", "value": self.precision, "choices": ", ".join(PRECISIONS)}),
            (self.optimizer in OPTIMIZERS, "estimate.error.choice", {"option": "--optimizer", "value": self.optimizer, "choices": ", ".join(OPTIMIZERS)}),
            (self.offload in OFFLOADS, "estimate.error.choice", {"option": "--offload", "value": self.offload, "choices": ", ".join(OFFLOADS)}),
            (self.attention in ATTENTIONS, "estimate.error.choice", {"option": "--attention", "value": self.attention, "choices": ", ".join(ATTENTIONS)}),
            (self.zero_stage in (0, 1, 2, 3), "estimate.error.choice", {"option": "--zero", "value": self.zero_stage, "choices": "0, 1, 2, 3"}),
        ]
        for ok, key, params in checks:
            if not ok:
                raise PlanError(t(key, **params))
        for option, value in (("--batch-size", self.micro_batch_size), ("--seq-len", self.seq_len),
                              ("--gpus", self.num_gpus), ("--grad-accum", self.grad_accum_steps)):
            if value < 1:
                raise PlanError(t("estimate.error.positive", option=option, value=value))
        if self.uses_lora and self.lora_rank < 1:
            raise PlanError(t("estimate.error.positive", option="--lora-rank", value=self.lora_rank))
        if not 0.0 <= self.lora_dropout < 1.0:
            raise PlanError(t("estimate.error.dropout", value=self.lora_dropout))
        if self.offload != "none" and self.zero_stage == 0:
            raise PlanError(t("estimate.error.offload_needs_zero", offload=self.offload))
        if self.offload == "all" and self.zero_stage != 3:
            raise PlanError(t("estimate.error.offload_all_needs_zero3"))
        if self.offload != "none" and self.optimizer not in ("adamw", "adamw_fused"):
            raise PlanError(t("estimate.error.offload_optimizer", optimizer=self.optimizer))
        if self.method == "qlora" and self.precision in ("fp32",):
            raise PlanError(t("estimate.error.qlora_precision", precision=self.precision))
        if gpu_bf16 is False and self.precision in ("bf16", "pure-bf16"):
            raise PlanError(t("estimate.error.no_bf16", precision=self.precision))
