"""Turning records into ``input_ids`` and ``labels`` for causal-LM training.

Conversations are rendered with the tokenizer's chat template. With ``loss_on="assistant"`` only the
assistant's tokens (its answer and its end-of-turn token) carry a label; everything else is -100.
Two ways to find them:

* ``generation``: templates that wrap assistant turns in ``{% generation %}`` give the mask directly
  (``return_assistant_tokens_mask``); the bundled tiny model's template does.
* ``prefix``: for other templates, each assistant turn is the text between the rendering of the
  conversation before it (with the generation prompt) and the rendering including it; tokens whose
  characters fall in such a span are labelled. When a template rewrites earlier turns (so a prefix is
  not a prefix), the answer's text is searched for instead.

An assistant turn the data excludes (``Message.trainable is False``: OpenAI ``weight: 0``, ms-swift
``loss: false``, the answers inside a TRL prompt) carries no label with either method.

Text records train on every token, with the end-of-sequence token appended; a text record's ``prompt``
(TRL's plain prompt/completion) comes first and carries no label. Sequences longer than
``max_seq_len`` are cut at the end (or, with ``overlong="drop"``, left out whole: ms-swift's
``truncation_strategy: delete``); how many and how many tokens were dropped is counted in ``Tokenized``,
and a sample left with no label at all is dropped and counted too: never silent.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.data.records import Conversation, Record, TextRecord

IGNORE_INDEX = -100


@dataclass
class Tokenized:
    """Token ids and labels of a dataset, and what truncation did to it."""

    input_ids: list[list[int]] = field(default_factory=list)
    labels: list[list[int]] = field(default_factory=list)
    truncated: int = 0  # samples cut to max_seq_len
    tokens_dropped: int = 0  # tokens removed by those cuts
    skipped: int = 0  # samples dropped because no labelled token was left
    overlong_dropped: int = 0  # samples longer than max_seq_len left out (overlong: drop)
    cut_no_answer: int = 0  # of ``skipped``, the samples the cut to max_seq_len left without their answer
    cut_no_answer_origins: list[str] = field(default_factory=list)  # where the first few came from
    skipped_origins: list[str] = field(default_factory=list)  # where the first few skipped ones came from
    # where the first few skipped ones the data itself gave nothing to train on came from (every assistant turn
    # excluded: weight 0), the skipped ones not cut_no_answer
    untrained_origins: list[str] = field(default_factory=list)
    method: str = ""  # how assistant tokens were found: generation, prefix, all
    chat_template_added: bool = False  # the tokenizer had no chat template; the bundled ChatML one was used

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> list[int]:
        return [len(ids) for ids in self.input_ids]

    @property
    def trained_tokens(self) -> int:
        return sum(1 for labels in self.labels for label in labels if label != IGNORE_INDEX)

    def summary(self) -> dict[str, Any]:
        return {"samples": len(self), "truncated": self.truncated, "tokens_dropped": self.tokens_dropped,
                "skipped": self.skipped, "cut_no_answer": self.cut_no_answer,
                "overlong_dropped": self.overlong_dropped, "trained_tokens": self.trained_tokens, "method": self.method,
                "chat_template_added": self.chat_template_added}


def bundled_chat_template() -> str:
    """The ChatML template of the bundled tiny model (used for tokenizers that have none)."""
    import json

    from core.assets import tiny_model_dir

    config = json.loads((tiny_model_dir() / "tokenizer_config.json").read_text(encoding="utf-8"))
    return config["chat_template"]


def ensure_chat_template(tokenizer: Any) -> bool:
    """Give a tokenizer without a chat template (a base model's) the bundled ChatML one.

    Returns True when it had to; the engine should say so in the run log, since the model then learns a
    conversation format of tunedeck's choosing.
    """
    if getattr(tokenizer, "chat_template", None):
        return False
    tokenizer.chat_template = bundled_chat_template()
    return True


def supports_generation_mask(tokenizer: Any) -> bool:
    """Whether the chat template marks assistant turns with ``{% generation %}``."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return isinstance(template, str) and "generation" in template and "endgeneration" in template


def template_kwargs(thinking: bool | None) -> dict[str, Any]:
    """The variables a run gives its chat template besides the messages: ``enable_thinking`` when the run's
    ``thinking`` is set (Qwen3's hybrid templates read it: false renders an empty think block before each
    answer), none when it is unset (the template's own default)."""
    return {} if thinking is None else {"enable_thinking": bool(thinking)}


def template_variables(tokenizer: Any) -> set[str] | None:
    """The variables the tokenizer's chat template reads from outside (``messages``, ``enable_thinking`` ...),
    or None when it has no template or jinja cannot parse it."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template:
        return None
    from jinja2 import Environment, TemplateSyntaxError, meta
    from jinja2.ext import loopcontrols

    environment = Environment(extensions=[loopcontrols])
    try:
        # transformers' {% generation %} extension is a block tag; plain jinja does not know it
        parsed = environment.parse(re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template))
    except TemplateSyntaxError:
        return None
    return set(meta.find_undeclared_variables(parsed))


def template_ignores(tokenizer: Any, kwargs: dict[str, Any]) -> list[str]:
    """The names of ``kwargs`` the tokenizer's chat template never reads (it renders the same with or without
    them); [] when it reads them all or cannot be read (then nothing is claimed)."""
    variables = template_variables(tokenizer)
    if variables is None:
        return []
    return [name for name in kwargs if name not in variables]


def _render(tokenizer: Any, messages: list[dict], tools: Any, add_generation_prompt: bool,
            kwargs: dict[str, Any] | None = None) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **(kwargs or {})
    )


def assistant_spans(tokenizer: Any, conversation: Conversation,
                    kwargs: dict[str, Any] | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of its assistant turns (prefix-diff method);
    ``kwargs``: the run's template variables (``template_kwargs``)."""
    messages = conversation.to_chat_messages()
    tools = conversation.tools
    trained = iter([m.trained for m in conversation.messages if m.role == "assistant"])
    full = _render(tokenizer, messages, tools, False, kwargs)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        keep = next(trained, True)
        before = _render(tokenizer, messages[:index], tools, True, kwargs)
        through = _render(tokenizer, messages[: index + 1], tools, False, kwargs)
        if full.startswith(through) and through.startswith(before) and len(before) >= cursor:
            start, end = len(before), len(through)
            # Whitespace after the end-of-turn token is layout, not something to learn.
            while end > start and through[end - 1] in " \n":
                end -= 1
        else:
            span = _search_span(full, cursor, message.get("content") or "",
                                through[len(before):] if through.startswith(before) else "")
            if span is None:
                continue
            start, end = span
        if keep:
            spans.append((start, end))
        cursor = end
    return full, spans


def _search_span(full: str, cursor: int, content: str, rendered_turn: str) -> tuple[int, int] | None:
    """Where an answer sits in ``full`` when prefixes render differently: find its text, then extend
    the span over what the template writes after it (e.g. the end-of-turn token) as far as it matches."""
    anchor = content or rendered_turn[:32]
    if not anchor.strip():
        return None
    found = full.find(anchor, cursor)
    if found < 0:
        return None
    start, end = found, found + len(anchor)
    offset = rendered_turn.find(anchor) if rendered_turn else -1
    begin = found - offset
    if offset >= 0 and begin >= cursor and full[begin:found] == rendered_turn[:offset]:
        start = begin
        length = 0
        limit = min(len(rendered_turn), len(full) - begin)
        while length < limit and full[begin + length] == rendered_turn[length]:
            length += 1
        end = max(end, begin + length)
    while end > start and full[end - 1] in " \n":
        end -= 1
    return start, end


def _encode_with_spans(tokenizer: Any, text: str, spans: list[tuple[int, int]]) -> tuple[list[int], list[bool]]:
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoding["input_ids"])
    mask = []
    for begin, end in encoding["offset_mapping"]:
        mask.append(any(begin < span_end and end > span_start for span_start, span_end in spans)
                    if end > begin else False)
    return ids, mask


def _runs(mask: list[bool]) -> list[tuple[int, int]]:
    """The ``[start, end)`` stretches of True in a mask."""
    runs, start = [], None
    for index, keep in enumerate([*mask, False]):
        if keep and start is None:
            start = index
        elif not keep and start is not None:
            runs.append((start, index))
            start = None
    return runs


# transformers compiles each chat template once per process (an lru_cache) and its ``{% generation %}`` tracker
# keeps the marks of the rendering under way on the compiled template: two threads rendering with the mask at once
# (the wizard's dataset summaries, a check beside them) mixed their marks (a few targets more or less) or failed
# ("AssistantTracker should not be reused before closed"). One rendering with the mask at a time.
_GENERATION_MASK = threading.Lock()


def _conversation_tokens(tokenizer: Any, conversation: Conversation, method: str,
                         kwargs: dict[str, Any] | None = None) -> tuple[list[int], list[bool]]:
    if method == "generation":
        with _GENERATION_MASK:
            out = tokenizer.apply_chat_template(
                conversation.to_chat_messages(), tools=conversation.tools, tokenize=True, return_dict=True,
                return_assistant_tokens_mask=True, **(kwargs or {}),
            )
        ids, mask = list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
        trained = [m.trained for m in conversation.messages if m.role == "assistant"]
        if all(trained):
            return ids, mask
        runs = _runs(mask)
        if len(runs) == len(trained):  # one marked stretch per assistant turn: drop the excluded ones
            for (start, end), keep in zip(runs, trained, strict=True):
                if not keep:
                    mask[start:end] = [False] * (end - start)
            return ids, mask
        # The template's marks do not line up with the turns: find them by rendering prefixes instead.
    text, spans = assistant_spans(tokenizer, conversation, kwargs)
    return _encode_with_spans(tokenizer, text, spans)


def _text_tokens(tokenizer: Any, record: TextRecord) -> list[int]:
    return _text_ids(tokenizer, record)[0]


def _text_ids(tokenizer: Any, record: TextRecord) -> tuple[list[int], int]:
    """The ids of a text record and how many of them (the prompt's) carry no label."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if record.prompt:
        prompt = list(tokenizer(record.prompt, add_special_tokens=True)["input_ids"])
        ids = prompt + list(tokenizer(record.text, add_special_tokens=False)["input_ids"])
    else:
        prompt = []
        ids = list(tokenizer(record.text, add_special_tokens=True)["input_ids"])
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids, len(prompt)


def tokenize_record(
    record: Record, tokenizer: Any, loss_on: str = "assistant", method: str | None = None,
    kwargs: dict[str, Any] | None = None,
) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of one record, untruncated; ``kwargs``: the run's template variables."""
    if isinstance(record, TextRecord):
        ids, untrained = _text_ids(tokenizer, record)
        if loss_on == "all":
            return ids, list(ids)
        return ids, [IGNORE_INDEX] * untrained + ids[untrained:]
    if method is None:
        method = "generation" if supports_generation_mask(tokenizer) else "prefix"
    ids, mask = _conversation_tokens(tokenizer, record, method, kwargs)
    if loss_on == "all":
        return ids, list(ids)
    return ids, [token if keep else IGNORE_INDEX for token, keep in zip(ids, mask, strict=True)]


def tokenize_dataset(
    records: Sequence[Record],
    tokenizer: Any,
    max_seq_len: int | None,
    loss_on: str = "assistant",
    method: str | None = None,
    overlong: str = "cut",
    kwargs: dict[str, Any] | None = None,
) -> Tokenized:
    """Token ids and labels for every record, cut to ``max_seq_len`` (``None``: no limit); with
    ``overlong="drop"`` a record longer than that is left out instead (``overlong_dropped``).

    ``loss_on``: ``assistant`` (labels only on assistant turns) or ``all``. ``method`` forces
    ``generation`` or ``prefix`` (default: ``generation`` when the template supports it). ``kwargs``: the
    variables the chat template is rendered with besides the messages (``template_kwargs``: the run's
    ``thinking``), the same ones chat and serve render prompts with.
    """
    if loss_on not in ("assistant", "all"):
        raise ValueError(f"loss_on must be 'assistant' or 'all', not {loss_on!r}")
    if overlong not in ("cut", "drop"):
        raise ValueError(f"overlong must be 'cut' or 'drop', not {overlong!r}")
    template_added = False
    if any(isinstance(record, Conversation) for record in records):
        template_added = ensure_chat_template(tokenizer)
    if method is None:
        method = "generation" if supports_generation_mask(tokenizer) else "prefix"
    result = Tokenized(method="all" if loss_on == "all" else method, chat_template_added=template_added)
    for record in records:
        ids, labels = tokenize_record(record, tokenizer, loss_on, method, kwargs)
        if max_seq_len is not None and len(ids) > max_seq_len and overlong == "drop":
            result.overlong_dropped += 1
            continue
        cut = max_seq_len is not None and len(ids) > max_seq_len
        answered = cut and any(label != IGNORE_INDEX for label in labels)
        if cut:
            result.truncated += 1
            result.tokens_dropped += len(ids) - max_seq_len
            ids, labels = ids[:max_seq_len], labels[:max_seq_len]
        if all(label == IGNORE_INDEX for label in labels):
            result.skipped += 1
            if answered:  # it had an answer, past the cut: the cut, not the data, left it nothing to learn
                result.cut_no_answer += 1
                if len(result.cut_no_answer_origins) < 10:
                    result.cut_no_answer_origins.append(record.origin or "?")
            elif len(result.untrained_origins) < 10:
                result.untrained_origins.append(record.origin or "?")
            if len(result.skipped_origins) < 10:
                result.skipped_origins.append(record.origin or "?")
            continue
        result.input_ids.append(ids)
        result.labels.append(labels)
    return result


def quiet_length_warning(tokenizer: Any) -> None:
    """Mark transformers' "Token indices sequence length is longer than the specified maximum" warning as said:
    a count of untruncated lengths tokenizes long records on purpose and runs none through the model (the
    planner and ``data check`` say what a cut drops, in their own words)."""
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True


def token_counts(records: Sequence[Record], tokenizer: Any, loss_on: str = "assistant",
                 kwargs: dict[str, Any] | None = None) -> list[tuple[int, int]]:
    """Each record's untruncated token length and its target count: the positions whose next token carries a
    label (``tokenize_record``'s labels, shifted as the loss reads them), the rows that the engine's fused
    losses send through the LM head (``core.train.fused_loss.target_rows``)."""
    quiet_length_warning(tokenizer)
    if any(isinstance(record, Conversation) for record in records):
        ensure_chat_template(tokenizer)
    method = "generation" if supports_generation_mask(tokenizer) else "prefix"
    counts = []
    for record in records:
        ids, labels = tokenize_record(record, tokenizer, loss_on, method, kwargs)
        counts.append((len(ids), sum(1 for label in labels[1:] if label != IGNORE_INDEX)))
    return counts


def token_lengths(records: Sequence[Record], tokenizer: Any, kwargs: dict[str, Any] | None = None) -> list[int]:
    """The untruncated token length of every record, as the model will see it."""
    quiet_length_warning(tokenizer)
    if any(isinstance(record, Conversation) for record in records):
        ensure_chat_template(tokenizer)
    lengths = []
    for record in records:
        if isinstance(record, TextRecord):
            lengths.append(len(_text_tokens(tokenizer, record)))
        else:
            text = _render(tokenizer, record.to_chat_messages(), record.tools, False, kwargs)
            lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return lengths
