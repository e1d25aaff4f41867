"""What the keys of LLaMA-Factory and ms-swift configurations mean in tunedeck: one table for two uses.

``tunedeck import`` converts a peer's file key by key through ``PEER_KEYS``, and the "did you mean"
of an unknown key in a tunedeck YAML consults the same table before edit distance, so that ``bf16``
points to ``precision: bf16`` (not to ``pure_bf16``, a different setting) and ``do_train`` is "not
needed" instead of a guess.

Each entry turns a peer value into an ``Outcome``: taken (tunedeck keys and values), dropped (why it is
not needed) or needs you (what the user has to decide). ``hint`` is the tunedeck spelling shown in a
suggestion. Names are shared where both peers use them with the same meaning (``lora_rank``,
``learning_rate``, ``per_device_train_batch_size``: Hugging Face TrainingArguments names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.i18n import Message

TAKEN = "taken"
DROPPED = "dropped"
NEEDS_YOU = "needs_you"

LLAMAFACTORY = "llamafactory"
SWIFT = "swift"


@dataclass
class Outcome:
    """What became of one peer key: ``values`` (taken), or ``reason`` (dropped / needs you)."""

    verdict: str
    values: dict[str, Any] = field(default_factory=dict)
    reason: Message | None = None


def show_value(value: Any) -> str:
    """A peer's value as its YAML file spells it (``true``, ``null``, ``16``), shortened past 80 characters."""
    import json

    if isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    else:
        text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _shown(params: dict[str, Any]) -> dict[str, Any]:
    """A reason's parameters with the values that are no text spelt as YAML (``True`` reads ``true``)."""
    return {name: param if isinstance(param, (str, Message)) else show_value(param) for name, param in params.items()}


def taken(values: dict[str, Any], note: Message | None = None) -> Outcome:
    return Outcome(TAKEN, dict(values), note)


def dropped(key: str, **params: Any) -> Outcome:
    return Outcome(DROPPED, reason=Message(key, **_shown(params)))


def needs_you(key: str, **params: Any) -> Outcome:
    return Outcome(NEEDS_YOU, reason=Message(key, **_shown(params)))


def is_unset(value: Any) -> bool:
    """A value that says "not set" in the peers' dumps: null, empty, or HF's -1 for max_steps."""
    return value is None or value == "" or value == [] or value == {} or \
        (isinstance(value, str) and value.strip().lower() in ("none", "null"))


def truthy(value: Any) -> bool | None:
    """``True``/``False`` for a boolean-looking value (``"true"`` from a command line), else None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


Convert = Callable[[Any], Outcome]


@dataclass(frozen=True)
class PeerKey:
    """One peer key: how its value converts, and how a suggestion spells it in tunedeck."""

    convert: Convert
    hint: str | None = None  # "precision: bf16"; None for a key with no tunedeck meaning
    peers: tuple[str, ...] = (LLAMAFACTORY, SWIFT)
    sample: Any = True  # a value a user would write, for the suggestion of a key without a hint


# -- converters ------------------------------------------------------------------------------------
def same(target: str) -> Convert:
    """The value as it is, under tunedeck's name ``target`` (checked later like any YAML value)."""
    def convert(value: Any) -> Outcome:
        return dropped("import.reason_unset") if is_unset(value) else taken({target: value})
    return convert


def when_true(values: dict[str, Any]) -> Convert:
    """``values`` when the flag is on; an off flag is the default and needs nothing."""
    def convert(value: Any) -> Outcome:
        flag = truthy(value)
        if flag is None:
            return dropped("import.reason_unset") if is_unset(value) else \
                needs_you("import.reason_not_a_flag", value=value)
        return taken(values) if flag else dropped("import.reason_flag_off")
    return convert


def not_needed(reason_key: str) -> Convert:
    def convert(value: Any) -> Outcome:
        return dropped(reason_key)
    return convert


def _positive_int(target: str, unset_below: float = 1) -> Convert:
    """HF writes -1 (max_steps) or 0 (warmup_steps) for "not set"."""
    def convert(value: Any) -> Outcome:
        number = _number(value)
        if is_unset(value) or (number is not None and number < unset_below):
            return dropped("import.reason_unset")
        return taken({target: int(number) if number is not None and number.is_integer() else value})
    return convert


def _method(value: Any) -> Outcome:
    """finetuning_type (LLaMA-Factory), train_type (ms-swift 3), tuner_type (ms-swift 4), sft_type (2)."""
    text = str(value).strip().lower()
    if text in ("lora", "full"):
        return taken({"method": text})
    if text == "dora":
        return taken({"method": "dora"})
    if text == "qlora":
        return taken({"method": "qlora"})
    return needs_you("import.reason_method", value=value)


def _quantization(value: Any) -> Outcome:
    number = _number(value)
    if is_unset(value):
        return dropped("import.reason_unset")
    if number == 4:
        return taken({"method": "qlora"})
    return needs_you("import.reason_quant_bits", value=value)


def _quant_method(value: Any) -> Outcome:
    if is_unset(value) or str(value).strip().lower() in ("bnb", "bitsandbytes"):
        return dropped("import.reason_bnb")
    return needs_you("import.reason_quant_method", value=value)


def _stage(value: Any) -> Outcome:
    text = str(value).strip().lower()
    if text == "sft":
        return dropped("import.reason_sft")
    if text == "pt":
        return taken({"loss_on": "all"}, Message("import.note_pretraining"))
    return needs_you("import.reason_not_sft", value=value)


def _lora_targets(value: Any) -> Outcome:
    if is_unset(value):
        return dropped("import.reason_unset")
    items = value if isinstance(value, list) else [part for part in str(value).split(",")]
    items = [str(item).strip() for item in items if str(item).strip()]
    if not items:
        return dropped("import.reason_unset")
    if any(item.lower() in ("all", "all-linear", "all_linear") for item in items):
        return taken({"lora_targets": "all-linear"})
    return taken({"lora_targets": items})


def _dataset(value: Any) -> Outcome:
    if is_unset(value):
        return dropped("import.reason_unset")
    items = value if isinstance(value, list) else str(value).split(",")
    items = [str(item).strip() for item in items if str(item).strip()]
    return taken({"dataset": items[0] if len(items) == 1 else items})


def _precision_flag(precision: str) -> Convert:
    def convert(value: Any) -> Outcome:
        flag = truthy(value)
        if flag is None:
            return dropped("import.reason_unset")
        return taken({"precision": precision}) if flag else dropped("import.reason_flag_off")
    return convert


_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
           "float32": "fp32", "fp32": "fp32", "float": "fp32"}


def _torch_dtype(value: Any) -> Outcome:
    if is_unset(value) or str(value).strip().lower() == "auto":
        return dropped("import.reason_unset")
    precision = _DTYPES.get(str(value).strip().lower())
    return taken({"precision": precision}) if precision else needs_you("import.reason_dtype", value=value)


_SCHEDULERS = {"cosine": "cosine", "linear": "linear", "constant_with_warmup": "constant"}


def _scheduler(value: Any) -> Outcome:
    if is_unset(value):
        return dropped("import.reason_unset")
    text = str(value).strip().lower()
    if text == "constant":
        # transformers' constant ignores warmup_ratio/warmup_steps; tunedeck's constant warms up: none here
        return taken({"lr_scheduler": "constant", "warmup_ratio": 0.0}, Message("import.note_constant_no_warmup"))
    if text == "cosine_with_restarts":
        # transformers' hard restarts with its default single cycle draw cosine's curve exactly; other cycle
        # counts come in lr_scheduler_kwargs, a key tunedeck lacks (its own line stops train)
        return taken({"lr_scheduler": "cosine"}, Message("import.note_one_cycle"))
    name = _SCHEDULERS.get(text)
    return taken({"lr_scheduler": name}) if name else needs_you("import.reason_scheduler", value=value)


_ATTENTION = {"fa2": "flash", "flash_attn": "flash", "flash_attention_2": "flash", "flash_attention": "flash",
              "sdpa": "sdpa", "eager": "eager", "disabled": "eager", "auto": "auto"}


def _attention(value: Any) -> Outcome:
    if is_unset(value):
        return dropped("import.reason_unset")
    name = _ATTENTION.get(str(value).strip().lower())
    return taken({"attn": name}) if name else needs_you("import.reason_attention", value=value)


def _deepspeed(value: Any) -> Outcome:
    """A JSON path (both peers), or ms-swift's shorthands zero0..zero3 (_offload)."""
    if is_unset(value):
        return dropped("import.reason_unset")
    text = str(value).strip()
    short = text.lower()
    if short.startswith("zero") and short[4:5].isdigit() and not short.endswith(".json"):
        stage = int(short[4])
        values: dict[str, Any] = {"zero_stage": stage}
        if short.endswith("_offload"):
            values["offload"] = "all" if stage == 3 else "optimizer"
        return taken(values)
    if isinstance(value, dict):
        return needs_you("import.reason_deepspeed_inline")
    return taken({"deepspeed": text})


def _eval_split(value: Any) -> Outcome:
    number = _number(value)
    if is_unset(value) or number == 0:
        return dropped("import.reason_unset")
    if number is not None and number >= 1:
        return needs_you("import.reason_eval_count", value=value)
    return taken({"eval_split": value})


def _optimizer(value: Any) -> Outcome:
    from core.config.schema import OPTIMIZER_ALIASES, OPTIMIZERS, reference_path

    if is_unset(value):
        return dropped("import.reason_unset")
    name = OPTIMIZER_ALIASES.get(str(value).strip(), str(value).strip())
    return taken({"optimizer": name}) if name in OPTIMIZERS else needs_you("import.reason_optimizer", value=value, reference=reference_path())


def _train_on_prompt(value: Any) -> Outcome:
    flag = truthy(value)
    if flag is None:
        return dropped("import.reason_unset")
    return taken({"loss_on": "all"}) if flag else dropped("import.reason_flag_off")


def _gradient_checkpointing_off(value: Any) -> Outcome:
    flag = truthy(value)
    if flag is None:
        return dropped("import.reason_unset")
    return taken({"gradient_checkpointing": False}) if flag else dropped("import.reason_flag_off")


def _use_hf(value: Any) -> Outcome:
    flag = truthy(value)
    if flag is None:
        return dropped("import.reason_unset")
    return taken({"hub": "huggingface" if flag else "modelscope"})


def _save_total_limit(value: Any) -> Outcome:
    return dropped("import.reason_unset") if is_unset(value) else taken({"save_total_limit": value})


def _only_when_set(reason_key: str) -> Convert:
    """A setting tunedeck lacks: unset is harmless, a value needs a decision."""
    def convert(value: Any) -> Outcome:
        if is_unset(value) or truthy(value) is False:
            return dropped("import.reason_unset")
        return needs_you(reason_key, value=value)
    return convert


def _dataset_dir(value: Any) -> Outcome:
    from core.config.schema import KEY_SPECS

    if is_unset(value):
        return dropped("import.reason_unset")
    if "dataset_dir" in KEY_SPECS:  # the dataset registry reads LLaMA-Factory's dataset_info.json there
        return taken({"dataset_dir": value})
    return needs_you("import.reason_dataset_dir", value=value)


def _loss_scale(value: Any) -> Outcome:
    """ms-swift's loss_scale: ``default`` trains on the answers (tunedeck's ``loss_on: assistant``)."""
    text = str(value).strip().lower()
    if is_unset(value):
        return dropped("import.reason_unset")
    if text == "default":
        return dropped("import.reason_loss_default")
    if text == "last_round":
        return needs_you("import.reason_last_round")
    if text == "all":
        return taken({"loss_on": "all"})
    return needs_you("import.reason_loss_scale", value=value)


def _max_samples(value: Any) -> Outcome:
    if is_unset(value):
        return dropped("import.reason_unset")
    return needs_you("import.reason_max_samples", value=value)


def _model_self_name(value: Any) -> Outcome:
    return dropped("import.reason_unset") if is_unset(value) else dropped("import.reason_self_cognition")


# -- the table ---------------------------------------------------------------------------------------
_BOTH = (LLAMAFACTORY, SWIFT)
_LF = (LLAMAFACTORY,)
_MS = (SWIFT,)

PEER_KEYS: dict[str, PeerKey] = {
    # the model
    "model_name_or_path": PeerKey(same("model"), "model: Qwen/Qwen2.5-7B-Instruct", _LF),
    "model_id_or_path": PeerKey(same("model"), "model: Qwen/Qwen2.5-7B-Instruct", _MS),
    "model_type": PeerKey(not_needed("import.reason_model_type"), None, _MS),
    "model_name": PeerKey(_model_self_name, None, _MS),
    "model_author": PeerKey(_model_self_name, None, _MS),
    "model_revision": PeerKey(_only_when_set("import.reason_revision"), None),
    "trust_remote_code": PeerKey(not_needed("import.reason_remote_code"), None),
    "use_hf": PeerKey(_use_hf, "hub: huggingface", _MS),
    "cache_dir": PeerKey(not_needed("import.reason_cache_dir"), None),
    "template": PeerKey(not_needed("import.reason_template"), None),
    "system": PeerKey(_only_when_set("import.reason_system"), None, _MS),
    # the method
    "stage": PeerKey(_stage, None, _LF, sample="sft"),
    "do_train": PeerKey(not_needed("import.reason_do_train"), None, _LF),
    "do_eval": PeerKey(_only_when_set("import.reason_predict"), None, _LF),
    "do_predict": PeerKey(_only_when_set("import.reason_predict"), None, _LF),
    "finetuning_type": PeerKey(_method, "method: lora", _LF),
    "train_type": PeerKey(_method, "method: lora", _MS),
    "tuner_type": PeerKey(_method, "method: lora", _MS),
    "sft_type": PeerKey(_method, "method: lora", _MS),
    "use_dora": PeerKey(when_true({"method": "dora"}), "method: dora"),
    "quantization_bit": PeerKey(_quantization, "method: qlora", _LF),
    "quant_bits": PeerKey(_quantization, "method: qlora", _MS),
    "quantization_method": PeerKey(_quant_method, None, _LF),
    "quant_method": PeerKey(_quant_method, None, _MS),
    "lora_rank": PeerKey(same("lora_rank"), "lora_rank: 16"),
    "lora_alpha": PeerKey(same("lora_alpha"), "lora_alpha: 32"),
    "lora_dropout": PeerKey(same("lora_dropout"), "lora_dropout: 0.05"),
    "use_rslora": PeerKey(when_true({"lora_rslora": True}), "lora_rslora: true"),
    "lora_target": PeerKey(_lora_targets, "lora_targets: all-linear", _LF),
    "target_modules": PeerKey(_lora_targets, "lora_targets: all-linear", _MS),
    "additional_target": PeerKey(_only_when_set("import.reason_modules_to_save"), None, _LF),
    "modules_to_save": PeerKey(_only_when_set("import.reason_modules_to_save"), None, _MS),
    "pure_bf16": PeerKey(same("pure_bf16"), "pure_bf16: true", _LF),
    "bf16": PeerKey(_precision_flag("bf16"), "precision: bf16"),
    "fp16": PeerKey(_precision_flag("fp16"), "precision: fp16"),
    "torch_dtype": PeerKey(_torch_dtype, "precision: bf16", _MS),
    "tf32": PeerKey(same("tf32"), "tf32: auto"),
    "flash_attn": PeerKey(_attention, "attn: flash", _LF),
    "attn_impl": PeerKey(_attention, "attn: flash", _MS),
    "enable_liger_kernel": PeerKey(when_true({"fused_ce": "liger"}), "fused_ce: liger", _LF),
    "use_liger_kernel": PeerKey(when_true({"fused_ce": "liger"}), "fused_ce: liger", _MS),
    "use_liger": PeerKey(when_true({"fused_ce": "liger"}), "fused_ce: liger", _MS),
    "use_unsloth": PeerKey(_only_when_set("import.reason_unsloth"), None, _LF),
    "deepspeed": PeerKey(_deepspeed, "deepspeed: path/to/ds.json"),
    # the data
    "dataset": PeerKey(_dataset, "dataset: data/train.jsonl"),
    "dataset_dir": PeerKey(_dataset_dir, None, _LF),
    "cutoff_len": PeerKey(same("max_seq_len"), "max_seq_len: 2048", _LF),
    "max_length": PeerKey(same("max_seq_len"), "max_seq_len: 2048", _MS),
    "max_samples": PeerKey(_max_samples, "dataset: NAME#N", _LF),
    "packing": PeerKey(same("packing"), "packing: true"),
    "neat_packing": PeerKey(when_true({"packing": True}), "packing: true", _LF),
    "train_on_prompt": PeerKey(_train_on_prompt, "loss_on: all", _LF),
    "loss_scale": PeerKey(_loss_scale, "loss_on: assistant", _MS),
    "val_size": PeerKey(_eval_split, "eval_split: 0.1", _LF),
    "split_dataset_ratio": PeerKey(_eval_split, "eval_split: 0.1", _MS),
    "overwrite_cache": PeerKey(not_needed("import.reason_cache"), None, _LF),
    "preprocessing_num_workers": PeerKey(not_needed("import.reason_workers"), None, _LF),
    "dataset_num_proc": PeerKey(not_needed("import.reason_workers"), None, _MS),
    "dataloader_num_workers": PeerKey(not_needed("import.reason_workers"), None),
    "streaming": PeerKey(_only_when_set("import.reason_streaming"), None),
    "lazy_tokenize": PeerKey(not_needed("import.reason_workers"), None, _MS),
    # the schedule
    "num_train_epochs": PeerKey(same("epochs"), "epochs: 3"),
    "max_steps": PeerKey(_positive_int("max_steps"), "max_steps: 1000"),
    "per_device_train_batch_size": PeerKey(same("micro_batch_size"), "micro_batch_size: 1"),
    "per_device_eval_batch_size": PeerKey(not_needed("import.reason_eval_batch"), None),
    "gradient_accumulation_steps": PeerKey(same("gradient_accumulation"), "gradient_accumulation: 8"),
    "learning_rate": PeerKey(same("learning_rate"), "learning_rate: 1e-4"),
    "lr_scheduler_type": PeerKey(_scheduler, "lr_scheduler: cosine"),
    "warmup_ratio": PeerKey(same("warmup_ratio"), "warmup_ratio: 0.03"),
    "warmup_steps": PeerKey(_positive_int("warmup_steps"), "warmup_steps: 100"),
    "weight_decay": PeerKey(same("weight_decay"), "weight_decay: 0.0"),
    "max_grad_norm": PeerKey(same("max_grad_norm"), "max_grad_norm: 1.0"),
    "optim": PeerKey(_optimizer, "optimizer: adamw_torch"),
    "seed": PeerKey(same("seed"), "seed: 42"),
    "gradient_checkpointing": PeerKey(same("gradient_checkpointing"), "gradient_checkpointing: true", _MS),
    "disable_gradient_checkpointing": PeerKey(_gradient_checkpointing_off, "gradient_checkpointing: false", _LF),
    "gradient_checkpointing_kwargs": PeerKey(not_needed("import.reason_gc_kwargs"), None),
    "ddp_timeout": PeerKey(not_needed("import.reason_ddp_timeout"), None),
    "ddp_backend": PeerKey(not_needed("import.reason_ddp_timeout"), None),
    # saving, logging, evaluation
    "output_dir": PeerKey(not_needed("import.reason_output_dir"), None),
    "overwrite_output_dir": PeerKey(not_needed("import.reason_output_dir"), None, _LF),
    "logging_dir": PeerKey(not_needed("import.reason_output_dir"), None),
    "add_version": PeerKey(not_needed("import.reason_output_dir"), None, _MS),
    "logging_steps": PeerKey(same("logging_steps"), "logging_steps: 10"),
    "save_steps": PeerKey(same("save_steps"), "save_steps: 500"),
    "save_total_limit": PeerKey(_save_total_limit, "save_total_limit: 2"),
    "save_strategy": PeerKey(not_needed("import.reason_strategy"), None),
    "save_only_model": PeerKey(not_needed("import.reason_save_only_model"), None),
    "eval_steps": PeerKey(_positive_int("eval_steps"), "eval_steps: 100"),
    "eval_strategy": PeerKey(not_needed("import.reason_strategy"), None),
    "evaluation_strategy": PeerKey(not_needed("import.reason_strategy"), None),
    "plot_loss": PeerKey(not_needed("import.reason_plot_loss"), None, _LF),
    "report_to": PeerKey(not_needed("import.reason_report_to"), None),
    "run_name": PeerKey(same("name"), "name: my-run"),
    "resume_from_checkpoint": PeerKey(_only_when_set("import.reason_resume"), None),
    "local_rank": PeerKey(not_needed("import.reason_launcher"), None),
}

# Defaults of a peer that differ from tunedeck's and change what trains: applied for keys the file
# leaves out (``lora_alpha`` in LLaMA-Factory defaults to twice the rank).
PEER_DEFAULTS: dict[str, dict[str, Any]] = {
    LLAMAFACTORY: {"lora_rank": 8, "lora_dropout": 0.0},
    SWIFT: {"lora_rank": 8, "lora_alpha": 32, "lora_dropout": 0.05},
}

PEER_NAMES = {LLAMAFACTORY: "LLaMA-Factory", SWIFT: "ms-swift"}


def peer_suggestion(key: str) -> Message | None:
    """The "did you mean" of a peer's key in a tunedeck YAML, or None when it is not a peer's name."""
    entry = PEER_KEYS.get(key.strip().lower())
    if entry is None:
        return None
    peers = " / ".join(PEER_NAMES[peer] for peer in entry.peers)
    if entry.hint:
        return Message("config.peer_key", peers=peers, hint=entry.hint)
    outcome = entry.convert(entry.sample)  # a set value: what a user who wrote the key would be told
    reason_message = outcome.reason if outcome.reason is not None and outcome.reason.key not in (
        "import.reason_unset", "import.reason_flag_off") else Message("import.reason_no_meaning")
    return Message("config.peer_key_not_needed", peers=peers, reason=reason_message)
