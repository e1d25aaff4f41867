"""Reading a run YAML file and ``key=value`` overrides into a checked ``RunConfig``.

The YAML is composed node by node so that every key keeps its line for error messages; a nested
mapping (``lora: {rank: 16}``) is flattened to ``lora_rank``, and an override ``lora.rank=16`` likewise.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.config.checks import (
    check_combinations,
    check_values,
    override_examples,
    section_unknown_key_message,
    unknown_key_message,
)
from core.config.issues import ConfigError, ConfigIssue
from core.config.schema import KEY_SPECS, RunConfig, resolve_defaults
from core.i18n import t

OVERRIDE_SOURCE = "command line"


def _flat_key(parts: list[str]) -> str:
    return "_".join(parts)


def _is_section_name(key: str) -> bool:
    """``lora`` names a section only because ``lora_rank`` and its siblings are real keys."""
    return key not in KEY_SPECS and any(k.startswith(key + "_") for k in KEY_SPECS)


def _is_section(key: str, value_node: Any) -> bool:
    """``lora: {rank: ..}`` is a section only because ``lora_rank`` and its siblings are real keys."""
    import yaml

    return isinstance(value_node, yaml.MappingNode) and _is_section_name(key)


def _nested_keys(node: Any, path: list[str], prefix: list[str]) -> tuple[list[str], list[str]]:
    """In a mapping that is no section (``training: {epochs: 2}``): the keys it holds that are run keys
    when written flat, as ``training.epochs → epochs: 2``, and the dotted paths of those that are not."""
    import yaml

    known: list[str] = []
    unknown: list[str] = []
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        here, parts = path + [str(key_node.value)], prefix + [str(key_node.value)]
        flat = _flat_key(parts)
        if _is_section(flat, value_node):
            more_known, more_unknown = _nested_keys(value_node, here, parts)
            known, unknown = known + more_known, unknown + more_unknown
        elif flat in KEY_SPECS:
            if isinstance(value_node, yaml.ScalarNode):
                shown = value_node.value if value_node.style is None else f'"{value_node.value}"'
            else:
                shown = yaml.safe_dump(yaml.safe_load(yaml.serialize(value_node)), default_flow_style=True,
                                       width=1000).strip()
            known.append(t("config.nested_move", path=".".join(here), key=flat, value=shown))
        else:
            unknown.append(".".join(here))
    return known, unknown


def _read_yaml_mapping(path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, int | None]], list[ConfigIssue]]:
    """Values, where each key was given, and problems of the file itself."""
    import yaml

    file = str(path)
    values: dict[str, Any] = {}
    locations: dict[str, tuple[str, int | None]] = {}
    issues: list[ConfigIssue] = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return values, locations, [ConfigIssue(file, None, None, t("config.file_missing"))]
    except (OSError, UnicodeDecodeError) as exc:
        return values, locations, [ConfigIssue(file, None, None, t("config.file_unreadable", reason=exc))]
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        if mark is not None:
            problem = f"{problem} (column {mark.column + 1})"
        return values, locations, [ConfigIssue(file, line, None, t("config.yaml_syntax", problem=problem))]
    if root is None:
        return values, locations, [ConfigIssue(file, None, None, t("config.empty_file"))]
    if not isinstance(root, yaml.MappingNode):
        kind = t("config.kind_list") if isinstance(root, yaml.SequenceNode) else t("config.kind_scalar")
        return values, locations, [ConfigIssue(file, root.start_mark.line + 1, None,
                                               t("config.not_a_mapping", kind=kind))]

    def walk(node: yaml.MappingNode, prefix: list[str]) -> None:
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                issues.append(ConfigIssue(file, line, None, t("config.non_string_key", given="a collection")))
                continue
            parts = prefix + [str(key_node.value)]
            key = _flat_key(parts)
            # A section (lora: {rank: ..}) only when the flattened names are real keys.
            if _is_section(key, value_node):
                walk(value_node, parts)
                continue
            if isinstance(value_node, yaml.MappingNode) and key not in KEY_SPECS:
                known, unknown = _nested_keys(value_node, parts, [])
                if known:  # training: {epochs: 2}: keys are flat, and these are the keys meant
                    message = t("config.nested_section", moves="; ".join(known))
                    if unknown:
                        message = t("config.nested_section_unknown", message=message, paths=", ".join(unknown))
                    issues.append(ConfigIssue(file, line, key, message))
                    continue
            if prefix and key not in KEY_SPECS:  # lora: {bogus: 3}: said as written, with the section's keys
                issues.append(ConfigIssue(file, line, ".".join(parts), section_unknown_key_message(parts)))
                continue
            if key in locations:
                first = locations[key][1]
                issues.append(ConfigIssue(file, line, key, t("config.duplicate_key", first=first)))
                continue
            try:
                value = yaml.safe_load(yaml.serialize(value_node))
            except yaml.YAMLError as exc:  # e.g. an unknown tag
                issues.append(ConfigIssue(file, line, key, t("config.yaml_syntax", problem=exc)))
                continue
            values[key] = value
            locations[key] = (file, line)

    walk(root, [])
    return values, locations, issues


def duplicate_keys(root: Any) -> list[tuple[str, int, int]]:
    """(key, line, first line) of each top-level key given again in a composed YAML mapping: a peer's file
    is refused for them as a run file is (``_read_yaml_mapping``), never read with the last one winning."""
    import yaml

    seen: dict[str, int] = {}
    found: list[tuple[str, int, int]] = []
    if not isinstance(root, yaml.MappingNode):
        return found
    for key_node, _value in root.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        line = key_node.start_mark.line + 1
        if key_node.value in seen:
            found.append((str(key_node.value), line, seen[key_node.value]))
        else:
            seen[key_node.value] = line
    return found


def parse_override(text: str) -> tuple[str, Any]:
    """``"lora.rank=16"`` → ``("lora_rank", 16)``; the value is read as a YAML scalar or flow list.

    Raises ``ValueError`` with a user-facing message when the text is not ``key=value``.
    """
    import yaml

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(t("config.override_syntax", text=text))
    key = key.replace(".", "_").replace("-", "_")
    raw = raw.strip()
    if raw == "":
        return key, None
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        problem = str(exc).splitlines()[0]
        examples = override_examples(key)
        if examples:
            raise ValueError(t("config.override_value", text=text, value=raw, problem=problem,
                               examples=t("config.override_examples_or").join(examples))) from None
        raise ValueError(t("config.override_value_no_example", text=text, value=raw, problem=problem)) from None
    return key, value


def apply_overrides(
    values: dict[str, Any],
    locations: dict[str, tuple[str, int | None]],
    overrides: Iterable[str],
) -> list[ConfigIssue]:
    """Apply ``key=value`` overrides in place; returns the problems with the overrides themselves."""
    issues: list[ConfigIssue] = []
    for text in overrides:
        try:
            key, value = parse_override(text)
        except ValueError as exc:
            issues.append(ConfigIssue(OVERRIDE_SOURCE, None, None, str(exc)))
            continue
        if key not in KEY_SPECS:
            parts = text.partition("=")[0].strip().replace("-", "_").split(".")
            if len(parts) > 1 and _is_section_name(_flat_key(parts[:-1])):  # lora.bogus=3, as the file says it
                issues.append(ConfigIssue(OVERRIDE_SOURCE, None, ".".join(parts), section_unknown_key_message(parts)))
            else:
                issues.append(ConfigIssue(OVERRIDE_SOURCE, None, key, unknown_key_message(key)))
            continue
        values[key] = value
        locations[key] = (f"{OVERRIDE_SOURCE} ({text})", None)
    return issues


def config_from_mapping(
    values: dict[str, Any],
    locations: dict[str, tuple[str, int | None]],
    source: str,
    gpu_caps: Any = None,
    prior_issues: Iterable[ConfigIssue] = (),
    for_training: bool = False,
) -> RunConfig:
    """Check ``values`` key by key and across keys, resolve defaults; raise ``ConfigError`` on any error.

    ``for_training`` adds what a run about to start needs (``checks.check_for_training``: a model that
    can be had, an empty ``output``), with the file and line of the key."""
    if not locations:
        locations = {key: (source, None) for key in values}
    clean, issues = check_values(values, locations, source)
    issues = list(prior_issues) + issues
    if clean.get("deepspeed"):  # the user's DeepSpeed JSON: its values join the run's, conflicts named
        from core.config.deepspeed_file import reconcile_deepspeed

        clean, deepspeed_issues = reconcile_deepspeed(clean, locations, source)
        issues += deepspeed_issues
    config = RunConfig(**resolve_defaults(clean))
    # A key whose value was refused is checked on as unset or its default: said once, for the value given
    # (``model: ""`` is "must not be empty", not that and "is required" as well).
    refused = {issue.key for issue in issues if issue.is_error and issue.key}
    issues += [issue for issue in check_combinations(config, locations, source, gpu_caps)
               if not (issue.is_error and issue.key in refused)]
    if for_training and not any(issue.is_error and issue.key in ("model", "output") for issue in issues):
        from core.config.checks import check_for_training

        issues += check_for_training(config, locations, source)
    # The file's problems in line order, then the command line's.
    issues.sort(key=lambda issue: (issue.file != source, issue.line or 0))
    errors = [issue for issue in issues if issue.is_error]
    if errors:
        raise ConfigError(errors)
    config.warnings = [issue for issue in issues if not issue.is_error]
    return config


def load_run_config(path: str | Path, overrides: Iterable[str] = (), gpu_caps: Any = None,
                    for_training: bool = False) -> RunConfig:
    """Read and check a run YAML file with ``key=value`` overrides applied on top.

    Raises ``ConfigError`` listing every problem (file, line, key, what is allowed). Non-fatal remarks
    (e.g. ZeRO on one GPU) are in the returned config's ``warnings``. ``gpu_caps`` optionally describes
    the GPUs (see ``core.config.checks.check_combinations``); ``for_training`` adds the checks of a run
    about to start (``config_from_mapping``).
    """
    path = Path(path)
    values, locations, issues = _read_yaml_mapping(path)
    if any(issue.key is None for issue in issues) and not values:
        raise ConfigError(issues)  # the file itself is unusable: nothing else can be said
    issues += apply_overrides(values, locations, overrides)
    return config_from_mapping(values, locations, str(path), gpu_caps=gpu_caps, prior_issues=issues,
                               for_training=for_training)
