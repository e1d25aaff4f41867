"""``tunedeck plan``: the wizard's recommendation, headless, with reasons and alternatives."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from core.i18n import t


def register(subparsers: Any) -> None:
    """Add the ``plan`` command."""
    from core.config.checks import cli_number
    from core.plan.hardware import read_price
    from core.plan.request import GOALS, read_epochs

    p = subparsers.add_parser("plan", help=t("plan.help"), description=t("plan.help"))
    p.add_argument("--model", required=True, help=t("plan.help.model"))
    p.add_argument("--dataset", default=None, help=t("plan.help.dataset"))
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpus", type=_non_empty, default=None, help=t("plan.help.gpus"))
    where.add_argument("--hardware", type=_non_empty, default=None, help=t("plan.help.hardware"))
    p.add_argument("--goal", choices=GOALS, default="fastest", help=t("plan.help.goal"))
    p.add_argument("--epochs", type=read_epochs, default=3.0, help=t("plan.help.epochs"))
    p.add_argument("--effective-batch", type=cli_number(int, minimum=1), default=16, help=t("plan.help.effective_batch"))
    p.add_argument("--price-per-gpu-hour", type=read_price, default=None, help=t("plan.help.price"))
    p.add_argument("--host-ram-gib", type=cli_number(float, above=0), default=None, help=t("plan.help.host_ram"))
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help=t("plan.help.set"))
    p.add_argument("--save", default=None, metavar="RUN.yaml", help=t("plan.help.save"))
    p.add_argument("--force", action="store_true", help=t("plan.help.force"))
    p.add_argument("--json", action="store_true", help=t("plan.help.json"))
    p.set_defaults(handler=cmd_plan)


def _non_empty(text: str) -> str:
    """An option's text that must say something: ``--hardware ""`` is a mistake, not "this box"."""
    if not text.strip():
        raise argparse.ArgumentTypeError(t("config.empty_string"))
    return text


def detect_target(gpus: str | None, price: float | None) -> Any:
    """This box as a HardwareTarget (CPU-only where NVML sees no GPU)."""
    from core.hardware.monitor import open_monitor
    from core.plan import parse_gpu_indices, target_from_snapshot

    monitor = open_monitor(interval_s=3600.0)
    try:
        snapshot = monitor.snapshot()
    finally:
        monitor.close()
    indices = parse_gpu_indices(gpus) if gpus else None
    return target_from_snapshot(snapshot, indices, price)


def build_request(args: argparse.Namespace) -> Any:
    """The PlanRequest the options describe (reads the dataset; raises CliError with what to fix)."""
    from dataclasses import replace

    from core.data import DataError
    from core.errors import CliError
    from core.plan import PlanRequest, parse_target, summarise_dataset
    from core.plan.overrides import parse_overrides, request_fields

    # An OverrideError or a HardwareError: exit 2 with its message (core.cli).
    overrides = parse_overrides(args.set)
    if args.hardware:
        target = parse_target(args.hardware, args.price_per_gpu_hour, args.host_ram_gib)
        if target.cpu_only:  # ``cpu`` is this box's CPU: sized against its RAM, not an assumed 16 GiB
            from core.plan.hardware import on_this_host

            target = on_this_host(target, detect_target(None, args.price_per_gpu_hour))
    else:
        target = detect_target(args.gpus, args.price_per_gpu_hour)
        if args.host_ram_gib is not None:
            target = replace(target, host_ram_gib=args.host_ram_gib)
    summary = None
    if args.dataset:
        try:
            summary = summarise_dataset(args.dataset, args.model, overrides.get("thinking"))
        except DataError as exc:  # its own words, which name the entry ("x.jsonl: file not found; …")
            raise CliError(exc.brief(), 2) from None
        except OSError as exc:
            raise CliError(t("plan.error.dataset", path=args.dataset, problem=str(exc)), 2) from exc
        if not summary.measured:  # hub data is not downloaded to plan: planned without its statistics
            print(t("plan.dataset_on_hub", entries=", ".join(summary.on_hub)), file=sys.stderr)
    if summary is not None and summary.measured:
        refused = summary.nothing_to_plan(args.dataset)
        if refused is not None:  # nothing to plan for: as `data check` says it
            raise CliError(refused, 2)
        if summary.issues:  # planned on the rows that load; the others are said, as `data check` does
            print(t("plan.dataset_problems", path=args.dataset, count=summary.issues, records=summary.records,
                    problems=summary.listed_problems()), file=sys.stderr)
    return PlanRequest(
        model=args.model, hardware=target, goal=args.goal, epochs=args.epochs,
        effective_batch=max(1, args.effective_batch), dataset=args.dataset, **request_fields(overrides),
    ).with_dataset(summary), summary


def cmd_plan(args: argparse.Namespace) -> int:
    """Handler of ``tunedeck plan``: exit 0 with a plan that fits, 3 when nothing fits."""
    from core.config import ConfigError
    from core.errors import CliError
    from core.plan import equivalent_command, recommend, save_run_config
    from core.plan.planner import base_plan

    if args.save and not args.dataset:  # a run config without data is no run: said before any planning
        raise CliError(t("plan.error.save_needs_dataset"), 2)
    if args.save and Path(args.save).is_dir():  # before the planning, and not even --force replaces a folder
        raise CliError(t("plan.error.save_folder", path=args.save.rstrip("/") or args.save), 2)
    if args.save and Path(args.save).exists() and not args.force:  # before the planning: said at once
        raise CliError(t("plan.error.save_exists", path=args.save), 2)
    request, summary = build_request(args)
    measured = None
    if request.hardware.detected:  # what earlier probes on this box measured
        from core.plan.probe import cached_measurements

        measured = cached_measurements(request)
    # a hub id found nowhere here: its config.json from the hub (ModelNotFoundError, ArchitectureError: exit 2)
    rec = recommend(request, base_plan(request, fetch=True), measured=measured)
    saved = None
    if args.save and rec.best is not None and rec.feasible:
        try:
            saved = save_run_config(rec.best, request, args.save, overwrite=args.force)
        except ConfigError as exc:
            # its problems, not ConfigError's own heading after this one's ("…not a valid run config: The run
            # configuration has a problem:")
            problems = "; ".join(str(issue) for issue in exc.errors) or str(exc)
            raise CliError(t("plan.error.config", problem=problems), 2) from exc
        except FileExistsError:
            raise CliError(t("plan.error.save_exists", path=args.save), 2) from None
    if args.json:
        data = rec.to_json()
        data["dataset_summary"] = summary.to_json() if summary else None
        data["saved"] = None if saved is None else str(saved)
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        from core.plan.view import format_recommendation

        print(format_recommendation(rec))
        if saved is not None:
            print(t("plan.saved", path=str(saved), command=equivalent_command(saved)), file=sys.stderr)
    return 0 if rec.feasible else 3
