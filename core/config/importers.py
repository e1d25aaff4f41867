"""``tunedeck import``: a LLaMA-Factory YAML, an ms-swift ``args.json`` or ``swift sft ...`` line → tunedeck.

Every key of the peer's file is accounted for in the mapping: taken (as which tunedeck key and value),
dropped (why tunedeck does not need it) or needs you (what has to be decided by hand). The conversion
goes through ``core.config.peers.PEER_KEYS``, the table the "did you mean" of unknown keys uses too.
A command line is split with ``shlex`` (never a shell); model ids and paths stay data.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config.peers import (
    DROPPED,
    LLAMAFACTORY,
    NEEDS_YOU,
    PEER_DEFAULTS,
    PEER_NAMES,
    PEER_TRAIN_DEFAULTS,
    SWIFT,
    TAKEN,
    Outcome,
    PeerKey,
    _stage,
    dropped,
    is_unset,
    needs_you,
    peer_key,
    show_value,
    taken,
    truthy,
)
from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import Message, t

# Keys that only a LLaMA-Factory file has (a tunedeck YAML never does): the file is converted, not read.
_LLAMAFACTORY_MARKERS = ("model_name_or_path", "stage", "finetuning_type", "do_train")
# ms-swift's method keys across versions (2: sft_type, 3: train_type, 4: tuner_type).
_SWIFT_MARKERS = ("train_type", "tuner_type", "sft_type", "model_id_or_path")
_SWIFT_COMMANDS = ("sft", "pt", "rlhf")
_METHOD_MERGE = {frozenset({"lora", "qlora"}): "qlora", frozenset({"lora", "dora"}): "dora"}


class PeerFileError(TunedeckError):
    """A file that cannot be imported; the message says why."""

    exit_code = EXIT_USAGE


@dataclass
class MappingLine:
    """What became of one key of the peer's file (``default`` lines are peer defaults the file left out)."""

    key: str
    value: Any
    outcome: Outcome
    default: bool = False
    entry: PeerKey | None = None  # the table's entry whose convert gave ``outcome``

    @property
    def verdict(self) -> str:
        return self.outcome.verdict

    def text(self) -> str:
        shown = show_value(self.value)
        key = t("import.default_key", key=self.key) if self.default else self.key
        if self.verdict == TAKEN:
            target = ", ".join(f"{k}={show_value(v)}" for k, v in self.outcome.values.items())
            line = t("import.line_taken", key=key, value=shown, target=target)
            if self.outcome.reason is not None:
                line = t("import.line_with_note", line=line, note=self.outcome.reason.text())
            return line
        reason = self.outcome.reason.text() if self.outcome.reason is not None else ""
        name = "import.line_dropped" if self.verdict == DROPPED else "import.line_needs_you"
        return t(name, key=key, value=shown, reason=reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "value": self.value,
            "verdict": self.verdict,
            "tunedeck": dict(self.outcome.values) if self.verdict == TAKEN else None,
            "reason": self.outcome.reason.text() if self.outcome.reason is not None else None,
            "peer_default": self.default,
        }


@dataclass
class ImportResult:
    """The converted configuration (tunedeck keys in documented order) and the key-by-key mapping."""

    peer: str
    source: str
    config: dict[str, Any]
    mapping: list[MappingLine] = field(default_factory=list)

    @property
    def peer_batch(self) -> int | None:
        """The peer's effective batch where the converted file says how many GPUs it trained on (micro-batch ×
        accumulation × GPUs: ``gpus`` a count or a list, CUDA_VISIBLE_DEVICES, NPROC_PER_NODE or an args.json's
        global_world_size); None where a value needs the user or the GPUs are the box's (``all``)."""
        from core.config.schema import RunConfig

        gpus = self.config.get("gpus")
        count = len(gpus) if isinstance(gpus, list) else gpus if type(gpus) is int else None
        micro = self.config.get("micro_batch_size", RunConfig.micro_batch_size)
        accumulation = self.config.get("gradient_accumulation", RunConfig.gradient_accumulation)
        if not count or not all(type(v) is int and v > 0 for v in (micro, accumulation)):
            return None
        return micro * accumulation * count

    @property
    def peer_name(self) -> str:
        return PEER_NAMES[self.peer]

    def counts(self) -> dict[str, int]:
        return {verdict: sum(1 for line in self.mapping if line.verdict == verdict)
                for verdict in (TAKEN, DROPPED, NEEDS_YOU)}

    def mapping_text(self) -> str:
        counts = self.counts()
        head = t("import.header", source=self.source, peer=self.peer_name, taken=counts[TAKEN],
                 dropped=counts[DROPPED], needs=counts[NEEDS_YOU])
        return "\n".join([head] + [f"  {line.text()}" for line in self.mapping])

    def to_yaml(self) -> str:
        from core.config.schema import dump_yaml

        lines = [t("import.yaml_header", source=self.source, peer=self.peer_name)]
        for line in self.mapping:
            if line.verdict == NEEDS_YOU:
                lines.append(f"# {line.text()}")
        body = dump_yaml(self.config)
        return "\n".join(f"# {text}" if not text.startswith("#") else text for text in lines) + "\n" + body

    def to_dict(self) -> dict[str, Any]:
        return {"peer": self.peer, "source": self.source, "config": self.config,
                "mapping": [line.to_dict() for line in self.mapping]}


# -- reading the peer's file -------------------------------------------------------------------------
def detect_peer(path: str | Path) -> str | None:
    """``llamafactory`` / ``swift`` when ``path`` is a peer's file, ``None`` for a tunedeck YAML (or an
    unreadable file: the tunedeck loader reports that with its line)."""
    try:
        peer, _values = read_peer_file(path)
    except (PeerFileError, OSError):
        return None
    return peer


def read_peer_file(path: str | Path) -> tuple[str, dict[str, Any]]:
    """The peer and its keys: a LLaMA-Factory or ms-swift YAML, an ``args.json``, or a ``swift`` line."""
    peer, values, _form, _environment = _read_peer_file(path)
    return peer, values


# How an ms-swift file gives its keys: a command line (``swift sft --key v``), a config file (``swift sft x.yaml``,
# read as that command line: ms-swift's own defaults fill what it leaves out) or an args.json (every value listed).
SWIFT_COMMAND, SWIFT_CONFIG, SWIFT_ARGS_JSON = "command", "config", "args.json"


def _read_peer_file(path: str | Path) -> tuple[str, dict[str, Any], str | None, frozenset[str]]:
    """``read_peer_file``'s answer, for ms-swift how its file gives the keys (``SWIFT_*``), and the names of a
    config file's ``ENV:`` entries (environment variables whatever their case)."""
    import yaml

    path = Path(path)
    try:  # utf-8-sig: a file a Windows editor saved starts with a BOM, which is no part of its text
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise PeerFileError(t("import.file_missing", path=str(path))) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PeerFileError(t("import.file_unreadable", path=str(path), reason=str(exc))) from None
    data: Any = None
    yaml_error: yaml.YAMLError | None = None
    as_json = is_json_text(path, text)
    if as_json:
        try:
            data = json.loads(text, object_pairs_hook=_pairs_once(path))
        except json.JSONDecodeError as exc:
            raise PeerFileError(t("import.json_syntax", path=str(path), line=exc.lineno, problem=exc.msg)) from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            data, yaml_error = None, exc  # a shell script with a swift line is not YAML
    if isinstance(data, dict):
        if not as_json:  # a JSON's were refused as it was read (``_pairs_once``); a YAML reader refuses some
            _refuse_duplicate_keys(path, text)  # JSON (tab indents, C1 characters): a traceback, once
        keys = {str(key) for key in data}
        # ms-swift's first: its args.json lists transformers' do_train too, a LLaMA-Factory marker
        if keys & set(_SWIFT_MARKERS) or isinstance(data.get("ENV"), dict):
            return SWIFT, *_swift_config_values(path, data, as_json)
        if keys & set(_LLAMAFACTORY_MARKERS):
            return LLAMAFACTORY, {str(k): v for k, v in data.items()}, None, frozenset()
        raise PeerFileError(t("import.not_a_peer_file", path=str(path)))
    tokens = _swift_line(text)
    if tokens is None:
        if yaml_error is not None and path.suffix.lower() in (".yaml", ".yml"):
            # a YAML file that does not parse: its error, not "not a peer file"
            mark = getattr(yaml_error, "problem_mark", None)
            problem = getattr(yaml_error, "problem", None) or str(yaml_error).splitlines()[0]
            if mark is not None:
                problem = f"{problem} (column {mark.column + 1})"
            raise PeerFileError(t("import.yaml_syntax", path=str(path),
                                  line=mark.line + 1 if mark is not None else "?", problem=problem))
        raise PeerFileError(t("import.not_a_peer_file", path=str(path)))
    return SWIFT, parse_swift_command(tokens), SWIFT_COMMAND, frozenset()


def _swift_config_values(path: Path, data: dict[Any, Any],
                         as_json: bool) -> tuple[dict[str, Any], str, frozenset[str]]:
    """An ms-swift file's keys and its form. ``swift sft x.yaml`` (or ``x.json``) reads the file as its command
    line, its ``ENV:`` mapping as the assignments before ``swift`` (ms-swift sets each one the shell has not set,
    swift/cli/main.py): they come first, under their names, as a command line's do. A JSON without ``ENV`` named
    args.json (2.x: sft_args.json) is the dump ms-swift writes with every value in it; another is a config a person wrote (``swift sft
    --config x.json``): ms-swift's defaults fill what it leaves out (a renamed dump leaves nothing out)."""
    env = data.get("ENV")
    if "ENV" in data and env is not None and not isinstance(env, dict):
        raise PeerFileError(t("import.swift_env_not_mapping", path=str(path), value=show_value(env)))
    values: dict[str, Any] = {str(k): str(v) if isinstance(v, (int, float, bool)) else v
                              for k, v in (env or {}).items()}
    values.update((str(k), v) for k, v in data.items() if k != "ENV")
    dump = as_json and "ENV" not in data and path.name.lower() in ("args.json", "sft_args.json")
    form = SWIFT_ARGS_JSON if dump else SWIFT_CONFIG
    return values, form, frozenset(values) - frozenset(str(k) for k in data)


def is_json_text(path: str | Path, text: str) -> bool:
    """Whether a peer's file is read as JSON (an ``args.json``, or a text that opens with ``{``), not as YAML."""
    return Path(path).suffix.lower() == ".json" or text.lstrip().startswith("{")


def json_key_lines(text: str) -> dict[str, int]:
    """The line (1-based) of each top-level key of a JSON object's text, as far as it reads ({} for one that
    is not an object). Read as JSON: a YAML reader finds no line in a JSON indented with tabs or holding
    C1 characters, and YAML's positions are not JSON's to rely on."""
    from json.decoder import scanstring

    decoder = json.JSONDecoder()
    lines: dict[str, int] = {}

    def skip(at: int) -> int:
        while at < len(text) and text[at] in " \t\n\r":
            at += 1
        return at

    at = skip(0)
    if text[at:at + 1] != "{":
        return lines
    at = skip(at + 1)
    try:
        while text[at:at + 1] == '"':
            key, end = scanstring(text, at + 1)
            lines.setdefault(key, text.count("\n", 0, at) + 1)
            at = skip(end)
            if text[at:at + 1] != ":":
                break
            _value, at = decoder.raw_decode(text, skip(at + 1))
            at = skip(at)
            if text[at:at + 1] != ",":
                break
            at = skip(at + 1)
    except ValueError:  # JSON that does not read on: the keys before it
        pass
    return lines


def _refuse_duplicate_keys(path: Path, text: str) -> None:
    """A key given twice in a peer's YAML is refused as in a tunedeck file (the last one would win
    silently): the loader's own check, on the file's top-level mapping."""
    import yaml

    from core.config.loader import duplicate_keys

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    for key, line, first in duplicate_keys(root):
        raise PeerFileError(f"{path}:{line}: {key}: {t('config.duplicate_key', first=first)}")


def _pairs_once(path: Path) -> Any:
    """``object_pairs_hook`` for an args.json: a key given twice is refused, not the last one taken."""

    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise PeerFileError(f"{path}: {key}: {t('import.json_duplicate_key')}")
            out[key] = value
        return out

    return build


def _swift_line(text: str) -> list[str] | None:
    """The tokens of the first ``swift sft|pt|rlhf`` command in a shell text (continuations joined)."""
    joined = text.replace("\\\r\n", " ").replace("\\\n", " ")
    for line in joined.splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        for index, token in enumerate(tokens[:-1]):
            if Path(token).name == "swift" and tokens[index + 1] in _SWIFT_COMMANDS:
                prefix = [tok for tok in tokens[:index] if "=" in tok and not tok.startswith("-")]
                return prefix + tokens[index:]
    return None


def parse_swift_command(tokens: list[str]) -> dict[str, Any]:
    """``[ENV=v ...] swift sft --key v [v ...] --flag --k=v`` → {key: value}; several values make a list.

    The subcommand is kept under ``swift`` and environment assignments under their names.
    """
    values: dict[str, Any] = {}
    tokens = list(tokens)
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-") and Path(tokens[0]).name != "swift":
        name, _, raw = tokens.pop(0).partition("=")
        values[name] = raw
    if not tokens or Path(tokens[0]).name != "swift":
        raise PeerFileError(t("import.not_a_swift_command", command=" ".join(tokens[:3])))
    tokens.pop(0)
    command = tokens.pop(0) if tokens else ""
    if command not in _SWIFT_COMMANDS:
        raise PeerFileError(t("import.not_a_swift_command", command=f"swift {command}".strip()))
    values["swift"] = command
    key: str | None = None
    items: list[Any] = []

    def flush() -> None:
        if key is not None:
            values[key] = True if not items else items[0] if len(items) == 1 else list(items)

    for token in tokens:
        if token.startswith("--") and len(token) > 2:
            flush()
            name, sep, raw = token[2:].partition("=")
            key, items = name.replace("-", "_"), []
            if sep:
                items.append(_scalar(raw))
        elif key is not None:
            items.append(_scalar(token))
    flush()
    return values


def _scalar(text: str) -> Any:
    """A command-line value read as YAML (``1e-4``, ``true``, ``'{"a": 1}'``), else kept as text."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (str, int, float, bool, dict, list)) or value is None else text


# -- converting ---------------------------------------------------------------------------------------
def _environment(name: str, value: Any) -> Outcome:
    text = str(value).strip()
    if name == "CUDA_VISIBLE_DEVICES":
        if text.startswith("$"):
            return needs_you("import.reason_shell_variable", value=text)
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not parts or parts[0].startswith("-"):  # empty or -1: CUDA sees no GPU, the peer trained on the CPU
            return dropped("import.reason_no_visible_gpus", value=text)
        if all(part.isdigit() for part in parts):
            return taken({"gpus": [int(part) for part in parts]})
        # GPU-<uuid> / MIG-<uuid> entries: the gpus key takes the indices nvidia-smi gives (it read "the list
        # must not be empty", the UUIDs left out as not digits)
        return needs_you("import.reason_gpu_uuids", value=text)
    if name == "NPROC_PER_NODE" and text.isdigit():
        return taken({"gpus": int(text)})
    if text.startswith("$"):
        return needs_you("import.reason_shell_variable", value=text)
    return dropped("import.reason_environment")


def _unknown(value: Any) -> Outcome:
    if is_unset(value) or truthy(value) is False:
        return dropped("import.reason_unset")
    return needs_you("import.reason_unknown")


def _convert_one(peer: str, key: str, value: Any, environment: frozenset[str] = frozenset()) -> MappingLine:
    if peer == SWIFT and key == "swift":
        return MappingLine(key, value, _stage(value))
    if key.isupper() or key in environment:  # an environment assignment before `swift sft` (or a config's ENV:)
        return MappingLine(key, value, _environment(key, value))
    if isinstance(value, str) and value.startswith("$"):
        return MappingLine(key, value, needs_you("import.reason_shell_variable", value=value))
    entry = peer_key(key, peer)
    if entry is None:
        from core.config.schema import KEY_SPECS

        if key in KEY_SPECS:  # a name both use with one meaning (ms-swift's model)
            return MappingLine(key, value, dropped("import.reason_unset") if is_unset(value) else taken({key: value}))
        return MappingLine(key, value, _unknown(value))
    return MappingLine(key, value, entry.convert(value), entry=entry)


def _check_taken(line: MappingLine) -> None:
    """A value tunedeck would refuse becomes "needs you" with tunedeck's own reason."""
    from core.config.checks import check_value
    from core.config.schema import KEY_SPECS

    clean: dict[str, Any] = {}
    for key, value in line.outcome.values.items():
        if key not in KEY_SPECS:
            continue
        try:
            checked = check_value(key, value)
        except ValueError as exc:
            line.outcome = needs_you("import.reason_refused", target=key, problem=str(exc))
            return
        # an integer the peer wrote stays one (lora_alpha: 16, not 16.0); a number key reads it as a float
        clean[key] = value if type(value) is int and checked == value else checked
    line.outcome.values.update(clean)


def convert(peer: str, values: dict[str, Any], source: str, form: str | None = None,
            environment: frozenset[str] = frozenset()) -> ImportResult:
    """The tunedeck configuration for a peer's keys, with a mapping line for every key. ``form`` is how an
    ms-swift file gives them (``SWIFT_*``; left out: a command line where ``values`` hold its ``swift``
    subcommand, else an args.json); ``environment`` names a config's ``ENV:`` entries."""
    from core.config.schema import KEY_SPECS

    if form is None and peer == SWIFT:
        form = SWIFT_COMMAND if "swift" in values else SWIFT_ARGS_JSON
    mapping = [_convert_one(peer, key, value, environment) for key, value in values.items()]
    for line in mapping:
        if line.verdict == TAKEN:
            _check_taken(line)
        if peer == SWIFT and "swift" in values and line.value is True and line.verdict == NEEDS_YOU \
                and line.outcome.reason is not None and line.outcome.reason.key == "import.reason_refused":
            # a bare `--lora_rank` on a command line reads as true: the flag's value is missing
            line.outcome = needs_you("import.reason_no_value", flag=f"--{line.key}")
    config: dict[str, Any] = {}
    owner: dict[str, str] = {}
    for line in mapping:
        if line.verdict != TAKEN:
            continue
        for key, value in list(line.outcome.values.items()):
            if key not in config or config[key] == value:
                config[key], owner[key] = value, line.key
            elif key == "method" and frozenset({config[key], value}) in _METHOD_MERGE:
                config[key], owner[key] = _METHOD_MERGE[frozenset({config[key], value})], line.key
            elif key == "gpus" and _gpus_agree(config[key], value) is not None:
                # CUDA_VISIBLE_DEVICES=0,1 NPROC_PER_NODE=2: one answer, the usual way to launch on several GPUs
                config[key] = _gpus_agree(config[key], value)
                for other in mapping:  # both lines say the GPUs the run gets
                    if other.key in (owner[key], line.key):
                        other.outcome.values[key] = config[key]
            elif key == "method" and {config[key], value} == {"qlora", "dora"}:
                # DoRA on a 4-bit model (QDoRA): peft has it, tunedeck has no method for it; said why and what to do
                dora_key, quant_key = (line.key, owner[key]) if value == "dora" else (owner[key], line.key)
                line.outcome = needs_you("import.reason_qdora", dora_key=dora_key, quant_key=quant_key)
                break
            else:
                line.outcome = needs_you("import.reason_conflict", target=key, other=owner[key],
                                         value=show_value(config[key]))
                break
    if "max_steps" in config and "epochs" in config:
        # transformers' max_steps overrides num_train_epochs (an args.json always lists both): not two answers
        del config["epochs"]
        for line in mapping:
            if line.verdict == TAKEN and "epochs" in line.outcome.values:
                line.outcome = dropped("import.reason_epochs_overridden")
    _drop_eval_steps_without_eval(peer, values, config, mapping)
    _say_eval_strategy(config, mapping)
    defaults = _peer_defaults(peer, values, config, form)  # first: a hook reads the dataset_dir LLaMA-Factory defaults to
    for line in mapping:
        hook = line.entry.in_context if line.entry is not None else None
        outcome = hook(line.value, config) if line.verdict == NEEDS_YOU and hook is not None else None
        if outcome is not None:
            line.outcome = outcome
    mapping += defaults
    if peer == SWIFT:
        _one_process_over_gpus(values, config, mapping)
    ordered = {key: config[key] for key in KEY_SPECS if key in config}
    return ImportResult(peer, source, ordered, mapping)


# The peer's key for the share of the data held out for evaluation (0 or left out: none; LLaMA-Factory's default is 0).
_EVAL_SPLIT_KEYS = {LLAMAFACTORY: "val_size", SWIFT: "split_dataset_ratio"}
# The peer's key for a separate dataset to evaluate on (tunedeck has none: it evaluates on a share of the training data).
_EVAL_DATASET_KEYS = {LLAMAFACTORY: "eval_dataset", SWIFT: "val_dataset"}


def _drop_eval_steps_without_eval(peer: str, values: dict[str, Any], config: dict[str, Any],
                                  mapping: list[MappingLine]) -> None:
    """An ``eval_steps`` where the file holds no share of the data out (``split_dataset_ratio 0``, no ``val_size``):
    the peer evaluates nothing there (or on its separate eval dataset, which tunedeck has no key for), and tunedeck
    refuses eval_steps without eval_split, so the converted file was refused as a whole. It is dropped, saying how
    to evaluate; kept where the split needs the user (a count) or
    where ms-swift's command line leaves its split to a version's default."""
    split_key = _EVAL_SPLIT_KEYS[peer]
    if "eval_steps" not in config or config.get("eval_split"):
        return
    if peer == SWIFT and split_key not in values:
        return
    if any(line.key == split_key and line.verdict == NEEDS_YOU for line in mapping):
        return
    del config["eval_steps"]
    eval_key = _EVAL_DATASET_KEYS[peer]
    separate = not is_unset(values.get(eval_key)) and truthy(values.get(eval_key)) is not False
    for line in mapping:
        if line.verdict == TAKEN and "eval_steps" in line.outcome.values:
            # with a dataset of its own to evaluate on, the peer does evaluate: said so, not "evaluates nothing"
            line.outcome = dropped("import.reason_eval_dataset_steps", eval_key=eval_key) if separate else \
                dropped("import.reason_no_eval_split", split=split_key)


def _say_eval_strategy(config: dict[str, Any], mapping: list[MappingLine]) -> None:
    """An ``eval_strategy`` line said "evaluates at each save" where the converted run holds nothing out (no
    eval_split): it evaluates nothing there. It says what the converted run does: evaluate its held-out share, or
    nothing (and how to evaluate); where the peer's strategy is ``no`` and a share is held out, that tunedeck
    evaluates it all the same."""
    held = bool(config.get("eval_split"))
    for line in mapping:
        if line.verdict != DROPPED or line.key not in ("eval_strategy", "evaluation_strategy"):
            continue
        off = str(line.value).strip().lower() in ("no", "false", "none") or line.value is False
        if held:
            key = "import.reason_eval_strategy_no_but_split" if off else "import.reason_eval_strategy"
        else:
            key = "import.reason_eval_strategy_no" if off else "import.reason_eval_strategy_nothing_held"
        line.outcome = dropped(key)


def _gpus_agree(first: Any, second: Any) -> list[int] | None:
    """The GPUs that a device list (CUDA_VISIBLE_DEVICES) and a process count (NPROC_PER_NODE) say together: the
    first ``count`` of the list, as torchrun starts that many processes on the visible devices; None where the count
    is more than the list holds (then they disagree)."""
    listed, count = (first, second) if isinstance(first, list) else (second, first)
    if not isinstance(listed, list) or not isinstance(count, int) or isinstance(count, bool) \
            or not 1 <= count <= len(listed):
        return None
    return listed[:count]


def _one_process_over_gpus(values: dict[str, Any], config: dict[str, Any], mapping: list[MappingLine]) -> None:
    """``CUDA_VISIBLE_DEVICES=0,1 swift sft ...`` without NPROC_PER_NODE is ONE ms-swift process with the model spread
    over the listed GPUs (device_map): its effective batch is micro-batch × accumulation. tunedeck trains one process
    per GPU (data-parallel), which multiplied that batch by the GPU count. The batch per process is divided instead
    (accumulation first, then the micro-batch) so the effective batch stays ms-swift's; where it does not divide over
    every listed GPU, the most of them it divides over are taken. Both lines say so."""
    gpus = config.get("gpus")
    if "NPROC_PER_NODE" in values or "CUDA_VISIBLE_DEVICES" not in values or not isinstance(gpus, list) \
            or len(gpus) < 2:
        return
    micro, accumulation = config.get("micro_batch_size", 1), config.get("gradient_accumulation")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (micro, accumulation)):
        return  # a value that needs the user: nothing to divide
    batch = micro * accumulation
    count = max(k for k in range(1, len(gpus) + 1) if batch % k == 0)
    per_process = batch // count
    new_micro = max(d for d in range(1, micro + 1) if per_process % d == 0)
    new = {"gpus": gpus[:count], "micro_batch_size": new_micro, "gradient_accumulation": per_process // new_micro}
    listed = ",".join(str(gpu) for gpu in gpus)
    for line in mapping:
        if line.verdict != TAKEN:
            continue
        changed = {key: new[key] for key in line.outcome.values if key in new and line.outcome.values[key] != new[key]}
        if line.key == "CUDA_VISIBLE_DEVICES":
            line.outcome.values["gpus"] = new["gpus"]
            key = "import.note_swift_one_process" if count == len(gpus) else "import.note_swift_one_process_fewer"
            line.outcome.reason = Message(key, gpus=listed, count=count, batch=batch)
        elif changed and set(changed) <= {"micro_batch_size", "gradient_accumulation"}:
            line.outcome.values.update(changed)
            line.outcome.reason = Message("import.note_swift_batch_split", value=show_value(line.value), count=count,
                                          batch=batch)
    config.update(new)


LF_DATASET_DIR = "data"  # LLaMA-Factory's dataset_dir when its file gives none


def _peer_defaults(peer: str, values: dict[str, Any], config: dict[str, Any],
                   form: str | None = None) -> list[MappingLine]:
    """The peer's defaults for keys the file leaves out, where they differ from tunedeck's: LoRA keys, the batch,
    accumulation, learning rate, schedule and warmup the peer trains with (``PEER_TRAIN_DEFAULTS``), ms-swift's
    adam_beta2 and its drop of over-long samples, and LLaMA-Factory's hub, dataset folder and packing of
    pre-training text."""
    lines: list[MappingLine] = []
    if peer == SWIFT and form == SWIFT_ARGS_JSON:
        return lines  # an args.json lists every value itself (a config file, like a command line, does not)
    defaults = dict(PEER_DEFAULTS.get(peer, {})) if config.get("method", "lora") != "full" else {}
    if peer == LLAMAFACTORY and defaults:
        defaults["lora_alpha"] = 2 * int(config.get("lora_rank", defaults["lora_rank"]))
    given = set(values)
    for key, (source_keys, value) in PEER_TRAIN_DEFAULTS.get(peer, {}).items():
        defaults[key] = value(values, config) if callable(value) else value
        if set(source_keys) & set(values):
            given.add(key)
    for key, value in defaults.items():
        if key not in config and key not in given:  # a key the file gives (even one that needs you) wins
            config[key] = value
            lines.append(MappingLine(key, value, taken({key: value}, Message("import.note_peer_default",
                                                                              peer=PEER_NAMES[peer])),
                                     default=True))
    if peer == LLAMAFACTORY and "dataset" in config and not {"dataset_dir", "dataset_info"} & {*values, *config} \
            and (Path(LF_DATASET_DIR) / "dataset_info.json").is_file():
        # LLaMA-Factory looks dataset names up in ./data/dataset_info.json (its dataset_dir default, from the
        # current directory: its examples are run from its own folder): made absolute, as the launch needs
        folder = str(Path(LF_DATASET_DIR).resolve())
        config["dataset_dir"] = folder
        lines.append(MappingLine("dataset_dir", folder, taken({"dataset_dir": folder},
                                                              Message("import.note_lf_dataset_dir")), default=True))
    if peer == LLAMAFACTORY and str(values.get("stage", "")).strip().lower() == "pt" \
            and not {"packing", "neat_packing"} & set(values) and "packing" not in config:
        # LLaMA-Factory's packing (None) turns on for pre-training: its steps read packed rows of cutoff_len
        config["packing"] = True
        lines.append(MappingLine("packing", True, taken({"packing": True}, Message("import.note_lf_pt_packing")),
                                 default=True))
    if peer == LLAMAFACTORY and "hub" not in config and isinstance(config.get("model"), str) \
            and not _is_local_model(config["model"]):
        config["hub"] = "huggingface"
        lines.append(MappingLine("hub", "huggingface", taken({"hub": "huggingface"},
                                                             Message("import.note_lf_hub")), default=True))
    return lines


def _is_local_model(model: str) -> bool:
    from core.assets import resolve_model_name

    return Path(resolve_model_name(model)).expanduser().exists()


def import_file(path: str | Path) -> ImportResult:
    """Convert a peer's file (see ``read_peer_file``); raises ``PeerFileError``."""
    peer, values, form, environment = _read_peer_file(path)
    result = convert(peer, values, str(path), form, environment)
    _relative_to_file(result.config, Path(path).resolve().parent)
    return result


def import_command(tokens: list[str]) -> ImportResult:
    """Convert a ``swift sft ...`` command given as arguments (split already, never by a shell)."""
    values = parse_swift_command(list(tokens))
    return convert(SWIFT, values, " ".join(shlex.quote(token) for token in tokens[:3]) + " ...")


def _relative_to_file(config: dict[str, Any], base: Path) -> None:
    """A user DeepSpeed JSON named relative to the peer's file is found from there too."""
    value = config.get("deepspeed")
    if isinstance(value, str) and not Path(value).expanduser().is_absolute() and not Path(value).exists() \
            and (base / value).exists():
        config["deepspeed"] = str(base / value)


# "Needs you" answers that leave what trains as the file describes it (a speed or bookkeeping setting
# tunedeck has its own way for): the converted file trains with them said. Every other one (a preference
# stage, a method, quantisation, scheduler, optimizer, loss or sampling tunedeck lacks, a key it does not
# know, a value it refuses, two keys saying different things) would train something else than the file
# describes: `tunedeck train` refuses the file until it is decided (the key removed from the file, or the
# difference accepted in a converted YAML, ``tunedeck import FILE -o run.yaml``).
NON_BLOCKING_REASONS = ("import.reason_attention", "import.reason_predict", "import.reason_unsloth",
                        "import.reason_streaming", "import.reason_deepspeed_inline",
                        "import.reason_dataset_dir")


def blocking_lines(result: ImportResult, overrides: list[str] | tuple[str, ...] = ()) -> list[MappingLine]:
    """The mapping lines that keep ``tunedeck train`` from training the converted file as it is. A line whose
    tunedeck key a ``key=value`` override sets is decided by it (``train run.sh model=Qwen/A`` where the file says
    ``--model $MODEL``)."""
    from core.config.loader import parse_override

    decided: set[str] = set()
    for text in overrides:
        try:
            decided.add(parse_override(text)[0])
        except ValueError:
            continue  # said by the overrides' own check
    return [line for line in result.mapping
            if line.verdict == NEEDS_YOU and (line.outcome.reason is None
                                              or line.outcome.reason.key not in NON_BLOCKING_REASONS)
            and _target_key(line, result.peer) not in decided]


def _target_key(line: MappingLine, peer: str) -> str | None:
    """The tunedeck key a peer's line stands for (its table entry's, or the same name), None where it has none."""
    from core.config.schema import KEY_SPECS

    entry = line.entry or peer_key(line.key, peer)
    if entry is not None and entry.hint:
        return entry.hint.partition(":")[0].strip()
    return line.key if line.key in KEY_SPECS else None


def _keep_peer_batch(result: ImportResult, values: dict[str, Any], locations: dict[str, tuple[str, int | None]],
                     overrides: list[str]) -> list[Any]:
    """``train sw.sh gpus=[0]`` of a file trained on two GPUs kept the file's accumulation per process (for
    ``CUDA_VISIBLE_DEVICES=0,1 swift sft`` the import's halved one), so the effective batch silently fell by half.
    A ``gpus`` override without a batch override now divides the peer's effective batch over the GPUs it gives (the
    accumulation first, then the micro-batch), said as a warning; where it does not divide, or the GPUs are the box's
    (``all``), the warning says the effective batch changes and what keeps it."""
    from core.config.checks import check_value
    from core.config.issues import WARNING, ConfigIssue
    from core.config.loader import OVERRIDE_SOURCE, parse_override

    given: dict[str, str] = {}
    for text in overrides:
        try:
            given[parse_override(text)[0]] = text.strip()
        except ValueError:
            continue  # said by the overrides' own check
    batch = result.peer_batch
    if "gpus" not in given or {"micro_batch_size", "gradient_accumulation"} & set(given) or batch is None:
        return []
    try:
        gpus = check_value("gpus", values["gpus"])
    except ValueError:
        return []  # said by the value's own check
    from core.config.schema import RunConfig

    micro = result.config.get("micro_batch_size", RunConfig.micro_batch_size)
    accumulation = result.config.get("gradient_accumulation", RunConfig.gradient_accumulation)
    count = len(gpus) if isinstance(gpus, list) else gpus if type(gpus) is int else None
    where = f"{OVERRIDE_SOURCE} ({given['gpus']})"
    if count and batch % count == 0:
        per_process = batch // count
        new_micro = max(d for d in range(1, micro + 1) if per_process % d == 0)
        new_accumulation = per_process // new_micro
        if (new_micro, new_accumulation) == (micro, accumulation):
            return []  # the file's own GPU count: nothing changes
        values["micro_batch_size"], values["gradient_accumulation"] = new_micro, new_accumulation
        locations["micro_batch_size"] = locations["gradient_accumulation"] = (where, None)
        message = t("import.gpus_keep_batch", peer=result.peer_name, batch=batch, micro=new_micro,
                    accumulation=new_accumulation, gpus=given["gpus"], was_micro=micro, was_accumulation=accumulation)
    else:
        shown = t("import.gpus_box", per=micro * accumulation) if count is None else str(micro * accumulation * count)
        message = t("import.gpus_change_batch", peer=result.peer_name, batch=batch, micro=micro,
                    accumulation=accumulation, now=shown)
    return [ConfigIssue(where, None, "gpus", message, WARNING)]


def load_imported_config(result: ImportResult, overrides: list[str], gpu_caps: Any = None,
                         for_training: bool = False) -> Any:
    """The checked ``RunConfig`` of a converted file with ``key=value`` overrides applied on top (raises
    ``ConfigError`` like ``load_run_config``)."""
    from core.config.loader import apply_overrides, config_from_mapping

    values = dict(result.config)
    locations: dict[str, tuple[str, int | None]] = {key: (result.source, None) for key in values}
    issues = apply_overrides(values, locations, overrides)
    issues += _keep_peer_batch(result, values, locations, overrides)
    return config_from_mapping(values, locations, result.source, gpu_caps=gpu_caps, prior_issues=issues,
                               for_training=for_training)
