"""Which weights a finished run stands for, and loading them again (base + adapter, or a full model).

The base of a run on a bare config (the bundled tiny model, the GPU benchmark configs) was initialised
at random from the run's seed; it is rebuilt the very same way here (same seed, dtype and device kind),
so that the adapter meets the weights it was trained against. QLoRA adapters are merged into the bf16
base, never into the 4-bit one: the adapter was trained against the NF4-dequantised weights, so the merged
model (the usual practice, as peft and LLaMA-Factory merge) may answer slightly differently from the 4-bit
model trained; every merge of a QLoRA run says so (``MergeResult.qlora_note``). A base stored already
quantized (a ``*-bnb-4bit`` hub model) is never merged into (``refuse_quantized_base``): the merge would
quantize the merged weights again.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import Message
from core.runs.checkpoints import COMPLETE_MARKER
from core.runs.run_dir import RunDirectory

log = logging.getLogger("tunedeck.lifecycle")


class LifecycleError(TunedeckError):
    """A run that cannot be merged / chatted with / served as asked; the message says what to do."""


class NoCheckpoint(LifecycleError):
    """The run has no complete checkpoint: there is nothing to merge, chat with, evaluate, export or serve.
    A request that cannot be (exit 2), as ``resume`` of such a run says, not a failure of doing it (1)."""

    exit_code = EXIT_USAGE


class OutputExists(LifecycleError):
    """The output folder is there already (and is not a result this call may reuse); ``path`` names it, so
    that a caller without ``--out`` / ``--force`` (the TUI) can ask whether to replace it."""

    def __init__(self, message: object, path: Path) -> None:
        super().__init__(message)
        self.path = path


class OutputNotReplaceable(LifecycleError):
    """The output folder is there and is neither empty nor an earlier tunedeck merge or export: never
    replaced, with or without ``--force`` (a merge deletes only its own results). ``path`` names it,
    ``holds`` says what it holds (in words), for a caller that words its own advice (the TUI)."""

    def __init__(self, message: object, path: Path, holds: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.holds = holds


@dataclass(frozen=True)
class ModelSource:
    """The pieces of a run's result: base model, adapter checkpoint (None for full fine-tunes) …"""

    run_id: str
    base_model: str  # as configured ("tiny", a path or a hub id)
    hub: str
    method: str
    seed: int
    precision: str  # bf16 / fp16 / fp32: what the run trained in
    trained_on: str  # cpu / cuda
    checkpoint: Path
    step: int
    # the chat template's variables the run trained with (its ``thinking``: ``core.data.tokenize.template_kwargs``),
    # so that chat, serve and a merged folder render prompts as training rendered its samples
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_adapter(self) -> bool:
        return is_adapter_checkpoint(self.checkpoint)

    def to_dict(self) -> dict[str, Any]:
        out = {"run_id": self.run_id, "base_model": self.base_model, "method": self.method, "seed": self.seed,
               "precision": self.precision, "trained_on": self.trained_on, "checkpoint": str(self.checkpoint),
               "step": self.step, "adapter": self.is_adapter}
        if self.template_kwargs:
            out["template_kwargs"] = dict(self.template_kwargs)
        return out


def is_adapter_checkpoint(checkpoint: Path) -> bool:
    """The checkpoint holds an adapter (LoRA, DoRA, QLoRA: peft's adapter_config.json), not a full model."""
    return (checkpoint / "adapter_config.json").is_file()


def run_has_adapter(run: RunDirectory) -> bool:
    """Whether the run's checkpoints are adapters rather than full models (``ModelSource.is_adapter``), from
    its newest complete checkpoint: a directory scan and a stat, nothing verified, so a screen may ask it
    before it opens (a run's checkpoints are all of one kind)."""
    checkpoint = run.last_complete_checkpoint()
    return checkpoint is not None and is_adapter_checkpoint(checkpoint.path)


@dataclass
class LoadedModel:
    """A model ready for generation; ``has_adapter`` means ``disable_adapter()`` gives the base."""

    model: Any
    tokenizer: Any
    source: ModelSource | None
    has_adapter: bool
    device: str
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # rendered with every prompt (``ModelSource``)


def no_checkpoint_message(run: RunDirectory, status: str | None = None) -> str:
    """Why ``run`` (which has no complete checkpoint) cannot be merged, chatted with, served …, and what to
    do, by its state: a live run will save one (wait for save_steps); an ended one never will, and a resume
    has nothing to start from either, so it is started anew from its config.yaml. ``status``: the run's,
    liveness applied (looked up when not given)."""
    from core.i18n import t
    from core.runs.liveness import effective_status
    from core.runs.states import ACTIVE_STATES, state_label

    status = status if status is not None else effective_status(run).status
    if status in ACTIVE_STATES:
        return t("lifecycle.no_checkpoint", run=run.id, status=state_label(status))
    return t("lifecycle.no_checkpoint_ended", run=run.id, status=state_label(status), config=str(run.config_path))


def passed_over_notice(run: RunDirectory) -> str | None:
    """What ``resolve_model_source`` says when it passes over the run's newest complete checkpoint, damaged,
    for an older sound one (the one a merge, chat, serve, evaluate or export then loads); None when the
    newest is sound or none is. Verifies checkpoints (stat calls, a few KB read): a worker's call in the app."""
    from core.i18n import t

    newest = run.last_complete_checkpoint()
    sound = run.last_sound_checkpoint() if newest is not None else None
    if newest is None or sound is None or sound.step == newest.step:
        return None
    return t("lifecycle.checkpoint_passed_over", damaged=newest.path.name, used=sound.path.name)


def resolve_model_source(run: RunDirectory, checkpoint: int | None = None) -> ModelSource:
    """The run's base model and its newest sound checkpoint (or checkpoint ``checkpoint``).

    Sound: what resume checks (``RunDirectory.last_sound_checkpoint``), so a damaged newer checkpoint is
    passed over as resume passes it over. With none sound the newest complete one is taken, and loading
    it says what is wrong with it."""
    from core.i18n import t

    if not run.exists():
        raise LifecycleError(t("lifecycle.not_a_run", path=str(run.path)), EXIT_USAGE)
    complete = run.checkpoints(complete_only=True)
    if not complete:
        raise NoCheckpoint(no_checkpoint_message(run))
    if checkpoint is None:
        newest = run.last_complete_checkpoint() or complete[-1]  # not one a later resume left behind
        chosen = run.last_sound_checkpoint() or newest
        if chosen.step != newest.step:
            log.warning("%s", t("lifecycle.checkpoint_passed_over", damaged=newest.path.name,
                                used=chosen.path.name))
    else:
        matches = [c for c in complete if c.step == checkpoint]
        if not matches:
            if _rotated_away(run, checkpoint):
                raise LifecycleError(Message("lifecycle.checkpoint_rotated", step=checkpoint, run=run.id,
                                             steps=_other_sound_steps(run.checkpoints_dir / f"checkpoint-{checkpoint}")),
                                     EXIT_USAGE)  # a checkpoint that is not there: a request that cannot be
            steps = ", ".join(str(c.step) for c in complete)
            raise LifecycleError(t("lifecycle.checkpoint_missing", step=checkpoint, run=run.id, steps=steps), EXIT_USAGE)
        chosen = matches[0]
    from core.data.tokenize import template_kwargs

    cfg = run.config()
    header = run.metrics_header() or {}
    return ModelSource(
        run_id=run.id,
        base_model=str(cfg.get("model") or header.get("model") or ""),
        hub=str(cfg.get("hub", "modelscope")),
        method=str(cfg.get("method") or header.get("method") or "lora"),
        seed=int(cfg.get("seed", 42)),
        precision=str(header.get("precision") or cfg.get("precision") or "fp32"),
        trained_on=str(header.get("device") or "cpu"),
        checkpoint=chosen.path,
        step=chosen.step,
        template_kwargs=template_kwargs(cfg.get("thinking")),
    )


def torch_dtype(precision: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def base_model_dir(source: ModelSource) -> Path:
    from core.train.model_setup import resolve_model_path

    return resolve_model_path(source.base_model, source.hub)


def refuse_quantized_base(source: ModelSource) -> None:
    """Refuse (exit 2, before anything is loaded) to merge an adapter into a base stored already quantized
    (a hub's ``*-bnb-4bit`` model: its config.json has a ``quantization_config``). Loaded, it is the
    quantized model again, and merging into it dequantizes, adds the adapter and quantizes once more: a
    merged model that is neither the bf16 original plus the adapter nor the model trained, written as if
    it were. The message says what to do: the full-precision model's id. A full fine-tune has nothing to
    merge."""
    if not source.is_adapter:
        return
    config_path = base_model_dir(source) / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # loading it says what is wrong with it
    quant = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(quant, dict):
        return
    bits = 4 if quant.get("load_in_4bit") else 8 if quant.get("load_in_8bit") else quant.get("bits")
    kind = f"{quant.get('quant_method') or 'quantized'}{f' {bits}-bit' if bits else ''}"
    raise LifecycleError(Message("lifecycle.merge_quantized_base", model=source.base_model, quant=kind,
                                 path=str(config_path), run=source.run_id), exit_code=EXIT_USAGE)


# The config.json fields an adapter's shapes follow: a base given in place of the run's must agree on them.
_SHAPE_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
                 "num_key_value_heads")


def _config_of(folder: Path | None) -> dict[str, Any] | None:
    if folder is None:
        return None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _shape_of(config: dict[str, Any]) -> dict[str, Any]:
    """``config``'s ``_SHAPE_FIELDS`` that it states, as transformers reads them: a config saved before grouped-query
    attention has no ``num_key_value_heads`` (as many as its attention heads), where a re-save (a hub's *-bnb-4bit
    copy) writes it out. A field one file leaves out is not compared."""
    shape = {key: config[key] for key in _SHAPE_FIELDS if config.get(key) is not None}
    if "num_key_value_heads" not in shape and "num_attention_heads" in shape:
        shape["num_key_value_heads"] = shape["num_attention_heads"]
    return shape


def with_base(source: ModelSource, base: str) -> ModelSource:
    """``source`` merged into ``base`` in place of the run's model (``merge RUN --base ID``: the full-precision model a
    run's ``*-bnb-4bit`` base was quantized from). A full fine-tune has no adapter to put on another base, and a base
    whose shapes (``_SHAPE_FIELDS``, where both config.json files are on this box) differ from the run's is refused
    before anything is loaded (peft's size mismatch read as a damaged checkpoint)."""
    from dataclasses import replace

    from core.train.model_setup import local_model_path

    if not source.is_adapter:
        raise LifecycleError(Message("lifecycle.merge_base_full", run=source.run_id), exit_code=EXIT_USAGE)
    given = replace(source, base_model=base)
    ours = _config_of(local_model_path(source.base_model, source.hub))
    theirs = _config_of(local_model_path(base, source.hub))
    if ours is not None and theirs is not None:
        ours, theirs = _shape_of(ours), _shape_of(theirs)
        differ = [f"{key} {ours[key]} ≠ {theirs[key]}" for key in _SHAPE_FIELDS
                  if key in ours and key in theirs and ours[key] != theirs[key]]
        if differ:
            raise LifecycleError(Message("lifecycle.merge_base_mismatch", base=base, model=source.base_model,
                                         fields="; ".join(differ)), exit_code=EXIT_USAGE)
    return given


def load_base_model(source: ModelSource, device: str | None = None) -> Any:
    """The run's base in full precision of the run (bf16 for QLoRA), rebuilt exactly for bare configs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.i18n import t
    from core.train.model_setup import has_weights, materialize_random_weights

    device = device or default_device()
    dtype = torch_dtype(source.precision)
    model_dir = base_model_dir(source)
    if has_weights(model_dir):
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
        return model.to(device)
    if source.method == "qlora":
        # QLoRA quantised the bf16 weights it materialised once; the same files are the base to merge into.
        return AutoModelForCausalLM.from_pretrained(
            str(materialize_random_weights(model_dir, source.seed, dtype)), dtype=dtype).to(device)
    if source.trained_on != device.split(":")[0]:
        # CPU and CUDA random generators differ: the rebuilt base would not be the trained one.
        raise LifecycleError(t("lifecycle.random_base_device", trained=source.trained_on, here=device))
    config = AutoConfig.from_pretrained(str(model_dir))
    torch.manual_seed(source.seed)
    if device.startswith("cuda"):
        torch.cuda.manual_seed_all(source.seed)
        with torch.device(device if ":" in device else "cuda:0"):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def load_tokenizer_for(source: ModelSource) -> Any:
    """The tokenizer saved with the checkpoint (it carries the chat template), else the base's."""
    from transformers import AutoTokenizer

    where = source.checkpoint if (source.checkpoint / "tokenizer_config.json").is_file() else base_model_dir(source)
    tokenizer = AutoTokenizer.from_pretrained(str(where))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _rotated_away(run: RunDirectory, step: int) -> bool:
    """Whether the run's events say checkpoint ``step`` was removed by its rotation (save_total_limit)."""
    from core.runs.jsonl import last_record

    name = f"checkpoint-{step}"
    return last_record(run.events_path, lambda r: r.get("event") == "checkpoint_removed"
                       and r.get("why") in ("rotated", "left_behind")
                       and Path(str(r.get("path", ""))).name == name) is not None


def _removed(checkpoint: Path) -> bool:
    """The checkpoint went while it was read: its folder is gone, or its marker is (rotation removes the
    marker first) and the run's events name its rotation."""
    if not checkpoint.is_dir():
        return True
    match = re.match(r"^checkpoint-(\d+)$", checkpoint.name)
    return (match is not None and not (checkpoint / COMPLETE_MARKER).is_file()
            and _rotated_away(RunDirectory(checkpoint.parent.parent), int(match.group(1))))


def checkpoint_gone(checkpoint: Path) -> LifecycleError:
    """The error for a checkpoint that is no longer there: a live run's rotation (save_total_limit) removed
    it, before or while it was read; it names the sound checkpoints there now. Not "damaged": it was not."""

    match = re.match(r"^checkpoint-(\d+)$", checkpoint.name)
    run = RunDirectory(checkpoint.parent.parent)
    return LifecycleError(Message("lifecycle.checkpoint_rotated",
                                  step=match.group(1) if match else checkpoint.name, run=run.id,
                                  steps=_other_sound_steps(checkpoint)))


@contextmanager
def _checkpoint_read(checkpoint: Path) -> Iterator[None]:
    """A checkpoint whose files cannot be read (truncated, overwritten, half-copied) is the user's data, not
    a bug: it becomes a LifecycleError that names the checkpoint and says what to do. One that is no longer
    there (a live run's rotation removed it) says that instead: it was not damaged."""
    from safetensors import SafetensorError


    try:
        yield
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        if _removed(checkpoint):
            raise checkpoint_gone(checkpoint) from exc
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LifecycleError(Message("lifecycle.checkpoint_unreadable", checkpoint=str(checkpoint),
                                     problem=problem, steps=_other_sound_steps(checkpoint))) from exc


@contextmanager
def pinned(source: ModelSource) -> Iterator[None]:
    """Hold ``source``'s checkpoint against the run's rotation while it is read (``pin_checkpoint``); one
    already removed (between choosing it and pinning it) is ``checkpoint_gone``."""
    from core.runs.checkpoints import pin_checkpoint

    with pin_checkpoint(source.checkpoint) as there:
        if not there:
            raise checkpoint_gone(source.checkpoint)
        yield


@contextmanager
def held(run: RunDirectory, source: ModelSource, requested: int | None,
         base: str | None = None) -> Iterator[ModelSource]:
    """``source`` (``resolve_model_source(run, requested)``) with its checkpoint pinned against the run's
    rotation until the block ends; yields the source held. Between the choice and the pin a live run's
    rotation (save_total_limit) may have removed the checkpoint (torch's import alone takes seconds): with
    no step asked for (``requested`` None: the newest), the newest now is chosen and held instead; a step
    asked for is ``checkpoint_gone``. Merge, export, chat, serve and evaluate hold their checkpoint so, from
    before their loading to its end: chat, serve and evaluate failed on a checkpoint "no longer there" that
    the user had not asked for. ``base``: the model ``source`` is merged into (``with_base``), kept for a
    checkpoint chosen again."""
    from core.runs.checkpoints import pin_checkpoint

    for _ in range(5):  # rotation keeps the newest: a second choice is held (a bound, not a wait)
        with pin_checkpoint(source.checkpoint) as there:
            if there:
                yield source
                return
        if requested is not None:
            break
        source = resolve_model_source(run)
        source = with_base(source, base) if base else source
    raise checkpoint_gone(source.checkpoint)


def _other_sound_steps(checkpoint: Path) -> str:
    """The steps of the run's other checkpoints that pass resume's checks ("none" in the language), for
    the message about a damaged one: no command lists a run's checkpoints, so the message does."""
    from core.i18n import t

    run = RunDirectory(checkpoint.parent.parent)  # RUN/checkpoints/checkpoint-N
    try:
        steps = sorted(c.step for c in run.sound_checkpoints() if c.path != checkpoint)
    except OSError:
        steps = []
    return ", ".join(str(step) for step in steps) or t("lifecycle.checkpoint_none_sound")


def load_source_tokenizer(source: ModelSource) -> Any:
    """The tokenizer ``load_finetuned`` gives ``source``, alone: seconds, where the model can take minutes
    (``evaluate`` tokenizes and checks its data with it before loading the model)."""
    with pinned(source), _checkpoint_read(source.checkpoint):
        return load_tokenizer_for(source)


def load_finetuned(source: ModelSource, device: str | None = None, tokenizer: Any = None) -> LoadedModel:
    """Base + adapter (a ``PeftModel``, so the base stays reachable) or the full fine-tuned checkpoint;
    ``tokenizer``: the one ``load_source_tokenizer`` gave already, not loaded again."""

    device = device or default_device()
    with pinned(source):  # a live run's rotation leaves it alone until it is read
        adapter = source.is_adapter
        if tokenizer is None:
            with _checkpoint_read(source.checkpoint):
                tokenizer = load_tokenizer_for(source)
        if adapter:
            from peft import PeftModel

            base = load_base_model(source, device)
            with _checkpoint_read(source.checkpoint):
                model = PeftModel.from_pretrained(base, str(source.checkpoint))
            model.to(device)
        else:
            from transformers import AutoModelForCausalLM

            with _checkpoint_read(source.checkpoint):
                model = AutoModelForCausalLM.from_pretrained(str(source.checkpoint),
                                                             dtype=torch_dtype(source.precision))
            model.to(device)
    model.eval()
    return LoadedModel(model, tokenizer, source, adapter, device, dict(source.template_kwargs))


def check_model_dir(path: Path) -> None:
    """Refuse (``LifecycleError``, exit 2) a ``--model-dir`` that is no whole model folder: not there, no
    config.json, a download not finished, no weights (``core.config.model_checks.folder_problem``, the
    launch checks' own look at a model folder). Loaded or served unchecked, such a folder ended in
    transformers', vLLM's or LMDeploy's own error, after the server had started."""
    from core.config.model_checks import folder_problem
    from core.errors import EXIT_USAGE

    found = folder_problem(path, str(path), loaded=True)
    if found is not None:
        raise LifecycleError(found[1], exit_code=EXIT_USAGE)
    damaged = _damaged_weights(path)
    if damaged is not None:
        raise LifecycleError(damaged, exit_code=EXIT_USAGE)


def _damaged_weights(path: Path) -> str | None:
    """Why a model folder's safetensors are not whole (a truncated or overwritten file), in one line, or
    None: the header of each is read and checked against the file's size (``safetensors_problem``, what
    resume checks a checkpoint with), so a cut file is said before loading, not in safetensors' words
    ("invalid header length") from chat, or in the server log's traceback from serve."""
    from core.i18n import t
    from core.runs.checkpoints import safetensors_problem

    for weights in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(weights)
        if problem is not None:
            return t("lifecycle.model_dir_damaged", path=str(path), file=weights.name, problem=problem.text())
    return None


@contextmanager
def _model_dir_read(path: Path) -> Iterator[None]:
    """A model folder that passed ``check_model_dir`` and still cannot be loaded (a shard the index names
    missing, a file cut while loading …): one message naming it, not the library's traceback."""
    from safetensors import SafetensorError

    from core.errors import EXIT_USAGE
    from core.i18n import t

    try:
        yield
    except (SafetensorError, OSError, ValueError) as exc:
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LifecycleError(t("lifecycle.model_dir_unreadable", path=str(path), problem=problem),
                             exit_code=EXIT_USAGE) from exc


def load_model_dir(path: Path, device: str | None = None, checked: bool = False) -> LoadedModel:
    """A plain model directory (e.g. a merged one): config, weights and tokenizer (``check_model_dir``
    first: a folder that is none says so, not in transformers' words). ``checked``: the caller has just
    made that check itself (``tunedeck chat`` makes it before saying "loading …"), so it is not made twice."""
    if not checked:
        check_model_dir(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or default_device()
    import torch

    with _model_dir_read(path):
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        dtype_name = str(config.get("dtype") or config.get("torch_dtype") or "float32")
        dtype = getattr(torch, dtype_name, torch.float32)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
        model.eval()
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(model, tokenizer, None, False, device, merged_template_kwargs(path))


def merged_template_kwargs(path: Path) -> dict[str, Any]:
    """The template variables a tunedeck merge of a run recorded in its ``tunedeck_merge.json`` (the run's
    ``thinking``), {} for any other folder or a record without them."""
    try:
        recorded = json.loads((path / "tunedeck_merge.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    kwargs = recorded.get("template_kwargs") if isinstance(recorded, dict) else None
    return {str(k): v for k, v in kwargs.items() if isinstance(v, bool)} if isinstance(kwargs, dict) else {}
