"""The one shape every dataset format is normalised into: a ``Conversation`` or a ``TextRecord``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class ToolCall:
    """A call the assistant makes; ``arguments`` is a dict when it was valid JSON, else the raw text."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        call: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id:
            call["id"] = self.id
        return call


@dataclass
class Message:
    role: str  # one of ROLES
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    name: str | None = None  # a tool's name on a tool message, when given
    tool_call_id: str | None = None
    # Whether this assistant turn is trained on: None = the default (yes); False = the data excluded it
    # (OpenAI ``weight: 0``, ms-swift ``loss: false``, a TRL prompt's own answers).
    trainable: bool | None = None

    @property
    def trained(self) -> bool:
        return self.role == "assistant" and self.trainable is not False

    def call_texts(self) -> list[str]:
        """The JSON of this message's tool calls, as ``Conversation.approx_text`` counts them (an answer that
        calls a tool trains on the call)."""
        return [json.dumps(call.to_openai(), ensure_ascii=False) for call in self.tool_calls]


@dataclass
class Conversation:
    """A chat: optional system prompt and tools, then user/assistant(/tool) messages (no system in them)."""

    messages: list[Message]
    system: str | None = None
    tools: list[dict[str, Any]] | None = None
    origin: str | None = None  # "file:line" it came from, for messages about it

    def to_chat_messages(self) -> list[dict[str, Any]]:
        """The OpenAI-style list that ``tokenizer.apply_chat_template`` takes (system first)."""
        out: list[dict[str, Any]] = []
        if self.system is not None:
            out.append({"role": "system", "content": self.system})
        for message in self.messages:
            item: dict[str, Any] = {"role": message.role, "content": message.content}
            if message.tool_calls:
                item["tool_calls"] = [call.to_openai() for call in message.tool_calls]
            if message.name:
                item["name"] = message.name
            if message.tool_call_id:
                item["tool_call_id"] = message.tool_call_id
            out.append(item)
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messages": self.to_chat_messages()}
        if self.tools:
            out["tools"] = self.tools
        return out

    def approx_text(self) -> str:
        """A plain rendering for length estimates when no tokenizer is at hand."""
        parts = [self.system or ""]
        if self.tools:
            parts.append(json.dumps(self.tools, ensure_ascii=False))
        for message in self.messages:
            parts += [f"{message.role}: {message.content}", *message.call_texts()]
        return "\n".join(p for p in parts if p)


@dataclass
class TextRecord:
    """Plain text: every token of ``text`` is trained on (continued pre-training).

    ``prompt`` (TRL's plain prompt/completion rows) comes before ``text`` and is context only: its
    tokens carry no loss, and no chat template is applied.
    """

    text: str
    origin: str | None = None
    prompt: str = ""

    def approx_text(self) -> str:
        return self.prompt + self.text


Record = Conversation | TextRecord
