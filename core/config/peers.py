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

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
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
    # answers the "did you mean" of an unknown key in a tunedeck YAML; off for the entries that only account
    # for a full dump's keys (``rank``, ``task_type``): there a look-alike (``lora_rank``) is the better answer
    suggest: bool = True
    # a value ``convert`` could not judge alone (needs you), judged again with the other keys of the converted
    # config (``data_seed`` equal to its seed): the line's new outcome, or None to keep it (importers.convert)
    in_context: Callable[[Any, dict[str, Any]], Outcome | None] | None = None


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


def _world_size(value: Any) -> Outcome:
    """ms-swift's ``global_world_size`` (an args.json's): how many processes trained, each with the file's micro-batch
    and accumulation. Kept as the GPU count, so the effective batch stays ms-swift's: ``gpus: all`` multiplied it by
    the GPUs of the box the converted run lands on."""
    number = _number(value)
    if number is None or not number.is_integer() or number < 1:
        return dropped("import.reason_unset") if is_unset(value) else needs_you("import.reason_unknown")
    count = int(number)
    return taken({"gpus": count}, Message("import.note_swift_world_size", count=count))


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


def _swift2_lora_targets(value: Any) -> Outcome:
    """ms-swift 2's ``lora_target_modules``: module names, ``ALL`` (every linear), or ``DEFAULT`` / ``AUTO``, the
    modules ms-swift 2 listed for the model type (often the attention's q/k/v alone): tunedeck has no such list."""
    items = value if isinstance(value, list) else str(value).split(",")
    if any(str(item).strip().upper() in ("DEFAULT", "AUTO") for item in items):
        return needs_you("import.reason_swift2_default_targets", value=value)
    return _lora_targets(value)


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
    """A JSON path (both peers), or ms-swift's shorthands zero0..zero3 (_offload), as ms-swift 2 spelt them too
    (``default-zero2``, ``default-zero3``, ``zero3-offload``)."""
    if is_unset(value):
        return dropped("import.reason_unset")
    text = str(value).strip()
    short = text.lower().removeprefix("default-").replace("-offload", "_offload")
    if short.startswith("zero") and short[4:5].isdigit() and short[5:] in ("", "_offload"):
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


# A data file of another format than JSON Lines is read whole to count its records, only up to this size: past it
# no count is claimed (the needs-you line stays), so that ``import`` and ``train --check`` never hold a large file.
_READ_WHOLE_BYTES = 64 * 1024 * 1024
_COUNT_CHUNK_BYTES = 1024 * 1024
_JSONL_SUFFIXES = (".jsonl", ".ndjson")


def count_jsonl_rows(path: Any) -> int:
    """The non-blank lines of a JSON Lines file, at least its records (a row per line, a blank one skipped):
    read once in chunks of 1 MiB, so memory stays bounded whatever the file's size or its longest line (a
    .jsonl.gz is counted as it is decompressed)."""
    from pathlib import Path

    from core.data.readers import open_decompressed

    rows, content = 0, False
    with open_decompressed(Path(path)) as stream:
        while chunk := stream.read(_COUNT_CHUNK_BYTES):
            pieces = chunk.split(b"\n")
            for piece in pieces[:-1]:
                rows += 1 if content or piece.strip() else 0
                content = False
            content = content or bool(pieces[-1].strip())
    return rows + (1 if content else 0)


def _local_record_counts(config: dict[str, Any]) -> list[int] | None:
    """At least the rows of each dataset of a converted config when every one is a local data file (not a
    hub, a folder, plain text or a ``#N`` draw), else None. A JSON Lines file's non-blank lines are counted
    streaming (``count_jsonl_rows``: a 20 GB file in bounded memory), another file is read whole below
    ``_READ_WHOLE_BYTES`` and its rows taken when it loads without a problem; each file is read once."""
    import lzma
    from pathlib import Path

    from core.data.issues import DataError
    from core.data.loading import is_hub_source, read_source
    from core.data.readers import COMPRESSIONS, data_suffix
    from core.data.registry import resolve_sources_and_issues

    try:
        sources, issues = resolve_sources_and_issues(
            config.get("dataset"), str(config.get("hub") or "modelscope"), config.get("dataset_info"),
            config.get("dataset_dir"), Path.cwd())
        if issues or not sources:
            return None
        counted: dict[Path, int] = {}
        for source in sources:
            path = Path(source.location)
            if is_hub_source(source) or source.sample is not None or not path.is_file() \
                    or data_suffix(path) == ".txt":  # LLaMA-Factory reads a line per row, tunedeck a block
                return None
            key = path.resolve()
            if key in counted:
                continue
            if data_suffix(path) in _JSONL_SUFFIXES:  # train.jsonl.gz too, streaming as it is decompressed
                counted[key] = count_jsonl_rows(path)
                continue
            # a compressed one's size on disk says nothing of what reading it whole holds (a 60 MB .json.gz: GBs)
            if path.stat().st_size > _READ_WHOLE_BYTES or path.suffix.lower() in COMPRESSIONS:
                return None
            loaded = read_source(source)
            if len(loaded) != 1 or loaded[0].issue_count:
                return None
            counted[key] = loaded[0].rows
    except (DataError, OSError, EOFError, lzma.LZMAError):  # the last two: a damaged archive
        return None
    return list(counted.values())


def _max_samples_in_context(value: Any, config: dict[str, Any]) -> Outcome | None:
    """LLaMA-Factory selects range(min(max_samples, len)) of each dataset: a cap at least every dataset's
    record count selects them all, the run tunedeck trains anyway."""
    number = _number(value)
    counts = _local_record_counts(config) if number is not None else None
    if not counts or number is None or number < max(counts):
        return None
    return dropped("import.reason_max_samples_all", value=value, count=max(counts))


def _enable_thinking(value: Any) -> Outcome:
    """LLaMA-Factory's enable_thinking (default true): the chat template's switch, tunedeck's ``thinking``
    (given to the template as ``enable_thinking`` in training, chat and serve alike)."""
    flag = truthy(value)
    if flag is None:
        return dropped("import.reason_unset") if is_unset(value) else needs_you("import.reason_not_a_flag", value=value)
    return taken({"thinking": flag})


def _swift_enable_thinking(value: Any) -> Outcome:
    """ms-swift 4.6's enable_thinking is read at inference only (swift/arguments/base_args/template_args.py:
    "takes effect during inference"); its training renders a sample the same whatever it says."""
    if is_unset(value):
        return dropped("import.reason_unset")
    flag = truthy(value)
    if flag is None:
        return needs_you("import.reason_not_a_flag", value=value)
    return dropped("import.reason_swift_thinking", value=value)


def _model_self_name(value: Any) -> Outcome:
    return dropped("import.reason_unset") if is_unset(value) else dropped("import.reason_self_cognition")


def _equal(value: Any, accepted: Any) -> bool:
    """``value`` (as a peer file or a command line spells it) is ``accepted``: flags by truth, numbers by value,
    names without regard to case."""
    if isinstance(accepted, bool):
        return truthy(value) is accepted
    if isinstance(accepted, (int, float)):
        number = _number(value)
        return number is not None and math.isclose(number, accepted, rel_tol=1e-9)
    if isinstance(accepted, str):
        return isinstance(value, str) and value.strip().lower() == accepted.lower()
    return bool(value == accepted)


def same_as_tunedeck(*accepted: Any) -> Convert:
    """A setting tunedeck has no key for: the ``accepted`` values are what tunedeck trains with anyway
    (dropped, said so); any other value would train something else than the file describes (needs you,
    and ``tunedeck train`` stops)."""
    def convert(value: Any) -> Outcome:
        if is_unset(value):
            return dropped("import.reason_unset")
        if any(_equal(value, one) for one in accepted):
            return dropped("import.reason_same_as_tunedeck")
        return needs_you("import.reason_unknown")
    return convert


def _truncation(value: Any) -> Outcome:
    """ms-swift's ``truncation_strategy`` for a sample longer than ``max_length``: ``delete`` leaves it out
    (``overlong: drop``), ``right`` cuts its end (``overlong: cut``, tunedeck's default); ``left`` cuts its
    start, which tunedeck does not do (it keeps a sample's start)."""
    if is_unset(value):
        return dropped("import.reason_unset")
    name = str(value).strip().lower()
    if name == "delete":
        return taken({"overlong": "drop"})
    if name == "right":
        return taken({"overlong": "cut"})
    return needs_you("import.reason_truncation", value=value)


def _only_with(other: str) -> Convert:
    """A setting read only together with ``other`` (a generation setting with predict_with_generate, a
    LoRA-GA one with init_weights: lora-ga, ...): ``other``'s own line decides, whatever this one says."""
    def convert(value: Any) -> Outcome:
        return dropped("import.reason_unset") if is_unset(value) else dropped("import.reason_only_with", other=other)
    return convert


def _data_seed_in_context(value: Any, config: dict[str, Any]) -> Outcome | None:
    """The engine's data_seed is its seed (42 unless set)."""
    return dropped("import.reason_same_as_tunedeck") if _equal(value, config.get("seed", 42)) else None


def _compute_dtype_in_context(value: Any, config: dict[str, Any]) -> Outcome | None:
    """QLoRA computes in the run's precision (bf16 unless set); without QLoRA the dtype is not read."""
    same = config.get("method") != "qlora" or \
        _DTYPES.get(str(value).strip().lower()) == config.get("precision", "bf16")
    return dropped("import.reason_same_as_tunedeck") if same else None


def _prefixed(prefixes: dict[str, str], key: str) -> PeerKey | None:
    """The entry of a key of a family (``galore_rank``, ``swanlab_mode``): read only with another key."""
    for prefix, other in prefixes.items():
        if key.startswith(prefix):
            return PeerKey(_only_with(other), None, (SWIFT,), suggest=False)
    return None


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
    "enable_thinking": PeerKey(_enable_thinking, "thinking: false", _LF),
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
    # LLaMA-Factory's bitsandbytes settings (its defaults: nf4, double quantisation on), as tunedeck quantises
    "quantization_type": PeerKey(same_as_tunedeck("nf4"), None, _LF),
    "double_quantization": PeerKey(same_as_tunedeck(True), None, _LF),
    "lora_rank": PeerKey(same("lora_rank"), "lora_rank: 16"),
    "lora_alpha": PeerKey(same("lora_alpha"), "lora_alpha: 32"),
    "lora_dropout": PeerKey(same("lora_dropout"), "lora_dropout: 0.05"),
    "use_rslora": PeerKey(when_true({"lora_rslora": True}), "lora_rslora: true"),
    "lora_target": PeerKey(_lora_targets, "lora_targets: all-linear", _LF),
    "target_modules": PeerKey(_lora_targets, "lora_targets: all-linear", _MS),
    # ms-swift 2's names (its sft_args.json and the scripts of its day), where ms-swift 3 renamed the key
    "lora_target_modules": PeerKey(_swift2_lora_targets, "lora_targets: all-linear", _MS),
    "lora_dropout_p": PeerKey(same("lora_dropout"), "lora_dropout: 0.05", _MS),
    "dtype": PeerKey(_torch_dtype, "precision: bf16", _MS),
    "batch_size": PeerKey(same("micro_batch_size"), "micro_batch_size: 1", _MS),
    "custom_train_dataset_path": PeerKey(_dataset, "dataset: data/train.jsonl", _MS),
    "dataset_test_ratio": PeerKey(_eval_split, "eval_split: 0.1", _MS),
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
    "truncation_strategy": PeerKey(_truncation, "overlong: drop", _MS),
    # no tunedeck equivalent: NAME#N draws N at random (repeating past the file's size), not the first N; a
    # cap at least each local dataset's record count takes them all (in_context)
    "max_samples": PeerKey(_max_samples, None, _LF, sample="N", in_context=_max_samples_in_context),
    "packing": PeerKey(same("packing"), "packing: true"),
    "neat_packing": PeerKey(when_true({"packing": True}), "packing: true", _LF),
    "train_on_prompt": PeerKey(_train_on_prompt, "loss_on: all", _LF),
    "loss_scale": PeerKey(_loss_scale, "loss_on: assistant", _MS),
    "val_size": PeerKey(_eval_split, "eval_split: 0.1", _LF),
    "split_dataset_ratio": PeerKey(_eval_split, "eval_split: 0.1", _MS),
    # a separate dataset to evaluate on: tunedeck has none (its eval_split holds a share of the training data out)
    "eval_dataset": PeerKey(_only_when_set("import.reason_eval_dataset"), None, _LF, sample="eval.json"),
    "val_dataset": PeerKey(_only_when_set("import.reason_eval_dataset"), None, _MS, sample="eval.jsonl"),
    "overwrite_cache": PeerKey(not_needed("import.reason_cache"), None, _LF),
    "preprocessing_num_workers": PeerKey(not_needed("import.reason_workers"), None, _LF),
    "dataset_num_proc": PeerKey(not_needed("import.reason_workers"), None, _MS),
    "dataloader_num_workers": PeerKey(not_needed("import.reason_workers"), None),
    "streaming": PeerKey(_only_when_set("import.reason_streaming"), None),
    "lazy_tokenize": PeerKey(not_needed("import.reason_lazy_tokenize"), None, _MS),
    # a speed setting: the batch flattened without padding trains the same loss (ms-swift needs flash-attention for it)
    "padding_free": PeerKey(not_needed("import.reason_padding_free"), None, _MS),
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
    "adam_beta1": PeerKey(same("adam_beta1"), "adam_beta1: 0.9"),
    "adam_beta2": PeerKey(same("adam_beta2"), "adam_beta2: 0.999"),
    "adam_epsilon": PeerKey(same("adam_epsilon"), "adam_epsilon: 1e-8"),
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
    "save_strategy": PeerKey(not_needed("import.reason_save_strategy"), None),
    "save_only_model": PeerKey(not_needed("import.reason_save_only_model"), None),
    "eval_steps": PeerKey(_positive_int("eval_steps"), "eval_steps: 100"),
    "eval_strategy": PeerKey(not_needed("import.reason_eval_strategy"), None),
    "evaluation_strategy": PeerKey(not_needed("import.reason_eval_strategy"), None),
    "plot_loss": PeerKey(not_needed("import.reason_plot_loss"), None, _LF),
    "report_to": PeerKey(not_needed("import.reason_report_to"), None),
    "run_name": PeerKey(same("name"), "name: my-run"),
    "resume_from_checkpoint": PeerKey(_only_when_set("import.reason_resume"), None),
    "local_rank": PeerKey(not_needed("import.reason_launcher"), None),
}

# Settings tunedeck has no key for that a full dump carries (ms-swift writes all of its ~200 arguments into
# args.json, mostly at their defaults): a value that is what tunedeck does anyway is no difference and stops
# nothing; another value still needs you (and stops ``tunedeck train``). Checked against the engine
# (core/train/worker.py builds transformers' TrainingArguments without these, so theirs apply; model_setup.py
# builds peft's LoraConfig and the QLoRA BitsAndBytesConfig; core/data tokenizes with the chat template and
# cuts a long sample at its end; the collator pads at the end). They answer no "did you mean" in a tunedeck
# YAML (suggest off): there the key is refused whatever its value, and a look-alike is the better answer.
_DUMP_KEYS: dict[str, PeerKey] = {
    # transformers' TrainingArguments defaults the engine keeps (the DeepSpeed config says "auto": the same)
    "average_tokens_across_devices": PeerKey(same_as_tunedeck(True), None),
    "train_sampling_strategy": PeerKey(same_as_tunedeck("random"), None),
    "half_precision_backend": PeerKey(same_as_tunedeck("auto"), None),
    "fp16_backend": PeerKey(same_as_tunedeck("auto"), None),
    "fp16_opt_level": PeerKey(_only_with("half_precision_backend"), None),  # apex's level
    "past_index": PeerKey(same_as_tunedeck(-1), None),
    "label_smoothing_factor": PeerKey(same_as_tunedeck(0), None),
    # map-style data: accelerate does not dispatch batches, each process reads its own
    "accelerator_config": PeerKey(same_as_tunedeck({"dispatch_batches": False}), None),
    # the engine's data_seed is its seed: the same when it equals the file's seed (in_context)
    "data_seed": PeerKey(same_as_tunedeck(), None, in_context=_data_seed_in_context),
    "metric_for_best_model": PeerKey(_only_with("load_best_model_at_end"), None),
    "greater_is_better": PeerKey(_only_with("load_best_model_at_end"), None),
    "length_column_name": PeerKey(_only_with("group_by_length"), None),
    **{key: PeerKey(_only_with("predict_with_generate"), None) for key in (
        "generation_max_length", "generation_num_beams", "generation_config")},
    # bookkeeping: logging, saving, hub, evaluation, data loader processes, the launcher; no maths
    **{key: PeerKey(not_needed("import.reason_bookkeeping"), None) for key in (
        "log_level", "log_level_replica", "log_on_each_node", "logging_strategy", "logging_first_step",
        "logging_nan_inf_filter", "include_num_input_tokens_seen", "include_tokens_per_second", "disable_tqdm",
        "skip_memory_metrics", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
        "save_safetensors", "save_on_each_node", "restore_callback_states_from_checkpoint",
        "enable_jit_checkpoint", "push_to_hub", "push_to_hub_model_id", "push_to_hub_organization",
        "push_to_hub_token", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push",
        "hub_revision", "remove_unused_columns", "dataloader_pin_memory", "dataloader_persistent_workers",
        "dataloader_prefetch_factor", "dataloader_multiprocessing_context", "dataloader_in_order",
        "eval_do_concat_batches", "eval_accumulation_steps", "eval_delay", "eval_on_start",
        "eval_use_gather_object", "batch_eval_metrics", "prediction_loss_only", "include_inputs_for_metrics",
        "include_for_metrics", "use_legacy_prediction_loop", "jit_mode_eval", "bf16_full_eval",
        "fp16_full_eval", "per_gpu_eval_batch_size", "ray_scope", "tpu_metrics_debug",
        "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers")},
    # ms-swift's own arguments
    "tuner_backend": PeerKey(same_as_tunedeck("peft"), None, _MS),
    "task_type": PeerKey(same_as_tunedeck("causal_lm"), None, _MS),
    "use_chat_template": PeerKey(same_as_tunedeck(True), None, _MS),
    "template_backend": PeerKey(not_needed("import.reason_template"), None, _MS),
    "padding_side": PeerKey(same_as_tunedeck("right"), None, _MS),
    "sequence_parallel_size": PeerKey(same_as_tunedeck(1), None, _MS),
    "train_dataloader_shuffle": PeerKey(same_as_tunedeck(True), None, _MS),
    "dataset_shuffle": PeerKey(same_as_tunedeck(True), None, _MS),
    "init_weights": PeerKey(same_as_tunedeck(True), None, _MS),  # peft's own initialisation
    "lora_bias": PeerKey(same_as_tunedeck("none"), None, _MS),
    "bnb_4bit_quant_type": PeerKey(same_as_tunedeck("nf4"), None, _MS),
    "bnb_4bit_use_double_quant": PeerKey(same_as_tunedeck(True), None, _MS),
    # the compute dtype is the run's precision: the same when it says the file's (in_context)
    "bnb_4bit_compute_dtype": PeerKey(same_as_tunedeck(), None, _MS, in_context=_compute_dtype_in_context),
    "bnb_4bit_quant_storage": PeerKey(not_needed("import.reason_bookkeeping"), None, _MS),
    "lisa_activated_layers": PeerKey(same_as_tunedeck(0), None, _MS),
    "lisa_step_interval": PeerKey(_only_with("lisa_activated_layers"), None, _MS),
    "freeze_vit": PeerKey(not_needed("import.reason_text_only"), None, _MS),
    "freeze_aligner": PeerKey(not_needed("import.reason_text_only"), None, _MS),
    "freeze_vision_tower": PeerKey(not_needed("import.reason_text_only"), None, _LF),
    "freeze_multi_modal_projector": PeerKey(not_needed("import.reason_text_only"), None, _LF),
    "load_from_cache_file": PeerKey(not_needed("import.reason_cache"), None, _MS),
    "download_mode": PeerKey(not_needed("import.reason_cache"), None, _MS),
    "shuffle_buffer_size": PeerKey(_only_with("streaming"), None, _MS),
    "stopping_strategy": PeerKey(_only_with("interleave_prob"), None, _MS),
    "ds3_gather_for_generation": PeerKey(_only_with("predict_with_generate"), None, _MS),
    **{key: PeerKey(_only_with("predict_with_generate"), None, _MS) for key in (
        "max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "num_beams", "stream",
        "stop_words", "logprobs", "top_logprobs")},
    **{key: PeerKey(not_needed("import.reason_bookkeeping"), None, _MS) for key in (
        "check_model", "acc_strategy", "create_checkpoint_symlink", "model_suffix", "model_info", "model_meta")},
    **{key: PeerKey(not_needed("import.reason_launcher"), None, _MS) for key in (
        "rank", "local_world_size")},
    "global_world_size": PeerKey(_world_size, None, _MS),
}
PEER_KEYS.update({key: replace(entry, suggest=False) for key, entry in _DUMP_KEYS.items()})

# Families of ms-swift arguments read only with another key (their tuner, GaLore, SwanLab reporting).
PEER_PREFIXES = {"lora_ga_": "init_weights", "galore_": "use_galore", "swanlab_": "report_to",
                 "fourier_": "tuner_type", "boft_": "tuner_type", "vera_": "tuner_type", "adapter_": "tuner_type",
                 "adalora_": "tuner_type", "llamapro_": "tuner_type", "reft_": "tuner_type"}


# Keys both peers spell alike with another meaning: the entry of that peer's file (``PEER_KEYS`` has the other's).
PEER_OWN_KEYS: dict[str, dict[str, PeerKey]] = {
    SWIFT: {"enable_thinking": PeerKey(_swift_enable_thinking, None, _MS, suggest=False)},
}


def peer_key(key: str, peer: str | None = None) -> PeerKey | None:
    """The table's entry for a peer's key (a family's by its prefix), or None; ``peer``: the file's peer, whose
    own entry (``PEER_OWN_KEYS``) comes first."""
    own = PEER_OWN_KEYS.get(peer or "", {}).get(key)
    return own or PEER_KEYS.get(key) or _prefixed(PEER_PREFIXES, key)


# Defaults of a peer that differ from tunedeck's and change what trains: applied for keys the file
# leaves out (``lora_alpha`` in LLaMA-Factory defaults to twice the rank).
PEER_DEFAULTS: dict[str, dict[str, Any]] = {
    LLAMAFACTORY: {"lora_rank": 8, "lora_dropout": 0.0},
    SWIFT: {"lora_rank": 8, "lora_alpha": 32, "lora_dropout": 0.05},
}
# A peer's defaults for any method, where they differ from tunedeck's, each with the peer keys that set it (a file
# that gives one of them decides itself); a callable value is worked out from the file's values and the converted
# configuration. LLaMA-Factory inherits transformers' TrainingArguments defaults: a batch of 8 per GPU, no
# gradient accumulation, learning rate 5e-5, a linear schedule and no warmup (tunedeck: 1, 8, 1e-4 for LoRA,
# cosine, 0.03). ms-swift 4.6's trainer arguments (swift/trainers/arguments.py) default adam_beta2 to 0.95,
# gradient_accumulation_steps to ceil(16 / per_device_train_batch_size / world size) and warmup_ratio to 0, and
# its template drops a sample longer than max_length (truncation_strategy None -> 'delete',
# swift/arguments/base_args/template_args.py), where transformers and tunedeck use 0.999 and cut; its batch (1),
# learning rate (1e-4 LoRA, 1e-5 full), schedule (cosine) and epochs (3) are tunedeck's.
_WARMUP_KEYS = ("warmup_ratio", "warmup_steps")


def _swift_accumulation(values: dict[str, Any], config: dict[str, Any]) -> int:
    """ms-swift's gradient_accumulation_steps when the line gives none: ceil(16 / batch / processes), processes as
    NPROC_PER_NODE says (one without it: ms-swift then spreads the model over the visible GPUs)."""
    gpus = config.get("gpus") if "NPROC_PER_NODE" in values else None
    world = len(gpus) if isinstance(gpus, list) else gpus if isinstance(gpus, int) and gpus > 0 else 1
    batch = config.get("micro_batch_size", 1)
    batch = batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0 else 1
    return max(1, math.ceil(16 / batch / world))


PEER_TRAIN_DEFAULTS: dict[str, dict[str, tuple[tuple[str, ...], Any]]] = {
    LLAMAFACTORY: {"micro_batch_size": (("per_device_train_batch_size",), 8),
                   "gradient_accumulation": (("gradient_accumulation_steps",), 1),
                   "learning_rate": (("learning_rate",), 5e-5),
                   "lr_scheduler": (("lr_scheduler_type",), "linear"),
                   "warmup_ratio": (_WARMUP_KEYS, 0.0)},
    SWIFT: {"adam_beta2": (("adam_beta2",), 0.95), "overlong": (("truncation_strategy",), "drop"),
            "gradient_accumulation": (("gradient_accumulation_steps",), _swift_accumulation),
            "warmup_ratio": (_WARMUP_KEYS, 0.0)},
}

PEER_NAMES = {LLAMAFACTORY: "LLaMA-Factory", SWIFT: "ms-swift"}


def peer_suggestion(key: str) -> Message | None:
    """The "did you mean" of a peer's key in a tunedeck YAML, or None when it is not a peer's name."""
    entry = peer_key(key.strip().lower())
    if entry is None or not entry.suggest:
        return None
    peers = " / ".join(PEER_NAMES[peer] for peer in entry.peers)
    if entry.hint:
        return Message("config.peer_key", peers=peers, hint=entry.hint)
    outcome = entry.convert(entry.sample)  # a set value: what a user who wrote the key would be told
    if outcome.verdict == NEEDS_YOU and outcome.reason is not None:
        return Message("config.peer_key_no_equivalent", peers=peers, reason=outcome.reason)
    reason_message = outcome.reason if outcome.reason is not None and outcome.reason.key not in (
        "import.reason_unset", "import.reason_flag_off") else Message("import.reason_no_meaning")
    return Message("config.peer_key_not_needed", peers=peers, reason=reason_message)
