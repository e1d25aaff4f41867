"""Datasets for the trainer: records in, token ids and loss labels out.

The dataset formats, validation and tokenisation belong to ``core.data``; this adapter calls it and only
turns its ``Tokenized`` result into what ``transformers.Trainer`` consumes (rows of ids/labels, an eval
split, optional packing and a padding collator).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

IGNORE_INDEX = -100


@dataclass
class TrainingExamples:
    train: list[dict[str, list[int]]]
    eval: list[dict[str, list[int]]] = field(default_factory=list)
    truncated_samples: int = 0
    dropped_tokens: int = 0
    total_tokens: int = 0
    skipped: int = 0  # examples with nothing to learn from (no assistant token left)
    overlong_dropped: int = 0  # examples longer than max_seq_len left out (overlong: drop)
    cut_no_answer: int = 0  # examples the cut to max_seq_len left without their answer: left out
    cut_no_answer_origins: list[str] = field(default_factory=list)  # the first few of them, file:line
    untrained_origins: list[str] = field(default_factory=list)  # the first few skipped, not cut_no_answer ones

    @property
    def untrained(self) -> int:
        """Examples left out as the data gives them nothing to train on (every assistant turn at weight 0)."""
        return self.skipped - self.cut_no_answer


def load_records(datasets: Sequence[str] | str, hub: str = "modelscope", cfg: dict[str, Any] | None = None
                 ) -> list[Any]:
    """Every record of the run's datasets (``core.data``; raises its ``DataError`` listing the problems).

    ``cfg``: the run's configuration, for ``dataset_info``, ``dataset_dir``, ``split`` and the ``seed``
    that ``#N`` sampling draws with."""
    from core.data import load_training_records

    cfg = cfg or {}
    return load_training_records(
        datasets if isinstance(datasets, str) else list(datasets), hub=hub,
        dataset_info=cfg.get("dataset_info"), dataset_dir=cfg.get("dataset_dir"), split=cfg.get("split"),
        seed=int(cfg["seed"]) if cfg.get("seed") is not None else 42,
    )


def tokenize_records(records: list[Any], tokenizer: Any, max_seq_len: int, loss_on: str,
                     overlong: str = "cut", thinking: bool | None = None) -> TrainingExamples:
    """Token ids and labels (-100 = no loss) for each record, truncation counted (``core.data``); a record
    longer than ``max_seq_len`` is cut to its start, or left out with ``overlong="drop"`` (counted too).
    ``thinking``: the run's, given to the chat template as ``enable_thinking`` (None: not given)."""
    from core.data import tokenize_dataset
    from core.data.tokenize import template_kwargs

    result = tokenize_dataset(records, tokenizer, max_seq_len, loss_on=loss_on, overlong=overlong,
                              kwargs=template_kwargs(thinking))
    examples = [
        {"input_ids": list(ids), "labels": list(labels)}
        for ids, labels in zip(result.input_ids, result.labels, strict=True)
        if len(ids) > 0
    ]
    return TrainingExamples(
        train=examples,
        truncated_samples=int(result.truncated),
        dropped_tokens=int(result.tokens_dropped),
        total_tokens=sum(len(e["input_ids"]) for e in examples),
        skipped=int(result.skipped),
        overlong_dropped=int(result.overlong_dropped),
        cut_no_answer=int(result.cut_no_answer),
        cut_no_answer_origins=list(result.cut_no_answer_origins),
        untrained_origins=list(result.untrained_origins),
    )


def held_out(count: int, fraction: float, seed: int) -> set[int]:
    """The positions of ``count`` examples that ``split_eval`` holds out for evaluation (at least one when asked
    for any, none of fewer than two), seeded: also what ``plan`` counts of a run's steps."""
    if fraction <= 0 or count < 2:
        return set()
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return set(order[:max(1, int(round(count * fraction)))])


def split_eval(examples: TrainingExamples, fraction: float, seed: int) -> TrainingExamples:
    """Hold out ``fraction`` of the examples (at least one when asked for any) for evaluation, seeded."""
    held = held_out(len(examples.train), fraction, seed)
    if not held:
        return examples
    examples.eval = [e for i, e in enumerate(examples.train) if i in held]
    examples.train = [e for i, e in enumerate(examples.train) if i not in held]
    return examples


def packed_rows(lengths: Sequence[int], max_seq_len: int) -> list[list[int]]:
    """The positions of the examples each packed row holds: whole examples in order, a new row where the next
    would pass ``max_seq_len`` tokens (``pack_examples``'s rows; ``plan`` counts a packed run's steps with it)."""
    rows: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(lengths):
        if current and used + n > max_seq_len:
            rows.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        rows.append(current)
    return rows


def pack_examples(examples: list[dict[str, list[int]]], max_seq_len: int) -> list[dict[str, list[int]]]:
    """Greedy packing of whole examples into rows of at most ``max_seq_len`` tokens (``packed_rows``).

    ``position_ids`` restart at each example: they are what keeps the examples apart. The collator passes
    them without an attention mask, and transformers then builds a block-causal mask from them (SDPA /
    eager: ``masking_utils.find_packed_sequence_indices``; flash-attention: varlen over one flattened
    row), so no token attends to another example and each example is trained exactly as if alone.
    """
    rows: list[dict[str, list[int]]] = []
    for members in packed_rows([len(ex["input_ids"]) for ex in examples], max_seq_len):
        current: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": []}
        for i in members:
            ex = examples[i]
            current["input_ids"] += ex["input_ids"]
            # The first token of each packed example must not be predicted from the previous example.
            current["labels"] += [IGNORE_INDEX] + ex["labels"][1:]
            current["position_ids"] += list(range(len(ex["input_ids"])))
        rows.append(current)
    return rows


class PaddingCollator:
    """Batches rows for the Trainer.

    Plain rows: padded to the batch's longest (a multiple of ``multiple_of``) with pad id / -100 /
    attention 0. Packed rows (they carry ``position_ids``): no attention mask, so that transformers
    separates the examples by their restarting positions; the padding at a row's end gets positions
    0, 1, ... of its own (a separate, loss-free segment). With ``flatten`` (flash-attention, whose varlen
    path needs one row) the whole micro-batch becomes a single row without any padding.

    With ``target_rows`` the batch also carries ``target_rows``: the flat indices (row x width + position) of
    the positions that predict a labelled token, counted here on the host. The run's own loss
    (``core.train.fused_loss``, ``fused_ce: chunked | triton``) takes the LM head over those rows only: the
    prompt, the padding and each row's last position cost no LM-head work, and no device synchronisation
    finds them (the tensor's length is known to the host). The trainer removes the key before the model runs.
    """

    def __init__(self, pad_token_id: int, multiple_of: int = 1, flatten: bool = False,
                 target_rows: bool = False) -> None:
        self.pad_token_id = pad_token_id
        self.multiple_of = max(1, multiple_of)
        self.flatten = flatten
        self.target_rows = target_rows

    def __call__(self, batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        out = self._packed(batch) if all("position_ids" in row for row in batch) else self._plain(batch)
        if self.target_rows:
            from core.train.fused_loss import TARGET_ROWS, target_rows

            out[TARGET_ROWS] = target_rows(out["labels"])
        return out

    def _plain(self, batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        import torch

        longest = max(len(row["input_ids"]) for row in batch)
        width = -(-longest // self.multiple_of) * self.multiple_of
        input_ids, labels, attention = [], [], []
        for row in batch:
            pad = width - len(row["input_ids"])
            input_ids.append(row["input_ids"] + [self.pad_token_id] * pad)
            labels.append(row["labels"] + [IGNORE_INDEX] * pad)
            attention.append([1] * len(row["input_ids"]) + [0] * pad)
        return {
            "input_ids": torch.tensor(input_ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "attention_mask": torch.tensor(attention, dtype=torch.long),
        }

    def _packed(self, batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        import torch

        if self.flatten:
            batch = [{key: [v for row in batch for v in row[key]] for key in ("input_ids", "labels", "position_ids")}]
            width = len(batch[0]["input_ids"])
        else:
            longest = max(len(row["input_ids"]) for row in batch)
            width = -(-longest // self.multiple_of) * self.multiple_of
        input_ids, labels, positions = [], [], []
        for row in batch:
            pad = width - len(row["input_ids"])
            input_ids.append(row["input_ids"] + [self.pad_token_id] * pad)
            labels.append(row["labels"] + [IGNORE_INDEX] * pad)
            positions.append(row["position_ids"] + list(range(pad)))
        return {
            "input_ids": torch.tensor(input_ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "position_ids": torch.tensor(positions, dtype=torch.long),
        }
