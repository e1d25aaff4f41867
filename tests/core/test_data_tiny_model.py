"""The bundled tiny model: tokenizer loads offline, matches its config, renders ChatML; assets reproducible."""

from __future__ import annotations

import json

import pytest

from core.assets import is_tiny_model, resolve_model_name, tiny_model_dir


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir()), local_files_only=True)


def test_files_are_there_without_weights():
    directory = tiny_model_dir()
    names = {p.name for p in directory.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= names
    assert not any(name.endswith((".safetensors", ".bin")) for name in names)
    assert is_tiny_model("tiny") and is_tiny_model(str(directory)) and not is_tiny_model("Qwen/Qwen2.5-7B")
    assert resolve_model_name("tiny") == str(directory)


def test_config_matches_the_tokenizer(tokenizer):
    config = json.loads((tiny_model_dir() / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert config["vocab_size"] == len(tokenizer)
    assert config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] == 2048
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id
    assert config["pad_token_id"] == tokenizer.convert_tokens_to_ids("<|endoftext|>") == tokenizer.pad_token_id


def test_tokenizer_round_trips_any_text(tokenizer):
    for text in ("What is 12 + 7?", "Ünïcode, 中文, emoji 🙂 and\ttabs\n", "<|im_start|>user\nhi<|im_end|>"):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    # digits are single tokens, which keeps sums learnable
    ids = tokenizer("12345", add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in ids] == ["1", "2", "3", "4", "5"]
    # special tokens are single ids
    assert len(tokenizer("<|im_start|>", add_special_tokens=False)["input_ids"]) == 1


def test_chat_template_is_chatml_with_a_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tools = [{"type": "function", "function": {"name": "f"}}]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\n") and '"name": "f"' in text


def test_model_builds_from_config_and_runs_a_forward_pass(tokenizer):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(tiny_model_dir()), local_files_only=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    ids = torch.tensor([tokenizer("What is 1 + 1?", add_special_tokens=False)["input_ids"]])
    out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(out.loss)


def test_tokenizer_training_is_reproducible():
    from tokenizers import Tokenizer

    from core.assets.make_tiny_tokenizer import build_tokenizer

    shipped = Tokenizer.from_file(str(tiny_model_dir() / "tokenizer.json"))
    rebuilt = build_tokenizer()
    assert rebuilt.get_vocab() == shipped.get_vocab()
    assert json.loads(rebuilt.to_str())["model"]["merges"] == json.loads(shipped.to_str())["model"]["merges"]


def test_sample_dataset_is_reproducible_and_valid():
    from core.data import load_records, sample_dataset_path
    from core.data.samples.make_samples import make_records

    lines = sample_dataset_path().read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == make_records()
    records = load_records(sample_dataset_path())
    assert 200 <= len(records) <= 400


def test_transformers_tokenizer_encodes_exactly_like_the_trained_one(tokenizer):
    # AutoTokenizer picks a Qwen2 tokenizer class from config.json; it must not swap in its own
    # pre-tokenizer rules for the ones the file was trained with.
    from tokenizers import Tokenizer

    from core.assets.make_tiny_tokenizer import GENERIC_ENGLISH, training_texts

    raw = Tokenizer.from_file(str(tiny_model_dir() / "tokenizer.json"))
    texts = training_texts()[:300] + GENERIC_ENGLISH.splitlines() + ["  leading spaces\n\n and 3.14159 "]
    for text in texts:
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == raw.encode(text).ids, text
