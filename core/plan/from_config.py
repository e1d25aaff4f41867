"""``tunedeck plan --config FILE``: re-plan a run file (a tunedeck YAML, or a LLaMA-Factory / ms-swift file as
``tunedeck import`` converts it) for this box, keeping the user's choices.

The file's model, data and the keys that say what is trained (``method``, ``lora_rank``, ``max_seq_len``,
``overlong``, ``thinking``; a LoRA key without a method pins the LoRA method the run trains) are pinned as ``--set``
pins them; a user DeepSpeed JSON's concrete values (its
ZeRO stage, offload, batch sizes, precision) likewise. What depends on the box (precision, the micro-batch and
accumulation, ZeRO, offload, checkpointing, GPUs) is planned again, the file's effective batch and epochs kept.
The command line wins: ``--model``, ``--dataset``, ``--epochs``, ``--effective-batch`` and ``--set`` (``FIELD=auto``
lets the planner choose a field the file pins). ``--save`` writes the file's keys with the plan's in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.i18n import t

# Run keys of a file pinned in the plan (the planner's field each stands for: ``FIELD_OF_CONFIG_KEY``).
PINNED_KEYS = ("method", "lora_rank", "max_seq_len", "overlong", "thinking")
# Run keys the plan decides for the box: a saved re-plan takes the plan's (or drops the file's, where the plan
# writes none, such as ``pure_bf16`` under a plan in fp32).
PLANNED_KEYS = ("precision", "pure_bf16", "micro_batch_size", "gradient_accumulation", "gradient_checkpointing",
                "gpus", "zero_stage", "offload", "offload_activations", "ce_chunk_tokens")
# A DeepSpeed JSON's values that pin the plan (run key → planner field), as the run reconciles them.
DEEPSPEED_PINS = {"zero_stage": "zero_stage", "offload": "offload", "micro_batch_size": "micro_batch_size",
                  "gradient_accumulation": "grad_accum_steps", "precision": "precision"}


@dataclass
class PlanConfig:
    """A run file read for planning: its keys (paths made absolute), the checked config, what it pins."""

    path: str
    values: dict[str, Any]
    config: Any  # core.config.RunConfig
    imported: Any = None  # core.config.importers.ImportResult of a peer's file
    # planner field -> (its value, the run key it was given as, where: "run.yaml:7", "ds.json: zero_optimization.stage")
    pins: dict[str, tuple[Any, str, str]] = field(default_factory=dict)
    lines: dict[str, int | None] = field(default_factory=dict)
    # the run keys the file gives; a peer's file: with the peer's defaults ``tunedeck import`` filled in for keys it
    # leaves out (ms-swift's lora_rank 8), which the peer trains with as much as with the keys the file writes
    given: set[str] = field(default_factory=set)
    # of those, the peer's defaults (said as the peer's default, not as a line of the file)
    peer_defaults: set[str] = field(default_factory=set)
    # the run keys the command line set in place of the file's (``--model``, ``--dataset``, ``--set KEY=VALUE``)
    decided: set[str] = field(default_factory=set)
    # run keys ``--set`` gave that are no planner field (``learning_rate=2e-5``): in the checked config and the save
    set_keys: dict[str, Any] = field(default_factory=dict)

    def open_lines(self) -> list[Any]:
        """A peer's file's lines that still need the user in the saved re-plan: less those the command line decided
        (``--model ID`` for a file's ``--model $MODEL``: the saved file holds its value, nothing is left to do)."""
        from core.config.importers import NEEDS_YOU, _target_key

        if self.imported is None:
            return []
        return [line for line in self.imported.mapping
                if line.verdict == NEEDS_YOU and _target_key(line, self.imported.peer) not in self.decided]

    def where(self, key: str) -> str:
        line = self.lines.get(key)
        if not line and key in self.peer_defaults and self.imported is not None:
            return t("plan.config_peer_default", path=self.path, peer=self.imported.peer_name)
        return f"{self.path}:{line}" if line else self.path

    @property
    def effective_batch(self) -> int | None:
        """The file's effective batch (micro-batch × accumulation × its GPU count, one where it gives none):
        None where it gives neither the micro-batch nor the accumulation (the planner's default then)."""
        if not {"micro_batch_size", "gradient_accumulation"} & self.given:
            return None
        gpus = self.config.requested_gpu_count() or 1
        return int(self.config.micro_batch_size) * int(self.config.gradient_accumulation) * gpus

    @property
    def epochs(self) -> float | None:
        return float(self.config.epochs) if self.config.epochs is not None else None


def split_set_items(items: list[str]) -> tuple[list[str], list[str]]:
    """``plan --config``'s ``--set`` items as (the planner's fields, run keys the plan keeps as given): a run key that
    is no planner field (``learning_rate=2e-5``, ``eval_split=0.05``) goes into the file's values, as ``train FILE
    key=value`` takes it; one the plan decides for the box (``gpus``, ``pure_bf16``) is refused saying what --set
    takes. Anything else stays with the planner's fields (whose reading refuses it with the fields it takes)."""
    from core.config.schema import KEY_SPECS
    from core.plan.overrides import FIELD_OF_CONFIG_KEY, OverrideError
    from core.plan.request import OVERRIDABLE, RUN_KEYS

    planner: list[str] = []
    run: list[str] = []
    for item in items:
        name = item.partition("=")[0].strip().replace("-", "_").replace(".", "_")
        if "=" not in item or FIELD_OF_CONFIG_KEY.get(name, name) in OVERRIDABLE + RUN_KEYS or name not in KEY_SPECS:
            planner.append(item)
        elif name in PLANNED_KEYS:
            raise OverrideError(t("plan.error.set_planned_key", text=item.strip(), key=name,
                                  fields=", ".join(OVERRIDABLE + RUN_KEYS)))
        else:
            run.append(item)
    return planner, run


def load_plan_config(path: str, model: str | None = None, dataset: str | None = None,
                     run_items: list[str] | tuple[str, ...] = ()) -> PlanConfig:
    """Read and check ``path`` (raises CliError naming file, line and key; a peer file's own errors as
    ``tunedeck import`` says them). ``model``, ``dataset``: the command line's, in place of the file's (a file whose
    model is a shell variable, ``--model $MODEL``, is planned with ``plan --config run.sh --model ID``).
    ``run_items``: ``--set KEY=VALUE`` of run keys (``split_set_items``), applied on top as ``train`` applies them."""
    from core.config import ConfigError
    from core.config.importers import detect_peer, import_file, load_imported_config
    from core.errors import CliError

    if Path(path).is_dir():
        raise CliError(t("plan.error.config_folder", path=path), 2)
    if not Path(path).is_file():
        raise CliError(t("plan.error.config_missing", path=path), 2)
    imported = None
    lines: dict[str, int | None] = {}
    given = {"model": model, "dataset": dataset}
    overrides = [f"{key}={value}" for key, value in given.items() if value] + list(run_items)
    try:
        if detect_peer(path):
            imported = import_file(path)
            values = dict(imported.config)
            config = load_imported_config(imported, overrides)
        else:
            from core.config.loader import _read_yaml_mapping, load_run_config

            config = load_run_config(path, overrides)
            values, locations, _issues = _read_yaml_mapping(Path(path))
            lines = {key: line for key, (_file, line) in locations.items()}
    except ConfigError as exc:
        raise CliError(t("plan.error.config_file", path=path, problem=str(exc)), 2) from exc
    if imported is not None:
        lines = _peer_lines(path, imported)
    # a peer's defaults are what the peer trains with (its LoRA rank, batch, learning rate): kept as its keys are
    keys_given = set(values) if imported is None else {key for line in imported.mapping
                                                  if line.verdict == "taken" for key in line.outcome.values}
    peer_defaults = set() if imported is None else {key for line in imported.mapping
                                                    if line.verdict == "taken" and line.default
                                                    for key in line.outcome.values}
    values.update({key: value for key, value in given.items() if value})
    set_keys = _set_values(run_items)
    values.update(set_keys)
    plan_config = PlanConfig(path, values, config, imported, lines=lines, given=keys_given | set(set_keys),
                             peer_defaults=peer_defaults - set(set_keys),
                             decided={key for key, value in given.items() if value} | set(set_keys),
                             set_keys=set_keys)
    _anchor(plan_config)
    plan_config.pins = _pins(plan_config)
    return plan_config


def _set_values(run_items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The run keys ``--set`` gave, as the checked config reads them (``None``: the key's default, as ``key=``)."""
    from core.config.checks import check_value
    from core.config.loader import parse_override

    out: dict[str, Any] = {}
    for item in run_items:
        key, value = parse_override(item)  # checked already with the file (load_run_config)
        checked = check_value(key, value) if value is not None else None
        # an integer stays one (lora_alpha=64, not 64.0), as tunedeck import keeps a peer's
        out[key] = value if type(value) is int and checked == value else checked
    return out


def _peer_lines(path: str, imported: Any) -> dict[str, int | None]:
    """The line of the peer's key each run key came from (a YAML's or an args.json's; a command line: none)."""
    import yaml

    from core.config.importers import is_json_text, json_key_lines

    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # as the importer reads it: a BOM is not text
    except (OSError, UnicodeDecodeError):
        return {}
    if is_json_text(path, text):  # read as the importer reads it: as JSON, not as YAML
        peer_lines = json_key_lines(text)
    else:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            return {}
        if not isinstance(root, yaml.MappingNode):
            return {}
        peer_lines = {str(key.value): key.start_mark.line + 1 for key, _value in root.value
                      if isinstance(key, yaml.ScalarNode)}
    out: dict[str, int | None] = {}
    for line in imported.mapping:
        if line.verdict == "taken" and line.key in peer_lines:
            for key in line.outcome.values:
                out.setdefault(key, peer_lines[line.key])
    return out


def _anchor(plan_config: PlanConfig) -> None:
    """The file's model and data paths as a run of it finds them: from the current folder, else the file's."""
    from types import SimpleNamespace

    from core.config.checks import model_as_launched, run_file_dir
    from core.data.registry import anchor_dataset_keys

    yaml_dir = run_file_dir(plan_config.path)
    values = plan_config.values
    if isinstance(values.get("model"), str):
        values["model"] = model_as_launched(values["model"], yaml_dir)
    holder = SimpleNamespace(dataset=values.get("dataset"), dataset_dir=values.get("dataset_dir"),
                             dataset_info=values.get("dataset_info"))
    if holder.dataset is not None:
        anchor_dataset_keys(holder, yaml_dir)
        for key in ("dataset", "dataset_dir", "dataset_info"):
            if getattr(holder, key):
                values[key] = getattr(holder, key)
    if plan_config.config.deepspeed:  # the JSON the check found (from the file's folder too)
        values["deepspeed"] = plan_config.config.deepspeed


def _pins(plan_config: PlanConfig) -> dict[str, tuple[Any, str, str]]:
    """The planner fields the file pins, with where (``PINNED_KEYS``, a DeepSpeed JSON's values)."""
    from core.config.schema import LORA_ONLY_KEYS
    from core.plan.overrides import FIELD_OF_CONFIG_KEY, parse_override_value

    config = plan_config.config
    pins: dict[str, tuple[Any, str, str]] = {}
    lora_keys = [key for key in LORA_ONLY_KEYS if key in plan_config.given]
    if "method" not in plan_config.given and lora_keys and config.is_lora:
        # a file with lora_rank and no method trains LoRA (the run's default method): planned as that, not as a
        # full fine-tune that drops its LoRA keys; said at the LoRA key's line
        name = FIELD_OF_CONFIG_KEY.get("method", "method")
        pins[name] = (parse_override_value(name, config.method, "method"), "method", plan_config.where(lora_keys[0]))
    for key in PINNED_KEYS:
        if key not in plan_config.given or (key == "lora_rank" and not config.is_lora):
            continue
        value = getattr(config, key)
        if value is None:
            continue
        name = FIELD_OF_CONFIG_KEY.get(key, key)
        text = str(value).lower() if isinstance(value, bool) else str(value)
        pins[name] = (parse_override_value(name, text, key), key, plan_config.where(key))
    if config.deepspeed:
        from core.config.deepspeed_file import _json_values, read_deepspeed_json

        json_values = _json_values(read_deepspeed_json(config.deepspeed))
        for key, name in DEEPSPEED_PINS.items():
            if key in json_values and json_values[key][1] != "auto":
                value = getattr(config, key)
                if name == "precision" and config.pure_bf16:
                    value = "pure-bf16"
                pins[name] = (value, key, f"{Path(config.deepspeed).name}: {json_values[key][0]}")
    return pins


def merged_overrides(plan_config: PlanConfig, cli_items: list[str]) -> dict[str, Any]:
    """The planner's pinned values: the file's, then ``--set`` on top (``FIELD=auto`` unpins one); a LoRA rank
    is not pinned for a full fine-tune."""
    from core.plan.overrides import parse_overrides

    values = {name: value for name, (value, _key, _where) in plan_config.pins.items()}
    for item in cli_items:
        name_text = item.partition("=")[0]
        parsed = parse_overrides([item])
        if parsed:
            values.update(parsed)
        else:  # ``FIELD=auto`` (or empty): the planner chooses it
            from core.plan.overrides import FIELD_OF_CONFIG_KEY

            name = name_text.strip().replace("-", "_").replace(".", "_")
            values.pop(FIELD_OF_CONFIG_KEY.get(name, name), None)
    if values.get("method", plan_config.config.method) == "full":
        values.pop("lora_rank", None)
    return values


def replanned_values(plan_config: PlanConfig, plan_values: dict[str, Any], model: str | None,
                     dataset: Any, epochs_given: bool = False) -> dict[str, Any]:
    """The file's keys with the plan's in place (``run_config_values``): what ``--save`` writes. The file's model
    and data unless the command line gave others; its learning rate, LoRA alpha and hub kept where it gives them
    (a full fine-tune the command line asked for drops its LoRA keys, a plan in fp32 its attn: flash).
    ``epochs_given``: the command line's ``--epochs``, which the plan was made for: it replaces the file's max_steps."""
    from core.config.peers import LLAMAFACTORY
    from core.config.schema import LORA_ONLY_KEYS

    out = dict(plan_config.values)
    for key in PLANNED_KEYS:
        out.pop(key, None)
    keep = {"learning_rate", "lora_alpha", "hub"} & plan_config.given
    if "lora_alpha" in plan_config.peer_defaults and plan_config.imported.peer == LLAMAFACTORY \
            and plan_values.get("lora_rank") != out.get("lora_rank"):
        keep.discard("lora_alpha")  # LLaMA-Factory's alpha is twice the rank: the plan's rank's (--set lora_rank=auto)
    for key, value in plan_values.items():
        if key in keep:
            continue
        if key == "model" and model is None:  # the file's, a bundled config's name as its hub id on the file's hub
            from core.estimate.model_source import bundled_hub_id

            file_model = str(out["model"])
            hub = str(out.get("hub") or "modelscope")
            out["model"] = file_model if Path(file_model).expanduser().exists() else \
                bundled_hub_id(file_model, hub) or file_model
            continue
        if key == "dataset" and dataset is None:
            continue
        out[key] = value
    if epochs_given:  # the epochs the plan's time is for, not the file's max_steps
        out.pop("max_steps", None)
    elif out.get("epochs") is not None and out.get("max_steps") is not None and "epochs" not in plan_config.given:
        out.pop("epochs")  # the file's max_steps ends its run, as before
    if out.get("attn") == "flash" and plan_values.get("precision") == "fp32":
        out.pop("attn")  # flash-attention needs a GPU in bf16/fp16: a plan in fp32 (a CPU) runs the default
    if plan_values.get("method") == "full":
        for key in LORA_ONLY_KEYS:
            out.pop(key, None)
    return out


def save_replanned(plan_config: PlanConfig, values: dict[str, Any], path: str, hardware: str,
                   overwrite: bool) -> Path:
    """Write the re-planned run file (checked as ``train`` checks one; raises ConfigError), headed by where it came
    from and, for a peer's file, the keys that need the user."""
    from core.atomic_file import shared_file_mode, write_atomic
    from core.config import RunConfig

    config = RunConfig.from_dict(values, source=t("plan.config_source"))
    header = [t("plan.config_header", path=plan_config.path, hardware=hardware)]
    header += [line.text() for line in plan_config.open_lines()]
    text = "".join(f"# {line}\n" for line in header)
    target = Path(path)
    if not overwrite and target.exists():
        raise FileExistsError(str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, config.to_yaml(header=text), shared_file_mode(target))
    return target
