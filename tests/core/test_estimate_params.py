"""Parameter counts: analytic vs transformers on the meta device, bundled configs, model resolution."""

from __future__ import annotations

import json

import pytest

from core.estimate import (
    ArchitectureError,
    ModelNotFoundError,
    architecture_from_config,
    count_parameters,
    known_model_names,
    load_model_config,
    lora_parameter_count,
    normalise_lora_targets,
)
from core.estimate.exact_count import count_parameters_exact

# Totals published on the models' cards / by the safetensors index (distinct parameters).
PUBLISHED_TOTALS = {
    "Qwen2.5-0.5B": 494_032_768,
    "Qwen2.5-1.5B": 1_543_714_304,
    "Qwen2.5-3B": 3_085_938_688,
    "Qwen2.5-7B": 7_615_616_512,
    "Qwen2.5-14B": 14_770_033_664,
    "Qwen2.5-32B": 32_763_876_352,
    "Qwen2.5-72B": 72_706_203_648,
    "Meta-Llama-3-8B": 8_030_261_248,
    "Qwen3-8B": 8_190_735_360,
    "Mistral-7B-v0.1": 7_241_732_096,
}


def test_every_bundled_config_matches_its_published_total():
    assert set(known_model_names()) == set(PUBLISHED_TOTALS)
    for name, total in PUBLISHED_TOTALS.items():
        arch = load_model_config(name).architecture()
        assert count_parameters(arch).total == total, name


@pytest.mark.parametrize("name", ["Qwen2.5-0.5B", "Qwen2.5-7B", "Meta-Llama-3-8B", "Qwen3-8B"])
def test_analytic_count_equals_meta_device_count(name):
    config = load_model_config(name)
    assert count_parameters(config.architecture()).total == count_parameters_exact(config.config)


def test_meta_device_count_of_a_custom_config_with_biases_and_untied_head(tmp_path):
    # A Llama with attention and MLP biases: exercises the bias terms the bundled configs lack.
    config = {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
        "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000, "attention_bias": True,
        "mlp_bias": True, "tie_word_embeddings": False,
    }
    arch = architecture_from_config(config)
    assert arch.qkv_bias and arch.o_bias and arch.mlp_bias
    assert count_parameters(arch).total == count_parameters_exact(config)


def test_hand_computed_qwen2_block():
    arch = load_model_config("Qwen/Qwen2.5-0.5B").architecture()
    counts = count_parameters(arch)
    h, f, kv = 896, 4864, 2 * 64
    attention = h * h + h + 2 * (h * kv + kv) + h * h  # q, k, v with biases; o without
    assert counts.per_layer_linear == attention + 3 * h * f
    assert counts.per_layer_norm == 2 * h
    assert counts.lm_head == 0  # tied
    assert counts.embedding == 151936 * h


def test_qwen3_has_per_head_qk_norms_and_no_biases():
    arch = load_model_config("Qwen/Qwen3-8B").architecture()
    assert arch.qk_norm and not arch.qkv_bias and arch.head_dim == 128
    assert count_parameters(arch).per_layer_norm == 2 * 4096 + 2 * 128


def test_lora_parameter_count_by_hand():
    arch = load_model_config("Qwen2.5-7B").architecture()
    h, f, q, kv, r = 3584, 18944, 3584, 512, 16
    per_layer = r * ((h + q) + (h + kv) + (h + kv) + (q + h) + (h + f) + (h + f) + (f + h))
    assert lora_parameter_count(arch, r, normalise_lora_targets("all-linear")) == 28 * per_layer
    qv = normalise_lora_targets("q,v")
    assert qv == ("q_proj", "v_proj")
    assert lora_parameter_count(arch, 8, qv) == 28 * 8 * ((h + q) + (h + kv))
    # DoRA adds one magnitude per output feature of each target.
    assert lora_parameter_count(arch, 8, qv, dora=True) == 28 * (8 * ((h + q) + (h + kv)) + q + kv)


def test_unknown_lora_target_names_the_valid_ones():
    with pytest.raises(ArchitectureError, match="gate_proj"):
        normalise_lora_targets("q,attn")


@pytest.mark.parametrize("spec", ["Qwen/Qwen2.5-7B-Instruct", "qwen/qwen2.5-7b", "Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct/"])
def test_instruct_and_case_variants_resolve_to_the_bundled_base_config(spec):
    config = load_model_config(spec)
    assert config.source == "bundled"
    assert config.architecture().hidden_size == 3584


def test_llama_3_names_resolve():
    for spec in ("meta-llama/Meta-Llama-3-8B-Instruct", "LLM-Research/Meta-Llama-3-8B-Instruct"):
        assert load_model_config(spec).architecture().vocab_size == 128256


def test_config_path_and_model_folder(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    source = load_model_config("Qwen2.5-0.5B").config
    (folder / "config.json").write_text(json.dumps(source))
    by_folder = load_model_config(str(folder))
    by_file = load_model_config(str(folder / "config.json"))
    assert by_folder.name == by_file.name == "my-model"
    assert by_folder.architecture() == by_file.architecture()


def test_hf_cache_is_searched(tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--acme--tiny-llm" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(load_model_config("Qwen2.5-0.5B").config))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert load_model_config("acme/tiny-llm").source.endswith("config.json")


def test_modelscope_cache_is_searched_where_downloads_and_the_sdk_put_models(tmp_path, monkeypatch):
    """The estimator looked for ModelScope configs under its own spelling of the cache root: MODELSCOPE_CACHE
    as written (a ``~/ms`` from an env file was a folder named '~' in the current one, where tunedeck's own
    download had gone to the home folder's ms/models/...), and not right in MODELSCOPE_CACHE, where older SDKs
    put ``<owner>/<name>``: a model on disk was "not found" by plan and estimate. Now it searches the roots
    tunedeck downloads to and lists local models from (``modelscope_cache_roots``). No network."""
    from core.hub.modelscope_source import modelscope_model_dir

    config = json.dumps(load_model_config("Qwen2.5-0.5B").config)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODELSCOPE_CACHE", "~/ms")
    downloaded = modelscope_model_dir("acme/tiny-llm.v2")  # where `tunedeck models download` puts it
    assert downloaded == tmp_path / "home" / "ms" / "models" / "acme" / "tiny-llm___v2"
    downloaded.mkdir(parents=True)
    (downloaded / "config.json").write_text(config)
    assert load_model_config("acme/tiny-llm.v2").source == str(downloaded / "config.json")

    old_sdk = tmp_path / "old" / "acme" / "tiny-llm"  # an older SDK: $MODELSCOPE_CACHE/<owner>/<name>
    old_sdk.mkdir(parents=True)
    (old_sdk / "config.json").write_text(config)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "old"))
    assert load_model_config("acme/tiny-llm").source == str(old_sdk / "config.json")


def test_unknown_model_says_how_to_pass_a_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="config.json") as info:
        load_model_config("nobody/no-such-model")
    assert "Qwen2.5-7B" in str(info.value)  # lists what is bundled


def test_folder_without_config_and_broken_json(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model_config(str(tmp_path))
    broken = tmp_path / "config.json"
    broken.write_text('{"model_type": "llama",\n  "hidden_size": }')
    with pytest.raises(ModelNotFoundError, match="line 2"):
        load_model_config(str(broken))


def test_config_missing_a_key_names_it(tmp_path):
    config = dict(load_model_config("Qwen2.5-0.5B").config)
    del config["num_hidden_layers"]
    with pytest.raises(ArchitectureError, match="num_hidden_layers"):
        architecture_from_config(config, source="x/config.json")


def test_unknown_family_is_flagged_but_sized():
    config = dict(load_model_config("Meta-Llama-3-8B").config, model_type="somethingnew")
    arch = architecture_from_config(config)
    assert not arch.known_family
    assert count_parameters(arch).total == PUBLISHED_TOTALS["Meta-Llama-3-8B"]


def test_multimodal_config_reads_text_config():
    text = load_model_config("Qwen2.5-0.5B").config
    arch = architecture_from_config({"model_type": "qwen2_vl", "text_config": text})
    assert arch.hidden_size == 896


def test_exact_count_is_automatic_only_outside_the_known_families(tmp_path):
    from core.estimate import plan_for_model

    assert plan_for_model("Qwen2.5-0.5B").exact_total_params is None
    # A known model_type under an unknown family name: counted on the meta device as a Llama.
    config = dict(load_model_config("Qwen2.5-0.5B").config)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config | {"model_type": "qwen2_moe_like"}))
    # transformers does not know this model_type: the analytic count stays, flagged as approximate.
    plan = plan_for_model(str(path))
    assert plan.exact_total_params is None and not plan.architecture.known_family
    assert plan_for_model("Qwen2.5-0.5B", exact_count=True).exact_total_params == 494_032_768


def test_exact_count_runs_for_a_family_transformers_knows_and_we_do_not(tmp_path):
    from core.estimate import plan_for_model

    config = {"model_type": "gemma", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 300}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    plan = plan_for_model(str(path))
    assert not plan.architecture.known_family
    assert plan.exact_total_params == count_parameters_exact(config)
