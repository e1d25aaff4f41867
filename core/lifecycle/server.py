"""tunedeck's own OpenAI-compatible server (stdlib ``http.server``; one generation at a time).

Run as ``python -m core.lifecycle.server --state DIR (--run RUN_DIR | --model-dir DIR) [--host] [--port]
[--start-id ID]``
by ``core.lifecycle.serve`` in its own session. It holds ``DIR/lock`` for its whole life, writes
``DIR/state.json`` (pid, host, port, url, status) once it listens, and answers:

    GET  /health                 {"status": "ok", "model": ...}
    GET  /v1/models              the fine-tuned model, and ``<id>-base`` when it is base + adapter
    GET  /v1/models/{id}         one of those (404 ``model_not_found`` for any other id)
    HEAD (any path)              what GET answers there, status and headers, without the body
    POST /v1/chat/completions    OpenAI schema; ``"stream": true`` answers as server-sent events; ``logprobs``
                                 (true) with ``top_logprobs`` (0 to 20) scores each generated token (streamed:
                                 each chunk carries its tokens', a token with the chunk that ends its text)
    POST /v1/completions         the legacy text completion (lm-eval, older SDKs): ``prompt`` a string, a list
                                 of token ids, or a list of either (a choice each), no chat template; the same
                                 checks and streaming. ``echo`` and ``logprobs`` (an integer k: each token's
                                 log-probability, its k likeliest alternatives and text offset, the echoed
                                 prompt's tokens included) score text as lm-eval's loglikelihood tasks ask;
                                 with ``echo`` (not streamed), ``max_tokens`` 0 scores the prompt and generates
                                 nothing; streamed, each chunk carries the ``logprobs`` of its tokens

A route asked with a method it does not take (GET on /v1/chat/completions, POST on /v1/models) is a 405 with
``Allow`` naming those it takes; a path it has not, OpenAI's 404 "Invalid URL"; both in OpenAI's error JSON.

Requests are checked as OpenAI's API checks them, each refusal a 400 (404 for an unknown model) in OpenAI's
error shape naming the parameter: ``model`` must be one /v1/models lists (left out, the fine-tuned model
answers, as vLLM allows); ``max_tokens`` (or its newer name ``max_completion_tokens``) an integer of at
least 1; ``temperature`` from 0 to 2; ``top_p`` above 0 and at most 1; ``n`` only 1; ``stop`` a string or
up to 4 of them (the reply ends before the first, finish_reason "stop"); ``presence_penalty`` and
``frequency_penalty`` from -2 to 2 and ``logit_bias`` (token id → -100 to 100) change the logits as OpenAI
defines them; ``tools``, ``tool_choice``, ``functions`` and a ``response_format`` other than text are refused
(their neutral values, what SDKs send by default, are taken). A value given is used as given,
0 included. The prompt and ``max_tokens`` together must fit the model's context (its config's
``max_position_embeddings``): past it the request is refused, as vLLM refuses it; with ``max_tokens`` left
out, the default (256) is cut to what the context has room for. Messages the model's chat template refuses
(Gemma's take no ``system`` message) are a 400 naming ``messages`` and the role, not a failed generation.

With an API key (environment ``TUNEDECK_API_KEY``, never the command line, where ``ps`` shows it) every
/v1 route needs ``Authorization: Bearer KEY`` (401 otherwise, OpenAI's error JSON); /health stays open.
A request body over ``--max-body-bytes`` (1 MiB by default) is refused with 413 before it is read.
A stream whose reply does not come whole (a failed generation, the server's SIGTERM) ends with OpenAI's error
event and ``[DONE]``; SIGTERM stops every generation at its next token, answers a request not streamed (or
still waiting for the model) with 503, and waits for those answers (``SHUTDOWN_WAIT_S``) before it exits.
Usage is counted from the generated token ids.
"""

from __future__ import annotations

import argparse
import fcntl
import hmac
import ipaddress
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# Where the server listens (IPv4 or IPv6, dual-stack ``::``): one module for it and for the looks before it.
from core.errors import TunedeckError
from core.listen import bare_host, listen_address, prepare_listen_socket

log = logging.getLogger("tunedeck.serve")
API_KEY_ENV = "TUNEDECK_API_KEY"
DEFAULT_MAX_BODY_BYTES = 1 << 20
DRAIN_CAP = 64 << 20  # a refused body is read and dropped up to this much, so the client sees the answer
DRAIN_TIMEOUT_S = 5.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.strip("[]").lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name or an interface address: reachable from elsewhere, as far as we know


class ChatServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` on the address family of its host (``listen_address``): IPv4 or IPv6."""

    daemon_threads = True

    def __init__(self, host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        self.address_family, address = listen_address(host, port)
        super().__init__(address, handler)

    def server_bind(self) -> None:
        prepare_listen_socket(self.socket, self.server_address)
        super().server_bind()


class ChatBackend:
    """The loaded model behind the API; generation is serialised (one model, one stream at a time)."""

    def __init__(self, loaded: Any, model_id: str, api_key: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.loaded = loaded
        self.model_id = model_id
        self.lock = threading.Lock()
        self.api_key = api_key or None
        self.max_body_bytes = max_body_bytes
        from core.lifecycle.chat import context_length

        self.context = context_length(loaded)  # prompt + reply, in tokens; None: not known, not checked
        self.closing = threading.Event()  # the server was told to stop (SIGTERM, Ctrl+C): no new generation
        self._stops: set[threading.Event] = set()  # the stop events of the generations under way
        self._active = 0  # requests being answered
        self._idle = threading.Condition()

    def enter(self) -> None:
        with self._idle:
            self._active += 1

    def leave(self) -> None:
        with self._idle:
            self._active -= 1
            self._idle.notify_all()

    @contextmanager
    def stoppable(self, stop: threading.Event) -> Iterator[threading.Event]:
        """``stop`` set for the generation inside as the server begins to shut down (at once if it has)."""
        with self._idle:
            self._stops.add(stop)
            if self.closing.is_set():
                stop.set()
        try:
            yield stop
        finally:
            with self._idle:
                self._stops.discard(stop)

    def close(self) -> None:
        """Begin the shutdown: every generation under way ends at its next token, none starts."""
        with self._idle:
            self.closing.set()
            for stop in self._stops:
                stop.set()

    def wait_idle(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until every request under way has had its answer; True when all have."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active <= 0, timeout)

    def chat_ids(self, messages: list[dict[str, str]]) -> Any:
        """The conversation's prompt token ids, chat-templated once (counted for the context, then generated
        from); a chat template that refuses the messages (a role it does not take) is the client's to mend:
        a 400 naming ``messages``."""
        from core.lifecycle.chat import ChatTemplateFailed, ChatTemplateRefused, prompt_ids

        try:
            return prompt_ids(self.loaded, messages)
        except ChatTemplateRefused as exc:
            raise RequestError(str(exc), param="messages") from None
        except ChatTemplateFailed as exc:
            # The messages reach the template as strings with the three chat roles (a content of another shape
            # is a 400 in _messages first), so the fault is the template's, not the client's: a 500 that says
            # so, never a 400 with the bare Python words.
            from core.i18n import t

            log.error("the chat template failed", exc_info=exc.__cause__)
            raise TemplateFailed(t("lifecycle.api_template_failed", error=exc.error)) from None

    def text_ids(self, text: str, index: int) -> Any:
        """A completions prompt's token ids (no template); one of no tokens at all is a 400: nothing to follow."""
        from core.lifecycle.chat import text_prompt_ids

        ids = text_prompt_ids(self.loaded, text)
        if int(ids.shape[-1]) < 1:
            from core.i18n import t

            raise RequestError(t("lifecycle.api_prompt_empty", index=index), param="prompt")
        return ids

    def token_ids(self, ids: list[int], index: int) -> Any:
        """A completions prompt given as token ids, on the model's device; an id the model has not is a 400."""
        import torch

        vocab = self.vocab
        wrong = next((i for i in ids if not 0 <= i < vocab), None)
        if wrong is not None:
            from core.i18n import t

            raise RequestError(t("lifecycle.api_prompt_token", index=index, value=wrong, last=vocab - 1),
                               param="prompt")
        return torch.tensor([ids], dtype=torch.long, device=self.loaded.device)

    @property
    def vocab(self) -> int:
        """How many token ids the model has (its logits' width): the ids a prompt or ``logit_bias`` may name."""
        return getattr(getattr(self.loaded.model, "config", None), "vocab_size", None) or len(self.loaded.tokenizer)

    def authorised(self, header: str | None) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    def model_ids(self) -> list[str]:
        ids = [self.model_id]
        if self.loaded.has_adapter:
            ids.append(self.model_id + "-base")
        return ids

    def variant_for(self, requested: Any) -> str:
        """"tuned" or "base" for the request's ``model``: one of ``model_ids`` (left out or null: the fine-tuned
        model); anything else is refused with OpenAI's 404 ``model_not_found``."""
        if requested is None or requested == self.model_id:
            return "tuned"
        if requested == self.model_id + "-base" and self.loaded.has_adapter:
            return "base"
        from core.i18n import t

        raise RequestError(t("lifecycle.api_unknown_model", model=requested, ids=", ".join(self.model_ids())),
                           param="model", code="model_not_found", status=404)


class TemplateFailed(TunedeckError):
    """The model's chat template failed in Python on well-formed messages: the server's fault (a 500)."""


class RequestError(TunedeckError, ValueError):
    """A request the API refuses: its HTTP status, the parameter at fault and OpenAI's error code."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


DEFAULT_MAX_TOKENS = 256
MAX_STOP_SEQUENCES = 4  # OpenAI's limit


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)[:80]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1  # a 64-bit integer, as vLLM takes it (torch's seed is one)
MAX_PENALTY = 2.0  # OpenAI's presence_penalty / frequency_penalty run from -2 to 2
MAX_LOGIT_BIAS = 100.0  # and a logit_bias value from -100 to 100


def _logit_bias(value: Any, vocab: int | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias`` ({"token id": bias}) as (id, bias) pairs; ``RequestError`` naming it for a key
    that is not a token id of the model (0 to ``vocab`` - 1) or a bias outside -100 to 100."""
    from core.i18n import t

    if value is None:
        return ()
    pairs = []
    ok = isinstance(value, dict)
    for key, bias in (value.items() if ok else ()):
        token = int(key) if isinstance(key, str) and key.strip().isdecimal() and key.strip().isascii() else -1
        if token < 0 or (vocab is not None and token >= vocab) or not (
                _is_number(bias) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
            ok = False
            break
        pairs.append((token, float(bias)))
    if not ok:
        last = "" if vocab is None else vocab - 1
        raise RequestError(t("lifecycle.api_logit_bias", last=last, limit=int(MAX_LOGIT_BIAS), value=_shown(value)),
                           param="logit_bias")
    return tuple(pairs)


def _unsupported_chat(body: dict[str, Any]) -> None:
    """A chat parameter this server cannot honour, given a value other than its neutral one (what clients send
    by default: null, empty, "none", "auto" without tools, a text response format), is a ``RequestError``
    naming it rather than an answer that silently leaves it out: tool calling, a JSON response format."""
    from core.i18n import t

    neutral: dict[str, tuple[Any, ...]] = {"tools": (None, []), "functions": (None, []),
                                           "tool_choice": (None, "none", "auto"),
                                           "function_call": (None, "none", "auto"),
                                           "response_format": (None, {"type": "text"})}
    for name, values in neutral.items():
        value = body.get(name)
        if not any(value == v and type(value) is type(v) for v in values):
            raise RequestError(t("lifecycle.api_unsupported", param=name, value=_shown(value)), param=name)


def _settings(body: dict[str, Any], least: int = 1, vocab: int | None = None) -> tuple[Any, bool]:
    """(GenerationSettings, whether max_tokens was given) from the request; ``RequestError`` for a value
    OpenAI refuses. A value given is used as given (0 is 0): only a missing or null one takes the default.
    ``least``: the smallest ``max_tokens`` taken (0 for an echoed completion: the prompt scored alone);
    ``vocab``: the model's vocabulary size, that ``logit_bias`` keys must fall in."""
    from core.i18n import t
    from core.lifecycle.chat import GenerationSettings

    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(name)
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < least):
        key = "lifecycle.api_max_tokens_echo" if least == 0 else "lifecycle.api_max_tokens"
        raise RequestError(t(key, param=name, value=_shown(max_tokens)), param=name)
    temperature = body.get("temperature")
    if temperature is not None and not (_is_number(temperature) and 0 <= temperature <= 2):
        raise RequestError(t("lifecycle.api_temperature", value=_shown(temperature)), param="temperature")
    top_p = body.get("top_p")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise RequestError(t("lifecycle.api_top_p", value=_shown(top_p)), param="top_p")
    n = body.get("n")
    if n is not None and (n != 1 or isinstance(n, bool)):
        raise RequestError(t("lifecycle.api_n", value=_shown(n)), param="n")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not SEED_MIN <= seed <= SEED_MAX):
        raise RequestError(t("lifecycle.api_seed", low=SEED_MIN, high=SEED_MAX, value=_shown(seed)), param="seed")
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (isinstance(stops, list) and len(stops) <= MAX_STOP_SEQUENCES
                                 and all(isinstance(s, str) for s in stops)):
        raise RequestError(t("lifecycle.api_stop", limit=MAX_STOP_SEQUENCES, value=_shown(stop)), param="stop")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(t("lifecycle.api_stream", value=_shown(stream)), param="stream")
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = body.get(name)
        if value is not None and not (_is_number(value) and -MAX_PENALTY <= value <= MAX_PENALTY):
            raise RequestError(t("lifecycle.api_penalty", param=name, limit=int(MAX_PENALTY), value=_shown(value)),
                               param=name)
        penalties[name] = float(value or 0)
    settings = GenerationSettings(temperature=0.7 if temperature is None else float(temperature),
                                  max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                                  top_p=1.0 if top_p is None else float(top_p), seed=seed,
                                  stop=tuple(s for s in stops or () if s),
                                  logit_bias=_logit_bias(body.get("logit_bias"), vocab), **penalties)
    return settings, max_tokens is not None


def _fit_context(settings: Any, explicit: bool, prompt_tokens: int, limit: int | None,
                 param: str = "messages") -> Any:
    """The settings with ``max_tokens`` fitting the model's context of ``limit`` tokens after the prompt.

    As vLLM: a prompt that leaves no room, or a ``max_tokens`` given that goes past the context, is refused
    (400 ``context_length_exceeded`` naming ``param``: a chat's "messages", a completion's "prompt"); the
    default ``max_tokens`` is cut to the room left."""
    from dataclasses import replace

    from core.i18n import t
    from core.lifecycle.chat import context_overflow

    if limit is None:
        return settings
    words = "lifecycle.api_" if param == "messages" else "lifecycle.api_completion_"
    over = context_overflow(prompt_tokens, settings.max_tokens if explicit else 1, limit)
    if over is not None and over.no_room:
        raise RequestError(t(words + "prompt_too_long", limit=limit, prompt=prompt_tokens),
                           param=param, code="context_length_exceeded")
    if over is not None:
        raise RequestError(t(words + "context", limit=limit, total=over.total, prompt=prompt_tokens,
                             completion=settings.max_tokens), param=param, code="context_length_exceeded")
    return replace(settings, max_tokens=min(settings.max_tokens, limit - prompt_tokens))


CHAT_ROLES = ("system", "user", "assistant")  # OpenAI's chat roles a chat template takes as they are
ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for the system instructions
TOOL_ROLES = ("tool", "function")  # answers to tool calls: this server takes no `tools`, so it has none to answer


def _content(content: Any, index: int) -> str:
    """A message's text: a string, or OpenAI's array of ``{"type": "text", "text": ...}`` parts (joined);
    anything else (null, a dict, an image part) is a ``RequestError`` naming ``messages[index].content``."""
    from core.i18n import t

    param = f"messages[{index}].content"
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        for number, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise RequestError(t("lifecycle.api_message_part", param=param, part=number, value=_shown(part)),
                                   param=param)
        return "".join(part["text"] for part in content)
    raise RequestError(t("lifecycle.api_message_content", param=param, value=_shown(content)), param=param)


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    """The request's messages as ``{role, content}`` strings the chat template takes; ``RequestError``
    (400, ``param`` ``messages[i].role`` / ``messages[i].content``) for one OpenAI's API would refuse or this
    server cannot answer. ``developer`` is taken as ``system``; ``tool`` / ``function`` are refused."""
    from core.i18n import t

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(t("lifecycle.api_messages", value=_shown(messages)), param="messages")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(t("lifecycle.api_message", index=index, value=_shown(message)),
                               param=f"messages[{index}]")
        role = message.get("role")
        param = f"messages[{index}].role"
        if role in TOOL_ROLES:
            raise RequestError(t("lifecycle.api_message_tool", param=param, role=role), param=param)
        if role not in CHAT_ROLES and role not in ROLE_ALIASES:
            raise RequestError(t("lifecycle.api_message_role", param=param, value=_shown(role),
                                 roles=", ".join(CHAT_ROLES + tuple(ROLE_ALIASES))), param=param)
        out.append({"role": ROLE_ALIASES.get(role, role), "content": _content(message.get("content"), index)})
    return out


UNSUPPORTED_COMPLETION = ("suffix", "best_of")  # OpenAI's, that this server cannot honour
MAX_LOGPROBS = 20  # the most alternatives a token's top_logprobs holds (OpenAI's limit is 5; vLLM's 20)


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(i, int) and not isinstance(i, bool)
                                                           for i in value)


def _prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """A completions request's ``prompt``: a string, a list of token ids, or a list of either (one choice
    each); ``RequestError`` for anything else, and for a parameter this server cannot honour (``suffix``,
    ``best_of`` above 1) rather than an answer that silently leaves it out."""
    from core.i18n import t

    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) or _token_list(prompt) else prompt
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, str) or _token_list(p) for p in prompts)):
        raise RequestError(t("lifecycle.api_prompt", value=_shown(prompt)), param="prompt")
    for name in UNSUPPORTED_COMPLETION:
        value = body.get(name)
        if value not in (None, False, "") and not (name == "best_of" and value == 1):
            raise RequestError(t("lifecycle.api_unsupported", param=name, value=_shown(value)), param=name)
    return prompts


def _scoring(body: dict[str, Any]) -> tuple[bool, int | None]:
    """(``echo``, ``logprobs``) of a completions request: whether the prompt comes back before the
    completion, and how many alternatives each token's ``top_logprobs`` holds (None: no logprobs at all).
    ``echo`` is answered whole, not streamed; streamed logprobs come with each chunk's tokens."""
    from core.i18n import t

    echo, top = body.get("echo"), body.get("logprobs")
    if echo is not None and not isinstance(echo, bool):
        raise RequestError(t("lifecycle.api_echo", value=_shown(echo)), param="echo")
    if top is not None and not (isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= MAX_LOGPROBS):
        raise RequestError(t("lifecycle.api_logprobs", limit=MAX_LOGPROBS, value=_shown(top)), param="logprobs")
    if body.get("stream") is True and echo:
        raise RequestError(t("lifecycle.api_scoring_stream", param="echo"), param="echo")
    return bool(echo), top


def _chat_scoring(body: dict[str, Any]) -> int | None:
    """A chat request's ``logprobs`` (true: each generated token scored) and ``top_logprobs`` (how many
    alternatives each lists, 0 to MAX_LOGPROBS; only with ``logprobs`` true, as OpenAI requires): the
    number of alternatives, or None for no logprobs. Streamed, each chunk has its tokens'."""
    from core.i18n import t

    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise RequestError(t("lifecycle.api_chat_logprobs", value=_shown(wanted)), param="logprobs")
    if top is not None and not (isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= MAX_LOGPROBS):
        raise RequestError(t("lifecycle.api_top_logprobs", limit=MAX_LOGPROBS, value=_shown(top)),
                           param="top_logprobs")
    if top is not None and not wanted:
        raise RequestError(t("lifecycle.api_top_logprobs_alone"), param="top_logprobs")
    return (top or 0) if wanted else None


@dataclass
class _Job:
    """One request's generations under the model lock, answered in its endpoint's shape: a chat's
    ``chat.completion`` (a message, delta chunks), a completion's ``text_completion`` (text, text chunks)."""

    chat: bool
    prompts: list[tuple[Any, Any]]  # (prompt token ids, GenerationSettings fitted to the context), a choice each
    variant: str
    model: str
    id: str
    created: int
    include_usage: bool = False
    echo: bool = False  # a completion's text starts with its prompt (``texts``)
    logprobs: int | None = None  # the generated tokens scored (a completion's prompt too with echo), this many alternatives each
    texts: list[str] = field(default_factory=list)  # each completion prompt as text: what ``echo`` gives back
    text_prompts: list[bool] = field(default_factory=list)  # whether each completion prompt came as text, not ids

    def choice(self, index: int, text: str, finish: str, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self.chat:
            return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                    "finish_reason": finish}
        if self.echo:
            text = self.texts[index] + text
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def chunk(self, index: int, piece: str | None, finish: str | None, role: bool = False,
              logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        """A stream chunk: a piece of text (with the ``logprobs`` of its tokens when asked for), or (``piece``
        None) the choice's end with its finish reason. With ``include_usage`` each has ``usage`` null, as
        OpenAI's do: only the last chunk (no choices) carries it."""
        if self.chat:
            delta = {"role": "assistant", "content": piece} if role else {} if piece is None else {"content": piece}
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        else:
            choice = {"index": index, "text": piece or "", "logprobs": logprobs, "finish_reason": finish}
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                 "created": self.created, "model": self.model, "choices": [choice]}
        return {**chunk, "usage": None} if self.include_usage else chunk


POST_ROUTES = ("/v1/chat/completions", "/v1/completions")
GET_ROUTES = ("/health", "/v1/models")  # and /v1/models/{id}


def _allowed_methods(path: str) -> tuple[str, ...] | None:
    """The methods the route at ``path`` (no query, no trailing "/") takes; None for a path this server has not."""
    if path in POST_ROUTES:
        return ("POST",)
    if path in GET_ROUTES or path.startswith("/v1/models/"):
        return ("GET", "HEAD")
    return None


def make_handler(backend: ChatBackend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "tunedeck"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.info("%s %s", self.address_string(), format % args)

        def _json(self, code: int, value: Any, headers: dict[str, str] | None = None) -> None:
            """``value`` as the JSON answer; to HEAD, the same status and headers without the body."""
            data = json.dumps(value).encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, text in (headers or {}).items():
                self.send_header(name, text)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _error(self, code: int, message: str, kind: str = "invalid_request_error",
                   error_code: str | None = None, headers: dict[str, str] | None = None,
                   param: str | None = None) -> None:
            self._json(code, _error_object(message, kind, param, error_code), headers)

        def _drain(self) -> None:
            """Read and drop the request body (at most DRAIN_CAP bytes, a few seconds) before a refusal.

            Closing a socket with unread data makes the kernel reset the connection, and the client then
            sees a reset instead of our 401/413 answer."""
            try:
                left = min(int(self.headers.get("Content-Length") or 0), DRAIN_CAP)
            except ValueError:
                return
            self.connection.settimeout(DRAIN_TIMEOUT_S)
            try:
                while left > 0:
                    chunk = self.rfile.read(min(left, 1 << 16))
                    if not chunk:
                        return
                    left -= len(chunk)
            except OSError:
                return

        def _refused(self, path: str) -> bool:
            """Answer 401 for a /v1 route without the right key; True when it did."""
            if not (path == "/v1" or path.startswith("/v1/")) or backend.authorised(self.headers.get("Authorization")):
                return False
            from core.i18n import t

            log.warning("%s %s refused: no or wrong API key", self.address_string(), path)
            self.close_connection = True
            self._drain()
            self._error(401, t("lifecycle.serve_bad_key"), error_code="invalid_api_key",
                        headers={"WWW-Authenticate": "Bearer", "Connection": "close"})
            return True

        def _not_allowed(self, path: str) -> bool:
            """Answer a route this server has, asked with a method it does not take there (GET on
            /v1/chat/completions, POST on /v1/models, DELETE anywhere), with 405 and the ``Allow`` header in
            OpenAI's error JSON, as HTTP asks, rather than a 404 that reads as a wrong URL; True when it did."""
            from core.i18n import t

            allowed = _allowed_methods(path)
            if allowed is None or self.command in allowed:
                return False
            self.close_connection = True
            self._drain()  # a body sent with it is read and dropped, so the client sees the answer
            self._error(405, t("lifecycle.api_method_not_allowed", method=self.command, path=path,
                               allowed=", ".join(allowed)),
                        headers={"Allow": ", ".join(allowed), "Connection": "close"})
            return True

        def _other_method(self) -> None:
            """A method no route takes (DELETE, PUT, PATCH, OPTIONS): 405 on a route this server has
            (``_not_allowed``), OpenAI's 404 "Invalid URL" on a path it has not, each in OpenAI's error JSON,
            not http.server's HTML 501 page that an API client cannot read."""

            path = self.path.split("?")[0].rstrip("/")
            if self._refused(path) or self._not_allowed(path):
                return
            self._no_route()

        def _no_route(self) -> None:
            """OpenAI's 404 "Invalid URL" for a path this server has not."""
            from core.i18n import t

            self.close_connection = True
            self._drain()  # a body sent with it is read and dropped, so the client sees the answer
            self._error(404, t("lifecycle.api_no_route", method=self.command, path=self.path),
                        headers={"Connection": "close"})

        do_DELETE = do_PUT = do_PATCH = do_OPTIONS = _other_method  # noqa: N815 - http.server's naming

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            """The GET routes; HEAD (``curl -I``, a proxy's or uptime monitor's probe) is answered the same,
            headers only, not http.server's HTML 501 page."""
            from core.i18n import t

            path = self.path.split("?")[0].rstrip("/")
            if self._refused(path) or self._not_allowed(path):
                return
            if path == "/health":
                self._json(200, {"status": "ok", "model": backend.model_id})
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [_model_object(mid) for mid in backend.model_ids()]})
            elif path.startswith("/v1/models/"):  # openai's models.retrieve(id); an id may hold a "/"
                from urllib.parse import unquote

                model_id = unquote(path[len("/v1/models/"):])
                try:
                    backend.variant_for(model_id)  # the same test a chat request's "model" passes
                except RequestError as exc:
                    self._error(exc.status, str(exc), error_code=exc.code, param=exc.param)
                else:
                    self._json(200, _model_object(model_id))
            else:
                self._error(404, t("lifecycle.api_no_route", method=self.command, path=self.path))

        do_HEAD = do_GET  # noqa: N815 - http.server's naming

        def do_POST(self) -> None:  # noqa: N802
            # counted from its first byte read until answered: a stop waits for it (``ChatBackend.wait_idle``),
            # a body still coming in or a prompt being templated included, not only one at the model
            backend.enter()
            try:
                self._post()
            finally:
                backend.leave()

        def _post(self) -> None:
            from core.i18n import t

            path = self.path.split("?")[0].rstrip("/")
            if self._refused(path) or self._not_allowed(path):
                return
            if path not in POST_ROUTES:
                self._no_route()
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length < 0:
                    raise ValueError
            except ValueError:
                self.close_connection = True
                self._error(400, t("lifecycle.serve_bad_length", value=self.headers.get("Content-Length")))
                return
            if length > backend.max_body_bytes:
                log.warning("%s refused a %d-byte body (limit %d)", self.address_string(), length,
                            backend.max_body_bytes)
                self.close_connection = True
                self._drain()  # read and dropped (up to a cap), never kept
                self._error(413, t("lifecycle.serve_body_too_large", size=length, limit=backend.max_body_bytes),
                            error_code="request_too_large", headers={"Connection": "close"})
                return
            chat = path == "/v1/chat/completions"
            try:
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError as exc:  # not JSON, or not UTF-8: said as such, with where it went wrong
                    raise RequestError(t("lifecycle.api_bad_json", error=str(exc))) from None
                if not isinstance(body, dict):
                    raise RequestError(t("lifecycle.api_body_not_object", value=_shown(body)))
                echo, top = False, None
                if chat:
                    prompts: list[Any] = [_messages(body)]
                    _unsupported_chat(body)
                    top = _chat_scoring(body)
                else:
                    prompts = _prompts(body)
                    echo, top = _scoring(body)
                settings, explicit = _settings(body, least=0 if echo else 1, vocab=backend.vocab)
                variant = backend.variant_for(body.get("model"))
                if chat:
                    ids = [backend.chat_ids(prompts[0])]
                else:
                    ids = [backend.text_ids(p, index) if isinstance(p, str) else backend.token_ids(p, index)
                           for index, p in enumerate(prompts)]
                fitted = [_fit_context(settings, explicit, int(one.shape[-1]), backend.context,
                                       "messages" if chat else "prompt") for one in ids]
            except RequestError as exc:
                self._error(exc.status, str(exc), error_code=exc.code, param=exc.param)
                return
            except TemplateFailed as exc:  # before ValueError / TypeError: the body's, which are the client's
                self._error(500, str(exc), "server_error")
                return
            except (ValueError, TypeError) as exc:
                self._error(400, str(exc))
                return
            except Exception as exc:  # tokenizing the prompt failed: as a failed generation
                log.exception("templating the prompt failed")
                self._error(500, _failed(exc), "server_error")
                return
            options = body.get("stream_options")
            job = _Job(chat=chat, prompts=list(zip(ids, fitted, strict=True)), variant=variant,
                       model=backend.model_id + ("-base" if variant == "base" else ""),
                       id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], created=int(time.time()),
                       include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
                       echo=echo, logprobs=top,
                       texts=[] if chat else [p if isinstance(p, str) else
                                              backend.loaded.tokenizer.decode(p, skip_special_tokens=False)
                                              for p in prompts],
                       text_prompts=[] if chat else [isinstance(p, str) for p in prompts])
            with backend.lock:
                if backend.closing.is_set():  # waited for the model while the server was told to stop
                    self._shutting_down()
                elif body.get("stream"):
                    self._stream(job)
                else:
                    self._complete(job)

        def _shutting_down(self) -> None:
            from core.i18n import t

            self.close_connection = True
            self._error(503, t("lifecycle.api_shutting_down"), "server_error")

        def _complete(self, job: _Job) -> None:
            from core.lifecycle.chat import GenerationOutcome, Reply, generate_from_prompt

            # A client that goes away (its timeout, Ctrl+C) ends the generation: the lock it holds would keep
            # every other request waiting for a reply nobody reads, up to max_tokens of it.
            # A server told to stop ends it too (``stop``), and answers 503 rather than a reply cut short.
            gone, finished, stop = threading.Event(), threading.Event(), threading.Event()

            def watch() -> None:
                while not finished.wait(CLIENT_POLL_S):
                    if client_gone(self.connection):
                        gone.set()
                        stop.set()
                        return

            threading.Thread(target=watch, daemon=True, name="tunedeck-client-watch").start()
            replies, scored = [], []
            try:
                with backend.stoppable(stop):
                    for ids, settings in job.prompts:
                        if settings.max_tokens == 0:  # an echoed prompt scored alone: nothing generated
                            replies.append(Reply("", GenerationOutcome(prompt_tokens=int(ids.shape[-1]),
                                                                       done=True)))
                        else:
                            replies.append(generate_from_prompt(backend.loaded, ids, settings, job.variant,
                                                                stop=stop))
                        if stop.is_set():
                            break
                if job.logprobs is not None and not stop.is_set():
                    scored = [_chat_logprobs(backend.loaded, ids, reply, job.logprobs, job.variant) if job.chat
                              else _logprobs(backend.loaded, ids, job.texts[index], reply, job.logprobs, job.echo,
                                             job.variant, text_prompt=job.text_prompts[index])
                              for index, ((ids, _fitted), reply) in enumerate(zip(job.prompts, replies,
                                                                                     strict=True))]
            except Exception as exc:  # a generation error is the client's answer, not a dead server
                log.exception("generation failed")
                self._error(500, _failed(exc), "server_error")
                return
            finally:
                finished.set()
            if gone.is_set():
                log.info("%s went away; its generation stopped after %d tokens", self.address_string(),
                         sum(reply.outcome.completion_tokens for reply in replies))
                self.close_connection = True
                return
            if stop.is_set():  # the server is shutting down: its generation was stopped
                self._shutting_down()
                return
            self._json(200, {
                "id": job.id, "object": "chat.completion" if job.chat else "text_completion",
                "created": job.created, "model": job.model,
                "choices": [job.choice(index, reply.text, reply.outcome.finish_reason,
                                       scored[index] if scored else None)
                            for index, reply in enumerate(replies)],
                "usage": _usage([reply.outcome for reply in replies]),
            })

        def _stream(self, job: _Job) -> None:
            from core.lifecycle.chat import GenerationOutcome, stream_pieces
            from core.lifecycle.scoring import CONTEXT_TOKENS, token_texts

            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def send(chunk: dict[str, Any]) -> None:
                self.wfile.write(b"data: " + json.dumps(chunk).encode("utf-8") + b"\n\n")
                self.wfile.flush()

            def end_with_error(message: str) -> None:
                """The stream's end when its reply did not come whole: OpenAI's error event (the openai client
                raises it as an APIError), then [DONE], never a stream that just stops as if finished."""
                send(_error_object(message, "server_error"))
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            stop = threading.Event()
            outcomes = []
            tokenizer = backend.loaded.tokenizer
            try:
                for index, (ids, settings) in enumerate(job.prompts):
                    if job.chat:
                        send(job.chunk(index, "", None, role=True))
                    outcome = GenerationOutcome()
                    outcomes.append(outcome)
                    offset = 0 if job.chat else len(job.texts[index])  # a completion's tokens', from its prompt's start
                    before: list[int] = []  # the tokens sent so far: each token's text read after them
                    # closing() ends the generation before the lock is let go when the client goes away
                    with backend.stoppable(stop), closing(stream_pieces(backend.loaded, ids, settings, job.variant,
                                                                        stop=stop, outcome=outcome,
                                                                        top=job.logprobs)) as pieces:
                        for piece in pieces:
                            if job.logprobs is None:
                                if piece.text:
                                    send(job.chunk(index, piece.text, None))
                                continue
                            # each chunk with the tokens whose text it completes (a held-back one's when it goes)
                            if job.chat:
                                logprobs = {"content": _chat_content(tokenizer, piece.ids, piece.scores, before),
                                            "refusal": None}
                            else:
                                texts = token_texts(tokenizer, list(piece.ids), skip_special=True, before=before)
                                logprobs = _legacy_logprobs(tokenizer, texts, piece.scores, offset, before)
                                offset += sum(map(len, texts))
                            before = [*before, *piece.ids][-CONTEXT_TOKENS:]
                            send(job.chunk(index, piece.text, None, logprobs=logprobs))
                    if stop.is_set():  # the server is shutting down: not a finished reply, an error (as vLLM's)
                        from core.i18n import t

                        log.info("%s: its stream was ended by the server's shutdown", self.address_string())
                        end_with_error(t("lifecycle.api_shutting_down"))
                        return
                    send(job.chunk(index, None, outcome.finish_reason))
                if job.include_usage:  # OpenAI's stream_options.include_usage: one last chunk, no choices
                    send({**job.chunk(0, None, None), "choices": [], "usage": _usage(outcomes)})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                stop.set()  # the client went away: stop generating for nobody
            except Exception as exc:
                log.exception("generation failed")
                stop.set()
                try:  # the client still reads: told the reply failed, not left with one cut short in silence
                    end_with_error(_failed(exc))
                except OSError:
                    pass

    return Handler


def _error_object(message: str, kind: str = "invalid_request_error", param: str | None = None,
                  code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, a refused request's body and a failed stream's last event alike: ``code`` is a
    string naming the error or null, never the HTTP status (clients read that from the response); ``param``
    names the parameter at fault, when one is."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _failed(exc: BaseException) -> str:
    """A failed generation's message for the client (a 500's, or a stream's error event)."""
    from core.i18n import t

    return t("lifecycle.api_generation_failed", error=str(exc) or type(exc).__name__)


def _completion_tokens(tokenizer: Any, reply: Any) -> list[int]:
    """The generated ids that make the reply's text: an end token (it adds no text) and the tokens past a
    stop string (generation ends on the token completing it; the text ends before it) left out."""
    ids, outcome = list(reply.outcome.ids), reply.outcome
    if not outcome.hit_stop:
        return ids[:-1] if outcome.hit_eos else ids
    # The fewest tokens whose text reaches the reply's end. A character split across tokens (byte pieces) is
    # reached only with its last piece: before it, its first pieces decode to U+FFFD, a character as long.
    whole = len(reply.text.rstrip("\ufffd"))
    low, high = 0, len(ids)
    while low < high:
        middle = (low + high) // 2
        text = tokenizer.decode(ids[:middle], skip_special_tokens=True)
        if len(text) >= len(reply.text) and len(text.rstrip("\ufffd")) >= whole:
            high = middle
        else:
            low = middle + 1
    return ids[:low]


def _scored(loaded: Any, prompt_ids: Any, reply: Any, top: int, variant: str) -> tuple[list[int], list[int], list[Any]]:
    """(prompt ids, the completion's ids that make the reply's text, a ``TokenScore`` for each of both)."""
    import torch

    from core.lifecycle.scoring import score_tokens

    prompt = [int(i) for i in prompt_ids[0].tolist()]
    completion = _completion_tokens(loaded.tokenizer, reply)
    ids = torch.tensor([prompt + completion], dtype=torch.long, device=prompt_ids.device)
    return prompt, completion, score_tokens(loaded, ids, top, variant)


def _chat_logprobs(loaded: Any, prompt_ids: Any, reply: Any, top: int, variant: str) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` object of one choice: ``_chat_content`` of each generated token of the reply,
    scored by the model given all before it."""
    prompt, completion, scores = _scored(loaded, prompt_ids, reply, top, variant)
    return {"content": _chat_content(loaded.tokenizer, completion, scores[len(prompt):]), "refusal": None}


def _chat_content(tokenizer: Any, ids: Any, scores: Any, before: Any = ()) -> list[dict[str, Any]]:
    """OpenAI's chat ``logprobs.content`` of generated tokens ``ids`` with their ``TokenScore``s (a whole reply's,
    or a stream chunk's, ``before``: the reply's tokens before this chunk's): each token's text in its place
    (``token_texts``: the texts join into the reply), its log-probability given all before it (the model's own
    distribution, before temperature, top_p or any penalty), its bytes (``token_bytes``: a piece of a character
    as its own bytes) and the likeliest tokens there, likeliest first, each read in the same place."""
    from core.lifecycle.scoring import CONTEXT_TOKENS, token_bytes, token_text

    def entry(token_id: int, text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": token_bytes(tokenizer, token_id, text)}

    window = [int(i) for i in before][-CONTEXT_TOKENS:]
    content = []
    for token_id, score in zip(ids, scores, strict=True):
        text = token_text(tokenizer, int(token_id), window, skip_special=True)
        content.append({**entry(token_id, text, score.logprob),
                        "top_logprobs": [entry(top_id, token_text(tokenizer, top_id, window), logprob)
                                         for top_id, logprob in score.top]})
        window = [*window, int(token_id)][-CONTEXT_TOKENS:]
    return content


def _logprobs(loaded: Any, prompt_ids: Any, prompt_text: str, reply: Any, top: int, echo: bool,
              variant: str, text_prompt: bool = False) -> dict[str, Any]:
    """OpenAI's legacy ``logprobs`` object of one choice (``_legacy_logprobs``): the completion's tokens, the
    prompt's before them with ``echo`` (a text prompt's own: ``_echo_span``); offsets from the start of the
    prompt, the completion's from where the prompt as sent ends."""
    from core.lifecycle.scoring import token_texts

    tokenizer = loaded.tokenizer
    prompt, completion, scores = _scored(loaded, prompt_ids, reply, top, variant)
    answer = _legacy_logprobs(tokenizer, token_texts(tokenizer, completion, skip_special=True),
                              scores[len(prompt):], len(prompt_text))
    if not echo:
        return answer
    first, last = _echo_span(tokenizer, prompt_text, prompt) if text_prompt else (0, len(prompt))
    echoed = _legacy_logprobs(tokenizer, token_texts(tokenizer, prompt[first:last]), scores[first:last], 0)
    return {name: echoed[name] + answer[name] for name in answer}


def _echo_span(tokenizer: Any, text: str, prompt: list[int]) -> tuple[int, int]:
    """(first, end) of the tokens of a text prompt's own ``text`` in its ids ``prompt``: those the tokenizer
    added itself (a BOS before it, an EOS after) are no part of the echoed text, so their tokens are left out
    of its logprobs, and the tokens join into the text with offsets into it. (0, all) when they are not found."""
    own = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    for first in range(len(prompt) - len(own) + 1):
        if prompt[first:first + len(own)] == own:
            return first, first + len(own)
    return 0, len(prompt)


def _legacy_logprobs(tokenizer: Any, texts: list[str], scores: Any, offset: int, before: Any = ()) -> dict[str, Any]:
    """OpenAI's legacy ``logprobs`` object of tokens with these ``texts`` (``token_texts``) and ``TokenScore``s
    (a choice's, or a stream chunk's, ``before``: the tokens before the first): each token's text, its
    log-probability given all before it (null for the very first of a prompt), the likeliest tokens there and
    the token itself as {text: logprob}, each read in its place (null for that first), and its character
    offset, the first's ``offset``."""
    from core.lifecycle.scoring import CONTEXT_TOKENS, token_text

    offsets = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    tops: list[dict[str, float] | None] = []
    window = [int(i) for i in before][-CONTEXT_TOKENS:]
    for score in scores:
        if score.logprob is not None:
            alternatives: dict[str, float] = {}
            for token_id, logprob in (*score.top, (score.id, score.logprob)):  # OpenAI: the token itself, always
                name = token_text(tokenizer, int(token_id), window)
                alternatives[name] = max(logprob, alternatives.get(name, logprob))
            tops.append(alternatives)
        else:
            tops.append(None)
        window = [*window, int(score.id)][-CONTEXT_TOKENS:]
    return {"tokens": list(texts), "token_logprobs": [score.logprob for score in scores], "top_logprobs": tops,
            "text_offset": offsets}


SHUTDOWN_WAIT_S = 10.0  # how long a stopping server waits for its requests' answers (serve's grace is 15 s)
CLIENT_POLL_S = 0.2  # how often a non-streamed generation looks whether its client is still there


def client_gone(connection: socket.socket) -> bool:
    """Whether the client closed its side of ``connection`` (readable, and nothing to read: end of file).
    A client that sent more bytes is still there; our HTTP/1.0 exchange has nothing else to read."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or closed under us
        return True


def _model_object(model_id: str) -> dict[str, Any]:
    """OpenAI's model object for one id this server serves."""
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "tunedeck"}


def _usage(outcomes: list[Any]) -> dict[str, int]:
    """OpenAI's usage of the generations of one request (a completions request may hold several prompts)."""
    prompt = sum(outcome.prompt_tokens for outcome in outcomes)
    completion = sum(outcome.completion_tokens for outcome in outcomes)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _write_state(state_dir: Path, start_id: str | None, **values: Any) -> None:
    """Merge ``values`` into the server's record, as every writer of it does (``serve_record``): under its
    lock, and never over a stop said meanwhile. With the ``start_id`` its starter gave it, only into that
    start's record: a server still exiting when a new start has begun leaves the new record alone."""
    from core.lifecycle.serve_record import update_state

    update_state(state_dir, where=None if start_id is None else {"start_id": start_id}, **values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.lifecycle.server")
    parser.add_argument("--state", required=True)
    parser.add_argument("--run", default=None)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--checkpoint", type=int, default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--start-id", default=None)  # the record it writes to is the one of this start only
    args = parser.parse_args(argv)
    start = args.start_id
    api_key = os.environ.pop(API_KEY_ENV, "") or None  # out of the environment of anything we start
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    from core.lifecycle.library_noise import quiet_libraries

    quiet_libraries()  # the log holds the server's own lines and the libraries' errors, not their notes
    state_dir = Path(args.state)
    lock_fd = os.open(state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.error("another server holds %s", state_dir / "lock")
        return 3
    _write_state(state_dir, start, pid=os.getpid(), status="loading", backend="transformers")

    from core.lifecycle.source import held, load_finetuned, load_model_dir, resolve_model_source
    from core.runs.run_dir import RunDirectory

    if args.model_dir:
        from core.lifecycle.serve import model_dir_id

        loaded = load_model_dir(Path(args.model_dir))
        model_id = model_dir_id(Path(args.model_dir))  # the id start_server filed it under
    else:
        run = RunDirectory(Path(args.run))
        # held from choice to load: a live run's rotation removes no checkpoint chosen meanwhile (``held``)
        with held(run, resolve_model_source(run, args.checkpoint), args.checkpoint) as source:
            _write_state(state_dir, start, step=source.step)  # the checkpoint served: status and the app show it
            loaded = load_finetuned(source)
        model_id = run.id
    backend = ChatBackend(loaded, model_id, api_key=api_key, max_body_bytes=args.max_body_bytes)
    args.host = bare_host(args.host)
    httpd = ChatServer(args.host, args.port, make_handler(backend))
    port = httpd.server_address[1]
    shown_host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{shown_host}:{port}/v1"

    def shut_down() -> None:
        backend.close()  # generations under way end at their next token; their clients are told why
        httpd.shutdown()

    def on_term(_signum: int, _frame: Any) -> None:
        threading.Thread(target=shut_down, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if not is_loopback(args.host):
        from core.i18n import t

        log.warning("%s", t("lifecycle.serve_public_host", host=args.host,
                            auth=t("lifecycle.serve_auth_on" if api_key else "lifecycle.serve_auth_off")))
    _write_state(state_dir, start, status="ready", host=args.host, port=port, url=url, model=model_id,
                 ready_ts=time.time(), auth=api_key is not None, max_body_bytes=args.max_body_bytes)
    log.info("serving %s at %s (API key %s, body limit %d bytes)", model_id, url,
             "required" if api_key else "not required", args.max_body_bytes)
    try:
        httpd.serve_forever(poll_interval=0.2)
        # Every request under way answered before the process ends: a stream cut off mid-token read as a
        # reply that just stopped, and torch threads killed by the interpreter's exit aborted it
        # ("terminate called without an active exception"). Bounded within the stop's grace before SIGKILL.
        if not backend.wait_idle(SHUTDOWN_WAIT_S):
            log.warning("requests still under way after %.0f s; stopping anyway", SHUTDOWN_WAIT_S)
    finally:
        httpd.server_close()
        _write_state(state_dir, start, status="stopped", stopped_ts=time.time())
    return 0


if __name__ == "__main__":
    sys.exit(main())
