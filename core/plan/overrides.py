"""Reading user overrides (``field=value``) into typed planner fields."""

from __future__ import annotations

from typing import Any

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import t
from core.plan.request import OVERRIDABLE, RUN_KEYS

INT_FIELDS = ("zero_stage", "micro_batch_size", "grad_accum_steps", "seq_len", "lora_rank", "num_gpus")
CHOICE_FIELDS = {
    "method": ("full", "lora", "dora", "qlora"),
    "precision": ("bf16", "pure-bf16", "fp16", "fp32"),
    "offload": ("none", "optimizer", "all"),
    "overlong": ("cut", "drop"),  # a run key (RUN_KEYS): what a run does with a sample past seq_len
}
# The run-config key each number stands for in the saved YAML: its own limits hold here too (``max_seq_len``
# 16 .. 1,048,576), so that a plan is never shown that the saved file cannot be (it said ``sequence 8`` and saved
# 16, or showed 2,000,000 and refused to save it).
CONFIG_KEYS = {"seq_len": "max_seq_len", "micro_batch_size": "micro_batch_size",
               "grad_accum_steps": "gradient_accumulation", "lora_rank": "lora_rank"}
# A run-config key given where the planner's field is meant (``--set max_seq_len=4096``, as the saved YAML and
# ``train key=value`` spell it): read as that field.
FIELD_OF_CONFIG_KEY = {key: name for name, key in CONFIG_KEYS.items()}
# A right value for a field whose name is no run-config key, for the message refusing a wrong one.
OWN_EXAMPLES = {"seq_len": "4096", "grad_accum_steps": "4", "num_gpus": "2"}
TRUE_WORDS = ("1", "true", "yes", "on", "y")
FALSE_WORDS = ("0", "false", "no", "off", "n")


class OverrideError(TunedeckError, ValueError):
    """An override the planner cannot read (the message names the field and what is allowed)."""

    exit_code = EXIT_USAGE


def override_value_error(name: str, text: str, problem: str, written: str | None = None) -> OverrideError:
    """The refusal of ``written=text`` (``written``: the field as the user named it, ``max_seq_len`` for
    ``seq_len``): which override, why, and right ones to write, as ``train key=value`` says it (the run
    config's own examples where the name is a run-config key, ``core.config.checks.override_examples``)."""
    from core.config.checks import override_examples
    from core.config.schema import KEY_SPECS

    written = written or name
    key = written.replace("-", "_").replace(".", "_")
    if key in KEY_SPECS and key in (name, CONFIG_KEYS.get(name)):
        examples = [written + example[len(key):] for example in override_examples(key)]
    else:
        examples = [f"{written}={OWN_EXAMPLES[name]}"]
    examples.append(f"{written}=auto")
    return OverrideError(t("plan.error.override_value", text=f"{written}={text.strip()}", problem=problem,
                           examples=t("config.override_examples_or").join(examples)))


def parse_override_value(name: str, text: str, written: str | None = None) -> Any:
    """``text`` as the type of ``name``; an empty text means "not pinned" (None). ``written``: the name the
    user gave the field (``max_seq_len``, ``seq-len``), for the message when ``text`` is refused."""
    value = text.strip().lower()
    if not value or value == "auto":
        return None
    if name in INT_FIELDS:
        try:
            number = int(value)
        except ValueError:
            raise override_value_error(name, text, t("plan.error.need_int", value=text.strip()), written) from None
        if name in CONFIG_KEYS:  # its run-config key's limits, in the config's words, low and high alike
            from core.config.checks import check_value

            try:
                check_value(CONFIG_KEYS[name], number)
            except ValueError as exc:
                raise override_value_error(name, text, t("plan.error.config_key", key=CONFIG_KEYS[name],
                                                         problem=str(exc)), written) from None
        if name == "zero_stage" and not 0 <= number <= 3:
            raise override_value_error(name, text, t("plan.error.zero_range", value=number), written)
        if name != "zero_stage" and number < 1:
            raise override_value_error(name, text, t("plan.error.at_least_one", value=number), written)
        return number
    if name in CHOICE_FIELDS:
        if value not in CHOICE_FIELDS[name]:
            raise override_value_error(name, text, t("plan.error.not_a_choice", value=text.strip(),
                                                     choices=", ".join(CHOICE_FIELDS[name])), written)
        return value
    if name in ("gradient_checkpointing", "thinking"):  # thinking: a run key (RUN_KEYS), the template's flag
        if value in TRUE_WORDS:
            return True
        if value in FALSE_WORDS:
            return False
        raise override_value_error(name, text, t("plan.error.not_a_choice", value=text.strip(), choices="on, off, true, false"),
                                   written)
    raise OverrideError(t("plan.error.override", text=name, fields=", ".join(OVERRIDABLE + RUN_KEYS)))


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["method=qlora", "seq_len=4096"]`` -> {"method": "qlora", "seq_len": 4096}; a run key (``RUN_KEYS``:
    ``overlong=drop``) comes in it too, for the caller to take out (``PlanRequest.overlong``)."""
    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        written = name.strip()
        name = written.replace("-", "_").replace(".", "_")
        name = FIELD_OF_CONFIG_KEY.get(name, name)
        if not sep or name not in OVERRIDABLE + RUN_KEYS:
            raise OverrideError(t("plan.error.override", text=item, fields=", ".join(OVERRIDABLE + RUN_KEYS)))
        parsed = parse_override_value(name, value, written)
        if parsed is not None:
            out[name] = parsed
    return out


def request_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The PlanRequest fields that pinned values (``parse_overrides``, the wizard's fields) stand for: the planner's
    fields as ``overrides``, each run key (``RUN_KEYS``: ``overlong``, ``thinking``) as its own field. The one reading of
    ``plan --set`` and of the wizard's overrides, so that the two plan alike."""
    return {"overrides": {name: value for name, value in values.items() if name not in RUN_KEYS},
            **{name: values[name] for name in RUN_KEYS if name in values}}
