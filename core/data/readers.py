"""Reading rows out of local data files, each with the line (or row index) it came from.

Supported: ``.jsonl`` (JSON lines), ``.json`` (an array, or JSON lines under a .json name), ``.csv``,
``.parquet``, and ``.txt`` (plain text for pre-training: one document per blank-line separated block, or
the whole file as one document). A row that cannot even be parsed (invalid JSON) is yielded as a ``BadRow`` so the caller
can report it with the others.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import Message, t

SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet",
            ".pq": "parquet", ".txt": "txt"}


@dataclass
class RawRow:
    value: Any
    line: int | None  # 1-based line where the row starts, when the file has lines
    row: int  # 0-based index among the file's rows


@dataclass
class BadRow:
    """A row whose text could not be parsed; ``message`` says why."""

    message: str
    line: int | None
    row: int


class FileProblem(TunedeckError, ValueError):
    """The file as a whole cannot be read (wrong kind, unreadable, not an array...); ``line`` is where,
    when one line is to blame (the first byte that is not UTF-8)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str | Message, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


# Compressed text data files (train.jsonl.gz, as Hugging Face datasets, LLaMA-Factory and ms-swift read them).
COMPRESSIONS = (".gz", ".bz2", ".xz")


def data_suffix(path: Path) -> str:
    """The suffix that says a data file's kind, lower-cased: a compressed file's inner one (train.jsonl.gz: .jsonl)."""
    suffixes = [suffix.lower() for suffix in path.suffixes]
    if len(suffixes) >= 2 and suffixes[-1] in COMPRESSIONS:
        return suffixes[-2]
    return path.suffix.lower()


def is_data_file_name(path: Path) -> bool:
    """Whether the name is one of a data file the loaders read (a compressed parquet is not: parquet compresses
    itself)."""
    kind = SUFFIXES.get(data_suffix(path))
    return kind is not None and not (kind == "parquet" and path.suffix.lower() in COMPRESSIONS)


def file_kind(path: Path) -> str:
    kind = SUFFIXES.get(data_suffix(path))
    if kind is None or (kind == "parquet" and path.suffix.lower() in COMPRESSIONS):
        suffix = "".join(path.suffixes[-2:]) if path.suffix.lower() in COMPRESSIONS else path.suffix
        raise FileProblem(Message("data.unknown_suffix", suffix=suffix or "(none)",
                                  allowed=", ".join(SUFFIXES) + " " + t("data.compressed_too",
                                                                        compressions=", ".join(COMPRESSIONS))))
    return kind


def read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when its name ends in .gz, .bz2 or .xz; a damaged archive is a
    ``FileProblem``."""
    raw = path.read_bytes()
    suffix = path.suffix.lower()
    if suffix not in COMPRESSIONS:
        return raw
    import bz2
    import gzip
    import lzma

    opener = {".gz": gzip.decompress, ".bz2": bz2.decompress, ".xz": lzma.decompress}[suffix]
    try:
        return opener(raw)
    except (OSError, EOFError, ValueError, lzma.LZMAError) as exc:
        raise FileProblem(Message("data.bad_compressed", suffix=suffix, problem=str(exc) or type(exc).__name__)) from None


def open_decompressed(path: Path) -> Any:
    """A binary stream of the file's bytes, decompressed as it is read when its name ends in .gz, .bz2 or .xz (a
    damaged archive raises, as it is read, ``OSError``, ``EOFError`` or ``lzma.LZMAError``)."""
    import bz2
    import gzip
    import lzma

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix.lower(), open)
    return opener(path, "rb")


def _json_error(exc: json.JSONDecodeError) -> str:
    return t("data.invalid_json", problem=exc.msg, column=exc.colno)


def _parse_error(exc: Exception) -> str:
    """Why a row's JSON could not be read, for any failure of the decoder (not only bad syntax)."""
    if isinstance(exc, json.JSONDecodeError):
        return _json_error(exc)
    if isinstance(exc, RecursionError):
        return t("data.json_too_deep")
    return t("data.invalid_json_other", problem=str(exc) or type(exc).__name__)


# What a decoder can raise on hostile input: bad syntax, nesting past the recursion limit, numbers too
# long to convert (ValueError), memory for one absurd value.
PARSE_FAILURES = (ValueError, RecursionError, MemoryError)


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSON-lines text: split on ``\n`` only (a ``\r`` before it is dropped).

    ``str.splitlines`` also breaks at U+2028, U+2029, U+0085 and other separators, which JSON allows
    unescaped inside strings (``json.dumps(ensure_ascii=False)`` writes them), so it would cut valid
    records in two.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


_NON_SPACE = re.compile(r"\S")


def first_non_space(text: str) -> int:
    """Where ``text.lstrip()`` would start (``len(text)`` for a blank text), without that copy of the text."""
    found = _NON_SPACE.search(text)
    return found.start() if found else len(text)


def iter_lines(text: str) -> Iterator[str]:
    """``jsonl_lines`` one line at a time, without a list of them all beside the text."""
    start, length = 0, len(text)
    while start < length:
        end = text.find("\n", start)
        if end < 0:
            end = length
        yield text[start:end - 1] if end > start and text[end - 1] == "\r" else text[start:end]
        start = end + 1


def iter_jsonl(text: str) -> Iterator[RawRow | BadRow]:
    yield from _jsonl_rows(enumerate(iter_lines(text), start=1))


def _jsonl_rows(lines: Iterable[tuple[int, str]]) -> Iterator[RawRow | BadRow]:
    """The rows of JSON Lines given as (line number, line without its end), blank lines skipped."""
    index = 0
    for line_number, line in lines:
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except PARSE_FAILURES as exc:
            yield BadRow(_parse_error(exc), line_number, index)
        else:
            yield RawRow(value, line_number, index)
        index += 1


def iter_json_array(text: str) -> Iterator[RawRow | BadRow]:
    """Elements of a top-level JSON array with the line each starts on (found while decoding)."""
    decoder = json.JSONDecoder()
    position = first_non_space(text)
    if not text.startswith("[", position):
        raise FileProblem(Message("data.json_not_array"))
    position += 1
    line = 1 + text.count("\n", 0, position)
    counted_to = position
    index = 0
    length = len(text)

    def skip_space(pos: int) -> int:
        while pos < length and text[pos] in " \t\r\n":
            pos += 1
        return pos

    position = skip_space(position)
    if position < length and text[position] == "]":
        return
    while True:
        position = skip_space(position)
        line += text.count("\n", counted_to, position)
        counted_to = position
        try:
            value, end = decoder.raw_decode(text, position)
        except PARSE_FAILURES as exc:
            # The rest of an array cannot be read past a broken element: report it and stop.
            yield BadRow(_parse_error(exc), getattr(exc, "lineno", line), index)
            return
        yield RawRow(value, line, index)
        index += 1
        position = skip_space(end)
        if position < length and text[position] == ",":
            position += 1
            continue
        if position < length and text[position] == "]":
            return
        bad_line = 1 + text.count("\n", 0, position)
        yield BadRow(t("data.invalid_json", problem=t("data.array_separator"),
                       column=position - text.rfind("\n", 0, position)), bad_line, index)
        return


def iter_json(text: str) -> Iterator[RawRow | BadRow]:
    start = first_non_space(text)  # not text.lstrip(): a copy of the whole text, held while its rows are read
    if text.startswith("[", start):
        yield from iter_json_array(text)
        return
    if text.startswith("{", start):
        # One object per line under a .json name is common; a single object of lists is not a dataset.
        end = text.find("\n", start)
        first = text[start:end if end >= 0 else len(text)].removesuffix("\r")
        try:
            json.loads(first)
        except json.JSONDecodeError:
            raise FileProblem(Message("data.json_not_array")) from None
        except PARSE_FAILURES:
            pass  # a first line that is a record, too deep or too big to read: reported as its line
        yield from iter_jsonl(text)
        return
    if start == len(text):
        return
    raise FileProblem(Message("data.json_not_array"))


def iter_csv(path: Path) -> Iterator[RawRow | BadRow]:
    """Rows of a CSV file with a header; ``line`` is the physical line a record starts on.

    The header is line 1, so the first record is line 2; a quoted field holding newlines makes its
    record span several lines (the csv reader's ``line_num`` counts them), and blank lines are skipped
    as ``csv.DictReader`` does.
    """
    text = read_utf8(path)
    with io.StringIO(text, newline="") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield BadRow(t("data.invalid_csv", problem=exc), reader.line_num, 0)
            return
        index = 0
        read_to = reader.line_num  # the last line consumed so far
        while True:
            begin = handle.tell()
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield BadRow(t("data.invalid_csv", problem=exc), reader.line_num, index)
                return
            start, read_to = read_to + 1, reader.line_num
            if not fields:  # a blank line
                continue
            if handle.tell() == len(text) and _quote_left_open(text[begin:]):
                yield BadRow(t("data.csv_unclosed_quote", end=read_to), start, index)
                return
            if len(fields) > len(header):
                yield BadRow(t("data.csv_extra_fields", count=len(fields) - len(header)), start, index)
            else:
                values = fields + [None] * (len(header) - len(fields))
                yield RawRow(dict(zip(header, values, strict=True)), start, index)
            index += 1


def _quote_left_open(last: str) -> bool:
    """Whether ``last``, the text of a file's last CSV record, ends inside a quoted field: the lenient reader
    takes a quote never closed as one field that swallows every line after it, and says nothing; the strict
    one says so (only of this: other complaints of its are the lenient reader's to forgive)."""
    try:
        for _ in csv.reader(io.StringIO(last, newline=""), strict=True):
            pass
    except csv.Error as exc:
        return "unexpected end of data" in str(exc)
    return False


def iter_parquet(path: Path) -> Iterator[RawRow | BadRow]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several kinds for a broken file
        raise FileProblem(Message("data.invalid_parquet", problem=str(exc))) from None
    index = 0
    for batch in parquet.iter_batches(batch_size=1024):
        for value in batch.to_pylist():
            yield RawRow(value, None, index)
            index += 1


def iter_txt(text: str, whole_file: bool = False) -> Iterator[RawRow]:
    """Documents of a plain-text file as ``{"text": ...}`` rows: blocks separated by blank lines, each
    with the line it starts on; with ``whole_file`` the file is one document."""
    if whole_file:
        if text.strip():
            start = 1 + text[: len(text) - len(text.lstrip())].count("\n")
            yield RawRow({"text": text.strip("\n")}, start, 0)
        return
    index = 0
    block: list[str] = []
    start = 0
    for number, line in enumerate(iter_lines(text), start=1):
        if line.strip():
            if not block:
                start = number
            block.append(line)
            continue
        if block:
            yield RawRow({"text": "\n".join(block)}, start, index)
            index += 1
            block = []
    if block:
        yield RawRow({"text": "\n".join(block)}, start, index)


def iter_rows(path: Path, whole_text_files: bool = False) -> Iterator[RawRow | BadRow]:
    """Every row of a local data file, in order (``whole_text_files``: a ``.txt`` is one document)."""
    kind = file_kind(path)
    if kind == "txt":
        yield from iter_txt(read_utf8(path), whole_text_files)
        return
    if kind == "parquet":
        yield from iter_parquet(path)
        return
    if kind == "csv":
        yield from iter_csv(path)
        return
    if kind == "jsonl":
        yield from iter_jsonl_file(path)
        return
    yield from iter_json(read_utf8(path))


def iter_jsonl_file(path: Path) -> Iterator[RawRow | BadRow]:
    """``iter_jsonl`` of the file read a line at a time (decompressed and decoded as ``read_utf8`` does it), never
    the whole text held: its bytes and its text side by side were twice the file before any row was read. A
    file that does not decode (or decompress) is said as ``read_utf8`` says it, by reading it so."""
    import lzma

    def lines(text: Iterable[str]) -> Iterator[tuple[int, str]]:
        chars = 0
        for line_number, line in enumerate(text, start=1):
            nul = line.find("\0")
            if nul >= 0:
                raise FileProblem(Message("data.nul_character", position=chars + nul + 1), line_number)
            chars += len(line)
            line = line[:-1] if line.endswith("\n") else line
            yield line_number, line[:-1] if line.endswith("\r") else line

    try:
        with open_decompressed(path) as stream:
            start = stream.read(4)
        encoding = next((name for bom, name in _BOMS if start.startswith(bom)), "utf-8-sig")
        with open_decompressed(path) as stream, io.TextIOWrapper(stream, encoding=encoding, newline="\n") as text:
            yield from _jsonl_rows(lines(text))
    except (UnicodeDecodeError, EOFError, OSError, lzma.LZMAError):
        read_utf8(path)  # raises the FileProblem that names the bad byte's line, or the damaged archive
        raise


# Byte-order marks of the encodings a text file says it is in (UTF-32's first: its LE mark starts as UTF-16's).
# Windows writes UTF-16 (PowerShell 5's '>' and Out-File, Notepad's "Unicode"): read, as the mark says.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))


def read_utf8(path: Path) -> str:
    """The file as text: UTF-8 (its byte-order mark dropped), or UTF-16 / UTF-32 that a byte-order mark says;
    not UTF-8 is a ``FileProblem`` naming the line, and so is a NUL character (UTF-16 without its mark reads as
    valid UTF-8 full of NULs, which no text data holds: every row "invalid JSON" said nothing of why)."""
    raw = read_bytes(path)
    encoding = next((name for bom, name in _BOMS if raw.startswith(bom)), "utf-8-sig")
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        if encoding != "utf-8-sig":
            raise FileProblem(Message("data.bad_encoding", encoding=encoding.upper(), position=exc.start)) from None
        line = raw.count(b"\n", 0, exc.start) + 1
        raise FileProblem(Message("data.not_utf8", position=exc.start), line) from None
    nul = text.find("\0")
    if nul >= 0:
        raise FileProblem(Message("data.nul_character", position=nul + 1), text.count("\n", 0, nul) + 1)
    return text
