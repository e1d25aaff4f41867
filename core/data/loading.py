"""Loading a dataset (local file or hub id) into normalised records, collecting every malformed row.

``read_dataset`` never raises for bad rows: it returns them as issues next to the good records, which is
what ``tunedeck data check`` shows. ``load_records`` / ``load_training_records`` raise ``DataError``
when anything is wrong, which is what a training run wants before it starts.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from core.data.formats import RowError, describe_keys, detect_format, format_of_row, normalise_row
from core.data.issues import DEFAULT_MAX_ISSUES, DataError, DataIssue
from core.data.readers import SUFFIXES, BadRow, FileProblem, RawRow, iter_rows
from core.data.records import Record
from core.i18n import t

DETECT_SAMPLE = 50
HUB_HOSTS = {"huggingface": ("huggingface.co", 443), "modelscope": ("www.modelscope.cn", 443)}
NETWORK_PROBE_TIMEOUT_S = 3.0


@dataclass
class LoadedDataset:
    """The good records of a source, its detected format, and its problems (up to the limit)."""

    source: str
    format: str | None
    records: list[Record] = field(default_factory=list)
    issues: list[DataIssue] = field(default_factory=list)
    rows: int = 0  # rows seen, good and bad
    more_issues: int = 0  # problems beyond ``issues`` (not listed)

    @property
    def issue_count(self) -> int:
        return len(self.issues) + self.more_issues

    def raise_for_issues(self) -> None:
        if self.issues:
            raise DataError(self.issues, self.more_issues)


def _normalise_rows(
    source: str, rows: Iterable[RawRow | BadRow], max_issues: int, fmt: str | None = None
) -> LoadedDataset:
    rows = list(rows)
    if fmt is None:
        fmt = detect_format(r.value for r in rows if isinstance(r, RawRow))
    result = LoadedDataset(source=source, format=fmt, rows=len(rows))

    def report(line: int | None, row: int, message: str) -> None:
        if len(result.issues) < max_issues:
            result.issues.append(DataIssue(source, line, row, message))
        else:
            result.more_issues += 1

    if fmt is None:
        first = next((r for r in rows if isinstance(r, RawRow)), None)
        if first is not None:
            report(None, None, t("data.unknown_format", keys=describe_keys(first.value)))
        elif not rows:
            report(None, None, t("data.empty_file"))
    for raw in rows:
        if isinstance(raw, BadRow):
            report(raw.line, raw.row, raw.message)
            continue
        if fmt is None:
            continue
        try:
            record = normalise_row(raw.value, fmt)
        except RecursionError:  # a value nested too deep for the checks themselves
            report(raw.line, raw.row, t("data.json_too_deep"))
            continue
        except RowError as exc:
            message = str(exc)
            other = format_of_row(raw.value)
            if other is not None and other != fmt:
                message = t("data.mixed_format", found=other, expected=fmt, problem=message)
            report(raw.line, raw.row, message)
            continue
        record.origin = f"{source}:{raw.line}" if raw.line is not None else f"{source} row {raw.row}"
        result.records.append(record)
    return result


def read_dataset(path: str | Path, max_issues: int = DEFAULT_MAX_ISSUES, fmt: str | None = None) -> LoadedDataset:
    """Read a local data file: detected format, normalised records and every malformed row.

    Raises ``DataError`` only when the file itself cannot be read (missing, wrong suffix, not JSON...).
    """
    path = Path(path)
    source = str(path)
    if path.is_dir():
        raise DataError([DataIssue(source, None, None, t("data.is_a_folder"))])
    if not path.is_file():
        raise DataError([DataIssue(source, None, None, t("data.file_missing"))])
    try:
        return _normalise_rows(source, iter_rows(path), max_issues, fmt)
    except FileProblem as exc:
        raise DataError([DataIssue(source, exc.line, None, str(exc))]) from None
    except OSError as exc:
        raise DataError([DataIssue(source, None, None, t("data.file_unreadable", reason=exc))]) from None


def load_records(path: str | Path, max_issues: int = DEFAULT_MAX_ISSUES) -> list[Record]:
    """The records of a local data file; raises ``DataError`` listing the malformed rows if any."""
    loaded = read_dataset(path, max_issues)
    loaded.raise_for_issues()
    return loaded.records


def data_files_in(directory: Path) -> list[Path]:
    """The data files directly inside a directory (a dataset folder), sorted by name."""
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)


def looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~")) and \
        Path(spec).suffix.lower() not in SUFFIXES


def _offline() -> bool:
    return any(os.environ.get(name, "") in ("1", "true", "TRUE", "yes") for name in
               ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_address(hub: str) -> tuple[str, int]:
    """Host and port of a hub, following ``HF_ENDPOINT`` / ``MODELSCOPE_DOMAIN`` when set."""
    host, port = HUB_HOSTS[hub]
    endpoint = os.environ.get("HF_ENDPOINT") if hub == "huggingface" else os.environ.get("MODELSCOPE_DOMAIN")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        host = parts.hostname or host
        port = parts.port or (80 if parts.scheme == "http" else 443)
    return host, port


def network_reachable(hub: str, timeout: float = NETWORK_PROBE_TIMEOUT_S) -> bool:
    """Whether the hub's host answers a TCP connection within ``timeout`` seconds (no HTTP request)."""
    host, port = hub_address(hub)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_rows(dataset_id: str, hub: str, split: str) -> Iterator[RawRow]:
    if hub == "huggingface":
        from datasets import load_dataset

        dataset = load_dataset(dataset_id, split=split)
    else:
        from modelscope.msdatasets import MsDataset

        dataset = MsDataset.load(dataset_id, split=split)
    for index, value in enumerate(dataset):
        yield RawRow(dict(value), None, index)


def read_hub_dataset(
    dataset_id: str, hub: str = "modelscope", split: str = "train", max_issues: int = DEFAULT_MAX_ISSUES
) -> LoadedDataset:
    """A hub dataset by id (``owner/name``), normalised like a local file.

    Fails within a few seconds with a clear ``DataError`` when the hub cannot be reached, instead of
    letting the hub client retry for minutes. With ``HF_HUB_OFFLINE=1`` the local cache is tried.
    """
    source = f"{hub}:{dataset_id}"
    if hub not in HUB_HOSTS:
        raise DataError([DataIssue(source, None, None, t("data.unknown_hub", hub=hub))])
    if not _offline() and not network_reachable(hub):
        host = hub_address(hub)[0]
        raise DataError([DataIssue(source, None, None, t("data.hub_unreachable", host=host, id=dataset_id))])
    try:
        rows = list(_hub_rows(dataset_id, hub, split))
    except DataError:
        raise
    except Exception as exc:  # the hub clients raise many kinds (missing dataset, auth, offline cache)
        raise DataError([DataIssue(source, None, None, t("data.hub_failed", problem=str(exc).splitlines()[0]
                                                         if str(exc) else type(exc).__name__))]) from None
    return _normalise_rows(source, rows, max_issues)


def read_any(spec: str, hub: str = "modelscope", max_issues: int = DEFAULT_MAX_ISSUES) -> list[LoadedDataset]:
    """A dataset given as a file, a folder of data files, or a hub id."""
    path = Path(spec).expanduser()
    if path.is_file():
        return [read_dataset(path, max_issues)]
    if path.is_dir():
        files = data_files_in(path)
        if not files:
            raise DataError([DataIssue(spec, None, None, t("data.empty_dir", allowed=", ".join(SUFFIXES)))])
        return [read_dataset(file, max_issues) for file in files]
    if looks_like_hub_id(spec):
        return [read_hub_dataset(spec, hub, max_issues=max_issues)]
    raise DataError([DataIssue(spec, None, None, t("data.file_missing"))])


def load_training_records(
    datasets: str | list[str], hub: str = "modelscope", max_issues: int = DEFAULT_MAX_ISSUES
) -> list[Record]:
    """All records of a run's ``dataset`` value (one spec or a list); raises ``DataError`` on any problem.

    Every source is read before raising, so the error lists the problems of all of them.
    """
    specs = [datasets] if isinstance(datasets, str) else list(datasets)
    records: list[Record] = []
    issues: list[DataIssue] = []
    more = 0
    for spec in specs:
        try:
            loaded_list = read_any(spec, hub, max_issues)
        except DataError as exc:
            issues += exc.issues
            continue
        for loaded in loaded_list:
            records += loaded.records
            issues += loaded.issues
            more += loaded.more_issues
    if issues:
        raise DataError(issues[:max_issues], more + max(0, len(issues) - max_issues))
    return records


def first_records(path: str | Path, count: int = 5) -> list[dict[str, Any]]:
    """The first rows of a file as they are (for previews)."""
    rows = []
    for raw in iter_rows(Path(path)):
        if isinstance(raw, RawRow):
            rows.append(raw.value)
        if len(rows) >= count:
            break
    return rows
