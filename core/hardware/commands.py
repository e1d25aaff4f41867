"""``tunedeck gpus [--json]``: one snapshot of the box, as a table or as JSON (SCHEMA.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from core.i18n import t
from core.units import format_disk

MIB = 1024 * 1024
GIB = 1024 * MIB

# Table columns: (message key of the header, width in cells, alignment).
_COLUMNS = (
    ("hardware.cli.col.index", 3, "right"),
    ("hardware.cli.col.name", 22, "left"),
    ("hardware.cli.col.memory", 20, "right"),
    ("hardware.cli.col.util", 5, "right"),
    ("hardware.cli.col.temp", 5, "right"),
    ("hardware.cli.col.power", 12, "right"),
    ("hardware.cli.col.procs", 5, "right"),
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("gpus", help=t("hardware.cli.help"), description=t("hardware.cli.help"))
    parser.add_argument("--json", action="store_true", help=t("hardware.cli.json_help"))
    parser.set_defaults(handler=run_gpus)


def _na(value: object, fmt: str = "{}") -> str:
    return t("hardware.cli.na") if value is None else fmt.format(value)


def _mib(value: int | None) -> str:
    return _na(None if value is None else value // MIB)


def _gib(value: int | None) -> str:
    return _na(None if value is None else value / GIB, "{:.1f}")


def _row(cells: list[str]) -> str:
    from core.text_width import cell_len, pad

    # A column is at least as wide as its header in this language (利用率 is 6 cells where Util is 4).
    return "  ".join(pad(cell, max(width, cell_len(t(key))), align)
                     for cell, (key, width, align) in zip(cells, _COLUMNS, strict=True)).rstrip()


def render_snapshot(snapshot: Any) -> list[str]:
    """The human form of a ``BoxSnapshot``: GPU table, processes (one line each), topology, host and driver lines."""
    from core.text_width import one_line

    lines = [_row([t(key) for key, _, _ in _COLUMNS])]
    for gpu in snapshot.gpus:
        memory = t("hardware.cli.memory", used=_mib(gpu.memory_used_bytes), total=_mib(gpu.memory_total_bytes))
        power = t("hardware.cli.power", draw=_na(gpu.power_draw_w, "{:.0f}"), limit=_na(gpu.power_limit_w, "{:.0f}"))
        lines.append(_row([
            str(gpu.index),
            gpu.name or t("hardware.cli.na"),
            t("hardware.cli.lost_cell") if gpu.lost else memory,
            _na(gpu.utilization_gpu_pct, "{}%"),
            _na(gpu.temperature_c, "{}°C"),
            power,
            # A lost GPU's processes cannot be listed: not "0", which reads as an idle GPU.
            t("hardware.cli.na") if gpu.lost or not gpu.processes_known else str(len(gpu.processes)),
        ]))
    lines.extend(t("hardware.cli.lost", index=gpu.index) for gpu in snapshot.gpus if gpu.lost)
    for gpu in snapshot.gpus:
        # MIG devices, as the GPU screen counts them: where a GPU's own utilisation reads N/A, and the UUIDs
        # CUDA_VISIBLE_DEVICES takes.
        for mig in gpu.mig_instances:
            lines.append(t(
                "hardware.cli.mig",
                index=gpu.index,
                slot=mig.index,
                gi=_na(mig.gpu_instance_id),
                ci=_na(mig.compute_instance_id),
                memory=t("hardware.cli.memory", used=_mib(mig.memory_used_bytes), total=_mib(mig.memory_total_bytes)),
                uuid=_na(mig.uuid),
            ))
    for gpu in snapshot.gpus:
        for proc in gpu.processes:
            key = "hardware.cli.process" if proc.visible else "hardware.cli.process_hidden"
            lines.append(t(
                key,
                index=gpu.index,
                pid=proc.pid,
                # "N/A", not "N/A MiB": NVML gives no per-process memory under MIG or in some containers.
                memory=_na(None if proc.used_memory_bytes is None else f"{proc.used_memory_bytes // MIB} MiB"),
                user=proc.user or t("hardware.cli.na"),
                command=one_line(proc.command or "") or t("hardware.cli.na"),  # --json keeps the real one
            ))
    if snapshot.pid_namespace_mismatch:
        lines.append(t("hardware.cli.pid_mismatch"))
    topology = snapshot.topology
    if topology is not None and len(topology.gpus) > 1:
        from core.text_width import pad

        lines.append(t("hardware.cli.topology"))
        width = max(5, *(len(label) + 1 for row in topology.matrix() for label in row))
        lines.append(" " * 6 + "".join(pad(f"GPU{i}", width) for i in topology.gpus).rstrip())
        for gpu_index, row in zip(topology.gpus, topology.matrix(), strict=True):
            lines.append(pad(f"GPU{gpu_index}", 6) + "".join(pad(label, width) for label in row).rstrip())
    lines.append(host_line(snapshot.host))
    lines.append(t(
        "hardware.cli.driver",
        driver=_na(snapshot.driver_version),
        cuda=_na(snapshot.cuda_driver_version),
    ))
    return lines


def host_line(host: Any) -> str:
    load = " ".join(f"{v:.2f}" for v in host.load_average) if host.load_average else None
    if host.disk_error:  # the data root's disk is not known: said, with what to do
        return t("hardware.cli.host_disk_unreadable", hostname=_na(host.hostname),
                 cpu=_na(host.cpu_percent, "{:.0f}%"), cores=_na(host.cpu_count_logical),
                 ram_used=_gib(host.memory_used_bytes), ram_total=_gib(host.memory_total_bytes), load=_na(load),
                 disk_path=_na(host.disk_path), error=host.disk_error)
    return t(
        "hardware.cli.host",
        hostname=_na(host.hostname),
        cpu=_na(host.cpu_percent, "{:.0f}%"),
        cores=_na(host.cpu_count_logical),
        ram_used=_gib(host.memory_used_bytes),
        ram_total=_gib(host.memory_total_bytes),
        load=_na(load),
        disk_free=format_disk(host.disk_free_bytes),
        disk_total=format_disk(host.disk_total_bytes),
        disk_path=_na(host.disk_path),
    ) + "".join(_cache_disk_text(disk) for disk in host.cache_disks)


def _cache_disk_text(disk: Any) -> str:
    """A hub cache on another disk than the data root's (downloads fill that one), after the host line."""
    from core.hub.problems import HUB_NAMES
    from core.i18n import join_words

    return t("hardware.cli.cache_disk", hubs=join_words(HUB_NAMES.get(hub, hub) for hub in disk.hubs),
             free=format_disk(disk.free_bytes), total=format_disk(disk.total_bytes), path=_na(disk.path))


def run_gpus(args: argparse.Namespace) -> int:
    """Take one snapshot; exit 2 (with the reason on stderr) when NVML is unavailable."""
    from core.errors import CliError
    from core.hardware.monitor import FAKE_GPUS_ENV, open_monitor
    from core.hardware.snapshot import SnapshotFormatError

    try:
        monitor = open_monitor()
    except SnapshotFormatError as exc:
        raise CliError(str(exc), 2) from exc  # it names $TUNEDECK_FAKE_GPUS and the file
    with monitor:
        snapshot = monitor.poll()
    if snapshot.synthetic and os.environ.get(FAKE_GPUS_ENV):
        print(t("hardware.cli.synthetic", path=os.environ[FAKE_GPUS_ENV]), file=sys.stderr)
    error = snapshot.nvml_error
    if args.json:
        print(json.dumps(snapshot.to_json(), indent=2, ensure_ascii=False))
        if error is not None:
            print(f"tunedeck: {error.message}", file=sys.stderr)
            return 2
        return 0
    if error is not None:
        print(host_line(snapshot.host))
        raise CliError(error.message, 2)
    print("\n".join(render_snapshot(snapshot)))
    return 0
