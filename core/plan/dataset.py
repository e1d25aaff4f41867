"""What the planner needs to know about the data: records, token lengths, a length histogram."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from core.errors import EXIT_USAGE, TunedeckError

HISTOGRAM_BINS = 8


class NothingToTrain(TunedeckError, ValueError):
    """The plan's sequence length cuts every record before its answer: a run would train on nothing."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class DatasetSummary:
    """Records and token lengths of a local data file (``exact`` False: counted without a tokenizer), and each
    record's target count: the tokens the loss is computed for (its labelled answer; ``targets`` empty: not counted)."""

    path: str
    format: str | None
    records: int
    issues: int
    lengths: tuple[int, ...] = field(default=(), repr=False)
    exact: bool = False
    targets: tuple[int, ...] = field(default=(), repr=False)
    # the rows that could not be read, as ``data check`` lists them (file:line: what is wrong), first ones
    problems: tuple[str, ...] = field(default=(), repr=False)
    # entries whose rows are on a hub (``owner/name``): not read, so nothing is measured (``measured``)
    on_hub: tuple[str, ...] = ()
    # of ``issues``, the problems of a whole file (an empty one, one of no known format), not of a row in it
    file_issues: int = 0
    # the run key ``thinking`` the tokens were counted with (the chat template's enable_thinking; None: unset)
    thinking: bool | None = None
    # files of a folder not read: named for another split than the one read (a test.jsonl beside train.jsonl)
    left_out: tuple[str, ...] = ()
    _cuts: dict[tuple[int | None, str], tuple[int, int]] = field(default_factory=dict, repr=False, compare=False)
    # cut_records by seq_len: asked of every candidate plan (warn_overlong_drop), a pass over every record each
    _longer: dict[int, tuple[int, int]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def measured(self) -> bool:
        """The records and lengths are the data's: no entry of it was left unread on a hub."""
        return not self.on_hub

    def listed_problems(self) -> str:
        """The rows that could not be read, one indented line each, and how many more: as ``data check`` says them."""
        from core.i18n import t

        listed = "\n".join(f"  {problem}" for problem in self.problems)
        if self.issues > len(self.problems):
            listed += "\n  " + t("data.more_issues", count=self.issues - len(self.problems))
        return listed

    def nothing_to_plan(self, name: str) -> str | None:
        """Why no plan can be made of this data (read, and not one usable record: an empty file, or every row
        broken), naming it ``name`` as the user gave it; None when there is something to plan for."""
        from core.i18n import t

        if not self.measured or self.records:
            return None
        return t("plan.error.dataset_empty", path=name, problems=self.listed_problems())

    @property
    def total_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def p95(self) -> int:
        if not self.lengths:
            return 0
        ordered = sorted(self.lengths)
        return ordered[min(len(ordered), max(1, math.ceil(0.95 * len(ordered)))) - 1]

    def target_share(self, seq_len: int | None = None, overlong: str = "cut") -> float | None:
        """The share of the tokens a step reads that have a target (the rows the engine's LM head reads), each
        record cut to ``seq_len`` as the engine cuts it, or left out with ``overlong="drop"``
        (``trained_tokens``). None: not counted."""
        if not self.targets or len(self.targets) != len(self.lengths):
            return None
        tokens, kept = self._cut(seq_len, overlong)
        return kept / tokens if tokens else None

    def trained_tokens(self, seq_len: int | None = None, overlong: str = "cut") -> int:
        """The tokens one pass over the data reads: each record cut to its first ``seq_len`` tokens, as the engine
        cuts it (``core.data.tokenize_dataset``), or with ``overlong="drop"`` a record longer than that left out
        whole, as the engine leaves it out; a record the cut leaves without a target dropped, as the engine drops
        it; packing (``pack_examples``) joins the kept records into rows, the same tokens. Without target counts
        every record the length keeps stays. What a run's time and cost follow, not ``total_tokens``: a
        5M-character row at a 128-token sequence is 128 tokens of work (cut), or none (drop)."""
        if not self.targets or len(self.targets) != len(self.lengths):
            if not seq_len:
                return self.total_tokens
            if overlong == "drop":
                return sum(n for n in self.lengths if n <= seq_len)
            return sum(min(n, seq_len) for n in self.lengths)
        return self._cut(seq_len, overlong)[0]

    def _cut(self, seq_len: int | None, overlong: str = "cut") -> tuple[int, int]:
        """(tokens, targets) left of the records the engine keeps at ``seq_len``: it keeps a record's start, so a
        cut takes its end, where a record's answer is, targets first (exact for one-answer chats and text;
        multi-turn chats lose earlier answers less); ``overlong="drop"`` keeps only the records that fit whole.
        Remembered per ``seq_len``: the planner asks for each plan."""
        if (seq_len, overlong) in self._cuts:
            return self._cuts[(seq_len, overlong)]
        kept_records = self._kept(seq_len, overlong)
        tokens, kept = sum(n for n, _left in kept_records), sum(left for _n, left in kept_records)
        self._cuts[(seq_len, overlong)] = (tokens, kept)
        return tokens, kept

    def _kept(self, seq_len: int | None, overlong: str = "cut") -> list[tuple[int, int]]:
        """(tokens, targets) of each record the engine keeps at ``seq_len``, in order: cut to its first ``seq_len``
        tokens, or left out with ``overlong="drop"``; one the cut leaves without a target dropped (where targets
        are counted; without them every record the length keeps stays, its targets 0)."""
        counted = bool(self.targets) and len(self.targets) == len(self.lengths)
        out: list[tuple[int, int]] = []
        for i, length in enumerate(self.lengths):
            cut = max(0, length - seq_len) if seq_len else 0
            if cut and overlong == "drop":
                continue
            left = max(0, self.targets[i] - cut) if counted else 0
            if counted and not left:
                continue
            out.append((length - cut, left))
        return out

    def trained_rows(self, seq_len: int | None, overlong: str = "cut", eval_split: float = 0.0,
                     packing: bool = False, seed: int = 42) -> int:
        """The rows an epoch of the run trains, as its trainer makes them: the records it keeps at ``seq_len``
        (``_kept``), less those ``split_eval`` holds out for ``eval_split`` (its own seeded choice), joined into
        rows as ``pack_examples`` packs them with ``packing``. ``records`` where the lengths are not counted."""
        from core.train.data_adapter import held_out, packed_rows

        if len(self.lengths) != self.records:
            return self.records
        kept = [n for n, _left in self._kept(seq_len, overlong)]
        held = held_out(len(kept), eval_split, seed)
        train = [n for i, n in enumerate(kept) if i not in held]
        return len(packed_rows(train, seq_len)) if packing and seq_len else len(train)

    def cut_records(self, seq_len: int) -> tuple[int, int]:
        """(records longer than ``seq_len``, which the engine cuts to their first ``seq_len`` tokens; of those,
        the ones the cut leaves without a target, which it drops: 0 where targets are not counted). With
        ``overlong: drop`` the first count is the records the engine leaves out whole."""
        if seq_len not in self._longer:
            longer = [i for i, length in enumerate(self.lengths) if length > seq_len]
            counted = bool(self.targets) and len(self.targets) == len(self.lengths)
            dropped = sum(1 for i in longer if self.targets[i] <= self.lengths[i] - seq_len) if counted else 0
            self._longer[seq_len] = (len(longer), dropped)
        return self._longer[seq_len]

    def shortest_keeping_an_answer(self) -> int | None:
        """The shortest sequence length at which some record keeps a target after the cut (the engine keeps each
        record's first tokens, ``cut_records``); None where targets are not counted or no record has one."""
        if not self.targets or len(self.targets) != len(self.lengths):
            return None
        needs = [length - targets + 1 for length, targets in zip(self.lengths, self.targets, strict=True) if targets]
        return min(needs, default=None)

    def no_answer_left(self, name: str, seq_len: int, positions: int | None = None,
                       overlong: str = "cut") -> str | None:
        """Why a run at ``seq_len`` would train nothing: every record is cut before its answer, so the engine
        drops them all (``tokenize_dataset``), or with ``overlong="drop"`` every record is longer than ``seq_len``
        and left out; what to do, naming the data ``name``. None when some record keeps an answer, or targets are
        not counted (cut). ``positions``: the most the model takes (raising past it is no way out)."""
        from core.i18n import t

        if overlong == "drop" and self.records and self.lengths and min(self.lengths) > seq_len:
            return t("plan.error.all_overlong", path=name, count=self.records, seq=seq_len, need=min(self.lengths))
        need = self.shortest_keeping_an_answer()
        if need is None or need <= seq_len or not self.records:
            return None
        if positions is not None and need > positions:
            return t("plan.error.no_answer_left_positions", path=name, count=self.records, seq=seq_len, need=need,
                     positions=positions)
        return t("plan.error.no_answer_left", path=name, count=self.records, seq=seq_len, need=need)

    @cached_property
    def max_length(self) -> int:
        return max(self.lengths, default=0)

    def histogram(self, bins: int = HISTOGRAM_BINS) -> list[tuple[int, int, int]]:
        """(low, high, count) bins of equal width over the token lengths, at most ``bins`` of them: the last
        one ends at the longest record (a rounded-up width fills the range in fewer bins; none is drawn past it)."""
        if not self.lengths:
            return []
        low, high = min(self.lengths), max(self.lengths)
        width = max(1, math.ceil((high - low + 1) / bins))
        counts = [0] * math.ceil((high - low + 1) / width)
        for n in self.lengths:
            counts[(n - low) // width] += 1
        return [(low + i * width, min(high, low + (i + 1) * width - 1), c) for i, c in enumerate(counts)]

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "records": self.records, "issues": self.issues,
                "total_tokens": self.total_tokens, "p95_tokens": self.p95, "max_tokens": self.max_length,
                "exact": self.exact, "target_tokens": sum(self.targets) if self.targets else None,
                "problems": list(self.problems), "on_hub": list(self.on_hub), "left_out": list(self.left_out),
                "histogram": [{"low": lo, "high": hi, "count": c} for lo, hi, c in self.histogram()]}


def summarise_dataset(path: str | Path, model: str | None = None, thinking: bool | None = None, *,
                      dataset_info: str | None = None, dataset_dir: str | None = None) -> DatasetSummary:
    """Read the run's ``dataset`` value ``path`` as ``train`` reads it (a file, a folder, a comma list, ``~``,
    ``#N`` sampled with the run's default seed) and measure its samples; tokens are exact when ``model`` is
    a local folder with a tokenizer, else approximate; ``thinking``: the run key, the chat template's
    enable_thinking the samples are rendered with (a Qwen3 template's empty think block before each answer with
    false), as the run renders them. A value naming hub data is not read (no statistics:
    ``on_hub``). ``dataset_info``, ``dataset_dir``: the run file's keys its names are looked up with (``plan
    --config``). Raises ``DataError`` when an entry names nothing or cannot be read at all."""
    from core.config.schema import default_for
    from core.data.loading import read_local_data

    loaded, on_hub = read_local_data(str(path), seed=int(default_for("seed")), dataset_info=dataset_info,
                                     dataset_dir=dataset_dir)
    if on_hub:
        return DatasetSummary(str(path), None, 0, 0, on_hub=tuple(on_hub), thinking=thinking)
    records = loaded.records
    counts: list[tuple[int, int]] | None = None
    exact = False
    if model and records:
        counts = _exact_counts(records, model, thinking)
        exact = counts is not None
    if counts is None:
        counts = approximate_counts(records)
    return DatasetSummary(str(path), loaded.format, len(records), loaded.issue_count,
                          tuple(n for n, _ in counts), exact, tuple(k for _, k in counts),
                          tuple(str(issue) for issue in loaded.issues),
                          file_issues=sum(1 for i in loaded.issues if i.line is None and i.row is None),
                          thinking=thinking, left_out=tuple(loaded.left_out))


def approximate_counts(records: list[Any]) -> list[tuple[int, int]]:
    """Lengths without a tokenizer (``core.data.stats.approximate_lengths``), and targets as the share of those
    tokens in what is trained on, weighed the same way: a conversation's answers the data does not exclude (with
    the tool calls they make), a text's text after its prompt."""
    from core.data.records import TextRecord
    from core.data.stats import approximate_lengths, approximate_token_weight

    counts = []
    for record, length in zip(records, approximate_lengths(records), strict=True):
        whole = max(1.0, approximate_token_weight(record.approx_text()))
        if isinstance(record, TextRecord):
            trained = approximate_token_weight(record.text)
        else:
            # an answer's content and its tool calls: an answer that only calls a tool trains on the call
            trained = sum(approximate_token_weight(m.content)
                          + sum(approximate_token_weight(call) for call in m.call_texts())
                          for m in record.messages if m.trained)
        targets = min(length, max(1, round(length * trained / whole))) if trained else 0
        counts.append((length, targets))
    return counts


def _exact_counts(records: list[Any], model: str, thinking: bool | None = None) -> list[tuple[int, int]] | None:
    """Token lengths and targets with the model's own tokenizer (its chat template given the run's ``thinking``),
    or None when it is not on this machine."""
    from core.data.stats import load_tokenizer
    from core.data.tokenize import template_kwargs, token_counts

    # Two tries: transformers' lazy module can fail an import made while another thread is importing it.
    for attempt in range(2):
        try:
            return token_counts(records, load_tokenizer(model), kwargs=template_kwargs(thinking))
        except ImportError:
            if attempt:
                return None
        except Exception:  # no local tokenizer (a hub id not downloaded): approximate instead
            return None
    return None
