"""Speed and memory of tunedeck's engine against the plain recipe (and ms-swift), one matrix per call.

Engines, on the same random-initialised model, the same tokenised data and the same steps:

- ``plain``: ``bench/plain_recipe.py`` — transformers Trainer + peft (+ ``prepare_model_for_kbit_training``
  for QLoRA) + bitsandbytes, the model's own loss, padding to the longest, ``adamw_torch``;
  ``plain+qlora_upcast=false``: the same without the upcast (every base weight frozen, none cast to fp32);
- ``tunedeck``: the real ``tunedeck train`` (detached run, ``bench/engine_gpu.py``'s helpers) with its
  defaults: chunked/Liger fused cross-entropy, QLoRA without the fp32 upcast, fused AdamW, packing;
- ``swift`` / ``swift-liger``: ms-swift's ``swift sft`` (defaults, and ``--use_liger_kernel true``) when
  the ``swift`` package is importable, on a saved random-weight copy of the model.

Per (row, engine): tokens/s in steady state (non-padding tokens between a later step and the last, over
the wall time between them: the first ``--warmup`` steps are left out), MFU (model FLOPs: forward +
backward from ``core.estimate.speed.flops_per_token``, the same for every engine, recomputation not
counted, over the GPU's dense bf16 peak), peak memory (NVML: the most GPU memory all processes held,
sampled every 0.1 s; torch's max allocated / reserved when the engine reports it; on a CPU the peak RSS of
the process tree) and the loss after N steps (mean of the last three logged losses).

Rows (``--rows``, comma list; default: all that the visible GPUs allow):

- ``7b-lora``, ``7b-qlora``, ``7b-full``: Qwen2.5-7B, micro-batch 4 x 2048 tokens, checkpointing;
- ``maxseq-7b-qlora``, ``maxseq-8b-qlora``: batch 1, growing the sequence (8k, 16k, 32k, 48k, 64k, 96k,
  128k) until out of memory; the table gives the longest that stayed within 24 / 48 / 80 GiB (tunedeck
  with ``offload_activations: true``);
- ``7b-lora-zero2``: the 7b-lora row on 2 GPUs with ZeRO-2 (only when 2 GPUs are visible): scaling
  against the one-GPU tunedeck row.

One call stays inside ``--budget-s`` (rows that cannot start in time are recorded as skipped, a running
engine is stopped at the budget). On one H200, in calls of under 10 minutes::

    python bench/engine_speed.py --out bench/results/engine-speed-a.md --rows 7b-lora,7b-qlora
    python bench/engine_speed.py --out bench/results/engine-speed-b.md --rows 7b-full
    python bench/engine_speed.py --out bench/results/engine-speed-c.md --rows maxseq-7b-qlora,maxseq-8b-qlora \\
        --engines tunedeck
    # 2 x H200:
    python bench/engine_speed.py --out bench/results/engine-speed-d.md --rows 7b-lora,7b-lora-zero2 \\
        --engines tunedeck

``--tiny --cpu`` runs the whole pipeline on the bundled tiny model on a CPU in about a minute (the test).
``--out X.md`` also writes ``X.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine_gpu import TOKENIZER_FILES, WORDS, one_run  # noqa: E402  (bench/ is not a package)
from results_files import write_results  # noqa: E402  (bench/ is not a package)

# The engine's LoRA run keys whose value as run the log header reports (a result's ``<key>_run``)
LORA_SWITCHES = ("lora_dropout_fused", "lora_swiglu_fused", "lora_swiglu_down", "lora_swiglu_db",
                 "qlora_reuse_dequantised", "recompute_skip_down", "recompute_keep_lora_a", "rms_norm_rows",
                 "lora_fold_dh")

CONFIGS = {
    "7b": ROOT / "bench" / "configs" / "qwen2.5-7b.json",
    "8b": ROOT / "bench" / "configs" / "llama-3-8b.json",
    "tiny": ROOT / "core" / "assets" / "tiny" / "config.json",
}
GIB = 2**30
MAXSEQ_LENGTHS = (8192, 16384, 32768, 49152, 65536, 98304, 131072)
MAXSEQ_BUDGETS_GIB = (24, 48, 80)
ENGINES = ("plain", "tunedeck", "swift", "swift-liger")
# Where ms-swift and its own pins (peft < 0.21, datasets < 4.8.5) are installed, ahead of everything
# else on PYTHONPATH for the ms-swift processes only (see ../shared/device/swift-wheels.sh).
SWIFT_SITE_ENV = "TUNEDECK_BENCH_SWIFT_SITE"


PLAIN_KEYS = ("qlora_upcast",)  # the plain recipe's one switch: peft's fp32 upcast of a 4-bit model, or not


def parse_engine(text: str) -> tuple[str, dict[str, Any]]:
    """``tunedeck+key=value+key=value`` -> ("tunedeck", {key: value}): a tunedeck run with run keys
    changed (values read as YAML), so that one call measures each switch against the defaults.
    ``tunedeck+env.NAME=value``: the run's processes get that environment variable (``env.NAME`` in the dict).
    ``plain+qlora_upcast=false``: the plain recipe without ``prepare_model_for_kbit_training``'s upcast."""
    import yaml

    base, *pairs = text.strip().split("+")
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"engine {text!r}: write tunedeck+key=value")
        overrides[key.strip()] = yaml.safe_load(value)
    if overrides and base != "tunedeck" and not (base == "plain" and set(overrides) <= set(PLAIN_KEYS)):
        raise ValueError(f"engine {text!r}: only tunedeck takes run keys (plain: {', '.join(PLAIN_KEYS)})")
    return base, overrides


def run_tag(changes: dict[str, Any]) -> str:
    """The part of a run's name (and its files' names) that says what it changes: ``key-value``, a path value by
    its file name (``tunedeck+env.TUNEDECK_LORA_DROPOUT_TILES=/root/out/x.json`` made a name with slashes in it,
    and the run no file)."""
    return "-".join(f"{k}-{Path(str(v)).name if '/' in str(v) else v}" for k, v in changes.items())


def log(text: str) -> None:
    print(f"[engine_speed {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---- rows ------------------------------------------------------------------------------------------------
def row_specs(tiny: bool, gpus: int) -> dict[str, dict[str, Any]]:
    """Every row this call could run: model, method, micro-batch, sequence, GPUs, checkpointing."""
    if tiny:
        return {
            "tiny-lora": {"model": "tiny", "method": "lora", "micro": 2, "seq": 128, "gpus": 1, "ckpt": False},
            "tiny-full": {"model": "tiny", "method": "full", "micro": 2, "seq": 128, "gpus": 1, "ckpt": False},
            "plan-tiny-lora": {"model": "tiny", "method": "lora", "micro": 0, "seq": 128, "gpus": 1, "ckpt": False,
                               "plan": True},
        }
    rows = {
        "7b-lora": {"model": "7b", "method": "lora", "micro": 4, "seq": 2048, "gpus": 1, "ckpt": True},
        "7b-qlora": {"model": "7b", "method": "qlora", "micro": 4, "seq": 2048, "gpus": 1, "ckpt": True},
        "7b-full": {"model": "7b", "method": "full", "micro": 4, "seq": 2048, "gpus": 1, "ckpt": True},
        # the wizard's own plan on this box (micro-batch, checkpointing, ... as `tunedeck plan` chooses)
        "plan-7b-lora": {"model": "7b", "method": "lora", "micro": 0, "seq": 2048, "gpus": 1, "ckpt": False,
                         "plan": True},
        "plan-7b-qlora": {"model": "7b", "method": "qlora", "micro": 0, "seq": 2048, "gpus": 1, "ckpt": False,
                          "plan": True},
        "maxseq-7b-qlora": {"model": "7b", "method": "qlora", "micro": 1, "seq": 0, "gpus": 1, "ckpt": True,
                            "maxseq": True},
        "maxseq-8b-qlora": {"model": "8b", "method": "qlora", "micro": 1, "seq": 0, "gpus": 1, "ckpt": True,
                            "maxseq": True},
    }
    if gpus >= 2:
        rows["7b-lora-zero2"] = {"model": "7b", "method": "lora", "micro": 4, "seq": 2048, "gpus": 2, "ckpt": True,
                                 "zero_stage": 2, "scaling_of": "7b-lora"}
    return rows


# ---- shared inputs ---------------------------------------------------------------------------------------
def make_model_dir(home: Path, model: str) -> Path:
    """The model's config.json + tunedeck's tiny tokenizer (token ids stay below its size)."""
    from core.assets import tiny_model_dir

    target = home / "models" / model
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIGS[model], target / "config.json")
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_model_dir() / name, target / name)
    return target


def make_long_dataset(home: Path, min_tokens: int, records: int, prompt_tokens: int = 0) -> Path:
    """Conversations whose assistant part alone is longer than ``min_tokens``: every row is full length
    in every engine (truncated to the sequence length), so no engine gains by padding less. The question is 30
    words, or about ``prompt_tokens`` tokens: the share of each row without a target (the loss's prompt)."""
    import random

    from core.assets import tiny_model_dir
    from core.train.model_setup import load_tokenizer

    path = home / "data" / f"long-{min_tokens}-{records}{f'-prompt{prompt_tokens}' if prompt_tokens else ''}.jsonl"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(tiny_model_dir())
    rng = random.Random(min_tokens)
    probe = " ".join(rng.choice(WORDS) for _ in range(400))
    per_word = max(0.5, len(tokenizer(probe)["input_ids"]) / 400)
    words = int(min_tokens / per_word * 1.2) + 50
    asked = int(prompt_tokens / per_word) if prompt_tokens else 30
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(records):
            question = " ".join(rng.choice(WORDS) for _ in range(asked))
            answer = " ".join(rng.choice(WORDS) for _ in range(words))
            handle.write(json.dumps({"messages": [{"role": "user", "content": question},
                                                  {"role": "assistant", "content": answer}]}) + "\n")
    return path


# ---- measurement -----------------------------------------------------------------------------------------
class PeakMemorySampler:
    """The most memory seen while it runs: NVML (all compute processes, per GPU) or, on a CPU, the summed
    RSS of the processes whose command line names ``marker`` (the bench's home: the engine under test,
    including tunedeck's detached worker, which is no child of ours), sampled every 0.1 s in a thread."""

    def __init__(self, cpu: bool, marker: str = "") -> None:
        self.cpu = cpu
        self.marker = marker
        self.peak_gib: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _sample(self) -> list[float]:
        if self.cpu:
            import psutil

            total = 0
            for proc in psutil.process_iter(["cmdline"]):
                try:
                    if proc.pid != os.getpid() and self.marker in " ".join(proc.info["cmdline"] or []):
                        total += proc.memory_info().rss
                except psutil.Error:
                    pass
            return [total / GIB]
        import pynvml

        values = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            values.append(sum((p.usedGpuMemory or 0) for p in procs) / GIB)
        return values

    def _run(self) -> None:
        if not self.cpu:
            import pynvml

            pynvml.nvmlInit()
        while not self._stop.is_set():
            try:
                sample = self._sample()
            except Exception:  # a process that ended between listing and reading: next sample
                sample = []
            if sample:
                if len(self.peak_gib) < len(sample):
                    self.peak_gib += [0.0] * (len(sample) - len(self.peak_gib))
                self.peak_gib = [max(a, b) for a, b in zip(self.peak_gib, sample, strict=False)]
            self._stop.wait(0.1)


def steady_tokens_per_s(points: list[tuple[float, float]], warmup: int) -> float | None:
    """(time s, cumulative tokens) per step -> tokens/s between step ``warmup`` and the last."""
    if len(points) < 2:
        return None
    first = points[min(warmup, len(points) - 2)]
    last = points[-1]
    return (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else None


def model_flops_per_token(model: str, method: str, seq: int) -> float:
    """Forward + backward training FLOPs per token of a row (``core.estimate.speed.model_flops_per_token``:
    no recomputation, every attention score counted, the PaLM convention)."""
    from core.estimate import plan_for_model
    from core.estimate.speed import model_flops_per_token as flops_of

    return flops_of(plan_for_model(str(CONFIGS[model]), method=method, seq_len=seq, exact_count=False))


def gpu_peak_flops() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    from core.estimate import find_gpu

    try:
        return find_gpu(torch.cuda.get_device_name(0)).peak_tflops("bf16") * 1e12
    except Exception:
        return None


def loss_after(losses: list[float]) -> float | None:
    tail = [v for v in losses if v is not None][-3:]
    return round(statistics.fmean(tail), 4) if tail else None


# ---- engines ---------------------------------------------------------------------------------------------
def run_plain(ctx: dict[str, Any], spec: dict[str, Any], seq: int, timeout_s: float,
              overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    upcast = bool((overrides or {}).get("qlora_upcast", True))
    out_json = ctx["home"] / "plain" / f"{spec['name']}-{seq}{'' if upcast else '-no-upcast'}.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "bench" / "plain_recipe.py"), "--model-dir", str(ctx["model_dirs"][spec["model"]]),
           "--dataset", str(ctx["dataset"](seq)), "--method", spec["method"], "--micro-batch", str(spec["micro"]),
           "--seq-len", str(seq), "--steps", str(ctx["steps"]), "--lora-dropout", str(ctx["lora_dropout"]),
           "--out", str(out_json)]
    if spec["ckpt"]:
        cmd.append("--gradient-checkpointing")
    if not upcast:
        cmd.append("--no-qlora-upcast")
    if ctx["cpu"]:
        cmd.append("--cpu")
    env = {**os.environ, "TUNEDECK_HOME": str(ctx["home"]), "PYTHONPATH": _pythonpath()}
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "timeout"}
    if not out_json.exists():
        return {"status": "failed", "reason": done.stderr.strip().splitlines()[-1:] or ["no output"]}
    data = json.loads(out_json.read_text())
    steps = data.get("steps") or []
    return {
        "status": data["status"],
        "reason": data.get("reason"),
        "tokens_per_s": steady_tokens_per_s([(s["t"], s["tokens"]) for s in steps], ctx["warmup"]),
        "torch_peak_allocated_gib": data.get("peak_allocated_gib"),
        "torch_peak_reserved_gib": data.get("peak_reserved_gib"),
        "loss": loss_after([s.get("loss") for s in steps]),
        "losses": [s.get("loss") for s in steps],  # each step's: the first tells whether two engines' bases agree
        "steps": len(steps),
        "optimizer": data.get("optimizer"),
    }


def planned_values(ctx: dict[str, Any], spec: dict[str, Any], seq: int) -> dict[str, Any]:
    """The wizard's own plan for this box (``tunedeck plan ... --save``), as run-config values."""
    import yaml
    from engine_gpu import tunedeck

    path = ctx["home"] / f"plan-{spec['name']}.yaml"
    # --cpu on a box with a GPU: plan for the CPU the run gets, not for the GPU that NVML sees
    hardware = ["--hardware", "cpu"] if ctx["cpu"] else []
    tunedeck(ctx["home"], "plan", "--model", str(ctx["model_dirs"][spec["model"]]), "--dataset", str(ctx["dataset"](seq)),
             "--set", f"method={spec['method']}", "--set", f"seq_len={seq}", *hardware, "--save", str(path), "--force")
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def run_tunedeck(ctx: dict[str, Any], spec: dict[str, Any], seq: int, timeout_s: float,
                 overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    values = {
        "name": f"speed-{spec['name']}", "model": str(ctx["model_dirs"][spec["model"]]),
        "dataset": str(ctx["dataset"](seq)), "method": spec["method"], "precision": "bf16",
        "max_seq_len": seq, "micro_batch_size": spec["micro"], "gradient_accumulation": 1,
        "gradient_checkpointing": spec["ckpt"], "max_steps": ctx["steps"], "learning_rate": 1e-4,
        "warmup_steps": 2, "lr_scheduler": "cosine", "lora_rank": 16, "lora_alpha": 32, "lora_dropout": ctx["lora_dropout"],
        "save_steps": 100000, "save_total_limit": 1, "logging_steps": 1, "seed": 1, "attn": "sdpa",
        "packing": True, "gpus": spec["gpus"] if not ctx["cpu"] else "all", "zero_stage": spec.get("zero_stage", 0),
    }
    if spec["method"] == "full":
        values["pure_bf16"] = True  # the plain recipe loads the model in bf16 too
    if spec.get("maxseq"):
        values["offload_activations"] = True  # long sequences: the kept block inputs wait in host memory
    if spec.get("plan"):  # the wizard's choices; only the bench's bookkeeping keys are ours
        planned = planned_values(ctx, spec, seq)
        keep = ("name", "max_steps", "warmup_steps", "save_steps", "save_total_limit", "logging_steps", "seed",
                "learning_rate", "lr_scheduler")
        values = {**planned, **{k: values[k] for k in keep}}
        for key in ("epochs", "warmup_ratio"):  # the bench's steps and warm-up replace these
            values.pop(key, None)
    overrides = dict(overrides or {})
    environment = {key[len("env."):]: str(overrides.pop(key)) for key in list(overrides) if key.startswith("env.")}
    values.update(overrides)
    tag = run_tag({**overrides, **environment})
    profile_window = None
    if ctx.get("profile") and not spec.get("maxseq"):
        from core.train.profiling import parse_profile_env

        profile_window = parse_profile_env(ctx["profile"])
    # The caller's own values come back after the run (TUNEDECK_MEMORY_PROFILE set for a whole call: popping
    # it after the first row left the others without memory.txt, session 32).
    saved_env = {name: os.environ.get(name) for name in ("TUNEDECK_PROFILE", "TUNEDECK_MEMORY_PROFILE",
                                                         "TUNEDECK_SYNC_TRACE", *environment)}
    if profile_window:
        os.environ["TUNEDECK_PROFILE"] = ctx["profile"]
    if ctx.get("memory_profile"):  # the allocations live at the peak of that step -> memory.txt
        os.environ["TUNEDECK_MEMORY_PROFILE"] = str(ctx["memory_profile"])
    if ctx.get("sync_trace"):  # where those steps make the host wait for the GPU -> syncs.txt
        os.environ["TUNEDECK_SYNC_TRACE"] = str(ctx["sync_trace"])
    os.environ.update(environment)  # the detached trainer inherits them
    try:
        row = one_run(ctx["home"], f"{spec['name']}-{seq}{'-' + tag if tag else ''}", values, False, timeout_s, False)
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    from core.runs.jsonl import iter_records

    records = list(iter_records(Path(row["run_dir"]) / "metrics.jsonl")) if row.get("run_dir") else []
    every_step = train = [r for r in records if r.get("kind") == "train"]
    header = records[0] if records else {}
    if profile_window:  # the profiled steps are slower: the rate is the one before them (the loss is not).
        # (A deferred record, written a step later, carries its own step's end: core.train.trainer.)
        train = [r for r in train if int(r.get("step") or 0) < profile_window[0]] or train
    profile = Path(row["run_dir"]) / "profile.txt" if row.get("run_dir") else None
    memory = Path(row["run_dir"]) / "memory.txt" if row.get("run_dir") else None
    syncs = Path(row["run_dir"]) / "syncs.txt" if row.get("run_dir") else None
    rate = steady_tokens_per_s([(r["elapsed_s"], r.get("tokens_seen") or 0) for r in train], ctx["warmup"])
    if rate is None and len(train) == 1:  # one step only (the longest lengths): that step's own rate
        rate = train[0].get("tokens_per_s")
    saved = [e for e in iter_records(Path(row["run_dir"]) / "events.jsonl") if e.get("event") == "checkpoint_saved"] \
        if row.get("run_dir") else []
    if ctx.get("drop_checkpoints") and row.get("run_dir"):  # the disk is small: keep only what was measured
        shutil.rmtree(Path(row["run_dir"]) / "checkpoints", ignore_errors=True)
    return {
        "checkpoints_saved": [{"step": e.get("step"), "gb": round((e.get("bytes") or 0) / 1e9, 2),
                               "seconds": e.get("seconds")} for e in saved],
        "config": {k: values.get(k) for k in ("micro_batch_size", "gradient_accumulation", "gradient_checkpointing",
                                               "checkpoint_layers", "lora_dropout", "compile_layers",
                                               "lora_input_upcast", "pure_bf16", "packing",
                                               "offload_activations", "tiled_mlp", "lora_grouped",
                                               *LORA_SWITCHES)},
        **{f"{key}_run": header.get(key) for key in LORA_SWITCHES},
        "tiled_mlp_run": header.get("tiled_mlp"),
        "profile": profile.read_text(encoding="utf-8") if profile and profile.exists() else None,
        "checkpoint_layers_run": header.get("checkpoint_layers"),
        "micro": values.get("micro_batch_size"),
        "status": row.get("status"),
        "reason": row.get("reason"),
        "tokens_per_s": rate,
        "rate_from": "one step" if rate is not None and len(train) == 1 else "steady",
        "memory_profile": memory.read_text(encoding="utf-8") if memory and memory.exists() else None,
        "syncs": syncs.read_text(encoding="utf-8") if syncs and syncs.exists() else None,
        "torch_peak_allocated_gib": row.get("peak_allocated_gib"),
        "torch_peak_reserved_gib": row.get("peak_reserved_gib"),
        # after every step run: earlier summaries read profiled rows' loss before the profiled steps only (the
        # rate's window), a higher loss that looked like another engine's maths
        "loss": loss_after([r.get("loss") for r in every_step]),
        "losses": [r.get("loss") for r in every_step],
        "steps": len(train),  # the rate's
        # Each step's wall seconds (from the metrics' elapsed_s): a mean rate hides whether every step is slow
        # or a few stall (a collection, a recompilation), which the next measurement must tell apart.
        "step_s": [round(b["elapsed_s"] - a["elapsed_s"], 3) for a, b in zip(train, train[1:], strict=False)],
        "optimizer": header.get("optimizer"),
        "fused_ce": header.get("fused_ce"),
        "oom": row.get("oom"),
    }


_SWIFT_STEP = re.compile(r"'global_step/max_steps': '(\d+)/(\d+)'")
_SWIFT_LOSS = re.compile(r"'loss': '?([0-9.]+)")


def run_swift(ctx: dict[str, Any], spec: dict[str, Any], seq: int, timeout_s: float, liger: bool) -> dict[str, Any]:
    """``swift sft`` with its defaults; steps timed as its log lines arrive (tokens = micro x seq per step)."""
    import importlib.util

    site = os.environ.get(SWIFT_SITE_ENV, "")
    if not (site and (Path(site) / "swift").is_dir()) and importlib.util.find_spec("swift") is None:
        return {"status": "skipped", "reason": "ms-swift is not installed"}
    import torch

    from core.train.model_setup import materialize_random_weights

    os.environ["TUNEDECK_HOME"] = str(ctx["home"])
    # made by ensure_random_weights in a child before the sampler started (on a CPU: here)
    weights = materialize_random_weights(ctx["model_dirs"][spec["model"]], 1, torch.bfloat16)
    out_dir = ctx["home"] / "swift" / f"{spec['name']}-{seq}{'-liger' if liger else ''}"
    # ms-swift's own entry point re-runs swift/cli/sft.py in a child python: one process with swift.cli.sft
    cmd = [sys.executable, "-m", "swift.cli.sft"] + [
        "--model", str(weights), "--model_type", "qwen2" if spec["model"] != "8b" else "llama3",
        "--template", "qwen2_5" if spec["model"] != "8b" else "llama3", "--dataset", str(ctx["dataset"](seq)),
        "--tuner_type", "full" if spec["method"] == "full" else "lora", "--torch_dtype", "bfloat16",
        "--check_model", "false",  # else it asks the hub whether the local model is the latest (offline here)
        "--per_device_train_batch_size", str(spec["micro"]), "--gradient_accumulation_steps", "1",
        "--max_length", str(seq), "--truncation_strategy", "right", "--max_steps", str(ctx["steps"]),
        "--learning_rate", "1e-4", "--warmup_ratio", "0", "--logging_steps", "1", "--save_strategy", "no",
        "--output_dir", str(out_dir), "--report_to", "none", "--seed", "1", "--split_dataset_ratio", "0",
        "--gradient_checkpointing", "true" if spec["ckpt"] else "false", "--dataloader_num_workers", "0",
    ]
    if spec["method"] != "full":
        cmd += ["--lora_rank", "16", "--lora_alpha", "32", "--target_modules", "all-linear",
                "--lora_dropout", str(ctx["lora_dropout"])]
    if spec["method"] == "qlora":
        cmd += ["--quant_method", "bnb", "--quant_bits", "4", "--bnb_4bit_quant_type", "nf4",
                "--bnb_4bit_use_double_quant", "true", "--bnb_4bit_compute_dtype", "bfloat16"]
    if liger:
        cmd += ["--use_liger_kernel", "true"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "MODELSCOPE_CACHE": str(ctx["home"] / "ms"),
           "PYTHONPATH": os.pathsep.join(p for p in (site, _pythonpath()) if p)}
    points: list[tuple[float, float]] = []
    losses: list[float] = []
    tail: list[str] = []
    # swift's launcher starts the trainer as a child: own session, so a timeout kills the whole group
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + timeout_s

    def kill_group() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is already gone
            pass

    timer = threading.Timer(timeout_s, kill_group)
    timer.start()
    try:
        for line in proc.stdout or []:
            tail = (tail + [line.rstrip()])[-20:]
            step = _SWIFT_STEP.search(line)
            loss = _SWIFT_LOSS.search(line)
            if step and loss:
                points.append((time.perf_counter(), int(step.group(1)) * spec["micro"] * seq))
                losses.append(float(loss.group(1)))
        proc.wait()
    finally:
        timer.cancel()
    status = "finished" if proc.returncode == 0 else ("timeout" if time.monotonic() >= deadline else "failed")
    return {"status": status, "reason": None if status == "finished" else " | ".join(tail[-3:])[-400:],
            "tokens_per_s": steady_tokens_per_s(points, ctx["warmup"]), "loss": loss_after(losses),
            "losses": losses, "steps": len(points), "optimizer": "swift default"}


def _pythonpath() -> str:
    path = os.environ.get("PYTHONPATH", "")
    return str(ROOT) + (os.pathsep + path if path else "")


def ensure_random_weights(ctx: dict[str, Any], model: str) -> None:
    """The random bf16 weights a bare config's 4-bit loaders read, made once in a child process before
    anything is measured: made inside the measured process they put their own peak (about 14 GiB for a
    7B) into its memory figures, above what a QLoRA step at 32k needs."""
    done = ctx.setdefault("weights_made", set())
    if ctx["cpu"] or model in done:
        return
    code = ("import sys, torch; from pathlib import Path; from core.train.model_setup import materialize_random_weights;"
            " print(materialize_random_weights(Path(sys.argv[1]), 1, torch.bfloat16))")
    env = {**os.environ, "TUNEDECK_HOME": str(ctx["home"]), "PYTHONPATH": _pythonpath()}
    subprocess.run([sys.executable, "-c", code, str(ctx["model_dirs"][model])], cwd=ROOT, env=env, check=True,
                   capture_output=True, text=True)
    done.add(model)


def run_engine(ctx: dict[str, Any], engine: str, spec: dict[str, Any], seq: int, timeout_s: float) -> dict[str, Any]:
    base, overrides = parse_engine(engine)
    if spec["method"] == "qlora" or base.startswith("swift"):
        ensure_random_weights(ctx, spec["model"])  # the same seed (1) and dtype the runs ask the cache for
    with PeakMemorySampler(ctx["cpu"], str(ctx["home"])) as sampler:
        if base == "plain":
            result = run_plain(ctx, spec, seq, timeout_s, overrides)
        elif base == "tunedeck":
            result = run_tunedeck(ctx, spec, seq, timeout_s, overrides)
        else:
            result = run_swift(ctx, spec, seq, timeout_s, liger=base == "swift-liger")
    result["peak_gib"] = [round(v, 2) for v in sampler.peak_gib]
    result["peak_source"] = "rss" if ctx["cpu"] else "nvml"
    tps = result.get("tokens_per_s")
    peak_flops = ctx["peak_flops"]
    if tps and peak_flops:
        result["mfu"] = round(tps * model_flops_per_token(spec["model"], spec["method"], seq)
                              / (peak_flops * spec["gpus"]), 4)
    if tps:
        result["tokens_per_s"] = round(tps, 1)
    return result


# ---- report ----------------------------------------------------------------------------------------------
def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "/".join(f"{v:.{digits}f}" for v in value) or "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# Issue #13's targets per method: (vs plain: speed >=, memory <=), (vs ms-swift + Liger: speed >=, memory <=)
TARGETS = {"lora": ((1.6, 0.6), (1.3, 1.0)), "qlora": ((1.8, 0.4), (1.3, 1.0)), "full": ((1.3, None), None)}
PLAN_TARGET = 2.5  # the wizard's plan against the plain recipe's default shape (b4 x 2048, checkpointing)


def _peak(row: dict[str, Any]) -> float | None:
    return max(row["peak_gib"]) if row.get("peak_gib") else None


def _versus(r: dict[str, Any], other: dict[str, Any] | None, name: str, target: tuple | None) -> str | None:
    if not other or not other.get("tokens_per_s") or not r.get("tokens_per_s"):
        return None
    speed = r["tokens_per_s"] / other["tokens_per_s"]
    mem = _peak(r) / _peak(other) if _peak(r) and _peak(other) else None
    text = f"{speed:.2f}x the tokens/s of {name}, peak {_fmt(mem, 2)}x, loss {_fmt(r.get('loss'), 3)} vs " \
           f"{_fmt(other.get('loss'), 3)}"
    if target is None:
        return text
    want_speed, want_mem = target
    ok = speed >= want_speed and (want_mem is None or (mem is not None and mem <= want_mem))
    mem_target = f", peak <= {want_mem}x" if want_mem is not None else ""
    return f"{text} (target >= {want_speed}x{mem_target}): {'meets' if ok else 'MISSES'}"


def analysis(results: list[dict[str, Any]]) -> list[str]:
    """Ratios against the issue's targets, from the rows this call measured (every tunedeck variant)."""
    by = {(r["row"], r["engine"], r["seq"]): r for r in results}
    lines = []
    for r in results:
        if not r["engine"].startswith("tunedeck") or r.get("maxseq") or r.get("gpus", 1) > 1:
            continue
        if r.get("plan"):
            default_row = r["row"].replace("plan-", "")
            plain = by.get((default_row, "plain", r["seq"]))
            text = _versus(r, plain, f"plain at {default_row}'s default shape", (PLAN_TARGET, None))
            if text:
                lines.append(f"- {r['row']} ({r['engine']}, the wizard's plan: {r.get('config')}): {text}")
            continue
        vs_plain, vs_swift = TARGETS.get(r["method"], ((1.0, None), None))
        parts = [_versus(r, by.get((r["row"], "plain", r["seq"])), "plain", vs_plain)]
        parts.append(_versus(r, by.get((r["row"], "swift-liger", r["seq"])), "ms-swift + Liger", vs_swift))
        parts.append(_versus(r, by.get((r["row"], "swift", r["seq"])), "ms-swift defaults", None))
        if r["engine"] != "tunedeck":
            parts.append(_versus(r, by.get((r["row"], "tunedeck", r["seq"])), "tunedeck's defaults", None))
        parts = [p for p in parts if p]
        if parts:
            lines.append(f"- {r['row']} ({r['engine']}):")
            lines += [f"  - {p}" for p in parts]
    for r in results:
        if r.get("scaling_of") and r.get("tokens_per_s"):
            one = by.get((r["scaling_of"], r["engine"], r["seq"]))
            if one and one.get("tokens_per_s"):
                lines.append(f"- {r['row']}: {r['tokens_per_s'] / one['tokens_per_s']:.2f}x the one-GPU tokens/s "
                             f"(target >= 1.85x)")
    maxseq: dict[tuple[str, str], dict[int, int]] = {}
    for r in results:
        if r.get("maxseq") and r.get("status") == "finished" and r.get("peak_gib"):
            fits = maxseq.setdefault((r["row"], r["engine"]), {})
            for budget in MAXSEQ_BUDGETS_GIB:
                if max(r["peak_gib"]) <= budget:
                    fits[budget] = max(fits.get(budget, 0), r["seq"])
    for (row, engine), fits in maxseq.items():
        text = ", ".join(f"{b} GiB: {fits.get(b, 0) or '< 8192'}" for b in MAXSEQ_BUDGETS_GIB)
        lines.append(f"- {row} ({engine}): longest sequence at batch 1 within {text} (target: >= 32768 within 24 GiB)")
    return lines


def render(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Engine speed: tunedeck vs the plain recipe",
        "",
        f"{meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}, {meta['steps']} steps "
        f"(steady rate after step {meta['warmup']}), LoRA dropout {meta.get('lora_dropout', 0.05)}, {meta['date']}",
        "",
        "| row | engine | method | batch x seq | GPUs | status | tokens/s | MFU | peak GiB "
        f"({'RSS' if meta['cpu'] else 'NVML'}) | torch max alloc/reserved GiB | loss after N | optimizer / CE |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        torch_peak = f"{_fmt(r.get('torch_peak_allocated_gib'))} / {_fmt(r.get('torch_peak_reserved_gib'))}"
        status = r.get("status") or "-"
        if r.get("reason") and status != "finished":
            status += f" ({str(r['reason'])[:60]})"
        extra = " / ".join(str(v) for v in (r.get("optimizer"), r.get("fused_ce")) if v)
        lines.append(
            f"| {r['row']} | {r['engine']} | {r['method']} | {r['micro']}x{r['seq']} | {r['gpus']} | {status} | "
            f"{_fmt(r.get('tokens_per_s'))} | {_fmt(r.get('mfu'), 3)} | {_fmt(r.get('peak_gib'))} | {torch_peak} | "
            f"{_fmt(r.get('loss'), 3)} | {extra or '-'} |"
        )
    lines += ["", "## Analysis", ""] + (analysis(results) or ["- (no pair of rows to compare yet)"])
    return "\n".join(lines) + "\n"


# ---- main ------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results markdown path (X.json written next to it)")
    parser.add_argument("--rows", default="", help="comma list of rows (default: all this box can run)")
    parser.add_argument("--engines", default="plain,tunedeck,swift,swift-liger")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the steady rate")
    parser.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget of this call")
    parser.add_argument("--tiny", action="store_true", help="the bundled tiny model (pipeline test)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (with --tiny)")
    parser.add_argument("--profile", default="", metavar="START:COUNT",
                        help="torch-profile these steps of every 'tunedeck' row (its rate is taken before them)")
    parser.add_argument("--sync-trace", default="", metavar="START:COUNT",
                        help="record where these steps of every 'tunedeck' row synchronise with the GPU (GPU only)")
    parser.add_argument("--lora-dropout", type=float, default=0.05,
                        help="every engine's LoRA dropout (0: no random masks, so the losses can be compared exactly)")
    parser.add_argument("--drop-checkpoints", action="store_true",
                        help="delete each tunedeck run's checkpoints once measured (small disks)")
    parser.add_argument("--home", default=None, help="TUNEDECK_HOME for runs and caches (default: a temp dir)")
    args = parser.parse_args(argv)
    started = time.monotonic()

    import torch
    import transformers

    cuda = torch.cuda.is_available() and not args.cpu
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # every engine's process, tunedeck's included
    gpus = torch.cuda.device_count() if cuda else 0
    home = Path(args.home or tempfile.mkdtemp(prefix="tunedeck-engine-speed-"))
    home.mkdir(parents=True, exist_ok=True)
    specs = row_specs(args.tiny, gpus)
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()] or list(specs)
    unknown = [r for r in wanted if r not in specs]
    if unknown:
        parser.error(f"unknown rows {unknown}; this box can run: {', '.join(specs)}")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    out_md = Path(args.out)
    out_json = out_md.with_suffix(".json")
    out_md.parent.mkdir(parents=True, exist_ok=True)
    datasets: dict[int, Path] = {}

    def dataset(seq: int) -> Path:
        if seq not in datasets:
            records = 8 * 4 * args.steps if seq <= 4096 else 2 * args.steps + 4
            datasets[seq] = make_long_dataset(home, seq, records)
        return datasets[seq]

    ctx = {
        "home": home, "cpu": not cuda, "steps": args.steps, "warmup": args.warmup, "dataset": dataset,
        "model_dirs": {m: make_model_dir(home, m) for m in {specs[r]["model"] for r in wanted}},
        "peak_flops": gpu_peak_flops() if cuda else None, "profile": args.profile, "sync_trace": args.sync_trace,
        "drop_checkpoints": args.drop_checkpoints, "lora_dropout": args.lora_dropout,
    }
    meta = {"device": (f"{torch.cuda.get_device_name(0)} x {gpus}" if cuda else "CPU"), "torch": torch.__version__,
            "transformers": transformers.__version__, "steps": args.steps, "lora_dropout": args.lora_dropout, "warmup": args.warmup, "cpu": not cuda,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "home": str(home)}
    if cuda:
        from core.train.lora_dropout_kernel import TILES
        from core.train.lora_swiglu_kernel import TILES as SWIGLU_TILES

        meta["lora_dropout_tiles"] = TILES  # the kernels' tiles (a sweep's, where TUNEDECK_LORA_DROPOUT_TILES names one)
        meta["lora_swiglu_tiles"] = SWIGLU_TILES  # (the tile bench's, where TUNEDECK_LORA_SWIGLU_TILES names one)
    results: list[dict[str, Any]] = []
    min_needed = 20.0 if not cuda else 90.0

    def record(result: dict[str, Any]) -> None:
        results.append(result)
        write_results(out_md, {"meta": meta, "results": results}, render(results, meta))

    for name in wanted:
        spec = {**specs[name], "name": name}
        for engine in engines:
            try:
                known = parse_engine(engine)[0] in ENGINES
            except ValueError as exc:
                parser.error(str(exc))
            if not known:
                parser.error(f"unknown engine {engine}; use {', '.join(ENGINES)} (tunedeck+key=value for a switch)")
            if spec.get("scaling_of") and parse_engine(engine)[0] != "tunedeck":
                continue  # the scaling row measures tunedeck across GPU counts
            if spec.get("plan") and parse_engine(engine)[0] != "tunedeck":
                continue  # the plan row measures the wizard's plan as planned (and with a switch changed)
            lengths = MAXSEQ_LENGTHS if spec.get("maxseq") else (spec["seq"],)
            for seq in lengths:
                base = {"row": name, "engine": engine, "method": spec["method"], "micro": spec["micro"], "seq": seq,
                        "gpus": spec["gpus"], "maxseq": bool(spec.get("maxseq")), "scaling_of": spec.get("scaling_of"),
                        "plan": bool(spec.get("plan"))}
                left = args.budget_s - (time.monotonic() - started)
                if left < min_needed:
                    record({**base, "status": "skipped", "reason": f"budget: {left:.0f} s left"})
                    continue
                log(f"{name} {engine} seq {seq} ({left:.0f} s left)")
                # The length search needs only a few steps per length: that it runs, and its peak.
                row_ctx = {**ctx, "steps": 4, "warmup": 1} if spec.get("maxseq") else ctx
                result = {**base, **run_engine(row_ctx, engine, spec, seq, left - 10)}
                record(result)
                log(f"  -> {result.get('status')} {result.get('tokens_per_s')} tok/s peak {result.get('peak_gib')} GiB")
                over_80 = result.get("peak_gib") and max(result["peak_gib"]) > max(MAXSEQ_BUDGETS_GIB)
                if spec.get("maxseq") and (result.get("status") != "finished" or over_80):
                    break  # longer sequences will not fit either
    log(f"results: {out_md} and {out_json}")
    print(out_md.read_text())
    return 0 if results and all(r.get("status") in ("finished", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
