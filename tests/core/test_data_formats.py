"""Format detection and normalisation of each dataset format into Conversation / TextRecord."""

from __future__ import annotations

import pytest

from core.data.formats import RowError, detect_format, normalise_row
from core.data.records import Conversation, TextRecord


@pytest.mark.parametrize(
    ("row", "fmt"),
    [
        ({"instruction": "a", "input": "", "output": "b"}, "alpaca"),
        ({"instruction": "a", "output": "b"}, "alpaca"),
        ({"conversations": [{"from": "human", "value": "a"}]}, "sharegpt"),
        ({"messages": [{"role": "user", "content": "a"}]}, "messages"),
        ({"text": "plain"}, "text"),
    ],
)
def test_detect_each_format(row, fmt):
    assert detect_format([row, row]) == fmt


def test_detect_by_majority_and_unknown():
    rows = [{"text": "x"}, {"messages": []}, {"messages": []}]
    assert detect_format(rows) == "messages"
    assert detect_format([{"question": "a", "answer": "b"}]) is None


def test_alpaca_with_input_system_and_history():
    record = normalise_row({
        "instruction": "Add.", "input": "2 and 3", "output": "5", "system": "Be exact.",
        "history": [["Hi", "Hello"]],
    }, "alpaca")
    assert isinstance(record, Conversation)
    assert record.system == "Be exact."
    assert [(m.role, m.content) for m in record.messages] == [
        ("user", "Hi"), ("assistant", "Hello"), ("user", "Add.\n2 and 3"), ("assistant", "5"),
    ]


def test_alpaca_joins_the_instruction_and_input_that_are_there():
    """An empty instruction with an input gave the prompt "\\ninput" (a newline LLaMA-Factory, which joins only
    the parts that are there, does not train on), and a row with neither said "message 1 (user) is empty", a
    message the alpaca row has no such thing as. Now the prompt is the input, and the empty row names its keys."""
    record = normalise_row({"instruction": "", "input": "2 and 3", "output": "5"}, "alpaca")
    assert [(m.role, m.content) for m in record.messages] == [("user", "2 and 3"), ("assistant", "5")]
    with pytest.raises(RowError, match="'instruction' and 'input' are both empty"):
        normalise_row({"instruction": " ", "input": "", "output": "5"}, "alpaca")


def test_sharegpt_roles_tools_and_function_calls():
    record = normalise_row({
        "system": "S",
        "tools": '[{"name": "f", "parameters": {}}]',
        "conversations": [
            {"from": "human", "value": "q"},
            {"from": "function_call", "value": '{"name": "f", "arguments": {"x": 1}}'},
            {"from": "observation", "value": "42"},
            {"from": "gpt", "value": "It is 42."},
        ],
    }, "sharegpt")
    assert record.system == "S"
    assert record.tools == [{"name": "f", "parameters": {}}]
    assert [m.role for m in record.messages] == ["user", "assistant", "tool", "assistant"]
    call = record.messages[1].tool_calls[0]
    assert (call.name, call.arguments) == ("f", {"x": 1})
    chat = record.to_chat_messages()
    assert chat[0] == {"role": "system", "content": "S"}
    assert chat[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"x": 1}}


def test_sharegpt_system_turn_becomes_the_system_prompt():
    record = normalise_row({"conversations": [
        {"from": "system", "value": "S"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"},
    ]}, "sharegpt")
    assert record.system == "S" and len(record.messages) == 2


def test_openai_messages_with_tool_calls_and_content_parts():
    record = normalise_row({"messages": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": [{"type": "text", "text": "he"}, {"type": "text", "text": "llo"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "g", "arguments": '{"a": "b"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "done"},
    ], "tools": [{"type": "function", "function": {"name": "g"}}]}, "messages")
    assert record.system == "S"
    assert record.messages[0].content == "hello"
    assert record.messages[1].tool_calls[0].arguments == {"a": "b"}
    assert record.messages[1].tool_calls[0].id == "c1"
    assert record.messages[2].tool_call_id == "c1"
    assert record.tools == [{"type": "function", "function": {"name": "g"}}]


def test_text_record():
    record = normalise_row({"text": "hello world"}, "text")
    assert isinstance(record, TextRecord) and record.text == "hello world"


@pytest.mark.parametrize(
    ("row", "fmt", "fragment"),
    [
        ({"instruction": "a"}, "alpaca", "missing key 'output'"),
        ({"instruction": "a", "output": None}, "alpaca", "'output' has no value (null"),  # not "missing" while listed
        ({"instruction": "a", "output": "  "}, "alpaca", "'output' is empty"),
        ({"instruction": 3, "output": "b"}, "alpaca", "must be text, not a number"),
        ({"instruction": "a", "output": "b", "history": [["only one"]]}, "alpaca", "[question, answer] pair"),
        ({"conversations": [{"from": "bot", "value": "x"}]}, "sharegpt", "role 'bot'"),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt"}]}, "sharegpt", "has no 'value'"),
        ({"conversations": [{"from": "gpt", "value": "a"}]}, "sharegpt", "must start with the user"),
        ({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "nope"}]},
         "sharegpt", "invalid tool call"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]},
         "messages", "message 2 (assistant) is empty"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": {"a": 1}}]},
         "messages", "must be text, not an object"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"},
                       {"role": "assistant", "content": "a"}]}, "messages", "may only come first"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                       {"role": "assistant", "content": "b"}]}, "messages", "must alternate"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]},
         "messages", "does not follow an assistant tool call"),
        ({"messages": [{"role": "user", "content": "q"}]}, "messages", "ends with a user message"),
        ({"messages": []}, "messages", "no messages"),
        ({"text": ""}, "text", "'text' is empty"),
        (["not", "an", "object"], "text", "must be a JSON object"),
    ],
)
def test_malformed_rows_say_what_is_wrong(row, fmt, fragment):
    with pytest.raises(RowError) as info:
        normalise_row(row, fmt)
    assert fragment in str(info.value)
