"""Dashboard costs: CPU while watching a busy run, time to open a run with a million metric lines, and
(on a GPU box) training throughput with and without a dashboard attached.

    .venv/bin/python bench/dashboard.py [--seconds 20] [--rate 50] [--lines 1000000]
                                        [--out bench/results/dashboard.json]
    .venv/bin/python bench/dashboard.py --gpu [--config RUN.yaml] --out bench/results/dashboard-gpu.json

(1) CPU: the app runs headless (``run_test``, 160×50) on the dashboard of a run that a separate writer
    process appends to at ``--rate`` metric records and log lines per second, with 8 fake H200s
    (``TUNEDECK_FAKE_GPUS=tests/fixtures/gpus/h200x8.json``, polled at 1 Hz); psutil measures this
    process's CPU time over ``--seconds``.
(2) Open: a run directory with ``--lines`` metric records; the clock runs from building the app to the
    first dashboard frame that shows data; the backfill of the whole history is timed too.
(3) Frame: one chart frame (``BucketedSeries.columns``, 150 columns) over a million points, median of
    50 (tests/core/test_watch_series.py asserts it reads buckets, not points; the seconds are here).
(4) ``--gpu``: one detached run (``tunedeck train``), a headless dashboard following it in every other
    window of ``--window-s`` seconds; tokens/s in the windows with it against those without, from the
    steps' own times in metrics.jsonl (``attached_throughput``). Two separate runs differ by more than the
    1% this must resolve.
Results go to ``--out`` (JSON) and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from results_files import write_results  # noqa: E402  (bench/ is not a package)

TRAIN_LINE = (
    '{{"kind": "train", "step": {step}, "total_steps": {total}, "epoch": {epoch:.4f}, "loss": {loss:.4f}, '
    '"learning_rate": {lr:.3e}, "grad_norm": {gn:.4f}, "tokens_per_s": {tok:.1f}, "samples_per_s": 5.9, '
    '"elapsed_s": {el:.2f}, "eta_s": {eta:.1f}, "tokens_seen": {seen}, "peak_allocated_gib": [61.2], '
    '"peak_reserved_gib": [66.0], "time": "2026-11-29T21:00:00Z"}}\n'
)


def train_line(step: int, total: int) -> str:
    import math

    return TRAIN_LINE.format(step=step, total=total, epoch=step / total, loss=0.6 + 2.4 * math.exp(-step / 5e4)
                             + 0.05 * math.sin(step), lr=2e-4 * (1 - step / total) + 1e-7, gn=1.2 + 0.1 * math.cos(step),
                             tok=12000 + 500 * math.sin(step / 50), el=step * 0.5, eta=(total - step) * 0.5,
                             seen=step * 6000)


def make_run(root: Path, run_id: str, lines: int, total: int, status: str = "running") -> Path:
    from tests.fixtures.watch.run_builder import build_run, header_record

    path = build_run(root, run_id, status=status, steps=0, total=total, evals_every=0, log_lines=0,
                     gpus=tuple(range(8)))
    with open(path / "metrics.jsonl", "w", encoding="utf-8") as handle:
        handle.write(json.dumps(header_record(total)) + "\n")
        batch = []
        for step in range(1, lines + 1):
            batch.append(train_line(step, total))
            if len(batch) == 10_000:
                handle.write("".join(batch))
                batch = []
        handle.write("".join(batch))
    return path


def writer_main(run_dir: Path, rate: float, start_step: int, total: int) -> None:
    """A stand-in trainer: append one metric record and one log line every 1/rate seconds, forever."""
    from core.runs.jsonl import append_line

    step = start_step
    next_at = time.monotonic()
    while True:
        step += 1
        append_line(run_dir / "metrics.jsonl", train_line(step, total).rstrip("\n"))
        append_line(run_dir / "train.log", f"[rank 0] step {step}/{total} | loss 0.9 | 12000 tok/s")
        next_at += 1.0 / rate
        time.sleep(max(0.0, next_at - time.monotonic()))


async def measure_cpu(run_dir: Path, seconds: float, rate: float) -> dict:
    import psutil

    from core.settings import Settings
    from tests.fixtures.watch.run_builder import SupervisorStandIn
    from tui.app import make_app
    from tui.screens.dashboard import DashboardScreen

    me = psutil.Process()
    writer = subprocess.Popen([sys.executable, __file__, "--writer", str(run_dir), "--rate", str(rate),
                               "--start-step", "1000", "--total", "1000000"])
    try:
        with SupervisorStandIn(run_dir):
            app = make_app(Settings(gpu_poll_interval_s=1.0), open_run=str(run_dir), persist_settings=False)
            async with app.run_test(size=(160, 50)) as pilot:
                while not (isinstance(app.screen, DashboardScreen) and app.screen.series.train_records):
                    await pilot.pause(0.05)
                screen = app.screen
                await pilot.pause(2.0)  # settle: first frames, first GPU polls
                start_step = screen.series.latest.get("step", 0)
                cpu0, wall0 = me.cpu_times(), time.perf_counter()
                await asyncio.sleep(seconds)
                cpu1, wall1 = me.cpu_times(), time.perf_counter()
                end_step = screen.series.latest.get("step", 0)
                gpus = len(screen.gpu_util)
    finally:
        writer.kill()
        writer.wait()
    used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"seconds": round(wall1 - wall0, 2), "cpu_seconds": round(used, 3),
            "cpu_percent_of_one_core": round(100 * used / (wall1 - wall0), 1),
            "records_per_s_written": rate, "records_seen": end_step - start_step, "fake_gpus": gpus}


async def measure_open(run_dir: Path) -> dict:
    from core.settings import Settings
    from tui.app import make_app
    from tui.screens.dashboard import DashboardScreen

    started = time.perf_counter()
    app = make_app(Settings(gpu_poll_interval_s=1.0), open_run=str(run_dir), persist_settings=False)
    async with app.run_test(size=(160, 50)) as pilot:
        while not (isinstance(app.screen, DashboardScreen) and app.screen.first_frame_at):
            await pilot.pause(0.01)
        screen = app.screen
        # the screen stamps the refresh that follows the first data (its first frame with data)
        first_frame = screen.first_frame_at - started
        from_open = screen.first_frame_at - screen.opened_at
        data_at = screen.first_data_at - started
        tail_records = screen.series.train_records
        while not screen.backfilled:
            await pilot.pause(0.1)
        backfill = time.perf_counter() - started
        records = screen.series.train_records
    return {"first_frame_with_data_s": round(first_frame, 3), "from_dashboard_open_s": round(from_open, 3),
            "tail_message_handled_s": round(data_at, 3),
            "tail_records_shown_first": tail_records, "backfill_done_s": round(backfill, 2),
            "records_after_backfill": records}


def measure_frame(points: int = 1_000_000, width: int = 150, repeats: int = 50) -> dict:
    """Seconds of one chart frame over ``points`` points: the cost is the buckets', not the points'."""
    import random

    from core.watch.downsample import BucketedSeries

    rng = random.Random(7)
    series = BucketedSeries(max_buckets=512)
    series.add_many([float(x) for x in range(points)], [1.0 + rng.random() * 0.01 for _ in range(points)])
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        series.columns(width, 0.0, float(points - 1))
        times.append(time.perf_counter() - started)
    return {"points": points, "buckets": len(series.counts), "columns": width,
            "frame_ms_median": round(1000 * statistics.median(times), 3)}


def engine_row_config(home: Path, row: str, steps: int) -> Path:
    """A run config of ``bench/engine_speed.py``'s ``row`` (e.g. ``7b-lora``: 7B LoRA, micro-batch 4 x 2048,
    checkpointed, a GPU-bound step), random weights and its long-conversation data, ``steps`` steps."""
    import yaml
    from engine_speed import make_long_dataset, make_model_dir, row_specs

    spec = row_specs(row.startswith("tiny"), 1)[row]
    values = {"name": f"dashboard-{row}", "model": str(make_model_dir(home, spec["model"])),
              "dataset": str(make_long_dataset(home, spec["seq"], 4 * spec["micro"] * steps)),
              "method": spec["method"], "precision": "bf16", "max_seq_len": spec["seq"],
              "micro_batch_size": spec["micro"], "gradient_accumulation": 1,
              "gradient_checkpointing": spec["ckpt"], "max_steps": steps, "learning_rate": 1e-4,
              "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.05, "save_steps": 100000, "logging_steps": 1,
              "seed": 1, "packing": True}
    path = home / f"dashboard-{row}.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def attached_throughput(config: str | None, windows: int, window_s: float, settle_s: float = 1.5) -> dict:
    """One run of ``config`` (default: the bundled demo), a headless dashboard (real NVML, 160x50) following it
    in every other window of ``window_s`` seconds, ``windows`` windows from the first steps on; the run is
    stopped after the last. Each step is put in the window it reached metrics.jsonl in (not in the first
    ``settle_s`` seconds after a switch: the app's start and exit are not what "attached" costs); a window's
    rate is its steps' tokens over their summed step times (``elapsed_s``), so two separate runs' noise (a
    third, on the demo) does not enter the ratio."""
    from core.runs import RunDirectory, resolve_run
    from core.runs.control import wait_for_end

    command = ["train", config] if config else ["demo", "--detach"]
    out = subprocess.run([sys.executable, "-m", "core", *command, "--json"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    run = resolve_run(json.loads(out.stdout)["id"])
    arrivals: dict[int, float] = {}  # step -> when its record was seen
    spans = asyncio.run(_alternate(run, windows, window_s, arrivals))
    subprocess.run([sys.executable, "-m", "core", "stop", run.id], cwd=ROOT, capture_output=True, text=True)
    wait_for_end(run)
    records = {r["step"]: r for r in _records(RunDirectory(run.path))}
    per_window = []
    for attached, began, ended in spans:
        steps = [s for s, seen in arrivals.items() if began + settle_s <= seen < ended and s - 1 in records
                 and s in records]
        seconds = sum(records[s]["elapsed_s"] - records[s - 1]["elapsed_s"] for s in steps)
        tokens = sum(records[s]["tokens_seen"] - records[s - 1]["tokens_seen"] for s in steps)
        per_window.append({"attached": attached, "steps": len(steps), "seconds": round(seconds, 3),
                           "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None})

    def rate(attached: bool) -> tuple[float | None, float | None]:
        """(tokens over seconds of the kind's windows, the windows' median rate)."""
        chosen = [w for w in per_window if w["attached"] is attached and w["tokens_per_s"]]
        seconds = sum(w["seconds"] for w in chosen)
        if not seconds:
            return None, None
        return (sum(w["tokens_per_s"] * w["seconds"] for w in chosen) / seconds,
                statistics.median(w["tokens_per_s"] for w in chosen))

    (alone, typical_alone), (attached, typical_attached) = rate(False), rate(True)
    return {"run": run.id, "config": config or "tunedeck demo", "window_s": window_s, "windows": per_window,
            "alone_tokens_per_s": alone and round(alone, 1), "attached_tokens_per_s": attached and round(attached, 1),
            "attached_over_alone": round(attached / alone, 4) if alone and attached else None,
            # one slow window (a hiccup of the box) moves the means; the windows' medians do not
            "median_attached_over_alone": round(typical_attached / typical_alone, 4)
            if typical_alone and typical_attached else None}


async def _alternate(run, windows: int, window_s: float, arrivals: dict[int, float]) -> list[tuple[bool, float, float]]:
    """Detached, attached, detached, ... (``windows`` spans of ``window_s`` s) once the run has logged a few
    steps; ``arrivals`` gets each step's first sight in metrics.jsonl (polled every 0.1 s)."""
    from tui.app import make_app

    async def follow() -> None:
        offset = 0
        while True:
            if run.metrics_path.exists():
                with open(run.metrics_path, encoding="utf-8") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
                complete = chunk[:chunk.rfind("\n") + 1]
                offset += len(complete.encode("utf-8"))
                now = time.monotonic()
                for line in complete.splitlines():
                    record = json.loads(line)
                    if record.get("kind") == "train":
                        arrivals.setdefault(int(record["step"]), now)
            await asyncio.sleep(0.1)

    follower = asyncio.create_task(follow())
    while len(arrivals) < 3:  # the model loaded, the first steps (compilation, warm-up) past
        if run.status().status in ("finished", "failed", "crashed", "stopped"):
            raise RuntimeError(f"run {run.id} ended before the windows: {run.status().status}")
        await asyncio.sleep(0.5)
    spans = []
    for index in range(windows):
        attached = index % 2 == 1
        began = time.monotonic()
        if attached:
            app = make_app(open_run=str(run.path), persist_settings=False)
            async with app.run_test(size=(160, 50)):
                await asyncio.sleep(window_s)
        else:
            await asyncio.sleep(window_s)
        spans.append((attached, began, time.monotonic()))
    follower.cancel()
    return spans


def _records(run) -> list[dict]:
    from core.runs.jsonl import iter_records

    return [r for r in iter_records(run.metrics_path) if r.get("kind") == "train"]


def write_report(out: Path, results: dict) -> None:
    lines = ["# Dashboard benchmark", "", f"Machine: {results['machine']}; load average after the run: "
             f"{results.get('load_average_after')}", ""]
    if "cpu" in results:
        cpu = results["cpu"]
        lines += ["| watching a busy run | value |", "|---|---|",
                  f"| CPU (% of one core) | {cpu['cpu_percent_of_one_core']} |",
                  f"| over | {cpu['seconds']} s |",
                  f"| records/s written (plus as many log lines) | {cpu['records_per_s_written']} |",
                  f"| fake GPUs charted | {cpu['fake_gpus']} |", ""]
    if "open" in results:
        op = results["open"]
        lines += ["| opening a run | value |", "|---|---|",
                  f"| metric lines | {results['open_lines']} |",
                  f"| first frame with data, from app start | {op['first_frame_with_data_s']} s |",
                  f"| first frame with data, from dashboard open | {op['from_dashboard_open_s']} s |",
                  f"| whole history backfilled | {op['backfill_done_s']} s |", ""]
    if "frame" in results:
        fr = results["frame"]
        lines += ["| one chart frame | value |", "|---|---|",
                  f"| points / buckets / columns | {fr['points']} / {fr['buckets']} / {fr['columns']} |",
                  f"| median | {fr['frame_ms_median']} ms |", ""]
    if "gpu" in results:
        lines += ["```", json.dumps(results["gpu"], indent=2), "```", ""]
    write_results(out, results, "\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=50.0, help="metric records (and log lines) per second")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "dashboard.json"))
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--skip-open", action="store_true")
    parser.add_argument("--skip-frame", action="store_true")
    parser.add_argument("--gpu", action="store_true",
                        help="tokens/s of one run in windows with and without a dashboard following it")
    parser.add_argument("--config", default=None,
                        help="with --gpu: a run configuration for 'tunedeck train' (default: 'tunedeck demo')")
    parser.add_argument("--row", default=None, help="with --gpu: run bench/engine_speed.py's row (e.g. 7b-lora) "
                        "instead of --config, for --steps steps")
    parser.add_argument("--steps", type=int, default=400, help="with --row: the run's steps (it is stopped after "
                        "the windows)")
    parser.add_argument("--windows", type=int, default=8, help="with --gpu: alternating windows, detached first")
    parser.add_argument("--window-s", type=float, default=10.0, help="with --gpu: seconds a window")
    parser.add_argument("--writer", help=argparse.SUPPRESS)
    parser.add_argument("--start-step", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, default=1_000_000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        writer_main(Path(args.writer), args.rate, args.start_step, args.total)
        return 0
    results: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                                f"Python {platform.python_version()}"}
    if args.gpu:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ.setdefault("TUNEDECK_HOME", tmp)  # runs of the benchmark stay out of the user's list
            config = str(engine_row_config(Path(tmp), args.row, args.steps)) if args.row else args.config
            results["gpu"] = attached_throughput(config, args.windows, args.window_s)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["TUNEDECK_HOME"] = tmp
            os.environ["TUNEDECK_FAKE_GPUS"] = str(ROOT / "tests" / "fixtures" / "gpus" / "h200x8.json")
            from core.paths import runs_dir

            if not args.skip_cpu:
                busy = make_run(runs_dir(), "20261129-2100-busy", 1000, 1_000_000)
                results["cpu"] = asyncio.run(measure_cpu(busy, args.seconds, args.rate))
                print(json.dumps(results["cpu"]), file=sys.stderr)
            if not args.skip_open:
                big = make_run(runs_dir(), "20261129-2100-big", args.lines, args.lines, status="finished")
                results["open_lines"] = args.lines
                results["open"] = asyncio.run(measure_open(big))
                print(json.dumps(results["open"]), file=sys.stderr)
            if not args.skip_frame:
                results["frame"] = measure_frame()
                print(json.dumps(results["frame"]), file=sys.stderr)
    # Other work on the box skews every figure: say how busy it was.
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    write_report(Path(args.out), results)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
