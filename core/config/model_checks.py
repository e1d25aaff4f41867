"""Checks of a run configuration against its model, before anything starts: LoRA targets that match no
module would only fail inside the trainer (peft's ``NoMatchingPeftModuleError``) after the model loads.

The module names come from a model built on PyTorch's meta device (no memory, no weights) when torch and
transformers are installed, else from the decoder layout of ``core.estimate.architecture``. A model whose
``config.json`` is not at hand (a hub id not downloaded yet) is not checked here.

``model_problem`` says, before a run starts, whether its ``model`` can be had at all: a local folder with a
config.json and whole weights (``weights_problem``: a stopped download is refused, as the trainer would
start it from random weights), the bundled ``tiny``, or a hub id ``owner/name`` (in the local cache, or
downloadable: the hub must answer). A bare name such as ``tinny`` would only fail in the trainer, after a
hub round trip.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.i18n import t


def _meta_module_names(config: dict[str, Any]) -> list[str] | None:
    """Full names of the linear and embedding modules of the model built on the meta device."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        return None
    values = dict(config)
    model_type = values.pop("model_type", None)
    if not model_type:
        return None
    try:
        hf_config = AutoConfig.for_model(model_type, **values)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
    except Exception:  # an architecture this transformers cannot build: fall back to the layout
        return None
    return [name for name, module in model.named_modules()
            if name and isinstance(module, (torch.nn.Linear, torch.nn.Embedding))]


def model_module_names(model: str) -> tuple[list[str], list[str]] | None:
    """(full names of the modules LoRA can target, the linear layers' short names) of ``model``; None
    when its config.json cannot be found offline or describes no model we can lay out."""
    from core.assets import resolve_model_name
    from core.estimate.architecture import LINEAR_NAMES, ArchitectureError
    from core.estimate.model_source import ModelNotFoundError, load_model_config

    try:
        model_config = load_model_config(resolve_model_name(model))
    except (ModelNotFoundError, OSError):
        return None
    names = _meta_module_names(model_config.config)
    if names is None:
        try:
            model_config.architecture()
        except (ArchitectureError, ValueError):
            return None
        # the Llama-style layout: attention projections under self_attn, the gated MLP under mlp
        full = [f"model.layers.0.{'self_attn' if n[0] in 'qkvo' else 'mlp'}.{n}" for n in LINEAR_NAMES]
        return full, list(LINEAR_NAMES)
    short: list[str] = []
    for name in names:
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in short and "embed" not in leaf:
            short.append(leaf)
    return names, short


def _matches(target: str, names: Sequence[str]) -> bool:
    """peft's rule: a module matches when its name is the target or ends with ``.target``."""
    return any(name == target or name.endswith("." + target) for name in names)


def lora_targets_problem(model: str | None, targets: str | list[str], method: str) -> str | None:
    """The message for LoRA targets that name no module of the model, or None when they all match (or
    the model cannot be looked at offline). ``all-linear`` always matches."""
    if method not in ("lora", "dora", "qlora") or not model or isinstance(targets, str):
        return None
    found = model_module_names(model)
    if found is None:
        return None
    names, short = found
    missing = [target for target in targets if not _matches(target, names)]
    if not missing:
        return None
    return t("config.lora_targets_unknown", missing=", ".join(missing), model=model, known=", ".join(short))


def weights_problem(folder: Path, value: str, loaded: bool = False) -> tuple[str, str] | None:
    """``(severity, message)`` for a model folder (it has a config.json) whose weights are not whole,
    else None. A download that is not finished (``.part`` files) is an error: its safetensors are
    missing or cut, and the trainer would start from random weights. A folder with no weights at all
    is an error when it is a download (a hub cache's or a tunedeck download's target: the weights never
    came), and a warning elsewhere: a bare config.json is the trainer's random-init path (the bundled
    ``tiny``, which passes, and the benchmarks' config-only folders), said so that it is never silent.

    ``loaded``: the folder is loaded as it is (``serve`` / ``chat --model-dir``), where there is no
    random-init path: no weights is always an error (the bundled ``tiny`` too), and the messages say
    what to give ``--model-dir``."""
    from core.assets import is_tiny_model
    from core.config.issues import ERROR, WARNING
    from core.hub.local import (
        download_command,
        hub_model_of,
        partial_files,
        partial_files_words,
        weights_state,
    )

    if not loaded and is_tiny_model(str(folder)):
        return None
    state = weights_state(folder)
    if state == "complete":
        return None
    owner = hub_model_of(folder)
    resume = download_command(owner[1], owner[0]) if owner else t("config.model_resume_unknown")
    if state == "partial":
        return ERROR, t("lifecycle.model_dir_download_unfinished" if loaded else "config.model_download_unfinished",
                        path=value, files=partial_files_words(len(partial_files(folder))), resume=resume)
    if owner is not None:
        return ERROR, t("lifecycle.model_dir_no_weights_download" if loaded else "config.model_no_weights_download",
                        path=value, resume=resume)
    if loaded:
        return ERROR, t("lifecycle.model_dir_no_weights", path=value)
    return WARNING, t("config.model_no_weights", path=value)


def folder_problem(folder: Path, value: str, loaded: bool = False) -> tuple[str, str] | None:
    """``(severity, message)`` for a local model folder that has no config.json or whose weights are not
    whole (``weights_problem``), else None: the local-folder part of ``model_problem`` (a run's ``model``)
    and, with ``loaded``, the check of a folder loaded as it is (``serve`` / ``chat --model-dir``), made
    before anything starts: served unchecked, such a folder ended in the backend's own error."""
    from core.config.issues import ERROR

    if not (folder / "config.json").is_file():
        if loaded:
            return ERROR, t("lifecycle.model_dir_no_config" if folder.is_dir() else "lifecycle.model_dir_missing",
                            path=value)
        return ERROR, t("runs.model_missing", path=value)
    return weights_problem(folder, value, loaded)


# A hub id as ModelScope and Hugging Face spell it: owner/name, letters, digits, '.', '-', '_'.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def model_problem(model: str, hub: str, probe: bool = True) -> tuple[str, str] | None:
    """``(severity, message)`` when ``model`` cannot be trained as it is named, else None.

    An error for a folder without config.json and for a name that is neither a folder, the bundled
    ``tiny`` nor a hub id (with the closest known name); for a hub id not in the local cache, an error
    when the hub cannot be reached (or ``HF_HUB_OFFLINE`` is set), else a warning that the run will
    download it. ``probe=False`` skips the network look (a test, or a caller that must not wait).
    """
    from core.assets import TINY_MODEL_NAME, resolve_model_name
    from core.config.checks import looks_like_local_path
    from core.config.issues import ERROR, WARNING

    value = resolve_model_name(model)
    path = Path(value).expanduser()
    if looks_like_local_path(value) or path.exists():
        return folder_problem(path, value)
    if HUB_ID.match(value):
        from core.estimate.model_source import cached_configs
        from core.hub.local import (
            cache_repo,
            cached_model_folder,
            download_command,
            partial_files,
            partial_files_words,
        )

        if cached_model_folder(value, hub) is not None:  # the whole copy the run loads, from either cache
            return None
        for cached in cached_configs(value):  # a download of it was stopped: a cache holds a part
            parts = partial_files(cache_repo(cached.parent))
            if parts:
                return ERROR, t("config.model_download_unfinished", path=str(cached.parent), files=partial_files_words(len(parts)),
                                resume=download_command(value, "hf" if hub == "huggingface" else "modelscope"))
        from core.data.loading import HUB_HOSTS, _offline, hub_address, network_reachable

        host = hub_address(hub)[0] if hub in HUB_HOSTS else hub
        if _offline():
            return ERROR, t("config.model_offline_not_cached", model=value)
        if probe and hub in HUB_HOSTS and not network_reachable(hub):
            return ERROR, t("config.model_hub_unreachable", model=value, host=host)
        return WARNING, t("config.model_will_download", model=value, host=host)
    from core.estimate.model_source import bundled_hub_id

    hub_id = bundled_hub_id(value, hub)
    if hub_id is not None:  # a bundled config: plans offline, but has no weights to train
        return ERROR, t("config.model_bundled_config", model=value, hub_id=hub_id)
    close = difflib.get_close_matches(value, [TINY_MODEL_NAME], n=1, cutoff=0.6)
    hint = t("config.did_you_mean", suggestion=close[0]) if close else ""
    return ERROR, t("config.model_unknown", model=value) + hint
