"""What a run was trained on, recorded when it starts and compared when it resumes.

A resume that finds a change records the new state, so the next one compares with what the run last
started or resumed with, and each change is told once (its event in events.jsonl keeps the history).

``fingerprint.json`` in the run directory holds, for each local dataset file, its path, size, mtime and
record count, and for the configuration a hash of the training-relevant keys with their values (so a
change can be named key by key). ``tunedeck resume`` compares: a dataset file that is gone refuses the
resume before anything starts; a changed file, or a changed key, is a warning naming what changed.

Resume stays cheap for unchanged data: a file whose size and mtime match is not read again; only a
changed one is re-counted.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.atomic_file import write_json_atomic
from core.i18n import Message

FINGERPRINT_FILE = "fingerprint.json"
SCHEMA = 1
# Keys that do not change what is trained (a label, where outputs are copied to).
UNTRAINED_KEYS = frozenset({"name", "output"})


def _local_files(spec: str) -> tuple[str, list[Path]] | None:
    """(kind, files) of a dataset spec that names a local file or folder; None for anything else."""
    from core.data.loading import data_files_in
    from core.data.registry import parse_spec

    split = None
    try:  # a file sampled with #N (or given a :split) is still that file; a folder's :split picks its files
        spec, split, _sample = parse_spec(spec, lambda base: Path(base).expanduser().exists())
    except ValueError:
        pass
    path = Path(spec).expanduser()
    if path.is_file():
        return "file", [path]
    if path.is_dir():
        return "dir", data_files_in(path, split)
    return None


def count_records(path: Path) -> int | None:
    """How many records the loaders read from ``path`` (None when it cannot be read at all)."""
    from core.data import DataError, read_dataset

    try:
        return len(read_dataset(path).records)
    except (DataError, OSError):
        return None


def file_fingerprint(path: Path) -> dict[str, Any]:
    info = path.stat()
    return {"path": str(path), "size": info.st_size, "mtime": info.st_mtime, "records": count_records(path)}


def data_fingerprint(datasets: Any) -> list[dict[str, Any]]:
    """One entry per dataset spec: ``{"spec", "kind": file|dir|hub, "files": [...]}``."""
    specs = [datasets] if isinstance(datasets, str) else list(datasets or [])
    entries = []
    for spec in specs:
        spec = str(spec)
        local = _local_files(spec)
        if local is None:
            entries.append({"spec": spec, "kind": "hub", "files": []})
            continue
        kind, files = local
        entries.append({"spec": spec, "kind": kind, "files": [file_fingerprint(f) for f in files]})
    return entries


def config_fingerprint(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = {k: v for k, v in sorted(cfg.items()) if k not in UNTRAINED_KEYS}
    text = json.dumps(keys, sort_keys=True, default=str, ensure_ascii=False)
    return {"hash": hashlib.sha256(text.encode("utf-8")).hexdigest(), "keys": keys}


def record_fingerprint(run_path: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    """Write ``fingerprint.json`` for the resolved configuration ``cfg`` of the run at ``run_path``."""
    value = {"schema": SCHEMA, "data": data_fingerprint(cfg.get("dataset")), "config": config_fingerprint(cfg)}
    write_json_atomic(Path(run_path) / FINGERPRINT_FILE, value)
    return value


def read_fingerprint(run_path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads((Path(run_path) / FINGERPRINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) and value.get("schema") == SCHEMA else None


@dataclass
class FingerprintReport:
    """The differences between a run's recorded fingerprint and what resume would now train on.

    ``missing`` refuses the resume; ``data_changed`` and ``config_changed`` are warnings. ``events`` are
    the same findings as data for events.jsonl.
    """

    recorded: bool = True
    missing: list[Message] = field(default_factory=list)
    data_changed: list[Message] = field(default_factory=list)
    config_changed: list[Message] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def warnings(self) -> list[Message]:
        return self.data_changed + self.config_changed


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value


def _file_changes(old: dict[str, Any], path: Path) -> tuple[list[Message], dict[str, Any]] | None:
    """What changed in one recorded file (None: nothing). Re-counts its records only if it changed."""
    info = path.stat()
    if info.st_size == old.get("size") and info.st_mtime == old.get("mtime"):
        return None
    records = count_records(path)
    changes: list[Message] = []
    if records != old.get("records"):
        changes.append(Message("resume.change_rows", old=_show(old.get("records")), new=_show(records)))
    if info.st_size != old.get("size"):
        changes.append(Message("resume.change_size", old=old.get("size"), new=info.st_size))
    if not changes:
        changes.append(Message("resume.change_mtime"))
    data = {"path": str(path), "old": {k: old.get(k) for k in ("size", "mtime", "records")},
            "new": {"size": info.st_size, "mtime": info.st_mtime, "records": records}}
    return changes, data


def compare_fingerprint(run_path: Path, cfg: dict[str, Any]) -> FingerprintReport:
    """Compare the run's ``fingerprint.json`` with configuration ``cfg`` and the data it names now."""
    report = FingerprintReport()
    recorded = read_fingerprint(run_path)
    if recorded is None:  # a run started before fingerprints: a dataset path that is gone still refuses
        from core.data.loading import looks_like_hub_id

        report.recorded = False
        specs = cfg.get("dataset")
        for spec in [specs] if isinstance(specs, str) else list(specs or []):
            if _local_files(str(spec)) is None and not looks_like_hub_id(str(spec)):
                report.missing.append(Message("resume.data_missing_unrecorded", path=str(spec)))
                report.events.append(("data_missing", {"path": str(spec)}))
        return report
    old_keys = (recorded.get("config") or {}).get("keys") or {}
    new_keys = config_fingerprint(cfg)["keys"]
    for key in sorted(set(old_keys) | set(new_keys)):
        if key in UNTRAINED_KEYS or old_keys.get(key) == new_keys.get(key):
            continue
        old, new = _show(old_keys.get(key)), _show(new_keys.get(key))
        report.config_changed.append(Message("resume.config_changed", key=key, old=old, new=new))
        report.events.append(("config_changed", {"key": key, "old": old_keys.get(key), "new": new_keys.get(key)}))
    old_files = {f["path"]: f for entry in recorded.get("data") or [] for f in entry.get("files") or []}
    old_specs = {entry.get("spec"): entry for entry in recorded.get("data") or []}
    specs = cfg.get("dataset")
    for spec in [specs] if isinstance(specs, str) else list(specs or []):
        spec = str(spec)
        local = _local_files(spec)
        before = old_specs.get(spec)
        if local is None:
            if before is not None and before.get("kind") != "hub":  # it was a local file or folder
                records = sum(int(f.get("records") or 0) for f in before.get("files") or [])
                report.missing.append(Message("resume.data_missing", path=spec, records=records))
                report.events.append(("data_missing", {"path": spec}))
            continue
        _kind, files = local
        for path in files:
            old = old_files.get(str(path))
            if old is None:
                report.data_changed.append(Message("resume.data_new_file", path=str(path)))
                report.events.append(("data_changed", {"path": str(path), "new_file": True}))
                continue
            try:
                found = _file_changes(old, path)
            except OSError:
                report.missing.append(Message("resume.data_missing", path=str(path), records=old.get("records")))
                report.events.append(("data_missing", {"path": str(path)}))
                continue
            if found is not None:
                changes, data = found
                report.data_changed.append(Message("resume.data_changed", path=str(path), changes=changes))
                report.events.append(("data_changed", data))
        if before is not None and before.get("kind") == "dir":
            now = {str(p) for p in files}
            for gone in (f["path"] for f in before.get("files") or []):
                if gone in now:
                    continue
                if not os.path.exists(gone):
                    report.data_changed.append(Message("resume.data_file_removed", path=gone, folder=spec))
                    report.events.append(("data_changed", {"path": gone, "removed": True}))
                else:  # there still, not read: named for another split (a run started before folders were split)
                    report.data_changed.append(Message("resume.data_file_left_out", path=gone, folder=spec))
                    report.events.append(("data_changed", {"path": gone, "left_out": True}))
    return report
