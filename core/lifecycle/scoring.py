"""Scoring text: each token's log-probability given the tokens before it, and the likeliest alternatives.

What the legacy completions API's ``echo`` + ``logprobs`` return, and what lm-evaluation-harness's
loglikelihood tasks (multiple choice) read from them: one forward pass over the whole sequence, the model's
own distribution (``log_softmax`` of its logits, before any temperature or top-p). A stream's generated tokens
are scored as they come, from the logits ``generate`` computes anyway (``StepScores``), the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from core.lifecycle.source import LoadedModel

SCORE_ROWS = 256  # positions turned into full-vocabulary log-probabilities at a time (a row is vocab floats)


@dataclass(frozen=True)
class TokenScore:
    """One token of a scored sequence: its id, its log-probability given the tokens before it (None for the
    first: nothing before it predicts it) and the ``top`` likeliest ids at its place, likeliest first."""

    id: int
    logprob: float | None
    top: tuple[tuple[int, float], ...]


def score_tokens(loaded: LoadedModel, ids: Any, top: int, variant: str = "tuned") -> list[TokenScore]:
    """Each token of ``ids`` (a 1 x n tensor on the model's device) scored by the model (``variant``:
    "tuned", or "base" with the adapter switched off), with its ``top`` likeliest alternatives."""
    import torch

    from core.lifecycle.chat import _adapter_context

    row = ids[0]
    with torch.no_grad(), _adapter_context(loaded, variant):
        logits = loaded.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
    scores = [TokenScore(int(row[0]), None, ())]
    with torch.no_grad():
        for start in range(0, int(row.shape[0]) - 1, SCORE_ROWS):
            # the logits at position i predict token i + 1; the last position predicts past the sequence
            rows = torch.log_softmax(logits[start:min(start + SCORE_ROWS, row.shape[0] - 1)].float(), dim=-1)
            scores.extend(scored(rows, row[start + 1:start + 1 + rows.shape[0]], top))
    return scores


def scored(rows: Any, targets: Any, top: int) -> list[TokenScore]:
    """Each of ``targets`` (n token ids) scored by its row of ``rows`` (n x vocab log-probabilities: the
    distribution it was drawn from), with the ``top`` likeliest ids of that row."""
    chosen = rows.gather(1, targets[:, None])[:, 0].tolist()
    values, indices = rows.topk(min(top, rows.shape[-1]), dim=-1)
    return [TokenScore(int(target), float(logprob), tuple(zip(top_ids, top_values, strict=True)))
            for target, logprob, top_values, top_ids in zip(targets.tolist(), chosen, values.tolist(),
                                                            indices.tolist(), strict=True)]


class StepScores:
    """Each token ``generate`` produces scored as ``score_tokens`` scores it, as it comes (a stream's logprobs):
    the model's own logits of each step, caught as its forward returns them (a forward hook: before any logits
    processor, penalty, temperature or top_p), paired in order with the tokens the streamer is handed
    (``score``). Entered around ``generate``, in its thread; the model's forward is hooked only meanwhile."""

    def __init__(self, loaded: LoadedModel, top: int) -> None:
        from collections import deque

        model = loaded.model
        # a PEFT model's generate runs the transformers model inside it: its forward returns the logits
        self.module = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.top = top
        self.rows: deque[Any] = deque()  # one step's log-probabilities each, not yet paired with its token
        self.handle: Any = None

    def _caught(self, _module: Any, _args: Any, output: Any) -> None:
        import torch

        logits = output.logits if hasattr(output, "logits") else output[0]
        with torch.no_grad():
            self.rows.append(torch.log_softmax(logits[0, -1].float(), dim=-1))

    def __enter__(self) -> StepScores:
        self.handle = self.module.register_forward_hook(self._caught)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.handle.remove()
        self.rows.clear()

    def score(self, token: int) -> TokenScore:
        """The next generated token's score: by the oldest step not yet paired (a streamer may be handed
        a token one step late, after the next forward has run)."""
        import torch

        row = self.rows.popleft()
        return scored(row[None], torch.tensor([int(token)], device=row.device), self.top)[0]


CONTEXT_TOKENS = 8  # the tokens before one that its text is read after (a word's start, a merged space)


def token_texts(tokenizer: Any, ids: list[int], skip_special: bool = False, before: Any = ()) -> list[str]:
    """Each token's text as it reads in its place (a special token as its name, or "" with ``skip_special``),
    ``before``: the tokens that came before the first (a stream's earlier chunks'). A token decoded alone
    loses what its neighbours give it: SentencePiece's word-initial space (Llama 2, Mistral, Gemma decode
    "▁world" alone as "world"), GPT-2's clean-up of " ." to "."; so its text is the decode of the few
    tokens before it and itself less the decode of those before it, as the reply's own decode reads them,
    and the texts join into the reply. A token holding part of a character (byte pieces) keeps its own
    text, U+FFFD (its ``bytes`` are its own: ``token_bytes``)."""
    window = [int(i) for i in before][-CONTEXT_TOKENS:]
    texts = []
    for token_id in ids:
        texts.append(token_text(tokenizer, int(token_id), window, skip_special))
        window = [*window, int(token_id)][-CONTEXT_TOKENS:]
    return texts


def token_text(tokenizer: Any, token_id: int, window: list[int], skip_special: bool = False) -> str:
    """One token's text after the tokens ``window`` (``token_texts``); its text alone where nothing is
    before it, or where the window's text is not where the decode with it begins (a character completed
    by this token, a clean-up across the two), or where it adds nothing to an unfinished character (a middle
    byte: its text read in place was "", its ``bytes`` none, and a client could not join the character)."""
    alone = tokenizer.decode([token_id], skip_special_tokens=skip_special)
    if not window:
        return alone
    prior = tokenizer.decode(window, skip_special_tokens=skip_special)
    whole = tokenizer.decode([*window, token_id], skip_special_tokens=skip_special)
    if not whole.startswith(prior) or "\ufffd" in whole[len(prior):]:
        return alone
    if whole == prior and "\ufffd" in alone:  # a middle byte of a character (B8 of E4 B8 AD "中"): its own
        return alone
    return whole[len(prior):]


def token_bytes(tokenizer: Any, token_id: int, text: str) -> list[int]:
    """A token's own bytes, as OpenAI's ``bytes`` gives them (``text``: the token's text as shown): a token
    holding part of a character that spans several tokens comes as its bytes, not as the U+FFFD its text
    shows, so a client joins them back into the character. Read from the vocabulary of a byte-level BPE
    (GPT-2's, Qwen's, Llama 3's) or a SentencePiece byte token (``<0xNN>``); any other token (a special one,
    a tokenizer of another kind), and any token whose text is whole (no U+FFFD: read in its place, it may hold
    a space its vocabulary entry does not, or lack one a clean-up took), is its text's UTF-8."""
    import re

    if "\ufffd" not in text or int(token_id) in (getattr(tokenizer, "added_tokens_decoder", None) or {}):
        return list(text.encode("utf-8"))
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if isinstance(piece, str):
        byte = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece)
        if byte:
            return [int(byte.group(1), 16)]
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        table = _byte_level_table()
        if "ByteLevel" in type(decoder).__name__ + repr(decoder) and all(c in table for c in piece):
            return [table[c] for c in piece]
    return list(text.encode("utf-8"))


@cache
def _byte_level_table() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's ``bytes_to_unicode``): the character each byte is written as."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars
