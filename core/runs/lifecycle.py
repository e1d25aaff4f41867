"""The life of a run: start it, resume it, stop it. One implementation for every caller.

``tunedeck train / demo / resume / stop`` (``core.runs.commands``), the wizard's launch, the planner's
probe, the dashboard and the Runs list all come here, so a run started or resumed from any of them gets
the same checks (config, model, LoRA targets, data, GPUs and their memory, disk space), the same run
directory and the same handling of a supervisor that dies at once (the run is marked failed, not left queued)::

    start_run("run.yaml", ["lr=1e-4"]) -> RunDirectory        # checked, created, supervisor started
    resume_run(run, checkpoint=None, weights_only=False, overrides=()) -> ResumePlan
    stop_run(run, force=False) -> StopResult                   # SIGTERM: checkpoint, then exit
    stop_run_and_wait(run, force=False, timeout_s=None) -> StopResult   # ... and wait for a final state
    can_stop(status) / can_resume(status)                      # what a state allows (core.runs.states)

Each raises ``RunError`` (``core.runs.errors``) with a message a user can act on and the exit code the
CLI uses. Warnings that do not stop anything (precision fallback, a disk that barely holds the
checkpoints, an imported config's mapping) go to ``warn``, standard error unless the caller says
otherwise. Nothing here prints on standard output: the CLI does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from core.errors import training_stack_missing
from core.i18n import Message, t
from core.runs.errors import GpuMemoryShort, GpusInUse, RunError, SupervisorDidNotStart
from core.runs.run_dir import RunDirectory
from core.runs.states import RunState, can_resume, can_stop

Warn = Callable[[str], None]


def warn_on_stderr(text: str) -> None:
    """The default ``warn``: one line on standard error, as the CLI has always printed warnings."""
    print(text, file=sys.stderr)


@dataclass
class RunFile:
    """A run file loaded and checked (``load_run_file``): the config, and the peer import it came from
    (a LLaMA-Factory / ms-swift file: ``core.config.importers.ImportedConfig``), else None."""

    config: Any
    imported: Any = None


@dataclass
class RunCheck:
    """What ``tunedeck train --check`` reports: the config as it would run here, and its GPUs."""

    config: Any
    gpus: list[int]
    imported: Any = None
    gpu_memory: Any = None  # core.runs.gpu_memory.GpuMemoryCheck; None on a CPU


# -- start ---------------------------------------------------------------------------------------
def load_run_file(path: str | Path, overrides: Sequence[str] = (), warn: Warn = warn_on_stderr) -> RunFile:
    """The checked configuration of the run file at ``path`` with ``key=value`` ``overrides``.

    A tunedeck YAML, or a LLaMA-Factory / ms-swift file converted (its mapping said through ``warn``);
    relative model and dataset paths made absolute (the trainer runs in the run directory); then the
    checks against the model, its LoRA targets and the data that must pass before anything starts.
    Nothing is written. Raises ``RunError`` (code 2) with every problem found.
    """
    from core.config import ConfigError, load_run_config
    from core.config.importers import blocking_lines, detect_peer, import_file, load_imported_config

    path = str(path)
    imported = None
    try:
        if detect_peer(path):
            imported = import_file(path)
            warn(t("runs.imported", path=path, peer=imported.peer_name))
            warn(imported.mapping_text())
            blocked = blocking_lines(imported, list(overrides))
            if blocked:
                raise RunError(t("runs.import_blocked", path=path,
                                 lines="\n".join(f"  {line.text()}" for line in blocked)), 2)
            config = load_imported_config(imported, list(overrides), gpu_caps=_gpu_caps(), for_training=True)
        else:
            config = load_run_config(path, list(overrides), gpu_caps=_gpu_caps(), for_training=True)
    except ConfigError as exc:
        raise RunError(str(exc), 2) from exc
    except FileNotFoundError as exc:
        raise RunError(t("runs.config_missing", path=path), 2) from exc
    for warning in getattr(config, "warnings", []) or []:
        warn(str(warning))  # "FILE:LINE: warning: KEY: ..." (the issue says its own prefix)
    from core.config.checks import model_as_launched, run_file_dir

    as_loaded = model_as_launched(config.model, run_file_dir(path))  # the folder the load's checks looked at
    _absolute_local_paths(config, Path(path).resolve().parent)
    _check_model(config, as_loaded, warn)
    _check_lora_targets(config)
    _check_data(config)
    _check_template_reads_thinking(config, path, warn)
    return RunFile(config, imported)


def check_run_file(path: str | Path, overrides: Sequence[str] = (), warn: Warn = warn_on_stderr,
                   allow_shared_gpus: bool = False, allow_over_memory: bool = False,
                   distributed: Any = None) -> RunCheck:
    """Every check ``start_run`` makes before it writes anything, nothing started: the config as it would
    run on this box (bf16/fp16 without a GPU become fp32, said through ``warn``), the GPUs it gets and the
    verdict on their memory (``GpuMemoryShort`` past it, unless ``allow_over_memory``)."""
    loaded = load_run_file(path, overrides, warn)
    config = loaded.config
    gpus = _claim_gpus(config, _check_box(config, warn), allow_shared_gpus, warn)  # a live run's GPUs, as train
    memory = _check_gpu_memory(config, gpus, _read_room(gpus), _world(gpus, distributed), warn, allow_over_memory)
    if not gpus and config.precision != "fp32":
        from core.config.issues import WARNING, ConfigIssue

        message = t("launch.precision_cpu", precision=config.precision)
        warn(message)
        # in the config's warnings too: `train --check --json` lists them
        config.warnings = [*(getattr(config, "warnings", None) or []),
                           ConfigIssue(str(path), None, "precision", message, WARNING)]
        config.precision, config.pure_bf16 = "fp32", False
    message = _sdpa_without_gpus(config, gpus, warn)
    if message is not None:
        from core.config.issues import WARNING, ConfigIssue

        config.warnings = [*(getattr(config, "warnings", None) or []),
                           ConfigIssue(str(path), None, "attn", message, WARNING)]
    return RunCheck(config, gpus, loaded.imported, memory)


def prepare_run(config: Any, argv: Sequence[str], command: str = "train", distributed: Any = None,
                warn: Warn = warn_on_stderr, allow_shared_gpus: bool = False,
                allow_over_memory: bool = False) -> RunDirectory:
    """Create the run directory of a checked ``RunConfig`` (queued, nothing started) for this box.

    Refuses what this box cannot run (GPUs asked for, QLoRA or ZeRO without a GPU) and checkpoints its
    disk cannot hold; resolves what really runs here into the run's config.yaml (precision, an absolute
    ``output``, ``checkpoint_layers: auto``, ``tiled_mlp: auto``) and records the data fingerprint resume compares with.
    ``argv`` is the command line recorded in run.json; ``command`` is ``train``, ``demo`` or ``probe`` (``PROBE_COMMAND``).
    A live run of this box on any of the same GPUs refuses it (``GpusInUse``) unless ``allow_shared_gpus``;
    a ``train`` whose estimated peak is past its GPUs' free memory (``GpuMemoryShort``) unless ``allow_over_memory``.
    """
    from core.runs.fingerprint import record_fingerprint
    from core.runs.launch import create_run

    gpus = _check_box(config, warn)
    with _one_claim_at_a_time():  # two launches at once: the second sees the first's queued run and its GPUs
        gpus = _claim_gpus(config, gpus, allow_shared_gpus, warn, elsewhere=command != "demo")
        # The memory the GPUs have free now: the auto keys are chosen for it, and a train is refused past it
        # (before _resolve_for_this_box creates the output folder). Without a reading, the table's card.
        room = _read_room(gpus) if gpus else None
        from core.runs.gpu_memory import Room

        caps = None
        if gpus and not isinstance(room, Room) and "auto" in (config.checkpoint_layers, config.tiled_mlp):
            caps = _gpu_caps()
        card = room.spec if isinstance(room, Room) else caps and caps["name"]
        if config.checkpoint_layers == "auto":
            from core.estimate.checkpointing import resolve_checkpoint_layers

            config.checkpoint_layers = resolve_checkpoint_layers(config, card, len(gpus))
            warn(t("runs.checkpoint_layers_chosen", value=config.checkpoint_layers))
        if config.tiled_mlp == "auto" and card:
            from core.estimate.checkpointing import resolve_tiled_mlp

            config.tiled_mlp = resolve_tiled_mlp(config, card, len(gpus))
            if config.tiled_mlp == "false":
                warn(t("runs.tiled_mlp_untiled"))
        if command == "train":  # the demo's tiny model and the planner's probe (a measurement) are not asked
            _check_gpu_memory(config, gpus, room, _world(gpus, distributed), warn, allow_over_memory)
        precision_asked = _resolve_for_this_box(config, gpus, warn)
        run = create_run(config, list(argv), command=command, gpus=gpus, distributed=distributed)
        if allow_over_memory and command == "train":  # its resumes honour it
            run.update_record(allow_over_memory=True)
    if precision_asked:  # the config says fp32 now; the event keeps what was asked for
        run.append_event("precision_fallback", requested=precision_asked, used="fp32", reason="no GPU")
    record_fingerprint(run.path, run.config())  # what resume compares the data and keys with
    return run


def start_run(config: str | Path | Any, overrides: Sequence[str] = (), distributed: Any = None, *,
              argv: Sequence[str] | None = None, command: str = "train",
              warn: Warn = warn_on_stderr, allow_shared_gpus: bool = False,
              allow_over_memory: bool = False) -> RunDirectory:
    """Start a detached run and return its ``RunDirectory`` once its supervisor holds the run's lock.

    ``config`` is the path of a run file (loaded and checked by ``load_run_file`` with ``overrides``) or
    a ``RunConfig`` the caller built and checked (the demo's), taken as it is. ``distributed`` is a
    ``core.runs.launch.DistributedSettings`` for a multi-node run. ``argv`` is what run.json records as
    the command line (by default the ``tunedeck train`` that does the same). Raises ``RunError``: a check
    that failed (code 2; ``GpusInUse`` when a live run has some of its GPUs, unless ``allow_shared_gpus``;
    ``GpuMemoryShort`` when the estimate is past the GPUs' free memory, unless ``allow_over_memory``),
    a disk that cannot be written, or ``SupervisorDidNotStart`` (code 1).
    """
    from core.runs.disk_space import cannot_write_message, is_unwritable

    if isinstance(config, (str, Path)):
        if argv is None:
            argv = ["tunedeck", "train", str(config), *overrides]
            if distributed is not None and distributed.nnodes > 1:
                argv += [f"--nnodes={distributed.nnodes}", f"--node-rank={distributed.node_rank}",
                         f"--master-addr={distributed.master_addr}", f"--master-port={distributed.master_port}"]
        config = load_run_file(config, overrides, warn).config
    elif overrides:
        raise ValueError("overrides apply to a run file; apply them to a RunConfig before start_run")
    try:
        run = prepare_run(config, argv or ["tunedeck", command], command, distributed, warn, allow_shared_gpus,
                          allow_over_memory)
        _start(run)
    except OSError as exc:
        if not is_unwritable(exc):
            raise
        raise RunError(cannot_write_message(exc), 1) from exc
    return run


# -- resume --------------------------------------------------------------------------------------
def resume_run(run: RunDirectory, checkpoint: int | None = None, weights_only: bool = False,
               overrides: Sequence[str] = (), warn: Warn = warn_on_stderr,
               notice: Callable[[Message], None] | None = None, allow_shared_gpus: bool = False,
               allow_over_memory: bool = False) -> Any:
    """Resume a stopped, failed or crashed run from its newest sound checkpoint (one that ended before its
    first step, with none, starts again from step 0: ``never_trained``); returns the
    ``core.runs.control.ResumePlan`` (checkpoint, None from step 0; step; notices) once the new supervisor has started.

    ``checkpoint`` picks checkpoint N instead; ``weights_only`` accepts one without optimizer state (the
    optimizer and LR schedule restart); ``overrides`` (``key=value``) change the run's config.yaml. The
    configuration (config.yaml as it is now, with the overrides) and the data are checked as ``train``
    checks them, and refused with nothing changed. The disk must hold the checkpoints still to come, and a
    live run of this box on any of its GPUs refuses it as it refuses ``train`` (``allow_shared_gpus``); a
    ``gpus=`` override moves the run to the GPUs it names, as many as it had (``_moving_gpus``). Its estimated
    peak past those GPUs' free memory refuses it as it refuses ``train`` (``allow_over_memory``). Each
    notice of the plan (fallbacks, removals, changed data or keys) goes to ``notice`` before the run
    starts, by default to ``warn`` as the CLI says it. Raises ``RunError``; if the supervisor exits at
    once, ``SupervisorDidNotStart`` and the run is marked failed.
    """
    from core.runs.control import prepare_resume, refuse_unresumable
    from core.runs.liveness import never_trained

    refuse_unresumable(run)  # a running or finished run is told so before anything about its config
    _check_training_stack()
    # The run's config.yaml (hand-edited perhaps) with the overrides, checked as `train` checks a run file
    config = _resume_config(run, list(overrides), warn)
    values = config.to_dict() if overrides else run.config()
    _check_disk_space(values, run.path, len(run.checkpoints(complete_only=True)), warn)
    # The GPUs the resumed trainer gets: run.json's, which the supervisor reads (refuse_unresumable has made
    # sure it reads and lists them), not config.yaml's ``gpus`` resolved again on the box as it is now; a
    # ``gpus=`` override moves the run to the GPUs it names, as many as before.
    from core.runs.gpus import recorded_visible

    record = run.read_launch_record()[0]
    gpus = list(record["gpus"])
    moving = _moving_gpus(run, config, overrides, gpus)
    if moving is None:
        _check_recorded_gpus_not_lost(run, record)
    if gpus:  # a CPU run parks no activations in pinned memory
        _check_host_memory(values, warn, processes=len(gpus))
    known, visible = recorded_visible(record)  # what the indices count within (start_supervisor restores it)
    # The look at the live runs' GPUs and this run queued on them (counted live by the next look) are one step,
    # as a launch's are: a launch or a resume at the same instant waits, then sees this run on its GPUs.
    with _one_claim_at_a_time():
        # A resume that held the lock before this one has queued the run, which the look below counts as a live
        # run on its own GPUs: the second of two resumes at once was refused "GPU 0 is in use by run <this run>
        # (queued) … --allow-shared-gpus" (a CPU run warned it shared the CPU with itself). Said as it is.
        refuse_unresumable(run)
        if moving is not None:  # indices of this shell's CUDA_VISIBLE_DEVICES, as `train` takes them
            moving = _claim_gpus(config, moving, allow_shared_gpus, warn)
        else:  # `train` twice and `train` + `resume` alike
            _check_gpus_free(gpus, allow_shared_gpus, warn, visible=visible if known else "ours")
        if gpus:  # the resumed trainer's GPUs as they are now, the config with its overrides: as train asks
            spread = record.get("distributed")
            nodes = int(spread.get("nnodes") or 1) if isinstance(spread, dict) else 1
            room = _read_room(moving) if moving is not None else _read_room(gpus, visible if known else "ours")
            # A run that trained here with the memory keys as they are measured that it fits: the estimate
            # warns then, it does not refuse (a run started with --allow-over-memory, or before the check).
            same = moving is None and not _memory_changed(run, config)
            trained = same and not never_trained(run)
            _check_gpu_memory(config, moving if moving is not None else gpus, room, len(gpus) * nodes, warn,
                              allow_over_memory or (same and record.get("allow_over_memory") is True), trained,
                              resume=_samples_per_step(run))
        plan = prepare_resume(run, step=checkpoint, weights_only=weights_only,
                              config=config if overrides else None, check_data=lambda: _check_data(config))
        if moving is not None:
            _record_moved_gpus(run, record, moving)
        if allow_over_memory:  # later resumes (cron's, scripted) honour it
            run.update_record(allow_over_memory=True)
    for each in plan.notices:
        if notice is not None:
            notice(each)
        else:
            warn(t("resume.notice", text=each.text()))
    _start(run, resume_from=plan.checkpoint)
    return plan


# -- stop ----------------------------------------------------------------------------------------
def stop_run(run: RunDirectory, force: bool = False) -> Any:
    """Ask a live run to stop: SIGTERM, so it saves a checkpoint and exits; ``force`` (or a second stop
    while it is stopping) kills its processes. Returns a ``core.runs.control.StopResult`` at once; raises
    ``RunError`` when the run is not live."""
    from core.runs.control import request_stop

    return request_stop(run, force=force)


def stop_run_and_wait(run: RunDirectory, force: bool = False, timeout_s: float | None = None,
                      waiting: Callable[[], None] | None = None) -> Any:
    """``stop_run``, then wait until the run reaches a final state or ``timeout_s`` passes (``tunedeck
    stop --wait``). ``waiting`` is called once before the wait begins (not when the stop was forced: a
    forced run is already final). The result's ``timed_out`` says the run was still live at the end."""
    from core.runs.control import StopResult, wait_for_end

    result = stop_run(run, force)
    if result.forced:
        return result
    if waiting is not None:
        waiting()
    status = wait_for_end(run, timeout_s)
    return StopResult(False, status, timed_out=status.active, notices=result.notices)


# -- the steps -------------------------------------------------------------------------------------
def _gpu_caps(nvml: Any = None) -> dict[str, Any] | None:
    """bf16 capability of the first visible GPU for config validation; None without NVML or when NVML
    cannot say (read through the hardware backend; ``nvml`` stands in for ``pynvml`` in tests)."""
    from core.hardware.nvml_backend import read_gpu_identities

    found = read_gpu_identities(nvml)
    usable = [gpu for gpu in found.gpus if not gpu.lost]  # a lost GPU (Xid 79) says no capability: not the box's
    if not usable or usable[0].compute_capability is None:
        return None
    first = usable[0]
    return {"bf16": first.compute_capability[0] >= 8, "name": first.name}


def _check_data(config: Any) -> None:
    """Refuse to start on data that does not load cleanly (before any GPU is touched)."""
    from core.data import DataError, load_training_records

    if not config.dataset:
        raise RunError(t("runs.no_dataset"), 2)
    try:
        records = load_training_records(config.dataset, hub=config.hub, dataset_info=config.dataset_info,
                                        dataset_dir=config.dataset_dir, split=config.split, seed=config.seed)
    except DataError as exc:
        raise RunError(t("runs.dataset_invalid", problems=str(exc)), 2) from exc
    _check_some_fit(config, records)


def _check_template_reads_thinking(config: Any, path: str, warn: Warn) -> None:
    """``thinking`` set for a chat template that never reads ``enable_thinking`` renders the same either way:
    said (a warning, also in ``train --check --json``), not silently taken as done. Needs the model's tokenizer
    on this machine (a model still to be downloaded is not looked at)."""
    if getattr(config, "thinking", None) is None:
        return
    from core.data.stats import load_tokenizer
    from core.data.tokenize import ensure_chat_template, template_ignores, template_kwargs

    try:
        tokenizer = load_tokenizer(str(config.model))
    except (FileNotFoundError, ValueError):
        return
    ensure_chat_template(tokenizer)  # a base model's: the bundled ChatML one, which training uses too
    if not template_ignores(tokenizer, template_kwargs(config.thinking)):
        return
    from core.config.issues import WARNING, ConfigIssue

    message = t("launch.thinking_unread", value="true" if config.thinking else "false", model=str(config.model))
    warn(message)
    config.warnings = [*(getattr(config, "warnings", None) or []),
                       ConfigIssue(str(path), None, "thinking", message, WARNING)]


# Tokens a chat template adds around a sample's text (role markers, a default system prompt, tool instructions)
TEMPLATE_MARGIN_TOKENS = 512


def _check_some_fit(config: Any, records: list[Any]) -> None:
    """Refuse data of which no sample is left to train, as the trainer would after its launch, here before it:
    with ``overlong: drop`` every sample longer than max_seq_len (``train.all_overlong_dropped``); with cut,
    every sample's answer past the cut (``train.all_cut_no_answer``). Needs the model's tokenizer on this
    machine (a model still to be downloaded is left to the trainer); ends at the first sample that trains."""
    from core.data import tokenize_dataset
    from core.data.stats import approximate_tokens, load_tokenizer
    from core.data.tokenize import template_kwargs

    overlong = getattr(config, "overlong", "cut")

    def fits(record: Any) -> bool:
        # Surely (a token is at least a byte), or by the estimate with half max_seq_len to spare: a max_seq_len of
        # 64 (or any below the 512 tokens of template kept aside) has no sample that surely fits, and loading
        # the tokenizer took every launch 3 s (10x) for data whose samples are a few words. An estimate wrong by
        # 2x leaves the refusal to the trainer, which says it in the same words.
        text = record.approx_text()
        return len(text.encode()) + TEMPLATE_MARGIN_TOKENS <= config.max_seq_len \
            or 2 * approximate_tokens(text) <= config.max_seq_len

    if overlong != "drop" and any(fits(record) for record in records):
        return  # cut: a sample fits whole, so keeps its answer; no tokenizer loaded
    try:
        tokenizer = load_tokenizer(str(config.model))
    except (FileNotFoundError, ValueError):
        return
    dropped = cut = 0
    first: str | None = None
    for record in records:
        try:
            tokenized = tokenize_dataset([record], tokenizer, config.max_seq_len, loss_on=config.loss_on,
                                         overlong=overlong, kwargs=template_kwargs(config.thinking))
        except Exception:  # a chat template that refuses a sample (jinja's TemplateError ...): the trainer
            return  # reports it with its own message; this look only answers "does any sample fit"
        if tokenized.input_ids:
            return
        dropped += tokenized.overlong_dropped
        cut += tokenized.cut_no_answer
        first = first or next(iter(tokenized.cut_no_answer_origins), None)
    datasets = [config.dataset] if isinstance(config.dataset, str) else list(config.dataset)
    if dropped:
        raise RunError(t("train.all_overlong_dropped", datasets=", ".join(datasets), count=dropped,
                         max_seq_len=config.max_seq_len), 2)
    if cut == len(records) and cut:
        raise RunError(t("train.all_cut_no_answer", datasets=", ".join(datasets), count=cut,
                         max_seq_len=config.max_seq_len, first=first), 2)


def _absolute_local_paths(config: Any, yaml_dir: Path | None) -> None:
    """Make relative model/dataset paths absolute: the trainer runs in the run directory, not here.

    A relative path is taken from the current directory, else from the YAML file's directory (the rule
    of ``core.data.registry.find_local``, which the config checks follow too); anything that exists in
    neither (a hub id such as ``Qwen/Qwen2.5-7B``) is left as it is.
    """
    from core.data.registry import find_local

    def fix(value: str) -> str:
        path = Path(value).expanduser()
        if path.is_absolute():
            return str(path)
        found = find_local(value, [yaml_dir] if yaml_dir is not None else [])
        return str(found) if found is not None else value

    if isinstance(config.model, str):
        config.model = fix(config.model)
    from core.data.registry import anchor_dataset_keys

    # Dataset entries keep their #N / :split; a dataset_info.json next to the YAML is recorded.
    anchor_dataset_keys(config, yaml_dir)


def _check_model(config: Any, as_loaded: Any, warn: Warn = warn_on_stderr) -> None:
    """The model as the run will have it. Loading checked ``as_loaded`` (``model_problem``: a path such as
    ``./m`` where the launch finds it, anything else as written); a relative name that
    ``_absolute_local_paths`` found to be a folder (``sub/model``, checked as a hub id) is another thing:
    the same check on the folder (a config.json, whole weights)."""
    if not config.model:
        raise RunError(t("runs.no_model"), 2)
    if _same_folder(config.model, as_loaded):
        return
    from core.config.issues import ERROR
    from core.config.model_checks import model_problem

    found = model_problem(str(config.model), config.hub, probe=False)
    if found is not None:
        severity, message = found
        if severity == ERROR:
            raise RunError(message, 2)
        warn(t("runs.config_warning", warning=message))


def _same_folder(model: Any, as_loaded: Any) -> bool:
    """Whether ``model`` names what ``as_loaded`` named from the current directory (or is the same id)."""
    if model == as_loaded:
        return True
    from core.assets import resolve_model_name

    try:
        return Path(resolve_model_name(str(model))).expanduser().resolve() == \
            Path(resolve_model_name(str(as_loaded))).expanduser().resolve()
    except (OSError, RuntimeError):  # an unresolvable path (a loop): check it again
        return False


def _check_lora_targets(config: Any) -> None:
    """LoRA targets that name no module of the model fail in the trainer: refuse them here."""
    from core.config.model_checks import lora_targets_problem

    problem = lora_targets_problem(config.model, config.lora_targets, config.method)
    if problem:
        raise RunError(problem, 2)


def _check_disk_space(values: dict[str, Any], where: Path, existing_checkpoints: int = 0,
                      warn: Warn = warn_on_stderr) -> None:
    """Refuse a run whose checkpoints (``save_total_limit`` of them + the final save) will not fit on the
    disk of ``where``, with the figures; warn when they barely do (``core.runs.disk_space``)."""
    from core.runs.disk_space import check_space

    check = check_space(values, where, existing_checkpoints)
    if check is None:  # a model the estimator cannot size: nothing to say
        return
    if check.verdict == "short":
        raise RunError(check.message.text(), 2)
    if check.verdict == "close":
        warn(check.message.text())


def _record_tight_disk(run: RunDirectory) -> None:
    """A launch that passed the space check only just: an event the dashboard lists (the wizard shows no
    stderr), with the same figures as the warning."""
    from core.runs.disk_space import check_space

    check = check_space(run.config(), run.path, len(run.checkpoints(complete_only=True)))
    if check is not None and check.verdict != "ok":
        try:
            run.append_event("disk_space_low", advice=check.message.english(), **check.to_dict())
        except OSError:
            pass


def _start(run: RunDirectory, resume_from: str | None = None) -> None:
    """Start the run's supervisor and wait until it holds the lock. One that exits at once leaves the run
    failed (if it never got past queued) and raises ``SupervisorDidNotStart`` with its log's tail."""
    from core.runs.launch import start_supervisor, wait_until_started

    _record_tight_disk(run)

    proc = start_supervisor(run, resume_from=None if resume_from is None else Path(resume_from))
    if not wait_until_started(run, proc):
        tail = ""
        try:
            tail = run.supervisor_log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        except OSError:
            pass
        last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
        state = run.status().status
        if state == RunState.STOPPED:  # a stop came first: the supervisor left it so, not failed
            raise SupervisorDidNotStart(t("runs.stopped_before_start", id=run.id), run.supervisor_log_path, last)
        message = t("runs.supervisor_failed", path=str(run.supervisor_log_path), tail=tail.strip())
        if state == RunState.QUEUED:  # the supervisor never got as far as recording anything
            run.write_status(RunState.FAILED, message.splitlines()[0])
        raise SupervisorDidNotStart(message, run.supervisor_log_path, last)


def _sdpa_without_gpus(config: Any, gpus: list[int], warn: Warn) -> str | None:
    """``attn: flash`` without a GPU becomes ``sdpa`` (flash-attention is CUDA-only; an imported ms-swift file's
    flash_attn asks for it), said through ``warn``: returns what was said, else None. ``train --check`` and
    the launch switch it alike."""
    if gpus or config.attn != "flash":
        return None
    message = t("launch.flash_cpu")
    warn(message)
    config.attn = "sdpa"
    return message


def _resolve_for_this_box(config: Any, gpus: list[int], warn: Warn) -> str | None:
    """What really runs, written into the run's config before it exists: returns the precision asked
    for when it cannot run here (bf16/fp16 without a GPU become fp32, with a warning, and attn: flash sdpa), else
    None; makes
    ``output`` absolute and checks it (``core.runs.output``: absent or empty, writable; created empty)."""
    asked = None
    if not gpus and config.precision != "fp32":
        asked = config.precision
        warn(t("launch.precision_cpu", precision=asked))
        config.precision, config.pure_bf16 = "fp32", False
    _sdpa_without_gpus(config, gpus, warn)
    if config.output:
        from core.runs.output import OutputError, prepare_output, resolve_output

        try:
            config.output = str(prepare_output(resolve_output(str(config.output))))
        except OutputError as exc:
            raise RunError(str(exc), 2) from None
    return asked


# What the trainer imports (core.train.worker) of the training stack (core.errors.TRAINING_STACK_MODULES) first.
TRAINING_PACKAGES = ("torch", "transformers", "peft", "accelerate")


def _check_training_stack() -> None:
    """Refuse a run this install cannot train: the trainer runs in this interpreter (``core.runs.launch``
    starts it with ``sys.executable``), and without the training stack it only fails, a traceback in train.log."""
    from importlib.util import find_spec

    missing = [name for name in TRAINING_PACKAGES if find_spec(name) is None]
    if missing:
        raise RunError(training_stack_missing(missing), 2)


def _check_box(config: Any, warn: Warn = warn_on_stderr) -> list[int]:
    """The GPUs the run gets here, refusing what this box cannot run and checkpoints the disk cannot hold."""
    from core.paths import runs_dir
    from core.runs.gpus import gpus_left_out, lost_gpus, resolve_gpus, visible_gpu_count

    _check_training_stack()
    available = visible_gpu_count()
    lost = lost_gpus() if available else []  # fallen off the bus: a trainer there hangs or fails in CUDA
    try:
        gpus = resolve_gpus(config.gpus, available, lost)
    except ValueError as exc:
        raise RunError(str(exc), 2) from exc
    left_out = gpus_left_out(config.gpus, lost)
    if left_out and gpus:
        warn(t("runs.gpus_lost_left_out", lost=",".join(map(str, left_out)), gpus=",".join(map(str, gpus))))
    if not gpus and config.method == "qlora":
        raise RunError(t("runs.qlora_needs_gpu"), 2)
    if not gpus and int(config.zero_stage or 0) > 0:
        raise RunError(t("runs.zero_needs_gpu"), 2)
    _check_disk_space(config.to_dict(), runs_dir(), warn=warn)  # before anything is written
    if gpus:  # on a CPU nothing is parked: the activations are in host memory either way
        _check_host_memory(config.to_dict(), warn, processes=len(gpus))
    return gpus


def live_runs_sharing(gpus: Sequence[int], visible: str | None | Literal["ours"] = "ours") -> list[tuple[str, str, list[int]]]:
    """``(run id, status, shared GPU indices)`` of each live run of this host (liveness applied: a dead one
    is crashed, not live) that uses any of ``gpus``; with no ``gpus`` (a CPU run), each live CPU run, with
    an empty list. A run of another host (nodes of one run sharing the data root) has its own GPUs; a run
    whose run.json does not read says none.

    Indices count within a ``CUDA_VISIBLE_DEVICES``: ``gpus`` within ``visible`` ("ours": this process's, which
    a launch's supervisor inherits), each run's within the one its run.json recorded; both are compared as the
    GPUs they name (``physical_gpus``), a ``GPU-…`` / ``MIG-…`` UUID entry as the NVML index of its GPU
    (``nvml_index``, as the dashboard maps them), the shared ones given as indices of ``gpus``. A run that
    recorded none (run.json without ``env``) is taken to count as ``gpus`` do."""
    import os
    import socket

    from core.runs.gpus import VISIBLE_ENV, nvml_index, physical_gpus, run_physical_gpus, uuid_indices
    from core.runs.listing import iter_run_dirs
    from core.runs.liveness import effective_status
    from core.runs.states import ACTIVE_STATES

    host = socket.gethostname()
    if visible == "ours":
        visible = os.environ.get(VISIBLE_ENV)
    wanted = set(gpus)
    by_uuid: dict[str, int] | None = None  # NVML asked only when a UUID entry is met

    def named(name: str) -> str:  # "1" for GPU 1 whether it was named 1 or by its UUID
        nonlocal by_uuid
        if name.isdigit():
            return name
        if by_uuid is None:
            from core.hardware.nvml_backend import read_gpu_identities

            by_uuid = uuid_indices(read_gpu_identities().gpus)
        index = nvml_index(name, by_uuid)
        return name if index is None else str(index)  # a UUID NVML does not know matches only itself

    mine = {named(name): gpu for name, gpu in zip(physical_gpus(list(gpus), visible), gpus, strict=True)}
    found = []
    for run in iter_run_dirs():
        if run.status().status not in ACTIVE_STATES:  # a final status file: no liveness check needed
            continue
        status = effective_status(run)
        if status.status not in ACTIVE_STATES:
            continue
        record, unreadable = run.read_record()
        if unreadable or record.get("host", host) != host:
            continue
        theirs = [named(name) for name in run_physical_gpus(record, visible)]
        shared = sorted({mine[name] for name in theirs if name in mine})
        if shared or (not wanted and not theirs):
            found.append((run.id, RunState(status.status).value, shared))
    return found


def _one_claim_at_a_time() -> AbstractContextManager[None]:
    """Held by a launch from its look at the live runs' GPUs until its own run is recorded (queued, its
    GPUs in run.json, which ``live_runs_sharing`` counts as live): two launches at the same instant would
    otherwise both find the GPUs free."""
    from core.paths import ensure_private_dir, runs_dir
    from core.runs.run_dir import held_lock

    return held_lock(ensure_private_dir(runs_dir()))  # the folder itself: no lock file left in it


def _claim_gpus(config: Any, gpus: list[int], allow_shared: bool, warn: Warn = warn_on_stderr,
                elsewhere: bool = True) -> list[int]:
    """The GPUs a new run takes here. A count (``gpus: 2``, the demo's one) whose first GPUs a live run of
    this box holds takes the first ones no live run holds, when there are enough (said through ``warn``;
    ``config.gpus`` becomes those indices, so config.yaml and a resume say them); else ``_check_gpus_free``.
    All GPUs or a list of indices is what the user named: never moved. ``elsewhere``: the refusal may advise
    other GPUs (``gpus=...``), which the demo does not take."""
    sharing = None  # not looked at yet
    if gpus and isinstance(config.gpus, int) and not isinstance(config.gpus, bool) and not allow_shared:
        from core.runs.gpus import lost_gpus, visible_gpu_count

        visible = visible_gpu_count()
        # One look at every GPU (each live run's status and run.json read once): what holds ``gpus`` is part of it
        every = live_runs_sharing(sorted(set(gpus) | set(range(visible))))
        sharing = [(run_id, status, [gpu for gpu in theirs if gpu in gpus])
                   for run_id, status, theirs in every if any(gpu in gpus for gpu in theirs)]
        if sharing:
            held = {gpu for _run, _status, theirs in every for gpu in theirs}
            held |= set(lost_gpus())  # fallen off the bus: free of runs, of no use to one
            free = [gpu for gpu in range(visible) if gpu not in held]
            if len(free) >= len(gpus):
                warn(t("runs.gpus_moved", busy=",".join(str(g) for g in gpus if g in held),
                       gpus=",".join(map(str, free[:len(gpus)]))))
                config.gpus = free[:len(gpus)]
                return config.gpus  # no live run holds them: nothing for _check_gpus_free to find
    _check_gpus_free(gpus, allow_shared, warn, elsewhere, sharing)  # a count not moved: what was found above
    return gpus


def _check_gpus_free(gpus: list[int], allow_shared: bool, warn: Warn = warn_on_stderr, elsewhere: bool = True,
                     sharing: list[tuple[str, str, list[int]]] | None = None,
                     visible: str | None | Literal["ours"] = "ours") -> None:
    """Refuse a run on GPUs a live run of this box uses (the second would run both out of memory), unless
    ``allow_shared``; on a CPU a live CPU run is only a warning (both go slower, neither fails).
    ``sharing``: ``live_runs_sharing(gpus)`` when the caller has just asked it (None: asked here);
    ``visible``: the ``CUDA_VISIBLE_DEVICES`` ``gpus`` count within (``live_runs_sharing``)."""
    from core.runs.states import state_label

    if sharing is None:
        sharing = live_runs_sharing(gpus, visible)
    if not sharing:
        return
    run_id, status, shared = sharing[0]
    if not gpus:
        warn(t("runs.cpu_in_use", id=run_id, status=state_label(status)))
        return
    if allow_shared:
        warn(t("runs.gpus_shared", id=run_id, gpus=",".join(map(str, shared))))
        return
    others = t("runs.gpus_in_use_more", count=len(sharing) - 1) if len(sharing) > 1 else ""
    taken = sorted({gpu for _run, _status, theirs in sharing for gpu in theirs})  # every live run's, not the first's
    raise GpusInUse(t("runs.gpus_in_use", id=run_id, status=state_label(status), gpus=",".join(map(str, taken)),
                      more=others, elsewhere=t("runs.gpus_in_use_elsewhere") if elsewhere else ""), sharing)


def _world(gpus: list[int], distributed: Any) -> int:
    """The training processes of a run of ``gpus`` on each of ``distributed``'s nodes (ZeRO shards over them all)."""
    return max(1, len(gpus)) * max(1, int(getattr(distributed, "nnodes", 1) or 1))


def _read_room(gpus: list[int], visible: str | None | Literal["ours"] = "ours") -> Any:
    """The memory of ``gpus`` now (``core.runs.gpu_memory.read_room``), None for a CPU run."""
    if not gpus:
        return None
    from core.runs.gpu_memory import read_room

    return read_room(gpus, visible)


def _check_gpu_memory(config: Any, gpus: list[int], room: Any, world: int, warn: Warn = warn_on_stderr,
                      allow_over_memory: bool = False, trained: bool = False, resume: int | None = None) -> Any:
    """Refuse a run whose estimated per-GPU peak is past the free memory of its GPUs (``GpuMemoryShort``, with
    the figures and what fits), unless ``allow_over_memory``, or ``trained`` (a resume of a run that trained on
    these GPUs with the same memory keys: it measured that it fits; warned; ``resume``: the samples per step of its
    checkpoint, which the ways out keep); warn when it is within the
    estimator's margin, or that it was not checked (a model the estimator cannot describe). Returns the
    ``GpuMemoryCheck``."""
    if not gpus:
        return None
    from core.runs.gpu_memory import check_gpu_memory

    check = check_gpu_memory(config, room, world, resume)
    if check is None or check.message is None:
        return check
    if check.verdict != "does_not_fit":
        warn(check.message.text())
    elif allow_over_memory:
        warn(t("runs.gpu_memory_allowed", text=check.message.text()))
    elif trained:
        warn(t("runs.gpu_memory_trained", text=check.message.text()))
    else:
        raise GpuMemoryShort(check.message.text(), check)
    return check


def _recorded_keys(run: RunDirectory) -> dict[str, Any]:
    """The config keys the run last started or resumed with: its fingerprint's, config.yaml without one."""
    from core.runs.fingerprint import read_fingerprint

    recorded = read_fingerprint(run.path)
    old = ((recorded or {}).get("config") or {}).get("keys") if isinstance(recorded, dict) else None
    return old if isinstance(old, dict) else run.config()


def _samples_per_step(run: RunDirectory) -> int | None:
    """micro_batch_size × gradient_accumulation of the run's last start or resume (None where not whole)."""
    keys = _recorded_keys(run)
    try:
        return int(keys.get("micro_batch_size", 1) or 1) * int(keys.get("gradient_accumulation", 1) or 1)
    except (TypeError, ValueError):
        return None


def _memory_changed(run: RunDirectory, config: Any) -> bool:
    """Whether ``config`` (a resume's, overrides applied) differs from what the run last started or resumed
    with (its fingerprint's keys; config.yaml without one) in a key the memory estimate reads and it recorded."""
    from core.runs.gpu_memory import MEMORY_KEYS

    old = _recorded_keys(run)
    new = config.to_dict()
    # a key the old record lacks is one its version did not write (its default then)
    return any(old[key] != new.get(key) for key in MEMORY_KEYS & old.keys())


def _check_host_memory(values: dict[str, Any], warn: Warn = warn_on_stderr, available: int | None = None,
                       processes: int = 1) -> None:
    """Refuse a run whose parked activations (``offload_activations``, one micro-batch per training process
    on this box) the box's memory cannot pin; warn when they take most of it (``core.runs.host_memory``)."""
    from core.runs.host_memory import check_offload_ram

    check = check_offload_ram(values, available, processes)
    if check is None or check.message is None:
        return
    if check.verdict == "short":
        raise RunError(check.message.text(), 2)
    warn(check.message.text())


def _moving_gpus(run: RunDirectory, config: Any, overrides: Sequence[str], gpus: list[int]) -> list[int] | None:
    """The GPUs a ``gpus=`` override of a resume names on this box (None without one): refused unless as
    many as the run had, since its checkpoint was written by that many processes (a ZeRO one is split
    over them; any other counts steps of a global batch of that many GPUs)."""
    from core.config.loader import parse_override
    from core.runs.gpus import lost_gpus, resolve_gpus, visible_gpu_count

    if not any(parse_override(text)[0] == "gpus" for text in overrides):  # _resume_config has read them
        return None
    available = visible_gpu_count()
    try:
        wanted = resolve_gpus(config.gpus, available, lost_gpus() if available else [])
    except ValueError as exc:
        raise RunError(str(exc), 2) from exc
    if len(wanted) != len(gpus):
        stage = int(run.config().get("zero_stage") or 0)  # the checkpoint's: config.yaml before the override
        why = (t("runs.resume_gpu_count_zero", stage=stage, old=len(gpus)) if stage > 0
               else t("runs.resume_gpu_count_batch"))
        raise RunError(t("runs.resume_gpu_count", id=run.id, gpus=",".join(map(str, wanted)) or "-",
                         new=len(wanted), old=len(gpus), why=why), 2)
    return wanted


def _check_recorded_gpus_not_lost(run: RunDirectory, record: dict[str, Any]) -> None:
    """Refuse a resume onto the GPUs run.json gives the trainer when NVML calls one of them lost (fallen off the
    bus): it would hang or fail with a CUDA error; the way out is a ``gpus=`` override, or the reboot."""
    import os

    from core.runs.gpus import VISIBLE_ENV, lost_gpus, lost_message, physical_gpus, recorded_visible

    gpus = [int(g) for g in record.get("gpus") or []]
    if not gpus:
        return
    known, visible = recorded_visible(record)
    recorded = visible if known else os.environ.get(VISIBLE_ENV)  # what start_supervisor gives the trainer
    lost = lost_gpus(visible=recorded)
    named = [g for g in gpus if g in lost]
    if named:
        raise RunError(t("runs.resume_gpu_lost", id=run.id, gpus=",".join(physical_gpus(gpus, recorded)),
                         lost=lost_message(physical_gpus(named, recorded))), 2)


def _record_moved_gpus(run: RunDirectory, record: dict[str, Any], gpus: list[int]) -> None:
    """run.json's ``gpus`` (what the supervisor gives the trainer) become a resume's ``gpus=``, which count
    within this shell's ``CUDA_VISIBLE_DEVICES``: its ``env`` records that one now (``start_supervisor``
    restores it, ``run_physical_gpus`` maps through it)."""
    import os

    from core.runs.gpus import VISIBLE_ENV

    env = dict(record.get("env") or {})
    env.pop(VISIBLE_ENV, None)
    if os.environ.get(VISIBLE_ENV) is not None:
        env[VISIBLE_ENV] = os.environ[VISIBLE_ENV]
    run.update_record(gpus=list(gpus), env=env)


def _resume_config(run: RunDirectory, overrides: list[str], warn: Warn) -> Any:
    """The run's config.yaml with ``key=value`` overrides applied (a dataset that moved), checked key by
    key and across keys as ``train`` checks a run file (``resume_run`` checks the data)."""
    from core.config import ConfigError, load_run_config

    try:
        config = load_run_config(run.config_path, overrides, gpu_caps=_gpu_caps())
    except ConfigError as exc:
        raise RunError(str(exc), 2) from exc
    except FileNotFoundError as exc:
        raise RunError(t("runs.config_missing", path=str(run.config_path)), 2) from exc
    for warning in getattr(config, "warnings", []) or []:
        warn(str(warning))  # "FILE:LINE: warning: KEY: ..." (the issue says its own prefix)
    _absolute_local_paths(config, None)
    return config


__all__ = ["GpuMemoryShort", "GpusInUse", "RunCheck", "RunError", "RunFile", "SupervisorDidNotStart", "can_resume", "can_stop",
           "check_run_file", "live_runs_sharing", "load_run_file", "prepare_run", "resume_run", "start_run", "stop_run",
           "stop_run_and_wait", "warn_on_stderr"]
