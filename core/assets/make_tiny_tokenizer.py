"""Rebuild the bundled tiny model's tokenizer and config: ``python -m core.assets.make_tiny_tokenizer``.

A byte-level BPE tokenizer (every string encodes; nothing is ever unknown) is trained with the
``tokenizers`` library on the bundled sample conversations, rendered with the chat template, plus a little
generic English, so that the demo's texts take few tokens. Digits are split one by one, which makes sums
learnable for a tiny model. The chat template is ChatML and marks assistant turns with
``{% generation %}`` so that ``return_assistant_tokens_mask`` works. The model config is a small
Qwen2ForCausalLM whose vocabulary is exactly the tokenizer's.

The script is deterministic: running it again writes the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

ASSETS = Path(__file__).parent
TINY_DIR = ASSETS / "tiny"
TEMPLATE_SOURCE = ASSETS / "chat_template.jinja"
VOCAB_SIZE = 1024  # an upper bound: the small corpus yields fewer merges at min_frequency 2
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", "<|im_end|>"]

# Model shape: large enough to learn part of the samples in a minute on a CPU, small enough to start fast.
MODEL_SHAPE = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
}

GENERIC_ENGLISH = """\
The quick brown fox jumps over the lazy dog. A small model can learn simple facts when it sees them often.
Training a language model means showing it text and asking it to predict the next token.
The loss goes down as the model learns, and the learning rate decides how big each step is.
You can ask a question, and the assistant answers with a short sentence.
Please write a short answer. Thank you for your help. Here is the result you asked for.
The weather today is sunny with a light wind from the west, and it may rain in the evening.
Water boils at one hundred degrees and freezes at zero degrees on the Celsius scale.
There are seven days in a week, twelve months in a year, and sixty minutes in an hour.
The user asked the system to summarise the document, translate the text and list the main points.
If the data is wrong, the model learns the wrong thing; check the file before you train.
Numbers: one two three four five six seven eight nine ten eleven twelve twenty hundred thousand.
Monday Tuesday Wednesday Thursday Friday Saturday Sunday. January February March April May June July.
Good morning. How are you? I am fine. What is your name? Where do you live? Why is the sky blue?
The function returns a list of strings. Call the tool with the arguments as JSON.
"""


def chat_template() -> str:
    return TEMPLATE_SOURCE.read_text(encoding="utf-8").strip() + "\n"


def training_texts() -> list[str]:
    """Texts the BPE merges are learnt from: rendered sample chats and generic English."""
    from jinja2 import Environment

    from core.data.samples import sample_dataset_path

    # The {% generation %} tag is a transformers extension; for rendering here it is a no-op.
    template = Environment().from_string(
        chat_template().replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    )
    from core.data.readers import jsonl_lines

    texts = []
    for line in jsonl_lines(sample_dataset_path().read_text(encoding="utf-8")):  # not splitlines: U+2028
        if not line.strip():
            continue
        record = json.loads(line)
        texts.append(template.render(messages=record["messages"], tools=None, add_generation_prompt=False))
    texts += GENERIC_ENGLISH.splitlines() * 3
    return texts


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_texts(), trainer=trainer)
    return tokenizer


def tokenizer_config(tokenizer) -> dict:
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "model_max_length": MODEL_SHAPE["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "padding_side": "right",
        "chat_template": chat_template(),
    }


def model_config(tokenizer) -> dict:
    from transformers import Qwen2Config

    config = Qwen2Config(
        vocab_size=tokenizer.get_vocab_size(),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.token_to_id(PAD_TOKEN),
        eos_token_id=tokenizer.token_to_id("<|im_end|>"),
        pad_token_id=tokenizer.token_to_id(PAD_TOKEN),
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        dtype="float32",
        **MODEL_SHAPE,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    return config.to_dict()


def main() -> None:
    tokenizer = build_tokenizer()
    TINY_DIR.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(TINY_DIR / "tokenizer.json"))
    dump = {"indent": 2, "sort_keys": True, "ensure_ascii": False}
    (TINY_DIR / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tokenizer), **dump) + "\n")
    config = model_config(tokenizer)
    config.pop("transformers_version", None)  # keeps the file stable across library upgrades
    (TINY_DIR / "config.json").write_text(json.dumps(config, **dump) + "\n")
    generation = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "do_sample": False,
        "max_new_tokens": 64,
    }
    (TINY_DIR / "generation_config.json").write_text(json.dumps(generation, **dump) + "\n")
    print(f"vocabulary {tokenizer.get_vocab_size()} tokens; wrote {TINY_DIR}")


if __name__ == "__main__":
    main()
