"""The recommendation as a run configuration (the YAML ``tunedeck train`` takes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.i18n import t
from core.plan.candidates import Candidate
from core.plan.request import PlanRequest


def run_config_values(candidate: Candidate, request: PlanRequest) -> dict[str, Any]:
    """Run-config keys for ``candidate`` (checked by ``RunConfig.from_dict``)."""
    p = candidate.plan
    hw = request.hardware
    if hw.cpu_only:
        gpus: Any = "all"
    elif hw.detected and hw.gpu_indices:
        gpus = list(hw.gpu_indices[: p.num_gpus])
    else:
        gpus = p.num_gpus
    values: dict[str, Any] = {
        "model": _trainable_model(request.model),
        "dataset": _anchored_dataset(request.dataset),
        "method": p.method,
        "precision": "bf16" if p.precision == "pure-bf16" else p.precision,
        "max_seq_len": p.seq_len,
        "micro_batch_size": p.micro_batch_size,
        "gradient_accumulation": p.grad_accum_steps,
        "epochs": request.epochs,
        "gradient_checkpointing": p.gradient_checkpointing,
        "gpus": gpus,
        "zero_stage": p.zero_stage,
        "offload": p.offload,
    }
    from core.hub.local import cached_hub

    if cached_hub(values["model"]) == "huggingface":  # downloaded from there: the run file says so, and a run of
        values["hub"] = "huggingface"  # it on another box fetches it from there, not from ModelScope (the default)
    if request.overlong != "cut":  # the run leaves long samples out, as the plan counted them
        values["overlong"] = request.overlong
    if request.thinking is not None:  # the run renders its samples so, as the plan counted their tokens
        values["thinking"] = request.thinking
    if p.precision == "pure-bf16":
        values["pure_bf16"] = True
    if p.offloads_activations:
        values["offload_activations"] = True
    if p.uses_lora:
        values["lora_rank"] = p.lora_rank
        values["lora_alpha"] = 2 * p.lora_rank
    if p.ce_chunk_tokens:
        values["ce_chunk_tokens"] = p.ce_chunk_tokens
    from core.assets import is_tiny_model

    if is_tiny_model(request.model):  # random weights: a pretrained model's default rate leaves its loss flat
        from core.config.demo import TINY_LEARNING_RATE

        values["learning_rate"] = TINY_LEARNING_RATE
    return values


def _trainable_model(value: str) -> str:
    """The model as a run names it: a bundled config's name (which plans offline, but has no weights)
    becomes the hub id it was published under on the run's hub; a local file or folder, its absolute
    path; anything else as it is."""
    from core.config import RunConfig
    from core.estimate.model_source import bundled_hub_id

    path = Path(value).expanduser()
    if not path.exists():
        hub_id = bundled_hub_id(value, RunConfig.hub)
        if hub_id is not None:
            return hub_id
    return _absolute_if_local(value) or value


def _anchored_dataset(value: str | None) -> Any:
    """The dataset as a run file anywhere names it: each local entry of it (a file, a folder, one of a comma
    list, ``~/x``) absolute, its ``#N`` kept, as ``train`` anchors a run's (``anchor_dataset_keys``); hub ids
    as they are."""
    from types import SimpleNamespace

    from core.data.registry import anchor_dataset_keys

    if not value:
        return value
    holder = SimpleNamespace(dataset=value)
    anchor_dataset_keys(holder, None)
    return holder.dataset


def _absolute_if_local(value: str | None) -> str | None:
    """A model or dataset that names a file or folder here, as an absolute path: the saved YAML is then
    the same run from any directory (``train`` reads a relative path from where it is started). A hub id,
    a dataset_info name or the bundled ``tiny`` stays as it is."""
    if not value:
        return value
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else value


def build_run_config(candidate: Candidate, request: PlanRequest) -> Any:
    """A checked ``RunConfig`` (raises ``ConfigError`` listing every problem)."""
    from core.config import RunConfig

    # its problems are the plan's, not a file's the user knows ("<plan>: dataset: is required")
    return RunConfig.from_dict(run_config_values(candidate, request), source=t("plan.config_source"))


def save_run_config(candidate: Candidate, request: PlanRequest, path: str | Path, overwrite: bool = True) -> Path:
    """Write the recommendation as a run YAML (creating its folder); returns the path. With ``overwrite``
    False an existing file is left alone (``FileExistsError``): ``plan --save`` without ``--force``. (The
    wizard saves with ``save_run_config_keeping``, which never replaces what it did not write.)"""
    config = build_run_config(candidate, request)
    if not overwrite and Path(path).exists():
        raise FileExistsError(str(path))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return config.save(path, shared=True)  # a plan is no secret: the umask's mode, as a file the user writes


def save_run_config_keeping(candidate: Candidate, request: PlanRequest, path: str | Path,
                            written: dict[Path, str]) -> Path:
    """Write the recommendation at ``path`` unless that would lose something: a file there that holds other
    text (hand edits, another plan) is left alone and the plan goes to the first free ``<stem>-2``, ``-3`` …
    (``free_config_path``). ``written`` maps the files this caller wrote to what it wrote, so that its own
    untouched file is rewritten rather than copied again; it is updated. Returns the path written."""
    config = build_run_config(candidate, request)
    text = config.to_yaml()
    target = free_config_path(Path(path), text, written)
    target.parent.mkdir(parents=True, exist_ok=True)
    config.save(target, shared=True)
    written[target] = text
    return target


def free_config_path(path: Path, text: str, written: dict[Path, str] | None = None) -> Path:
    """``path``, or the first of ``<stem>-2<suffix>``, ``-3`` … where ``text`` can be written without losing
    anything: a name that is free, that holds ``text`` already, or that holds what ``written`` says was
    written there (untouched since)."""
    written = written or {}
    for n in range(1, 10_000):
        candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        try:
            existing = candidate.read_text(encoding="utf-8")
        except FileNotFoundError:
            return candidate
        except (OSError, UnicodeDecodeError):
            continue  # unreadable (or not text): not ours to replace
        if existing == text or existing == written.get(candidate):
            return candidate
    raise FileExistsError(str(path))


def default_config_path(request: PlanRequest) -> Path:
    """``<data root>/plans/<model>-<method>.yaml``: where the wizard saves unless told otherwise."""
    from core.paths import data_root

    name = request.model.rstrip("/").replace("\\", "/").split("/")[-1] or "model"
    return data_root() / "plans" / f"{name}.yaml"


def equivalent_command(path: str | Path) -> str:
    return f"tunedeck train {path}"
