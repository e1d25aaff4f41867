"""Validation errors: every problem collected, each with file, line, key and what is allowed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from core.config import ConfigError, RunConfig, load_run_config, validate
from core.config.schema import KEY_SPECS


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def errors_of(path: Path, overrides=(), gpu_caps=None):
    with pytest.raises(ConfigError) as info:
        load_run_config(path, overrides, gpu_caps=gpu_caps)
    return info.value.errors


def only_error(path: Path, overrides=(), gpu_caps=None):
    errors = errors_of(path, overrides, gpu_caps)
    assert len(errors) == 1, [str(e) for e in errors]
    return errors[0]


def test_unknown_key_suggests_the_closest_with_its_line(tmp_path):
    path = write(tmp_path, """\
        model: m
        dataset: d
        lora_rnk: 8
    """)
    error = only_error(path)
    assert (error.file, error.line, error.key) == (str(path), 3, "lora_rnk")
    assert "did you mean 'lora_rank'?" in error.message
    assert f"{path}:3: lora_rnk: " in str(error)


def test_unknown_key_without_a_close_match_points_to_the_reference(tmp_path):
    error = only_error(write(tmp_path, "model: m\ndataset: d\nbanana: 1\n"))
    assert error.key == "banana" and "REFERENCE.md" in error.message


def test_wrong_type_names_key_given_value_and_expected(tmp_path):
    error = only_error(write(tmp_path, "model: m\ndataset: d\nmicro_batch_size: four\n"))
    assert error.line == 3 and error.key == "micro_batch_size"
    assert "'four'" in error.message and "an integer" in error.message


def test_wrong_choice_lists_the_allowed_values(tmp_path):
    error = only_error(write(tmp_path, "model: m\ndataset: d\nmethod: lorax\n"))
    assert error.key == "method" and error.line == 3
    assert "full, lora, dora, qlora" in error.message


def test_out_of_range_values(tmp_path):
    errors = errors_of(write(tmp_path, """\
        model: m
        dataset: d
        micro_batch_size: 0
        lora_dropout: 1.5
        learning_rate: -1
        eval_split: 1
        zero_stage: 4
    """))
    by_key = {e.key: e for e in errors}
    assert set(by_key) == {"micro_batch_size", "lora_dropout", "learning_rate", "eval_split", "zero_stage"}
    assert by_key["micro_batch_size"].line == 3 and "at least 1" in by_key["micro_batch_size"].message
    assert by_key["zero_stage"].line == 7 and "0, 1, 2, 3" in by_key["zero_stage"].message


def test_all_errors_are_collected_in_line_order_and_rendered(tmp_path):
    path = write(tmp_path, """\
        model: m
        dataset: d
        precison: bf16
        lora_rank: x
        method: qlora
        zero_stage: 3
    """)
    errors = errors_of(path, ["max_stepz=3"])
    assert [e.line for e in errors if e.file == str(path)] == [3, 4, 6]
    assert errors[-1].file == "command line" and "did you mean 'max_steps'?" in errors[-1].message
    text = str(ConfigError(errors))
    assert text.startswith("The run configuration has 4 problems:")
    assert "precision" in text and "ZeRO-3" in text


def test_missing_model_and_dataset(tmp_path):
    errors = errors_of(write(tmp_path, "method: lora\n"))
    assert {e.key for e in errors} == {"model", "dataset"}


def test_yaml_syntax_error_gives_its_line(tmp_path):
    error = only_error(write(tmp_path, "model: m\ndataset: [a, b\nmethod: lora\n"))
    assert error.key is None and error.line is not None and error.line >= 2
    assert "YAML syntax error" in error.message


def test_top_level_list_is_refused(tmp_path):
    error = only_error(write(tmp_path, "- model: m\n"))
    assert "mapping" in error.message


def test_missing_file(tmp_path):
    error = only_error(tmp_path / "absent.yaml")
    assert "not found" in error.message


def test_duplicate_key_names_both_lines(tmp_path):
    error = only_error(write(tmp_path, "model: m\ndataset: d\nlora_rank: 8\nlora_rank: 16\n"))
    assert error.line == 4 and error.key == "lora_rank" and "line 3" in error.message


def test_nested_section_says_keys_are_flat_and_names_the_keys_inside(tmp_path):
    """``training: {epochs: 2}`` is no section (no training_* keys): one error at its line that says keys
    are flat and which keys inside are run keys, with the value to write at the top level."""
    path = write(tmp_path, """\
        model: m
        dataset: d
        training:
          epochs: 2
          learning_rate: 1e-4
          foo: 1
    """)
    error = only_error(path)
    assert (error.line, error.key) == (3, "training")
    assert "run keys are flat" in error.message
    assert error.message.endswith("write at the top level: training.epochs → epochs: 2; "
                                  "training.learning_rate → learning_rate: 1e-4 (training.foo: no such key)")
    # a mapping with no run key inside stays a plain unknown key
    assert "run keys are flat" not in only_error(write(tmp_path, "model: m\ndataset: d\nwandb: {project: x}\n")).message


def test_malformed_override(tmp_path):
    error = only_error(write(tmp_path, "model: m\ndataset: d\n"), ["lora_rank"])
    assert error.file == "command line" and "key=value" in error.message


def test_override_whose_value_is_no_yaml_names_it_and_shows_a_right_one(tmp_path):
    """``gpus=[0`` (a shell split ``gpus=[0, 1]``): which override, that its value is not YAML, and a right
    one, not only PyYAML's "while parsing a flow sequence"."""
    error = only_error(write(tmp_path, "model: m\ndataset: d\n"), ["gpus=[0"])
    assert error.file == "command line"
    assert error.message.startswith("override 'gpus=[0': the value '[0' is not valid YAML (while parsing")
    assert error.message.endswith("write it as e.g. gpus=[0,1] or gpus=2")


@pytest.mark.parametrize("key", sorted(KEY_SPECS))
def test_override_examples_are_right_overrides(key):
    from core.config.checks import check_value, override_examples
    from core.config.loader import parse_override
    from core.config.schema import default_for

    for example in override_examples(key):
        name, value = parse_override(example)
        assert name == key
        check_value(key, value)  # raises when the example itself would be refused
    if KEY_SPECS[key].kind == "int" and isinstance(default_for(key), int):
        assert override_examples(key) == [f"{key}={default_for(key)}"]  # max_seq_len=2048, not its floor 16


@pytest.mark.parametrize(
    ("yaml_text", "key", "fragment"),
    [
        ("method: qlora\nzero_stage: 3\n", "zero_stage", "qlora cannot run with zero_stage 3"),
        ("method: full\nlora_rank: 64\n", "lora_rank", "only applies to LoRA methods"),
        ("method: full\nlora_targets: [q_proj]\n", "lora_targets", "only applies to LoRA methods"),
        ("precision: fp16\npure_bf16: true\n", "pure_bf16", "pure_bf16 needs precision bf16"),
        ("offload: optimizer\nzero_stage: 1\n", "offload", "offload needs ZeRO-2 or ZeRO-3"),
        ("offload: optimizer\n", "offload", "offload needs ZeRO-2 or ZeRO-3"),
        ("offload: all\nzero_stage: 2\n", "offload", "only ZeRO-3"),
        ("offload: optimizer\nzero_stage: 2\noptimizer: paged_adamw_8bit\n", "optimizer", "CPU Adam"),
        ("epochs: 2\nmax_steps: 100\n", "max_steps", "both set"),
        ("warmup_ratio: 0.1\nwarmup_steps: 10\n", "warmup_steps", "both set"),
        ("eval_steps: 10\n", "eval_steps", "eval_split"),
        ("attn: flash\nprecision: fp32\n", "attn", "bf16 or fp16"),
    ],
)
def test_incompatible_pairs_are_refused_with_the_reason(tmp_path, yaml_text, key, fragment):
    path = write(tmp_path, "model: m\ndataset: d\n" + yaml_text)
    error = only_error(path)
    assert error.key == key
    assert fragment in error.message
    assert error.line is not None and error.line >= 3


def test_gpu_without_bf16_is_named(tmp_path):
    path = write(tmp_path, "model: m\ndataset: d\nprecision: bf16\n")
    error = only_error(path, gpu_caps={"bf16": False, "name": "Tesla V100"})
    assert error.key == "precision" and error.line == 3
    assert "Tesla V100 has no bf16" in error.message and "fp16" in error.message
    # default precision (bf16) is refused as well, without a line
    error = only_error(write(tmp_path, "model: m\ndataset: d\n"), gpu_caps={"bf16": False, "name": "T4"})
    assert error.line is None and "T4" in error.message
    assert load_run_config(path, ["precision=fp16"], gpu_caps={"bf16": False}).precision == "fp16"


def test_gpu_capabilities_as_an_object(tmp_path):
    class Caps:
        name = "NVIDIA A100"
        bf16 = True
        count = 2
        compute_capability = "8.0"

    path = write(tmp_path, "model: m\ndataset: d\ngpus: [0, 3]\n")
    error = only_error(path, gpu_caps=Caps())
    assert error.key == "gpus" and "GPU 3 does not exist" in error.message
    assert "this box has 2 GPUs," in error.message  # not "2 GPU(s)"


def test_flash_attention_on_an_old_gpu(tmp_path):
    path = write(tmp_path, "model: m\ndataset: d\nattn: flash\nprecision: fp16\n")
    error = only_error(path, gpu_caps={"compute_capability": 7.5, "name": "T4", "bf16": False})
    assert error.key == "attn" and "7.5" in error.message


def test_zero_on_one_gpu_is_a_warning_not_an_error(tmp_path):
    path = write(tmp_path, "model: m\ndataset: d\nzero_stage: 2\ngpus: 1\n")
    config = load_run_config(path)
    assert config.zero_stage == 2
    assert [w.key for w in config.warnings] == ["zero_stage"]
    assert config.warnings[0].line == 3 and "warning" in str(config.warnings[0])
    # "all" GPUs on a one-GPU box warns as well when the box is known
    config = load_run_config(write(tmp_path, "model: m\ndataset: d\nzero_stage: 3\n"), gpu_caps={"count": 1})
    assert len(config.warnings) == 1
    # no warning with several GPUs
    assert load_run_config(write(tmp_path, "model: m\ndataset: d\nzero_stage: 3\ngpus: [0, 1]\n")).warnings == []


def test_validate_a_config_built_in_code():
    config = RunConfig(model="m", dataset="d", method="qlora", zero_stage=3, precision="bf16")
    issues = validate(config, gpu_caps={"bf16": False, "name": "Tesla V100"})
    messages = " | ".join(issue.message for issue in issues if issue.is_error)
    assert "qlora cannot run with zero_stage 3" in messages
    assert "Tesla V100 has no bf16" in messages
    assert validate(RunConfig(model="m", dataset="d")) == []
    bad = RunConfig(model="m", dataset="d", lora_rank=0)
    assert [issue.key for issue in validate(bad)] == ["lora_rank"]


def test_model_written_as_a_missing_local_path(tmp_path):
    error = only_error(write(tmp_path, f"model: {tmp_path / 'no-such-model'}\ndataset: d\n"))
    assert error.key == "model" and error.line == 1 and "not a directory" in error.message
    (tmp_path / "my-model").mkdir()
    assert load_run_config(write(tmp_path, f"model: {tmp_path / 'my-model'}\ndataset: d\n")).name == "my-model-lora"
    # a hub id is not checked against the disk
    assert load_run_config(write(tmp_path, "model: Qwen/Qwen2.5-7B\ndataset: d\n")).model == "Qwen/Qwen2.5-7B"


@pytest.mark.parametrize(("factory", "text", "message"), [
    # cli_value: a run-config key's own limits, as a config file's value gets them
    (("lora_rank",), "0", "got 0; must be at least 1"),
    (("lora_rank",), "5000", "got 5000; must be at most 4096"),
    (("max_seq_len",), "2.5", "got '2.5'; expected an integer"),
    (("lora_dropout", float), "1", "got 1.0; must be less than 1"),
    (("epochs", float), "0", "got 0.0; must be more than 0"),
    (("epochs", float), "nan", "got 'nan'; expected a number"),
    (("epochs", float), "1e308", "got 1e+308; must be at most 1000000"),  # the trainer's steps overflowed
    # cli_number: limits of its own, the same words
    ((int, 1, None, 8), "0", "got 0; must be at least 1"),
    ((int, 1, None, 8), "9", "got 9; must be at most 8"),
    ((int, 1, None, 8), "many", "got 'many'; expected an integer"),
    ((float, None, 0, None), "0", "got 0.0; must be more than 0"),
    ((float, 0, None, None), "inf", "got 'inf'; expected a number"),
])
def test_command_line_numbers_are_checked_as_config_values(factory, text, message):
    import argparse

    from core.config.checks import cli_number, cli_value

    convert = cli_value(*factory) if isinstance(factory[0], str) else cli_number(*factory)
    with pytest.raises(argparse.ArgumentTypeError) as info:
        convert(text)
    assert str(info.value) == message


def test_command_line_numbers_in_bounds_come_back_as_their_kind():
    from core.config.checks import cli_number, cli_value

    assert cli_value("max_seq_len")("4096") == 4096 and cli_value("lora_dropout", float)("0.1") == 0.1
    assert cli_number(int, minimum=1)("3") == 3 and isinstance(cli_number(float, minimum=0)("2"), float)


@pytest.mark.parametrize(("text", "said"), [
    ('model: ""\ndataset: d\n', "must not be empty"),
    ("model: m\ndataset: []\n", "the list must not be empty"),
    ("model: m\ndataset: d\nmodel_override: 1\n", None),
])
def test_a_refused_value_is_said_once_not_again_as_the_key_missing(tmp_path, text, said):
    """``model: ""`` was two problems at line 1: "must not be empty" and "is required" (the check across
    keys saw the refused value as unset)."""
    if said is None:  # an unknown key beside them is its own problem, still listed
        assert [e.key for e in errors_of(write(tmp_path, text))] == ["model_override"]
        return
    error = only_error(write(tmp_path, text))
    assert error.line in (1, 2) and said in error.message


def test_unknown_key_inside_a_section_is_said_as_written_with_the_keys_that_section_takes(tmp_path):
    """``lora: {bogus: 3}`` is ``lora.bogus``, not ``lora_bogus`` with the schema's nearest look-alike
    (``qlora_upcast``): the message names the lora keys, and a close match is looked for only among them."""
    path = write(tmp_path, """\
        model: m
        dataset: d
        lora:
          rank: 8
          bogus: 3
          alpah: 16
    """)
    bogus, alpah = errors_of(path)
    assert (bogus.line, bogus.key, alpah.line, alpah.key) == (5, "lora.bogus", 6, "lora.alpah")
    assert f"{path}:5: lora.bogus: unknown key; lora takes lora.rank, lora.alpha, " in str(bogus)
    assert "qlora" not in bogus.message and "did you mean" not in bogus.message
    assert "as lora_rank" in bogus.message
    assert alpah.message.startswith("unknown key; did you mean 'lora.alpha'? lora takes lora.rank, ")
    # an override written with the section's dot is said the same way
    error = only_error(write(tmp_path, "model: m\ndataset: d\n"), ["eval.step=3"])
    assert error.file == "command line" and error.key == "eval.step"
    assert error.message.startswith("unknown key; did you mean 'eval.steps'? eval takes eval.split, eval.steps")
