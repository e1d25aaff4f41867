"""Listing runs and finding one by id, id prefix, name or path."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.assets import model_label
from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import render_stored
from core.paths import runs_dir
from core.runs.gpus import run_physical_gpus
from core.runs.heartbeat import last_sign_of_life, read_beats
from core.runs.launch import PROBE_COMMAND
from core.runs.liveness import effective_status, foreign_host, never_trained, stalled_step
from core.runs.run_dir import FINISHED, STALLED, RunDirectory, utc_iso
from core.runs.states import ETA_STATES, TERMINAL_STATES, can_resume
from core.watch.figures import steady_tokens_per_s


class RunNotFound(TunedeckError, LookupError):
    """No run matches (or several do); the message says which and what to type instead."""

    exit_code = EXIT_USAGE


@dataclass
class RunSummary:
    """One line of ``tunedeck runs``; the dashboard's run picker uses the same fields."""

    id: str
    status: str
    reason: str
    created: str
    model: str
    method: str
    step: int | None
    total_steps: int | None
    run_dir: str
    # a resume changed what decides the total (epochs, data …) and its trainer has not counted it yet: "?"
    total_unknown: bool = False
    loss: float | None = None
    # The last logged interval's rate: the key --json has always had (users' scripts read it), kept as it was.
    tokens_per_s: float | None = None
    steady_tokens_per_s: float | None = None  # over the steady steps so far: the figure the tables show
    eta_s: float | None = None
    gpus: list[int] = field(default_factory=list)  # run.json's, counted within the launch's CUDA_VISIBLE_DEVICES
    physical_gpus: list[str] = field(default_factory=list)  # as this box numbers them (``run_physical_gpus``)
    name: str = ""
    updated: str = ""
    reason_message: dict[str, Any] | None = None  # the reason as a message record (see RunStatus)
    has_checkpoint: bool = False  # ended with a complete checkpoint (``ended_with_checkpoint``)
    resumable: bool = False  # ended short, with a checkpoint or before its first step (``offers_resume``)
    record_error: str | None = None  # why run.json does not read (permissions, bad JSON): its facts are unknown
    # The latest sign of life (heartbeat or metric, ``last_sign_of_life``), UTC like ``updated``, and the
    # seconds since it when this was read: ``updated`` moves only with the status, these with the trainer.
    last_alive: str | None = None
    silent_s: float | None = None
    # Started by the wizard's probe (``core.plan.probe``) to measure a plan, not to train a model: run.json's
    # ``command`` is ``probe``. The Runs screen keeps these out of the way.
    probe: bool = False
    # The host run.json says the run runs on (None: it does not say). One that is not this box's
    # (``core.runs.liveness.foreign_host``: a data root shared between nodes) is not this box's to stop.
    host: str | None = None

    @property
    def reason_text(self) -> str:
        """The reason in the current interface language; ``reason`` stays English (JSON output is data)."""
        return render_stored(self.reason, self.reason_message)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shown_total(step: int | None, total: int | None, status: str) -> int | None:
    """The total a progress figure is shown against: a finished run's last step, when it ended short of
    ``max_steps`` (the epoch ran out first), so it reads ``50/50 100%`` and not ``50/54 93%``; and when it
    ended past it (resumed with a max_steps below its step, which resume refuses now), so it reads
    ``1168/1168 100%`` as the dashboard does, not ``1168/100 1168%``."""
    if status == FINISHED and step is not None and (total is None or step != total):
        return step
    return total


def ended_with_checkpoint(run: RunDirectory, status: str) -> bool:
    """The run has ended (``status``, liveness applied) and holds a complete checkpoint (a directory scan,
    the marker trusted): what resume and the after-training actions need, one rule for the dashboard and
    the Runs list. A checkpoint that turns out damaged is for those actions to say ("cannot be loaded;
    sound ones: …"), not a reason to hide their keys and leave the user guessing."""
    return status in TERMINAL_STATES and run.last_complete_checkpoint() is not None


def offers_resume(run: RunDirectory, status: str, record: dict[str, Any] | None = None) -> bool:
    """Whether a resume is offered (the Runs list and the dashboard's resume key): the run ended short
    (stopped, failed, crashed) with a complete checkpoint to go on from, or before its first training step
    (``never_trained``: the resume starts it again from step 0), and it is this host's: another host's run
    (``foreign_host``: a data root shared between nodes) trains on that host's GPUs, and its resume here is
    refused (``refuse_unresumable``). ``record``: the run's run.json when the caller has read it."""
    if not can_resume(status):
        return False
    if foreign_host(run.read_record()[0] if record is None else record) is not None:
        return False
    return run.last_complete_checkpoint() is not None or never_trained(run)


def steady_rate(run: RunDirectory, metrics: dict[str, Any]) -> float | None:
    """The run's tokens/s over its steady steps so far (``steady_tokens_per_s``): the figure the runs list,
    ``tunedeck status`` and the Runs screen show; None before its first train record. After a resume, until
    the new attempt logs, the last known (``RunDirectory.latest_metrics``), as the dashboard shows it."""
    if metrics.get("kind") not in ("train", "resumed"):
        return None
    return steady_tokens_per_s(run.first_train_metrics(), metrics)


def _physical_gpus(record: dict[str, Any]) -> list[str]:
    """``run_physical_gpus``, or run.json's ``gpus`` as they are where they are not a list of indices (edited
    by hand: the listing shows such a run; its start and resume refuse it, saying why)."""
    try:
        return run_physical_gpus(record)
    except (TypeError, ValueError):
        return [str(gpu) for gpu in record.get("gpus") or []] if isinstance(record.get("gpus"), list) else []


def summarize(run: RunDirectory) -> RunSummary:
    """Status (liveness applied), identity and the latest metrics of one run; reads only tails."""
    beats = read_beats(run.path)  # once: the stall check, the stalled step and the last sign of life
    status = effective_status(run, beats=beats)
    record, unreadable = run.read_record()  # one that does not read lists without its facts, and says why
    config = record.get("config_summary") or {}
    metrics = run.latest_metrics() or {}
    total = metrics.get("total_steps")
    if total is None and not metrics.get("total_unknown"):
        header = run.metrics_header() or {}
        total = header.get("total_steps")
    moving = status.status != STALLED  # a stalled run's last speed is no longer true
    step = metrics.get("step")
    if status.status == STALLED:  # the step its reason quotes: the heartbeat's when that is newer
        step = stalled_step(run, step, beats)
    alive = last_sign_of_life(run.path, beats)
    return RunSummary(
        id=run.id,
        status=status.status,
        reason=status.reason,
        reason_message=status.reason_message,
        created=str(record.get("created", "")),
        model=model_label(str(config.get("model", ""))),  # the bundled tiny model as "tiny", demo or wizard
        method=str(config.get("method", "")),
        step=step,
        total_steps=shown_total(step, total, status.status),
        total_unknown=bool(metrics.get("total_unknown")) and total is None,
        run_dir=str(run.path),
        loss=metrics.get("loss"),
        tokens_per_s=metrics.get("tokens_per_s") if moving else None,
        steady_tokens_per_s=steady_rate(run, metrics) if moving else None,
        eta_s=metrics.get("eta_s") if status.status in ETA_STATES else None,  # none stalled, stopping or ended
        gpus=list(record.get("gpus") or []),
        physical_gpus=_physical_gpus(record),
        name=str(config.get("name", "") or ""),
        updated=status.updated,
        has_checkpoint=ended_with_checkpoint(run, status.status),
        resumable=offers_resume(run, status.status, record),
        record_error=unreadable or None,
        last_alive=None if alive is None else utc_iso(alive),  # as created and updated
        silent_s=None if alive is None else round(max(0.0, time.time() - alive), 1),
        probe=is_probe(record),
        host=record["host"] if isinstance(record.get("host"), str) and record["host"] else None,
    )


def is_probe(record: dict[str, Any]) -> bool:
    """run.json says the wizard's probe started the run: its ``command`` (since the marking), or, for a
    probe run made before it, the command line's run file, which the probe writes under the data root's
    ``probes/`` (``core.plan.probe.probe_one``; no file a user names lives there)."""
    if record.get("command") == PROBE_COMMAND:
        return True
    argv = record.get("argv")
    if not (isinstance(argv, list) and len(argv) >= 3 and argv[1:2] == ["train"]):
        return False
    from core.paths import data_root

    try:
        return Path(str(argv[2])).parent.resolve() == (data_root() / "probes").resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def iter_run_dirs(root: Path | None = None) -> list[RunDirectory]:
    root = root or runs_dir()
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []
    return [RunDirectory(p) for p in children if (p / "run.json").is_file()]


def list_runs(root: Path | None = None) -> list[RunSummary]:
    """Every run under ``runs_dir()``, newest first, with crashed runs detected (and recorded)."""
    summaries = [summarize(run) for run in iter_run_dirs(root)]
    summaries.sort(key=lambda s: (s.created, s.id), reverse=True)
    return summaries


_ID_STAMP = re.compile(r"^\d{8}-\d{4}-")
SHOWN_MATCHES = 5  # an ambiguous reference lists this many of its matches, and says how many more


def name_part(run_id: str) -> str:
    """The id without its ``YYYYMMDD-HHMM-`` stamp: ``long-demo-9be2``, the name the Runs screen shows when
    the whole id does not fit."""
    return _ID_STAMP.sub("", run_id, count=1)


def _refers_to(run_id: str, ref: str) -> bool:
    """``ref`` is the start of the id or of its name part, or an end of the id that begins after a dash
    (``9be2``, ``demo-9be2``): what a user copies from the Runs screen or ``tunedeck runs``."""
    return (run_id.startswith(ref) or name_part(run_id).startswith(ref)
            or run_id.endswith("-" + ref.lstrip("-")))


def resolve_run(ref: str, root: Path | None = None) -> RunDirectory:
    """A run from its id, the path of its directory, its name part (the id less its date-time stamp, as
    the Runs screen shows it), or a unique start of either or end of the id (from a dash).

    The whole id wins, then a whole name part, then the starts and ends; several matches at that level
    are an error that names them (the first ``SHOWN_MATCHES``) and says how many there are."""
    from core.i18n import t

    candidate = Path(ref).expanduser()
    if (candidate / "run.json").is_file():
        return RunDirectory(candidate.resolve())
    runs = iter_run_dirs(root)
    exact = [r for r in runs if r.id == ref]
    if exact:
        return exact[0]
    named = [r for r in runs if name_part(r.id) == ref] if ref else []
    matches = named or ([r for r in runs if _refers_to(r.id, ref)] if ref.strip("-") else [])
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunNotFound(t("runs.not_found", ref=ref, root=str(root or runs_dir())))
    matches.sort(key=lambda r: r.id, reverse=True)  # newest first, like 'tunedeck runs'
    ids = ", ".join(r.id for r in matches[:SHOWN_MATCHES])
    more = len(matches) - SHOWN_MATCHES
    if more > 0:
        raise RunNotFound(t("runs.ambiguous_more", ref=ref, count=len(matches), ids=ids, more=more))
    raise RunNotFound(t("runs.ambiguous", ref=ref, count=len(matches), ids=ids))
