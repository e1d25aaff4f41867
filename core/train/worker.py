"""The trainer process: ``python -m core.train.worker RUN_DIR [--resume CHECKPOINT]``.

Started by the run's supervisor, once (CPU / one GPU) or once per rank under ``torchrun``. It reads the
resolved ``config.yaml`` of the run directory, builds tokenizer, data and model, trains with
``transformers.Trainer`` and leaves its verdict in ``outcome.json`` (finished / stopped / failed with a
reason) for the supervisor, which owns the final status.

Several GPUs on one node: the supervisor runs ``torchrun --nproc_per_node=N`` (DDP, or DeepSpeed ZeRO
1/2/3 when ``zero_stage`` > 0, with the generated ``deepspeed.json`` in the run dir). Several nodes: run
``tunedeck train RUN.yaml --nnodes N --node-rank I --master-addr HOST0 --master-port PORT`` on every node,
or ``tunedeck train RUN.yaml --hostfile HOSTS`` (one ``host [slots=N]`` per line, node 0 first; each node
finds its rank by its name or address) — same config and data paths on each; node 0's address reachable
from all; set NCCL_SOCKET_IFNAME if the default interface is wrong. Each node has its own run directory; node 0's holds the checkpoints unless
the runs root is on a shared filesystem.

Signals: SIGTERM/SIGINT ask for a checkpoint at the end of the current step and a clean exit (status
``stopped``); the process dies with its parent (PR_SET_PDEATHSIG), so it never outlives its supervisor.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

# Before torch allocates: growable segments instead of fixed blocks, so that memory freed by one size of
# tensor serves the next (long sequences allocate many sizes; without it the reserved pool ran 4 GiB over
# what was allocated on an 8B at 96k tokens). A user's own setting wins.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from core.atomic_file import write_json_atomic  # noqa: E402
from core.config.schema import LORA_METHODS  # noqa: E402
from core.errors import EXIT_USAGE, TunedeckError
from core.runs.checkpoints import COMPLETE_MARKER, verify_checkpoint  # noqa: E402
from core.runs.run_dir import FAILED, FINISHED, STOPPED, RunDirectory  # noqa: E402
from core.runs.supervisor import set_parent_death_signal  # noqa: E402

log = logging.getLogger("tunedeck.train")

OPTIMIZER_NAMES = {
    "adamw_torch": "adamw_torch",
    "adamw_torch_fused": "adamw_torch_fused",
    "adamw_fused": "adamw_torch_fused",
    "adamw_8bit": "adamw_bnb_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit",
    "paged_adamw_32bit": "paged_adamw_32bit",
    "adafactor": "adafactor",
    "sgd": "sgd",
}


class TrainingSetupError(TunedeckError):
    """Something in the configuration cannot run on this machine; the message says what to change."""

    exit_code = EXIT_USAGE


class _ListDataset:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]


def _configure_logging(rank: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger("tunedeck")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    root.propagate = False
    # Liger tries its optional backends for an op (the CuTe DSL's, Ascend's) and warns of each one missing, in
    # every run, before it takes its Triton kernel: two lines in every GPU train.log that read like a failure.
    logging.getLogger("liger_kernel.backends.registry").setLevel(logging.ERROR)
    # bitsandbytes, imported with peft, tells on every CPU with AVX512-BF16 (the Xeons of GPU boxes too) that its
    # optional hub kernel is missing ("pip install kernels"), and falls back to its own: a line in every train.log,
    # the demo's first, that reads like a broken install (`tunedeck merge` and `chat` silence it alike).
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _dtype_choices(cfg: dict[str, Any], cuda: bool, bf16_supported: bool) -> tuple[Any, Any, bool, bool]:
    """(compute dtype, weights dtype, Trainer bf16 flag, Trainer fp16 flag) for this machine."""
    import torch

    precision = str(cfg.get("precision", "bf16"))
    if not cuda:
        if precision != "fp32":  # recorded as an event by train(); the metrics header says fp32
            log.warning("precision %s needs a GPU; this run trains in fp32", precision)
        return torch.float32, torch.float32, False, False
    if precision == "bf16" and not bf16_supported:
        from core.i18n import Message

        raise TrainingSetupError(Message("train.bf16_unsupported"))
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    method = str(cfg.get("method", "lora"))
    if method == "full":
        # Mixed precision keeps fp32 master weights; pure_bf16 keeps everything in bf16 (half the memory).
        weights = torch.bfloat16 if (precision == "bf16" and cfg.get("pure_bf16")) else torch.float32
    else:
        weights = compute  # the frozen base in low precision; LoRA weights stay fp32 (peft)
    return compute, weights, precision == "bf16", precision == "fp16"


def _fused_ce(cfg: dict[str, Any], cuda: bool) -> str:
    """The loss implementation: ``liger``, ``triton``, ``chunked`` or ``none`` (see ``core.train.fused_loss``)."""
    from core.train.fused_loss import resolve_fused_ce

    return resolve_fused_ce(cfg.get("fused_ce", "auto"), cuda)


def oom_tips(cfg: dict[str, Any], world_size: int) -> list[Any]:
    """What to change after an out-of-memory error, as messages (rendered in the reader's language)."""
    from core.i18n import Message

    tips = []
    micro = int(cfg.get("micro_batch_size", 1))
    if micro > 1:
        tips.append(Message("train.oom_tip_micro_batch", now=micro, new=max(1, micro // 2),
                            accum=int(cfg.get("gradient_accumulation", 1)) * 2))
    if not cfg.get("gradient_checkpointing"):
        tips.append(Message("train.oom_tip_checkpointing"))
    if cfg.get("method") in ("lora", "dora", "full"):
        tips.append(Message("train.oom_tip_qlora"))
    tips.append(Message("train.oom_tip_seq_len", now=int(cfg.get("max_seq_len", 0))))
    if int(cfg.get("zero_stage", 0) or 0) < 3:
        tips.append(Message("train.oom_tip_zero", gpus=max(2, world_size)))
    return tips


def optimizer_name(cfg: dict[str, Any], cuda: bool) -> str:
    """The transformers ``optim`` for the run. ``auto`` (the default): fused AdamW on CUDA (the same
    update as ``adamw_torch`` in one kernel per step instead of a launch per tensor group), ``adamw_torch``
    on a CPU. With ZeRO optimizer offload DeepSpeed builds its own CPU Adam whatever this says."""
    wanted = str(cfg.get("optimizer", "auto") or "auto")
    if wanted == "auto":
        return "adamw_torch_fused" if cuda else "adamw_torch"
    return OPTIMIZER_NAMES.get(wanted, wanted)


def oom_advice(cfg: dict[str, Any], world_size: int) -> str:
    """The tips as one English line, for events.jsonl and train.log (data and logs, not shown text)."""
    return "; ".join(tip.english() for tip in oom_tips(cfg, world_size))


def _checkpointing_args(enabled: bool) -> dict[str, Any]:
    """Activation (gradient) checkpointing under the TrainingArguments name this transformers uses."""
    from dataclasses import fields

    from transformers import TrainingArguments

    names = {f.name for f in fields(TrainingArguments)}
    prefix = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {prefix: enabled, f"{prefix}_kwargs": {"use_reentrant": False}}


def _checkpoint_layers(cfg: dict[str, Any], model: Any) -> int | None:
    """How many decoder layers to checkpoint: None = all (the plain behaviour), else the first N.

    ``auto`` is resolved before launch (``core.runs``); one that reaches the trainer unresolved (a config
    written by hand for an older launcher) means all layers.
    """
    value = cfg.get("checkpoint_layers", "all")
    if not cfg.get("gradient_checkpointing") or value in (None, "all", "auto"):
        return None
    from core.train.engine_switches import decoder_layers

    return min(int(value), len(decoder_layers(model)))


def _model_flops_per_token(cfg: dict[str, Any], model_dir: Path, world_size: int) -> float | None:
    """The run's forward + backward FLOPs per token (``core.estimate.speed.model_flops_per_token``), for the
    dashboard's MFU; None when the estimator cannot describe the model (the dashboard then falls back)."""
    from core.errors import TunedeckError
    from core.estimate.run_plan import plan_for_run
    from core.estimate.speed import model_flops_per_token

    try:
        return float(round(model_flops_per_token(plan_for_run({**cfg, "model": str(model_dir)}, world_size))))
    except TunedeckError as exc:
        log.info("no FLOPs figure for the MFU: %s", exc)
        return None


def _tiled_mlp(cfg: dict[str, Any], world_size: int, zero_stage: int = 0) -> str | int:
    """The run's ``tiled_mlp`` as the engine applies it: ``false`` in a distributed or DeepSpeed run (the
    tiles' gradients accumulate inside backward, which DDP's and ZeRO's gradient hooks count as several)."""
    value = cfg.get("tiled_mlp", "auto")
    value = "false" if value in (False, None, 0, 1, "false") else value
    if value != "false" and (world_size > 1 or zero_stage > 0):
        if value != "auto":
            log.warning("tiled_mlp applies to one-GPU runs without ZeRO; this run is not tiled")
        return "false"
    return value


def _is_oom(exc: BaseException) -> bool:
    import torch

    oom_types = tuple(
        cls for cls in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)) if cls
    )
    return isinstance(exc, oom_types)


def _scheduler_type(name: str) -> str:
    """transformers' name of a run's ``lr_scheduler``: its ``constant`` ignores the warmup, so tunedeck's
    (which warms up as cosine and linear do, ``warmup_ratio`` 0.03 unless set) is ``constant_with_warmup``,
    the same as ``constant`` for a warmup of 0."""
    return "constant_with_warmup" if name == "constant" else name


def train(run: RunDirectory, cfg: dict[str, Any], resume: str | None, flag: Any, rank: int,
          local_rank: int, world_size: int) -> tuple[str, str]:
    """Train to the end (or to a stop request); returns (status, reason)."""
    import torch
    from transformers import TrainingArguments, set_seed
    from transformers.trainer_callback import PrinterCallback
    from transformers.utils import logging as hf_logging

    from core.i18n import Message
    from core.train.callbacks import (
        FreezeSetupObjectsCallback,
        GracefulStopCallback,
        HeartbeatCallback,
        HoldAtStepCallback,
        InjectedOomCallback,
        RunMetricsCallback,
    )
    from core.train.data_adapter import (
        PaddingCollator,
        load_records,
        pack_examples,
        split_eval,
        tokenize_records,
    )
    from core.train.deepspeed_config import deepspeed_config, write_deepspeed_config
    from core.train.model_setup import (
        dequantised_reusing,
        describe_model_dir,
        load_model,
        load_tokenizer,
        lora_a_keeping,
        lora_dh_folding,
        lora_dropout_fusing,
        lora_grouping,
        lora_swiglu_db_summing,
        lora_swiglu_down_fusing,
        lora_swiglu_fusing,
        resolve_model_path,
        rms_norm_rows_using,
    )
    from core.train.trainer import AtomicCheckpointTrainer, defers_logs, read_tunedeck_state

    hf_logging.set_verbosity_warning()
    hf_logging.disable_progress_bar()
    seed = int(cfg.get("seed", 42))
    set_seed(seed)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(local_rank)
    bf16_ok = cuda and torch.cuda.is_bf16_supported()
    compute_dtype, weights_dtype, use_bf16, use_fp16 = _dtype_choices(cfg, cuda, bf16_ok)
    if not cuda and str(cfg.get("precision", "bf16")) != "fp32" and rank == 0:
        # 'tunedeck train' already writes fp32 for a run without GPUs; this is a torch without CUDA.
        run.append_event("precision_fallback", requested=str(cfg.get("precision")), used="fp32", reason="no GPU")
    tf32 = cfg.get("tf32", "auto")
    if cuda and (tf32 is True or (tf32 == "auto" and torch.cuda.get_device_capability()[0] >= 8)):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    checkpoint: Path | None = None
    prior_elapsed = 0.0
    weights_only = False
    if resume:
        checkpoint = Path(resume)
        if not (checkpoint / COMPLETE_MARKER).is_file():
            raise TrainingSetupError(Message("train.checkpoint_incomplete", path=str(checkpoint)))
        # 'tunedeck resume' verified it already; check again (cheap) in case it changed since, and read
        # the resume's own choice of a weights-only restart from the record it left in run.json.
        last_resume = (run.record().get("resumes") or [{}])[-1]
        weights_only = bool(last_resume.get("weights_only")) and last_resume.get("checkpoint") == str(checkpoint)
        found = verify_checkpoint(checkpoint)
        bad = found.first_problem
        if bad is not None and not (weights_only and found.weights_usable):
            raise TrainingSetupError(Message("checkpoints.unusable", path=str(checkpoint), file=bad.file,
                                             problem=bad.message))
        prior_elapsed = float(read_tunedeck_state(checkpoint).get("elapsed_s", 0.0) or 0.0)

    zero_stage = int(cfg.get("zero_stage", 0) or 0)
    ds_path = None
    if zero_stage > 0:
        if not cuda:
            raise TrainingSetupError(Message("train.zero_needs_gpu"))
        ds = deepspeed_config(cfg, world_size, use_bf16, use_fp16)
        if cfg.get("deepspeed"):  # the user's own JSON, merged over the generated one
            from core.config.deepspeed_file import DeepSpeedFileError, read_deepspeed_json
            from core.train.deepspeed_config import merge_user_config

            try:
                ds, notes = merge_user_config(ds, read_deepspeed_json(str(cfg["deepspeed"])))
            except DeepSpeedFileError as exc:
                raise TrainingSetupError(Message("train.deepspeed_file", problem=str(exc))) from exc
            for note in notes:
                log.info("deepspeed %s: %s", cfg["deepspeed"], note)
        ds_path = str(write_deepspeed_config(run.deepspeed_config_path, ds))

    model_dir = resolve_model_path(str(cfg["model"]), str(cfg.get("hub", "modelscope")))
    tokenizer = load_tokenizer(model_dir)
    max_seq_len = int(cfg.get("max_seq_len", 2048))
    datasets = cfg.get("dataset")
    datasets = [datasets] if isinstance(datasets, str) else list(datasets or [])
    records = load_records(datasets, str(cfg.get("hub", "modelscope")), cfg)
    overlong = str(cfg.get("overlong", "cut"))
    examples = tokenize_records(records, tokenizer, max_seq_len, str(cfg.get("loss_on", "assistant")), overlong,
                                cfg.get("thinking"))
    examples = split_eval(examples, float(cfg.get("eval_split", 0.0) or 0.0), seed)
    if not examples.train:
        if examples.overlong_dropped:  # left out as too long (overlong: drop), not empty: say so, and the way out
            raise TrainingSetupError(Message("train.all_overlong_dropped", datasets=", ".join(datasets),
                                             count=examples.overlong_dropped, max_seq_len=max_seq_len))
        if examples.cut_no_answer:  # every answer lies past the cut: say so, and the way out
            raise TrainingSetupError(Message("train.all_cut_no_answer", datasets=", ".join(datasets),
                                             count=examples.cut_no_answer, max_seq_len=max_seq_len,
                                             first=examples.cut_no_answer_origins[0]))
        raise TrainingSetupError(Message("train.no_examples", datasets=", ".join(datasets)))
    if examples.truncated_samples and rank == 0:
        run.append_event("data_truncated", samples=examples.truncated_samples, tokens=examples.dropped_tokens,
                         max_seq_len=max_seq_len)
        log.warning("%d samples longer than max_seq_len %d were truncated (%d tokens dropped)",
                    examples.truncated_samples, max_seq_len, examples.dropped_tokens)
    if examples.cut_no_answer and rank == 0:  # counted among the truncated: these train nothing at all
        run.append_event("data_cut_no_answer", samples=examples.cut_no_answer, max_seq_len=max_seq_len,
                         file=examples.cut_no_answer_origins[0])
        log.warning("%d of them lost their whole answer to the cut and were left out (the first: %s); raise "
                    "max_seq_len to train on them", examples.cut_no_answer, ", ".join(examples.cut_no_answer_origins))
    if examples.untrained and rank == 0:  # said as the other left-out samples are, not dropped without a word
        run.append_event("data_no_trained_turn", samples=examples.untrained, file=examples.untrained_origins[0])
        log.warning("%d samples have no turn to train on (every assistant turn excluded: weight 0) and were left "
                    "out (the first: %s)", examples.untrained, ", ".join(examples.untrained_origins))
    if examples.overlong_dropped and rank == 0:
        run.append_event("data_overlong_dropped", samples=examples.overlong_dropped, max_seq_len=max_seq_len)
        log.warning("%d samples longer than max_seq_len %d were left out (overlong: drop)",
                    examples.overlong_dropped, max_seq_len)
    train_rows = examples.train
    if cfg.get("packing"):
        train_rows = pack_examples(train_rows, max_seq_len)
    log.info("data: %d training rows, %d eval rows, %d tokens", len(train_rows), len(examples.eval),
             examples.total_tokens)
    if flag.is_set():
        from core.runs.liveness import stopped_early_reason

        reason = stopped_early_reason(run)  # a resumed run keeps its earlier checkpoints
        if reason.key == "runs.reason_stopped_no_checkpoint":
            reason = Message("train.stopped_before_start")
        return STOPPED, reason

    micro = int(cfg.get("micro_batch_size", 1))
    accum = int(cfg.get("gradient_accumulation", 1))
    max_steps = cfg.get("max_steps")
    warmup_steps = cfg.get("warmup_steps")
    warmup = float(warmup_steps) if warmup_steps is not None else float(cfg.get("warmup_ratio") or 0.0)
    save_steps = int(cfg.get("save_steps", 500))
    has_eval = bool(examples.eval)
    from core.train.fused_loss import liger_available

    fused_ce = _fused_ce(cfg, cuda)
    optim = optimizer_name(cfg, cuda)
    ds_offload = zero_stage > 0 and str(cfg.get("offload", "none")) != "none"
    # fused_ce: triton replaces Liger's loss only: its RMSNorm, SwiGLU and RoPE kernels run where installed
    use_liger = fused_ce == "liger" or (fused_ce == "triton" and liger_available())
    lr = cfg.get("learning_rate")
    args = TrainingArguments(
        output_dir=str(run.checkpoints_dir),
        per_device_train_batch_size=micro,
        per_device_eval_batch_size=micro,
        gradient_accumulation_steps=accum,
        num_train_epochs=float(cfg.get("epochs") or 1.0),
        max_steps=int(max_steps) if max_steps else -1,
        learning_rate=float(lr if lr is not None else (1e-5 if cfg.get("method") == "full" else 1e-4)),
        lr_scheduler_type=_scheduler_type(str(cfg.get("lr_scheduler", "cosine"))),
        warmup_steps=warmup,
        weight_decay=float(cfg.get("weight_decay", 0.0)),
        # every AdamW the Trainer builds takes these (torch's, fused, bitsandbytes' 8-bit/paged); a DeepSpeed
        # optimizer section says "auto" for them (deepspeed_config), which the Trainer fills with these too
        adam_beta1=float(cfg.get("adam_beta1", 0.9)),
        adam_beta2=float(cfg.get("adam_beta2", 0.999)),
        adam_epsilon=float(cfg.get("adam_epsilon", 1e-8)),
        max_grad_norm=float(cfg.get("max_grad_norm", 1.0)),
        optim=optim,
        bf16=use_bf16,
        fp16=use_fp16,
        **_checkpointing_args(bool(cfg.get("gradient_checkpointing", False))),
        logging_strategy="steps",
        logging_steps=int(cfg.get("logging_steps", 10)),
        logging_nan_inf_filter=False,
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=None,  # we rotate ourselves, complete checkpoints only
        eval_strategy="steps" if has_eval else "no",
        eval_steps=int(cfg.get("eval_steps") or save_steps) if has_eval else None,
        seed=seed,
        data_seed=seed,
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        include_num_input_tokens_seen="non_padding",
        use_cpu=not cuda,
        deepspeed=ds_path,
        ddp_find_unused_parameters=False,
        use_liger_kernel=use_liger,
        dataloader_pin_memory=cuda,
        # batches go up from pinned memory without a host synchronisation: a blocking copy waits for the
        # GPU's queue to drain (the optimizer step) before the next step's first kernel can be launched
        accelerator_config={"non_blocking": cuda},
        log_level="warning",
    )
    model = load_model(cfg, model_dir, device, compute_dtype, weights_dtype, local_rank,
                       zero3=zero_stage == 3)
    from core.train.engine_switches import decoder_layers
    from core.train.lora_group import skips_down

    checkpoint_layers = _checkpoint_layers(cfg, model)
    compile_layers = bool(cfg.get("compile_layers")) and cuda
    tiled = _tiled_mlp(cfg, world_size, zero_stage)
    if cfg.get("compile_layers") and not cuda:
        log.warning("compile_layers applies on GPUs; this CPU run is not compiled")
    global_batch = micro * accum * world_size
    ce_chunk = None if cfg.get("ce_chunk_tokens", "auto") == "auto" else int(cfg["ce_chunk_tokens"])
    gpu_names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    header = {
        "run_id": run.id,
        "model": str(cfg.get("model")),
        "method": str(cfg.get("method")),
        "precision": "bf16" if use_bf16 else "fp16" if use_fp16 else "fp32",
        "device": device,
        "gpu_names": gpu_names,
        "world_size": world_size,
        "micro_batch_size": micro,
        "gradient_accumulation": accum,
        "global_batch": global_batch,
        "max_seq_len": max_seq_len,
        "zero_stage": zero_stage,
        "attn": getattr(model.config, "_attn_implementation", None),
        "liger": use_liger,
        "fused_ce": fused_ce,
        "ce_chunk_tokens": ce_chunk if fused_ce in ("chunked", "triton") else None,  # None: the loss's own rule
        "logs_deferred": defers_logs(cuda),
        "optimizer": "deepspeed_cpu_adam" if ds_offload else optim,
        "packing": bool(cfg.get("packing")),
        "offload_activations": bool(cfg.get("offload_activations") and cfg.get("gradient_checkpointing")),
        "qlora_upcast": bool(cfg.get("qlora_upcast")) if cfg.get("method") == "qlora" else None,
        "lora_input_upcast": bool(cfg.get("lora_input_upcast")) if cfg.get("method") in LORA_METHODS else None,
        "lora_fused_add": bool(cfg.get("lora_fused_add", True)) if cfg.get("method") in LORA_METHODS else None,
        "lora_grouped": lora_grouping(cfg) if cfg.get("method") in LORA_METHODS else None,
        "lora_dropout_fused": lora_dropout_fusing(cfg, cuda) if cfg.get("method") in LORA_METHODS else None,
        "lora_swiglu_fused": lora_swiglu_fusing(cfg, cuda) if cfg.get("method") in LORA_METHODS else None,
        "lora_swiglu_down": lora_swiglu_down_fusing(cfg, cuda) if cfg.get("method") in LORA_METHODS else None,
        "lora_swiglu_db": lora_swiglu_db_summing(cfg, cuda) if cfg.get("method") in LORA_METHODS else None,
        "lora_fold_dh": lora_dh_folding(cfg, cuda) if cfg.get("method") in LORA_METHODS else None,
        "qlora_reuse_dequantised": dequantised_reusing(cfg) if cfg.get("method") == "qlora" else None,
        # (the groups decide by the block's kind: the key alone would say so for a Gemma too)
        "recompute_skip_down": skips_down(model) if cfg.get("method") in LORA_METHODS else None,
        "recompute_keep_lora_a": (lora_a_keeping(cfg) and lora_dropout_fusing(cfg, cuda)
                                  if cfg.get("method") in LORA_METHODS else None),
        "rms_norm_rows": rms_norm_rows_using(cfg, cuda, use_liger) if cfg.get("method") in LORA_METHODS else None,
        "checkpoint_layers": (0 if not cfg.get("gradient_checkpointing") else checkpoint_layers
                              if checkpoint_layers is not None else len(decoder_layers(model))),
        "compile_layers": compile_layers,
        "tiled_mlp": tiled,
        "train_rows": len(train_rows),
        "eval_rows": len(examples.eval),
        "truncated_samples": examples.truncated_samples,
        "model_flops_per_token": _model_flops_per_token(cfg, model_dir, world_size),
        **describe_model_dir(model_dir),
    }
    metrics_cb = RunMetricsCallback(run, header, str(checkpoint) if checkpoint else None, prior_elapsed,
                                    global_batch, is_main=rank == 0)
    stop_cb = GracefulStopCallback(flag)
    callbacks = [metrics_cb, stop_cb, HeartbeatCallback(), FreezeSetupObjectsCallback()]
    if cfg.get("offload_activations"):
        if cfg.get("gradient_checkpointing"):
            from core.train.offload import OffloadedCheckpointingCallback

            callbacks.append(OffloadedCheckpointingCallback())
        else:
            log.warning("offload_activations needs gradient_checkpointing: true; ignored")
    swiglu, norm_rows, fold = header["lora_swiglu_fused"], header["rms_norm_rows"], header["lora_fold_dh"]
    if checkpoint_layers is not None or compile_layers or tiled != "false" or swiglu or norm_rows or fold:
        from core.train.engine_switches import EngineSwitchesCallback

        callbacks.insert(0, EngineSwitchesCallback(checkpoint_layers, compile_layers, tiled, bool(swiglu),
                                                   bool(norm_rows), bool(fold)))
    from core.train.profiling import MemoryPeakCallback, ProfileStepsCallback, SyncTraceCallback

    for profile_cb in (ProfileStepsCallback.from_env(run.path), MemoryPeakCallback.from_env(run.path),
                       SyncTraceCallback.from_env(run.path)):
        if profile_cb is not None and rank == 0:
            callbacks.append(profile_cb)
    for fault_cb in (InjectedOomCallback.from_env(), HoldAtStepCallback.from_env()):
        if fault_cb is not None:
            callbacks.append(fault_cb)
    trainer = AtomicCheckpointTrainer(
        model=model,
        args=args,
        train_dataset=_ListDataset(train_rows),
        eval_dataset=_ListDataset(examples.eval) if has_eval else None,
        data_collator=PaddingCollator(tokenizer.pad_token_id, multiple_of=8 if cuda else 1,
                                      flatten=header["attn"] == "flash_attention_2",
                                      target_rows=fused_ce in ("chunked", "triton")),
        processing_class=tokenizer,
        callbacks=callbacks,
        run=run,
        keep_checkpoints=int(cfg.get("save_total_limit", 2) or 0),
        elapsed_fn=metrics_cb.elapsed_s,
        step_ended=metrics_cb.step_ended,
        own_loss=fused_ce if fused_ce in ("chunked", "triton") else None,
        chunk_tokens=ce_chunk,
        weights_only=weights_only,
    )
    trainer.remove_callback(PrinterCallback)  # our metrics callback logs a line per step already
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if stop_cb.stopped_at is not None:
        return STOPPED, Message("train.stopped_at", step=stop_cb.stopped_at, id=run.id)  # the command, pasteable
    if rank == 0 and cfg.get("output"):
        from core.runs.output import publish_run_output

        publish_run_output(run, cfg)  # the finished model into the `output` folder (failures are events)
    return FINISHED, ""


def _write_outcome(run: RunDirectory, status: str, reason: Any, rank: int, **extra: Any) -> None:
    # This process never learns the language of whoever will read the reason (the Runs screen, the
    # dashboard, 'tunedeck status', maybe in another language than the one the run was started in), so
    # a reason given as a Message is recorded as data: English text for old readers and other tools, plus
    # its key and parameters, which the supervisor copies to status.json and readers render themselves.
    from core.i18n import stored_reason
    from core.runs.disk_space import is_disk_full, release_reserve

    outcome = {"status": status, "rank": rank, "attempt": os.environ.get("TUNEDECK_ATTEMPT"),
               **stored_reason(reason), **extra}
    try:
        write_json_atomic(run.outcome_path, outcome)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        release_reserve(run.path)  # the room kept for exactly this (core.runs.disk_space)
        write_json_atomic(run.outcome_path, outcome)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m core.train.worker")
    parser.add_argument("run_dir")
    parser.add_argument("--resume", default=None)
    args = parser.parse_args(argv)
    set_parent_death_signal(signal.SIGKILL)
    os.umask(0o077)  # checkpoints and logs are private to the user, like the run directory
    if os.getppid() == 1:  # the supervisor died before we armed the death signal
        return 1
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    _configure_logging(rank)
    from core.train.callbacks import StopFlag

    flag = StopFlag()

    def on_signal(signum: int, _frame: Any) -> None:
        if not flag.is_set():
            log.info("%s received: finishing this step, then saving a checkpoint", signal.Signals(signum).name)
        flag.set(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    run = RunDirectory(Path(args.run_dir))
    from core.runs.heartbeat import start_heartbeat

    start_heartbeat(run.path, rank)  # before anything slow: readers judge stalls by it
    cfg = run.config()
    from core.i18n import Message
    from core.train.model_setup import ModelSetupError

    try:
        status, reason = train(run, cfg, args.resume, flag, rank, local_rank, world_size)
    except Exception as exc:
        if _is_oom(exc):
            return _on_oom(run, cfg, exc, rank, world_size)
        from core.runs.disk_space import is_disk_full

        if is_disk_full(exc):
            return _on_disk_full(run, cfg, exc, rank)
        if isinstance(exc, (TrainingSetupError, ModelSetupError)) and exc.args and isinstance(exc.args[0], Message):
            reason = exc.args[0]
        elif type(exc).__name__ == "DataError":  # core.data's: its problems kept as data, for each reader
            reason = exc.reason()
        elif isinstance(exc, (TrainingSetupError, ModelSetupError)):
            reason = str(exc)
        else:
            reason = Message("train.reason_exception", error=f"{type(exc).__name__}: {exc}")
        log.error("training failed: %s\n%s", reason, traceback.format_exc())
        _write_outcome(run, FAILED, reason, rank)
        return 1
    if rank == 0:
        _write_outcome(run, status, reason, rank)
    log.info("training %s%s", status, f": {reason}" if reason else "")
    # The work is done and recorded. Python resets its handlers to the default at exit, so a stop that
    # arrives now would kill us with SIGTERM and look like a failure: ignore it instead.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return 0


def _on_oom(run: RunDirectory, cfg: dict[str, Any], exc: BaseException, rank: int, world_size: int) -> int:
    from core.i18n import Message
    from core.train.callbacks import memory_figures_gib

    memory = memory_figures_gib()
    last = run.latest_metrics() or {}
    advice = oom_advice(cfg, world_size)
    reason = Message("train.reason_oom", advice=oom_tips(cfg, world_size))
    keys = ("model", "method", "precision", "micro_batch_size", "gradient_accumulation", "max_seq_len",
            "gradient_checkpointing", "zero_stage", "offload", "packing", "optimizer",
            "fused_ce", "offload_activations", "qlora_upcast", "qlora_reuse_dequantised")  # engine switches that decide memory too
    run.append_event(
        "oom",
        rank=rank,
        step=last.get("step"),
        error=str(exc)[:500],
        config={k: cfg.get(k) for k in keys},
        world_size=world_size,
        memory_gib=memory,
        advice=advice,
    )
    log.error("out of GPU memory on rank %d: %s\n%s", rank, str(exc)[:500], advice)
    _write_outcome(run, FAILED, reason, rank, oom=True)
    return 1


def _on_disk_full(run: RunDirectory, cfg: dict[str, Any], exc: BaseException, rank: int) -> int:
    """The disk filled up: an event and a final verdict with the figures and what to do (the reserve
    file makes room for them), and the traceback in the log after them."""
    from core.runs.disk_space import (
        DiskFullError,
        disk_full_reason,
        estimate_checkpoint_size,
        free_bytes,
        release_reserve,
    )

    full = exc
    while full is not None and not isinstance(full, DiskFullError):
        full = full.__cause__ or full.__context__
    if isinstance(full, DiskFullError):
        path, needed, free, step, kept = full.path, full.needed_bytes, full.free, full.step, full.weights_kept
    else:
        path = run.checkpoints_dir if run.checkpoints_dir.is_dir() else run.path
        size = estimate_checkpoint_size(cfg)
        needed, free, kept = (size.total if size else None), free_bytes(path), None
        step = (run.latest_metrics() or {}).get("step")
    release_reserve(run.path)
    reason = disk_full_reason(path, needed, free, run.id, kept, step)
    try:
        run.append_event("disk_full", rank=rank, step=step, path=str(path), needed_bytes=needed, free_bytes=free,
                         weights_kept=str(kept) if kept else None, error=f"{type(exc).__name__}: {exc}"[:500],
                         advice=reason.english())
    except OSError:
        pass  # the verdict below matters more; the supervisor records an event from it
    _write_outcome(run, FAILED, reason, rank, disk_full=True)
    log.error("disk full on rank %d: %s\n%s", rank, reason.english(), traceback.format_exc())
    return 1


def exit_after_handlers(code: int) -> None:
    """Leave once the run is recorded: the exit handlers run (log handlers flushed, file locks released,
    temporary folders removed), the interpreter's module teardown does not. In that teardown triton's
    nanobind bindings (imported by torch) report ~30 lines of "leaked" objects, the last lines of every
    train.log, which read like a crash after a run that finished."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_after_handlers(main())

