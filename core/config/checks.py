"""Validation of run configurations: one checker per value kind, then the checks across keys.

Every problem is collected (never just the first) as a ``ConfigIssue`` naming the file, line and key.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.config.issues import ERROR, WARNING, ConfigIssue
from core.config.schema import (
    EIGHT_BIT_OPTIMIZERS,
    KEY_SPECS,
    LORA_ONLY_KEYS,
    OPTIMIZER_ALIASES,
    KeySpec,
    RunConfig,
    default_for,
    reference_path,
)
from core.i18n import t
from core.units import plural_key

# key -> (file, line) where the key was given; keys not in it were left at their default.
Locations = Mapping[str, "tuple[str, int | None]"]


class _Invalid(Exception):
    """A value a checker refuses; the message says what is allowed."""


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f"'{value}'"
    if value is None:
        return t("config.shown_null")
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _wrong_type(value: Any, expected_key: str) -> _Invalid:
    return _Invalid(t("config.wrong_type", given=_show(value), expected=t(expected_key)))


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise _wrong_type(value, "config.expect_int")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            number = float(value.strip().replace("_", ""))
        except ValueError:
            raise _wrong_type(value, "config.expect_int") from None
        if number.is_integer():
            return int(number)
    raise _wrong_type(value, "config.expect_int")


def _as_number(value: Any) -> float:
    if isinstance(value, bool):
        raise _wrong_type(value, "config.expect_number")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        # YAML 1.1 reads "1e-4" (no dot) as text; it is what people write for learning rates.
        try:
            number = float(value.strip().replace("_", ""))
        except ValueError:
            raise _wrong_type(value, "config.expect_number") from None
    else:
        raise _wrong_type(value, "config.expect_number")
    if not math.isfinite(number):
        raise _wrong_type(value, "config.expect_number")
    return number


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "on", "off"):
        return value.strip().lower() in ("true", "yes", "on")
    raise _wrong_type(value, "config.expect_bool")


def _as_text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _wrong_type(value, "config.expect_text")
    text = str(value).strip()
    if not text:
        raise _Invalid(t("config.empty_string"))
    return text


def _check_bounds(number: float, spec: KeySpec, given: Any) -> None:
    if spec.minimum is not None and number < spec.minimum:
        raise _Invalid(t("config.too_small", given=_show(given), minimum=_fmt(spec.minimum)))
    if spec.above is not None and number <= spec.above:
        raise _Invalid(t("config.too_small_above", given=_show(given), minimum=_fmt(spec.above)))
    if spec.maximum is not None and number > spec.maximum:
        raise _Invalid(t("config.too_large", given=_show(given), maximum=_fmt(spec.maximum)))
    if spec.below is not None and number >= spec.below:
        raise _Invalid(t("config.must_be_below", given=_show(given), maximum=_fmt(spec.below)))


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def _check_choice(value: Any, spec: KeySpec, key: str) -> Any:
    if key == "optimizer" and isinstance(value, str):
        value = OPTIMIZER_ALIASES.get(value.strip(), value.strip())
    if isinstance(value, str):
        value = value.strip()
        lowered = value.lower()
        for choice in spec.choices:
            if isinstance(choice, str) and choice == lowered:
                return choice
        # "zero_stage: '2'" is still a clear intent
        if all(isinstance(c, int) for c in spec.choices) and lowered.isdigit() and int(lowered) in spec.choices:
            return int(lowered)
    elif not isinstance(value, bool) and value in spec.choices:
        return value
    allowed = ", ".join(str(c) for c in spec.choices)
    raise _Invalid(t("config.wrong_choice", given=_show(value), allowed=allowed))


def _check_auto_bool(value: Any, spec: KeySpec) -> str | bool:
    """auto, a bool, or one of the key's named choices (``fused_ce: chunked``)."""
    if isinstance(value, str) and value.strip().lower() in ("auto", *spec.choices):
        return value.strip().lower()
    try:
        return _as_bool(value)
    except _Invalid:
        if spec.choices:
            allowed = ", ".join(("auto", "true", "false", *spec.choices))
            raise _Invalid(t("config.wrong_choice", given=_show(value), allowed=allowed)) from None
        raise _wrong_type(value, "config.expect_auto_bool") from None


def _check_int_or_choice(value: Any, spec: KeySpec) -> str | int:
    """One of the key's named choices (``checkpoint_layers: auto``) or a whole number in its bounds; a key
    whose choices name ``false`` takes YAML's booleans too (``tiled_mlp: false``, ``true`` = ``auto``)."""
    if isinstance(value, bool) and "false" in spec.choices:
        return "auto" if value else "false"
    if isinstance(value, str) and value.strip().lower() in ("true", "yes", "on") and "false" in spec.choices:
        return "auto"
    if isinstance(value, str) and value.strip().lower() in ("no", "off") and "false" in spec.choices:
        return "false"
    if isinstance(value, str) and value.strip().lower() in spec.choices:
        return value.strip().lower()
    try:
        number = _as_int(value)
    except _Invalid:
        allowed = ", ".join((*spec.choices, t("config.expect_int")))
        raise _Invalid(t("config.wrong_choice", given=_show(value), allowed=allowed)) from None
    _check_bounds(number, spec, value)
    return number


def _check_gpus(value: Any) -> str | int | list[int]:
    if isinstance(value, str) and value.strip().lower() == "all":
        return "all"
    if isinstance(value, str) and "," in value:  # "0,1" as CUDA_VISIBLE_DEVICES would say it
        value = [part for part in value.split(",") if part.strip()]
    if isinstance(value, (list, tuple)):
        if not value:
            raise _Invalid(t("config.empty_list"))
        indices: list[int] = []
        for item in value:
            try:
                index = _as_int(item)
            except _Invalid:
                raise _wrong_type(value, "config.expect_gpus") from None
            if index < 0:
                raise _wrong_type(value, "config.expect_gpus")
            if index in indices:
                raise _Invalid(t("config.duplicate_gpu", index=index))
            indices.append(index)
        return indices
    try:
        count = _as_int(value)
    except _Invalid:
        raise _wrong_type(value, "config.expect_gpus") from None
    if count < 1:
        raise _Invalid(t("config.too_small", given=_show(value), minimum=1))
    return count


def _check_text_list(value: Any, expected_key: str) -> list[str]:
    if not isinstance(value, (list, tuple)):
        raise _wrong_type(value, expected_key)
    if not value:
        raise _Invalid(t("config.empty_list"))
    out = []
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise _wrong_type(value, expected_key)
        out.append(item.strip())
    return out


def _check_dataset(value: Any) -> str | list[str]:
    if isinstance(value, str):
        return _as_text(value)
    items = _check_text_list(value, "config.expect_dataset")
    return items[0] if len(items) == 1 else items


def _check_targets(value: Any) -> str | list[str]:
    if isinstance(value, str):
        text = value.strip()
        if text in ("all-linear", "all_linear", "all"):  # "all" is LLaMA-Factory's spelling
            return "all-linear"
        if text and "," in text:
            return [part.strip() for part in text.split(",") if part.strip()]
        if text:
            return [text]
        raise _Invalid(t("config.empty_string"))
    items = _check_text_list(value, "config.expect_targets")
    return "all-linear" if len(items) == 1 and items[0] in ("all-linear", "all_linear", "all") else items


def check_value(key: str, value: Any) -> Any:
    """The clean value of ``key`` (e.g. ``"1e-4"`` → ``0.0001``); raises ``ValueError`` with the reason."""
    spec = KEY_SPECS[key]
    try:
        return _check(key, value, spec)
    except _Invalid as exc:
        raise ValueError(str(exc)) from None


def _check(key: str, value: Any, spec: KeySpec) -> Any:
    if value is None:
        if spec.optional:
            return None
        raise _Invalid(t("config.wrong_type", given=_show(value), expected=_expected(spec)))
    kind = spec.kind
    if kind == "int":
        number = _as_int(value)
        _check_bounds(number, spec, value)
        return number
    if kind == "number":
        number = _as_number(value)
        _check_bounds(number, spec, value)
        return number
    if kind == "bool":
        return _as_bool(value)
    if kind == "text":
        return _as_text(value)
    if kind == "choice":
        return _check_choice(value, spec, key)
    if kind == "auto_bool":
        return _check_auto_bool(value, spec)
    if kind == "int_or_choice":
        return _check_int_or_choice(value, spec)
    if kind == "gpus":
        return _check_gpus(value)
    if kind == "dataset":
        return _check_dataset(value)
    if kind == "targets":
        return _check_targets(value)
    raise AssertionError(f"no checker for kind {kind!r}")


def _expected(spec: KeySpec) -> str:
    names: dict[str, Callable[[], str]] = {
        "int": lambda: t("config.expect_int"),
        "number": lambda: t("config.expect_number"),
        "bool": lambda: t("config.expect_bool"),
        "text": lambda: t("config.expect_text"),
        "auto_bool": lambda: t("config.expect_auto_bool"),
        "gpus": lambda: t("config.expect_gpus"),
        "dataset": lambda: t("config.expect_dataset"),
        "targets": lambda: t("config.expect_targets"),
        "choice": lambda: ", ".join(str(c) for c in spec.choices),
        "int_or_choice": lambda: ", ".join((*spec.choices, t("config.expect_int"))),
    }
    return names[spec.kind]()


def override_examples(key: str) -> list[str]:
    """Right ``key=value`` overrides for a known key (``gpus=[0,1]``, ``gpus=2``); [] for an unknown one.
    Lists are written without spaces: a shell splits ``gpus=[0, 1]`` into two arguments."""
    spec = KEY_SPECS.get(key)
    if spec is None:
        return []
    if spec.kind == "gpus":
        return [f"{key}=[0,1]", f"{key}=2"]
    if spec.kind == "targets":
        return [f"{key}=[q_proj,v_proj]", f"{key}=all-linear"]
    if spec.kind == "dataset":
        return [f"{key}=train.jsonl", f"{key}=[a.jsonl,b.jsonl]"]
    if spec.kind in ("choice", "int_or_choice"):
        return [f"{key}={spec.choices[0]}"]
    if spec.kind in ("bool", "auto_bool"):
        return [f"{key}=true"]
    if spec.kind == "int":  # the key's default where it is a number (max_seq_len=2048, not its floor 16)
        default = default_for(key)
        typical = default if isinstance(default, int) and not isinstance(default, bool) and default >= (spec.minimum or 1) \
            else int(max(spec.minimum or 1, 1))
        return [f"{key}={typical}"]
    if spec.kind == "number":
        small = (spec.below is not None and spec.below <= 1) or (spec.maximum is not None and spec.maximum <= 1)
        return [f"{key}={'0.1' if small else '2'}"]
    return [f"{key}=my-value"]


def cli_value(key: str, kind: Callable[[str], Any] = int) -> Callable[[str], Any]:
    """An argparse ``type`` for an option that stands for the run-config key ``key`` (``--seq-len`` for
    ``max_seq_len``): the text read as ``kind``, then held to the key's own limits, so that a command
    refuses what a run config would (``got -1; must be at least 0``)."""
    return _cli_type(key, KEY_SPECS[key], kind)


def cli_number(kind: Callable[[str], Any] = int, minimum: float | None = None, above: float | None = None,
               maximum: float | None = None) -> Callable[[str], Any]:
    """An argparse ``type`` for a number that is no run-config key (a price, a token count) in bounds:
    ``cli_value`` with limits of its own rather than a key's."""
    spec = KeySpec("int" if kind is int else "number", minimum=minimum, above=above, maximum=maximum)
    return _cli_type("number", spec, kind)


def _cli_type(name: str, spec: KeySpec, kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """The one argparse ``type`` behind ``cli_value`` and ``cli_number``: the text read as ``kind`` (an
    int, or a finite float), then checked as a run config's value of ``spec`` is."""
    import argparse

    def convert(text: str) -> Any:
        try:
            number = kind(text)
            if isinstance(number, float) and not math.isfinite(number):
                raise ValueError(text)
        except ValueError:
            raise argparse.ArgumentTypeError(t("config.wrong_type", given=_show(text), expected=t(
                "config.expect_int" if kind is int else "config.expect_number"))) from None
        try:
            return _check(name, number, spec)
        except _Invalid as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name  # argparse names the type in its own "invalid ... value" message
    return convert


def suggest_key(key: str) -> str | None:
    """The known key closest to a misspelt one, if any is close enough."""
    candidates = list(KEY_SPECS)
    normalised = key.replace("-", "_").replace(".", "_").lower()
    if normalised in KEY_SPECS:
        return normalised
    close = difflib.get_close_matches(normalised, candidates, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_key_message(key: str) -> str:
    from core.config.peers import peer_suggestion

    peer = peer_suggestion(key)  # a LLaMA-Factory / ms-swift name: what it means here, not a look-alike
    if peer is not None:
        return peer.text()
    suggestion = suggest_key(key)
    if suggestion:
        return t("config.unknown_key", suggestion=suggestion)
    return t("config.unknown_key_no_suggestion", reference=reference_path())


def section_unknown_key_message(parts: list[str]) -> str:
    """An unknown key inside a section as the user wrote it (``lora: {bogus: 3}``, ``parts`` ``["lora",
    "bogus"]``): the keys that section takes, and a close match only among them, not the whole schema's
    nearest look-alike (``lora_bogus`` is not close to ``qlora_upcast`` in any sense a user means)."""
    from core.config.peers import peer_suggestion

    peer = peer_suggestion("_".join(parts))
    if peer is not None:
        return peer.text()
    section, dotted = "_".join(parts[:-1]), ".".join(parts[:-1])
    leaves = [key[len(section) + 1:] for key in KEY_SPECS if key.startswith(section + "_")]
    keys = ", ".join(f"{dotted}.{leaf}" for leaf in leaves)
    flat = f"{section}_{leaves[0]}" if leaves else section
    close = difflib.get_close_matches(parts[-1].replace("-", "_").lower(), leaves, n=1, cutoff=0.6)
    if close:
        return t("config.section_unknown_key", section=dotted, keys=keys, flat=flat,
                 suggestion=f"{dotted}.{close[0]}")
    return t("config.section_unknown_key_no_suggestion", section=dotted, keys=keys, flat=flat)


def check_values(values: Mapping[str, Any], locations: Locations, default_file: str) -> tuple[dict, list]:
    """Check each given key on its own; returns the clean values and the issues."""
    clean: dict[str, Any] = {}
    issues: list[ConfigIssue] = []
    for key, value in values.items():
        file, line = locations.get(key, (default_file, None))
        if key not in KEY_SPECS:
            issues.append(ConfigIssue(file, line, key, unknown_key_message(key)))
            continue
        try:
            clean[key] = check_value(key, value)
        except ValueError as exc:
            issues.append(ConfigIssue(file, line, key, str(exc)))
    return clean, issues


def looks_like_local_path(value: str) -> bool:
    """A model written as a path (``/x``, ``./x``, ``~/x``, ``C:\\x``) rather than a hub id ``owner/name``."""
    return value.startswith(("/", "./", "../", "~", "\\")) or (len(value) > 2 and value[1] == ":")


def run_file_dir(source: str) -> Path | None:
    """The directory of the run file ``source``, where relative paths in it are also looked for; None for
    a config that is no file (the app's own, an override)."""
    path = Path(source)
    return path.resolve().parent if path.is_file() else None


def model_as_launched(model: Any, yaml_dir: Path | None) -> Any:
    """A model written as a path (``./m``, ``../m``, ``~/m``), as the launch will have it
    (``core.runs.lifecycle._absolute_local_paths``): the absolute path of the first of
    ``core.data.registry.local_places`` that exists; anything else (a hub id, ``tiny``, a path found in
    neither place) as written."""
    if not isinstance(model, str) or not looks_like_local_path(model):
        return model
    from core.data.registry import find_local

    found = find_local(model, [yaml_dir] if yaml_dir is not None else [])
    return str(found) if found is not None else model


def _capability(gpu_caps: Any, name: str, default: Any = None) -> Any:
    if gpu_caps is None:
        return default
    if isinstance(gpu_caps, Mapping):
        return gpu_caps.get(name, default)
    return getattr(gpu_caps, name, default)


def check_combinations(
    config: RunConfig,
    locations: Locations,
    default_file: str,
    gpu_caps: Any = None,
) -> list[ConfigIssue]:
    """Checks across keys, and against the GPUs when ``gpu_caps`` describes them.

    ``gpu_caps`` is a mapping or an object with any of: ``name`` (str), ``bf16`` (bool), ``count``
    (number of GPUs), ``compute_capability`` (e.g. 8.0 or "8.0"), ``cuda`` (bool: any NVIDIA GPU).
    Unknown capabilities are not checked.
    """
    issues: list[ConfigIssue] = []

    def where(*keys: str) -> tuple[str, int | None, str]:
        for key in keys:  # the first key the user actually wrote carries the line
            if key in locations:
                file, line = locations[key]
                return file, line, key
        return default_file, None, keys[0]

    def add(message: str, *keys: str, severity: str = ERROR) -> None:
        file, line, key = where(*keys)
        issues.append(ConfigIssue(file, line, key, message, severity))

    if config.model is None:
        add(t("config.required", hint=t("config.required_model")), "model")
    elif looks_like_local_path(config.model):
        yaml_dir = run_file_dir(default_file)  # a run file next to its model folder, started from elsewhere
        if not Path(model_as_launched(config.model, yaml_dir)).expanduser().is_dir():
            from core.data.registry import local_places

            looked = ", ".join(str(place) for place in local_places(config.model, [yaml_dir] if yaml_dir else []))
            add(t("config.model_dir_missing", path=config.model, looked=looked), "model")
    if config.dataset is None:
        add(t("config.required", hint=t("config.required_dataset")), "dataset")

    if config.method == "qlora" and config.zero_stage == 3:
        add(t("config.qlora_zero3"), "zero_stage", "method")
    if config.method == "full":
        for key in LORA_ONLY_KEYS:
            # A resolved file carries every key; only a value changed from the default is a mistake.
            if key in locations and getattr(config, key) != default_for(key):
                add(t("config.lora_key_with_full"), key)
    if config.pure_bf16 and config.precision != "bf16":
        add(t("config.fp16_pure_bf16", precision=config.precision), "pure_bf16", "precision")
    if config.pure_bf16 and config.is_lora and "pure_bf16" in locations:
        add(t("config.pure_bf16_lora", method=config.method), "pure_bf16", severity=WARNING)
    if config.offload != "none" and config.zero_stage < 2:
        add(t("config.offload_needs_zero", stage=config.zero_stage), "offload", "zero_stage")
    elif config.offload == "all" and config.zero_stage != 3:
        add(t("config.offload_all_needs_zero3"), "offload", "zero_stage")
    if config.offload != "none" and config.optimizer in EIGHT_BIT_OPTIMIZERS:
        add(t("config.offload_8bit_optimizer", optimizer=config.optimizer), "optimizer", "offload")
    if config.optimizer in ("adafactor", "sgd"):
        for key in ("adam_beta1", "adam_beta2", "adam_epsilon"):
            if key in locations and getattr(config, key) != default_for(key):
                add(t("config.adam_key_unused", optimizer=config.optimizer), key, "optimizer", severity=WARNING)
    if "epochs" in locations and "max_steps" in locations and config.epochs is not None \
            and config.max_steps is not None:
        add(t("config.epochs_and_max_steps"), "max_steps", "epochs")
    if config.warmup_ratio is not None and config.warmup_steps is not None \
            and "warmup_ratio" in locations and "warmup_steps" in locations:
        add(t("config.warmup_both"), "warmup_steps", "warmup_ratio")
    if config.eval_steps is not None and config.eval_split == 0:
        add(t("config.eval_steps_without_split"), "eval_steps", "eval_split")
    if config.attn == "flash" and config.precision == "fp32":
        add(t("config.flash_needs_half"), "attn", "precision")

    # Against the hardware, when known.
    gpu_name = _capability(gpu_caps, "name") or t("config.this_gpu")
    count = _capability(gpu_caps, "count")
    if _capability(gpu_caps, "bf16") is False and (config.precision == "bf16" or config.pure_bf16):
        add(t("config.no_bf16", gpu=gpu_name), "precision", "pure_bf16")
    if _capability(gpu_caps, "cuda") is False and config.method == "qlora":
        add(t("config.qlora_needs_cuda"), "method")
    capability = _capability(gpu_caps, "compute_capability")
    try:
        cc = float(capability) if capability is not None else None
    except (TypeError, ValueError):
        cc = None
    if cc is not None and cc < 8.0:
        if config.attn == "flash":
            add(t("config.flash_old_gpu", gpu=gpu_name, cc=capability), "attn")
        if config.tf32 is True:
            add(t("config.tf32_old_gpu", gpu=gpu_name), "tf32", severity=WARNING)
    if isinstance(count, int) and not isinstance(count, bool):
        if isinstance(config.gpus, list):
            for index in config.gpus:
                if index >= count:
                    add(t(plural_key("config.gpu_index_missing", count), index=index, count=count,
                          last=max(count - 1, 0)), "gpus")
        elif isinstance(config.gpus, int) and config.gpus > count:
            add(t("config.gpu_count_too_many", wanted=config.gpus, count=count), "gpus")
    used = config.requested_gpu_count()
    if used is None and isinstance(count, int):
        used = count
    if config.zero_stage > 0 and used == 1:
        add(t("config.zero_one_gpu", stage=config.zero_stage), "zero_stage", severity=WARNING)
    return issues


def check_for_training(config: RunConfig, locations: Locations, default_file: str,
                       probe: bool = True) -> list[ConfigIssue]:
    """What ``train`` (and ``train --check``, the same checks) needs of the box beyond the file itself,
    each naming the key's file and line: a model that can be had (``model_checks.model_problem``; the hub
    is probed unless ``probe`` is False), ``dataset`` entries that name something (a missing file; the
    data itself is read later) and an ``output`` folder that is absent or empty (a finished model is never
    overwritten). Nothing is written."""
    from core.config.model_checks import model_problem

    issues: list[ConfigIssue] = []

    def add(message: str, key: str, severity: str = ERROR, named: bool = True) -> None:
        file, line = locations.get(key, (default_file, None))
        issues.append(ConfigIssue(file, line, key if named else None, message, severity))

    yaml_dir = run_file_dir(default_file)
    if config.model:  # a local path as the launch will find it: from here, else from the file's folder
        found = model_problem(str(model_as_launched(config.model, yaml_dir)), config.hub, probe=probe)
        if found is not None:
            add(found[1], "model", found[0])
    if config.dataset:  # entries that name nothing (a missing file): said at the dataset key's line
        import copy

        from core.data.registry import anchor_dataset_keys, resolve_sources_and_issues

        anchored = copy.copy(config)  # the keys as train will have them: from here, else the file's folder
        anchor_dataset_keys(anchored, yaml_dir)
        _, missing = resolve_sources_and_issues(
            anchored.dataset, anchored.hub, anchored.dataset_info, anchored.dataset_dir, base_dir=yaml_dir,
            split=anchored.split)
        for problem in missing:
            add(f"{problem.file}: {problem.message}", "dataset")
    if config.output:
        from core.runs.output import output_problem, resolve_output

        problem = output_problem(resolve_output(str(config.output)))  # as the launch resolves it
        if problem is not None:  # its message starts with "output:" itself
            add(problem.text(), "output", named=False)
    return issues


def validate(config: RunConfig, gpu_caps: Any = None, source: str = "<config>") -> list[ConfigIssue]:
    """Every problem of an already-built ``RunConfig`` (errors and warnings), e.g. one edited in the app.

    Keys whose value differs from the default count as given by the user.
    """
    values = config.to_dict()
    locations = {key: (source, None) for key, value in values.items() if value != default_for(key)}
    _, issues = check_values(values, {}, source)
    return issues + check_combinations(config, locations, source, gpu_caps)
