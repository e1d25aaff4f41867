"""Scoring text: each token's log-probability given the tokens before it, and the likeliest alternatives.

What the legacy completions API's ``echo`` + ``logprobs`` return, and what lm-evaluation-harness's
loglikelihood tasks (multiple choice) read from them: one forward pass over the whole sequence, the model's
own distribution (``log_softmax`` of its logits, before any temperature or top-p).
"""

from __future__ import annotations

from dataclasses import dataclass
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
            targets = row[start + 1:start + 1 + rows.shape[0]]
            chosen = rows.gather(1, targets[:, None])[:, 0].tolist()
            values, indices = rows.topk(min(top, rows.shape[-1]), dim=-1)
            for target, logprob, top_values, top_ids in zip(targets.tolist(), chosen, values.tolist(),
                                                            indices.tolist(), strict=True):
                scores.append(TokenScore(int(target), float(logprob),
                                         tuple(zip(top_ids, top_values, strict=True))))
    return scores


def token_texts(tokenizer: Any, ids: list[int], skip_special: bool = False) -> list[str]:
    """Each token's own text (a special token as its name, or "" with ``skip_special``)."""
    return [tokenizer.decode([int(i)], skip_special_tokens=skip_special) for i in ids]
