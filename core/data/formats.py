"""Dataset formats: detecting which one a file uses and normalising each row into a ``Record``.

* ``alpaca``: ``instruction``, ``input``, ``output`` (+ optional ``system``, ``history`` [[q, a], ...]).
* ``sharegpt``: ``conversations`` of ``{from, value}`` with roles human/gpt/function_call/observation/
  system (+ optional ``system`` and ``tools``), the LLaMA-Factory convention; ``{role, content}`` items are
  accepted too.
* ``messages``: OpenAI chat, ``messages`` of ``{role, content}`` with system/user/assistant/tool roles and
  assistant ``tool_calls``.
* ``text``: plain ``text`` for continued pre-training.

A row that does not fit raises ``RowError`` whose message says what is wrong; the reader adds where.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from core.data.records import Conversation, Message, Record, TextRecord, ToolCall
from core.i18n import t

FORMATS = ("alpaca", "sharegpt", "messages", "text")
SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant",
    "function_call": "function_call",
    "observation": "tool", "tool": "tool", "function": "tool",
    "system": "system",
}


class RowError(ValueError):
    """A row that does not fit its format; the message is for the user."""


def format_of_row(row: Any) -> str | None:
    """The format a single row looks like, or ``None``."""
    if not isinstance(row, dict):
        return None
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        return "sharegpt"
    if "instruction" in row or ("output" in row and "input" in row):
        return "alpaca"
    if "text" in row:
        return "text"
    return None


def detect_format(rows: Iterable[Any], sample: int = 50) -> str | None:
    """The format most of the first ``sample`` rows use (``None`` when none is recognised)."""
    votes: Counter[str] = Counter()
    for index, row in enumerate(rows):
        if index >= sample:
            break
        found = format_of_row(row)
        if found:
            votes[found] += 1
    return votes.most_common(1)[0][0] if votes else None


def describe_keys(row: Any) -> str:
    if isinstance(row, dict):
        return ", ".join(f"'{key}'" for key in list(row)[:8]) or "none"
    return type(row).__name__


def _kind(value: Any) -> str:
    if value is None:
        return t("data.kind_null")
    names = {dict: "data.kind_object", list: "data.kind_list", str: "data.kind_text", bool: "data.kind_bool",
             int: "data.kind_number", float: "data.kind_number"}
    key = names.get(type(value))
    return t(key) if key else type(value).__name__


def _text(value: Any, what: str, allow_empty: bool = True) -> str:
    """``value`` as text; OpenAI content parts ``[{type: text, text: ...}]`` are joined."""
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        value = "".join(str(p.get("text", "")) for p in value)
    if not isinstance(value, str):
        raise RowError(t("data.not_text", what=what, kind=_kind(value)))
    if not allow_empty and not value.strip():
        raise RowError(t("data.empty_text", what=what))
    return value


def _maybe_json(value: Any) -> Any:
    """Lists and objects arrive as JSON text from CSV and some hub datasets."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value


TOOLS_EXAMPLE = ('[{"type": "function", "function": {"name": "get_weather", "description": "...", '
                 '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]')


def _shown(value: Any, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """A row's tool definitions: a list of objects (or one object), or that list as JSON text."""
    raw = value
    value = _maybe_json(value)
    if value in (None, "", []):
        return None
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list):
        for index, tool in enumerate(value):
            if not isinstance(tool, dict):
                raise RowError(t("data.bad_tools_item", index=index, kind=_kind(tool), value=_shown(tool),
                                 example=TOOLS_EXAMPLE))
        return value
    if isinstance(raw, str) and raw.strip()[:1] in ("[", "{"):
        raise RowError(t("data.bad_tools_json", example=TOOLS_EXAMPLE))
    raise RowError(t("data.bad_tools", kind=_kind(value), value=_shown(value), example=TOOLS_EXAMPLE))


def _arguments(value: Any) -> dict[str, Any] | str:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return value
        return parsed if isinstance(parsed, dict) else value
    if value is None:
        return {}
    raise RowError(t("data.bad_tool_call", problem=t("data.call_arguments_kind", kind=_kind(value))))


def _tool_call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, dict):
        raise RowError(t("data.bad_tool_call", problem=t("data.call_not_object", where=where, kind=_kind(raw))))
    function = raw.get("function", raw)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise RowError(t("data.bad_tool_call", problem=t("data.call_no_name", where=where)))
    return ToolCall(name=function["name"], arguments=_arguments(function.get("arguments")),
                    id=raw.get("id") if isinstance(raw.get("id"), str) else None)


def check_turn_order(messages: list[Message]) -> None:
    """Users and tools speak, the assistant answers; the conversation ends with an assistant answer."""
    if not messages:
        raise RowError(t("data.no_messages"))
    previous = None
    for index, message in enumerate(messages, start=1):
        role = message.role
        if role == "system":
            raise RowError(t("data.system_not_first", index=index))
        if previous is None and role != "user":
            raise RowError(t("data.first_not_user", index=index, role=role))
        if role == "user" and previous == "user":
            raise RowError(t("data.role_order", index=index, role=role, previous=previous))
        if role == "assistant" and previous == "assistant":
            raise RowError(t("data.role_order", index=index, role=role, previous=previous))
        if role == "tool" and previous not in ("assistant", "tool"):
            raise RowError(t("data.tool_without_call", index=index))
        if role == "assistant" and not message.content.strip() and not message.tool_calls:
            raise RowError(t("data.empty_assistant", index=index))
        if role in ("user", "tool") and not message.content.strip():
            raise RowError(t("data.empty_text", what=t("data.message_n", index=index, role=role)))
        previous = role
    if previous != "assistant":
        raise RowError(t("data.ends_without_answer", role=previous))


def _require(row: dict, key: str, fmt: str) -> Any:
    if key not in row or row[key] is None:
        raise RowError(t("data.missing_key", field=key, format=fmt, keys=describe_keys(row)))
    return row[key]


def normalise_alpaca(row: dict) -> Conversation:
    instruction = _text(_require(row, "instruction", "alpaca"), "'instruction'")
    extra = row.get("input")
    extra = _text(extra, "'input'") if extra is not None else ""
    output = _text(_require(row, "output", "alpaca"), "'output'")
    if not output.strip():
        raise RowError(t("data.empty_output"))
    system = row.get("system")
    system = _text(system, "'system'") if system not in (None, "") else None
    messages: list[Message] = []
    history = _maybe_json(row.get("history"))
    if history not in (None, "", []):
        if not isinstance(history, list):
            raise RowError(t("data.bad_history", problem=t("data.history_kind", kind=_kind(history))))
        for number, pair in enumerate(history, start=1):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise RowError(t("data.bad_history", problem=t("data.history_not_pair", number=number)))
            messages.append(Message("user", _text(pair[0], t("data.history_question", number=number))))
            messages.append(Message("assistant", _text(pair[1], t("data.history_answer", number=number))))
    prompt = f"{instruction}\n{extra}" if extra.strip() else instruction
    messages += [Message("user", prompt), Message("assistant", output)]
    check_turn_order(messages)
    return Conversation(messages=messages, system=system)


def normalise_sharegpt(row: dict) -> Conversation:
    turns = _maybe_json(_require(row, "conversations", "sharegpt"))
    if not isinstance(turns, list):
        raise RowError(t("data.not_a_list", field="conversations", kind=_kind(turns)))
    system = row.get("system")
    system = _text(system, "'system'") if system not in (None, "") else None
    messages: list[Message] = []
    for index, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict):
            raise RowError(t("data.turn_not_object", index=index, kind=_kind(turn)))
        tag = turn.get("from", turn.get("role"))
        value = turn.get("value", turn.get("content"))
        if tag is None:
            raise RowError(t("data.turn_missing", index=index, field="from"))
        role = SHAREGPT_ROLES.get(str(tag).lower())
        if role is None:
            allowed = "human, gpt, function_call, observation, system"
            raise RowError(t("data.unknown_role", index=index, role=tag, allowed=allowed))
        if value is None:
            raise RowError(t("data.turn_missing", index=index, field="value"))
        what = t("data.message_n", index=index, role=tag)
        if role == "system":
            if messages:
                raise RowError(t("data.system_not_first", index=index))
            system = _text(value, what)
            continue
        if role == "function_call":
            calls = _maybe_json(value)
            if isinstance(calls, dict):
                calls = [calls]
            if not isinstance(calls, list) or not calls:
                raise RowError(t("data.bad_tool_call", problem=t("data.call_not_json", where=what)))
            tool_calls = [_tool_call(call, what) for call in calls]
            messages.append(Message("assistant", "", tool_calls=tool_calls))
            continue
        messages.append(Message(role, _text(value, what)))
    check_turn_order(messages)
    return Conversation(messages=messages, system=system, tools=_tools(row.get("tools")))


def normalise_messages(row: dict) -> Conversation:
    items = _maybe_json(_require(row, "messages", "messages"))
    if not isinstance(items, list):
        raise RowError(t("data.not_a_list", field="messages", kind=_kind(items)))
    system: str | None = None
    messages: list[Message] = []
    for index, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise RowError(t("data.turn_not_object", index=index, kind=_kind(item)))
        role = item.get("role", item.get("from"))
        if role is None:
            raise RowError(t("data.turn_missing", index=index, field="role"))
        role = SHAREGPT_ROLES.get(str(role).lower(), str(role))
        if role not in ("system", "user", "assistant", "tool"):
            allowed = "system, user, assistant, tool"
            raise RowError(t("data.unknown_role", index=index, role=item.get("role"), allowed=allowed))
        what = t("data.message_n", index=index, role=role)
        content = item.get("content", item.get("value"))
        raw_calls = item.get("tool_calls") if role == "assistant" else None
        if content is None and raw_calls:
            content = ""
        if content is None:
            raise RowError(t("data.turn_missing", index=index, field="content"))
        text = _text(content, what)
        if role == "system":
            if messages or system is not None:
                raise RowError(t("data.system_not_first", index=index))
            system = text
            continue
        calls: list[ToolCall] = []
        if raw_calls:
            raw_calls = _maybe_json(raw_calls)
            if not isinstance(raw_calls, list):
                raise RowError(t("data.bad_tool_call", problem=t("data.calls_not_list", where=what, kind=_kind(raw_calls))))
            calls = [_tool_call(call, what) for call in raw_calls]
        name = item.get("name") if isinstance(item.get("name"), str) else None
        call_id = item.get("tool_call_id") if isinstance(item.get("tool_call_id"), str) else None
        messages.append(Message(role, text, tool_calls=calls, name=name, tool_call_id=call_id))
    check_turn_order(messages)
    return Conversation(messages=messages, system=system, tools=_tools(row.get("tools")))


def normalise_text(row: dict) -> TextRecord:
    text = _text(_require(row, "text", "text"), "'text'", allow_empty=False)
    return TextRecord(text=text)


NORMALISERS = {
    "alpaca": normalise_alpaca,
    "sharegpt": normalise_sharegpt,
    "messages": normalise_messages,
    "text": normalise_text,
}


def normalise_row(row: Any, fmt: str) -> Record:
    """The ``Record`` of ``row`` read as format ``fmt``; raises ``RowError`` saying what is wrong."""
    if not isinstance(row, dict):
        raise RowError(t("data.row_not_object", kind=_kind(row)))
    return NORMALISERS[fmt](row)
