"""``check_data``: what a data file holds, what is wrong with it, and how long its samples are."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.data.issues import DEFAULT_MAX_ISSUES, DataError, DataIssue
from core.data.loading import read_local_data
from core.data.records import Conversation, Record
from core.i18n import Message, t

APPROX_CHARS_PER_TOKEN = 4
# Without a tokenizer a wide character (Chinese, Japanese, Korean: two terminal cells) counts as one token:
# BPE tokenizers give such text about one token a character (Qwen2.5 ~0.7, Llama-3 ~1, Llama-2 more), where
# English averages four characters a token. Counted as characters / 4, Chinese data read 3-4x short, and
# the plan's sequence length, cut to the data's 95th percentile, truncated most records unannounced.
APPROX_TOKENS_PER_WIDE_CHAR = 1
# ``check_data`` with a tokenizer reads at most this many characters of one record: memory and time grow
# with the text a tokenizer is given (a 50 MB message took 10 GB and 90 s), and no run uses more than its
# max_seq_len tokens of a record. A token is seldom more than 16 characters, hence the margin; the floor
# keeps every ordinary record exact whatever --max-seq-len says.
CAP_CHARS_PER_TOKEN = 16
CAP_CHARS_FLOOR = 1_000_000


@dataclass
class LengthStats:
    """Token lengths of the samples; ``exact`` is False when counted without a tokenizer (``approximate_tokens``)."""

    count: int
    min: int
    mean: float
    p50: int
    p95: int
    max: int
    exact: bool
    method: str  # "tokenizer: <name>" or "approximate: characters / 4, …"
    over_max: int | None = None  # samples longer than max_seq_len, when given
    max_seq_len: int | None = None
    overlong: str = "cut"  # what a run does with those samples: cut them, or drop them (the run key)
    thinking: bool | None = None  # the run key the conversations were rendered with (None: the template's default)
    # of ``over_max``, the samples a cut to max_seq_len leaves without their answer (the run leaves them out), and
    # where the first one is; None: not counted (no tokenizer, no max_seq_len)
    cut_no_answer: int | None = None
    cut_no_answer_first: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class DataReport:
    """The result of checking a data file."""

    path: str
    format: str | None
    records: int  # good records
    rows: int  # rows seen, good and bad
    issues: list[DataIssue] = field(default_factory=list)
    more_issues: int = 0
    conversations: int = 0
    text_records: int = 0
    turns: int = 0  # assistant turns over all conversations
    untrained_turns: int = 0  # assistant turns the data excludes from the loss (weight 0, loss false)
    with_tools: int = 0
    lengths: LengthStats | None = None
    # records cut before tokenising (``capped_token_lengths``): (where, characters, tokens counted)
    capped: list[tuple[str, int, int]] = field(default_factory=list)
    # files of a folder not read: named for another split (a test.jsonl beside train.jsonl)
    left_out: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "format": self.format, "records": self.records, "rows": self.rows,
            "ok": self.ok, "issues": [issue.to_dict() for issue in self.issues], "more_issues": self.more_issues,
            "conversations": self.conversations, "text_records": self.text_records,
            "assistant_turns": self.turns, "assistant_turns_untrained": self.untrained_turns,
            "with_tools": self.with_tools,
            "tokens": self.lengths.to_dict() if self.lengths else None,
            "capped": [{"origin": where, "chars": chars, "tokens_counted": tokens}
                       for where, chars, tokens in self.capped],
            "left_out": list(self.left_out),
        }


def percentile(sorted_values: list[int], fraction: float) -> int:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def length_stats(lengths: list[int], exact: bool, method: str, max_seq_len: int | None) -> LengthStats | None:
    if not lengths:
        return None
    ordered = sorted(lengths)
    over = sum(1 for n in ordered if n > max_seq_len) if max_seq_len else None
    return LengthStats(
        count=len(ordered), min=ordered[0], mean=round(sum(ordered) / len(ordered), 1),
        p50=percentile(ordered, 0.5), p95=percentile(ordered, 0.95), max=ordered[-1],
        exact=exact, method=method, over_max=over, max_seq_len=max_seq_len,
    )


def approximate_token_weight(text: str) -> float:
    """Tokens of ``text`` without a tokenizer, unrounded: characters / 4, a wide (CJK) character one token."""
    from core.text_width import char_width

    wide = 0 if text.isascii() else sum(1 for char in text if char_width(char) == 2)
    return (len(text) - wide) / APPROX_CHARS_PER_TOKEN + wide * APPROX_TOKENS_PER_WIDE_CHAR


def approximate_tokens(text: str) -> int:
    """Tokens of ``text`` without a tokenizer (``approximate_token_weight``), at least 1."""
    return max(1, math.ceil(approximate_token_weight(text)))


def approximate_lengths(records: list[Record]) -> list[int]:
    return [approximate_tokens(record.approx_text()) for record in records]


def load_tokenizer(model: str) -> Any:
    """The tokenizer of a local model directory (or ``tiny``), never downloading anything.

    Raises ``FileNotFoundError`` or ``ValueError`` with a user-facing message.
    """
    from core.assets import resolve_model_name

    directory = Path(resolve_model_name(model)).expanduser()
    if not directory.is_dir():
        raise FileNotFoundError(t("data.model_not_local", model=model))
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for a broken folder
        raise ValueError(t("data.tokenizer_failed", model=model, problem=str(exc).splitlines()[0])) from None


def check_data(
    path: str | Path,
    tokenizer_or_model: Any = None,
    max_seq_len: int | None = None,
    max_issues: int = DEFAULT_MAX_ISSUES,
    thinking: bool | None = None,
    overlong: str = "cut",
) -> DataReport:
    """Read local data as a run's ``dataset`` names it (a file, a folder, a comma list, ``~``; ``#N`` read
    whole: the check is of what the source holds) and report its format, records, problems and token lengths.

    ``tokenizer_or_model``: a tokenizer object, a local model directory or ``tiny``; without one the
    lengths are an approximation (``approximate_tokens``), labelled as such. ``thinking``: the run key, the
    chat template's enable_thinking the conversations are rendered with, as the run renders them (a Qwen3
    template's empty think block before each answer with false; None: the template's default). ``overlong``: the
    run key; with ``drop`` the samples a cut leaves without their answer are not counted (None): no cut happens, and
    counting them tokenizes every over-long sample a second time. Raises ``DataError`` only when the data cannot be
    read at all, or names hub data (read by ``train``, not here); malformed rows are in the report.
    """
    loaded, on_hub = read_local_data(str(path), max_issues)
    if on_hub:
        raise DataError([DataIssue(spec, None, None, Message("data.check_on_hub")) for spec in on_hub])
    records = loaded.records
    report = DataReport(
        path=str(path), format=loaded.format, records=len(records), rows=loaded.rows,
        issues=loaded.issues, more_issues=loaded.more_issues, left_out=loaded.left_out,
    )
    for record in records:
        if isinstance(record, Conversation):
            report.conversations += 1
            report.turns += sum(1 for m in record.messages if m.role == "assistant")
            report.untrained_turns += sum(1 for m in record.messages if m.role == "assistant" and not m.trained)
            report.with_tools += 1 if record.tools else 0
        else:
            report.text_records += 1
    tokenizer = tokenizer_or_model
    if isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(str(tokenizer))
    if tokenizer is not None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        limit = max_seq_len or _default_max_seq_len()
        from core.data.tokenize import template_kwargs

        lengths, report.capped = capped_token_lengths(records, tokenizer,
                                                      max(CAP_CHARS_FLOOR, limit * CAP_CHARS_PER_TOKEN),
                                                      template_kwargs(thinking))
        report.lengths = length_stats(lengths, True, t("data.method_tokenizer", name=name), max_seq_len)
        if report.lengths is not None and max_seq_len and overlong != "drop":
            capped = {where for where, _chars, _tokens in report.capped}
            over = [record for index, (record, n) in enumerate(zip(records, lengths, strict=True))
                    if n > max_seq_len and (record.origin or f"record {index + 1}") not in capped]
            report.lengths.cut_no_answer, report.lengths.cut_no_answer_first = cut_without_answer(
                over, tokenizer, max_seq_len, template_kwargs(thinking))
    else:
        report.lengths = length_stats(approximate_lengths(records), False,
                                      t("data.method_approx"), max_seq_len)
    if report.lengths is not None:
        report.lengths.overlong = overlong
    return report


def cut_without_answer(records: list[Record], tokenizer: Any, max_seq_len: int,
                       kwargs: dict[str, Any] | None = None) -> tuple[int, str | None]:
    """How many of ``records`` a cut to their first ``max_seq_len`` tokens leaves without an answer to learn,
    which a run (``overlong: cut``) leaves out (``core.data.tokenize_dataset``'s count), and where the first is."""
    if not records:
        return 0, None
    from core.data.tokenize import quiet_length_warning, tokenize_dataset

    quiet_length_warning(tokenizer)
    result = tokenize_dataset(records, tokenizer, max_seq_len, kwargs=kwargs)
    return result.cut_no_answer, next(iter(result.cut_no_answer_origins), None)


def _default_max_seq_len() -> int:
    from core.config.schema import default_for

    return int(default_for("max_seq_len"))


def capped_token_lengths(records: list[Record], tokenizer: Any, max_chars: int,
                         kwargs: dict[str, Any] | None = None) -> tuple[list[int], list[tuple[str, int, int]]]:
    """Each record's token length as the model sees it, the text of a record longer than ``max_chars``
    characters cut there first (its length is then a lower bound); and for each record cut, (where it
    came from, its characters, the tokens counted). The tokenizer's "sequence length is longer than the
    specified maximum" warning is silenced: the lengths are what this check reports. ``kwargs``: the chat
    template's variables besides the messages (``core.data.tokenize.template_kwargs``: the run's thinking)."""
    import logging

    from core.data.records import TextRecord
    from core.data.tokenize import _render, _text_tokens, ensure_chat_template

    if any(isinstance(record, Conversation) for record in records):
        ensure_chat_template(tokenizer)
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    lengths: list[int] = []
    capped: list[tuple[str, int, int]] = []
    try:
        for index, record in enumerate(records):
            if isinstance(record, TextRecord):
                chars = len(record.prompt or "") + len(record.text)
                if chars <= max_chars:
                    lengths.append(len(_text_tokens(tokenizer, record)))
                    continue
                text = ((record.prompt or "") + record.text)[:max_chars]
            else:
                text = _render(tokenizer, record.to_chat_messages(), record.tools, False, kwargs)
                chars = len(text)
                if chars <= max_chars:
                    lengths.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
                    continue
                text = text[:max_chars]
            counted = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            lengths.append(counted)
            capped.append((record.origin or f"record {index + 1}", chars, counted))
    finally:
        quiet.setLevel(level)
    return lengths, capped
