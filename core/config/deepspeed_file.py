"""A user's own DeepSpeed JSON (``deepspeed: path/to/ds.json``) reconciled with the run configuration.

The run configuration is what the Trainer, the estimator and the checks use, so the JSON's values for
what the run configuration also says (ZeRO stage, offload, batch sizes, clipping, precision, an optimizer's
betas and eps) are brought
into it when checked: a key the YAML leaves at its default takes the JSON's value; a key the YAML sets
to something else wins, and the conflict is named. ``"auto"`` takes the run configuration's value. The
rest of the JSON (bucket sizes, communication, an optimizer section) is kept as written when the trainer
merges it with what tunedeck generates (``core.train.deepspeed_config.merge_user_config``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.config.issues import ERROR, WARNING, ConfigIssue
from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import t


def _enabled(value: Any) -> bool | None:
    if isinstance(value, Mapping):
        enabled = value.get("enabled")
        return enabled if isinstance(enabled, bool) else None
    return None


def _offload(zero: Mapping[str, Any]) -> str | None:
    def device(section: str) -> str | None:
        part = zero.get(section)
        return str(part.get("device")).lower() if isinstance(part, Mapping) and part.get("device") else None

    optimizer, param = device("offload_optimizer"), device("offload_param")
    if param in ("cpu", "nvme"):
        return "all"
    if optimizer in ("cpu", "nvme"):
        return "optimizer"
    if optimizer == "none" or param == "none" or "offload_optimizer" in zero or "offload_param" in zero:
        return "none"
    return None


class DeepSpeedFileError(TunedeckError, ValueError):
    """A DeepSpeed JSON that cannot be read; the message names ``file:line``."""

    exit_code = EXIT_USAGE


def resolve_path(value: str, source: str) -> Path:
    """The file a ``deepspeed:`` value names: absolute, from the current directory, or from the YAML's."""
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    if path.exists():
        return path.resolve()
    beside = Path(source).parent / path
    return beside.resolve() if beside.exists() else path


def read_deepspeed_json(path: str | Path) -> dict[str, Any]:
    """The JSON object in ``path``; raises ``DeepSpeedFileError`` naming the file and line."""
    path = Path(path)
    try:  # utf-8-sig: a file a Windows editor saved starts with a BOM, which is no part of the JSON
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DeepSpeedFileError(t("config.deepspeed_missing", path=str(path))) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DeepSpeedFileError(t("config.deepspeed_unreadable", path=str(path), reason=str(exc))) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DeepSpeedFileError(t("config.deepspeed_json", path=str(path), line=exc.lineno, column=exc.colno,
                                   problem=exc.msg)) from None
    if not isinstance(data, dict):
        raise DeepSpeedFileError(t("config.deepspeed_not_object", path=str(path)))
    return data


def _json_values(data: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """run key -> (the JSON's path for it, its value as the run key would say it, or "auto")."""
    found: dict[str, tuple[str, Any]] = {}
    zero = data.get("zero_optimization")
    if isinstance(zero, Mapping):
        if "stage" in zero:
            found["zero_stage"] = ("zero_optimization.stage", zero["stage"])
        offload = _offload(zero)
        if offload is not None:
            found["offload"] = ("zero_optimization.offload_*", offload)
    simple = (("train_micro_batch_size_per_gpu", "micro_batch_size"),
              ("gradient_accumulation_steps", "gradient_accumulation"),
              ("gradient_clipping", "max_grad_norm"))
    for name, key in simple:
        if name in data:
            found[key] = (name, data[name])
    optimizer = data.get("optimizer")
    params = optimizer.get("params") if isinstance(optimizer, Mapping) else None
    if isinstance(params, Mapping):  # an Adam's betas and eps: the run's adam_beta1/adam_beta2/adam_epsilon
        betas = params.get("betas")
        if betas == "auto":  # both are filled from the run, as a list's two are both taken
            found["adam_beta1"] = ("optimizer.params.betas[0]", "auto")
            found["adam_beta2"] = ("optimizer.params.betas[1]", "auto")
        elif isinstance(betas, (list, tuple)) and len(betas) == 2:
            found["adam_beta1"] = ("optimizer.params.betas[0]", betas[0])
            found["adam_beta2"] = ("optimizer.params.betas[1]", betas[1])
        if "eps" in params:
            found["adam_epsilon"] = ("optimizer.params.eps", params["eps"])
    bf16, fp16 = _enabled(data.get("bf16")), _enabled(data.get("fp16"))
    if bf16 or fp16:
        found["precision"] = ("bf16.enabled" if bf16 else "fp16.enabled", "bf16" if bf16 else "fp16")
    return found


def reconcile_deepspeed(
    values: dict[str, Any],
    locations: Mapping[str, tuple[str, int | None]],
    source: str,
) -> tuple[dict[str, Any], list[ConfigIssue]]:
    """The checked run values with the JSON's brought in, and the issues (conflicts are warnings)."""
    from core.config.checks import check_value

    out = dict(values)
    file, line = locations.get("deepspeed", (source, None))
    issues: list[ConfigIssue] = []
    path = resolve_path(str(values["deepspeed"]), source)
    try:
        data = read_deepspeed_json(path)
    except DeepSpeedFileError as exc:
        return out, [ConfigIssue(file, line, "deepspeed", str(exc), ERROR)]
    out["deepspeed"] = str(path)
    filled: list[str] = []
    for key, (where, raw) in _json_values(data).items():
        if raw == "auto":
            filled.append(f"{where} ← {key}")
            continue
        try:
            value = check_value(key, raw)
        except ValueError as exc:
            issues.append(ConfigIssue(file, line, "deepspeed", t("config.deepspeed_bad_value", path=path.name,
                                                                 where=where, key=key, problem=str(exc)), ERROR))
            continue
        ours = out.get(key)
        if key in locations and ours is not None and ours != value:
            issues.append(ConfigIssue(file, line, "deepspeed", t(
                "config.deepspeed_conflict", path=path.name, where=where, theirs=raw, key=key, ours=ours),
                WARNING))
        elif ours != value:
            out[key] = value
            issues.append(ConfigIssue(file, line, "deepspeed", t(
                "config.deepspeed_taken", path=path.name, where=where, value=raw, key=key), WARNING))
    if filled:
        issues.append(ConfigIssue(file, line, "deepspeed", t("config.deepspeed_auto", path=path.name,
                                                             filled=", ".join(filled)), WARNING))
    if int(out.get("zero_stage") or 0) == 0:
        issues.append(ConfigIssue(file, line, "deepspeed", t("config.deepspeed_stage0", path=path.name), WARNING))
    return out, issues
