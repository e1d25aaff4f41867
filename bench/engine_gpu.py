"""GPU proof of the training engine, through the real ``tunedeck train`` path (detached runs).

For each (model, method) it writes a run YAML, starts ``tunedeck train`` (a detached supervisor), polls
the run's status, stops it gracefully after its first checkpoint, resumes it, and waits for the end;
then it reads metrics.jsonl/events.jsonl and appends one row to the results (JSON + markdown, rewritten
after every run so that a timeout keeps what was measured).

Models are random-initialised from the published Qwen2.5 configs in ``bench/configs/`` (vocab kept at
Qwen's size) with tunedeck's tiny tokenizer standing in for Qwen's (token ids stay below its size: fine
for speed and memory). Data: synthetic conversations, packed to ``--seq-len`` tokens.

One H200 (each command stays under 10 minutes)::

    python bench/engine_gpu.py --out /tmp/engine-0.5b.md --models 0.5b
    python bench/engine_gpu.py --out /tmp/engine-7b.md --models 7b

Two GPUs (DDP, ZeRO-2, ZeRO-3 of the 0.5B model, full fine-tuning)::

    python bench/engine_gpu.py --out /tmp/engine-multi.md --multi

``--out X.md`` also writes ``X.json``; run dirs and logs stay under ``--home`` (default: a temporary
directory) for inspection; checkpoints are deleted after each run unless ``--keep-checkpoints``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from results_files import write_results  # noqa: E402  (bench/ is not a package)

CONFIGS = {"0.5b": ROOT / "bench" / "configs" / "qwen2.5-0.5b.json",
           "7b": ROOT / "bench" / "configs" / "qwen2.5-7b.json",
           "tiny": ROOT / "core" / "assets" / "tiny" / "config.json"}  # CPU smoke test of this script
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Per model and method: settings sized for one H200 (141 GB) at the given sequence length.
SINGLE_GPU_PLANS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "lora": {"micro_batch_size": 2, "gradient_checkpointing": False},
        "dora": {"micro_batch_size": 2, "gradient_checkpointing": False},
        "full": {"micro_batch_size": 2, "gradient_checkpointing": False},
    },
    "0.5b": {
        "lora": {"micro_batch_size": 8, "gradient_checkpointing": False},
        "dora": {"micro_batch_size": 8, "gradient_checkpointing": False},
        "qlora": {"micro_batch_size": 8, "gradient_checkpointing": True},
        "full": {"micro_batch_size": 8, "gradient_checkpointing": False, "learning_rate": 1e-5},
    },
    "7b": {
        "lora": {"micro_batch_size": 4, "gradient_checkpointing": True},
        "dora": {"micro_batch_size": 4, "gradient_checkpointing": True},
        "qlora": {"micro_batch_size": 4, "gradient_checkpointing": True},
        # bf16 weights + bf16 AdamW states (pure_bf16): 7.6B x 8 bytes ~ 61 GB before activations
        "full": {"micro_batch_size": 2, "gradient_checkpointing": True, "pure_bf16": True, "learning_rate": 1e-5},
    },
}
MULTI_GPU_PLANS = {
    "ddp": {"zero_stage": 0},
    "zero2": {"zero_stage": 2},
    "zero3": {"zero_stage": 3},
}
WORDS = ("alpha beta gamma delta river mountain cloud stone light shadow number seven eleven garden "
         "window paper engine signal quiet rapid golden silver market letter answer question story").split()


def log(text: str) -> None:
    print(f"[engine_gpu {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def make_model_dir(home: Path, size: str) -> Path:
    """Qwen2.5 config + the tiny tokenizer: tunedeck initialises random weights from it."""
    from core.assets import tiny_model_dir

    target = home / "models" / f"qwen2.5-{size}-random"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIGS[size], target / "config.json")
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_model_dir() / name, target / name)
    return target


def make_dataset(home: Path, records: int = 1500, seed: int = 0) -> Path:
    path = home / "data" / "synthetic.jsonl"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(records):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
            answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 150)))
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            handle.write(json.dumps({"messages": messages}) + "\n")
    return path


def write_run_yaml(path: Path, values: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def tunedeck(home: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    # Keep the caller's PYTHONPATH (the GPU box carries bitsandbytes/deepspeed there) after ours.
    path = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "TUNEDECK_HOME": str(home), "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}
    out = subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    if check and out.returncode != 0:
        raise RuntimeError(f"tunedeck {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out


def wait_for(run: Any, predicate: Any, timeout_s: float) -> bool:
    from core.runs.liveness import effective_status

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        if not effective_status(run).active:
            return predicate()
        time.sleep(1.0)
    return False


def one_run(home: Path, name: str, values: dict[str, Any], resume: bool, timeout_s: float,
            keep_checkpoints: bool) -> dict[str, Any]:
    """Start, (stop after the first checkpoint, resume,) wait; return the measured row."""
    from core.runs.jsonl import iter_records
    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory

    started = time.time()
    cfg_path = write_run_yaml(home / f"{name}.yaml", values)
    row: dict[str, Any] = {"name": name, "model": values["model"].split("/")[-1], "method": values["method"],
                           "gpus": values.get("gpus"), "zero_stage": values.get("zero_stage", 0)}
    try:
        run_id = tunedeck(home, "train", str(cfg_path)).stdout.strip()
    except RuntimeError as exc:
        row.update(status="not started", reason=str(exc)[-500:])
        return row
    run = RunDirectory(home / "runs" / run_id)
    row["run_dir"] = str(run.path)
    log(f"{name}: run {run_id}")
    resumed_ok = None
    if resume:
        save_steps = int(values["save_steps"])
        reached = wait_for(run, lambda: any(c.step >= save_steps for c in run.checkpoints(True))
                           and (run.latest_metrics() or {}).get("step", 0) >= save_steps + 2, timeout_s)
        step = (run.latest_metrics() or {}).get("step", 0)
        if reached and effective_status(run).active and step < int(values["max_steps"]) - 2:
            tunedeck(home, "stop", run_id, "--wait", "--timeout", "300")
            stopped = run.status()
            log(f"{name}: {stopped.status} at step {(run.latest_metrics() or {}).get('step')}")
            if stopped.status == "stopped":
                tunedeck(home, "resume", run_id)
                resumed_ok = True
    wait_for(run, lambda: not effective_status(run).active, timeout_s)
    final = effective_status(run)
    if final.active:  # took too long: stop it so that the next run has the GPU
        tunedeck(home, "stop", run_id, "--force", check=False)
        final = run.status()
    records = list(iter_records(run.metrics_path))
    train = [r for r in records if r.get("kind") == "train"]
    last_resume = max((i for i, r in enumerate(records) if r.get("kind") == "resumed"), default=-1)
    # Speed of the last session, past its warm-up steps (or of the whole run if that is too short).
    measured = [r for r in records[last_resume + 1:] if r.get("kind") == "train"][3:] or train[3:]
    events = [r.get("event") for r in iter_records(run.events_path)]
    peaks_alloc = [max(vals) for vals in zip(*[r["peak_allocated_gib"] for r in train if r.get("peak_allocated_gib")],
                                             strict=False)] if train else []
    peaks_res = [max(vals) for vals in zip(*[r["peak_reserved_gib"] for r in train if r.get("peak_reserved_gib")],
                                           strict=False)] if train else []
    row.update(
        run_id=run_id,
        status=final.status,
        reason=final.reason,
        steps=train[-1]["step"] if train else 0,
        total_steps=train[-1]["total_steps"] if train else None,
        tokens_per_s=round(statistics.median(r["tokens_per_s"] for r in measured), 1) if measured else None,
        samples_per_s=round(statistics.median(r["samples_per_s"] for r in measured), 3) if measured else None,
        peak_allocated_gib=peaks_alloc,
        peak_reserved_gib=peaks_res,
        loss_first=train[0]["loss"] if train else None,
        loss_last=train[-1]["loss"] if train else None,
        checkpoints_saved=events.count("checkpoint_saved"),
        stopped_and_resumed=bool(resumed_ok and "resumed" in events),
        oom=("oom" in events),
        wall_s=round(time.time() - started, 1),
    )
    if final.status != "finished":  # what went wrong, for whoever reads the results without the box
        row["log_tail"] = run.log_path.read_text(errors="replace").splitlines()[-40:]
        row["supervisor_log_tail"] = (run.supervisor_log_path.read_text(errors="replace").splitlines()[-20:]
                                      if run.supervisor_log_path.exists() else [])
    if not keep_checkpoints:
        shutil.rmtree(run.checkpoints_dir, ignore_errors=True)
    log(f"{name}: {row['status']} {row.get('tokens_per_s')} tok/s peak {row['peak_allocated_gib']} GiB")
    return row


def render_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# tunedeck engine on GPU",
        "",
        f"{meta['gpu']} × {meta['gpu_count']}, torch {meta['torch']}, transformers {meta['transformers']}, "
        f"seq len {meta['seq_len']}, {meta['steps']} steps per run, {meta['date']}",
        "",
        "| run | method | GPUs | ZeRO | status | steps | tokens/s | peak alloc GiB (per rank) | "
        "peak reserved GiB | loss first→last | ckpt+resume | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        alloc = "/".join(f"{v:.1f}" for v in r.get("peak_allocated_gib") or []) or "-"
        reserved = "/".join(f"{v:.1f}" for v in r.get("peak_reserved_gib") or []) or "-"
        loss = (f"{r['loss_first']:.3f}→{r['loss_last']:.3f}" if r.get("loss_first") is not None
                and r.get("loss_last") is not None else "-")
        status = r["status"] + (f" ({r['reason'][:80]})" if r.get("reason") and r["status"] != "finished" else "")
        lines.append(
            f"| {r['name']} | {r['method']} | {r.get('gpus')} | {r.get('zero_stage', 0)} | {status} | "
            f"{r.get('steps', 0)}/{r.get('total_steps') or '-'} | {r.get('tokens_per_s') or '-'} | {alloc} | "
            f"{reserved} | {loss} | {'yes' if r.get('stopped_and_resumed') else 'no'} | {r.get('wall_s', '-')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results markdown path (X.json written next to it)")
    parser.add_argument("--models", default="0.5b", help="comma list of 0.5b, 7b (tiny: CPU smoke test)")
    parser.add_argument("--methods", default="lora,dora,qlora,full")
    parser.add_argument("--multi", action="store_true", help="DDP, ZeRO-2, ZeRO-3 on the first 2 GPUs (0.5B, full)")
    parser.add_argument("--multi-plans", default=",".join(MULTI_GPU_PLANS), help="with --multi: ddp,zero2,zero3")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--no-resume", action="store_true", help="skip the stop/resume in the middle")
    parser.add_argument("--home", default=None, help="TUNEDECK_HOME for the runs (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=420, help="seconds per run before giving up")
    parser.add_argument("--keep-checkpoints", action="store_true")
    args = parser.parse_args()

    import torch
    import transformers

    home = Path(args.home or tempfile.mkdtemp(prefix="tunedeck-engine-gpu-"))
    home.mkdir(parents=True, exist_ok=True)
    out_md = Path(args.out)
    out_json = out_md.with_suffix(".json")
    out_md.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        "gpu_count": torch.cuda.device_count(), "torch": torch.__version__,
        "transformers": transformers.__version__, "seq_len": args.seq_len, "steps": args.steps,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "home": str(home),
    }
    log(f"runs under {home}")
    dataset = make_dataset(home)
    rows: list[dict[str, Any]] = []
    save_steps = max(2, args.steps // 3)

    def base(size: str) -> dict[str, Any]:
        return {
            "name": f"bench-{size}", "model": str(make_model_dir(home, size)), "dataset": str(dataset),
            "precision": "bf16", "max_seq_len": args.seq_len, "packing": True, "gradient_accumulation": 1,
            "max_steps": args.steps, "learning_rate": 1e-4, "warmup_steps": 2, "save_steps": save_steps,
            "save_total_limit": 1, "logging_steps": 1, "seed": 1, "attn": "sdpa",
            "gpus": 1 if torch.cuda.is_available() else "all",
        }

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        write_results(out_md, {"meta": meta, "runs": rows}, render_markdown(rows, meta))

    if args.multi:
        if torch.cuda.device_count() < 2:
            log("--multi needs 2 GPUs")
            return 2
        wanted = [m.strip() for m in args.multi_plans.split(",") if m.strip()]
        for mode, extra in [(m, MULTI_GPU_PLANS[m]) for m in wanted]:
            values = {**base("0.5b"), "method": "full", "gpus": 2, "micro_batch_size": 8,
                      "gradient_checkpointing": False, "learning_rate": 1e-5, **extra}
            values["name"] = f"bench-0.5b-full-{mode}"
            record(one_run(home, f"0.5b-full-{mode}", values, not args.no_resume, args.timeout,
                           args.keep_checkpoints))
    else:
        for size in [s.strip() for s in args.models.split(",") if s.strip()]:
            for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
                plan = SINGLE_GPU_PLANS[size][method]
                values = {**base(size), "method": method, **plan}
                values["name"] = f"bench-{size}-{method}"
                resume = not args.no_resume
                if size == "7b" and method == "full":
                    # One checkpoint of weights + optimizer is ~45 GB: save once, at the end, no stop/resume.
                    values["save_steps"] = args.steps
                    resume = False
                record(one_run(home, f"{size}-{method}", values, resume, args.timeout, args.keep_checkpoints))
                shutil.rmtree(home / "cache" / "random-init", ignore_errors=True)  # QLoRA's random weights
    log(f"results: {out_md} and {out_json}")
    print(out_md.read_text())
    return 0 if rows and all(r["status"] == "finished" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
