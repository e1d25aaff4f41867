"""The run configuration: every key, its type, default and allowed values.

One YAML file describes a run (see ``core/config/REFERENCE.md`` for the user-facing table). Keys are flat;
a nested mapping such as ``lora: {rank: 16}`` is read as ``lora_rank`` and so is the override
``lora.rank=16``.

=========================  ==================================  =========================================
key                        allowed                             default
=========================  ==================================  =========================================
name                       text                                ``<model>-<method>``
model                      hub id or local directory           (required)
hub                        modelscope, huggingface             modelscope
dataset                    path / hub id, or a list of them    (required)
dataset_info               path to a dataset_info.json         (unset: the one in dataset_dir or next to the config)
dataset_dir                folder with dataset_info.json       (unset)
split                      hub dataset split                   (unset: train, or the dataset_info entry's)
method                     full, lora, dora, qlora             lora
lora_rank                  int >= 1                            16
lora_alpha                 number > 0                          32
lora_dropout               0 <= x < 1                          0.05
lora_targets               all-linear or list of module names  all-linear
lora_rslora                bool                                false
precision                  bf16, fp16, fp32                    bf16
pure_bf16                  bool                                false
tf32                       auto, true, false                   auto
max_seq_len                int 16 .. 1048576                   2048
overlong                   cut, drop                           cut (a sample longer than max_seq_len)
micro_batch_size           int >= 1                            1
gradient_accumulation      int >= 1                            8
epochs                     number > 0                          3 (when max_steps is not set)
max_steps                  int >= 1                            (unset)
learning_rate              0 < x < 1                           1e-4 for LoRA methods, 1e-5 for full
optimizer                  see OPTIMIZERS                      auto (fused AdamW on CUDA)
lr_scheduler               cosine, linear, constant            cosine
warmup_ratio               0 <= x < 1                          0.03 (when warmup_steps is not set)
warmup_steps               int >= 0                            (unset)
weight_decay               x >= 0                              0.0
adam_beta1                 0 <= x < 1                          0.9
adam_beta2                 0 <= x < 1                          0.999
adam_epsilon               0 < x < 1                           1e-8
max_grad_norm              x >= 0 (0 = no clipping)            1.0
gradient_checkpointing     bool                                true
checkpoint_layers          all, auto, or an int >= 0           all
packing                    bool                                false
seed                       int >= 0                            42
gpus                       all, a count, or a list of indices  all
zero_stage                 0, 1, 2, 3                          0
offload                    none, optimizer, all                none
deepspeed                  path to a DeepSpeed JSON            (unset: tunedeck generates one)
save_steps                 int >= 1                            500
save_total_limit           int >= 0 (0 = keep all)             2
eval_split                 0 <= x < 1                          0.0
eval_steps                 int >= 1                            (unset: at each save)
logging_steps              int >= 1                            10
loss_on                    assistant, all                      assistant
thinking                   bool                                (unset: the chat template's default)
fused_ce                   auto, bool, liger, triton, chunked  auto
ce_chunk_tokens            auto, or an int >= 1                auto
qlora_upcast               bool                                false
lora_input_upcast          bool                                false
lora_fused_add             bool                                true
lora_grouped               bool                                true
lora_dropout_fused         bool                                true
lora_swiglu_fused          bool                                true
lora_swiglu_down           bool                                true
lora_swiglu_db             bool                                true
lora_fold_dh               bool                                true
qlora_reuse_dequantised    bool                                true
recompute_skip_down        bool                                true
recompute_keep_lora_a      bool                                false
rms_norm_rows              bool                                true
compile_layers             bool                                false
offload_activations        bool                                false
tiled_mlp                  auto, false, or an int >= 1         auto
attn                       auto, sdpa, eager, flash            auto
output                     directory                           unset; the finished model is copied there
=========================  ==================================  =========================================
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

METHODS = ("full", "lora", "dora", "qlora")
LORA_METHODS = ("lora", "dora", "qlora")
HUBS = ("modelscope", "huggingface")
PRECISIONS = ("bf16", "fp16", "fp32")
OPTIMIZERS = (
    "auto", "adamw_torch", "adamw_torch_fused", "adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit",
    "adafactor", "sgd",
)
# Friendly spellings accepted in YAML, stored as the transformers name.
OPTIMIZER_ALIASES = {"adamw_fused": "adamw_torch_fused", "adamw": "adamw_torch", "adamw_bnb_8bit": "adamw_8bit"}
EIGHT_BIT_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit", "paged_adamw_32bit")
LR_SCHEDULERS = ("cosine", "linear", "constant")
OFFLOADS = ("none", "optimizer", "all")
LOSS_ON = ("assistant", "all")
OVERLONG = ("cut", "drop")  # a sample longer than max_seq_len: cut to its first tokens, or left out
MAX_EPOCHS = 1_000_000
ATTENTION = ("auto", "sdpa", "eager", "flash")
ZERO_STAGES = (0, 1, 2, 3)
LORA_ONLY_KEYS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "lora_rslora")

DEFAULT_EPOCHS = 3.0
DEFAULT_WARMUP_RATIO = 0.03
DEFAULT_LR_LORA = 1e-4
DEFAULT_LR_FULL = 1e-5


@dataclass(frozen=True)
class KeySpec:
    """How one key is checked: ``kind`` names the checker in ``core.config.checks``."""

    kind: str  # text, int, number, bool, choice, auto_bool, int_or_choice, gpus, dataset, targets
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    below: float | None = None  # exclusive upper bound
    above: float | None = None  # exclusive lower bound
    optional: bool = False  # None is allowed (means "unset")


KEY_SPECS: dict[str, KeySpec] = {
    "name": KeySpec("text", optional=True),
    "model": KeySpec("text", optional=True),
    "hub": KeySpec("choice", HUBS),
    "dataset": KeySpec("dataset", optional=True),
    "dataset_info": KeySpec("text", optional=True),
    "dataset_dir": KeySpec("text", optional=True),
    "split": KeySpec("text", optional=True),
    "method": KeySpec("choice", METHODS),
    "lora_rank": KeySpec("int", minimum=1, maximum=4096),
    "lora_alpha": KeySpec("number", above=0),
    "lora_dropout": KeySpec("number", minimum=0, below=1),
    "lora_targets": KeySpec("targets"),
    "lora_rslora": KeySpec("bool"),
    "precision": KeySpec("choice", PRECISIONS),
    "pure_bf16": KeySpec("bool"),
    "tf32": KeySpec("auto_bool"),
    "max_seq_len": KeySpec("int", minimum=16, maximum=1_048_576),
    "overlong": KeySpec("choice", OVERLONG),
    "micro_batch_size": KeySpec("int", minimum=1),
    "gradient_accumulation": KeySpec("int", minimum=1),
    # At most a million: more is a typo (1e308), and its steps and tokens overflow the trainer's arithmetic.
    "epochs": KeySpec("number", above=0, maximum=MAX_EPOCHS, optional=True),
    "max_steps": KeySpec("int", minimum=1, optional=True),
    "learning_rate": KeySpec("number", above=0, below=1, optional=True),
    "optimizer": KeySpec("choice", OPTIMIZERS),
    "lr_scheduler": KeySpec("choice", LR_SCHEDULERS),
    "warmup_ratio": KeySpec("number", minimum=0, below=1, optional=True),
    "warmup_steps": KeySpec("int", minimum=0, optional=True),
    "weight_decay": KeySpec("number", minimum=0),
    # AdamW's moment decays and epsilon (transformers' defaults; ms-swift's beta2 is 0.95)
    "adam_beta1": KeySpec("number", minimum=0, below=1),
    "adam_beta2": KeySpec("number", minimum=0, below=1),
    "adam_epsilon": KeySpec("number", above=0, below=1),
    "max_grad_norm": KeySpec("number", minimum=0),
    "gradient_checkpointing": KeySpec("bool"),
    "checkpoint_layers": KeySpec("int_or_choice", ("all", "auto"), minimum=0),
    "packing": KeySpec("bool"),
    "seed": KeySpec("int", minimum=0),
    "gpus": KeySpec("gpus"),
    "zero_stage": KeySpec("choice", ZERO_STAGES),
    "offload": KeySpec("choice", OFFLOADS),
    "deepspeed": KeySpec("text", optional=True),
    "save_steps": KeySpec("int", minimum=1),
    "save_total_limit": KeySpec("int", minimum=0),
    "eval_split": KeySpec("number", minimum=0, below=1),
    "eval_steps": KeySpec("int", minimum=1, optional=True),
    "logging_steps": KeySpec("int", minimum=1),
    "loss_on": KeySpec("choice", LOSS_ON),
    # the chat template's enable_thinking (Qwen3's hybrid templates), in training and in chat/serve alike
    "thinking": KeySpec("bool", optional=True),
    "fused_ce": KeySpec("auto_bool", ("liger", "triton", "chunked")),
    "ce_chunk_tokens": KeySpec("int_or_choice", ("auto",), minimum=1),
    "qlora_upcast": KeySpec("bool"),
    "lora_input_upcast": KeySpec("bool"),
    "lora_fused_add": KeySpec("bool"),
    "lora_grouped": KeySpec("bool"),
    "lora_dropout_fused": KeySpec("bool"),
    "lora_swiglu_fused": KeySpec("bool"),
    "lora_swiglu_down": KeySpec("bool"),
    "lora_swiglu_db": KeySpec("bool"),
    "lora_fold_dh": KeySpec("bool"),
    "qlora_reuse_dequantised": KeySpec("bool"),
    "recompute_skip_down": KeySpec("bool"),
    "recompute_keep_lora_a": KeySpec("bool"),
    "rms_norm_rows": KeySpec("bool"),
    "compile_layers": KeySpec("bool"),
    "offload_activations": KeySpec("bool"),
    "tiled_mlp": KeySpec("int_or_choice", ("auto", "false"), minimum=1),
    "attn": KeySpec("choice", ATTENTION),
    "output": KeySpec("text", optional=True),
}


@dataclass
class RunConfig:
    """A validated, resolved run configuration (see the module docstring for every key).

    Build one with ``core.config.load_run_config`` (from YAML, with overrides) or
    ``RunConfig.from_dict``; both check every value. ``warnings`` holds non-fatal remarks from
    validation and is not part of the saved file.
    """

    model: str | None = None
    dataset: str | list[str] | None = None
    dataset_info: str | None = None  # a LLaMA-Factory dataset_info.json naming datasets (core.data.registry)
    dataset_dir: str | None = None
    split: str | None = None
    name: str | None = None
    hub: str = "modelscope"
    method: str = "lora"
    lora_rank: int = 16
    lora_alpha: float = 32
    lora_dropout: float = 0.05
    lora_targets: str | list[str] = "all-linear"
    lora_rslora: bool = False
    precision: str = "bf16"
    pure_bf16: bool = False
    tf32: str | bool = "auto"
    max_seq_len: int = 2048
    overlong: str = "cut"
    micro_batch_size: int = 1
    gradient_accumulation: int = 8
    epochs: float | None = None
    max_steps: int | None = None
    learning_rate: float | None = None
    optimizer: str = "auto"
    lr_scheduler: str = "cosine"
    warmup_ratio: float | None = None
    warmup_steps: int | None = None
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = True
    checkpoint_layers: str | int = "all"
    packing: bool = False
    seed: int = 42
    gpus: str | int | list[int] = "all"
    zero_stage: int = 0
    offload: str = "none"
    deepspeed: str | None = None
    save_steps: int = 500
    save_total_limit: int = 2
    eval_split: float = 0.0
    eval_steps: int | None = None
    logging_steps: int = 10
    loss_on: str = "assistant"
    thinking: bool | None = None
    fused_ce: str | bool = "auto"
    ce_chunk_tokens: str | int = "auto"
    qlora_upcast: bool = False
    lora_input_upcast: bool = False
    lora_fused_add: bool = True
    lora_grouped: bool = True
    lora_dropout_fused: bool = True
    lora_swiglu_fused: bool = True
    lora_swiglu_down: bool = True
    lora_swiglu_db: bool = True
    lora_fold_dh: bool = True
    qlora_reuse_dequantised: bool = True
    recompute_skip_down: bool = True
    recompute_keep_lora_a: bool = False
    rms_norm_rows: bool = True
    compile_layers: bool = False
    offload_activations: bool = False
    tiled_mlp: str | int = "auto"
    attn: str = "auto"
    output: str | None = None
    warnings: list = field(default_factory=list, repr=False, compare=False)

    # ---- conversions -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every key in documented order, as plain YAML/JSON-able values (no ``warnings``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "warnings":
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, (list, tuple)) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<config>", gpu_caps: Any = None) -> RunConfig:
        """Check ``data`` like a YAML file (unknown keys, types, combinations) and resolve defaults.

        Raises ``ConfigError`` listing every problem.
        """
        from core.config.loader import config_from_mapping

        return config_from_mapping(dict(data), {}, source, gpu_caps=gpu_caps)

    def to_yaml(self, header: str = "# tunedeck run configuration (resolved: every key with the value in force)\n"
                ) -> str:
        """The configuration as YAML text, keys in documented order."""
        return header + dump_yaml(self.to_dict())

    def save(self, path: str | Path, shared: bool = False) -> Path:
        """Write the resolved configuration as YAML, atomically; returns the path. Private (0600), as in a
        run's own folder, unless ``shared``: a plan the user keeps gets the mode a plain write would give."""
        from core.atomic_file import shared_file_mode, write_atomic

        path = Path(path)
        write_atomic(path, self.to_yaml(), shared_file_mode(path) if shared else 0o600)
        return path

    # ---- derived values the engine needs -----------------------------------------------------------
    @property
    def is_lora(self) -> bool:
        return self.method in LORA_METHODS

    @property
    def datasets(self) -> list[str]:
        """``dataset`` as a list (one entry when a single dataset is given)."""
        if self.dataset is None:
            return []
        return [self.dataset] if isinstance(self.dataset, str) else list(self.dataset)

    def gpu_indices(self, available: int) -> list[int]:
        """The GPU indices this run uses on a box with ``available`` GPUs."""
        if self.gpus == "all":
            return list(range(available))
        if isinstance(self.gpus, int):
            return list(range(min(self.gpus, available)))
        return list(self.gpus)

    def requested_gpu_count(self) -> int | None:
        """How many GPUs the configuration asks for; ``None`` for ``all`` (depends on the box)."""
        if self.gpus == "all":
            return None
        return self.gpus if isinstance(self.gpus, int) else len(self.gpus)


def dump_yaml(values: dict[str, Any]) -> str:
    """A run configuration as YAML a person edits: one ``key: value`` per line (block style), a short
    list of plain values on its key's line (``gpus: [0, 1]``), anything longer one item a line."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
        short = all(isinstance(item, (str, int, float, bool)) or item is None for item in data) and \
            len(", ".join(str(item) for item in data)) <= 60
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=short)

    _Dumper.add_representer(list, represent_list)
    _Dumper.add_representer(tuple, represent_list)
    return yaml.dump(values, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False,
                     width=100)


def default_for(key: str) -> Any:
    """The dataclass default of ``key`` (before resolution)."""
    for f in fields(RunConfig):
        if f.name == key:
            return f.default
    raise KeyError(key)


def resolve_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """Fill the defaults that depend on other keys (learning rate, epochs, warmup, name)."""
    out = dict(values)
    method = out.get("method", default_for("method"))
    if out.get("learning_rate") is None:
        out["learning_rate"] = DEFAULT_LR_FULL if method == "full" else DEFAULT_LR_LORA
    if out.get("epochs") is None and out.get("max_steps") is None:
        out["epochs"] = DEFAULT_EPOCHS
    if out.get("warmup_ratio") is None and out.get("warmup_steps") is None:
        out["warmup_ratio"] = DEFAULT_WARMUP_RATIO
    if not out.get("name") and out.get("model"):
        model_name = str(out["model"]).rstrip("/").replace("\\", "/").split("/")[-1]
        out["name"] = f"{model_name}-{method}"
    return out


def reference_path() -> str:
    """Where the table of run keys (``REFERENCE.md``, shipped as package data) is in this install: the path that
    messages pointing users to it give, one that exists in a checkout and in a pip install alike."""
    from importlib.resources import files

    return str(files("core.config").joinpath("REFERENCE.md"))
