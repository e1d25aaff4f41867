"""Loading a dataset (local file or hub id) into normalised records, collecting every malformed row.

``read_dataset`` never raises for bad rows: it returns them as issues next to the good records, which is
what ``tunedeck data check`` shows. ``load_records`` / ``load_training_records`` raise ``DataError``
when anything is wrong, which is what a training run wants before it starts.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import socket
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from core.data.formats import (
    RowError,
    describe_keys,
    detect_format,
    format_of_row,
    normalise_row,
    not_an_object,
    refusal_message,
    refusal_of_row,
)
from core.data.issues import DEFAULT_MAX_ISSUES, DataError, DataIssue, row_location
from core.data.readers import (
    COMPRESSIONS,
    SUFFIXES,
    BadRow,
    FileProblem,
    RawRow,
    data_suffix,
    is_data_file_name,
    iter_rows,
)
from core.data.records import Record
from core.data.registry import (
    DatasetSource,
    RegistryEntry,
    dataset_entries,
    map_rows,
    resolve_sources,
    resolve_sources_and_issues,
    sample_records,
)
from core.data.registry import (
    looks_like_hub_id as looks_like_hub_id,  # callers import it from here
)
from core.i18n import Message

DETECT_SAMPLE = 50
HUB_HOSTS = {"huggingface": ("huggingface.co", 443), "modelscope": ("www.modelscope.cn", 443)}
# The hub probe's two bounds, each generous for a box that is online (a lost SYN is resent after 1 s):
# looking the host up (a resolver that does not answer would hold getaddrinfo 10 s and more), then
# connecting (to every address at once, so a dead IPv6 route does not delay a live IPv4 one).
DNS_PROBE_TIMEOUT_S = 1.5
NETWORK_PROBE_TIMEOUT_S = 1.5


@dataclass
class LoadedDataset:
    """The good records of a source, its detected format, and its problems (up to the limit)."""

    source: str
    format: str | None
    records: list[Record] = field(default_factory=list)
    issues: list[DataIssue] = field(default_factory=list)
    rows: int = 0  # rows seen, good and bad
    more_issues: int = 0  # problems beyond ``issues`` (not listed)
    # files of a folder not read: named for another split than the one read (``split_files``)
    left_out: list[str] = field(default_factory=list)

    @property
    def issue_count(self) -> int:
        return len(self.issues) + self.more_issues

    def raise_for_issues(self) -> None:
        if self.issues:
            raise DataError(self.issues, self.more_issues)


def _normalise_rows(
    source: str, rows: Iterable[RawRow | BadRow], max_issues: int, fmt: str | None = None
) -> LoadedDataset:
    """The rows read one at a time (never all held: a 2 GB file's parsed rows next to its records doubled what a
    check or a run took), the format detected from the first ``DETECT_SAMPLE`` parsed ones."""
    rows = iter(rows)
    head: list[RawRow | BadRow] = []
    if fmt is None:
        parsed = 0
        for raw in rows:
            head.append(raw)
            parsed += isinstance(raw, RawRow)
            if parsed >= DETECT_SAMPLE:
                break
        fmt = detect_format(r.value for r in head if isinstance(r, RawRow))
    result = LoadedDataset(source=source, format=fmt)

    def report(line: int | None, row: int, message: str | Message) -> None:
        if len(result.issues) < max_issues:
            result.issues.append(DataIssue(source, line, row, message))
        else:
            result.more_issues += 1

    if fmt is None:
        first = next((r for r in head if isinstance(r, RawRow)), None)
        if first is not None:  # said at that row (file:line), as every other problem of the data
            report(first.line, first.row, not_an_object(first.value)
                   or Message("data.unknown_format", keys=describe_keys(first.value)))
        elif not head:
            report(None, None, Message("data.empty_file"))
    # Data that is not SFT text (preference, KTO, multimodal) is said once per kind, at its first row
    # with the number of rows like it, instead of as hundreds of misleading row errors.
    refused: dict[str, tuple[RawRow, int]] = {}
    for raw in itertools.chain(head, rows):
        result.rows += 1
        if isinstance(raw, BadRow):
            report(raw.line, raw.row, raw.message)
            continue
        if fmt is None:
            continue
        kind = refusal_of_row(raw.value)
        if kind is not None:
            found, count = refused.get(kind, (raw, 0))
            refused[kind] = (found, count + 1)
            continue
        try:
            record = normalise_row(raw.value, fmt)
        except RecursionError:  # a value nested too deep for the checks themselves
            report(raw.line, raw.row, Message("data.json_too_deep"))
            continue
        except RowError as exc:
            message = exc.stored_message or str(exc)
            other = format_of_row(raw.value)
            if other is not None and other != fmt:
                message = Message("data.mixed_format", found=other, expected=fmt, problem=message)
            report(raw.line, raw.row, message)
            continue
        record.origin = f"{source}:{raw.line}" if raw.line is not None else row_location(source, raw.row)
        result.records.append(record)
    # First in the list: they say what the data is, which matters more than any row's detail.
    said = [DataIssue(source, found.line, found.row, refusal_message(kind, count))
            for kind, (found, count) in refused.items()]
    result.issues[0:0] = said
    if len(result.issues) > max_issues:
        result.more_issues += len(result.issues) - max_issues
        del result.issues[max_issues:]
    return result


def read_dataset(
    path: str | Path,
    max_issues: int = DEFAULT_MAX_ISSUES,
    fmt: str | None = None,
    entry: RegistryEntry | None = None,
    whole_text_files: bool = False,
) -> LoadedDataset:
    """Read a local data file: detected format, normalised records and every malformed row.

    ``entry``: the ``dataset_info.json`` entry the file belongs to (its columns, tags and formatting).
    ``whole_text_files``: a ``.txt`` file is one document (else one per blank-line separated block).
    Raises ``DataError`` only when the file itself cannot be read (missing, wrong suffix, not JSON...).
    """
    path = Path(path)
    source = str(path)
    if path.is_dir():
        raise DataError([DataIssue(source, None, None, Message("data.is_a_folder"))])
    if not path.is_file():
        raise DataError([DataIssue(source, None, None, Message("data.file_missing"))])
    if data_suffix(path) == ".txt":
        fmt = "text"
    try:
        rows = iter_rows(path, whole_text_files)
        if entry is not None:
            rows = map_rows(rows, entry)
            fmt = fmt or entry.format
        return _normalise_rows(source, rows, max_issues, fmt)
    except FileProblem as exc:
        raise DataError([DataIssue(source, exc.line, None, exc.stored_message or str(exc))]) from None
    except OSError as exc:
        raise DataError([DataIssue(source, None, None, Message("data.file_unreadable", reason=str(exc)))]) from None


def load_records(path: str | Path, max_issues: int = DEFAULT_MAX_ISSUES) -> list[Record]:
    """The records of a local data file; raises ``DataError`` listing the malformed rows if any."""
    loaded = read_dataset(path, max_issues)
    loaded.raise_for_issues()
    return loaded.records


def data_files_in(directory: Path, split: str | None = None) -> list[Path]:
    """The data files directly inside a directory (a dataset folder), sorted by name: those of ``split``
    (train when None) where the files are named for splits (``split_files``).

    ``.txt`` files count only in a folder without structured data files (a README.txt beside a
    train.jsonl is not training text)."""
    return split_files(directory, split)[0]


# The words that name a split in a data file's name, as Hugging Face ``datasets`` reads a folder (and ms-swift,
# which loads a folder through it): train.jsonl, validation.jsonl, test-00000-of-00002.parquet, dev.json...
SPLIT_WORDS = {"train": "train", "training": "train", "validation": "validation", "valid": "validation",
               "val": "validation", "dev": "validation", "test": "test", "testing": "test", "eval": "test",
               "evaluation": "test"}
_SPLIT_WORD = re.compile(r"(?:^|[-._ ])(" + "|".join(sorted(SPLIT_WORDS, key=len, reverse=True)) + r")(?=[-._ 0-9]|$)")


def file_split(path: Path) -> str | None:
    """The split a data file's name says (``train``, ``validation``, ``test``: a split word standing apart in
    the name, as ``datasets`` matches it), None when it names none."""
    name = path.name.lower()
    if path.suffix.lower() in COMPRESSIONS:  # train.jsonl.gz: train
        name = name[: -len(path.suffix)]
    found = _SPLIT_WORD.search(name[: len(name) - len(Path(name).suffix)])
    return SPLIT_WORDS[found.group(1)] if found else None


def folder_data_files(directory: Path) -> list[Path]:
    """Every data file directly inside a folder, sorted by name, whatever split its name says (``.txt`` ones
    only where there is no structured data file)."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and is_data_file_name(p))
    return [p for p in files if data_suffix(p) != ".txt"] or files


def split_files(directory: Path, split: str | None = None) -> tuple[list[Path], list[Path]]:
    """(the data files of a folder that ``split`` reads, the others): where some file's name says a split
    other than train (train.jsonl beside test.jsonl), only the files of ``split`` (train when None; a name
    that says no split counts as train) are read, as ``datasets`` reads such a folder; a held-out test or
    validation file is not trained on. A folder with no such names is all ``train``."""
    files = folder_data_files(directory)
    wanted = SPLIT_WORDS.get((split or "train").lower(), split or "train")
    named = {path: file_split(path) or "train" for path in files}
    if all(said == "train" for said in named.values()):
        return (files, []) if wanted == "train" else ([], files)
    return [p for p in files if named[p] == wanted], [p for p in files if named[p] != wanted]


def _offline() -> bool:
    return any(os.environ.get(name, "") in ("1", "true", "TRUE", "yes") for name in
               ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_address(hub: str) -> tuple[str, int]:
    """Host and port of a hub, following ``HF_ENDPOINT`` / ``MODELSCOPE_ENDPOINT`` (or the older
    ``MODELSCOPE_DOMAIN``) when set, as the hubs' SDKs do."""
    host, port = HUB_HOSTS[hub]
    if hub == "huggingface":
        endpoint = os.environ.get("HF_ENDPOINT")
    else:
        endpoint = os.environ.get("MODELSCOPE_ENDPOINT") or os.environ.get("MODELSCOPE_DOMAIN")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        host = parts.hostname or host
        port = parts.port or (80 if parts.scheme == "http" else 443)
    return host, port


def _resolve(host: str, port: int, timeout: float) -> list[tuple[Any, ...]]:
    """The TCP addresses of ``host``, or [] when it does not resolve, or not within ``timeout`` seconds:
    getaddrinfo has no timeout of its own, so it runs in a daemon thread that is left to finish alone."""
    found: list[list[tuple[Any, ...]]] = []

    def look_up() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError):  # gaierror: no such host, or no resolver answering
            found.append([])

    thread = threading.Thread(target=look_up, name="hub-probe-dns", daemon=True)
    thread.start()
    thread.join(timeout)
    return found[0] if found else []


def network_reachable(hub: str, timeout: float = NETWORK_PROBE_TIMEOUT_S,
                      dns_timeout: float = DNS_PROBE_TIMEOUT_S) -> bool:
    """Whether the hub's host answers a TCP connection (no HTTP request). False at once when its name does
    not resolve, and within ``dns_timeout`` + ``timeout`` seconds at worst: the lookup is bounded, then
    every address is tried at the same time, the first to accept answering yes."""
    import selectors
    import time

    host, port = hub_address(hub)
    addresses = _resolve(host, port, dns_timeout)
    if not addresses:
        return False
    attempts: list[socket.socket] = []
    try:
        with selectors.DefaultSelector() as selector:
            for family, kind, proto, _, address in addresses:
                try:
                    sock = socket.socket(family, kind, proto)
                except OSError:  # a family this box has no stack for
                    continue
                attempts.append(sock)
                sock.setblocking(False)
                error = sock.connect_ex(address)
                if error == 0:
                    return True
                if error in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
                    selector.register(sock, selectors.EVENT_WRITE)
            deadline = time.monotonic() + timeout
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                for key, _ in selector.select(left):
                    sock = key.fileobj  # type: ignore[assignment]
                    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                        return True
                    selector.unregister(sock)  # refused or unreachable: the other addresses may answer
            return False
    finally:
        for sock in attempts:
            sock.close()


def _hub_rows(dataset_id: str, hub: str, split: str, subset: str | None = None) -> Iterator[RawRow]:
    if hub == "huggingface":
        from datasets import load_dataset

        dataset = load_dataset(dataset_id, subset, split=split) if subset else load_dataset(dataset_id, split=split)
    else:
        from modelscope.msdatasets import MsDataset

        dataset = MsDataset.load(dataset_id, subset_name=subset, split=split) if subset else \
            MsDataset.load(dataset_id, split=split)
    for index, value in enumerate(dataset):
        yield RawRow(dict(value), None, index)


def read_hub_dataset(
    dataset_id: str, hub: str = "modelscope", split: str = "train", max_issues: int = DEFAULT_MAX_ISSUES,
    entry: RegistryEntry | None = None,
) -> LoadedDataset:
    """A hub dataset by id (``owner/name``), normalised like a local file.

    Fails within a few seconds with a clear ``DataError`` when the hub cannot be reached, instead of
    letting the hub client retry for minutes. With ``HF_HUB_OFFLINE=1`` the local cache is tried.
    """
    source = f"{hub}:{dataset_id}" + (f" ({split})" if split != "train" else "")
    if hub not in HUB_HOSTS:
        raise DataError([DataIssue(source, None, None, Message("data.unknown_hub", hub=hub))])
    if not _offline() and not network_reachable(hub):
        host = hub_address(hub)[0]
        raise DataError([DataIssue(source, None, None, Message("data.hub_unreachable", host=host, id=dataset_id))])
    try:
        rows: list[RawRow | BadRow] = list(_hub_rows(dataset_id, hub, split, entry.subset if entry else None))
    except DataError:
        raise
    except Exception as exc:  # the hub clients raise many kinds (missing dataset, auth, offline cache)
        raise DataError([DataIssue(source, None, None, Message("data.hub_failed", problem=str(exc).splitlines()[0]
                                                         if str(exc) else type(exc).__name__))]) from None
    if entry is not None:
        return _normalise_rows(source, map_rows(rows, entry), max_issues, entry.format)
    return _normalise_rows(source, rows, max_issues)


def read_source(source: DatasetSource, hub: str = "modelscope", max_issues: int = DEFAULT_MAX_ISSUES
                ) -> list[LoadedDataset]:
    """The data of one resolved ``dataset`` entry (a file, the files of a folder, a hub split)."""
    entry = source.entry
    if source.kind == "hub" or (entry is not None and entry.hub_id):
        return [read_hub_dataset(source.location, source.hub or hub, source.split or "train", max_issues, entry)]
    path = Path(source.location)
    if path.is_dir():
        # A folder named in a run's dataset is split by its files' names; one of a dataset_info.json entry is
        # read whole, as LLaMA-Factory reads it.
        files, others = split_files(path, source.split) if entry is None else (folder_data_files(path), [])
        if not files and others:
            raise DataError([DataIssue(source.spec, None, None, Message(
                "data.no_split_files", split=source.split or "train",
                files=", ".join(f"{p.name} ({file_split(p) or 'train'})" for p in others)))])
        if not files:
            below = _folders_with_data(path)
            if below:  # a downloaded hub dataset keeps its files in data/ or train/: say which folder to name
                raise DataError([DataIssue(source.spec, None, None, Message(
                    "data.empty_dir_data_below", folders=", ".join(str(folder) for folder in below[:5]),
                    first=_split_folder_spec(below, source.split)))])
            raise DataError([DataIssue(source.spec, None, None, Message("data.empty_dir", allowed=", ".join(SUFFIXES)))])
        loaded = [read_dataset(file, max_issues, entry=entry, whole_text_files=True) for file in files]
        loaded[0].left_out = [str(p) for p in others]
        return loaded
    return [read_dataset(path, max_issues, entry=entry)]


def _split_folder_spec(folders: list[Path], split: str | None) -> str:
    """The dataset spec that reads ``split`` (train when None) from one of ``folders`` (a downloaded dataset's
    data/ or train/, validation/): a folder named for the split whose files name none (read whole), else one
    whose files are named for it (with ``:split`` where that is not train); the train one (else the first) when none holds it."""
    wanted = SPLIT_WORDS.get((split or "train").lower(), split or "train")
    for folder in sorted(folders, key=lambda f: file_split(f) != wanted):
        try:
            if file_split(folder) == wanted and all(file_split(p) is None for p in folder_data_files(folder)):
                return str(folder)
            if split_files(folder, split)[0]:
                return str(folder) + (f":{split}" if wanted != "train" else "")
        except OSError:
            continue
    return str(next((f for f in folders if file_split(f) == "train"), folders[0]))


def _folders_with_data(directory: Path) -> list[Path]:
    """The folders right inside ``directory`` that hold data files, sorted (hidden ones, .git and .cache, not
    looked in)."""
    try:
        folders = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    found = []
    for folder in folders:
        try:
            if any(p.is_file() and is_data_file_name(p) for p in folder.iterdir()):
                found.append(folder)
        except OSError:
            continue
    return found


def read_any(spec: str, hub: str = "modelscope", max_issues: int = DEFAULT_MAX_ISSUES) -> list[LoadedDataset]:
    """A dataset given as a file, a folder of data files, or a hub id (``:split`` and ``#N`` read, the
    sampling not applied: this is what the source holds)."""
    loaded: list[LoadedDataset] = []
    for source in resolve_sources([spec], hub):
        loaded += read_source(source, hub, max_issues)
    return loaded


def is_hub_source(source: DatasetSource) -> bool:
    """A resolved entry whose rows are on a hub (a hub id, a dataset_info.json entry naming one)."""
    return source.kind == "hub" or (source.entry is not None and bool(source.entry.hub_id))


def _read_sources(sources: list[DatasetSource], hub: str, max_issues: int, seed: int | None,
                  issues: list[DataIssue]) -> Iterator[tuple[list[LoadedDataset], list[Record]]]:
    """Each source read (``read_source``) with its records, ``#N`` sampled with ``seed`` (None: every row);
    a source that cannot be read at all adds its problems to ``issues`` and is passed over, so that every
    source is read before the caller raises."""
    for source in sources:
        try:
            loaded_list = read_source(source, hub, max_issues)
        except DataError as exc:
            issues += exc.issues
            continue
        found = [record for loaded in loaded_list for record in loaded.records]
        yield loaded_list, (sample_records(found, source.sample, seed)
                            if seed is not None and source.sample is not None else found)


def read_local_data(datasets: str | list[str], max_issues: int = DEFAULT_MAX_ISSUES, seed: int | None = None,
                    *, dataset_info: str | None = None, dataset_dir: str | None = None,
                    base_dir: str | Path | None = None) -> tuple[LoadedDataset, list[str]]:
    """What a run's ``dataset`` value holds on this machine, resolved as ``train`` resolves it (a file, a
    folder of data files, a comma list, ``~``, a ``dataset_info.json`` name next to the current directory),
    merged into one ``LoadedDataset`` (its format: the sources' one, or ``mixed``); and the entries whose
    rows are on a hub, not read (that needs the network). ``seed``: ``#N`` entries sampled as the run
    samples them; None: every row read (what the sources hold, for a check). Raises ``DataError`` listing
    every entry that names nothing or cannot be read at all. ``dataset_info``, ``dataset_dir``: a run file's keys,
    where its names are looked up; ``base_dir``: the folder a relative entry is found in (the current one)."""
    sources, issues = resolve_sources_and_issues(datasets, dataset_info=dataset_info, dataset_dir=dataset_dir,
                                                 base_dir=Path.cwd() if base_dir is None else base_dir)
    merged = LoadedDataset(source=", ".join(dataset_entries(datasets)), format=None)
    on_hub = [source.spec for source in sources if is_hub_source(source)]
    formats: list[str | None] = []
    local = [source for source in sources if not is_hub_source(source)]
    for loaded_list, records in _read_sources(local, "modelscope", max_issues, seed, issues):
        for loaded in loaded_list:
            merged.issues += loaded.issues
            merged.more_issues += loaded.more_issues
            merged.rows += loaded.rows
            merged.left_out += loaded.left_out
            formats.append(loaded.format)
        merged.records += records
    if issues:
        raise DataError(issues[:max_issues], max(0, len(issues) - max_issues))
    known = set(formats)
    merged.format = formats[0] if len(known) == 1 else ("mixed" if known else None)
    if len(merged.issues) > max_issues:
        merged.more_issues += len(merged.issues) - max_issues
        del merged.issues[max_issues:]
    return merged, on_hub


def load_training_records(
    datasets: str | list[str],
    hub: str = "modelscope",
    max_issues: int = DEFAULT_MAX_ISSUES,
    *,
    dataset_info: str | None = None,
    dataset_dir: str | None = None,
    base_dir: str | Path | None = None,
    split: str | None = None,
    seed: int = 42,
) -> list[Record]:
    """All records of a run's ``dataset`` value (one spec, a comma-separated text or a list); raises
    ``DataError`` on any problem.

    Entries are resolved by ``core.data.registry`` (files, folders, ``dataset_info.json`` names, hub
    ids, ``:split``, ``#N`` sampled with ``seed``). Every source is read before raising, so the error
    lists the problems of all of them.
    """
    records: list[Record] = []
    more = 0
    sources, issues = resolve_sources_and_issues(datasets, hub, dataset_info, dataset_dir, base_dir, split)
    for loaded_list, found in _read_sources(sources, hub, max_issues, seed, issues):
        for loaded in loaded_list:
            issues += loaded.issues
            more += loaded.more_issues
        records += found
    if issues:
        raise DataError(issues[:max_issues], more + max(0, len(issues) - max_issues))
    return records


def config_records(cfg: dict[str, Any], max_issues: int = DEFAULT_MAX_ISSUES, base_dir: str | Path | None = None
                   ) -> list[Record]:
    """The records of a run configuration (a ``RunConfig.to_dict()`` or a run's ``config.yaml``)."""
    return load_training_records(
        cfg.get("dataset") or [], str(cfg.get("hub") or "modelscope"), max_issues,
        dataset_info=cfg.get("dataset_info"), dataset_dir=cfg.get("dataset_dir"), base_dir=base_dir,
        split=cfg.get("split"), seed=int(cfg["seed"]) if cfg.get("seed") is not None else 42,
    )


def first_records(path: str | Path, count: int = 5) -> list[dict[str, Any]]:
    """The first rows of a file as they are (for previews)."""
    rows = []
    for raw in iter_rows(Path(path)):
        if isinstance(raw, RawRow):
            rows.append(raw.value)
        if len(rows) >= count:
            break
    return rows
