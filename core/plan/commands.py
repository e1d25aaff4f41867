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
    p.add_argument("--config", default=None, metavar="RUN.yaml", help=t("plan.help.config"))
    p.add_argument("--model", default=None, help=t("plan.help.model"))
    p.add_argument("--dataset", default=None, help=t("plan.help.dataset"))
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpus", type=_non_empty, default=None, help=t("plan.help.gpus"))
    where.add_argument("--hardware", type=_non_empty, default=None, help=t("plan.help.hardware"))
    p.add_argument("--goal", choices=GOALS, default="fastest", help=t("plan.help.goal"))
    # None: the --config file's, else 3 epochs and an effective batch of 16
    p.add_argument("--epochs", type=read_epochs, default=None, help=t("plan.help.epochs"))
    p.add_argument("--effective-batch", type=cli_number(int, minimum=1), default=None,
                   help=t("plan.help.effective_batch"))
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
    """The PlanRequest the options describe (reads the dataset; raises CliError with what to fix). With
    ``--config`` the file's model, data, epochs, effective batch and pinned keys, the options' on top."""
    from dataclasses import replace

    from core.data import DataError
    from core.errors import CliError
    from core.plan import PlanRequest, parse_target, summarise_dataset
    from core.plan.overrides import parse_overrides, request_fields
    from core.plan.request import DEFAULT_EFFECTIVE_BATCH

    plan_config = getattr(args, "plan_config", None)
    # An OverrideError or a HardwareError: exit 2 with its message (core.cli).
    if plan_config is not None:
        from core.plan.from_config import merged_overrides

        overrides = merged_overrides(plan_config, args.set)
    else:
        overrides = parse_overrides(args.set)
    model, dataset = args.model, args.dataset
    dataset_keys: dict[str, Any] = {}
    epochs, effective_batch = args.epochs, args.effective_batch
    if plan_config is not None:
        model = model or plan_config.values["model"]
        if dataset is None:
            value = plan_config.values.get("dataset")
            dataset = ",".join(value) if isinstance(value, list) else value
        # where the names are looked up, --dataset's too: the saved re-plan keeps these keys, and its run reads so
        dataset_keys = {key: plan_config.values.get(key) for key in ("dataset_info", "dataset_dir")}
        epochs = epochs if epochs is not None else plan_config.epochs
        effective_batch = effective_batch if effective_batch is not None else plan_config.effective_batch
    effective_batch = DEFAULT_EFFECTIVE_BATCH if effective_batch is None else effective_batch
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
    if dataset:
        try:
            summary = summarise_dataset(dataset, model, overrides.get("thinking"), **dataset_keys)
        except DataError as exc:  # its own words, which name the entry ("x.jsonl: file not found; …")
            raise CliError(exc.brief(), 2) from None
        except OSError as exc:
            raise CliError(t("plan.error.dataset", path=dataset, problem=str(exc)), 2) from exc
        if not summary.measured:  # hub data is not downloaded to plan: planned without its statistics
            print(t("plan.dataset_on_hub", entries=", ".join(summary.on_hub)), file=sys.stderr)
    if summary is not None and summary.measured:
        refused = summary.nothing_to_plan(dataset)
        if refused is not None:  # nothing to plan for: as `data check` says it
            raise CliError(refused, 2)
        if summary.issues:  # planned on the rows that load; the others are said, as `data check` does
            print(t("plan.dataset_problems", path=dataset, count=summary.issues, records=summary.records,
                    problems=summary.listed_problems()), file=sys.stderr)
    max_steps = plan_config.config.max_steps if plan_config is not None else None
    if epochs is None and max_steps and summary is not None and summary.measured and summary.records:
        # the file's run ends at max_steps: as many epochs as those steps read of the rows an epoch trains, at its
        # effective batch; the rows as its trainer makes them (less the eval split, packed where it packs)
        config = plan_config.config
        rows = summary.trained_rows(int(overrides.get("seq_len") or config.max_seq_len),
                                    str(overrides.get("overlong", config.overlong)),
                                    config.eval_split, bool(config.packing), config.seed)
        epochs = max(float(f"{max_steps * effective_batch / max(1, rows):.3g}"), 1e-3)
    # unmeasured data (a hub's): the time and cost are for the file's max_steps, each sample at the full sequence
    # length (an upper bound), not for epochs the run never trains
    steps_only = int(max_steps) if epochs is None and max_steps and not (summary is not None and summary.measured) \
        else None
    epochs = 3.0 if epochs is None else epochs
    return PlanRequest(
        model=model, hardware=target, goal=args.goal, epochs=epochs,
        effective_batch=max(1, effective_batch), dataset=dataset, max_steps=steps_only, **request_fields(overrides),
    ).with_dataset(summary), summary


def cmd_plan(args: argparse.Namespace) -> int:
    """Handler of ``tunedeck plan``: exit 0 with a plan that fits, 3 when nothing fits."""
    from core.config import ConfigError
    from core.errors import CliError
    from core.plan import equivalent_command, recommend, save_run_config
    from core.plan.planner import base_plan

    args.plan_config = None
    if args.config:  # read first: its errors (file, line, key) before anything is planned
        from core.plan.from_config import load_plan_config, split_set_items

        # --set of a run key that is no planner field (learning_rate=2e-5): applied to the file as train applies it
        args.set, run_items = split_set_items(args.set)
        args.plan_config = load_plan_config(args.config, args.model, args.dataset, run_items)
    elif not args.model:
        raise CliError(t("plan.error.need_model"), 2)
    if args.save and not args.dataset and not (args.plan_config and args.plan_config.values.get("dataset")):  # a run config without data is no run: said before any planning
        raise CliError(t("plan.error.save_needs_dataset"), 2)
    if args.save and Path(args.save).is_dir():  # before the planning, and not even --force replaces a folder
        raise CliError(t("plan.error.save_folder", path=args.save.rstrip("/") or args.save), 2)
    if args.save and Path(args.save).exists() and not args.force:  # before the planning: said at once
        raise CliError(t("plan.error.save_exists", path=args.save), 2)
    request, summary = build_request(args)
    if args.plan_config is not None:
        _say_pins(args.plan_config, request, args.set, _file_steps(args), summary)
    measured = None
    if request.hardware.detected:  # what earlier probes on this box measured
        from core.plan.probe import cached_measurements

        measured = cached_measurements(request)
    # a hub id found nowhere here: its config.json from the hub (ModelNotFoundError, ArchitectureError: exit 2)
    rec = recommend(request, base_plan(request, fetch=True), measured=measured)
    saved = None
    if args.save and rec.best is not None and rec.feasible:
        try:
            if args.plan_config is not None:
                from core.plan.from_config import replanned_values, save_replanned
                from core.plan.run_config import run_config_values

                values = replanned_values(args.plan_config, run_config_values(rec.best, request), args.model,
                                          args.dataset, epochs_given=args.epochs is not None)
                saved = save_replanned(args.plan_config, values, args.save, request.hardware.describe(),
                                       overwrite=args.force)
            else:
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
        if args.plan_config is not None:
            data["config"] = _config_json(args.plan_config, request, args.set, _file_steps(args), summary)
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        from core.plan.view import format_recommendation

        print(format_recommendation(rec))
        if saved is not None:
            print(t("plan.saved", path=str(saved), command=equivalent_command(saved)), file=sys.stderr)
    return 0 if rec.feasible else 3


def _file_steps(args: argparse.Namespace) -> int | None:
    """The file's max_steps where its run ends there (no epochs in the file, none on the command line), else None."""
    plan_config = args.plan_config
    if plan_config is None or args.epochs is not None or plan_config.epochs is not None:
        return None
    return plan_config.config.max_steps or None


def _length_words(request: Any, steps: int | None, summary: Any) -> str:
    """How long the file's run is, as the pins line says it: its epochs, or its max_steps with the epochs they read
    of measured data (hub data is not read: the time and cost are then for its steps, each sample at the full
    sequence length, an upper bound)."""
    from core.plan.view import plain_number

    epochs = plain_number(request.epochs)
    if steps is None:
        return t("plan.config_length_epochs", epochs=epochs)
    if summary is not None and summary.measured and summary.records:
        return t("plan.config_length_steps", steps=steps, epochs=epochs)
    return t("plan.config_length_steps_unmeasured", steps=steps)


def _say_pins(plan_config: Any, request: Any, cli_items: list[str], steps: int | None = None,
              summary: Any = None) -> None:
    """On stderr: the file read (a peer's: the keys that need the user), what it pins and where, and what is
    planned again for this box."""
    from core.config.importers import NEEDS_YOU
    from core.plan.from_config import PLANNED_KEYS

    if plan_config.imported is not None:
        counts = plan_config.imported.counts()
        print(t("plan.config_imported", path=plan_config.path, peer=plan_config.imported.peer_name,
                taken=counts["taken"], dropped=counts["dropped"], needs=counts[NEEDS_YOU]), file=sys.stderr)
        for line in plan_config.imported.mapping:
            if line.verdict == NEEDS_YOU:
                print(f"  {line.text()}", file=sys.stderr)
    pinned = [f"{key}={_shown(value)} ({where})" for key, value, where in _file_pins(plan_config, request, cli_items)]
    pinned += [f"{key}={_shown(value)} (--set)" for key, value in plan_config.set_keys.items()]
    planned = [f"{key}={_shown(plan_config.values[key])}" for key in PLANNED_KEYS if key in plan_config.given]
    print(t("plan.config_pins", path=plan_config.path, pinned="; ".join(pinned) or t("plan.config_nothing"),
            planned=", ".join(planned) or t("plan.config_nothing"), batch=request.effective_batch,
            length=_length_words(request, steps, summary)), file=sys.stderr)


def _file_pins(plan_config: Any, request: Any, cli_items: list[str]) -> list[tuple[str, Any, str]]:
    """(run key, value, where) of each pin of the file the plan keeps: not one ``--set`` replaced or freed."""
    from core.plan.overrides import FIELD_OF_CONFIG_KEY

    cli_names = {item.partition("=")[0].strip().replace("-", "_").replace(".", "_") for item in cli_items}
    cli_names = {FIELD_OF_CONFIG_KEY.get(name, name) for name in cli_names}
    return [(key, value, where) for name, (value, key, where) in plan_config.pins.items()
            if name not in cli_names and (name != "lora_rank" or "lora_rank" in request.overrides)]


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _config_json(plan_config: Any, request: Any, cli_items: list[str], steps: int | None = None,
                 summary: Any = None) -> dict[str, Any]:
    """``plan --config --json``'s ``config``: the file, what of it is kept (and from where) and planned again, and
    how long its run is: ``max_steps`` where the file ends there, with ``epochs`` the data those steps read (None
    where the data is on a hub, not measured)."""
    measured = summary is not None and summary.measured and bool(summary.records)
    from core.plan.from_config import PLANNED_KEYS

    return {"path": plan_config.path,
            "peer": plan_config.imported.peer if plan_config.imported is not None else None,
            "pinned": {**{key: {"value": value, "from": where}
                          for key, value, where in _file_pins(plan_config, request, cli_items)},
                       **{key: {"value": value, "from": "--set"} for key, value in plan_config.set_keys.items()}},
            "planned_again": [key for key in PLANNED_KEYS if key in plan_config.given],
            "effective_batch": request.effective_batch, "max_steps": steps,
            "epochs": request.epochs if steps is None or measured else None,
            # unmeasured data: the time and cost are an upper bound, every sample at the full sequence length
            "time_upper_bound": request.max_steps is not None}
