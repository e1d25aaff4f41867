"""Tokenization: loss only on assistant tokens (checked by decoding), truncation counted, text records."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from core.assets import tiny_model_dir
from core.data import IGNORE_INDEX, load_records, tokenize_dataset
from core.data.records import Conversation, Message, TextRecord
from core.data.tokenize import supports_generation_mask, token_counts, token_lengths

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"

# A template without {% generation %}: the prefix-diff method has to find the answers.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ '### ' + m.role + ':\\n' + m.content + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### assistant:\\n' }}{% endif %}"
)
# A template whose rendering of a prefix is not a prefix of the whole (like templates that drop old
# reasoning): the answer text has to be searched for.
SUFFIX_TEMPLATE = (
    "{% for m in messages %}{{ '<' + m.role + '>' + m.content + '</s>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant>' }}{% else %}{{ '[END]' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir()), local_files_only=True)


def with_template(tokenizer, template):
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return other


def labelled_text(tokenizer, labels):
    return tokenizer.decode([token for token in labels if token != IGNORE_INDEX])


def labelled_runs(tokenizer, labels):
    """The decoded text of each maximal run of labelled tokens."""
    runs, current = [], []
    for token in labels + [IGNORE_INDEX]:
        if token == IGNORE_INDEX:
            if current:
                runs.append(tokenizer.decode(current))
            current = []
        else:
            current.append(token)
    return runs


def chat(*pairs, system=None):
    messages = []
    for user, assistant in pairs:
        messages += [Message("user", user), Message("assistant", assistant)]
    return Conversation(messages=messages, system=system)


def test_bundled_template_supports_generation_masks(tokenizer):
    assert supports_generation_mask(tokenizer)
    assert not supports_generation_mask(with_template(tokenizer, PLAIN_TEMPLATE))


@pytest.mark.parametrize("method", ["generation", "prefix"])
def test_only_assistant_turns_carry_labels(tokenizer, method):
    record = chat(("What is 2 + 3?", "2 + 3 = 5."), ("And plus 4?", "5 + 4 = 9."), system="Be brief.")
    result = tokenize_dataset([record], tokenizer, max_seq_len=512, method=method)
    ids, labels = result.input_ids[0], result.labels[0]
    assert len(ids) == len(labels)
    assert labelled_runs(tokenizer, labels) == ["2 + 3 = 5.<|im_end|>", "5 + 4 = 9.<|im_end|>"]
    unlabelled = tokenizer.decode([i for i, label in zip(ids, labels, strict=True) if label == IGNORE_INDEX])
    assert "Be brief." in unlabelled and "What is 2 + 3?" in unlabelled and "5 + 4 = 9." not in unlabelled
    for token, label in zip(ids, labels, strict=True):
        assert label in (IGNORE_INDEX, token)


def test_both_methods_agree_on_every_fixture_and_the_samples(tokenizer):
    from core.data.samples import sample_dataset_path

    records = []
    for name in ("alpaca.json", "sharegpt.jsonl", "messages.jsonl"):
        records += load_records(FIXTURES / name)
    records += load_records(sample_dataset_path())
    generation = tokenize_dataset(records, tokenizer, None, method="generation")
    prefix = tokenize_dataset(records, tokenizer, None, method="prefix")
    assert generation.input_ids == prefix.input_ids
    assert generation.labels == prefix.labels
    assert generation.method == "generation" and prefix.method == "prefix"


def test_tool_calls_are_trained_on_and_tool_results_are_not(tokenizer):
    records = load_records(FIXTURES / "messages.jsonl")
    result = tokenize_dataset(records[2:], tokenizer, None)
    runs = labelled_runs(tokenizer, result.labels[0])
    assert runs == [
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call><|im_end|>',
        "21 degrees in Rome.<|im_end|>",
    ]


def test_prefix_method_on_a_template_without_generation_tags(tokenizer):
    plain = with_template(tokenizer, PLAIN_TEMPLATE)
    record = chat(("Spell cat backwards.", "tac"), ("Reverse: red blue", "blue red"))
    result = tokenize_dataset([record], plain, None)
    assert result.method == "prefix"
    assert [run.strip() for run in labelled_runs(plain, result.labels[0])] == ["tac", "blue red"]


def test_search_fallback_when_a_prefix_renders_differently(tokenizer):
    odd = with_template(tokenizer, SUFFIX_TEMPLATE)
    record = chat(("one?", "uno"), ("two?", "dos"))
    result = tokenize_dataset([record], odd, None)
    # each answer with the end-of-turn text that follows it; the last also with the template's [END]
    assert labelled_runs(odd, result.labels[0]) == ["uno</s>", "dos</s>[END]"]


def test_loss_on_all_labels_every_token(tokenizer):
    record = chat(("q", "a"))
    result = tokenize_dataset([record], tokenizer, None, loss_on="all")
    assert result.labels[0] == result.input_ids[0]
    with pytest.raises(ValueError, match="loss_on"):
        tokenize_dataset([record], tokenizer, None, loss_on="user")


def test_text_records_train_on_all_tokens_and_end_with_eos(tokenizer):
    result = tokenize_dataset([TextRecord("The river runs past the bridge.")], tokenizer, 256)
    ids, labels = result.input_ids[0], result.labels[0]
    assert labels == ids
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[:-1]) == "The river runs past the bridge."


def test_truncation_is_counted_never_silent(tokenizer):
    long_answer = " ".join(["word"] * 60)
    records = [chat(("short", "ok")), chat(("tell me a lot", long_answer)), TextRecord("x " * 100)]
    full = tokenize_dataset(records, tokenizer, None)
    limit = 24
    cut = tokenize_dataset(records, tokenizer, limit)
    expected_dropped = sum(max(0, n - limit) for n in full.lengths)
    assert cut.truncated == 2
    assert cut.tokens_dropped == expected_dropped > 0
    assert max(cut.lengths) == limit
    assert cut.skipped == 0
    assert cut.summary()["truncated"] == 2


def test_overlong_drop_leaves_a_long_sample_out_and_counts_it(tokenizer):
    """overlong: drop (ms-swift's truncation_strategy: delete): a sample longer than max_seq_len is left out
    whole, counted apart from the cut ones; the default still cuts it."""
    records = [chat(("short", "ok")), chat(("tell me a lot", " ".join(["word"] * 60))), TextRecord("x " * 100)]
    dropped = tokenize_dataset(records, tokenizer, 24, overlong="drop")
    assert len(dropped) == 1 and dropped.overlong_dropped == 2
    assert dropped.truncated == 0 and dropped.tokens_dropped == 0 and dropped.skipped == 0
    assert dropped.summary()["overlong_dropped"] == 2
    cut = tokenize_dataset(records, tokenizer, 24)
    assert len(cut) == 3 and cut.overlong_dropped == 0 and cut.truncated == 2
    with pytest.raises(ValueError, match="overlong"):
        tokenize_dataset(records, tokenizer, 24, overlong="left")


def test_a_sample_left_without_labels_is_dropped_and_counted(tokenizer):
    record = chat(("a very long question " * 20, "short answer"))
    record.origin = "data.jsonl:7"
    result = tokenize_dataset([record, chat(("q", "a"))], tokenizer, 16)
    assert len(result) == 1
    assert result.skipped == 1 and result.skipped_origins == ["data.jsonl:7"]
    assert result.truncated == 1
    # the cut, not the data, left it nothing: counted apart (the trainer and data check say how many, and where)
    assert result.cut_no_answer == 1 and result.cut_no_answer_origins == ["data.jsonl:7"]
    assert tokenize_dataset([record], tokenizer, None).skipped == 0


def test_token_lengths_match_untruncated_tokenization(tokenizer):
    records = load_records(FIXTURES / "sharegpt.jsonl") + load_records(FIXTURES / "text.jsonl")
    assert token_lengths(records, tokenizer) == tokenize_dataset(records, tokenizer, None).lengths


def test_token_counts_are_the_lengths_and_the_targets_the_loss_reads(tokenizer):
    """A record's targets: its positions whose next token has a label (the loss's shifted rows)."""
    records = load_records(FIXTURES / "sharegpt.jsonl") + load_records(FIXTURES / "text.jsonl")
    counts = token_counts(records, tokenizer)
    tokenized = tokenize_dataset(records, tokenizer, None)
    assert len(tokenized) == len(records)
    assert [n for n, _ in counts] == token_lengths(records, tokenizer)
    assert [k for _, k in counts] == [sum(1 for label in labels[1:] if label != IGNORE_INDEX)
                                      for labels in tokenized.labels]
    chats = sum(isinstance(r, Conversation) for r in records)
    assert all(0 < k < n / 2 for n, k in counts[:chats])  # prompts and the template's tokens carry none
    assert all(k == n - 1 for n, k in counts[chats:])  # a text trains on every next token
    assert token_counts(records[:1], tokenizer, loss_on="all")[0] == (counts[0][0], counts[0][0] - 1)


def test_tokenizer_without_a_chat_template_gets_the_bundled_one(tokenizer):
    base = with_template(tokenizer, None)
    assert not base.chat_template
    result = tokenize_dataset([chat(("q?", "an answer"))], base, None)
    assert result.chat_template_added is True and result.summary()["chat_template_added"] is True
    assert labelled_runs(base, result.labels[0]) == ["an answer<|im_end|>"]
    # text records need no template and leave the tokenizer alone
    plain = with_template(tokenizer, None)
    assert tokenize_dataset([TextRecord("x")], plain, None).chat_template_added is False
    assert not plain.chat_template


def test_counts_made_in_several_threads_at_once_are_the_counts():
    """The wizard counts a dataset in a worker, and a second one starts when Enter comes before the first is done.
    transformers keeps the ``{% generation %}`` marks of a rendering on the compiled template, shared by the
    process: renderings at once mixed their marks (a few targets more or less: the plan's speed moved in its last
    digit) or failed. Six threads, each with its own tokenizer as the workers load them, switching as often as
    the interpreter can (without the lock every one of them went wrong)."""
    import sys
    import threading

    from core.data.samples import sample_dataset_path
    from core.data.stats import load_tokenizer

    records = load_records(sample_dataset_path())
    expected = token_counts(records, load_tokenizer("tiny"))
    tokenizers = [load_tokenizer("tiny") for _ in range(6)]
    results: list[object] = []

    def count(tokenizer) -> None:
        try:
            results.append(token_counts(records, tokenizer))
        except Exception as exc:  # "AssistantTracker should not be reused before closed"
            results.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=count, args=(tokenizer,)) for tokenizer in tokenizers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert [result == expected for result in results] == [True] * 6, [r for r in results if r != expected][:1]


# A Qwen3-style hybrid template (no {% generation %}): with enable_thinking false an empty think block comes
# before each answer, in the prompt an answer follows (so outside the answer's labels), as Qwen3's does at
# inference; left out (the template's default), no block.
QWEN3_STYLE_TEMPLATE = (
    "{%- set off = enable_thinking is defined and enable_thinking is false %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if off %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{{ m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if off %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
# The same with {% generation %} around the answer: the mask comes from the template.
QWEN3_STYLE_GENERATION = QWEN3_STYLE_TEMPLATE.replace(
    "{{ m.content + '<|im_end|>\\n' }}", "{%- generation %}{{ m.content + '<|im_end|>' }}{%- endgeneration %}{{ '\\n' }}")


@pytest.mark.parametrize("template", [QWEN3_STYLE_TEMPLATE, QWEN3_STYLE_GENERATION])
def test_thinking_off_renders_the_empty_think_block_outside_the_labels(tokenizer, template):
    """Before, a run could not give the chat template enable_thinking=False (LLaMA-Factory's enable_thinking:
    false blocked): a Qwen3 model was trained without the empty think block its non-thinking mode puts before
    each answer. Now ``kwargs`` reach the template: the text gets the block, and the labels still cover exactly
    each answer and its end-of-turn token."""
    from core.data.tokenize import template_kwargs

    other = with_template(tokenizer, template)
    record = chat(("What is 2 + 3?", "2 + 3 = 5."), ("And plus 4?", "5 + 4 = 9."), system="Be brief.")
    plain = tokenize_dataset([record], other, max_seq_len=512)
    off = tokenize_dataset([record], other, max_seq_len=512, kwargs=template_kwargs(False))
    assert "<think>" not in other.decode(plain.input_ids[0])
    text = other.decode(off.input_ids[0])
    assert text.count("<|im_start|>assistant\n<think>\n\n</think>\n\n") == 2
    assert text.replace("<think>\n\n</think>\n\n", "") == other.decode(plain.input_ids[0])
    for result in (plain, off):
        assert labelled_runs(other, result.labels[0]) == ["2 + 3 = 5.<|im_end|>", "5 + 4 = 9.<|im_end|>"]
    # token counts and lengths (the planner's, data check's) see the block too
    [(length, _targets)] = token_counts([record], other, kwargs=template_kwargs(False))
    assert length == len(off.input_ids[0]) == token_lengths([record], other, kwargs={"enable_thinking": False})[0]
    assert template_kwargs(None) == {} and template_kwargs(True) == {"enable_thinking": True}


def test_a_template_that_never_reads_enable_thinking_is_told_apart(tokenizer):
    """The warning of ``train --check`` rests on this: the bundled ChatML template renders the same with or
    without enable_thinking, a Qwen3-style one reads it."""
    from core.data.tokenize import template_ignores

    kwargs = {"enable_thinking": False}
    assert template_ignores(tokenizer, kwargs) == ["enable_thinking"]
    assert template_ignores(with_template(tokenizer, QWEN3_STYLE_TEMPLATE), kwargs) == []
    assert template_ignores(with_template(tokenizer, QWEN3_STYLE_GENERATION), kwargs) == []
    assert template_ignores(with_template(tokenizer, "{% for m in messages %"), kwargs) == []  # unreadable: no claim


def test_chat_prompts_get_the_runs_template_variables(tokenizer, tmp_path):
    """Chat and serve render a prompt as training rendered its samples: a run with thinking: false gets the
    empty think block after the generation prompt (before, chat rendered the template's default, so a model
    trained without thinking was asked to think). A merge records the variables for its folder."""
    import json

    from core.lifecycle.chat import prompt_ids
    from core.lifecycle.source import LoadedModel, merged_template_kwargs

    other = with_template(tokenizer, QWEN3_STYLE_TEMPLATE)
    messages = [{"role": "user", "content": "Hi"}]
    off = other.decode(prompt_ids(LoadedModel(None, other, None, False, "cpu", {"enable_thinking": False}),
                                  messages)[0])
    default = other.decode(prompt_ids(LoadedModel(None, other, None, False, "cpu"), messages)[0])
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and default.endswith("assistant\n")
    (tmp_path / "tunedeck_merge.json").write_text(json.dumps({"template_kwargs": {"enable_thinking": False}}))
    assert merged_template_kwargs(tmp_path) == {"enable_thinking": False}
    assert merged_template_kwargs(tmp_path / "elsewhere") == {}
