"""What a dashboard watches: a tunedeck run directory or another trainer's output directory.

``open_source(path)`` finds the metric file, the human log and the events of a directory and says which
adapter reads its records. ms-swift nests each run in ``vN-YYYYMMDD-HHMMSS/`` under the output dir: the
newest such run with a ``logging.jsonl`` is taken.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.i18n import t

TUNEDECK = "tunedeck"
SWIFT = "swift"
LLAMAFACTORY = "llamafactory"

_METRIC_FILES = ((TUNEDECK, "metrics.jsonl"), (SWIFT, "logging.jsonl"), (LLAMAFACTORY, "trainer_log.jsonl"))
_LOG_NAMES = ("train.log", "running_log.txt", "log.txt", "train.txt")


class SourceNotFound(LookupError):
    """The directory is none of the layouts we can read; the message says what we looked for."""


@dataclass
class WatchSource:
    """Paths and identity of one watched directory."""

    kind: str
    path: Path
    metrics_path: Path
    log_path: Path | None
    events_path: Path | None
    read_only: bool
    facts: dict[str, Any] = field(default_factory=dict)  # model, method, precision … known up front

    @property
    def run_id(self) -> str:
        return self.path.name


def _newest_swift_run(path: Path) -> Path | None:
    candidates = [p for p in path.iterdir() if p.is_dir() and (p / "logging.jsonl").is_file()]
    if not candidates:
        return None
    return max(candidates, key=lambda p: ((p / "logging.jsonl").stat().st_mtime, p.name))


def open_source(path: Path | str) -> WatchSource:
    """The watch source for a directory: tunedeck run (has run.json), ms-swift or LLaMA-Factory output."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise SourceNotFound(t("watch.not_a_dir", path=str(path)))
    if (path / "run.json").is_file():
        log = path / "train.log"
        return WatchSource(TUNEDECK, path, path / "metrics.jsonl", log, path / "events.jsonl", read_only=False)
    kind = next((k for k, name in _METRIC_FILES if (path / name).is_file()), None)
    if kind is None:
        nested = _newest_swift_run(path)
        if nested is None:
            raise SourceNotFound(t("watch.unknown_dir", path=str(path),
                                   files=", ".join(name for _k, name in _METRIC_FILES)))
        path, kind = nested, SWIFT
    metrics = path / dict(_METRIC_FILES)[kind]
    log = next((path / n for n in _LOG_NAMES if (path / n).is_file()), None)
    return WatchSource(kind, path, metrics, log, None, read_only=True, facts=_external_facts(kind, path))


def _external_facts(kind: str, path: Path) -> dict[str, Any]:
    """Model, method and precision from the tool's saved arguments, where it saves them."""
    facts: dict[str, Any] = {}
    if kind == SWIFT:
        try:
            args = json.loads((path / "args.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            args = {}
        if isinstance(args, dict):
            facts["model"] = args.get("model") or args.get("model_id_or_path")
            facts["method"] = args.get("train_type") or args.get("sft_type")
            facts["precision"] = args.get("torch_dtype")
            deepspeed = args.get("deepspeed")
            if isinstance(deepspeed, str) and deepspeed.startswith("zero"):
                facts["zero_stage"] = deepspeed[4:5]
    elif kind == LLAMAFACTORY:
        import yaml

        for name in ("llamaboard_config.yaml", "training_args.yaml"):
            try:
                data = yaml.safe_load((path / name).read_text(encoding="utf-8"))
            except (OSError, ValueError, yaml.YAMLError):
                continue
            if isinstance(data, dict):
                facts.setdefault("model", data.get("model_name_or_path") or data.get("top.model_name"))
                facts.setdefault("method", data.get("finetuning_type") or data.get("top.finetuning_type"))
                facts.setdefault("precision", "bf16" if data.get("bf16") else "fp16" if data.get("fp16") else None)
    return {k: v for k, v in facts.items() if v}
