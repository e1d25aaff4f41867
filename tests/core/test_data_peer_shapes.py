"""Data in the shapes LLaMA-Factory, ms-swift, OpenAI, Anthropic and TRL users already have (#17).

Each shape is written here in the peer's documented form (not copied from the peers' files) and checked
for: the detected format, the record count, which tokens the loss is on, and, for data tunedeck does not
train (preference, KTO, multimodal), the refusal saying what it is at file:line.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from core.assets import tiny_model_dir
from core.data import IGNORE_INDEX, DataError, load_training_records, read_dataset, tokenize_dataset
from core.data.records import Conversation, TextRecord

# No {% generation %} marks: the prefix method finds the answers (the tiny model's own template has the
# marks, and both are checked below).
PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ '### ' + m.role + ':\\n' + m.content + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '### assistant:\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir()), local_files_only=True)


@pytest.fixture(scope="module")
def plain_tokenizer(tokenizer):
    other = copy.deepcopy(tokenizer)
    other.chat_template = PLAIN_TEMPLATE
    return other


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def trained_text(tokenizer, record) -> str:
    """The text of the tokens that carry a label, joined: what the model is taught."""
    tokenized = tokenize_dataset([record], tokenizer, None)
    ids, labels = tokenized.input_ids[0], tokenized.labels[0]
    return tokenizer.decode([i for i, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX])


# -- refused before the GPU: preference, KTO, multimodal -------------------------------------------
REFUSED = {
    "llamafactory_dpo_sharegpt": ([{"conversations": [{"from": "human", "value": "Pick one."}],
                                    "chosen": {"from": "gpt", "value": "Good."},
                                    "rejected": {"from": "gpt", "value": "Bad."}}] * 3, "preference (DPO) data"),
    "llamafactory_dpo_alpaca": ([{"instruction": "Pick.", "input": "", "chosen": "Good.", "rejected": "Bad."}] * 2,
                                "preference (DPO) data"),
    "trl_preference": ([{"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}] * 2,
                       "preference (DPO) data"),
    "swift_rejected_response": ([{"messages": [{"role": "user", "content": "Hi"},
                                               {"role": "assistant", "content": "Hello"}],
                                  "rejected_response": "Go away"}], "preference (DPO) data"),
    "llamafactory_kto": ([{"messages": [{"role": "user", "content": "Hi"},
                                        {"role": "assistant", "content": "Rude answer"}], "label": False},
                          {"messages": [{"role": "user", "content": "Hi"},
                                        {"role": "assistant", "content": "Hello!"}], "label": True}], "KTO data"),
    "alpaca_kto_tag": ([{"instruction": "Hi", "input": "", "output": "Rude", "kto_tag": False}], "KTO data"),
    "trl_unpaired_preference": ([{"prompt": "The sky is", "completion": " green.", "label": False}], "KTO data"),
    "llamafactory_mllm": ([{"messages": [{"role": "user", "content": "<image>What is this?"},
                                         {"role": "assistant", "content": "A cat."}],
                            "images": ["mllm_demo_data/1.jpg"]}] * 4, "multimodal rows: images are not supported"),
    "image_token_only": ([{"instruction": "<image>Describe", "input": "", "output": "A dog."}],
                         "multimodal rows: images are not supported"),
    "openai_image_url_part": ([{"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
        {"role": "assistant", "content": "A tree."}]}], "multimodal rows: images are not supported"),
    "swift_videos": ([{"messages": [{"role": "user", "content": "<video>What happens?"},
                                    {"role": "assistant", "content": "Rain."}], "videos": ["v.mp4"]}],
                     "multimodal rows: videos are not supported"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_data_that_is_not_sft_text_is_refused_with_what_it_is_and_where(tmp_path, name):
    rows, expected = REFUSED[name]
    path = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    loaded = read_dataset(path)
    assert loaded.records == []
    (issue,) = loaded.issues  # one issue for the whole kind, not one misleading error per row
    assert expected in issue.message
    assert f"{len(rows)} rows" in issue.message
    assert str(issue).startswith(f"{path}:1: ")
    with pytest.raises(DataError, match="tunedeck|text only"):
        load_training_records(str(path))


def test_a_refused_row_inside_trainable_data_is_located(tmp_path):
    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    bad = {**good, "images": ["x.png"]}
    path = write_jsonl(tmp_path / "mixed.jsonl", [good, good, bad, good])
    loaded = read_dataset(path)
    assert len(loaded.records) == 3
    (issue,) = loaded.issues
    assert issue.line == 3 and "multimodal rows: images are not supported (1 rows" in issue.message


def test_preference_hint_says_how_to_use_the_chosen_answers(tmp_path):
    path = write_jsonl(tmp_path / "dpo.jsonl", REFUSED["trl_preference"][0])
    message = read_dataset(path).issues[0].message
    assert "tunedeck trains SFT only; use the chosen answers by" in message
    assert read_dataset(path).format == "preference"


# -- per-turn loss switches -------------------------------------------------------------------------
def _three_turns(key: str, off, on) -> dict:
    return {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "EXCLUDED answer", key: off},
        {"role": "user", "content": "second question"},
        {"role": "assistant", "content": "KEPT answer", key: on},
    ]}


@pytest.mark.parametrize("key, off, on", [("weight", 0, 1), ("loss", False, True), ("loss_weight", 0.0, 1.0)])
@pytest.mark.parametrize("template", ["generation", "prefix"])
def test_weight_0_and_loss_false_turns_are_excluded_from_the_loss(tmp_path, tokenizer, plain_tokenizer,
                                                                  key, off, on, template):
    path = write_jsonl(tmp_path / "weights.jsonl", [_three_turns(key, off, on)])
    loaded = read_dataset(path)
    assert loaded.format == "messages" and not loaded.issues
    (record,) = loaded.records
    assert [m.trained for m in record.messages if m.role == "assistant"] == [False, True]
    tok = tokenizer if template == "generation" else plain_tokenizer
    taught = trained_text(tok, record)
    assert "KEPT answer" in taught
    assert "EXCLUDED" not in taught and "question" not in taught


def test_data_check_counts_the_excluded_turns(tmp_path):
    from core.data import check_data

    path = write_jsonl(tmp_path / "weights.jsonl", [_three_turns("weight", 0, 1)])
    report = check_data(path).to_dict()
    assert report["assistant_turns"] == 2 and report["assistant_turns_untrained"] == 1


def test_a_conversation_whose_every_answer_is_excluded_is_skipped_and_counted(tmp_path, tokenizer):
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "weight": 0}]}
    (record,) = read_dataset(write_jsonl(tmp_path / "w.jsonl", [row])).records
    result = tokenize_dataset([record], tokenizer, None)
    assert len(result) == 0 and result.skipped == 1


@pytest.mark.parametrize("item, problem", [
    ({"role": "assistant", "content": "a", "weight": 0.5}, "'weight' must be 0"),
    ({"role": "assistant", "content": "a", "loss": "no"}, "'loss' must be true/false"),
])
def test_bad_loss_switches_are_named(tmp_path, item, problem):
    row = {"messages": [{"role": "user", "content": "q"}, item]}
    (issue,) = read_dataset(write_jsonl(tmp_path / "w.jsonl", [row])).issues
    assert issue.line == 1 and problem in issue.message


def test_loss_true_on_a_user_turn_is_refused(tmp_path):
    row = {"messages": [{"role": "user", "content": "q", "loss": True}, {"role": "assistant", "content": "a"}]}
    (issue,) = read_dataset(write_jsonl(tmp_path / "w.jsonl", [row])).issues
    assert "only assistant turns can be trained" in issue.message


# -- shapes the peers read -------------------------------------------------------------------------
def test_swift_query_response_history(tmp_path, tokenizer):
    rows = [{"system": "You are helpful.", "query": "And 3+3?", "response": "SIX",
             "history": [["What is 1+1?", "TWO"], ["And 2+2?", "FOUR"]]},
            {"query": "Hi", "response": "HELLO"}]
    loaded = read_dataset(write_jsonl(tmp_path / "qr.jsonl", rows))
    assert loaded.format == "query_response" and len(loaded.records) == 2 and not loaded.issues
    first = loaded.records[0]
    assert first.system == "You are helpful." and [m.role for m in first.messages] == ["user", "assistant"] * 3
    taught = trained_text(tokenizer, first)
    assert all(word in taught for word in ("TWO", "FOUR", "SIX")) and "What is" not in taught


def test_swift_conversation_human_assistant(tmp_path, tokenizer):
    rows = [{"system": "Be kind.", "conversation": [{"human": "hello", "assistant": "HI THERE"},
                                                    {"human": "bye", "assistant": "SEE YOU"}]}]
    loaded = read_dataset(write_jsonl(tmp_path / "conv.jsonl", rows))
    assert loaded.format == "conversation" and len(loaded.records) == 1 and not loaded.issues
    taught = trained_text(tokenizer, loaded.records[0])
    assert "HI THERE" in taught and "SEE YOU" in taught and "hello" not in taught


def test_swift_agent_roles_tool_call_and_tool_response(tmp_path, tokenizer):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    row = {"tools": json.dumps(tools), "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "tool_call", "content": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
        {"role": "tool_response", "content": json.dumps({"temp": 21})},
        {"role": "assistant", "content": "It is 21 degrees."},
    ]}
    loaded = read_dataset(write_jsonl(tmp_path / "agent.jsonl", [row]))
    assert loaded.format == "messages" and not loaded.issues
    (record,) = loaded.records
    assert [m.role for m in record.messages] == ["user", "assistant", "tool", "assistant"]
    assert record.messages[1].tool_calls[0].name == "get_weather"
    assert record.messages[1].tool_calls[0].arguments == {"city": "Paris"}
    assert record.tools[0]["function"]["name"] == "get_weather"
    taught = trained_text(tokenizer, record)
    assert "get_weather" in taught and "It is 21 degrees." in taught and "temp" not in taught


def test_openai_legacy_function_call_and_function_role(tmp_path):
    row = {"functions": [{"name": "lookup", "parameters": {"type": "object", "properties": {}}}],
           "messages": [{"role": "user", "content": "Find it"},
                        {"role": "assistant", "content": None,
                         "function_call": {"name": "lookup", "arguments": "{\"q\": \"it\"}"}},
                        {"role": "function", "name": "lookup", "content": "found"},
                        {"role": "assistant", "content": "Here it is."}]}
    loaded = read_dataset(write_jsonl(tmp_path / "legacy.jsonl", [row]))
    assert loaded.format == "messages" and not loaded.issues
    (record,) = loaded.records
    assert record.messages[1].tool_calls[0].name == "lookup"
    assert record.messages[1].tool_calls[0].arguments == {"q": "it"}
    assert record.messages[2].role == "tool" and record.messages[2].name == "lookup"
    assert record.tools == [{"type": "function", "function": row["functions"][0]}]


def test_anthropic_tool_use_and_tool_result_blocks(tmp_path, tokenizer):
    row = {"system": "You use tools.",
           "tools": [{"name": "add", "description": "Adds", "input_schema": {"type": "object"}}],
           "messages": [
               {"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": [{"type": "text", "text": "Let me add."},
                                                 {"type": "tool_use", "id": "toolu_1", "name": "add",
                                                  "input": {"a": 2, "b": 2}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}]},
               {"role": "assistant", "content": [{"type": "text", "text": "It is 4."}]},
           ]}
    loaded = read_dataset(write_jsonl(tmp_path / "anthropic.jsonl", [row]))
    assert loaded.format == "messages" and not loaded.issues, loaded.issues
    (record,) = loaded.records
    assert record.system == "You use tools."
    assert [m.role for m in record.messages] == ["user", "assistant", "tool", "assistant"]
    call = record.messages[1].tool_calls[0]
    assert (call.name, call.arguments, call.id) == ("add", {"a": 2, "b": 2}, "toolu_1")
    assert record.messages[2].tool_call_id == "toolu_1" and record.messages[2].name == "add"
    assert record.tools[0]["function"]["parameters"] == {"type": "object"}
    taught = trained_text(tokenizer, record)
    assert "Let me add." in taught and "It is 4." in taught and "2+2" not in taught


def test_llamafactory_v1_content_parts_with_value(tmp_path, tokenizer):
    row = {"messages": [{"role": "user", "content": [{"type": "text", "value": "Say hi"}]},
                        {"role": "assistant", "content": [{"type": "text", "value": "HI"}]}]}
    loaded = read_dataset(write_jsonl(tmp_path / "v1.jsonl", [row]))
    assert loaded.format == "messages" and not loaded.issues  # was "is empty"
    (record,) = loaded.records
    assert record.messages[0].content == "Say hi" and "HI" in trained_text(tokenizer, record)


def test_trl_plain_prompt_completion_trains_the_completion_only(tmp_path, tokenizer):
    rows = [{"prompt": "The sky is", "completion": " blue."}, {"prompt": "Grass is", "completion": " green."}]
    loaded = read_dataset(write_jsonl(tmp_path / "pc.jsonl", rows))
    assert loaded.format == "prompt_completion" and len(loaded.records) == 2 and not loaded.issues
    record = loaded.records[0]
    assert isinstance(record, TextRecord) and record.prompt == "The sky is"
    tokenized = tokenize_dataset([record], tokenizer, None)
    ids, labels = tokenized.input_ids[0], tokenized.labels[0]
    prompt_len = len(tokenizer("The sky is")["input_ids"])
    assert all(label == IGNORE_INDEX for label in labels[:prompt_len])
    assert labels[prompt_len:] == ids[prompt_len:] and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[prompt_len:-1]) == " blue."


def test_trl_conversational_prompt_completion(tmp_path, tokenizer):
    row = {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "EARLIER reply"},
                      {"role": "user", "content": "Colour of the sky?"}],
           "completion": [{"role": "assistant", "content": "BLUE it is."}]}
    loaded = read_dataset(write_jsonl(tmp_path / "pcc.jsonl", [row]))
    assert loaded.format == "prompt_completion" and not loaded.issues
    (record,) = loaded.records
    assert isinstance(record, Conversation) and len(record.messages) == 4
    taught = trained_text(tokenizer, record)
    assert "BLUE it is." in taught and "EARLIER" not in taught


def test_trl_messages_is_the_messages_format(tmp_path):
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert read_dataset(write_jsonl(tmp_path / "m.jsonl", [row])).format == "messages"


def test_txt_files_for_pretraining(tmp_path, tokenizer):
    path = tmp_path / "corpus.txt"
    path.write_text("First document,\nstill first.\n\n\nSecond document.\n\nThird.\n", encoding="utf-8")
    loaded = read_dataset(path)
    assert loaded.format == "text" and len(loaded.records) == 3 and not loaded.issues
    assert [r.origin for r in loaded.records] == [f"{path}:1", f"{path}:5", f"{path}:7"]
    assert loaded.records[0].text == "First document,\nstill first."
    tokenized = tokenize_dataset(loaded.records[:1], tokenizer, None)
    assert tokenized.labels[0] == tokenized.input_ids[0]  # loss on every token


def test_a_folder_of_txt_files_is_one_document_per_file(tmp_path):
    folder = tmp_path / "books"
    folder.mkdir()
    (folder / "a.txt").write_text("Para one.\n\nPara two.\n", encoding="utf-8")
    (folder / "b.txt").write_text("Only one.\n", encoding="utf-8")
    records = load_training_records(str(folder))
    assert [r.text for r in records] == ["Para one.\n\nPara two.", "Only one."]


def test_a_readme_txt_beside_structured_data_is_not_training_text(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [{"text": "real"}])
    (folder / "README.txt").write_text("About this data.\n", encoding="utf-8")
    assert [r.text for r in load_training_records(str(folder))] == ["real"]
