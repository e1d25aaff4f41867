"""Tokenizer and model for a run: local dir or hub id, random init from a bare config, LoRA/DoRA/QLoRA.

A model directory with only ``config.json`` (the bundled tiny model, the GPU benchmark configs) gets
random weights initialised from the config with the run's seed, so that a resume rebuilds the very same
base weights. QLoRA needs real weights to quantise at load time: for a bare config they are generated
once, saved under ``data_root()/cache/random-init/<hash>``, and loaded from there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import Message

log = logging.getLogger("tunedeck.train")

_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.safetensors.index.json", "*.bin.index.json")


class ModelSetupError(TunedeckError):
    """A model that cannot be loaded as configured; its one argument, a ``Message``, says what to change."""

    exit_code = EXIT_USAGE


def has_weights(model_dir: Path) -> bool:
    return any(any(model_dir.glob(pattern)) for pattern in _WEIGHT_PATTERNS)


def local_model_path(model: str, hub: str) -> Path | None:
    """``model``'s directory on this box: as given, the bundled ``tiny``, or a whole copy in a hub cache (either
    hub's, ``hub``'s first: ``core.hub.local.cached_model_folder``); None where it would have to be downloaded."""
    from core.assets import resolve_model_name

    local = Path(resolve_model_name(model)).expanduser()
    if local.is_dir():
        return local
    from core.hub.local import cached_model_folder

    return cached_model_folder(model, hub)


def resolve_model_path(model: str, hub: str) -> Path:
    """A local directory for ``model``: ``local_model_path``'s, or downloaded from ``hub``."""
    local = local_model_path(model, hub)
    if local is not None:
        return local
    if hub == "huggingface":
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model))
    from modelscope import snapshot_download as ms_snapshot_download

    return Path(ms_snapshot_download(model))


def attention_implementation(attn: str) -> str:
    if attn in ("auto", "sdpa"):
        return "sdpa"
    if attn == "eager":
        return "eager"
    if attn == "flash":
        try:
            import flash_attn  # noqa: F401
        except ImportError as exc:
            raise ModelSetupError(Message("train.flash_attn_missing")) from exc
        return "flash_attention_2"
    raise ModelSetupError(Message("train.attn_unknown", value=attn))


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _random_init_cache(model_dir: Path, seed: int, dtype_name: str) -> Path:
    from core.paths import data_root, ensure_private_dir

    config_text = (model_dir / "config.json").read_text(encoding="utf-8")
    key = hashlib.sha256(f"{config_text}|{seed}|{dtype_name}".encode()).hexdigest()[:16]
    return ensure_private_dir(data_root() / "cache" / "random-init") / key


def materialize_random_weights(model_dir: Path, seed: int, dtype: Any) -> Path:
    """Random weights for a bare config, saved once (for loaders that need files, e.g. 4-bit quantising)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype_name = str(dtype).replace("torch.", "")
    target = _random_init_cache(model_dir, seed, dtype_name)
    if (target / "COMPLETE").is_file():
        return target
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    config = AutoConfig.from_pretrained(str(model_dir))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
        with torch.device("cuda"):  # initialising 7B parameters takes seconds on a GPU, minutes on a CPU
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(str(tmp), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (model_dir / name).is_file() and not (tmp / name).exists():
            (tmp / name).write_bytes((model_dir / name).read_bytes())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        # The bf16 model made here (14 GiB for a 7B) is set-up, not training: left in the peak it made a
        # 7B QLoRA at 32k look like 14.2 GiB where its steps need 9.9.
        torch.cuda.reset_peak_memory_stats()
    try:
        os.rename(tmp, target)
    except OSError:  # another rank won the race
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    (target / "COMPLETE").write_text("ok\n")
    return target


def load_model(
    cfg: dict[str, Any],
    model_dir: Path,
    device: str,
    compute_dtype: Any,
    weights_dtype: Any,
    local_rank: int,
    zero3: bool,
) -> Any:
    """The model to train: weights loaded or randomly initialised, wrapped with LoRA/DoRA if asked."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    method = str(cfg.get("method", "lora"))
    seed = int(cfg.get("seed", 42))
    attn = attention_implementation(str(cfg.get("attn", "auto")))
    bare = not has_weights(model_dir)
    kwargs: dict[str, Any] = {"attn_implementation": attn}

    if method == "qlora":
        if device != "cuda":
            raise ModelSetupError(Message("config.qlora_needs_cuda"))
        from transformers import BitsAndBytesConfig

        source = materialize_random_weights(model_dir, seed, compute_dtype) if bare else model_dir
        quant = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype,
            bnb_4bit_quant_storage=compute_dtype,
        )
        model = AutoModelForCausalLM.from_pretrained(
            str(source), quantization_config=quant, dtype=compute_dtype, device_map={"": local_rank}, **kwargs
        )
    elif bare:
        config = AutoConfig.from_pretrained(str(model_dir))
        torch.manual_seed(seed)
        if device == "cuda":
            torch.cuda.manual_seed_all(seed)
        if device == "cuda" and not zero3:
            # Initialise straight on the GPU: a 7B model initialises in seconds there, minutes on a CPU.
            with torch.device(f"cuda:{local_rank}"):
                model = AutoModelForCausalLM.from_config(config, dtype=weights_dtype, **kwargs)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=weights_dtype, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=weights_dtype, **kwargs)

    model.config.use_cache = False  # the KV cache is useless in training and costs memory
    if method in ("lora", "dora", "qlora"):
        # The adapters' initial draws from the run's seed alone, not from what making the base model used up
        # (a 4-bit model from the random-weights cache uses nothing; a bare config on the CPU uses the generator)
        torch.manual_seed(seed)
        model = wrap_lora(model, cfg, compute_dtype)
    return model


def prepare_kbit_model(model: Any, compute_dtype: Any) -> Any:
    """QLoRA's base model made ready for LoRA without peft's fp32 upcast (``qlora_upcast: false``).

    peft's ``prepare_model_for_kbit_training`` casts every non-quantised weight to fp32; an fp32 norm
    weight turns its bf16 input into an fp32 output, so the residual stream, the LoRA inputs and the
    logits all become fp32 (twice the activation memory, slower matmuls). Here every base weight is
    frozen and the non-quantised ones (embedding, norms, LM head) are kept in the compute dtype: they
    never change, so nothing is lost by not storing them in fp32, and the softmax is still taken in fp32
    by the loss. What must be fp32 is what trains: the LoRA adapters, which peft creates in fp32.
    Gradient checkpointing is the Trainer's, non-reentrant: gradients reach the adapters inside a
    checkpointed block without peft's ``enable_input_require_grads`` hook (which would also make the
    embedding output keep a gradient).
    """
    import torch

    for param in model.parameters():
        param.requires_grad = False
        if param.__class__.__name__ != "Params4bit" and param.is_floating_point() and param.dtype != compute_dtype:
            param.data = param.data.to(compute_dtype)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return model


def wrap_lora(model: Any, cfg: dict[str, Any], compute_dtype: Any = None) -> Any:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    method = str(cfg.get("method"))
    gradient_checkpointing = bool(cfg.get("gradient_checkpointing", False))
    if method == "qlora" and bool(cfg.get("qlora_upcast", False)):
        model = prepare_model_for_kbit_training(  # the plain recipe: non-quantised weights upcast to fp32
            model,
            use_gradient_checkpointing=gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    elif method == "qlora":
        import torch

        model = prepare_kbit_model(model, compute_dtype or torch.bfloat16)
    targets = cfg.get("lora_targets", "all-linear")
    lora = LoraConfig(
        r=int(cfg.get("lora_rank", 16)),
        lora_alpha=float(cfg.get("lora_alpha", 32)),
        lora_dropout=float(cfg.get("lora_dropout", 0.05)),
        target_modules=targets if isinstance(targets, str) else list(targets),
        use_dora=method == "dora",
        use_rslora=bool(cfg.get("lora_rslora", False)),  # scaling alpha/sqrt(r), which the fused kernels read
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    if not bool(cfg.get("lora_input_upcast", False)):
        from core.train.engine_switches import disable_lora_input_upcast

        disable_lora_input_upcast(model)  # bf16 inputs stay bf16; the fp32 adapters are untouched
    if bool(cfg.get("lora_fused_add", True)):
        from core.train.engine_switches import fuse_lora_add

        fuse_lora_add(model)  # scale and add inside the lora_B matmul
    if lora_grouping(cfg):
        from core.train.lora_group import group_lora_layers

        fused = bool(cfg.get("lora_dropout_fused", True))
        swiglu = bool(cfg.get("lora_swiglu_fused", True))
        reuse = dequantised_reusing(cfg)
        skip = down_skipping(cfg)
        keep = lora_a_keeping(cfg)
        down = swiglu and bool(cfg.get("lora_swiglu_down", True))
        db = down and bool(cfg.get("lora_swiglu_db", True))
        log.info("lora_grouped: %d groups of LoRA linears that share an input (dropout in Triton kernels: %s; "
                 "gate/up updates in the SwiGLU kernel: %s; down projection's LoRA input work in it too: %s; "
                 "dequantised weights kept for backward: %s; down projection skipped in the recompute: %s; "
                 "gate/up B gradients in it: %s; lora_A products kept for the recompute: %s)",
                 group_lora_layers(model, fused_dropout=fused, fused_swiglu=swiglu, reuse_dequantised=reuse,
                                   skip_down=skip, keep_lora_a=keep, swiglu_down=down, swiglu_db=db),
                 fused, swiglu, down, reuse, skip, db, keep)
    trainable, total = model.get_nb_trainable_parameters()
    log.info("%s: %s trainable parameters of %s (%.3f%%)", method, f"{trainable:,}", f"{total:,}",
             100.0 * trainable / max(1, total))
    return model


def lora_grouping(cfg: dict[str, Any]) -> bool:
    """Whether a run's LoRA linears run grouped (``core.train.lora_group``): on by default for LoRA and
    QLoRA, off for DoRA, under peft's input upcast and for compiled layers."""
    return (str(cfg.get("method")) in ("lora", "qlora") and bool(cfg.get("lora_grouped", True))
            and not cfg.get("lora_input_upcast") and not cfg.get("compile_layers"))


def lora_dropout_fusing(cfg: dict[str, Any], cuda: bool) -> bool:
    """Whether a run's LoRA dropout runs in ``core.train.lora_dropout_kernel``'s kernels (the group checks
    the rest, such as one rank, at its first forward): grouped, on a GPU, with a dropout the kernels take."""
    from core.estimate.plan import FUSED_DROPOUT_MAX_P

    return (cuda and lora_grouping(cfg) and bool(cfg.get("lora_dropout_fused", True))
            and 0 < float(cfg.get("lora_dropout", 0.05) or 0) < FUSED_DROPOUT_MAX_P)


def lora_swiglu_fusing(cfg: dict[str, Any], cuda: bool) -> bool:
    """Whether a run's gate/up LoRA updates are added in ``core.train.lora_swiglu_kernel``'s SwiGLU kernel
    (each MLP checks its activation and ranks at its first forward): grouped, on a GPU."""
    return cuda and lora_grouping(cfg) and bool(cfg.get("lora_swiglu_fused", True))


def lora_dh_folding(cfg: dict[str, Any], cuda: bool) -> bool:
    """Whether a run's grouped LoRA linears make their adapters' ``dh`` in the base's input-gradient matmul
    (``lora_fold_dh``, ``core.train.lora_group.home_lora_bases``, at train begin): LoRA (16/32-bit bases), grouped,
    on a GPU."""
    return cuda and lora_grouping(cfg) and cfg.get("method") == "lora" and bool(cfg.get("lora_fold_dh", True))


def rms_norm_rows_using(cfg: dict[str, Any], cuda: bool, liger: bool) -> bool:
    """Whether a run's frozen RMSNorms run ``core.train.rms_norm_kernel``'s row kernels (``rms_norm_rows``): LoRA
    or QLoRA (the norms frozen) with Liger's norms, on a GPU; each norm checks at each call that it applies."""
    return cuda and liger and cfg.get("method") in ("lora", "qlora") and bool(cfg.get("rms_norm_rows", True))


def lora_swiglu_down_fusing(cfg: dict[str, Any], cuda: bool) -> bool:
    """Whether a run's down projections do their LoRA input work in the fused SwiGLU kernels
    (``lora_swiglu_down``, ``core.train.lora_group``): where the SwiGLU is fused."""
    return lora_swiglu_fusing(cfg, cuda) and bool(cfg.get("lora_swiglu_down", True))


def lora_swiglu_db_summing(cfg: dict[str, Any], cuda: bool) -> bool:
    """Whether a run's SwiGLU backward kernels sum the gate/up adapters' B gradients (``lora_swiglu_db``,
    ``core.train.lora_group``): where the down projection's LoRA input work is in them."""
    return lora_swiglu_down_fusing(cfg, cuda) and bool(cfg.get("lora_swiglu_db", True))


def dequantised_reusing(cfg: dict[str, Any]) -> bool:
    """Whether a QLoRA run's checkpointed blocks keep the weights they dequantise for backward
    (``qlora_reuse_dequantised``, ``core.train.lora_group``): grouped, with gradient checkpointing."""
    return (cfg.get("method") == "qlora" and lora_grouping(cfg) and bool(cfg.get("gradient_checkpointing"))
            and bool(cfg.get("qlora_reuse_dequantised", True)))


def down_skipping(cfg: dict[str, Any]) -> bool:
    """Whether a run's checkpointed blocks recompute without the frozen down-projection matmul
    (``recompute_skip_down``, ``core.train.lora_group``; the group checks the block's kind): grouped, with
    gradient checkpointing."""
    return (lora_grouping(cfg) and bool(cfg.get("gradient_checkpointing"))
            and bool(cfg.get("recompute_skip_down", True)))


def lora_a_keeping(cfg: dict[str, Any]) -> bool:
    """Whether a run's checkpointed blocks keep the fused dropout kernels' ``lora_A`` products for their
    recompute (``recompute_keep_lora_a``, ``core.train.lora_group``; only where those kernels run): grouped,
    with gradient checkpointing and dropout in the fused kernels."""
    return (lora_grouping(cfg) and bool(cfg.get("gradient_checkpointing")) and bool(cfg.get("lora_dropout_fused", True))
            and bool(cfg.get("recompute_keep_lora_a", False)))


def describe_model_dir(model_dir: Path) -> dict[str, Any]:
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    return {
        "model_dir": str(model_dir),
        "random_init": not has_weights(model_dir),
        "architecture": (config.get("architectures") or [None])[0],
        "hidden_size": config.get("hidden_size"),
        "num_hidden_layers": config.get("num_hidden_layers"),
        "vocab_size": config.get("vocab_size"),
    }
