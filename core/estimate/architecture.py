"""The shape of a decoder-only model, read from its ``config.json``, and its parameter counts.

Counts are analytic for the Llama-style decoder families (Llama, Mistral, Qwen2, Qwen3 and the dense
DeepSeek models, which reuse the Llama and Qwen2 code): token embedding, per layer the attention
projections q/k/v/o (grouped-query attention, with the biases the family has), Qwen3's per-head q/k
norms, the gated MLP gate/up/down and two RMSNorms, then a final norm and the LM head unless it is tied
to the embedding. ``core.estimate.exact_count`` checks these against transformers on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import t

# Families whose layer layout we know exactly: model_type -> (q/k/v bias, o bias, q/k norm).
# ``None`` means "read it from the config's attention_bias key" (Llama: default False).
_FAMILY_LAYOUT: dict[str, tuple[bool | None, bool, bool]] = {
    "llama": (None, False, False),
    "mistral": (False, False, False),
    "qwen2": (True, False, False),
    "qwen3": (None, False, True),
}

# Linear layers of one decoder block, in the names peft and LLaMA-Factory use for LoRA targets.
LINEAR_NAMES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ArchitectureError(TunedeckError, ValueError):
    """A config.json that does not describe a decoder model we can size."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class LinearShape:
    """One linear layer of a decoder block: ``in_features -> out_features``, with or without bias."""

    name: str
    in_features: int
    out_features: int
    bias: bool

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features

    @property
    def params(self) -> int:
        return self.weight_params + (self.out_features if self.bias else 0)


@dataclass(frozen=True)
class ModelArchitecture:
    """What the estimator needs to know about a model, all from its config.json."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    max_position_embeddings: int | None = None
    known_family: bool = True
    # The positions the model takes: ``max_position_embeddings``, extended by its config's ``rope_scaling``
    # (``supported_positions``); None: the config gives none.
    positions: int | None = None
    # where the config.json was read (``ModelConfig.source``): a plan says when it is only a hub's config, the
    # weights not downloaded yet; no part of the model's shape
    source: str = field(default="", compare=False)

    @property
    def q_dim(self) -> int:
        """Width of the query projection output (heads x head_dim)."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of each of the key and value projection outputs."""
        return self.num_kv_heads * self.head_dim

    def linear_shapes(self) -> tuple[LinearShape, ...]:
        """The seven linear layers of one decoder block."""
        h, f = self.hidden_size, self.intermediate_size
        return (
            LinearShape("q_proj", h, self.q_dim, self.qkv_bias),
            LinearShape("k_proj", h, self.kv_dim, self.qkv_bias),
            LinearShape("v_proj", h, self.kv_dim, self.qkv_bias),
            LinearShape("o_proj", self.q_dim, h, self.o_bias),
            LinearShape("gate_proj", h, f, self.mlp_bias),
            LinearShape("up_proj", h, f, self.mlp_bias),
            LinearShape("down_proj", f, h, self.mlp_bias),
        )


def _require_int(config: Mapping[str, Any], key: str, source: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ArchitectureError(t("estimate.error.config_key", source=source, key=key, value=value))
    return value


def supported_positions(config: Mapping[str, Any]) -> int | None:
    """The positions a model takes: ``max_position_embeddings``, or more where ``rope_scaling`` stretches an
    ``original_max_position_embeddings`` past it (Qwen's YaRN: ``factor`` 4 over 32,768 takes 131,072); None
    when the config says none. A scaling that names no original is not multiplied again: Gemma 3 and Llama 3
    give ``max_position_embeddings`` already stretched, and an understated limit is only a default a user may
    pass (with a warning), where an overstated one plans records the model cannot place."""
    trained = config.get("max_position_embeddings")
    if not isinstance(trained, int) or isinstance(trained, bool) or trained <= 0:
        return None
    scaling = config.get("rope_scaling")
    if not isinstance(scaling, Mapping):
        return trained
    factor = scaling.get("factor")
    original = scaling.get("original_max_position_embeddings")
    if (isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 1
            and isinstance(original, int) and not isinstance(original, bool) and original > 0):
        return max(trained, int(original * factor))
    return trained


def architecture_from_config(config: Mapping[str, Any], name: str = "", source: str = "config.json") -> ModelArchitecture:
    """Read a ``ModelArchitecture`` from a transformers ``config.json`` mapping.

    Multimodal configs that nest the language model under ``text_config`` are read from there. A
    ``model_type`` outside the known families is sized as a Llama-style decoder and flagged with
    ``known_family=False`` so the caller can say the count is approximate.
    """
    if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]
    model_type = str(config.get("model_type") or "")
    if not model_type:
        raise ArchitectureError(t("estimate.error.config_key", source=source, key="model_type", value=None))
    hidden = _require_int(config, "hidden_size", source)
    heads = _require_int(config, "num_attention_heads", source)
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    layout = _FAMILY_LAYOUT.get(model_type)
    attention_bias = bool(config.get("attention_bias", False))
    qkv_bias, o_bias, qk_norm = (attention_bias, attention_bias, False) if layout is None else layout
    if qkv_bias is None:
        qkv_bias = attention_bias
        o_bias = attention_bias
    return ModelArchitecture(
        name=name or str(config.get("_name_or_path") or model_type),
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=_require_int(config, "intermediate_size", source),
        num_layers=_require_int(config, "num_hidden_layers", source),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        vocab_size=_require_int(config, "vocab_size", source),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(qkv_bias),
        o_bias=bool(o_bias),
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=qk_norm,
        max_position_embeddings=config.get("max_position_embeddings"),
        known_family=layout is not None,
        positions=supported_positions(config),
        source=source,
    )


@dataclass(frozen=True)
class ParameterCounts:
    """Parameter counts by part; ``total`` counts a tied embedding/LM head once."""

    embedding: int
    lm_head: int  # 0 when tied to the embedding
    per_layer_linear: int  # weights and biases of the seven linears of one block
    per_layer_norm: int  # the two RMSNorms (and Qwen3's q/k norms) of one block
    final_norm: int
    num_layers: int

    @property
    def layers(self) -> int:
        return (self.per_layer_linear + self.per_layer_norm) * self.num_layers

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.layers + self.final_norm

    @property
    def linear_in_layers(self) -> int:
        """The parameters bitsandbytes quantises for QLoRA: the linears of the decoder blocks."""
        return self.per_layer_linear * self.num_layers

    @property
    def not_in_layer_linears(self) -> int:
        """Embedding, LM head and norms: the parameters QLoRA keeps unquantised."""
        return self.total - self.linear_in_layers


def count_parameters(arch: ModelArchitecture) -> ParameterCounts:
    """Analytic parameter counts of a Llama-style decoder."""
    h = arch.hidden_size
    embedding = arch.vocab_size * h
    norms = 2 * h + (2 * arch.head_dim if arch.qk_norm else 0)
    return ParameterCounts(
        embedding=embedding,
        lm_head=0 if arch.tie_word_embeddings else arch.vocab_size * h,
        per_layer_linear=sum(shape.params for shape in arch.linear_shapes()),
        per_layer_norm=norms,
        final_norm=h,
        num_layers=arch.num_layers,
    )


def normalise_lora_targets(targets: tuple[str, ...] | list[str] | str) -> tuple[str, ...]:
    """Expand ``all-linear`` / short names (``q``, ``q_proj``) into the block's linear names."""
    if isinstance(targets, str):
        targets = tuple(part.strip() for part in targets.split(",") if part.strip())
    names: list[str] = []
    for target in targets:
        key = target.strip().lower()
        if key in ("all", "all-linear", "all_linear"):
            return LINEAR_NAMES
        full = key if key.endswith("_proj") else f"{key}_proj"
        if full not in LINEAR_NAMES:
            raise ArchitectureError(
                t("estimate.error.lora_target", target=target, known=", ".join(LINEAR_NAMES))
            )
        if full not in names:
            names.append(full)
    if not names:
        raise ArchitectureError(t("estimate.error.lora_target", target="", known=", ".join(LINEAR_NAMES)))
    return tuple(name for name in LINEAR_NAMES if name in names)


def lora_parameter_count(arch: ModelArchitecture, rank: int, targets: tuple[str, ...], dora: bool = False) -> int:
    """Trainable adapter parameters: r x (in + out) per targeted linear, + the DoRA magnitude vector."""
    per_layer = 0
    for shape in arch.linear_shapes():
        if shape.name in targets:
            per_layer += rank * (shape.in_features + shape.out_features)
            if dora:
                per_layer += shape.out_features
    return per_layer * arch.num_layers
