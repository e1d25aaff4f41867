"""What a dashboard watches: a tunedeck run directory or another trainer's output directory.

``open_watch_source(path)`` finds the metric file, the human log and the events of a directory and says which
adapter reads its records. ms-swift nests each run in ``vN-YYYYMMDD-HHMMSS/`` under the output dir (by
default ``output/<model>/``), LLaMA-Board each of its runs in ``train_<date>/``: the newest run with such a
metric file, one or two levels down, is taken. A plain HF Trainer output dir is read through its
``trainer_state.json`` (the top-level one or a ``checkpoint-N/``'s, whichever was written last), a
TensorBoard log dir through its ``events.out.tfevents.*`` files (in the dir, or under ``runs/``/``logs/``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import t

TUNEDECK = "tunedeck"
SWIFT = "swift"
LLAMAFACTORY = "llamafactory"
HF_TRAINER = "hf_trainer"
TENSORBOARD = "tensorboard"

_METRIC_FILES = ((TUNEDECK, "metrics.jsonl"), (SWIFT, "logging.jsonl"), (LLAMAFACTORY, "trainer_log.jsonl"))
# the human log of another trainer's folder, the first of these found (a dashboard names them when none is)
LOG_NAMES = ("train.log", "running_log.txt", "log.txt", "train.txt")


class SourceNotFound(TunedeckError, LookupError):
    """The directory is none of the layouts we can read; the message says what we looked for."""

    exit_code = EXIT_USAGE


class SourceNotYet(SourceNotFound):
    """A folder there and readable, with none of the files a watch reads (yet): an output dir a training that is
    starting has not written into yet (``wait_for_source`` waits for them)."""


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
    # the folder named, where the run is the newest one below it (ms-swift's vN-…/, LLaMA-Board's train_…/),
    # and the run folders there were below it then (``newer_run``: a run started there since)
    root: Path | None = None
    runs_seen: frozenset[Path] = frozenset()

    @property
    def run_id(self) -> str:
        return self.path.name


def _nested_runs(path: Path) -> list[tuple[float, str, Path, str]]:
    """Every run folder below ``path`` with another trainer's metric file: (its last write, the folder's name,
    the metric file, its kind). ms-swift's ``vN-…/`` (``--output_dir`` given) or one level deeper,
    ``<model>/vN-…/``, where ms-swift puts a run by default (``output/<model>/``); LLaMA-Board's
    ``train_<date>/`` runs under ``saves/<model>/<method>/``. A few globs and a stat per run: asked every few
    seconds (``newer_run``)."""
    try:
        candidates = [(p, kind) for kind, name in _METRIC_FILES[1:]
                      for p in (*path.glob("*/" + name), *path.glob("*/*/" + name)) if p.is_file()]
    except OSError:
        return []
    dated = []
    for file, kind in candidates:
        try:  # a run folder deleted since the glob (a rotation, rm -r) is no candidate
            dated.append((file.stat().st_mtime, file.parent.name, file, kind))
        except OSError:
            continue
    return dated


def _newest_nested_run(path: Path) -> tuple[Path, str, frozenset[Path]] | None:
    """The newest run folder below ``path`` (``_nested_runs``, by last write) and its kind, with every run
    folder found."""
    dated = _nested_runs(path)
    if not dated:
        return None
    *_, newest, kind = max(dated, key=lambda c: (c[0], c[1]))
    return newest.parent, kind, frozenset(file.parent for *_, file, _kind in dated)


def _checkpoint_step(path: Path) -> int:
    try:
        return int(path.name.rpartition("-")[2])
    except ValueError:
        return -1


def trainer_state_file(path: Path) -> Path | None:
    """The newest ``trainer_state.json`` of an HF Trainer output dir: the top-level one (written at the
    end) or a ``checkpoint-N/``'s, whichever was written last (equal times: the top-level one, then the higher
    N); None without one.
    By time, not by N: a run started again in a used output folder writes checkpoint-50 while the previous
    run's checkpoint-1000 is still there, and the dashboard showed the old run's end for the new run."""
    candidates = [(0, -1, path / "trainer_state.json")]
    try:
        candidates += [(1, _checkpoint_step(p), p / "trainer_state.json") for p in path.glob("checkpoint-*")]
    except OSError:
        pass
    best: tuple[float, int, int, Path] | None = None
    for rank, step, candidate in candidates:
        try:
            if not candidate.is_file():
                continue
            key = (candidate.stat().st_mtime, -rank, step, candidate)
        except OSError:
            continue
        if best is None or key[:3] > best[:3]:
            best = key
    return None if best is None else best[3]


def current_checkpoints(path: Path) -> list[tuple[float, Path]]:
    """(time written, ``trainer_state.json``) of the checkpoints of the run last written into an HF Trainer
    output dir, oldest first: the newest checkpoints whose steps rise with their times. A previous run's
    checkpoints left in the folder (a higher step written before a lower one) are not this run's."""
    dated = []
    try:
        folders = list(path.glob("checkpoint-*"))
    except OSError:
        return []
    for folder in folders:
        try:
            dated.append((folder.joinpath("trainer_state.json").stat().st_mtime, _checkpoint_step(folder),
                          folder / "trainer_state.json"))
        except OSError:
            continue
    dated.sort(key=lambda c: (c[0], c[1]))
    run: list[tuple[float, Path]] = []
    step = None
    for when, number, state in reversed(dated):
        if step is not None and number >= step:
            break  # a step not below the next one's: an earlier run's checkpoint
        run.append((when, state))
        step = number
    run.reverse()
    return run


EVENT_GLOB = "events.out.tfevents.*"


def event_files(path: Path) -> list[Path]:
    """TensorBoard event files of a log dir: in it, or in ``runs/``/``logs/`` (and one level below)."""
    found: list[Path] = []
    for folder in (path, path / "runs", path / "logs"):
        if not folder.is_dir():
            continue
        found.extend(p for p in folder.glob(EVENT_GLOB) if p.is_file())
        found.extend(p for p in folder.glob("*/" + EVENT_GLOB) if p.is_file())
    return found


def newest_event_dir(path: Path) -> Path | None:
    """The folder of the newest event file (one writer's run: HF writes ``runs/<date>_<host>/``)."""
    files = event_files(path)
    if not files:
        return None
    return max(files, key=lambda p: (p.stat().st_mtime, p.name)).parent


def tensorboard_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def open_watch_source(path: Path | str) -> WatchSource:
    """The watch source for a directory: tunedeck run (has run.json), ms-swift, LLaMA-Factory or HF
    Trainer output, or a TensorBoard log dir."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise SourceNotFound(t("watch.not_a_dir", path=str(path)))
    try:
        with os.scandir(path) as entries:
            next(entries, None)
    except OSError as error:  # it said "not a … output directory, looked for …": none of its files could be seen
        raise SourceNotFound(t("watch.dir_unreadable", path=str(path), error=error.strerror or str(error))) from error
    if (path / "run.json").is_file():
        log = path / "train.log"
        return WatchSource(TUNEDECK, path, path / "metrics.jsonl", log, path / "events.jsonl", read_only=False)
    kind = next((k for k, name in _METRIC_FILES if (path / name).is_file()), None)
    if kind is None:
        nested = _newest_nested_run(path)
        if nested is None:
            return _open_other(path)
        nested_path, kind, seen = nested
        return _open_run(nested_path, kind, path, seen)
    return _open_run(path, kind, None, frozenset())


def open_llamafactory(path: Path) -> WatchSource:
    """The LLaMA-Factory run of ``path``, its trainer_log.jsonl there or not (yet): named by the user, the file
    a run started again with overwrite_output_dir removed as it began is that run's, read once it comes."""
    return _open_run(Path(path), LLAMAFACTORY, None, frozenset())


def _open_run(path: Path, kind: str, root: Path | None, seen: frozenset[Path]) -> WatchSource:
    """An ms-swift or LLaMA-Factory run folder (``root``: the folder named above it, if any)."""
    metrics = path / dict(_METRIC_FILES)[kind]
    log = next((path / n for n in LOG_NAMES if (path / n).is_file()), None)
    return WatchSource(kind, path, metrics, log, None, read_only=True, facts=_external_facts(kind, path),
                       root=root, runs_seen=seen)


def newer_run(source: WatchSource) -> WatchSource | None:
    """A run started below the folder named (``source.root``) since ``source`` was opened: ms-swift's next
    ``vN-…/``, LLaMA-Board's next ``train_…/``; of several, the one written last. None where there is none,
    or ``source`` is not a run of a folder named. A run folder that was there already is never offered (two
    runs written side by side do not take turns), and every run folder is looked at, not only the one
    written last: a new run beside a busy one (which logs more often) was found only once it wrote after it.
    Asked every few seconds: a few globs and stats, and a run's files are read only for a new one."""
    if source.root is None:
        return None
    runs = _nested_runs(source.root)
    fresh = [run for run in runs if run[2].parent != source.path and run[2].parent not in source.runs_seen]
    if not fresh:
        return None
    _when, _name, file, kind = max(fresh, key=lambda c: (c[0], c[1]))
    seen = frozenset(run[2].parent for run in runs)
    try:
        return _open_run(file.parent, kind, source.root, seen)
    except OSError:
        return None


# What a LLaMA-Factory run leaves in its output dir beside trainer_log.jsonl: LLaMA-Board's saved arguments and
# log, the loss plot (plot_loss), the model card it tags "llama-factory"
_LLAMAFACTORY_MARKS = ("llamaboard_config.yaml", "training_args.yaml", "running_log.txt", "training_loss.png")


def _llamafactory_dir(path: Path) -> bool:
    """A LLaMA-Factory output dir (by what its runs leave there, ``_LLAMAFACTORY_MARKS``), its trainer_log.jsonl
    or not."""
    if any((path / name).is_file() for name in _LLAMAFACTORY_MARKS):
        return True
    try:
        with open(path / "README.md", "rb") as card:
            return b"llama-factory" in card.read(4096).lower()
    except OSError:
        return False


def _open_other(path: Path) -> WatchSource:
    """An HF Trainer output dir or a TensorBoard log dir; SourceNotFound naming what was looked for.

    A LLaMA-Factory output dir without its trainer_log.jsonl is a run started again there with
    overwrite_output_dir (it removes the file as it begins, minutes before its first line): it is watched as
    LLaMA-Factory's, the file read once it comes. The previous run's trainer_state.json beside it was read as an
    HF Trainer dir: a fresh ``watch`` showed the old run's figures and said "finished" of the new one."""
    if _llamafactory_dir(path):  # (LLaMA-Board saves its arguments there before the run starts: waited for too)
        return open_llamafactory(path)
    state = trainer_state_file(path)
    log = next((path / n for n in LOG_NAMES if (path / n).is_file()), None)
    if state is not None:
        return WatchSource(HF_TRAINER, path, state, log, None, read_only=True,
                           facts=_model_facts(state.parent) or _model_facts(path))
    events = newest_event_dir(path)
    if events is not None:
        if not tensorboard_available():
            raise SourceNotFound(t("watch.tensorboard_missing", path=str(events)))
        return WatchSource(TENSORBOARD, path, events, log, None, read_only=True, facts=_model_facts(path))
    files = [name for _k, name in _METRIC_FILES] + ["checkpoint-*/trainer_state.json", EVENT_GLOB]
    raise SourceNotYet(t("watch.unknown_dir", path=str(path), files=", ".join(files)))


def wait_for_source(path: Path | str, waiting: Any, interval_s: float = 1.0, sleep: Any = None) -> WatchSource:
    """``open_watch_source``, waiting (as ``tail -F`` does) while the folder is there with none of the files it
    reads yet: a training that is starting writes its first records minutes after its output folder. ``waiting``
    is called once, with the reason (``SourceNotYet``), before the first wait. A folder that is not there, cannot
    be read or holds what cannot be read (SourceNotFound) is said at once; Ctrl+C ends the wait."""
    import time

    sleep = time.sleep if sleep is None else sleep
    said = False
    while True:
        try:
            return open_watch_source(path)
        except SourceNotYet as error:
            if not said:
                waiting(error)
                said = True
        sleep(interval_s)


def _model_facts(folder: Path) -> dict[str, Any]:
    """Model and method from what HF Trainer saves with a checkpoint (peft's adapter_config.json, else
    the model's config.json)."""
    for name in ("adapter_config.json", "config.json"):
        try:
            data = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        if name == "adapter_config.json":
            peft = data.get("peft_type")
            facts = {"model": data.get("base_model_name_or_path"), "method": str(peft).lower() if peft else None}
        else:
            facts = {"model": data.get("_name_or_path"), "method": "full",
                     "precision": data.get("torch_dtype") or data.get("dtype")}
        return {k: v for k, v in facts.items() if v}
    return {}


def _external_facts(kind: str, path: Path) -> dict[str, Any]:
    """Model, method and precision from the tool's saved arguments, where it saves them."""
    facts: dict[str, Any] = {}
    if kind == SWIFT:
        args: Any = {}
        for name in ("args.json", "sft_args.json"):  # ms-swift ≥ 3 writes args.json, 1.x/2.x sft_args.json
            try:
                args = json.loads((path / name).read_text(encoding="utf-8"))
                break
            except (OSError, ValueError):
                continue
        if isinstance(args, dict):
            facts["model"] = args.get("model") or args.get("model_id_or_path") or args.get("model_type")
            # ms-swift 4 names it tuner_type; 3.x train_type (Megatron-SWIFT too); 1.x/2.x sft_type
            facts["method"] = args.get("tuner_type") or args.get("train_type") or args.get("sft_type")
            dtype = args.get("torch_dtype") or args.get("dtype")  # 1.x/2.x: dtype ("bf16"; AUTO if unresolved)
            facts["precision"] = None if str(dtype).upper() == "AUTO" else dtype
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
