"""Generating replies: chat-template the conversation, stream tokens as the model produces them.

``stream_chat`` yields text pieces while ``generate`` runs in a thread (token by token), so the
CLI, the chat worker and the server can all show tokens as they arrive. ``variant="base"`` answers with
the adapter switched off: the side-by-side comparison needs one model in memory, not two.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import closing, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.lifecycle.source import LifecycleError, LoadedModel, ModelSource


@dataclass(frozen=True)
class GenerationSettings:
    temperature: float = 0.7
    max_tokens: int = 256
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()  # the reply ends before the first of these strings (not included in it)
    # OpenAI's: added to a token's logit at each step ((token id, bias) pairs), and taken off it by how often
    # (frequency) and whether (presence) the reply so far holds it. Neutral by default.
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


@dataclass
class GenerationOutcome:
    """What one generation produced, filled in by ``stream_chat`` when it ends.

    ``ids`` are the generated token ids as ``generate`` returned them (the prompt cut off; an end token
    the model emitted is included: it was generated). The usage the server reports is counted from these
    ids, never by tokenising the decoded text again (special tokens decode to nothing, and a re-encoding
    need not give the same tokens back).
    """

    ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    max_tokens: int = 0
    hit_eos: bool = False
    hit_stop: bool = False  # ended on one of the settings' stop strings
    done: bool = False

    @property
    def completion_tokens(self) -> int:
        return len(self.ids)

    @property
    def finish_reason(self) -> str:
        """OpenAI's: "length" when the reply was cut at ``max_tokens`` without an end token or a stop string,
        else "stop"."""
        if self.hit_eos or self.hit_stop:
            return "stop"
        return "length" if self.completion_tokens >= self.max_tokens else "stop"


@dataclass(frozen=True)
class Reply:
    text: str
    outcome: GenerationOutcome


def eos_ids(loaded: LoadedModel) -> set[int]:
    """The token ids that end a reply: the generation config's (an int or a list) and the tokenizer's."""
    found: set[int] = set()
    config = getattr(loaded.model, "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), getattr(loaded.tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, (list, tuple)):
            found.update(int(v) for v in value if isinstance(v, int))
    return found


def context_length(loaded: LoadedModel) -> int | None:
    """The most tokens (prompt and reply together) the model takes, from its config; None if it says not."""
    config = getattr(getattr(loaded, "model", None), "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class ContextOverflow:
    """A prompt and the reply asked for that go past the model's context, with the counts to say."""

    prompt: int
    completion: int
    limit: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    @property
    def no_room(self) -> bool:
        """The prompt alone fills the context: no reply length would fit."""
        return self.prompt >= self.limit


def context_overflow(prompt_tokens: int, max_tokens: int, limit: int | None) -> ContextOverflow | None:
    """Whether ``prompt_tokens`` plus a reply of ``max_tokens`` go past the context of ``limit`` tokens
    (``context_length``; None: not known, not checked). The server's check and the chat screen's: checked
    before generating, as ``generate`` past the context fails (or worse, answers garbage)."""
    if limit is None or prompt_tokens + max_tokens <= limit:
        return None
    return ContextOverflow(prompt_tokens, max_tokens, limit)


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` may be the start of a stop string (kept until it is known)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


def _first_stop(text: str, stops: tuple[str, ...]) -> int:
    """Where the first stop string in ``text`` begins, or -1."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return min(found) if found else -1


def build_messages(history: list[dict[str, str]], system_prompt: str = "") -> list[dict[str, str]]:
    """The conversation with the system prompt first (when there is one and none is given already)."""
    messages = [dict(m) for m in history]
    if system_prompt and not (messages and messages[0].get("role") == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


class ChatTemplateRefused(LifecycleError):
    """The model's chat template refused the messages (jinja's ``raise_exception``: Gemma's templates take no
    ``system`` message, some insist on user/assistant turns). ``role``: the role it refuses, when taking that
    role's messages out makes it take the rest; ``reason``: the template's own words. The conversation is
    the caller's to change, not a failure of the model: the server answers it 400, the chat says it."""

    def __init__(self, message: str, role: str | None, reason: str) -> None:
        super().__init__(message)
        self.role = role
        self.reason = reason


class ChatTemplateFailed(LifecycleError):
    """The model's chat template failed in Python on well-formed messages (not a refusal): a fault of the
    template, which the server answers 500 and the chat says, going on. ``error``: Python's words for it."""

    def __init__(self, message: str, error: str) -> None:
        super().__init__(message)
        self.error = error


def _template_refusal(tokenizer: Any, messages: list[dict[str, str]], reason: str,
                      kwargs: dict[str, Any] | None = None) -> ChatTemplateRefused:
    """Which role the template refuses: the first (but user) whose messages, taken out, leave messages it
    takes; said with what to do instead."""
    from jinja2.exceptions import TemplateError

    from core.i18n import t

    for role in dict.fromkeys(m.get("role") for m in messages):
        rest = [m for m in messages if m.get("role") != role]
        if role == "user" or not rest:
            continue
        try:
            tokenizer.apply_chat_template(rest, add_generation_prompt=True, tokenize=False, **(kwargs or {}))
        except TemplateError:
            continue
        key = "lifecycle.template_refuses_system" if role == "system" else "lifecycle.template_refuses_role"
        return ChatTemplateRefused(t(key, role=role, reason=reason), str(role), reason)
    return ChatTemplateRefused(t("lifecycle.template_refuses", reason=reason), None, reason)


def prompt_ids(loaded: LoadedModel, messages: list[dict[str, str]]) -> Any:
    """The conversation as prompt token ids (its chat template, with the generation prompt), on the model's
    device; ``ChatTemplateRefused`` when the template raises on these messages, ``ChatTemplateFailed`` when it
    fails in Python. The template gets the run's variables (``LoadedModel.template_kwargs``: its ``thinking``),
    as training rendered its samples."""
    tokenizer = loaded.tokenizer
    kwargs = dict(getattr(loaded, "template_kwargs", None) or {})
    if getattr(tokenizer, "chat_template", None):
        from jinja2.exceptions import TemplateError

        try:
            encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                    return_dict=True, **kwargs)
        except TemplateError as exc:
            raise _template_refusal(tokenizer, messages, str(exc), kwargs) from None
        except Exception as exc:
            # Python failing inside the template (a TypeError on `content + 1`): the template's fault, on
            # messages of strings with the chat roles; said in one line, not a traceback that ends the chat.
            from core.i18n import t

            error = f"{type(exc).__name__}: {exc}"
            raise ChatTemplateFailed(t("lifecycle.template_failed", error=error), error) from exc
        ids = encoded["input_ids"]
    else:  # a base model without a template: plain text turns
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
    return ids.to(loaded.device)


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation ready to answer: its prompt token ids, the model's context (``context_length``; None:
    not known) and whether the prompt with the reply asked for goes past it (``context_overflow``)."""

    ids: Any
    limit: int | None
    overflow: ContextOverflow | None

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[-1])


def chat_prompt(loaded: LoadedModel, messages: list[dict[str, str]], max_tokens: int) -> ChatPrompt:
    """``messages`` chat-templated (``prompt_ids``: its refusals and failures raised as they are) and checked
    against the context for a reply of ``max_tokens``: the chat CLI's check of each line and the chat
    screen's of each group of side-by-side replies, before anything is generated."""
    ids = prompt_ids(loaded, messages)
    limit = context_length(loaded)
    return ChatPrompt(ids, limit, context_overflow(int(ids.shape[-1]), max_tokens, limit))


def text_prompt_ids(loaded: LoadedModel, text: str) -> Any:
    """A plain text prompt (the legacy completions API's: no chat template) as token ids on the model's device,
    with the special tokens the tokenizer adds itself (a BOS where the model expects one)."""
    return loaded.tokenizer(text, return_tensors="pt")["input_ids"].to(loaded.device)


@dataclass(frozen=True)
class Piece:
    """A piece of a reply's text as it is streamed, with the generated tokens whose text it completes (a token
    comes with the piece that carries the last of its text; one that adds none, with the next) and, when the
    stream scores them, their ``TokenScore``s."""

    text: str
    ids: tuple[int, ...] = ()
    scores: tuple[Any, ...] = ()


class TokenStreamer:
    """A ``generate`` streamer that hands out text token by token (transformers' own waits for a space).

    Text is decoded from all tokens so far and only the new suffix is emitted, as a ``Piece`` with the tokens
    since the last one (scored by ``scorer``, a ``StepScores``, when given); a suffix ending in an incomplete
    UTF-8 character (U+FFFD) waits for up to three more tokens. An end token (``ends``: ``eos_ids``) adds no
    text, even one the tokenizer does not count as special (a generation config's end token that is a plain
    token): generation ends on it, and its text is no part of the reply, streamed or not.
    """

    _END = object()

    def __init__(self, tokenizer: Any, scorer: Any = None, ends: set[int] | frozenset[int] = frozenset()) -> None:
        import queue

        self.tokenizer = tokenizer
        self.scorer = scorer
        self.ends = ends
        self.queue: queue.Queue[Any] = queue.Queue()
        self.ids: list[int] = []
        self.sent = 0
        self.pending = 0
        self.waiting: list[int] = []  # the tokens since the last piece
        self.scores: list[Any] = []  # and their scores
        self.prompt_seen = False

    def _emit(self, text: str, keep: int = 0) -> None:
        """``text`` past what was sent, as a piece with the tokens since the last one (but the ``keep`` last)."""
        given = len(self.waiting) - keep
        self.queue.put(Piece(text[self.sent:], tuple(self.waiting[:given]), tuple(self.scores[:given])))
        self.sent = len(text)
        self.waiting, self.scores = self.waiting[given:], self.scores[given:]

    def put(self, value: Any) -> None:
        if not self.prompt_seen:  # the first call carries the prompt
            self.prompt_seen = True
            return
        for token in (int(v) for v in value.reshape(-1).tolist()):
            self.ids.append(token)
            self.waiting.append(token)
            if self.scorer is not None:
                self.scores.append(self.scorer.score(token))
        text = self._text()
        self.pending += 1
        if text.endswith("\ufffd"):
            if self.pending < 4:
                return
            # A UTF-8 character spans at most 4 byte tokens: what comes before the last U+FFFD is junk bytes the
            # model really emitted, and goes; the last may be the first bytes of a character the next tokens
            # complete (after stray bytes, 80 80 80 E4 B8 AD is "���中"), so it waits with its tokens, for up to
            # three more. Sent with the junk, its character was lost: the text sent no longer grew.
            self.pending = self._unfinished(text)
            if len(text) - 1 > self.sent:
                self._emit(text[:-1], keep=self.pending)
            return
        self.pending = 0
        if len(text) > self.sent:
            self._emit(text)

    def _unfinished(self, text: str) -> int:
        """How many of the last tokens make the unfinished character that ends ``text`` (its last U+FFFD; an
        end token after them counted with them): the fewest whose text left out leaves the text before it.
        Its first bytes may be one token or several (E4 B8 of "中" decode to one U+FFFD)."""
        for keep in range(1, len(self.waiting) + 1):
            if self.tokenizer.decode(self.ids[:-keep], skip_special_tokens=True) == text[:-1]:
                return keep
        return 1

    def _text(self) -> str:
        """The reply's text so far: an end token (the last one, as generation ends on it) left out."""
        ids = self.ids[:-1] if self.ids and self.ids[-1] in self.ends else self.ids
        return self.tokenizer.decode(ids, skip_special_tokens=True) if ids else ""

    def end(self) -> None:
        text = self._text()
        if len(text) > self.sent or self.waiting:
            self._emit(text)
        self.queue.put(self._END)

    def __iter__(self) -> Iterator[Piece]:
        while True:
            item = self.queue.get()
            if item is self._END:
                return
            yield item


def local_base_folder(source: ModelSource) -> Path | None:
    """The run's base as a whole model folder on this box (config and weights: one ``--model-dir`` loads),
    or None: a base initialised at random (the bundled ``tiny``), or a hub id not downloaded here. Looks
    only, never downloads."""
    from core.assets import resolve_model_name
    from core.config.model_checks import HUB_ID, folder_problem

    value = resolve_model_name(source.base_model)
    folder: Path | None = Path(value).expanduser()
    if not folder.is_dir():
        folder = None
        if HUB_ID.match(value):
            from core.hub.local import cached_model_folder

            folder = cached_model_folder(value, source.hub)
    if folder is None or folder_problem(folder, str(folder), loaded=True) is not None:
        return None
    return folder


def refuse_base_without_adapter(source: ModelSource) -> None:
    """``tunedeck chat RUN --base`` on a run whose checkpoints hold whole models (a full fine-tune): there
    is no adapter to switch off, and answering with the fine-tuned model under the name of the base would
    mislead. Refused (exit 2) before anything loads, saying what to chat with instead: the base's own
    folder where it is on this box, else why there is none."""
    from core.errors import EXIT_USAGE
    from core.i18n import t

    if source.is_adapter:
        return
    folder = local_base_folder(source)
    if folder is not None:
        raise LifecycleError(t("lifecycle.chat_base_full", run=source.run_id, path=str(folder)), EXIT_USAGE)
    from core.assets import resolve_model_name
    from core.config.model_checks import HUB_ID

    value = resolve_model_name(source.base_model)
    if HUB_ID.match(value) and not Path(value).expanduser().exists():
        from core.hub.local import download_command

        hub = "hf" if source.hub == "huggingface" else "modelscope"
        raise LifecycleError(t("lifecycle.chat_base_full_not_here", run=source.run_id, model=source.base_model,
                               download=download_command(value, hub)), EXIT_USAGE)
    raise LifecycleError(t("lifecycle.chat_base_full_random", run=source.run_id, model=source.base_model),
                         EXIT_USAGE)


def openai_logits_processor(settings: GenerationSettings, start: int) -> Any:
    """A transformers ``LogitsProcessor`` doing OpenAI's ``logit_bias`` and its presence and frequency
    penalties (``mu[j] - c[j] * frequency - (c[j] > 0) * presence``, ``c[j]`` the times token j was generated
    so far: the ids past ``start``, the prompt's length), or None when the settings leave the logits alone.
    Applied before temperature and top_p, as OpenAI applies them."""
    if not (settings.logit_bias or settings.presence_penalty or settings.frequency_penalty):
        return None
    import torch
    from transformers import LogitsProcessor

    class _OpenAIAdjustments(LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            scores = scores.clone()
            if settings.presence_penalty or settings.frequency_penalty:
                generated = input_ids[:, start:]
                counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated,
                                                                                             dtype=scores.dtype))
                scores -= counts * settings.frequency_penalty + (counts > 0).to(scores.dtype) * settings.presence_penalty
            for token_id, bias in settings.logit_bias:
                scores[:, token_id] += bias
            return scores

    return _OpenAIAdjustments()


def _adapter_context(loaded: LoadedModel, variant: str) -> Any:
    if variant == "base" and loaded.has_adapter:
        return loaded.model.disable_adapter()
    return nullcontext()


def stream_chat(loaded: LoadedModel, messages: list[dict[str, str]], settings: GenerationSettings | None = None,
                variant: str = "tuned", stop: threading.Event | None = None,
                outcome: GenerationOutcome | None = None) -> Iterator[str]:
    """Text pieces of the reply to ``messages`` (chat-templated) as they are generated: ``stream_prompt``."""
    yield from stream_prompt(loaded, prompt_ids(loaded, messages), settings, variant, stop, outcome)


def stream_prompt(loaded: LoadedModel, ids: Any, settings: GenerationSettings | None = None,
                  variant: str = "tuned", stop: threading.Event | None = None,
                  outcome: GenerationOutcome | None = None) -> Iterator[str]:
    """Text pieces of what follows the prompt token ids ``ids`` (``prompt_ids`` of a conversation,
    ``text_prompt_ids`` of a plain prompt) as they are generated: the text of ``stream_pieces``."""
    with closing(stream_pieces(loaded, ids, settings, variant, stop, outcome)) as pieces:
        for piece in pieces:
            if piece.text:
                yield piece.text


def stream_pieces(loaded: LoadedModel, ids: Any, settings: GenerationSettings | None = None,
                  variant: str = "tuned", stop: threading.Event | None = None,
                  outcome: GenerationOutcome | None = None, top: int | None = None) -> Iterator[Piece]:
    """``Piece``s of what follows the prompt token ids ``ids`` as they are generated (``variant``: "tuned" or
    "base"): each with the tokens whose text it completes, scored (``StepScores``: each its log-probability and
    its ``top`` likeliest alternatives, as ``score_tokens`` scores a whole sequence) when ``top`` is given.
    The tokens given out in all are the reply's own: an end token (it adds no text) and those past a stop
    string left out, the one the stop string begins in kept. A piece may have no text, only tokens.

    ``outcome``, when given, receives the generated ids, the prompt length and whether an end token
    came, once the last piece has been yielded.

    ``settings.stop``: generation ends on the token that completes one of these strings (checked on the
    decoded reply, in the generating thread, so no token is generated past it); the text yielded ends
    before it. While the reply ends in what may be the start of a stop string, that part is held back, and
    its tokens with it.

    Closed before its end (a client gone mid-stream, Ctrl+C), it stops generating and waits for the
    generating thread to end before it returns: the model is shared, and a generation left running in the
    background would overlap the next one (and a base reply's switched-off adapter would outlive it)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    from core.lifecycle.scoring import StepScores

    settings = settings or GenerationSettings()
    scorer = StepScores(loaded, top) if top is not None else None
    streamer = TokenStreamer(loaded.tokenizer, scorer, eos_ids(loaded))
    stops = tuple(s for s in settings.stop if s)
    start = int(ids.shape[-1])
    window = 4 * max((len(s) for s in stops), default=0) + 8

    abandoned = threading.Event()  # the reader went away: end the generation

    class _StopFlag(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> bool:
            if abandoned.is_set() or (stop is not None and stop.is_set()):
                return True
            if not stops:
                return False
            # A stop string is looked for as the token completing it comes, so it ends in the newest one:
            # the last few tokens are decoded (up to 4 per character: byte pieces), not the whole reply
            # each time (quadratic in a long reply).
            text = loaded.tokenizer.decode(input_ids[0, max(start, input_ids.shape[-1] - window):].tolist(),
                                           skip_special_tokens=True)
            return _first_stop(text, stops) >= 0

    sample = settings.temperature > 0
    kwargs: dict[str, Any] = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "max_new_tokens": max(1, int(settings.max_tokens)),
        "do_sample": sample,
        "streamer": streamer,
        "stopping_criteria": StoppingCriteriaList([_StopFlag()]),
        "pad_token_id": loaded.tokenizer.pad_token_id,
    }
    adjustments = openai_logits_processor(settings, start)
    if adjustments is not None:
        from transformers import LogitsProcessorList

        kwargs["logits_processor"] = LogitsProcessorList([adjustments])
    if sample:
        kwargs.update(temperature=float(settings.temperature), top_p=float(settings.top_p))
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    errors: list[BaseException] = []
    outcome = outcome if outcome is not None else GenerationOutcome()
    outcome.prompt_tokens = int(ids.shape[-1])
    outcome.max_tokens = kwargs["max_new_tokens"]

    def run() -> None:
        try:
            if settings.seed is not None:
                torch.manual_seed(settings.seed)
            with torch.no_grad(), _adapter_context(loaded, variant), scorer or nullcontext():
                sequences = loaded.model.generate(**kwargs)
            outcome.ids = [int(v) for v in sequences[0, ids.shape[-1]:].tolist()]
        except BaseException as exc:  # surfaced to the caller after the stream ends
            errors.append(exc)
            streamer.end()

    thread = threading.Thread(target=run, daemon=True, name="tunedeck-generate")
    thread.start()
    text, sent, ended = "", 0, False
    # The tokens not given out yet, each with the reply's length once its text is whole, and the length
    # reached by those given out: a token goes out with the piece that reaches its end.
    held: list[tuple[int, int, Any]] = []
    reached = 0

    def taken(upto: int, cut: bool = False) -> tuple[tuple[int, ...], tuple[Any, ...]]:
        """The held tokens whose text ends by ``upto`` (``cut``: those that begin before it, the fewest whose
        text reaches it), taken out of ``held``. The tokens of one piece share its end (the first ones add no
        text, or a character's first bytes): with ``cut`` they are taken together, as the last carries the
        text they begin."""
        nonlocal reached
        count = 0
        for end, _token, _score in held:
            if (reached >= upto and not (count and end == reached)) if cut else (end > upto):
                break
            reached = end
            count += 1
        out = held[:count]
        del held[:count]
        return tuple(token for _, token, _ in out), tuple(score for _, _, score in out if score is not None)

    try:
        for piece in streamer:
            if ended:
                continue  # past a stop string: the rest of the stream is read and dropped
            text += piece.text
            held.extend((len(text), token, piece.scores[n] if piece.scores else None)
                        for n, token in enumerate(piece.ids))
            if not piece.text:
                continue  # the tokens at the end that add no text: given out below, an end token left out
            safe = len(text)
            if stops:
                cut = _first_stop(text, stops)
                if cut >= 0:
                    ended = outcome.hit_stop = True
                    tokens, scores = taken(cut, cut=True)
                    if cut > sent or tokens:
                        yield Piece(text[sent:cut], tokens, scores)
                    continue
                safe -= _held_back(text, stops)
            tokens, scores = taken(safe)
            if safe > sent or tokens:
                yield Piece(text[sent:safe], tokens, scores)
                sent = safe
        if not ended:  # held back, and no stop string came; an end token that ends it adds no text
            if held and held[-1][1] in eos_ids(loaded):
                held.pop()
            tokens, scores = taken(len(text))
            if len(text) > sent or tokens:
                yield Piece(text[sent:], tokens, scores)
    finally:  # closed early (GeneratorExit), or an error: the generation ends with the reader
        if thread.is_alive():
            abandoned.set()
        thread.join()
    if errors:
        raise errors[0]
    # A batch of one is never padded: the ids end where the model stopped, on its end token or not.
    outcome.hit_eos = bool(outcome.ids) and outcome.ids[-1] in eos_ids(loaded)
    outcome.done = True


def generate_reply(loaded: LoadedModel, messages: list[dict[str, str]], settings: GenerationSettings | None = None,
                   variant: str = "tuned", stop: threading.Event | None = None) -> Reply:
    """The whole reply with its ``GenerationOutcome`` (generated ids, prompt length, finish reason);
    ``stop``, once set, ends the generation at the next token (the reply so far is returned)."""
    return generate_from_prompt(loaded, prompt_ids(loaded, messages), settings, variant, stop)


def generate_from_prompt(loaded: LoadedModel, ids: Any, settings: GenerationSettings | None = None,
                         variant: str = "tuned", stop: threading.Event | None = None) -> Reply:
    """``generate_reply`` for prompt token ids already made (``prompt_ids``, ``text_prompt_ids``)."""
    outcome = GenerationOutcome()
    text = "".join(stream_prompt(loaded, ids, settings, variant, stop=stop, outcome=outcome))
    return Reply(text, outcome)


def complete_chat(loaded: LoadedModel, messages: list[dict[str, str]], settings: GenerationSettings | None = None,
                  variant: str = "tuned") -> tuple[str, int, int]:
    """(reply text, prompt tokens, completion tokens) without streaming; tokens counted from the ids."""
    reply = generate_reply(loaded, messages, settings, variant)
    return reply.text, reply.outcome.prompt_tokens, reply.outcome.completion_tokens
