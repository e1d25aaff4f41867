"""What a run's ``dataset`` value names: files, folders, hub ids and LLaMA-Factory dataset names.

A ``dataset`` entry (one of a list, or of a comma-separated text such as ``identity,alpaca_en_demo``) is

* a local file or folder (relative to the current directory, else to the config file's directory);
* a name in a LLaMA-Factory ``dataset_info.json`` (the ``dataset_info`` key, else the one in
  ``dataset_dir``, else the one next to the config file), whose ``file_name`` or hub URL, ``formatting``
  (alpaca, sharegpt, openai), ``columns``, ``tags``, ``ranking``, ``split``, ``subset`` and
  ``num_samples`` are followed;
* a hub id ``owner/name``.

Any of them may end in ``:split`` (hub ids, names and folders, not a single file; ``train`` unless the entry, or the run's ``split``
key, says otherwise) and ``#N`` (ms-swift's sampling: N records drawn with the run's seed; more than the
source holds repeats it whole, then draws the rest). Neither suffix is ever sent to a hub.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.data.formats import RowError, describe_keys, refusal_of_row
from core.data.issues import DataError, DataIssue
from core.data.readers import SUFFIXES, BadRow, RawRow, data_suffix
from core.i18n import Message, t

INFO_FILE = "dataset_info.json"
FORMATTINGS = {"alpaca": "alpaca", "sharegpt": "sharegpt", "openai": "messages"}
SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
                 "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system"}
CANONICAL_TAGS = {"user_tag": "human", "assistant_tag": "gpt", "observation_tag": "observation",
                  "function_tag": "function_call", "system_tag": "system"}
ALPACA_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
                  "history": "history"}
# Columns copied under their canonical names so that what the data is (tools, preference, KTO,
# multimodal) is seen by the normalisers and refusals whatever the file calls them.
PASSED_COLUMNS = ("tools", "images", "videos", "audios", "chosen", "rejected", "kto_tag")
UNSUPPORTED_SOURCES = ("script_url", "cloud_file_name")
_SAMPLE = re.compile(r"^(?P<base>.+)#(?P<count>\d+)$")
_SPLIT = re.compile(r"^(?P<base>[^:]+):(?P<split>[A-Za-z0-9_.\-\[\]%]+)$")


@dataclass
class RegistryEntry:
    """One dataset of a ``dataset_info.json``, its location resolved."""

    name: str
    info_file: Path
    line: int | None
    file: Path | None = None
    hub_id: str | None = None
    hub: str | None = None
    formatting: str = "alpaca"
    columns: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    split: str | None = None
    subset: str | None = None
    num_samples: int | None = None

    @property
    def format(self) -> str:
        return FORMATTINGS[self.formatting]


@dataclass
class DatasetSource:
    """One resolved entry of a run's ``dataset``: what to read and how."""

    spec: str  # as written
    kind: str  # file, dir, hub, entry
    location: str  # a path or a hub id
    split: str | None = None
    sample: int | None = None
    entry: RegistryEntry | None = None
    hub: str | None = None  # the hub of a hub id given by a registry entry


def dataset_entries(datasets: str | Iterable[str] | None) -> list[str]:
    """A ``dataset`` value as a list of entries; a text is split at commas (unless it is a path)."""
    if datasets is None:
        return []
    values = [datasets] if isinstance(datasets, str) else [str(d) for d in datasets]
    out: list[str] = []
    for value in values:
        if "," in value and not Path(value).expanduser().exists():
            out += [part.strip() for part in value.split(",") if part.strip()]
        elif value.strip():
            out.append(value.strip())
    return out


def parse_spec(spec: str, exists: Any = None) -> tuple[str, str | None, int | None]:
    """``(base, split, sample)`` of an entry: ``data/x.json#100`` → ``("data/x.json", None, 100)``,
    ``owner/name:train_sft#5`` → ``("owner/name", "train_sft", 5)``. A base that ``exists`` (a path
    check) keeps any ``:`` in it."""
    base, sample = spec, None
    match = _SAMPLE.match(base)
    if match:
        base, sample = match["base"], int(match["count"])
        if sample < 1:
            raise ValueError(t("data.bad_sample"))  # said after the entry, by whoever reports it
    split = None
    if not (exists and exists(base)):
        match = _SPLIT.match(base)
        if match:
            base, split = match["base"], match["split"]
    return base, split, sample


def looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~")) and \
        data_suffix(Path(spec)) not in SUFFIXES


def local_places(base: str, base_dirs: list[Path]) -> list[Path]:
    """Where a run's relative path (a dataset entry, its model folder) is looked for, in order: an absolute
    or ``~`` path as it is, else under the current directory, then under each of ``base_dirs`` (the run
    file's directory), resolved."""
    path = Path(base).expanduser()
    if path.is_absolute():
        return [path]
    return list(dict.fromkeys((directory / path).resolve() for directory in [Path.cwd(), *base_dirs]))


def find_local(base: str, base_dirs: list[Path]) -> Path | None:
    """The first of ``local_places`` that exists, or ``None`` where ``base`` is in none of them."""
    return next((place for place in local_places(base, base_dirs) if place.exists()), None)


def find_dataset_info(dataset_info: str | None = None, dataset_dir: str | None = None,
                      base_dir: str | Path | None = None) -> Path | None:
    """The ``dataset_info.json`` a run uses: the ``dataset_info`` key (a file, or a folder holding one),
    else the one in ``dataset_dir``, else the one next to the config file; ``None`` when there is none.

    Raises ``DataError`` when a key names a file that is not there."""
    if dataset_info:
        path = Path(dataset_info).expanduser()
        path = path / INFO_FILE if path.is_dir() else path
        if not path.is_file():
            raise DataError([DataIssue(str(path), None, None, Message("data.info_missing", key="dataset_info"))])
        return path
    if dataset_dir:
        path = Path(dataset_dir).expanduser()
        if not path.is_dir():
            raise DataError([DataIssue(str(path), None, None, Message("data.dataset_dir_missing"))])
        return path / INFO_FILE if (path / INFO_FILE).is_file() else None
    if base_dir is not None and (Path(base_dir) / INFO_FILE).is_file():
        return Path(base_dir) / INFO_FILE
    return None


def _key_line(text: str, name: str) -> int | None:
    found = text.find(json.dumps(name, ensure_ascii=False) + ":")
    if found < 0:
        found = text.find(json.dumps(name, ensure_ascii=False))
    return None if found < 0 else text.count("\n", 0, found) + 1


def read_dataset_info(path: Path) -> tuple[dict[str, Any], str]:
    """The names of a ``dataset_info.json`` and its text (for line numbers); ``DataError`` when unreadable."""
    try:
        text = path.read_text(encoding="utf-8-sig")
        info = json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError([DataIssue(str(path), None, None, Message("data.file_unreadable", reason=str(exc)))]) from None
    except json.JSONDecodeError as exc:
        raise DataError([DataIssue(str(path), exc.lineno, None,
                                   Message("data.invalid_json", problem=exc.msg, column=exc.colno))]) from None
    if not isinstance(info, dict):
        raise DataError([DataIssue(str(path), None, None, Message("data.info_not_object"))])
    return info, text


def registry_entry(name: str, raw: Any, info_file: Path, text: str, hub: str) -> RegistryEntry:
    """The entry ``name`` of a ``dataset_info.json``; ``DataError`` naming the key that is wrong."""
    line = _key_line(text, name)

    def fail(message: str) -> DataError:
        return DataError([DataIssue(str(info_file), line, None, Message("data.info_entry", name=name, problem=message))])

    if not isinstance(raw, dict):
        raise fail(t("data.info_entry_not_object"))
    for key in UNSUPPORTED_SOURCES:
        if raw.get(key) and not (raw.get("hf_hub_url") or raw.get("ms_hub_url")):
            raise fail(t("data.info_unsupported_source", key=key))
    formatting = str(raw.get("formatting", "alpaca"))
    if formatting not in FORMATTINGS:
        raise fail(t("data.info_bad_value", key="formatting", value=formatting, allowed=", ".join(FORMATTINGS)))
    entry = RegistryEntry(name=name, info_file=info_file, line=line, formatting=formatting)
    for key in ("columns", "tags"):
        value = raw.get(key) or {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise fail(t("data.info_bad_mapping", key=key))
        setattr(entry, key, dict(value))
    if raw.get("ranking"):
        entry.columns.setdefault("chosen", "chosen")
        entry.columns.setdefault("rejected", "rejected")
    entry.split = str(raw["split"]) if raw.get("split") else None
    entry.subset = str(raw["subset"]) if raw.get("subset") else None
    if raw.get("num_samples") is not None:
        count = raw["num_samples"]
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise fail(t("data.info_bad_value", key="num_samples", value=count, allowed="int >= 1"))
        entry.num_samples = count
    ms_id, hf_id = raw.get("ms_hub_url"), raw.get("hf_hub_url")
    if ms_id or hf_id:
        if (hub == "modelscope" and ms_id) or not hf_id:
            entry.hub_id, entry.hub = str(ms_id), "modelscope"
        else:
            entry.hub_id, entry.hub = str(hf_id), "huggingface"
        return entry
    if not raw.get("file_name"):
        raise fail(t("data.info_no_source"))
    file = Path(str(raw["file_name"])).expanduser()
    entry.file = file if file.is_absolute() else info_file.parent / file
    if not entry.file.exists():
        raise fail(t("data.info_file_missing", path=str(entry.file)))
    return entry


def resolve_sources(
    datasets: str | Iterable[str] | None,
    hub: str = "modelscope",
    dataset_info: str | None = None,
    dataset_dir: str | None = None,
    base_dir: str | Path | None = None,
    split: str | None = None,
) -> list[DatasetSource]:
    """Every entry of a ``dataset`` value resolved to a file, folder, hub id or registry entry.

    Raises ``DataError`` listing every entry that names nothing (and why)."""
    sources, issues = resolve_sources_and_issues(datasets, hub, dataset_info, dataset_dir, base_dir, split)
    if issues:
        raise DataError(issues)
    return sources


def resolve_sources_and_issues(
    datasets: str | Iterable[str] | None,
    hub: str = "modelscope",
    dataset_info: str | None = None,
    dataset_dir: str | None = None,
    base_dir: str | Path | None = None,
    split: str | None = None,
) -> tuple[list[DatasetSource], list[DataIssue]]:
    """Like ``resolve_sources``, but the entries that resolve are kept beside the problems of the others."""
    base_dirs = [Path(base_dir)] if base_dir is not None else []
    issues: list[DataIssue] = []
    sources: list[DatasetSource] = []
    info_path: Path | None = None
    info: dict[str, Any] | None = None
    info_text = ""
    info_error: DataError | None = None
    try:
        info_path = find_dataset_info(dataset_info, dataset_dir, base_dir)
        if info_path is not None:
            info, info_text = read_dataset_info(info_path)
    except DataError as exc:
        info_error = exc
    for spec in dataset_entries(datasets):
        try:
            base, spec_split, sample = parse_spec(spec, lambda b: find_local(b, base_dirs) is not None)
        except ValueError as exc:
            issues.append(DataIssue(spec, None, None, str(exc)))
            continue
        local = find_local(base, base_dirs)
        if local is not None and spec_split is not None and not local.is_dir():
            # a file is read whole: its :split was ignored silently, reading all of it where a part was meant
            issues.append(DataIssue(spec, None, None, Message("data.split_on_file", split=spec_split,
                                                              file=str(local))))
            continue
        if local is not None:
            sources.append(DatasetSource(spec, "dir" if local.is_dir() else "file", str(local), spec_split, sample))
            continue
        if info is not None and base in info:
            try:
                entry = registry_entry(base, info[base], info_path, info_text, hub)  # type: ignore[arg-type]
            except DataError as exc:
                issues += exc.issues
                continue
            chosen_split = spec_split or entry.split or split
            sources.append(DatasetSource(spec, "entry", str(entry.file or entry.hub_id), chosen_split,
                                         sample if sample is not None else entry.num_samples, entry, entry.hub))
            continue
        if looks_like_hub_id(base):
            sources.append(DatasetSource(spec, "hub", base, spec_split or split, sample))
            continue
        if info_error is not None:
            issues += info_error.issues
            info_error = None  # said once
        issues.append(DataIssue(spec, None, None, _not_found(base, info_path, info)))
    return sources, issues


def _not_found(base: str, info_path: Path | None, info: dict[str, Any] | None) -> Message:
    if data_suffix(Path(base)) in SUFFIXES or base.startswith((".", "/", "~")):
        return Message("data.file_missing")  # written as a path: say so, not that it is no known name
    if info_path is None or info is None:
        return Message("data.not_found_no_info")
    import difflib

    close = difflib.get_close_matches(base, list(info), n=1, cutoff=0.6)
    if close:
        return Message("data.not_found_in_info_suggest", info=str(info_path), suggestion=close[0])
    return Message("data.not_found_in_info", info=str(info_path), count=len(info))


def _turns(value: Any, entry: RegistryEntry) -> Any:
    """sharegpt turns written with the entry's tags, as ``{from, value}`` with the standard tags."""
    if not isinstance(value, list):
        return value
    tags = {**SHAREGPT_TAGS, **entry.tags}
    canonical = {tags[key]: name for key, name in CANONICAL_TAGS.items()}
    out = []
    for index, turn in enumerate(value, start=1):
        if not isinstance(turn, dict):
            out.append(turn)
            continue
        role = turn.get(tags["role_tag"])
        if role not in canonical:
            allowed = ", ".join(f"{key}={tags[key]}" for key in CANONICAL_TAGS)
            raise RowError(t("data.info_unknown_tag", index=index, tag=tags["role_tag"], value=_short(role),
                             allowed=allowed, name=entry.name))
        out.append({"from": canonical[role], "value": turn.get(tags["content_tag"])})
    return out


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:39] + "…"


def map_row(row: Any, entry: RegistryEntry) -> Any:
    """A row of a registry dataset under the standard names of its format (``RowError`` when its turns
    use tags the entry does not declare)."""
    if not isinstance(row, dict):
        return row
    columns = entry.columns
    out: dict[str, Any] = {}
    if entry.formatting == "alpaca":
        for canonical, default in ALPACA_COLUMNS.items():
            source = columns.get(canonical, default)
            if source in row:
                out[default] = row[source]
    else:
        source = columns.get("messages", "conversations" if entry.formatting == "sharegpt" else "messages")
        key = "conversations" if entry.formatting == "sharegpt" else "messages"
        if source in row:
            out[key] = _turns(row[source], entry) if entry.formatting == "sharegpt" else row[source]
        if columns.get("system", "system") in row:
            out["system"] = row[columns.get("system", "system")]
    for canonical in PASSED_COLUMNS:
        source = columns.get(canonical, canonical)
        if source in row:
            out[canonical] = row[source]
    _check_formatting(row, out, entry)
    return out


_ROLE_CONTENT_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                      "assistant_tag": "assistant", "system_tag": "system"}


def _check_formatting(row: dict, mapped: dict, entry: RegistryEntry) -> None:
    """A row the entry's formatting cannot read at all (chat ``messages`` under the default alpaca): said
    with the keys the row has, not those left after the mapping (none), and the entry that would read it."""
    if entry.formatting == "alpaca":
        needed = entry.columns.get("prompt", "instruction")
    else:
        needed = entry.columns.get("messages", "conversations" if entry.formatting == "sharegpt" else "messages")
    if needed in row or not row or refusal_of_row(mapped) is not None:
        return  # present (its value is the normaliser's to check), or data said otherwise
    problem = t("data.info_missing_column", column=needed, formatting=entry.formatting, name=entry.name,
                keys=describe_keys(row))
    suggestion = _formatting_for(row)
    if suggestion is not None and suggestion.get("formatting") != entry.formatting:
        text = json.dumps(suggestion, ensure_ascii=False)[1:-1]
        problem = t("data.info_formatting_hint", problem=problem, name=entry.name, entry=text,
                    info=str(entry.info_file))
    raise RowError(problem)


def _formatting_for(row: dict) -> dict[str, Any] | None:
    """The dataset_info.json entry keys that would read ``row`` where that is clear: a column of chat turns
    (role/content or from/value) as sharegpt, instruction and output as alpaca; else None."""
    for column, value in row.items():
        turns = _maybe_turns(value)
        if not turns:
            continue
        if all("role" in turn and "content" in turn for turn in turns):
            return {"formatting": "sharegpt", "columns": {"messages": column}, "tags": dict(_ROLE_CONTENT_TAGS)}
        if all("from" in turn and "value" in turn for turn in turns):
            found: dict[str, Any] = {"formatting": "sharegpt"}
            if column != "conversations":
                found["columns"] = {"messages": column}
            return found
    if "instruction" in row and "output" in row:
        return {"formatting": "alpaca"}
    return None


def _maybe_turns(value: Any) -> list[dict] | None:
    if isinstance(value, list) and value and all(isinstance(turn, dict) for turn in value):
        return value
    return None


def map_rows(rows: Iterable[RawRow | BadRow], entry: RegistryEntry) -> Iterator[RawRow | BadRow]:
    for raw in rows:
        if isinstance(raw, BadRow):
            yield raw
            continue
        try:
            yield RawRow(map_row(raw.value, entry), raw.line, raw.row)
        except RowError as exc:
            yield BadRow(str(exc), raw.line, raw.row)


def sample_records(records: list[Any], count: int, seed: int) -> list[Any]:
    """``count`` of ``records`` drawn with ``seed`` (file order kept); more than there are repeats them
    whole, then draws the rest."""
    if not records:
        return []
    rng = random.Random(seed)
    whole, rest = divmod(count, len(records))
    picked = sorted(rng.sample(range(len(records)), rest))
    return records * whole + [records[i] for i in picked]


def anchor_dataset_keys(config: Any, yaml_dir: Path | None) -> None:
    """Make the dataset keys of a config independent of the current directory (the trainer runs in the
    run directory): local entries absolute (``#N`` and ``:split`` kept), ``dataset_dir`` and
    ``dataset_info`` absolute, and a ``dataset_info.json`` next to the config file recorded in
    ``dataset_info`` when the run names datasets that are not paths."""
    bases = [yaml_dir] if yaml_dir is not None else []

    def absolute(value: str | None) -> str | None:
        if not value:
            return value
        found = find_local(value, bases)
        return str(found) if found is not None else value

    for key in ("dataset_dir", "dataset_info"):
        if hasattr(config, key):
            setattr(config, key, absolute(getattr(config, key)))

    def fix(spec: str) -> str:
        try:
            base, split, sample = parse_spec(spec, lambda b: find_local(b, bases) is not None)
        except ValueError:
            return spec
        found = find_local(base, bases)
        if found is None:
            return spec
        return str(found) + (f":{split}" if split else "") + (f"#{sample}" if sample is not None else "")

    value = config.dataset
    entries = dataset_entries(value)
    fixed = [fix(spec) for spec in entries]
    if isinstance(value, str):
        config.dataset = fixed[0] if len(fixed) == 1 else fixed
    elif isinstance(value, list):
        config.dataset = fixed
    named = any(find_local(parse_spec(s)[0], []) is None and not looks_like_hub_id(parse_spec(s)[0]) for s in fixed
                if _safe(s))
    if named and yaml_dir is not None and hasattr(config, "dataset_info") and not config.dataset_info \
            and not getattr(config, "dataset_dir", None) and (yaml_dir / INFO_FILE).is_file():
        config.dataset_info = str((yaml_dir / INFO_FILE).resolve())


def _safe(spec: str) -> bool:
    try:
        parse_spec(spec)
    except ValueError:
        return False
    return True
