"""Measure real training-step memory and speed on a GPU and compare them with ``core.estimate``.

For each configuration (model config, method, precision, batch, sequence length, checkpointing, fused
cross-entropy) a worker process builds the model from its config with random weights on the GPU,
runs a few real training steps (transformers + peft forward/backward, AdamW step, bf16 autocast) on
random tokens (fused cross-entropy rows use Liger's kernels, as the engine does, or a chunked loss
when liger-kernel is missing: the engine's own, ``core.train.fused_loss``), and reports: NVML process memory (what decides an OOM), torch's max reserved and max
allocated, the CUDA context, and tokens/s from the median step after the first. OOM is recorded as such.
The rows of one model share a worker process (imports and CUDA start paid once per model; each row
frees everything and resets the peak counters before the next; plain-loss rows run before fused ones
since Liger patches transformers process-wide); a crash or timeout costs only the row it happened in.
The parent writes ``estimate_matrix.json`` and ``estimate_matrix.md`` (measured vs estimated, error %).

Needs only torch, transformers, peft and nvidia-ml-py; QLoRA and 8-bit-Adam rows need bitsandbytes and
are recorded as skipped without it. On one H200 the 44 rows take about three 600 s device calls:

    python bench/estimate_matrix.py --list --part 1/3       # which rows each part runs, expected seconds
    python bench/estimate_matrix.py --part 1/3 --out "$OUT" # then 2/3 and 3/3, one device call each
    python bench/estimate_matrix.py --report-only p1/estimate_matrix.json p2/... p3/...  # merge the parts
    python bench/estimate_matrix.py --only 0.5B --steps 3   # a subset (regex on the row name)
    python bench/estimate_matrix.py --estimate-only         # no GPU: the estimator's side of the table
    python bench/estimate_matrix.py --smoke                 # CPU self-test of the worker on a tiny model
    python bench/estimate_matrix.py --report-only bench/results/estimate_matrix/estimate_matrix.json
                                                            # no GPU: re-estimate a committed run

The estimator's constants live in core/estimate/calibration.py; this table is what they are fitted to.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

from results_files import write_results  # noqa: E402  (bench/ is not a package)

GIB = 1024**3
RESULT_PREFIX = "ESTIMATE_MATRIX_RESULT "
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class BenchConfig:
    """One row of the matrix; field names follow ``core.estimate.TrainingPlan``."""

    model: str  # a bundled config name (core/estimate/known_configs) or a config.json path
    method: str = "lora"
    precision: str = "bf16"
    micro_batch_size: int = 1
    seq_len: int = 2048
    gradient_checkpointing: bool = True
    fused_ce: bool = True
    lora_rank: int = 16
    lora_dropout: float = 0.05
    optimizer: str = "adamw"

    @property
    def name(self) -> str:
        parts = [self.model, self.method]
        if self.precision != "bf16":
            parts.append(self.precision)
        parts.append(f"b{self.micro_batch_size}xs{self.seq_len}")
        parts.append("ckpt" if self.gradient_checkpointing else "nockpt")
        parts.append("fusedCE" if self.fused_ce else "plainCE")
        if self.optimizer != "adamw":
            parts.append(self.optimizer)
        if self.method != "full" and self.lora_dropout != 0.05:
            parts.append(f"dropout{self.lora_dropout:g}")
        return " ".join(parts)

    @property
    def needs_bitsandbytes(self) -> bool:
        return self.method == "qlora" or "8bit" in self.optimizer


def _rows() -> list[BenchConfig]:
    """The matrix, smallest models first so a time budget cuts the largest rows."""
    q05, q15, q3, q7 = "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-3B", "Qwen2.5-7B"
    c = BenchConfig
    return [
        c(q05, "lora", micro_batch_size=4, seq_len=1024),
        c(q05, "lora", micro_batch_size=4, seq_len=1024, fused_ce=False),
        c(q05, "lora", micro_batch_size=4, seq_len=1024, gradient_checkpointing=False, fused_ce=False),
        c(q05, "lora", micro_batch_size=4, seq_len=1024, gradient_checkpointing=False),
        c(q05, "lora", micro_batch_size=4, seq_len=1024, gradient_checkpointing=False, lora_dropout=0.0),
        c(q05, "full", micro_batch_size=4, seq_len=1024),
        c(q05, "full", micro_batch_size=4, seq_len=1024, gradient_checkpointing=False, fused_ce=False),
        c(q05, "full", "pure-bf16", micro_batch_size=4, seq_len=1024, gradient_checkpointing=False, fused_ce=False),
        c(q05, "qlora", micro_batch_size=4, seq_len=1024),
        c(q05, "qlora", micro_batch_size=4, seq_len=1024, gradient_checkpointing=False, fused_ce=False),
        c(q05, "dora", micro_batch_size=4, seq_len=1024),
        c(q05, "lora", micro_batch_size=8, seq_len=2048, gradient_checkpointing=False, fused_ce=False),
        c(q05, "full", micro_batch_size=8, seq_len=2048, fused_ce=False),
        c(q15, "lora", micro_batch_size=4, seq_len=2048),
        c(q15, "lora", micro_batch_size=4, seq_len=2048, gradient_checkpointing=False, fused_ce=False),
        c(q15, "full", micro_batch_size=2, seq_len=2048),
        c(q15, "full", micro_batch_size=2, seq_len=2048, gradient_checkpointing=False, fused_ce=False),
        c(q15, "qlora", micro_batch_size=4, seq_len=2048),
        c(q15, "full", micro_batch_size=2, seq_len=2048, optimizer="adamw_8bit"),
        c(q15, "full", micro_batch_size=2, seq_len=2048, optimizer="adamw_fused"),
        c(q3, "lora", micro_batch_size=4, seq_len=2048),
        c(q3, "lora", micro_batch_size=4, seq_len=2048, gradient_checkpointing=False, fused_ce=False),
        c(q3, "full", micro_batch_size=2, seq_len=2048),
        c(q3, "qlora", micro_batch_size=4, seq_len=2048, fused_ce=False),
        c(q3, "dora", micro_batch_size=2, seq_len=2048),
        c(q7, "lora", micro_batch_size=1, seq_len=2048),
        c(q7, "lora", micro_batch_size=4, seq_len=2048),
        c(q7, "lora", micro_batch_size=4, seq_len=2048, fused_ce=False),
        c(q7, "lora", micro_batch_size=2, seq_len=4096, gradient_checkpointing=False, fused_ce=False),
        c(q7, "lora", micro_batch_size=8, seq_len=4096),
        c(q7, "qlora", micro_batch_size=4, seq_len=2048),
        c(q7, "qlora", micro_batch_size=1, seq_len=2048, fused_ce=False),
        c(q7, "full", "pure-bf16", micro_batch_size=2, seq_len=2048),
        c(q7, "full", micro_batch_size=1, seq_len=2048),
        c(q7, "full", micro_batch_size=1, seq_len=2048, optimizer="adamw_fused"),
        c(q7, "full", micro_batch_size=1, seq_len=1024, gradient_checkpointing=False, fused_ce=False),
        c(q7, "dora", micro_batch_size=2, seq_len=2048),
        c("Meta-Llama-3-8B", "lora", micro_batch_size=4, seq_len=2048),
        c("Meta-Llama-3-8B", "lora", micro_batch_size=4, seq_len=2048, gradient_checkpointing=False, fused_ce=False),
        c("Meta-Llama-3-8B", "qlora", micro_batch_size=4, seq_len=4096),
        c("Qwen3-8B", "lora", micro_batch_size=2, seq_len=4096),
        c("Qwen3-8B", "full", "pure-bf16", micro_batch_size=1, seq_len=4096),
        c("Qwen2.5-14B", "lora", micro_batch_size=2, seq_len=2048),
        c("Qwen2.5-14B", "qlora", micro_batch_size=2, seq_len=2048),
    ]


SMOKE_CONFIG = {
    "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "tie_word_embeddings": True,
    "max_position_embeddings": 512,
}


# ----------------------------------------------------------------------------------------------------
# Worker: runs in its own process, one configuration, prints one result line.
# ----------------------------------------------------------------------------------------------------

def _model_config_dict(model: str) -> dict[str, Any]:
    from core.estimate.model_source import load_model_config

    return dict(load_model_config(model).config)


def _nvml_handle():
    try:
        import pynvml

        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        index = int(visible) if visible.isdigit() else 0
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # no NVML: the torch numbers still come back
        return None, None


def _nvml_process_bytes(pynvml, handle, baseline_used: int | None) -> tuple[int | None, str]:
    """This process's GPU memory as NVML sees it; device-used delta when PIDs are not ours (containers)."""
    if pynvml is None:
        return None, "none"
    try:
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory:
                return int(proc.usedGpuMemory), "process"
    except pynvml.NVMLError:
        pass
    if baseline_used is None:
        return None, "none"
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) - baseline_used, "device_delta"


def _build_model(config: dict[str, Any], dtype, device: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(config)
    hf_config = AutoConfig.for_model(values.pop("model_type"), **values)
    hf_config.use_cache = False
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            try:
                model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa", dtype=dtype)
            except TypeError:
                model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa", torch_dtype=dtype)
    finally:
        torch.set_default_dtype(previous)
    if next(model.parameters()).dtype != dtype:
        model.to(dtype)
    return model


def _quantise_decoder_linears(model, compute_dtype) -> None:
    """Replace the decoder blocks' linears by NF4 bitsandbytes layers (double quantisation), as QLoRA loads."""
    import bitsandbytes as bnb
    import torch

    layers = model.model.layers
    for layer in layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if not isinstance(child, torch.nn.Linear):
                    continue
                quantised = bnb.nn.Linear4bit(
                    child.in_features, child.out_features, bias=child.bias is not None,
                    compute_dtype=compute_dtype, compress_statistics=True, quant_type="nf4", device="meta",
                )
                quantised.weight = bnb.nn.Params4bit(
                    child.weight.data, requires_grad=False, compress_statistics=True, quant_type="nf4",
                ).to(child.weight.device)
                if child.bias is not None:
                    quantised.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(parent, name, quantised)
                del child


def _enable_checkpointing(model) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        try:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            return
        except TypeError:
            pass
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _apply_liger(model) -> bool:
    """Liger's kernels on the (base) model, as the Trainer's ``use_liger_kernel`` does; False without Liger."""
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
    except ImportError:
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        _apply_liger_kernel_to_instance(model=base)
    except Exception as exc:  # a Liger/transformers mismatch: measure with the chunked loss instead
        print(f"liger-kernel could not patch the model ({exc}); using the chunked loss", file=sys.stderr)
        return False
    return True


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Build, train ``steps`` steps, measure. Returns the result record (never raises for OOM)."""
    config = BenchConfig(**spec["config"])
    steps = int(spec.get("steps", 3))
    device = spec.get("device", "cuda")
    model_config = spec.get("model_config") or _model_config_dict(config.model)

    pynvml, handle = _nvml_handle() if device == "cuda" else (None, None)
    baseline_used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) if pynvml is not None else None

    import torch

    result: dict[str, Any] = {"status": "ok", "torch": torch.__version__}
    try:
        import peft
        import transformers

        result["transformers"] = transformers.__version__
        result["peft"] = peft.__version__
    except ImportError as exc:
        return {"status": "error", "error": f"missing library: {exc}"}
    cuda = device == "cuda"
    compute_dtype = torch.bfloat16 if config.precision != "fp16" else torch.float16
    if cuda:
        torch.cuda.init()
        warm = torch.ones(256, 256, device="cuda", dtype=compute_dtype)
        (warm @ warm).sum().item()  # loads cuBLAS: part of the context every training process pays
        del warm
        nvml_now, _ = _nvml_process_bytes(pynvml, handle, baseline_used)
        if nvml_now is not None:
            result["context_gib"] = (nvml_now - torch.cuda.memory_reserved()) / GIB

    started = time.perf_counter()
    try:
        model = _train_setup(config, model_config, compute_dtype, device)
        liger = config.fused_ce and cuda and _apply_liger(model)
        chunked = config.fused_ce and not liger
        result["fused_ce_impl"] = "liger" if liger else ("chunked" if chunked else "none")
        if chunked:
            from core.estimate.architecture import architecture_from_config
            from core.estimate.memory import fused_ce_chunk_tokens
            from core.train.fused_loss import forward_chunked_loss

            chunk_tokens = fused_ce_chunk_tokens(architecture_from_config(model_config),
                                                 config.micro_batch_size * config.seq_len)
        result["load_s"] = time.perf_counter() - started
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        trainable = [p for p in model.parameters() if p.requires_grad]
        result["trainable_params"] = sum(p.numel() for p in trainable)
        if config.optimizer == "adamw":  # transformers' "adamw_torch": the foreach implementation on CUDA
            optimizer = torch.optim.AdamW(trainable, lr=1e-5, foreach=cuda)
        elif config.optimizer == "adamw_fused":
            optimizer = torch.optim.AdamW(trainable, lr=1e-5, fused=cuda)
        else:
            import bitsandbytes as bnb

            cls = bnb.optim.PagedAdamW8bit if config.optimizer == "paged_adamw_8bit" else bnb.optim.AdamW8bit
            optimizer = cls(trainable, lr=1e-5)
        vocab = model_config["vocab_size"]
        generator = torch.Generator(device=device).manual_seed(0)
        input_ids = torch.randint(0, vocab, (config.micro_batch_size, config.seq_len), device=device, generator=generator)
        autocast = config.precision != "fp32"
        step_times = []
        nvml_peak = 0
        nvml_source = "none"
        for _ in range(steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=compute_dtype, enabled=autocast):
                if chunked:  # the engine's own chunked loss, through the model's forward as the trainer calls it
                    loss = forward_chunked_loss(model, model, {"input_ids": input_ids, "labels": input_ids},
                                                chunk_tokens=chunk_tokens)
                else:
                    loss = model(input_ids=input_ids, labels=input_ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss
            if cuda:
                torch.cuda.synchronize()
            step_times.append(time.perf_counter() - t0)
            used, source = _nvml_process_bytes(pynvml, handle, baseline_used)
            if used is not None and used > nvml_peak:
                nvml_peak, nvml_source = used, source
        timed = step_times[1:] or step_times
        result["step_s"] = statistics.median(timed)  # robust to one slow step (allocator growth, autotuning)
        result["tokens_per_s"] = config.micro_batch_size * config.seq_len / result["step_s"]
        result["step_times_s"] = step_times
    except torch.cuda.OutOfMemoryError as exc:
        result["status"] = "oom"
        result["error"] = str(exc).splitlines()[0][:300]
    except ImportError as exc:
        result["status"] = "skipped"
        result["error"] = f"missing library: {exc}"
    if cuda:
        result["torch_max_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
        result["torch_max_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
        if result["status"] == "ok":
            result["nvml_peak_gib"] = nvml_peak / GIB if nvml_peak else None
            result["nvml_source"] = nvml_source
    return result


def run_worker_batch(specs: list[dict[str, Any]]) -> None:
    """Run several rows of one model in this process (imports and CUDA start paid once); one line per row.

    Rows are independent: everything a row allocated is released (and the peak counters reset) before the
    next one, and the parent orders plain-loss rows before fused ones because Liger patches transformers'
    modules for the whole process.
    """
    import gc

    for index, spec in enumerate(specs):
        try:
            result = run_worker(spec)
        except Exception as exc:  # report, keep going with the next row
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:500]}
        result["batch_index"] = index
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        gc.collect()
        if spec.get("device", "cuda") == "cuda":
            import torch

            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def _train_setup(config: BenchConfig, model_config: dict[str, Any], compute_dtype, device: str):
    """The model as the engine's recipes train it (see core/estimate/precision.py for the dtypes)."""
    import torch

    fp32 = config.precision == "fp32"
    if config.method == "full":
        mixed = config.precision in ("bf16", "fp16")
        dtype = torch.float32 if (mixed or fp32) else torch.bfloat16
        model = _build_model(model_config, dtype, device)
        if config.gradient_checkpointing:
            _enable_checkpointing(model)
        model.train()
        return model

    from peft import LoraConfig, get_peft_model

    model = _build_model(model_config, torch.float32 if fp32 else compute_dtype, device)
    if config.method == "qlora":
        _quantise_decoder_linears(model, compute_dtype)
        # peft.prepare_model_for_kbit_training's plain recipe: freeze, upcast the rest to fp32.
        for param in model.parameters():
            param.requires_grad = False
            if param.dtype in (torch.float16, torch.bfloat16) and param.__class__.__name__ != "Params4bit":
                param.data = param.data.to(torch.float32)
    if config.gradient_checkpointing:
        model.enable_input_require_grads()
        _enable_checkpointing(model)
    lora = LoraConfig(r=config.lora_rank, lora_alpha=2 * config.lora_rank, lora_dropout=config.lora_dropout,
                      target_modules=ALL_LINEAR, use_dora=config.method == "dora", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    return model


# ----------------------------------------------------------------------------------------------------
# Parent: estimator side, subprocess per row, report.
# ----------------------------------------------------------------------------------------------------

def _detect_gpu_name() -> str | None:
    pynvml, handle = _nvml_handle()
    if pynvml is None:
        return None
    name = pynvml.nvmlDeviceGetName(handle)
    return name.decode() if isinstance(name, bytes) else str(name)


def estimate_row(config: BenchConfig, gpu_name: str, model_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The estimator's prediction for one row (lora targets all-linear, like the worker)."""
    from core.estimate import TrainingPlan, architecture_from_config, estimate, find_gpu, plan_for_model
    from core.estimate.calibration import DEFAULT_CALIBRATION

    options = {key: value for key, value in asdict(config).items() if key != "model"}
    # The worker prepares QLoRA the plain way (prepare_model_for_kbit_training's fp32 upcast).
    options["kbit_upcast"] = True
    if model_config is not None:
        plan = TrainingPlan(architecture=architecture_from_config(model_config, name="smoke"), **options)
    else:
        plan = plan_for_model(config.model, **options)
    plan = replace(plan, num_gpus=1, zero_stage=0)
    gpu = find_gpu(gpu_name)
    result = estimate(plan, gpu, DEFAULT_CALIBRATION)
    data = result.to_json()
    data["tensor_gib"] = result.peak_gib - result.breakdown["cuda_context"] - result.breakdown["allocator_slack"]
    return data


def _run_batch(configs: list[BenchConfig], steps: int, timeout_s: float, device: str,
               model_config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Measure ``configs`` in one worker process; a crash or timeout costs the row it happened in only.

    Rows after a failed one are re-run in a fresh process (as long as time is left).
    """
    results: list[dict[str, Any]] = []
    pending = list(configs)
    deadline = time.perf_counter() + timeout_s
    while pending:
        remaining = deadline - time.perf_counter()
        if remaining < 10:
            results += [{"status": "skipped", "error": "time budget spent"} for _ in pending]
            break
        specs = [{"config": asdict(c), "steps": steps, "device": device, "model_config": model_config} for c in pending]
        command = [sys.executable, str(Path(__file__).resolve()), "--worker-batch", json.dumps(specs)]
        failure = None
        try:
            proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=remaining)
            stdout, stderr = proc.stdout, proc.stderr
            if proc.returncode != 0:
                failure = {"status": "error", "error": f"worker exit {proc.returncode}: "
                           + " | ".join((stderr or "").strip().splitlines()[-3:])[:500]}
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            failure = {"status": "timeout", "error": f"no result within the {timeout_s:.0f} s of its batch"}
        done = [json.loads(line[len(RESULT_PREFIX):]) for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        results += done
        pending = pending[len(done):]
        if pending:
            # The row that was running when the worker died or ran out of time; the rest get a new worker.
            results.append(failure or {"status": "error", "error": "worker ended without a result"})
            pending = pending[1:]
    return results


def row_cost_s(config: BenchConfig, steps: int, gpu_name: str = "H200") -> float:
    """Expected wall seconds of one row: model build (grows with size) + steps at the estimated speed."""
    try:
        estimate = estimate_row(config, gpu_name)
        step_s = estimate["seconds_per_step"]
        params_b = estimate["total_params"] / 1e9
    except (ValueError, KeyError):
        return 30.0
    return 4.0 + 0.8 * params_b + steps * step_s * 1.5


def plan_batches(configs: list[BenchConfig], steps: int, max_batch_s: float = 150.0) -> list[list[BenchConfig]]:
    """Rows grouped by model (one process each), plain-loss rows first; big groups split near ``max_batch_s``."""
    by_model: dict[str, list[BenchConfig]] = {}
    for config in configs:
        by_model.setdefault(config.model, []).append(config)
    batches = []
    for group in by_model.values():
        group = sorted(group, key=lambda c: c.fused_ce)  # Liger patches modules process-wide: fused rows last
        current: list[BenchConfig] = []
        cost = 8.0  # imports + CUDA start
        for config in group:
            row = row_cost_s(config, steps)
            if current and cost + row > max_batch_s:
                batches.append(current)
                current, cost = [], 8.0
            current.append(config)
            cost += row
        if current:
            batches.append(current)
    return batches


def split_parts(batches: list[list[BenchConfig]], parts: int, steps: int) -> list[list[list[BenchConfig]]]:
    """Deal the batches to ``parts`` GPU calls of similar expected time (largest first, into the lightest)."""
    loads = [0.0] * parts
    out: list[list[list[BenchConfig]]] = [[] for _ in range(parts)]
    costs = [(8.0 + sum(row_cost_s(c, steps) for c in batch), index) for index, batch in enumerate(batches)]
    for cost, index in sorted(costs, reverse=True):
        lightest = loads.index(min(loads))
        out[lightest].append(batches[index])
        loads[lightest] += cost
    order = {id(batch): index for index, batch in enumerate(batches)}
    return [sorted(part, key=lambda b: order[id(b)]) for part in out]


def _pct(estimated: float | None, measured: float | None) -> float | None:
    if estimated is None or not measured:
        return None
    return 100.0 * (estimated - measured) / measured


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def write_report(rows: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> None:
    """estimate_matrix.json (everything) and estimate_matrix.md (the comparison table + summary)."""
    lines = [
        "# Estimator vs measurement",
        "",
        f"GPU: {meta.get('gpu')} · steps per row: {meta.get('steps')} · torch {meta.get('torch', '?')} · "
        f"rows: {len(rows)} · wall: {meta.get('wall_s', 0):.0f} s"
        + (f" · estimates recomputed {meta['re_estimated']}" if meta.get("re_estimated") else ""),
        "",
        "Memory: NVML process memory (context + torch reserved) vs the estimated peak; `alloc` compares torch's "
        "max allocated with the estimate minus context and allocator slack. Error = (estimate − measured) / measured.",
        "",
        "| # | configuration | status | NVML GiB | est GiB | err % | alloc GiB | est alloc GiB | err % | "
        "reserved GiB | ctx GiB | tok/s | est tok/s | err % | est fits |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mem_errors: dict[str, list[float]] = {}
    speed_errors: dict[str, list[float]] = {}
    for index, row in enumerate(rows, 1):
        measured, est = row.get("measured", {}), row.get("estimate", {})
        mem_err = _pct(est.get("peak_gib"), measured.get("nvml_peak_gib"))
        alloc_err = _pct(est.get("tensor_gib"), measured.get("torch_max_allocated_gib") if measured.get("status") == "ok" else None)
        speed_err = _pct(est.get("tokens_per_s"), measured.get("tokens_per_s"))
        method = row["config"]["method"]
        if mem_err is not None:
            mem_errors.setdefault(method, []).append(mem_err)
        if speed_err is not None:
            speed_errors.setdefault(method, []).append(speed_err)
        status = measured.get("status", "?")
        if status == "oom" and est.get("fits") is False:
            status = "oom (predicted)"
        elif status == "oom":
            status = "**oom, estimate said fits**"
        elif status == "ok" and est.get("fits") is False:
            status = "ok (estimate said no fit)"
        impl = measured.get("fused_ce_impl")
        label = row["name"] + (f" [{impl}]" if impl == "chunked" else "")
        lines.append(
            f"| {index} | {label} | {status} | {_fmt(measured.get('nvml_peak_gib'), 2)} | "
            f"{_fmt(est.get('peak_gib'), 2)} | {_fmt(mem_err)} | {_fmt(measured.get('torch_max_allocated_gib'), 2)} | "
            f"{_fmt(est.get('tensor_gib'), 2)} | {_fmt(alloc_err)} | {_fmt(measured.get('torch_max_reserved_gib'), 2)} | "
            f"{_fmt(measured.get('context_gib'), 2)} | {_fmt(measured.get('tokens_per_s'), 0)} | "
            f"{_fmt(est.get('tokens_per_s'), 0)} | {_fmt(speed_err)} | {est.get('fits', '–')} |"
        )
    lines += ["", "## Summary (median error % by method; mean absolute error %)", "",
              "| method | memory median | memory MAE | speed median | speed MAE | rows |", "|---|---|---|---|---|---|"]
    for method in sorted(set(mem_errors) | set(speed_errors)):
        mem, spd = mem_errors.get(method, []), speed_errors.get(method, [])
        lines.append(
            f"| {method} | {_fmt(statistics.median(mem) if mem else None)} | "
            f"{_fmt(statistics.mean(abs(x) for x in mem) if mem else None)} | "
            f"{_fmt(statistics.median(spd) if spd else None)} | "
            f"{_fmt(statistics.mean(abs(x) for x in spd) if spd else None)} | {max(len(mem), len(spd))} |"
        )
    errors = [row for row in rows if row.get("measured", {}).get("status") in ("error", "timeout")]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {row['name']}: {row['measured'].get('error')}" for row in errors]
    write_results(out_dir / "estimate_matrix.md", {"meta": meta, "rows": rows}, "\n".join(lines))


def report_only(results_json: list[Path], out_dir: Path | None = None) -> int:
    """Recompute the estimator's columns of earlier runs with today's constants; keep the measurements.

    Several files (the ``--part`` runs of one matrix) are merged: rows in the matrix's order, a row measured
    in one part wins over its unmeasured copy in another.
    """
    order = {config.name: index for index, config in enumerate(_rows())}
    rows: dict[str, dict[str, Any]] = {}
    meta: dict[str, Any] = {}
    wall = 0.0
    for path in results_json:
        data = json.loads(path.read_text())
        meta = {**data.get("meta", {}), **meta}
        wall += float(data.get("meta", {}).get("wall_s") or 0.0)
        for row in data["rows"]:
            known = rows.get(row["name"])
            if known is None or known.get("measured", {}).get("status") in (None, "not run", "skipped"):
                rows[row["name"]] = row
    meta["wall_s"] = wall
    meta.pop("part", None)
    gpu_label = meta.get("gpu") or "H200"
    merged = sorted(rows.values(), key=lambda row: order.get(row["name"], len(order)))
    for row in merged:
        config = BenchConfig(**row["config"])
        try:
            row["estimate"] = estimate_row(config, gpu_label)
        except ValueError as exc:
            row["estimate"] = {"error": str(exc)}
    meta["re_estimated"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    target = out_dir or results_json[0].parent
    write_report(merged, target, meta)
    print(f"re-estimated {len(merged)} rows from {len(results_json)} file(s): {target / 'estimate_matrix.md'}",
          file=sys.stderr)
    return 0


def run_matrix(args: argparse.Namespace) -> int:
    rows_wanted = _rows()
    if args.only:
        pattern = re.compile(args.only)
        rows_wanted = [row for row in rows_wanted if pattern.search(row.name)]
    if args.list:
        if not args.part:
            for row in rows_wanted:
                print(row.name)
            return 0
        count = args.part[1]
        parts = split_parts(plan_batches(rows_wanted, args.steps, args.batch_s), count, args.steps)
        for number, part in enumerate(parts, 1):
            expected = sum(8.0 + sum(row_cost_s(c, args.steps) for c in batch) for batch in part)
            print(f"part {number}/{count}: {len(part)} worker processes, ~{expected:.0f} s expected")
            for batch in part:
                for config in batch:
                    print(f"  {config.name}  (~{row_cost_s(config, args.steps):.0f} s)")
        return 0
    smoke_config = SMOKE_CONFIG if args.smoke else None
    if args.smoke:
        rows_wanted = [
            BenchConfig("smoke", "lora", micro_batch_size=2, seq_len=64),
            BenchConfig("smoke", "full", micro_batch_size=2, seq_len=64, gradient_checkpointing=False, fused_ce=False),
            BenchConfig("smoke", "dora", micro_batch_size=2, seq_len=64, fused_ce=True),
        ]
    device = "cpu" if args.smoke else "cuda"
    gpu_name = args.gpu or _detect_gpu_name() or "H200"
    from core.estimate import UnknownGpuError, find_gpu

    try:
        gpu_label = find_gpu(gpu_name).name
    except UnknownGpuError:
        print(f"GPU '{gpu_name}' is not in core.estimate's table; comparing against H200", file=sys.stderr)
        gpu_label = "H200"
    have_bnb = importlib.util.find_spec("bitsandbytes") is not None
    out_dir = Path(args.out or os.environ.get("OUT") or ROOT / "bench" / "results")
    started = time.perf_counter()
    meta: dict[str, Any] = {"gpu": gpu_label, "gpu_reported": gpu_name, "steps": args.steps,
                            "budget_s": args.budget_s, "liger": importlib.util.find_spec("liger_kernel") is not None}
    try:
        import torch

        meta["torch"] = torch.__version__
    except ImportError:
        pass
    by_name: dict[str, dict[str, Any]] = {}
    runnable: list[BenchConfig] = []
    for config in rows_wanted:
        row: dict[str, Any] = {"name": config.name, "config": asdict(config)}
        try:
            row["estimate"] = estimate_row(config, gpu_label, smoke_config)
        except ValueError as exc:
            row["estimate"] = {"error": str(exc)}
        if args.estimate_only:
            row["measured"] = {"status": "not run"}
        elif config.needs_bitsandbytes and not have_bnb:
            row["measured"] = {"status": "skipped", "error": "bitsandbytes missing"}
        else:
            runnable.append(config)
        by_name[config.name] = row
    batches = plan_batches(runnable, args.steps, args.batch_s)
    if args.part:
        index, count = args.part
        batches = split_parts(batches, count, args.steps)[index - 1]
        meta["part"] = f"{index}/{count}"
        mine = {config.name for batch in batches for config in batch}
        by_name = {name: row for name, row in by_name.items()
                   if name in mine or (index == 1 and "measured" in row)}  # unrunnable rows: part 1 reports them
    results = list(by_name.values())  # canonical order (the row list's)

    def report() -> None:
        meta["wall_s"] = time.perf_counter() - started
        write_report(results, out_dir, meta)  # after every batch: a killed run still leaves its table

    for batch in batches:
        remaining = args.budget_s - (time.perf_counter() - started)
        if remaining < 30:
            measured_rows = [{"status": "skipped", "error": "time budget spent"} for _ in batch]
        else:
            limit = min(remaining, args.row_timeout_s * len(batch))
            measured_rows = _run_batch(batch, args.steps, limit, device, smoke_config)
        for config, measured in zip(batch, measured_rows, strict=True):
            row = by_name[config.name]
            row["measured"] = measured
            print(f"[{time.perf_counter() - started:6.0f}s] {config.name}: {measured.get('status')} "
                  f"nvml={_fmt(measured.get('nvml_peak_gib'), 2)} est={_fmt(row['estimate'].get('peak_gib'), 2)} GiB "
                  f"tok/s={_fmt(measured.get('tokens_per_s'), 0)} est={_fmt(row['estimate'].get('tokens_per_s'), 0)}",
                  file=sys.stderr, flush=True)
        report()
    report()
    print(f"wrote {out_dir / 'estimate_matrix.md'} and {out_dir / 'estimate_matrix.json'}", file=sys.stderr)
    return 0


def _part(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise argparse.ArgumentTypeError(f"--part wants K/N with 1 <= K <= N, not {text!r}")
    return int(match.group(1)), int(match.group(2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None,
                        help="folder for estimate_matrix.json/.md (default: $OUT, else bench/results)")
    parser.add_argument("--only", help="regex on row names, e.g. '0.5B|1.5B' or 'qlora'")
    parser.add_argument("--steps", type=int, default=4,
                        help="training steps per row (the first is not timed; tokens/s from the median of the rest)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting batches after this many seconds")
    parser.add_argument("--row-timeout-s", type=float, default=120.0, help="per row, summed over a batch")
    parser.add_argument("--batch-s", type=float, default=150.0,
                        help="split a model's rows into worker processes of about this many expected seconds")
    parser.add_argument("--part", type=_part, default=None, metavar="K/N",
                        help="run only the K-th of N parts of similar expected time (one GPU call each); "
                             "merge the parts' JSON files with --report-only")
    parser.add_argument("--gpu", help="GPU name for the estimator (default: NVML's name)")
    parser.add_argument("--estimate-only", action="store_true", help="no GPU: only the estimator's columns")
    parser.add_argument("--smoke", action="store_true", help="CPU self-test on a tiny model")
    parser.add_argument("--list", action="store_true", help="print the row names and exit")
    parser.add_argument("--report-only", metavar="JSON", nargs="+",
                        help="no GPU: re-estimate earlier estimate_matrix.json file(s) with today's constants and "
                             "write one table (several files, e.g. the parts of a run, are merged); written "
                             "next to the first file, or in --out when given")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-batch", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        try:
            result = run_worker(json.loads(args.worker))
        except Exception as exc:  # report, do not lose the row
            result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:500]}
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0
    if args.worker_batch:
        run_worker_batch(json.loads(args.worker_batch))
        return 0
    if args.report_only:
        return report_only([Path(p) for p in args.report_only], Path(args.out) if args.out else None)
    return run_matrix(args)


if __name__ == "__main__":
    sys.exit(main())
