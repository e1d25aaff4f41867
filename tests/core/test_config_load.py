"""Loading run YAML files: defaults, resolution, overrides, nested sections, round trips."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from core.config import ConfigError, RunConfig, default_demo_config, load_run_config, parse_override
from core.config.schema import KEY_SPECS


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_minimal_file_gets_resolved_defaults(tmp_path):
    config = load_run_config(write(tmp_path, """\
        model: Qwen/Qwen2.5-0.5B-Instruct
        dataset: data/train.jsonl
    """))
    assert config.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.method == "lora"
    assert config.hub == "modelscope"
    assert config.epochs == 3.0 and config.max_steps is None
    assert config.learning_rate == pytest.approx(1e-4)
    assert config.warmup_ratio == pytest.approx(0.03) and config.warmup_steps is None
    assert config.name == "Qwen2.5-0.5B-Instruct-lora"
    assert config.datasets == ["data/train.jsonl"]
    assert config.warnings == []


def test_full_method_gets_a_lower_default_learning_rate(tmp_path):
    config = load_run_config(write(tmp_path, "model: m\ndataset: d.jsonl\nmethod: full\n"))
    assert config.learning_rate == pytest.approx(1e-5)


def test_yaml_1_1_exponent_strings_are_numbers(tmp_path):
    # PyYAML reads 1e-4 (no dot) as a string; people write learning rates that way.
    config = load_run_config(write(tmp_path, "model: m\ndataset: d\nlearning_rate: 1e-4\nweight_decay: 1e-2\n"))
    assert config.learning_rate == pytest.approx(1e-4)
    assert config.weight_decay == pytest.approx(0.01)


def test_max_steps_alone_leaves_epochs_unset(tmp_path):
    config = load_run_config(write(tmp_path, "model: m\ndataset: d\nmax_steps: 100\nwarmup_steps: 5\n"))
    assert config.max_steps == 100 and config.epochs is None
    assert config.warmup_steps == 5 and config.warmup_ratio is None


def test_overrides_parse_yaml_scalars_lists_and_dotted_keys(tmp_path):
    path = write(tmp_path, "model: m\ndataset: d\nlora_rank: 8\n")
    config = load_run_config(path, ["lora_rank=64", "lora.alpha=128", "gpus=[0, 2]", "packing=true",
                                    "learning_rate=2e-5", "lora_targets=q_proj,v_proj", "name=my run"])
    assert config.lora_rank == 64
    assert config.lora_alpha == 128
    assert config.gpus == [0, 2]
    assert config.packing is True
    assert config.learning_rate == pytest.approx(2e-5)
    assert config.lora_targets == ["q_proj", "v_proj"]
    assert config.name == "my run"


def test_override_with_empty_value_unsets_an_optional_key(tmp_path):
    path = write(tmp_path, "model: m\ndataset: d\nepochs: 2\n")
    config = load_run_config(path, ["epochs=", "max_steps=50"])
    assert config.epochs is None and config.max_steps == 50


def test_parse_override_forms():
    assert parse_override("zero_stage=2") == ("zero_stage", 2)
    assert parse_override("lora.rank = 4") == ("lora_rank", 4)
    assert parse_override("dataset=[a.jsonl, b.jsonl]") == ("dataset", ["a.jsonl", "b.jsonl"])
    assert parse_override("tf32=auto") == ("tf32", "auto")
    with pytest.raises(ValueError, match="key=value"):
        parse_override("lora_rank")


def test_nested_section_is_flattened_with_lines(tmp_path):
    path = write(tmp_path, """\
        model: m
        dataset: d
        lora:
          rank: 4
          alpha: 8
          targets: [q_proj, k_proj]
    """)
    config = load_run_config(path)
    assert (config.lora_rank, config.lora_alpha, config.lora_targets) == (4, 8, ["q_proj", "k_proj"])


def test_gpus_forms(tmp_path):
    for text, expected in (("all", "all"), ("2", 2), ("[1, 3]", [1, 3]), ('"0,1"', [0, 1])):
        config = load_run_config(write(tmp_path, f"model: m\ndataset: d\ngpus: {text}\n"))
        assert config.gpus == expected
    assert RunConfig(gpus=[1, 3]).gpu_indices(4) == [1, 3]
    assert RunConfig(gpus="all").gpu_indices(3) == [0, 1, 2]
    assert RunConfig(gpus=2).gpu_indices(8) == [0, 1]


def test_optimizer_alias_is_stored_under_the_transformers_name(tmp_path):
    config = load_run_config(write(tmp_path, "model: m\ndataset: d\noptimizer: adamw_fused\n"))
    assert config.optimizer == "adamw_torch_fused"


def test_to_dict_from_dict_and_save_round_trip(tmp_path):
    config = load_run_config(write(tmp_path, """\
        model: m
        dataset: [a.jsonl, b.jsonl]
        method: qlora
        lora_rank: 32
        zero_stage: 2
        gpus: [0, 1]
        max_steps: 10
    """))
    data = config.to_dict()
    assert set(data) == set(KEY_SPECS)
    assert "warnings" not in data
    again = RunConfig.from_dict(data)
    assert again == config
    (tmp_path / "out").mkdir()
    saved = config.save(tmp_path / "out" / "config.yaml")
    text = saved.read_text(encoding="utf-8")
    assert yaml.safe_load(text) == data
    assert load_run_config(saved) == config  # the resolved file loads back to the same configuration


def test_saved_resolved_full_config_loads_back(tmp_path):
    # A resolved file carries the lora_* keys at their defaults; that must not count as a mistake.
    config = load_run_config(write(tmp_path, "model: m\ndataset: d\nmethod: full\n"))
    saved = config.save(tmp_path / "resolved.yaml")
    assert load_run_config(saved) == config


def test_from_dict_checks_values():
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({"model": "m", "dataset": "d", "lora_rank": "big"})
    assert info.value.errors[0].key == "lora_rank"


def test_demo_config_points_at_bundled_assets():
    config = default_demo_config()
    assert Path(config.model, "config.json").is_file()
    assert Path(config.model, "tokenizer.json").is_file()
    assert Path(str(config.dataset)).is_file()
    assert config.method == "full" and config.precision == "fp32"
    assert config.max_steps and config.epochs is None
    assert config.warnings == []
    assert RunConfig.from_dict(config.to_dict()) == config


def test_saved_yaml_is_block_style_one_key_a_line_with_short_lists_inline(tmp_path):
    """Run and plan files are edited by hand: `key: value` lines, not one `{model: .., dataset: ..}` flow
    mapping that a viewer wraps mid-key; a short list stays on its key's line and the text reads back."""
    config = RunConfig.from_dict({"model": "tiny", "dataset": ["a.jsonl", "b.jsonl"], "gpus": [0, 1],
                                  "lora_targets": ["q_proj", "v_proj"]})
    text = config.to_yaml()
    lines = text.splitlines()
    assert lines[1] == "model: tiny" and "dataset_info: null" in lines and "{" not in text
    assert "gpus: [0, 1]" in lines and "lora_targets: [q_proj, v_proj]" in lines
    assert "dataset: [a.jsonl, b.jsonl]" in lines
    assert len([line for line in lines if not line.startswith("#")]) == len(config.to_dict())
    assert RunConfig.from_dict(yaml.safe_load(text)).to_dict() == config.to_dict()
    long = RunConfig.from_dict({"model": "tiny", "dataset": [f"/data/a-rather-long-folder/part-{i}.jsonl"
                                                             for i in range(4)]}).to_yaml()
    assert "dataset:\n- /data/a-rather-long-folder/part-0.jsonl\n" in long


def test_adam_keys_default_to_transformers_and_refuse_what_adamw_cannot_take(tmp_path):
    """adam_beta1/adam_beta2/adam_epsilon are run keys (ms-swift writes adam_beta2: 0.95): unset, they are
    transformers' own, so an existing config trains as before; a beta of 1 or more, or an epsilon of 0, is
    refused at its line with the bound."""
    config = load_run_config(write(tmp_path, "model: m\ndataset: d.jsonl\n"))
    assert (config.adam_beta1, config.adam_beta2, config.adam_epsilon) == (0.9, 0.999, 1e-8)
    config = load_run_config(write(tmp_path, "model: m\ndataset: d.jsonl\nadam_beta2: 0.95\nadam_epsilon: 1e-6\n"))
    assert (config.adam_beta2, config.adam_epsilon) == (0.95, 1e-6)
    with pytest.raises(ConfigError) as info:
        load_run_config(write(tmp_path, "model: m\ndataset: d.jsonl\nadam_beta1: -0.1\nadam_beta2: 1\n"
                                        "adam_epsilon: 0\noverlong: left\n"))
    text = str(info.value)
    assert "run.yaml:3: adam_beta1: got -0.1; must be at least 0" in text
    assert "run.yaml:4: adam_beta2: got 1; must be less than 1" in text
    assert "run.yaml:5: adam_epsilon: got 0; must be more than 0" in text
    assert "run.yaml:6: overlong:" in text and "cut" in text and "drop" in text


def test_a_deepspeed_jsons_adam_betas_are_the_runs_and_the_trainer_fills_them(tmp_path):
    """A user's DeepSpeed JSON with an optimizer section naming betas/eps: the run took transformers' betas
    and the Trainer refused the mismatch at launch. Now the JSON's values are the run's (the YAML not saying
    otherwise) and the merged config says "auto" for them, which the Trainer fills with the run's."""
    from core.train.deepspeed_config import deepspeed_config, merge_user_config

    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": '
                  '{"lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-6}}}', encoding="utf-8")
    config = load_run_config(write(tmp_path, f"model: m\ndataset: d.jsonl\ndeepspeed: {ds}\n"))
    assert (config.adam_beta1, config.adam_beta2, config.adam_epsilon) == (0.9, 0.95, 1e-6)
    assert any("optimizer.params.betas[1]" in str(w) for w in config.warnings), config.warnings
    config = load_run_config(write(tmp_path, f"model: m\ndataset: d.jsonl\ndeepspeed: {ds}\nadam_beta2: 0.99\n"))
    assert config.adam_beta2 == 0.99  # the YAML's own value wins, the conflict said
    merged, notes = merge_user_config(deepspeed_config(config.to_dict(), 1, True, False),
                                      json.loads(ds.read_text(encoding="utf-8")))
    assert merged["optimizer"]["params"]["betas"] == "auto" and merged["optimizer"]["params"]["eps"] == "auto"
    assert merged["optimizer"]["params"]["lr"] == 1e-4
    assert 'optimizer.params.betas: [0.9, 0.95] -> "auto"' in notes


def test_a_deepspeed_jsons_auto_betas_are_both_said_filled_from_the_run(tmp_path):
    """``"betas": "auto"`` recorded adam_beta1 alone: the 'auto filled in' warning named beta1 as filled and
    left beta2 out, though the Trainer fills both. Both are said now, like a list's two are both taken."""
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": '
                  '{"betas": "auto", "eps": "auto"}}}', encoding="utf-8")
    config = load_run_config(write(tmp_path, f"model: m\ndataset: d.jsonl\ndeepspeed: {ds}\nadam_beta2: 0.95\n"))
    auto = next(str(w) for w in config.warnings if "filled in from the run configuration" in str(w))
    assert "optimizer.params.betas[0] ← adam_beta1" in auto and "optimizer.params.betas[1] ← adam_beta2" in auto
    assert "optimizer.params.eps ← adam_epsilon" in auto
    assert (config.adam_beta1, config.adam_beta2) == (0.9, 0.95)  # the run's, the JSON taking nothing


def test_adam_keys_with_an_optimizer_that_is_no_adamw_are_said_unused(tmp_path):
    """adafactor and sgd read no betas: a beta set beside them would silently do nothing; it is said."""
    config = load_run_config(write(tmp_path, "model: m\ndataset: d.jsonl\noptimizer: sgd\nadam_beta2: 0.95\n"))
    assert any("optimizer sgd is no AdamW" in str(w) for w in config.warnings), config.warnings
    config = load_run_config(write(tmp_path, "model: m\ndataset: d.jsonl\nadam_beta2: 0.95\n"))
    assert not any("no AdamW" in str(w) for w in config.warnings)
