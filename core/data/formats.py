"""Dataset formats: detecting which one a file uses and normalising each row into a ``Record``.

* ``alpaca``: ``instruction``, ``input``, ``output`` (+ optional ``system``, ``history`` [[q, a], ...]).
* ``sharegpt``: ``conversations`` of ``{from, value}`` with roles human/gpt/function_call/observation/
  system (+ optional ``system`` and ``tools``), the LLaMA-Factory convention; ``{role, content}`` items are
  accepted too.
* ``messages``: OpenAI chat, ``messages`` of ``{role, content}`` with system/user/assistant/tool roles and
  assistant ``tool_calls``.
  Also read here: TRL ``messages``; OpenAI's legacy assistant ``function_call`` and role ``function``;
  ms-swift's agent roles ``tool_call`` / ``tool_response``; Anthropic content blocks (``text``,
  ``tool_use``, ``tool_result``) with a top-level ``system``; LLaMA-Factory v1 content parts
  ``{type: text, value}``. Per-turn loss switches on assistant turns are honoured: OpenAI ``weight``
  (0 or 1), ms-swift ``loss`` (true/false), LLaMA-Factory v1 ``loss_weight``.
* ``conversation``: ms-swift's ``conversation`` of ``{human, assistant}`` pairs (+ optional ``system``).
* ``query_response``: ms-swift's ``query``, ``response`` (+ optional ``system``, ``history`` [[q, a], ...]).
* ``prompt_completion``: TRL's ``prompt`` + ``completion``: plain strings (the completion is trained on
  after the prompt as plain text) or lists of messages (a conversation; only the completion is trained).
* ``text``: plain ``text`` for continued pre-training (also ``.txt`` files).

Data that is not supervised fine-tuning data is recognised and refused, never trained on as if it were:
``preference`` (``chosen`` / ``rejected``, ms-swift ``rejected_response``), ``kto`` (a boolean ``label``
or LLaMA-Factory's ``kto_tag`` on each answer) and multimodal rows (``images`` / ``videos`` / ``audios``
columns, ``<image>`` tokens, image or audio content parts); see ``refusal_of_row``.

A row that does not fit raises ``RowError`` whose message says what is wrong; the reader adds where.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from core import i18n
from core.data.records import Conversation, Message, Record, TextRecord, ToolCall
from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import t

FORMATS = ("alpaca", "sharegpt", "messages", "conversation", "query_response", "prompt_completion", "text")
# Recognised but refused: what they are is said at their first row (see ``refusal_of_row``).
REFUSED_FORMATS = ("preference", "kto")
SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant",
    "function_call": "function_call", "tool_call": "function_call",
    "observation": "tool", "tool": "tool", "function": "tool", "tool_response": "tool",
    "system": "system",
}
MEDIA_COLUMNS = {"images": "images", "image": "images", "videos": "videos", "video": "videos",
                 "audios": "audios", "audio": "audios"}
MEDIA_TOKENS = {"<image>": "images", "<video>": "videos", "<audio>": "audios"}
MEDIA_PART_TYPES = {"image": "images", "image_url": "images", "input_image": "images", "video": "videos",
                    "video_url": "videos", "audio": "audios", "audio_url": "audios", "input_audio": "audios"}
CONVERSATION_KEYS = ("messages", "conversations", "conversation", "completion", "output", "response", "prompt")


class RowError(TunedeckError, ValueError):
    """A row that does not fit its format; the message is for the user."""

    exit_code = EXIT_USAGE


def format_of_row(row: Any) -> str | None:
    """The format a single row looks like, or ``None`` (refused kinds included: ``preference``, ``kto``)."""
    if not isinstance(row, dict):
        return None
    if ("chosen" in row and "rejected" in row) or "rejected_response" in row:
        return "preference"
    if "kto_tag" in row or (isinstance(row.get("label"), bool) and any(k in row for k in CONVERSATION_KEYS)):
        return "kto"
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        return "sharegpt"
    if "conversation" in row:
        return "conversation"
    if "instruction" in row or ("output" in row and "input" in row):
        return "alpaca"
    if "query" in row and "response" in row:
        return "query_response"
    if "prompt" in row and "completion" in row:
        return "prompt_completion"
    if "text" in row:
        return "text"
    return None


def _media_in(value: Any, depth: int = 0) -> str | None:
    """``images`` / ``videos`` / ``audios`` when ``value`` holds a media token or content part."""
    if depth > 8:
        return None
    if isinstance(value, str):
        return next((kind for token, kind in MEDIA_TOKENS.items() if token in value), None)
    if isinstance(value, dict):
        part = value.get("type")
        if isinstance(part, str) and part in MEDIA_PART_TYPES:
            return MEDIA_PART_TYPES[part]
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            found = _media_in(item, depth + 1)
            if found:
                return found
    return None


def refusal_of_row(row: Any) -> str | None:
    """Why a row is not SFT text data tunedeck can train: ``preference``, ``kto``, ``images``,
    ``videos``, ``audios``, or ``None`` when it is (or may be) trainable."""
    if not isinstance(row, dict):
        return None
    kind = format_of_row(row)
    if kind in REFUSED_FORMATS:
        return kind
    for column, media in MEDIA_COLUMNS.items():
        if row.get(column) not in (None, "", [], {}):
            return media
    for key in ("messages", "conversations", "conversation", "instruction", "input", "query", "prompt",
                "completion", "system", "text"):
        if key in row:
            found = _media_in(row[key])
            if found:
                return found
    return None


def refusal_message(kind: str, count: int) -> i18n.Message:
    """What a refused kind of data is and what to do, for ``count`` rows (the first one is located)."""
    if kind == "preference":
        return i18n.Message("data.refuse_preference", count=count)
    if kind == "kto":
        return i18n.Message("data.refuse_kto", count=count)
    return i18n.Message("data.refuse_multimodal", media=i18n.Message("data.media_" + kind), count=count)


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
    """``value`` as text; content parts ``[{type: text, text: ...}]`` (OpenAI, Anthropic) and
    ``[{type: text, value: ...}]`` (LLaMA-Factory v1) are joined."""
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        value = "".join(str(p.get("text", p.get("value", ""))) for p in value)
    if not isinstance(value, str):
        raise RowError(i18n.Message("data.not_text", what=what, kind=_kind(value)))
    if not allow_empty and not value.strip():
        raise RowError(i18n.Message("data.empty_text", what=what))
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
                raise RowError(i18n.Message("data.bad_tools_item", index=index, kind=_kind(tool), value=_shown(tool),
                                 example=TOOLS_EXAMPLE))
        return value
    if isinstance(raw, str) and raw.strip()[:1] in ("[", "{"):
        raise RowError(i18n.Message("data.bad_tools_json", example=TOOLS_EXAMPLE))
    raise RowError(i18n.Message("data.bad_tools", kind=_kind(value), value=_shown(value), example=TOOLS_EXAMPLE))


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
    raise RowError(i18n.Message("data.bad_tool_call", problem=i18n.Message("data.call_arguments_kind", kind=_kind(value))))


def _tool_call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, dict):
        raise RowError(i18n.Message("data.bad_tool_call", problem=i18n.Message("data.call_not_object", where=where, kind=_kind(raw))))
    function = raw.get("function", raw)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise RowError(i18n.Message("data.bad_tool_call", problem=i18n.Message("data.call_no_name", where=where)))
    return ToolCall(name=function["name"], arguments=_arguments(function.get("arguments")),
                    id=raw.get("id") if isinstance(raw.get("id"), str) else None)


def check_turn_order(messages: list[Message]) -> None:
    """Users and tools speak, the assistant answers; the conversation ends with an assistant answer."""
    if not messages:
        raise RowError(i18n.Message("data.no_messages"))
    previous = None
    for index, message in enumerate(messages, start=1):
        role = message.role
        if role == "system":
            raise RowError(i18n.Message("data.system_not_first", index=index))
        if previous is None and role != "user":
            raise RowError(i18n.Message("data.first_not_user", index=index, role=role))
        if role == "user" and previous == "user":
            raise RowError(i18n.Message("data.role_order", index=index, role=role, previous=previous))
        if role == "assistant" and previous == "assistant":
            raise RowError(i18n.Message("data.role_order", index=index, role=role, previous=previous))
        if role == "tool" and previous not in ("assistant", "tool"):
            raise RowError(i18n.Message("data.tool_without_call", index=index))
        if role == "assistant" and not message.content.strip() and not message.tool_calls:
            raise RowError(i18n.Message("data.empty_assistant", index=index))
        if role in ("user", "tool") and not message.content.strip():
            raise RowError(i18n.Message("data.empty_text", what=i18n.Message("data.message_n", index=index, role=role)))
        previous = role
    if previous != "assistant":
        raise RowError(i18n.Message("data.ends_without_answer", role=previous))


def _require(row: dict, key: str, fmt: str) -> Any:
    if key not in row:
        raise RowError(i18n.Message("data.missing_key", field=key, format=fmt, keys=describe_keys(row)))
    if row[key] is None:  # the key is there (a "missing key" message listed it among the row's keys): null
        raise RowError(i18n.Message("data.null_key", field=key, format=fmt))
    return row[key]


def normalise_alpaca(row: dict) -> Conversation:
    instruction = _text(_require(row, "instruction", "alpaca"), "'instruction'")
    extra = row.get("input")
    extra = _text(extra, "'input'") if extra is not None else ""
    output = _text(_require(row, "output", "alpaca"), "'output'")
    if not output.strip():
        raise RowError(i18n.Message("data.empty_output"))
    system = row.get("system")
    system = _text(system, "'system'") if system not in (None, "") else None
    messages: list[Message] = []
    history = _maybe_json(row.get("history"))
    if history not in (None, "", []):
        if not isinstance(history, list):
            raise RowError(i18n.Message("data.bad_history", problem=i18n.Message("data.history_kind", kind=_kind(history))))
        for number, pair in enumerate(history, start=1):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise RowError(i18n.Message("data.bad_history", problem=i18n.Message("data.history_not_pair", number=number)))
            messages.append(Message("user", _text(pair[0], t("data.history_question", number=number))))
            messages.append(Message("assistant", _text(pair[1], t("data.history_answer", number=number))))
    # instruction and input joined as LLaMA-Factory joins them: the ones that are there, a newline between; an
    # empty instruction does not start the prompt with a newline, and a prompt with neither is said by its keys
    prompt = "\n".join(part for part in (instruction, extra) if part.strip())
    if not prompt:
        raise RowError(i18n.Message("data.empty_prompt"))
    messages += [Message("user", prompt), Message("assistant", output)]
    check_turn_order(messages)
    return Conversation(messages=messages, system=system)


def normalise_sharegpt(row: dict) -> Conversation:
    turns = _maybe_json(_require(row, "conversations", "sharegpt"))
    if not isinstance(turns, list):
        raise RowError(i18n.Message("data.not_a_list", field="conversations", kind=_kind(turns)))
    system = row.get("system")
    system = _text(system, "'system'") if system not in (None, "") else None
    messages: list[Message] = []
    for index, turn in enumerate(turns, start=1):
        if not isinstance(turn, dict):
            raise RowError(i18n.Message("data.turn_not_object", index=index, kind=_kind(turn)))
        tag = turn.get("from", turn.get("role"))
        value = turn.get("value", turn.get("content"))
        if tag is None:
            raise RowError(i18n.Message("data.turn_missing", index=index, field="from"))
        role = SHAREGPT_ROLES.get(str(tag).lower())
        if role is None:
            allowed = "human, gpt, function_call, observation, system"
            raise RowError(i18n.Message("data.unknown_role", index=index, role=tag, allowed=allowed))
        if value is None:
            raise RowError(i18n.Message("data.turn_missing", index=index, field="value"))
        what = t("data.message_n", index=index, role=tag)
        if role == "system":
            if messages:
                raise RowError(i18n.Message("data.system_not_first", index=index))
            system = _text(value, what)
            continue
        if role == "function_call":
            calls = _maybe_json(value)
            if isinstance(calls, dict):
                calls = [calls]
            if not isinstance(calls, list) or not calls:
                raise RowError(i18n.Message("data.bad_tool_call", problem=i18n.Message("data.call_not_json", where=what)))
            tool_calls = [_tool_call(call, what) for call in calls]
            messages.append(Message("assistant", "", tool_calls=tool_calls))
            continue
        messages.append(Message(role, _text(value, what)))
    check_turn_order(messages)
    return Conversation(messages=messages, system=system, tools=_tools(row.get("tools")))


def _trainable(item: dict, role: str, what: str) -> bool | None:
    """A turn's own loss switch: OpenAI ``weight`` (0/1), ms-swift ``loss`` (bool), LLaMA-Factory v1
    ``loss_weight`` (a number); ``None`` when it has none. Only assistant turns can be trained."""
    value: bool | None = None
    if item.get("weight") is not None:
        weight = item["weight"]
        if isinstance(weight, bool) or weight not in (0, 1):
            raise RowError(i18n.Message("data.bad_weight", what=what, value=_shown(weight)))
        value = weight == 1
    for key in ("loss", "loss_weight"):
        if item.get(key) is None:
            continue
        raw = item[key]
        if key == "loss" and not isinstance(raw, bool):
            raise RowError(i18n.Message("data.bad_loss", what=what, key=key, value=_shown(raw)))
        if key == "loss_weight" and (isinstance(raw, bool) or not isinstance(raw, (int, float))):
            raise RowError(i18n.Message("data.bad_loss", what=what, key=key, value=_shown(raw)))
        value = bool(raw > 0) if key == "loss_weight" else raw
    if value and role != "assistant":
        raise RowError(i18n.Message("data.loss_not_assistant", what=what))
    return value if role == "assistant" else None


def _anthropic_tools(tools: Any) -> Any:
    """Anthropic tool definitions (``name``, ``input_schema``) as OpenAI function tools."""
    if isinstance(tools, list) and tools and all(isinstance(x, dict) and "input_schema" in x for x in tools):
        return [{"type": "function", "function": {"name": x.get("name"), "description": x.get("description", ""),
                                                  "parameters": x["input_schema"]}} for x in tools]
    return tools


def _row_tools(row: dict) -> list[dict[str, Any]] | None:
    tools = _maybe_json(row.get("tools"))
    if tools in (None, "", []) and row.get("functions") not in (None, "", []):  # OpenAI's legacy name
        functions = _maybe_json(row["functions"])
        tools = [{"type": "function", "function": f} for f in functions] if isinstance(functions, list) else functions
    return _tools(_anthropic_tools(tools))


def _content_blocks(content: list, role: str, what: str) -> tuple[str, list[ToolCall], list[tuple[str, str | None]]]:
    """Anthropic-style content blocks: (text, tool calls from ``tool_use``, results of ``tool_result``)."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[tuple[str, str | None]] = []
    for number, block in enumerate(content, start=1):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text(block.get("text", block.get("value")), what))
        elif kind == "tool_use" and role == "assistant":
            name = block.get("name")
            if not isinstance(name, str) or not name:
                raise RowError(i18n.Message("data.bad_tool_call", problem=i18n.Message("data.call_no_name", where=what)))
            calls.append(ToolCall(name=name, arguments=_arguments(block.get("input")),
                                  id=block.get("id") if isinstance(block.get("id"), str) else None))
        elif kind == "tool_result":
            inner = block.get("content", "")
            inner = _text(inner, what) if isinstance(inner, (str, list)) else json.dumps(inner, ensure_ascii=False)
            results.append((inner, block.get("tool_use_id") if isinstance(block.get("tool_use_id"), str) else None))
        else:
            raise RowError(i18n.Message("data.bad_content_part", what=what, number=number,
                             kind=_shown(kind) if kind is not None else _kind(block)))
    return "".join(texts), calls, results


def normalise_messages(row: dict) -> Conversation:
    items = _maybe_json(_require(row, "messages", "messages"))
    if not isinstance(items, list):
        raise RowError(i18n.Message("data.not_a_list", field="messages", kind=_kind(items)))
    system: str | None = None
    if row.get("system") not in (None, ""):  # Anthropic keeps the system prompt beside the messages
        system = _text(row["system"], "'system'")
    messages: list[Message] = []
    names: dict[str, str] = {}  # tool call id -> tool name, for results that give only the id
    for index, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise RowError(i18n.Message("data.turn_not_object", index=index, kind=_kind(item)))
        raw_role = item.get("role", item.get("from"))
        if raw_role is None:
            raise RowError(i18n.Message("data.turn_missing", index=index, field="role"))
        role = SHAREGPT_ROLES.get(str(raw_role).lower(), str(raw_role))
        if role not in ("system", "user", "assistant", "tool", "function_call"):
            allowed = "system, user, assistant, tool (function, tool_call, tool_response)"
            raise RowError(i18n.Message("data.unknown_role", index=index, role=raw_role, allowed=allowed))
        what = t("data.message_n", index=index, role=raw_role)
        if role == "function_call":  # ms-swift: the call's JSON as the content of its own turn
            calls = _maybe_json(item.get("content", item.get("value")))
            calls = [calls] if isinstance(calls, dict) else calls
            if not isinstance(calls, list) or not calls:
                raise RowError(i18n.Message("data.bad_tool_call", problem=i18n.Message("data.call_not_json", where=what)))
            tool_calls = [_tool_call(call, what) for call in calls]
            trainable = _trainable(item, "assistant", what)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # parallel calls, or text then a call
                last.tool_calls += tool_calls
                last.trainable = last.trainable if trainable is None else trainable
            else:
                messages.append(Message("assistant", "", tool_calls=tool_calls, trainable=trainable))
            continue
        content = item.get("content", item.get("value"))
        raw_calls = item.get("tool_calls") if role == "assistant" else None
        legacy_call = item.get("function_call") if role == "assistant" else None
        if content is None and (raw_calls or legacy_call):
            content = ""
        if content is None:
            raise RowError(i18n.Message("data.turn_missing", index=index, field="content"))
        calls: list[ToolCall] = []
        results: list[tuple[str, str | None]] = []
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result")
                                             for b in content):
            text, calls, results = _content_blocks(content, role, what)
        elif isinstance(content, list) and content and all(isinstance(b, dict) for b in content) and \
                not all(b.get("type") == "text" for b in content):
            bad = next(n for n, b in enumerate(content, start=1) if b.get("type") != "text")
            raise RowError(i18n.Message("data.bad_content_part", what=what, number=bad, kind=_shown(content[bad - 1].get("type"))))
        else:
            text = _text(content, what)
        if role == "system":
            if messages or system is not None:
                raise RowError(i18n.Message("data.system_not_first", index=index))
            system = text
            continue
        if raw_calls:
            raw_calls = _maybe_json(raw_calls)
            if not isinstance(raw_calls, list):
                raise RowError(i18n.Message("data.bad_tool_call", problem=i18n.Message("data.calls_not_list", where=what, kind=_kind(raw_calls))))
            calls += [_tool_call(call, what) for call in raw_calls]
        if legacy_call:
            calls.append(_tool_call(_maybe_json(legacy_call), what))
        for call in calls:
            if call.id:
                names[call.id] = call.name
        if results:  # Anthropic: tool results arrive inside a user turn, text after them is the user's
            for output, call_id in results:
                messages.append(Message("tool", output, name=names.get(call_id or ""), tool_call_id=call_id))
            if text.strip():
                messages.append(Message("user", text))
            continue
        name = item.get("name") if isinstance(item.get("name"), str) else None
        call_id = item.get("tool_call_id") if isinstance(item.get("tool_call_id"), str) else None
        messages.append(Message(role, text, tool_calls=calls, name=name, tool_call_id=call_id,
                                trainable=_trainable(item, role, what)))
    check_turn_order(messages)
    return Conversation(messages=messages, system=system, tools=_row_tools(row))


def normalise_conversation(row: dict) -> Conversation:
    """ms-swift's ``conversation: [{human, assistant}, ...]`` (+ ``system``)."""
    pairs = _maybe_json(_require(row, "conversation", "conversation"))
    if not isinstance(pairs, list):
        raise RowError(i18n.Message("data.not_a_list", field="conversation", kind=_kind(pairs)))
    system = row.get("system")
    system = _text(system, "'system'") if system not in (None, "") else None
    messages: list[Message] = []
    for index, pair in enumerate(pairs, start=1):
        if not isinstance(pair, dict):
            raise RowError(i18n.Message("data.turn_not_object", index=index, kind=_kind(pair)))
        for key, role in (("human", "user"), ("assistant", "assistant")):
            if pair.get(key) is None:
                raise RowError(i18n.Message("data.turn_missing", index=index, field=key))
            messages.append(Message(role, _text(pair[key], t("data.message_n", index=index, role=key))))
    check_turn_order(messages)
    return Conversation(messages=messages, system=system, tools=_row_tools(row))


def normalise_query_response(row: dict) -> Conversation:
    """ms-swift's ``query`` / ``response`` / ``history`` (+ ``system``): alpaca under other names."""
    mapped = {"instruction": _require(row, "query", "query_response"),
              "output": _require(row, "response", "query_response"),
              "system": row.get("system"), "history": row.get("history")}
    conversation = normalise_alpaca(mapped)
    conversation.tools = _row_tools(row)
    return conversation


def _message_list(value: Any, field_name: str) -> list[dict] | None:
    value = _maybe_json(value)
    if isinstance(value, list):
        if not all(isinstance(item, dict) for item in value):
            raise RowError(i18n.Message("data.not_a_list", field=field_name, kind=_kind(value)))
        return value
    return None


def normalise_prompt_completion(row: dict) -> Record:
    """TRL's ``prompt`` + ``completion``: plain text (the completion is trained after the prompt, no chat
    template), or lists of messages (a conversation whose completion turns alone are trained)."""
    prompt = _require(row, "prompt", "prompt_completion")
    completion = _require(row, "completion", "prompt_completion")
    if isinstance(prompt, str) and isinstance(completion, str):
        if not completion.strip():
            raise RowError(i18n.Message("data.empty_text", what="'completion'"))
        return TextRecord(text=completion, prompt=prompt)
    prompt_items = _message_list(prompt, "prompt")
    completion_items = _message_list(completion, "completion")
    if prompt_items is None or completion_items is None:
        raise RowError(i18n.Message("data.prompt_completion_mixed", prompt=_kind(prompt), completion=_kind(completion)))
    before = normalise_messages({"messages": prompt_items + [{"role": "assistant", "content": "-"}],
                                 "tools": row.get("tools")})
    before.messages.pop()  # the placeholder that let the prompt pass the turn-order check
    for message in before.messages:
        if message.role == "assistant":
            message.trainable = False  # earlier answers in a TRL prompt are context, not targets
    whole = normalise_messages({"messages": prompt_items + completion_items, "tools": row.get("tools")})
    for message, earlier in zip(whole.messages, before.messages, strict=False):
        message.trainable = earlier.trainable
    return whole


def normalise_text(row: dict) -> TextRecord:
    text = _text(_require(row, "text", "text"), "'text'", allow_empty=False)
    return TextRecord(text=text)


def _refused(kind: str) -> Callable[[dict], Record]:
    def refuse(row: dict) -> Record:
        raise RowError(refusal_message(kind, 1))

    return refuse


NORMALISERS: dict[str, Callable[[dict], Record]] = {
    "alpaca": normalise_alpaca,
    "sharegpt": normalise_sharegpt,
    "messages": normalise_messages,
    "conversation": normalise_conversation,
    "query_response": normalise_query_response,
    "prompt_completion": normalise_prompt_completion,
    "text": normalise_text,
    "preference": _refused("preference"),
    "kto": _refused("kto"),
}


def not_an_object(row: Any) -> i18n.Message | None:
    """What is wrong with a row that is no JSON object (a list, a string, ...); None for an object."""
    return None if isinstance(row, dict) else i18n.Message("data.row_not_object", kind=_kind(row))


def normalise_row(row: Any, fmt: str) -> Record:
    """The ``Record`` of ``row`` read as format ``fmt``; raises ``RowError`` saying what is wrong."""
    problem = not_an_object(row)
    if problem is not None:
        raise RowError(problem)
    return NORMALISERS[fmt](row)
