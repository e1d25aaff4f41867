"""``tunedeck train / demo / runs / status / logs / stop / resume``: detached runs from the shell.

The CLI layer only: parse the arguments, call ``core.runs`` (the life of a run is ``core.runs.lifecycle``,
which the app calls too), print what came of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from core.runs.states import ACTIVE_STATES
from core.units import TOTAL_PENDING, UNKNOWN, format_duration, format_rate


def _total(summary: Any) -> str:
    """A run's step total as the tables show it: "?" while a resume that changed it has not logged."""
    return str(summary.total_steps or (TOTAL_PENDING if summary.total_unknown else UNKNOWN))


def register(subparsers: Any) -> None:
    from core.config.schema import reference_path
    from core.i18n import t

    p = subparsers.add_parser("train", help=t("runs.train_help"), description=t("runs.train_help"))
    p.add_argument("config", metavar="RUN.yaml", help=t("runs.config_arg_help"))
    p.add_argument("overrides", nargs="*", metavar="key=value", help=t("runs.overrides_help", reference=reference_path()))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.add_argument("--nnodes", type=int, default=1, help=t("runs.nnodes_help"))
    p.add_argument("--node-rank", type=int, default=0, help=t("runs.node_rank_help"))
    p.add_argument("--master-addr", default="127.0.0.1", help=t("runs.master_addr_help"))
    p.add_argument("--master-port", type=int, default=0, help=t("runs.master_port_help"))
    p.add_argument("--hostfile", default=None, help=t("runs.hostfile_help"))
    p.add_argument("--check", action="store_true", help=t("runs.check_help"))
    p.add_argument("--allow-shared-gpus", action="store_true", help=t("runs.allow_shared_gpus_help"))
    p.add_argument("--allow-over-memory", action="store_true", help=t("runs.allow_over_memory_help"))
    p.set_defaults(handler=cmd_train)

    p = subparsers.add_parser("demo", help=t("runs.demo_help"), description=t("runs.demo_help"))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--headless", action="store_true", help=t("runs.demo_headless_help"))
    mode.add_argument("--detach", action="store_true", help=t("runs.demo_detach_help"))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.add_argument("--allow-shared-gpus", action="store_true", help=t("runs.allow_shared_gpus_help"))
    p.set_defaults(handler=cmd_demo)

    p = subparsers.add_parser("runs", help=t("runs.runs_help"), description=t("runs.runs_help"))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.add_argument("--probes", action="store_true", help=t("runs.probes_help"))
    p.set_defaults(handler=cmd_runs)

    p = subparsers.add_parser("status", help=t("runs.status_help"), description=t("runs.status_help"))
    p.add_argument("run", metavar="RUN", nargs="?", help=t("runs.run_arg_or_newest_help"))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.set_defaults(handler=cmd_status)

    p = subparsers.add_parser("logs", help=t("runs.logs_help"), description=t("runs.logs_help"))
    p.add_argument("run", metavar="RUN", nargs="?", help=t("runs.run_arg_or_newest_help"))
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
    p.add_argument("--allow-shared-gpus", action="store_true", help=t("runs.allow_shared_gpus_help"))
    p.add_argument("--allow-over-memory", action="store_true", help=t("runs.allow_over_memory_help"))
    p.add_argument("--json", action="store_true", help=t("runs.json_help"))
    p.set_defaults(handler=cmd_resume)


# -- helpers ---------------------------------------------------------------------------------------
def _err(text: str) -> None:
    print(text, file=sys.stderr)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _resolve(ref: str) -> Any:
    from core.runs.listing import resolve_run

    return resolve_run(ref)  # RunNotFound: exit 2


def _resolve_or_newest(ref: str | None) -> Any:
    """The run ``ref`` names; without one (``tunedeck logs -f`` right after a train), the newest run that is not
    a wizard's probe, said on stderr (stdout stays the command's: --json), or ``RunNotFound`` with none."""
    if ref is not None:
        return _resolve(ref)
    from core.i18n import t
    from core.runs.listing import RunNotFound, list_runs

    newest = next((summary for summary in list_runs() if not summary.probe), None)
    if newest is None:
        raise RunNotFound(t("runs.none_yet"))
    _err(t("runs.newest_taken", id=newest.id))
    return _resolve(str(newest.run_dir))


def _state(status: str) -> str:
    """A run status for human output, translated (--json keeps the status value itself)."""
    from core.runs.states import state_label

    return state_label(status)


# -- handlers --------------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    from core.runs.lifecycle import start_run

    distributed = _distributed_settings(args)  # before --check too: it refuses what train refuses
    if args.check:
        return _check_only(args, distributed)
    run = start_run(args.config, list(args.overrides), distributed, warn=_err,
                    allow_shared_gpus=args.allow_shared_gpus, allow_over_memory=args.allow_over_memory)
    _report_started(run, args.json)
    return 0


def _distributed_settings(args: argparse.Namespace) -> Any:
    """The multi-node settings of ``train``'s options (``--hostfile`` read into them); ``CliError`` (exit 2)
    for what no launch can use: a rank outside 0 .. nnodes-1, several nodes without ``--master-port``."""
    from core.errors import CliError
    from core.i18n import t
    from core.runs.launch import DistributedSettings

    if args.hostfile:
        from core.runs.hostfile import DEFAULT_MASTER_PORT, node_rank_of, read_hostfile

        hosts = read_hostfile(Path(args.hostfile))  # HostfileError: exit 2
        rank = node_rank_of(hosts) if args.node_rank == 0 else args.node_rank
        if rank is None:
            raise CliError(t("runs.hostfile_not_listed", path=args.hostfile), 2)
        args.nnodes, args.node_rank, args.master_addr = len(hosts), rank, hosts[0]
        args.master_port = args.master_port or DEFAULT_MASTER_PORT
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise CliError(t("runs.node_rank_out_of_range", rank=args.node_rank, nnodes=args.nnodes), 2)
    if args.nnodes > 1 and not args.master_port:
        raise CliError(t("runs.master_port_needed"), 2)
    return DistributedSettings(args.nnodes, args.node_rank, args.master_addr, args.master_port)


def _check_only(args: argparse.Namespace, distributed: Any = None) -> int:
    """``train --check``: every check ``train`` makes before launch, the resolved config printed, nothing
    started; exit 2 with the problems (``--json``: ``{ok, problems}`` on stdout as well; ``gpu_memory``: the
    estimate against each GPU's free memory, null on a CPU)."""
    from core.i18n import t
    from core.runs.errors import GpuMemoryShort, RunError
    from core.runs.lifecycle import check_run_file

    try:
        check = check_run_file(args.config, list(args.overrides), warn=_err, allow_shared_gpus=args.allow_shared_gpus,
                               allow_over_memory=args.allow_over_memory, distributed=distributed)
    except RunError as exc:
        if args.json:
            memory = exc.check.to_json() if isinstance(exc, GpuMemoryShort) else None
            _print_json({"ok": False, "problems": str(exc).splitlines(), "gpu_memory": memory})
        raise  # core.cli prints it, with its exit code
    config = check.config
    if args.json:
        _print_json({"ok": True, "config": config.to_dict(), "gpus": check.gpus,
                     "gpu_memory": check.gpu_memory.to_json() if check.gpu_memory is not None else None,
                     "warnings": [str(w) for w in getattr(config, "warnings", []) or []],
                     "mapping": [line.to_dict() for line in check.imported.mapping] if check.imported else None})
    else:
        sys.stdout.write(config.to_yaml())
        _err(t("runs.check_ok"))
    return 0


def _report_started(run: Any, as_json: bool, extra: dict[str, Any] | None = None,
                    resumed_from: int | None = None, restarted: bool = False) -> None:
    """The run id on stdout, and on stderr what was started and how to follow it (``resumed_from``: the
    checkpoint step a resume continues from, said as such rather than "started run"; ``restarted``: a
    resume of a run that never trained, started again from step 0)."""
    from core.i18n import t

    if as_json:
        _print_json({"id": run.id, "run_dir": str(run.path), "status": run.status().status, **(extra or {})})
    else:
        print(run.id)
        if restarted:
            _err(t("runs.restarted", id=run.id, path=str(run.path)))
        elif resumed_from is None:
            _err(t("runs.started", id=run.id, path=str(run.path)))
        else:
            _err(t("runs.resumed", id=run.id, path=str(run.path), step=resumed_from))


def cmd_demo(args: argparse.Namespace) -> Any:
    from core.config import default_demo_config
    from core.i18n import t
    from core.runs.lifecycle import prepare_run, start_run

    if not (args.headless or args.detach):  # the demo's dashboard: before a run is started for it
        from core.cli import require_app

        require_app(args, t("runs.demo_no_terminal"), t("runs.demo_needs_app"))
    config = default_demo_config()
    if config.gpus == "all":
        from core.runs.gpus import visible_gpu_count

        # A tiny model gains nothing from eight GPUs: one, or the CPU.
        config.gpus = 1 if visible_gpu_count() > 0 else "all"
    argv = ["tunedeck", "demo"] + (["--headless"] if args.headless else []) + (["--detach"] if args.detach else [])
    if args.headless:  # supervised in this process, not detached
        return _run_headless(prepare_run(config, argv, "demo", warn=_err, allow_shared_gpus=args.allow_shared_gpus),
                             args.json)
    run = start_run(config, argv=argv, command="demo", warn=_err, allow_shared_gpus=args.allow_shared_gpus)
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
    from core.runs.logs import FOLLOW_MAX_LINES, FOLLOW_MAX_READ
    from core.runs.supervisor import supervise
    from core.watch.adapters import parse_lines
    from core.watch.follow import FileFollower

    stop = threading.Event()
    # Only what was appended since the last look is read (the one follower, bounded batches).
    metrics = FileFollower(run.metrics_path, max_read=FOLLOW_MAX_READ, max_lines=FOLLOW_MAX_LINES)

    def progress() -> None:
        while True:
            done = stop.is_set()
            result = metrics.read_new()
            for record in parse_lines(result.lines, "tunedeck"):
                if record.get("kind") == "train":
                    _err(t("runs.progress_line", step=record.get("step"), total=record.get("total_steps"),
                           loss=_fmt_float(record.get("loss")), tps=format_rate(record.get("tokens_per_s")),
                           eta=format_duration(record.get("eta_s"))))
                elif record.get("kind") == "eval":
                    _err(t("runs.progress_eval", step=record.get("step"), loss=_fmt_float(record.get("eval_loss"))))
            if result.more:
                continue
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
        if status.reason_text:
            _err(t("runs.headless_done", status=_state(status.status), reason=status.reason_text))
        else:
            _err(t("runs.headless_done_plain", status=_state(status.status)))
    return headless_exit_code(run, status.status, code)


def headless_exit_code(run: Any, status: str, supervisor_code: int) -> int:
    """``demo --headless``'s exit code: 0 only for a run that finished. Stopped: 128 + the signal that
    asked for the stop (130 for Ctrl-C's SIGINT, 143 for SIGTERM); otherwise the supervisor's code, 1 at least."""
    from core.runs.states import RunState

    if status == RunState.FINISHED:
        return 0
    if status == RunState.STOPPED:
        import signal

        name = str((run.last_event("stop_requested") or {}).get("signal") or "SIGINT")
        number = getattr(signal, name, signal.SIGINT)
        return 128 + int(number)
    return supervisor_code or 1


def _fmt_float(value: Any, digits: int = 4) -> str:
    if value is None:
        return UNKNOWN
    return f"{float(value):.{digits}f}"


def cmd_runs(args: argparse.Namespace) -> int:
    from core.i18n import t
    from core.runs.listing import list_runs
    from core.text_width import pad, truncate
    from core.units import plural_key

    runs = list_runs()
    if args.json:
        _print_json([r.to_dict() for r in runs])
        return 0
    # The wizard's probe runs (a few steps each to measure a plan) are not the user's training: the table
    # leaves them out unless asked, as the Runs screen does, and says how many it left
    hidden = 0 if args.probes else sum(1 for r in runs if r.probe)
    runs = [r for r in runs if args.probes or not r.probe]
    if not runs:
        _err(t("runs.none_yet"))
    if hidden:
        _err(t(plural_key("runs.probes_not_listed", hidden), count=hidden))
    if not runs:
        return 0
    headers = [t("runs.col_id"), t("runs.col_status"), t("runs.col_method"), t("runs.col_step"),
               t("runs.col_loss"), t("runs.col_tps"), t("runs.col_eta"), t("runs.col_model")]
    rows = []
    for r in runs:
        step = f"{r.step}/{_total(r)}" if r.step is not None else UNKNOWN
        # A run.json that does not read has no model or method to show: the model column says so
        # (`status RUN` and --json's record_error say why).
        model = t("runs.record_unreadable_short") if r.record_error else truncate(r.model, 40)
        method = t("runs.probe_mark", method=r.method) if r.probe else r.method
        rows.append([r.id, _state(r.status), method, step, _fmt_float(r.loss), format_rate(r.steady_tokens_per_s),
                     format_duration(r.eta_s) if r.status in ACTIVE_STATES else UNKNOWN, model])
    from core.text_width import cell_len

    widths = [max(cell_len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    for row in [headers, *rows]:
        print("  ".join(pad(str(cell), w) for cell, w in zip(row, widths, strict=False)).rstrip())
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from core.i18n import t
    from core.runs.listing import summarize

    run = _resolve_or_newest(args.run)
    summary = summarize(run)
    record, unreadable = run.read_record()  # one that does not read: what else there is shows, then why
    last_ckpt = run.last_sound_checkpoint()  # a damaged newer one is not what a resume or export takes
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
            "record_error": unreadable or None,
        })
        _print_json(data)
        return _record_unreadable(run, unreadable)
    lines = [
        (t("runs.field_id"), summary.id),
        (t("runs.field_status"), _state(summary.status) + (f" — {summary.reason_text}" if summary.reason_text else "")),
        (t("runs.field_model"), f"{summary.model or UNKNOWN} ({summary.method or UNKNOWN})"),
        (t("runs.field_step"), f"{summary.step if summary.step is not None else UNKNOWN}/{_total(summary)}"),
        (t("runs.field_loss"), _fmt_float(summary.loss)),
        (t("runs.field_eval_loss"), _fmt_float((last_eval or {}).get("eval_loss"))),
        (t("runs.field_speed"), format_rate(summary.steady_tokens_per_s)),
        (t("runs.field_eta"), format_duration(summary.eta_s) if summary.status in ACTIVE_STATES else UNKNOWN),
        (t("runs.field_checkpoint"), str(last_ckpt.path) if last_ckpt else UNKNOWN),
        (t("runs.field_gpus"), _gpus_text(summary, record, unreadable)),
        (t("runs.field_dir"), summary.run_dir),
    ]
    from core.text_width import cell_len, pad

    width = max(cell_len(k) for k, _ in lines)  # in cells: a Chinese label is two cells a character
    for key, value in lines:
        print(f"{pad(key, width)}  {value}")
    return _record_unreadable(run, unreadable)


def _gpus_text(summary: Any, record: dict[str, Any], unreadable: str) -> str:
    """``status``'s GPUs: as this box numbers them, or those of another host (a shared data root), said so."""
    from core.i18n import t
    from core.runs.liveness import foreign_host

    if unreadable:
        return UNKNOWN
    gpus = ",".join(summary.physical_gpus) or "cpu"
    host = foreign_host(record)
    return t("runs.gpus_on_host", gpus=gpus, host=host) if host else gpus


def _record_unreadable(run: Any, reason: str) -> int:
    """``status`` of a run whose run.json does not read (permissions, bad JSON): after what it could show,
    one line that names the file, why and what to do, and exit 1; 0 when there is nothing to say."""
    if not reason:
        return 0
    from core.errors import CliError
    from core.i18n import t

    sys.stdout.flush()  # what was shown comes before the reason on a terminal
    raise CliError(t("runs.status_record_unreadable", path=str(run.record_path), reason=reason))


def cmd_logs(args: argparse.Namespace) -> int:
    from core.runs.liveness import effective_status
    from core.runs.logs import follow, last_lines

    if args.lines is not None and args.lines < 0:
        from core.errors import CliError
        from core.i18n import t

        raise CliError(t("runs.lines_negative", lines=args.lines), 2)
    run = _resolve_or_newest(args.run)
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
    # `logs -f | head`: the closed pipe ends it in core.cli.dispatch, as for every command. A run directory
    # deleted meanwhile reads as queued (no status.json) for ever: it ends the follow too, with an error.
    for line in follow(run.log_path, lambda: not run.path.is_dir() or not effective_status(run).active, offset):
        print(line, flush=True)
    if not run.path.is_dir():
        from core.errors import CliError
        from core.i18n import t

        raise CliError(t("runs.logs_run_dir_gone", id=run.id, path=str(run.path)), 1)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from core.i18n import t
    from core.runs.lifecycle import stop_run, stop_run_and_wait
    from core.runs.states import BEFORE_TRAINING_STATES

    run = _resolve(args.run)
    starting = run.status().status in BEFORE_TRAINING_STATES  # stopped before its first step: no checkpoint
    if args.wait:
        waiting = "runs.stop_waiting_starting" if starting else "runs.stop_waiting"
        result = stop_run_and_wait(run, force=args.force, timeout_s=args.timeout,
                                   waiting=lambda: _err(t(waiting, id=run.id)))
    else:
        result = stop_run(run, force=args.force)
    status, timed_out = result.status, result.timed_out  # timed out: --wait ran out of --timeout
    if args.json:
        _print_json({"id": run.id, "forced": result.forced, "status": status.status, "reason": status.reason,
                     "timed_out": timed_out, "notices": [notice.text() for notice in result.notices]})
    elif result.forced:
        _err(t("runs.stop_forced", id=run.id))
    elif timed_out:
        pass
    elif status.active:
        _err(t("runs.stop_requested_starting" if starting else "runs.stop_requested", id=run.id))
    else:
        _err(t("runs.stop_done", id=run.id, status=_state(status.status)))
    for notice in result.notices:  # what went wrong on the way (a run.json that does not read): last, to act on
        _err(t("resume.notice", text=notice.text()))
    if timed_out:
        _err(t("runs.stop_timeout", id=run.id, status=_state(status.status), timeout=f"{args.timeout:g}"))
        return 1
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from core.runs.lifecycle import resume_run

    run = _resolve(args.run)
    plan = resume_run(run, checkpoint=args.checkpoint, weights_only=args.weights_only,
                      overrides=list(args.overrides), warn=_err, allow_shared_gpus=args.allow_shared_gpus,
                      allow_over_memory=args.allow_over_memory)
    _report_started(run, args.json, {"checkpoint": plan.checkpoint, "step": plan.step,
                                     "weights_only": plan.weights_only,
                                     "notices": [notice.text() for notice in plan.notices]},
                    resumed_from=plan.step, restarted=plan.checkpoint is None)
    return 0
