"""``tunedeck train / demo / runs / status / logs / stop / resume``: detached runs from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from core.runs.states import ACTIVE_STATES, RunState
from core.units import UNKNOWN, format_duration, format_rate


def register(subparsers: Any) -> None:
    from core.i18n import t

    p = subparsers.add_parser("train", help=t("runs.train_help"), description=t("runs.train_help"))
    p.add_argument("config", metavar="RUN.yaml")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.add_argument("--nnodes", type=int, default=1, help=t("runs.nnodes_help"))
    p.add_argument("--node-rank", type=int, default=0, help=t("runs.node_rank_help"))
    p.add_argument("--master-addr", default="127.0.0.1", help=t("runs.master_addr_help"))
    p.add_argument("--master-port", type=int, default=0, help=t("runs.master_port_help"))
    p.add_argument("--hostfile", default=None, help=t("runs.hostfile_help"))
    p.add_argument("--check", action="store_true", help=t("runs.check_help"))
    p.set_defaults(handler=cmd_train)

    p = subparsers.add_parser("demo", help=t("runs.demo_help"), description=t("runs.demo_help"))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--headless", action="store_true", help=t("runs.demo_headless_help"))
    mode.add_argument("--detach", action="store_true", help=t("runs.demo_detach_help"))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.set_defaults(handler=cmd_demo)

    p = subparsers.add_parser("runs", help=t("runs.runs_help"), description=t("runs.runs_help"))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.set_defaults(handler=cmd_runs)

    p = subparsers.add_parser("status", help=t("runs.status_help"), description=t("runs.status_help"))
    p.add_argument("run", metavar="RUN", help=t("runs.run_arg_help"))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.set_defaults(handler=cmd_status)

    p = subparsers.add_parser("logs", help=t("runs.logs_help"), description=t("runs.logs_help"))
    p.add_argument("run", metavar="RUN", help=t("runs.run_arg_help"))
    p.add_argument("-f", "--follow", action="store_true", help=t("runs.follow_help"))
    p.add_argument("-n", "--lines", type=int, default=None, help=t("runs.lines_help"))
    p.set_defaults(handler=cmd_logs)

    p = subparsers.add_parser("stop", help=t("runs.stop_help"), description=t("runs.stop_help"))
    p.add_argument("run", metavar="RUN", help=t("runs.run_arg_help"))
    p.add_argument("--force", action="store_true", help=t("runs.force_help"))
    p.add_argument("--wait", action="store_true", help=t("runs.wait_help"))
    p.add_argument("--timeout", type=float, default=None, help=t("runs.timeout_help"))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.set_defaults(handler=cmd_stop)

    p = subparsers.add_parser("resume", help=t("runs.resume_help"), description=t("runs.resume_help"))
    p.add_argument("run", metavar="RUN", help=t("runs.run_arg_help"))
    p.add_argument("overrides", nargs="*", metavar="key=value", help=t("resume.overrides_help"))
    p.add_argument("--checkpoint", type=int, default=None, metavar="N", help=t("resume.checkpoint_help"))
    p.add_argument("--weights-only", action="store_true", help=t("resume.weights_only_help"))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.set_defaults(handler=cmd_resume)


# -- helpers ---------------------------------------------------------------------------------------
def _err(text: str) -> None:
    print(text, file=sys.stderr)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _resolve(ref: str) -> Any:
    from core.cli import CliError
    from core.runs.listing import RunNotFound, resolve_run

    try:
        return resolve_run(ref)
    except RunNotFound as exc:
        raise CliError(str(exc), 2) from exc


def _state(status: str) -> str:
    """A run status for human output, translated (--json keeps the status value itself)."""
    from core.runs.states import state_label

    return state_label(status)


def _gpu_caps() -> dict[str, Any] | None:
    """bf16 capability of the first visible GPU for config validation; None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() == 0:
                return None
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            major, _minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = pynvml.nvmlDeviceGetName(handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    return {"bf16": major >= 8, "name": name if isinstance(name, str) else name.decode()}


def _check_data(config: Any) -> None:
    """Refuse to start on data that does not load cleanly (before any GPU is touched)."""
    from core.cli import CliError
    from core.data import DataError, load_training_records
    from core.i18n import t

    if not config.dataset:
        raise CliError(t("runs.no_dataset"), 2)
    try:
        load_training_records(config.dataset, hub=config.hub, dataset_info=config.dataset_info,
                              dataset_dir=config.dataset_dir, split=config.split, seed=config.seed)
    except DataError as exc:
        raise CliError(t("runs.dataset_invalid", problems=str(exc)), 2) from exc


def _absolute_local_paths(config: Any, yaml_dir: Path | None) -> None:
    """Make relative model/dataset paths absolute: the trainer runs in the run directory, not here.

    A relative path is taken from the current directory, else from the YAML file's directory; anything
    that exists in neither (a hub id such as ``Qwen/Qwen2.5-7B``) is left as it is.
    """

    def fix(value: str) -> str:
        path = Path(value).expanduser()
        if path.is_absolute():
            return str(path)
        for base in (Path.cwd(), yaml_dir):
            if base is not None and (base / path).exists():
                return str((base / path).resolve())
        return value

    if isinstance(config.model, str):
        config.model = fix(config.model)
    from core.data.registry import anchor_dataset_keys

    # Dataset entries keep their #N / :split; a dataset_info.json next to the YAML is recorded.
    anchor_dataset_keys(config, yaml_dir)


def _check_model(config: Any) -> None:
    """A model that names a local directory must be one with a config.json (hub ids pass)."""
    from core.assets import resolve_model_name
    from core.cli import CliError
    from core.i18n import t

    if not config.model:
        raise CliError(t("runs.no_model"), 2)
    value = resolve_model_name(str(config.model))
    looks_local = value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().exists()
    if looks_local and not (Path(value).expanduser() / "config.json").is_file():
        raise CliError(t("runs.model_missing", path=value), 2)


def _check_disk_space(values: dict[str, Any], where: Path, existing_checkpoints: int = 0) -> None:
    """Refuse a run whose checkpoints (``save_total_limit`` of them + the final save) will not fit on the
    disk of ``where``, with the figures; warn when they barely do (``core.runs.disk_space``)."""
    from core.cli import CliError
    from core.runs.disk_space import check_space

    check = check_space(values, where, existing_checkpoints)
    if check is None:  # a model the estimator cannot size: nothing to say
        return
    if check.verdict == "short":
        raise CliError(check.message.text(), 2)
    if check.verdict == "close":
        _err(check.message.text())


def _record_tight_disk(run: Any) -> None:
    """A launch that passed the space check only just: an event the dashboard lists (the wizard shows no
    stderr), with the same figures as the warning."""
    from core.runs.disk_space import check_space

    check = check_space(run.config(), run.path, len(run.checkpoints(complete_only=True)))
    if check is not None and check.verdict != "ok":
        try:
            run.append_event("disk_space_low", advice=check.message.english(), **check.to_dict())
        except OSError:
            pass


def _start(run: Any, resume_from: str | None = None) -> None:
    from core.cli import CliError
    from core.i18n import t
    from core.runs.launch import start_supervisor, wait_until_started

    _record_tight_disk(run)

    proc = start_supervisor(run, resume_from=None if resume_from is None else Path(resume_from))
    if not wait_until_started(run, proc):
        tail = ""
        try:
            tail = run.supervisor_log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        except OSError:
            pass
        message = t("runs.supervisor_failed", path=str(run.supervisor_log_path), tail=tail.strip())
        if run.status().status == RunState.QUEUED:  # the supervisor never got as far as recording anything
            run.write_status(RunState.FAILED, message.splitlines()[0])
        raise CliError(message, 1)


def _resolve_for_this_box(config: Any, gpus: list[int]) -> str | None:
    """What really runs, written into the run's config before it exists: returns the precision asked
    for when it cannot run here (bf16/fp16 without a GPU become fp32, with a warning), else None; makes
    ``output`` absolute and checks it (``core.runs.output``: absent or empty, writable; created empty)."""
    from core.cli import CliError
    from core.i18n import t

    asked = None
    if not gpus and config.precision != "fp32":
        asked = config.precision
        _err(t("launch.precision_cpu", precision=asked))
        config.precision, config.pure_bf16 = "fp32", False
    if config.output:
        from core.runs.output import OutputError, prepare_output, resolve_output

        try:
            config.output = str(prepare_output(resolve_output(str(config.output))))
        except OutputError as exc:
            raise CliError(str(exc), 2) from None
    return asked


def _check_box(config: Any) -> list[int]:
    """The GPUs the run gets here, refusing what this box cannot run and checkpoints the disk cannot hold."""
    from core.cli import CliError
    from core.i18n import t
    from core.paths import runs_dir
    from core.runs.gpus import resolve_gpus, visible_gpu_count

    try:
        gpus = resolve_gpus(config.gpus, visible_gpu_count())
    except ValueError as exc:
        raise CliError(str(exc), 2) from exc
    if not gpus and config.method == "qlora":
        raise CliError(t("runs.qlora_needs_gpu"), 2)
    if not gpus and int(config.zero_stage or 0) > 0:
        raise CliError(t("runs.zero_needs_gpu"), 2)
    _check_disk_space(config.to_dict(), runs_dir())  # before anything is written
    return gpus


def _launch_config(config: Any, argv: list[str], command: str, distributed: Any = None) -> Any:
    from core.i18n import t
    from core.runs.launch import create_run

    gpus = _check_box(config)
    precision_asked = _resolve_for_this_box(config, gpus)
    if config.checkpoint_layers == "auto":
        from core.estimate.checkpointing import resolve_checkpoint_layers

        caps = _gpu_caps() if gpus else None
        config.checkpoint_layers = resolve_checkpoint_layers(config, caps and caps["name"], len(gpus))
        _err(t("runs.checkpoint_layers_chosen", value=config.checkpoint_layers))
    run = create_run(config, argv, command=command, gpus=gpus, distributed=distributed)
    if precision_asked:  # the config says fp32 now; the event keeps what was asked for
        run.append_event("precision_fallback", requested=precision_asked, used="fp32", reason="no GPU")
    from core.runs.fingerprint import record_fingerprint

    record_fingerprint(run.path, run.config())  # what resume compares the data and keys with
    return run


# -- handlers --------------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from core.cli import CliError
    from core.i18n import t
    from core.runs.launch import DistributedSettings

    if args.check:
        return _check_only(args)
    config = _train_config(args)
    if args.hostfile:
        from core.runs.hostfile import DEFAULT_MASTER_PORT, HostfileError, node_rank_of, read_hostfile

        try:
            hosts = read_hostfile(Path(args.hostfile))
        except HostfileError as exc:
            raise CliError(str(exc), 2) from exc
        rank = node_rank_of(hosts) if args.node_rank == 0 else args.node_rank
        if rank is None:
            raise CliError(t("runs.hostfile_not_listed", path=args.hostfile), 2)
        args.nnodes, args.node_rank, args.master_addr = len(hosts), rank, hosts[0]
        args.master_port = args.master_port or DEFAULT_MASTER_PORT
    if args.nnodes > 1 and not args.master_port:
        raise CliError(t("runs.master_port_needed"), 2)
    distributed = DistributedSettings(args.nnodes, args.node_rank, args.master_addr, args.master_port)
    argv = ["tunedeck", "train", args.config, *args.overrides]
    if args.nnodes > 1:
        argv += [f"--nnodes={args.nnodes}", f"--node-rank={args.node_rank}",
                 f"--master-addr={args.master_addr}", f"--master-port={args.master_port}"]
    run = _launch_config(config, argv, "train", distributed)
    _start(run)
    _report_started(run, args.json)
    return 0


def _train_config(args: argparse.Namespace) -> Any:
    """The checked configuration of ``tunedeck train FILE``: a tunedeck YAML, or a LLaMA-Factory /
    ms-swift file converted (its mapping printed on stderr), then the checks against the model, the data
    and this box that must pass before anything starts (the ones ``--check`` runs)."""
    from core.cli import CliError
    from core.config import ConfigError, load_run_config
    from core.config.importers import blocking_lines, detect_peer, import_file, load_imported_config
    from core.i18n import t

    try:
        if detect_peer(args.config):
            imported = import_file(args.config)
            _err(t("runs.imported", path=args.config, peer=imported.peer_name))
            _err(imported.mapping_text())
            blocked = blocking_lines(imported)
            if blocked:
                raise CliError(t("runs.import_blocked", path=args.config,
                                 lines="\n".join(f"  {line.text()}" for line in blocked)), 2)
            args.imported = imported
            config = load_imported_config(imported, list(args.overrides), gpu_caps=_gpu_caps())
        else:
            config = load_run_config(args.config, list(args.overrides), gpu_caps=_gpu_caps())
    except ConfigError as exc:
        raise CliError(str(exc), 2) from exc
    except FileNotFoundError as exc:
        raise CliError(t("runs.config_missing", path=args.config), 2) from exc
    for warning in getattr(config, "warnings", []) or []:
        _err(t("runs.config_warning", warning=str(warning)))
    _absolute_local_paths(config, Path(args.config).resolve().parent)
    _check_model(config)
    _check_lora_targets(config)
    _check_data(config)
    return config


def _check_lora_targets(config: Any) -> None:
    """LoRA targets that name no module of the model fail in the trainer: refuse them here."""
    from core.cli import CliError
    from core.config.model_checks import lora_targets_problem

    problem = lora_targets_problem(config.model, config.lora_targets, config.method)
    if problem:
        raise CliError(problem, 2)


def _check_only(args: argparse.Namespace) -> int:
    """``train --check``: every check ``train`` makes before launch, the resolved config printed, nothing
    started; exit 2 with the problems (``--json``: ``{ok, problems}`` on stdout as well)."""
    from core.cli import CliError
    from core.i18n import t

    args.imported = None
    try:
        config = _train_config(args)
        gpus = _check_box(config)
        if not gpus and config.precision != "fp32":  # what train would run here: said, and printed so
            _err(t("launch.precision_cpu", precision=config.precision))
            config.precision, config.pure_bf16 = "fp32", False
    except CliError as exc:
        if args.json:
            _print_json({"ok": False, "problems": str(exc).splitlines()})
        raise
    if args.json:
        _print_json({"ok": True, "config": config.to_dict(), "gpus": gpus,
                     "warnings": [str(w) for w in getattr(config, "warnings", []) or []],
                     "mapping": [line.to_dict() for line in args.imported.mapping] if args.imported else None})
    else:
        sys.stdout.write(config.to_yaml())
        _err(t("runs.check_ok"))
    return 0


def _report_started(run: Any, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    from core.i18n import t

    if as_json:
        _print_json({"id": run.id, "run_dir": str(run.path), "status": run.status().status, **(extra or {})})
    else:
        print(run.id)
        _err(t("runs.started", id=run.id, path=str(run.path)))


def cmd_demo(args: argparse.Namespace) -> Any:
    from core.config import default_demo_config
    from core.i18n import t

    config = default_demo_config()
    if config.gpus == "all":
        from core.runs.gpus import visible_gpu_count

        # A tiny model gains nothing from eight GPUs: one, or the CPU.
        config.gpus = 1 if visible_gpu_count() > 0 else "all"
    run = _launch_config(config, ["tunedeck", "demo"] + (["--headless"] if args.headless else [])
                         + (["--detach"] if args.detach else []), "demo")
    if args.headless:
        return _run_headless(run, args.json)
    _start(run)
    if args.detach:
        _report_started(run, args.json)
        return 0
    from core.cli import OpenApp
    from core.settings import load_settings

    _err(t("runs.started", id=run.id, path=str(run.path)))
    return OpenApp(load_settings(), open_run=run.id)


def _run_headless(run: Any, as_json: bool) -> int:
    """Supervise the run in this process, printing a progress line per metrics record on stderr."""
    import threading

    from core.i18n import t
    from core.runs.jsonl import iter_records
    from core.runs.supervisor import supervise

    stop = threading.Event()

    def progress() -> None:
        seen = 0
        while True:
            done = stop.is_set()
            records = list(iter_records(run.metrics_path))
            for record in records[seen:]:
                if record.get("kind") == "train":
                    _err(t("runs.progress_line", step=record.get("step"), total=record.get("total_steps"),
                           loss=_fmt_float(record.get("loss")), tps=format_rate(record.get("tokens_per_s")),
                           eta=format_duration(record.get("eta_s"))))
                elif record.get("kind") == "eval":
                    _err(t("runs.progress_eval", step=record.get("step"), loss=_fmt_float(record.get("eval_loss"))))
            seen = len(records)
            if done:
                return
            stop.wait(0.5)

    _err(t("runs.headless_start", id=run.id, path=str(run.path)))
    printer = threading.Thread(target=progress, daemon=True)
    printer.start()
    try:
        code = supervise(run.path)
    finally:
        stop.set()
        printer.join(timeout=5)
    status = run.status()
    if as_json:
        _print_json({"id": run.id, "run_dir": str(run.path), "status": status.status, "reason": status.reason})
    else:
        print(run.id)
        _err(t("runs.headless_done", status=_state(status.status), reason=status.reason_text or "-"))
    return code


def _fmt_float(value: Any, digits: int = 4) -> str:
    if value is None:
        return UNKNOWN
    return f"{float(value):.{digits}f}"


def cmd_runs(args: argparse.Namespace) -> int:
    from core.i18n import t
    from core.runs.listing import list_runs
    from core.text_width import pad, truncate

    runs = list_runs()
    if args.json:
        _print_json([r.to_dict() for r in runs])
        return 0
    if not runs:
        _err(t("runs.none_yet"))
        return 0
    headers = [t("runs.col_id"), t("runs.col_status"), t("runs.col_method"), t("runs.col_step"),
               t("runs.col_loss"), t("runs.col_tps"), t("runs.col_eta"), t("runs.col_model")]
    rows = []
    for r in runs:
        step = f"{r.step}/{r.total_steps}" if r.step is not None else "-"
        rows.append([r.id, _state(r.status), r.method, step, _fmt_float(r.loss), format_rate(r.tokens_per_s),
                     format_duration(r.eta_s) if r.status in ACTIVE_STATES else UNKNOWN, truncate(r.model, 40)])
    from core.text_width import cell_len

    widths = [max(cell_len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    for row in [headers, *rows]:
        print("  ".join(pad(str(cell), w) for cell, w in zip(row, widths, strict=False)).rstrip())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from core.i18n import t
    from core.runs.listing import summarize

    run = _resolve(args.run)
    summary = summarize(run)
    record = run.record()
    last_ckpt = run.last_complete_checkpoint()
    last_eval = run.latest_eval()
    if args.json:
        data = summary.to_dict()
        data.update({
            "last_checkpoint": str(last_ckpt.path) if last_ckpt else None,
            "last_checkpoint_step": last_ckpt.step if last_ckpt else None,
            "eval_loss": (last_eval or {}).get("eval_loss"),
            "supervisor": record.get("supervisor"),
            "attempts": record.get("attempts") or [],
            "last_event": run.last_event(),
        })
        _print_json(data)
        return 0
    lines = [
        (t("runs.field_id"), summary.id),
        (t("runs.field_status"), _state(summary.status) + (f" — {summary.reason_text}" if summary.reason_text else "")),
        (t("runs.field_model"), f"{summary.model} ({summary.method})"),
        (t("runs.field_step"), f"{summary.step if summary.step is not None else '-'}/{summary.total_steps or '-'}"),
        (t("runs.field_loss"), _fmt_float(summary.loss)),
        (t("runs.field_eval_loss"), _fmt_float((last_eval or {}).get("eval_loss"))),
        (t("runs.field_speed"), format_rate(summary.tokens_per_s)),
        (t("runs.field_eta"), format_duration(summary.eta_s) if summary.status in ACTIVE_STATES else UNKNOWN),
        (t("runs.field_checkpoint"), str(last_ckpt.path) if last_ckpt else "-"),
        (t("runs.field_gpus"), ",".join(str(g) for g in summary.gpus) or "cpu"),
        (t("runs.field_dir"), summary.run_dir),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key.ljust(width)}  {value}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from core.runs.liveness import effective_status
    from core.runs.logs import follow, last_lines

    run = _resolve(args.run)
    offset = 0
    if args.lines is not None:
        lines, offset = last_lines(run.log_path, max(0, args.lines))
        for line in lines:
            print(line)
        sys.stdout.flush()
        if not args.follow:
            return 0
    if not args.follow:
        for line in follow(run.log_path, lambda: True, offset):
            print(line)
        return 0
    try:
        for line in follow(run.log_path, lambda: not effective_status(run).active, offset):
            print(line, flush=True)
    except BrokenPipeError:
        return 0
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from core.cli import CliError
    from core.i18n import t
    from core.runs.control import RunControlError, request_stop, wait_for_end

    run = _resolve(args.run)
    try:
        result = request_stop(run, force=args.force)
    except RunControlError as exc:
        raise CliError(str(exc), 1) from exc
    status = result.status
    if args.wait and not result.forced:
        _err(t("runs.stop_waiting", id=run.id))
        status = wait_for_end(run, args.timeout)
    timed_out = args.wait and not result.forced and status.active  # --wait ran out of --timeout
    if args.json:
        _print_json({"id": run.id, "forced": result.forced, "status": status.status, "reason": status.reason,
                     "timed_out": timed_out})
    elif result.forced:
        _err(t("runs.stop_forced", id=run.id))
    elif timed_out:
        pass
    elif status.active:
        _err(t("runs.stop_requested", id=run.id))
    else:
        _err(t("runs.stop_done", id=run.id, status=status.status))
    if timed_out:
        _err(t("runs.stop_timeout", id=run.id, status=_state(status.status), timeout=f"{args.timeout:g}"))
        return 1
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from core.cli import CliError
    from core.i18n import t
    from core.runs.control import RunControlError, prepare_resume

    run = _resolve(args.run)
    config = _resume_config(run, list(args.overrides)) if args.overrides else None
    _check_disk_space(config.to_dict() if config is not None else run.config(), run.path,
                      len(run.checkpoints(complete_only=True)))
    try:
        plan = prepare_resume(run, step=args.checkpoint, weights_only=args.weights_only, config=config)
    except RunControlError as exc:
        raise CliError(str(exc), 1) from exc
    for notice in plan.notices:
        _err(t("resume.notice", text=notice.text()))
    _start(run, resume_from=plan.checkpoint)
    _report_started(run, args.json, {"checkpoint": plan.checkpoint, "step": plan.step,
                                     "weights_only": plan.weights_only,
                                     "notices": [notice.text() for notice in plan.notices]})
    return 0


def _resume_config(run: Any, overrides: list[str]) -> Any:
    """The run's config.yaml with ``key=value`` overrides applied and checked (a dataset that moved)."""
    from core.cli import CliError
    from core.config import ConfigError, load_run_config
    from core.i18n import t

    try:
        config = load_run_config(run.config_path, overrides, gpu_caps=_gpu_caps())
    except ConfigError as exc:
        raise CliError(str(exc), 2) from exc
    except FileNotFoundError as exc:
        raise CliError(t("runs.config_missing", path=str(run.config_path)), 2) from exc
    for warning in getattr(config, "warnings", []) or []:
        _err(t("runs.config_warning", warning=str(warning)))
    _absolute_local_paths(config, None)
    return config
