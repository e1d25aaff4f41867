"""Configurations from LLaMA-Factory and ms-swift: ``tunedeck import``, ``train FILE`` on a peer's file,
``train --check``, the peers' names in "did you mean", a user's DeepSpeed JSON, and LoRA targets checked
against the model before anything starts.

The peer files here are written in each peer's documented shape (LLaMA-Factory's
``examples/train_lora/*.yaml``, the ``args.json`` ms-swift writes into its output folder, ms-swift's
``swift sft`` command line); none is copied from those projects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from core.atomic_file import umask_modes
from core.config import ConfigError, load_run_config
from core.config.checks import check_value, unknown_key_message
from core.config.importers import import_command, import_file, read_peer_file
from core.config.peers import DROPPED, NEEDS_YOU, TAKEN
from core.i18n import set_language

ROOT = Path(__file__).resolve().parents[2]

LLAMAFACTORY_YAML = """\
### model
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all

### dataset
dataset: identity,alpaca_en_demo
template: llama3
cutoff_len: 2048
max_samples: 1000
overwrite_cache: true
preprocessing_num_workers: 16

### output
output_dir: saves/llama3-8b/lora/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
"""

SWIFT_ARGS = {
    "model": "Qwen/Qwen2.5-7B-Instruct", "model_type": "qwen2_5", "model_revision": None,
    "torch_dtype": "bfloat16", "attn_impl": "flash_attn", "template": "qwen2_5", "system": None,
    "max_length": 4096, "dataset": ["AI-ModelScope/alpaca-gpt4-data-zh#500", "swift/self-cognition#500"],
    "val_dataset": [], "split_dataset_ratio": 0.01, "dataset_num_proc": 1, "streaming": False,
    "train_type": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.05,
    "target_modules": ["all-linear"], "use_dora": False, "quant_bits": 4, "quant_method": "bnb",
    "output_dir": "/root/output/v0-20250101-120000", "per_device_train_batch_size": 2,
    "per_device_eval_batch_size": 1, "gradient_accumulation_steps": 16, "learning_rate": 0.0001,
    "weight_decay": 0.1, "max_grad_norm": 1.0, "num_train_epochs": 1.0, "max_steps": -1,
    "lr_scheduler_type": "cosine", "warmup_ratio": 0.05, "warmup_steps": 0, "logging_steps": 5,
    "save_steps": 50.0, "save_total_limit": 2, "eval_steps": 50.0, "seed": 42, "bf16": True, "fp16": False,
    "gradient_checkpointing": True, "deepspeed": None, "model_author": ["swift"], "model_name": ["swift-robot"],
    "report_to": ["tensorboard"], "loss_scale": "default", "lr_warmup_frobnicate": 3,
}

SWIFT_SCRIPT = """\
# 2 GPUs, 27 GiB each
nproc_per_node=2

CUDA_VISIBLE_DEVICES=0,1 \\
NPROC_PER_NODE=$nproc_per_node \\
swift sft \\
    --model Qwen/Qwen2.5-7B-Instruct \\
    --train_type lora \\
    --torch_dtype bfloat16 \\
    --dataset 'AI-ModelScope/alpaca-gpt4-data-en#500' 'swift/self-cognition#500' \\
    --num_train_epochs 1 \\
    --per_device_train_batch_size 1 \\
    --learning_rate 1e-4 \\
    --target_modules q_proj v_proj \\
    --gradient_accumulation_steps 8 \\
    --max_length 2048 \\
    --deepspeed zero3_offload \\
    --system 'You are a helpful assistant.' \\
    --gradient_checkpointing_kwargs '{"use_reentrant": false}'
"""


@pytest.fixture(autouse=True)
def _english():
    set_language("en")
    yield


def _line(result, key: str):
    return next(line for line in result.mapping if line.key == key and not line.default)


def _tunedeck(home: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1",
                                            "TUNEDECK_LANG": "en", "LANG": "C.UTF-8"})


def _data(path: Path) -> Path:
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in (("Say yes.", "Yes."), ("A pet?", "A dog."), ("Sky colour?", "Blue."))]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# -- import: LLaMA-Factory ---------------------------------------------------------------------------
def test_llamafactory_yaml_converts_key_by_key(tmp_path):
    path = tmp_path / "llama3_lora_sft.yaml"
    path.write_text(LLAMAFACTORY_YAML, encoding="utf-8")
    result = import_file(path)
    assert result.peer == "llamafactory"
    assert result.config == {
        "model": "meta-llama/Meta-Llama-3-8B-Instruct", "hub": "huggingface",
        "dataset": ["identity", "alpaca_en_demo"], "method": "lora", "lora_rank": 8,
        "lora_alpha": 16,  # LLaMA-Factory's default: twice the rank (tunedeck's own would be 32)
        "lora_dropout": 0.0, "lora_targets": "all-linear", "precision": "bf16", "max_seq_len": 2048,
        "micro_batch_size": 1, "gradient_accumulation": 8, "epochs": 3.0, "learning_rate": 1e-4,
        "lr_scheduler": "cosine", "warmup_ratio": 0.1, "save_steps": 500, "logging_steps": 10,
    }
    verdicts = {line.key: line.verdict for line in result.mapping if not line.default}
    assert set(verdicts) == set(yaml.safe_load(LLAMAFACTORY_YAML))  # every key accounted for
    for key in ("do_train", "stage", "template", "overwrite_cache", "preprocessing_num_workers", "plot_loss",
                "overwrite_output_dir", "output_dir", "ddp_timeout", "trust_remote_code"):
        assert verdicts[key] == DROPPED, key
    assert verdicts["max_samples"] == NEEDS_YOU
    assert _line(result, "bf16").text() == "bf16: true → taken as precision=bf16"
    assert _line(result, "cutoff_len").text() == "cutoff_len: 2048 → taken as max_seq_len=2048"
    assert _line(result, "do_train").text() == "do_train: true → dropped: tunedeck train always trains"
    assert "first 1000 records" in _line(result, "max_samples").text()
    assert "NAME#" not in _line(result, "max_samples").text()  # a draw at random, repeating: not the first N
    # The YAML is a tunedeck file: it loads (with the data and model it names) and lists what needs you.
    text = result.to_yaml()
    assert text.startswith("# tunedeck run configuration converted by tunedeck import")
    assert "# max_samples: 1000 → needs you" in text
    assert yaml.safe_load(text) == result.config
    assert "{" not in text and f"model: {result.config['model']}" in text.splitlines()  # block style


def test_mapping_spells_values_as_yaml_and_keeps_the_peers_integers(tmp_path):
    """A flag is true/false in a reason (not Python's True), and an integer the peer wrote stays one
    (lora_alpha: 16, not 16.0) in the mapping and the converted YAML; a float it wrote stays a float."""
    path = tmp_path / "lf.yaml"
    path.write_text("model_name_or_path: /nope/model\nstage: sft\nfinetuning_type: lora\nlora_rank: 8\n"
                    "lora_alpha: 16\nuse_unsloth: true\nnum_train_epochs: 3.0\n", encoding="utf-8")
    result = import_file(path)
    assert _line(result, "use_unsloth").text().startswith("use_unsloth: true → needs you: unsloth is not used (true);")
    assert _line(result, "lora_alpha").text() == "lora_alpha: 16 → taken as lora_alpha=16"
    assert _line(result, "num_train_epochs").text() == "num_train_epochs: 3.0 → taken as epochs=3.0"
    text = result.to_yaml()
    assert "lora_alpha: 16\n" in text and "(True)" not in text


def test_llamafactory_quantization_and_dora_pick_the_method(tmp_path):
    path = tmp_path / "qlora.yaml"
    path.write_text("model_name_or_path: /nope/model\nstage: sft\nfinetuning_type: lora\nquantization_bit: 4\n"
                    "quantization_method: bnb\nlora_rank: 32\nlora_alpha: 64\nflash_attn: fa2\n"
                    "val_size: 0.1\ndeepspeed: ds_z2.json\n", encoding="utf-8")
    (tmp_path / "ds_z2.json").write_text("{}", encoding="utf-8")
    result = import_file(path)
    assert result.config["method"] == "qlora" and result.config["attn"] == "flash"
    assert result.config["lora_alpha"] == 64 and result.config["eval_split"] == 0.1
    assert result.config["deepspeed"] == str(tmp_path / "ds_z2.json")  # found beside the peer's file
    assert "hub" not in result.config or result.config["hub"] == "huggingface"
    path.write_text("model_name_or_path: x/y\nstage: dpo\nfinetuning_type: freeze\nquantization_bit: 8\n",
                    encoding="utf-8")
    result = import_file(path)
    assert {line.key for line in result.mapping if line.verdict == NEEDS_YOU} == \
        {"stage", "finetuning_type", "quantization_bit"}
    assert "tunedeck trains SFT only" in _line(result, "stage").text()


# -- import: ms-swift --------------------------------------------------------------------------------
def test_llamafactory_trains_with_transformers_defaults_for_the_keys_it_leaves_out(tmp_path):
    """LLaMA-Factory inherits transformers' TrainingArguments defaults: a file with a batch of 2 and no
    gradient_accumulation_steps trains at 2x1, learning rate 5e-5, linear, no warmup. The converted run took
    tunedeck's (8 accumulation steps: an effective batch 8 times larger, 1e-4, cosine, 3% warmup)."""
    path = tmp_path / "lf.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\nfinetuning_type: lora\n"
                    "dataset: d.jsonl\nper_device_train_batch_size: 2\n", encoding="utf-8")
    result = import_file(path)
    config = result.config
    assert (config["micro_batch_size"], config["gradient_accumulation"]) == (2, 1)
    assert (config["learning_rate"], config["lr_scheduler"], config["warmup_ratio"]) == (5e-5, "linear", 0.0)
    defaults = [line.text() for line in result.mapping if line.default]
    assert "gradient_accumulation (peer default): 1 → taken as gradient_accumulation=1 (LLaMA-Factory's default, " \
           "left out of the file)" in defaults
    # a batch left out is transformers' 8; a key the file gives (warmup_steps for the warmup) decides itself
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nfinetuning_type: full\ndataset: d.jsonl\n"
                    "warmup_steps: 10\nlearning_rate: 2.0e-5\n", encoding="utf-8")
    config = import_file(path).config
    assert (config["micro_batch_size"], config["gradient_accumulation"], config["learning_rate"]) == (8, 1, 2e-5)
    assert config["warmup_steps"] == 10 and "warmup_ratio" not in config


def test_swift_command_line_trains_with_ms_swifts_accumulation_and_warmup(tmp_path):
    """ms-swift's gradient_accumulation_steps None is ceil(16 / per_device_train_batch_size / processes) and its
    warmup_ratio 0: a `swift sft` line without them trained at an effective batch of 16 with no warmup, the
    converted run at tunedeck's 8 accumulation steps with 3% warmup."""
    base = ["swift", "sft", "--model", "Qwen/Qwen2.5-0.5B", "--dataset", "d.jsonl"]
    assert import_command(base).config["gradient_accumulation"] == 16
    config = import_command([*base, "--per_device_train_batch_size", "3"]).config
    assert (config["gradient_accumulation"], config["warmup_ratio"]) == (6, 0.0)
    config = import_command(["NPROC_PER_NODE=2", *base, "--per_device_train_batch_size", "2"]).config
    assert config["gradient_accumulation"] == 4  # 16 / 2 / 2 processes
    told = import_command([*base, "--gradient_accumulation_steps", "2", "--warmup_ratio", "0.1"]).config
    assert (told["gradient_accumulation"], told["warmup_ratio"]) == (2, 0.1)
    assert "warmup_ratio" not in import_command([*base, "--warmup_steps", "5"]).config


def test_a_separate_eval_dataset_is_said_as_one_tunedeck_does_not_have(tmp_path):
    """A LLaMA-Factory eval_dataset / an ms-swift val_dataset evaluates on a dataset of its own: its eval_steps was
    dropped as 'nothing is held out to evaluate, so the peer evaluates nothing' (untrue) and the dataset key was an
    unknown one. tunedeck has no separate eval dataset (it evaluates on a held-out share of the training data): both
    lines now say so, and how to evaluate (eval_split)."""
    path = tmp_path / "lf.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nfinetuning_type: lora\ndataset: d.jsonl\n"
                    "eval_dataset: e.jsonl\neval_steps: 100\n", encoding="utf-8")
    for result, key in ((import_file(path), "eval_dataset"),
                        (import_command(["swift", "sft", "--model", "Qwen/Qwen2.5-0.5B", "--dataset", "d.jsonl",
                                         "--val_dataset", "e.jsonl", "--eval_steps", "50",
                                         "--split_dataset_ratio", "0"]), "val_dataset")):
        steps = _line(result, "eval_steps")
        assert steps.verdict == DROPPED and "evaluates nothing" not in steps.text()
        assert f"the peer evaluates on its {key}, a separate dataset" in steps.text()
        line = _line(result, key)
        assert line.verdict == NEEDS_YOU and "no such setting" not in line.text()
        assert "tunedeck evaluates only on a share of the training data held out (eval_split)" in line.text()
        assert "eval_steps" not in result.config


def test_swift_args_json_converts_key_by_key(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps(SWIFT_ARGS, indent=2), encoding="utf-8")
    result = import_file(path)
    assert result.peer == "swift"
    config = result.config
    assert config["model"] == "Qwen/Qwen2.5-7B-Instruct" and config["method"] == "qlora"
    assert config["dataset"] == ["AI-ModelScope/alpaca-gpt4-data-zh#500", "swift/self-cognition#500"]
    assert (config["lora_rank"], config["lora_alpha"], config["lora_targets"]) == (16, 32, "all-linear")
    assert (config["max_seq_len"], config["micro_batch_size"], config["gradient_accumulation"]) == (4096, 2, 16)
    assert (config["precision"], config["attn"], config["eval_split"], config["save_steps"]) == \
        ("bf16", "flash", 0.01, 50)
    assert "max_steps" not in config and "warmup_steps" not in config  # HF's -1 and 0 mean "not set"
    assert "hub" not in config  # ms-swift's default hub is ModelScope, as tunedeck's
    verdicts = {line.key: line.verdict for line in result.mapping}
    assert set(verdicts) == set(SWIFT_ARGS)
    assert verdicts["model_name"] == DROPPED and "self-cognition" in _line(result, "model_name").text()
    assert verdicts["max_steps"] == DROPPED and verdicts["loss_scale"] == DROPPED
    assert verdicts["lr_warmup_frobnicate"] == NEEDS_YOU  # a key nobody knows is not silently lost
    assert not any(line.default for line in result.mapping)  # args.json lists every value itself


def test_a_peers_file_saved_with_a_bom_reads_as_without_one(tmp_path):
    """A Windows editor saves UTF-8 with a byte-order mark: the args.json was refused ("not valid JSON:
    Unexpected UTF-8 BOM"), a swift script was "not a peer file", and plan named no line of the args.json."""
    from core.plan.from_config import load_plan_config

    plain, marked = tmp_path / "plain" / "args.json", tmp_path / "bom" / "args.json"
    for path, prefix in ((plain, b""), (marked, b"\xef\xbb\xbf")):
        path.parent.mkdir()
        path.write_bytes(prefix + json.dumps(SWIFT_ARGS, indent=2).encode("utf-8"))
    assert import_file(marked).to_dict() | {"source": None} == import_file(plain).to_dict() | {"source": None}
    lines = load_plan_config(str(marked)).lines
    assert lines and lines == load_plan_config(str(plain)).lines
    script = tmp_path / "train.sh"
    script.write_bytes(b"\xef\xbb\xbf" + SWIFT_SCRIPT.encode("utf-8"))
    assert import_file(script).peer == "swift"


def test_swift_command_line_in_a_script_and_as_arguments(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text(SWIFT_SCRIPT, encoding="utf-8")
    result = import_file(script)
    config = result.config
    assert config["gpus"] == [0, 1] and config["zero_stage"] == 3 and config["offload"] == "all"
    assert config["dataset"] == ["AI-ModelScope/alpaca-gpt4-data-en#500", "swift/self-cognition#500"]
    assert config["lora_targets"] == ["q_proj", "v_proj"] and config["learning_rate"] == 1e-4
    assert config["lora_rank"] == 8 and config["lora_alpha"] == 32  # ms-swift's defaults, named as such
    # ms-swift 4.6 trains with adam_beta2 0.95 and drops a sample past max_length unless told otherwise
    assert config["adam_beta2"] == 0.95 and config["overlong"] == "drop"
    assert _line(result, "NPROC_PER_NODE").verdict == NEEDS_YOU  # $nproc_per_node is not expanded
    assert _line(result, "system").verdict == NEEDS_YOU
    assert _line(result, "gradient_checkpointing_kwargs").verdict == DROPPED
    defaults = [line.text() for line in result.mapping if line.default]
    assert "lora_rank (peer default): 8 → taken as lora_rank=8 (ms-swift's default, left out of the file)" in defaults

    tokens = ["swift", "sft", "--model", "Qwen/Qwen2.5-0.5B", "--train_type", "full", "--dataset", "d.jsonl",
              "--use_hf", "true", "--max_length=1024", "--packing", "--lr_scheduler_type", "polynomial"]
    result = import_command(tokens)
    assert result.config == {"model": "Qwen/Qwen2.5-0.5B", "hub": "huggingface", "dataset": "d.jsonl",
                             "method": "full", "max_seq_len": 1024, "packing": True, "adam_beta2": 0.95,
                             "overlong": "drop", "gradient_accumulation": 16, "warmup_ratio": 0.0}
    # a line that says them itself keeps its own values
    told = import_command([*tokens[:8], "--adam_beta2", "0.999", "--truncation_strategy", "right"]).config
    assert (told["adam_beta2"], told["overlong"]) == (0.999, "cut")
    assert _line(result, "lr_scheduler_type").verdict == NEEDS_YOU
    # Values are data: a model id with shell syntax stays one string, nothing is run.
    result = import_command(["swift", "sft", "--model", "$(touch /tmp/x)", "--dataset", "a;b"])
    assert _line(result, "model").verdict == NEEDS_YOU and result.config["dataset"] == "a;b"


def test_swift_yaml_config_reads_as_its_command_line(tmp_path):
    """``swift sft x.yaml`` (ms-swift 4.x, swift/cli/main.py) reads the file as its command line and sets its
    ``ENV:`` entries as environment variables. The import dropped ENV whole ("an environment variable tunedeck
    does not read": the GPUs lost) and, taking the file for an args.json, gave none of ms-swift's defaults
    (lora_rank 8, lora_alpha 32, adam_beta2 0.95, ...): a YAML config converts as the equivalent command line."""
    config = tmp_path / "sft.yaml"
    config.write_text("ENV:\n  NPROC_PER_NODE: 2\n  CUDA_VISIBLE_DEVICES: '0,1'\n  http_proxy: http://proxy:3128\n"
                      "model: Qwen/Qwen2.5-0.5B-Instruct\ntuner_type: lora\ndataset: d.jsonl\n"
                      "per_device_train_batch_size: 1\n", encoding="utf-8")
    result = import_file(config)
    command = import_command(["NPROC_PER_NODE=2", "CUDA_VISIBLE_DEVICES=0,1", "swift", "sft", "--model",
                              "Qwen/Qwen2.5-0.5B-Instruct", "--tuner_type", "lora", "--dataset", "d.jsonl",
                              "--per_device_train_batch_size", "1"])
    assert result.config == command.config
    assert result.config["gpus"] == [0, 1] and result.config["gradient_accumulation"] == 8  # 16 / 1 / 2 GPUs
    assert (result.config["lora_rank"], result.config["lora_alpha"], result.config["adam_beta2"]) == (8, 32, 0.95)
    assert _line(result, "CUDA_VISIBLE_DEVICES").verdict == TAKEN and _line(result, "NPROC_PER_NODE").verdict == TAKEN
    assert not any(line.key == "ENV" for line in result.mapping)
    # an ENV entry whatever its case is an environment variable, not an ms-swift key that "needs you"
    assert "an environment variable tunedeck does not read" in _line(result, "http_proxy").text()
    # ms-swift takes a JSON config the same way; one with ENV is never its args.json
    as_json = tmp_path / "sft.json"
    as_json.write_text(json.dumps({"ENV": {"CUDA_VISIBLE_DEVICES": "1"}, "model": "Qwen/Qwen2.5-0.5B-Instruct",
                                   "dataset": "d.jsonl"}), encoding="utf-8")
    result = import_file(as_json)
    assert result.config["gpus"] == [1] and result.config["lora_rank"] == 8
    broken = tmp_path / "broken.yaml"
    broken.write_text("ENV: [CUDA_VISIBLE_DEVICES=0]\nmodel: Qwen/Qwen2.5-0.5B-Instruct\ntuner_type: lora\n",
                      encoding="utf-8")
    from core.config.importers import PeerFileError
    with pytest.raises(PeerFileError, match=r"broken.yaml: ENV: .* is not a mapping"):
        import_file(broken)


def test_a_json_config_without_env_gets_ms_swifts_defaults_and_a_renamed_args_json_does_not(tmp_path):
    """``swift sft --config sft.json`` reads a JSON as its command line, as a YAML: one a person wrote without
    ``ENV`` was taken for an args.json and got none of ms-swift's defaults (tunedeck's lora_rank, accumulation and
    adam_beta2 trained instead, said nowhere). Only a file named args.json is read as the dump that lists every
    value; a dump renamed leaves no key out, so ms-swift's defaults add nothing to it."""
    keys = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "tuner_type": "lora", "dataset": "d.jsonl"}
    written = tmp_path / "sft.json"
    written.write_text(json.dumps(keys), encoding="utf-8")
    yaml_twin = tmp_path / "sft.yaml"
    yaml_twin.write_text(yaml.safe_dump(keys), encoding="utf-8")
    result = import_file(written)
    assert result.config == import_file(yaml_twin).config
    assert (result.config["lora_rank"], result.config["gradient_accumulation"], result.config["adam_beta2"]) == \
        (8, 16, 0.95)
    data = tmp_path / "d.jsonl"
    data.write_text('{"instruction": "q", "output": "a"}\n', encoding="utf-8")
    dump = _swift_args_json(tmp_path / "args.json", data)
    renamed = tmp_path / "run3_args.json"
    renamed.write_text(dump.read_text(encoding="utf-8"), encoding="utf-8")
    assert not any(line.default for line in import_file(renamed).mapping)
    assert import_file(renamed).config == import_file(dump).config


def test_files_that_are_not_a_peers_config(tmp_path):
    from core.config.importers import PeerFileError, detect_peer

    tunedeck = tmp_path / "run.yaml"
    tunedeck.write_text("model: tiny\ndataset: d.jsonl\nbf16: true\n", encoding="utf-8")
    assert detect_peer(tunedeck) is None  # a tunedeck YAML with one peer key is not converted
    infer = tmp_path / "infer.sh"
    infer.write_text("swift infer --model x\n", encoding="utf-8")
    with pytest.raises(PeerFileError):
        read_peer_file(infer)
    broken = tmp_path / "args.json"
    broken.write_text('{\n  "model": "x",\n  "train_type": lora\n}\n', encoding="utf-8")
    with pytest.raises(PeerFileError, match=r"args.json:3: not valid JSON"):
        read_peer_file(broken)


def test_a_yaml_error_and_a_duplicate_key_are_said_with_file_and_line(tmp_path):
    """A tab-indented LLaMA-Factory file was 'not a LLaMA-Factory YAML' without a word about line 3; a key
    given twice was read with the last one winning. Both are refused as a tunedeck YAML refuses them."""
    from core.config.importers import PeerFileError

    tab = tmp_path / "tab.yaml"
    tab.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\n\tfinetuning_type: lora\n", encoding="utf-8")
    with pytest.raises(PeerFileError, match=r"tab.yaml:3: not valid YAML: found character '\\t'.*never tabs"):
        read_peer_file(tab)
    dup = tmp_path / "dup.yaml"
    dup.write_text("model_name_or_path: Qwen/A\nstage: sft\nmodel_name_or_path: Qwen/B\n", encoding="utf-8")
    with pytest.raises(PeerFileError, match=r"dup.yaml:3: model_name_or_path: given twice \(first on line 1\)"):
        read_peer_file(dup)
    args = tmp_path / "args.json"
    args.write_text('{"model": "a/b", "train_type": "lora", "train_type": "full"}', encoding="utf-8")
    with pytest.raises(PeerFileError, match=r"args.json: train_type: given twice"):
        read_peer_file(args)


def test_a_swift_flag_without_its_value_is_one_clear_problem(tmp_path):
    result = import_command(["swift", "sft", "--model", "Qwen/A", "--lora_rank"])
    lines = [line for line in result.mapping if line.key == "lora_rank"]
    assert len(lines) == 1 and lines[0].verdict == NEEDS_YOU  # no "peer default: 8 → taken" beside it
    assert lines[0].text().endswith("--lora_rank is given without a value; write the value after it")
    assert "lora_rank" not in result.config
    switch = import_command(["swift", "sft", "--model", "Qwen/A", "--gradient_checkpointing"])
    assert _line(switch, "gradient_checkpointing").verdict == TAKEN  # a bare switch still means true


def test_import_options_after_the_dashes_are_refused(tmp_path):
    """`-o x.yaml` after `--` was swallowed as values of the last swift flag and the YAML went to stdout."""
    done = _tunedeck(tmp_path / "home", "import", "--", "swift", "sft", "--model", "Qwen/A", "--bogus_flag", "1",
                     "-o", str(tmp_path / "x.yaml"), cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert "-o comes after '--'" in done.stderr and not (tmp_path / "x.yaml").exists()


# -- the suggestion table ----------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "says"), [
    ("bf16", "tunedeck says 'precision: bf16'"),
    ("stage", "not needed in tunedeck: tunedeck trains SFT"),
    ("deepspeed_config", None),
    ("model_name", "the model to train is 'model'"),
    ("cutoff_len", "'max_seq_len: 2048'"),
    ("num_train_epochs", "'epochs: 3'"),
    ("finetuning_type", "'method: lora'"),
    ("quantization_bit", "'method: qlora'"),
    ("template", "the tokenizer's own chat template"),
    ("max_samples", "tunedeck has no equivalent: LLaMA-Factory trains on the first N records"),
    ("truncation_strategy", "ms-swift name; tunedeck says 'overlong: drop'"),
    ("per_device_train_batch_size", "'micro_batch_size: 1'"),
    ("gradient_accumulation_steps", "'gradient_accumulation: 8'"),
    ("lora_target", "'lora_targets: all-linear'"),
    ("do_train", "not needed in tunedeck: tunedeck train always trains"),
    ("overwrite_cache", "not needed in tunedeck"),
])
def test_unknown_keys_get_the_peers_meaning_before_edit_distance(key, says):
    message = unknown_key_message(key)
    if says is None:
        assert "seed" not in message
    else:
        assert says in message, message
    assert "pure_bf16" not in message and "zero_stage" not in message


def test_peer_keys_in_a_tunedeck_yaml_are_reported_with_their_meaning(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: tiny\ndataset: d.jsonl\nbf16: true\ncutoff_len: 512\nlora_rank: 8\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_run_config(path)
    text = str(caught.value)
    assert "run.yaml:3: bf16: LLaMA-Factory / ms-swift name; tunedeck says 'precision: bf16'" in text
    assert "run.yaml:4: cutoff_len: LLaMA-Factory name; tunedeck says 'max_seq_len: 2048'" in text
    assert unknown_key_message("lora_rnak") == "unknown key; did you mean 'lora_rank'?"  # edit distance still


@pytest.mark.parametrize("key", ["rank", "vera_rank", "task_type", "log_level", "label_smoothing_factor"])
def test_keys_listed_only_for_a_full_dump_give_no_peer_answer_in_a_tunedeck_yaml(key):
    """The table's entries for an args.json's ~200 keys answered the "did you mean" of a tunedeck YAML:
    ``rank: 16`` got "ms-swift name; not needed in tunedeck: set by the launcher" instead of lora_rank, and
    ``task_type`` said "the run would train without it", untrue where an unknown key is refused."""
    message = unknown_key_message(key)
    assert "ms-swift" not in message and "would train without it" not in message, message
    if key.endswith("rank"):
        assert message == "unknown key; did you mean 'lora_rank'?"


def test_rank_in_a_tunedeck_yaml_suggests_lora_rank(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: tiny\ndataset: d.jsonl\nrank: 16\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_run_config(path)
    assert "run.yaml:3: rank: unknown key; did you mean 'lora_rank'?" in str(caught.value)


# -- LoRA targets ------------------------------------------------------------------------------------
def test_lora_targets_all_is_all_linear_and_unknown_names_are_refused_with_the_models_modules():
    from core.config.model_checks import lora_targets_problem

    assert check_value("lora_targets", "all") == "all-linear"
    assert check_value("lora_targets", ["all"]) == "all-linear"
    assert lora_targets_problem("tiny", ["q_proj", "self_attn.v_proj"], "lora") is None
    problem = lora_targets_problem("tiny", ["q_proj", "query_key_value"], "lora")
    assert problem.startswith("lora_targets: query_key_value: no module of tiny has this name")
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" in problem
    assert lora_targets_problem("tiny", ["query_key_value"], "full") is None
    assert lora_targets_problem("someone/not-downloaded-model", ["x"], "lora") is None  # cannot look: the trainer will


# -- DeepSpeed JSON ----------------------------------------------------------------------------------
def _ds_run(tmp_path: Path, ds: dict | str, **keys) -> Path:
    (tmp_path / "ds.json").write_text(ds if isinstance(ds, str) else json.dumps(ds, indent=2), encoding="utf-8")
    values = {"model": "tiny", "dataset": str(_data(tmp_path / "d.jsonl")), "deepspeed": "ds.json", **keys}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def test_user_deepspeed_json_values_join_the_run_config_and_conflicts_are_named(tmp_path):
    user = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "zero_optimization": {"stage": 3, "overlap_comm": False, "stage3_max_live_parameters": 5e8,
                                  "offload_optimizer": {"device": "cpu"}},
            "communication_data_type": "fp32"}
    config = load_run_config(_ds_run(tmp_path, user, micro_batch_size=2))
    assert config.deepspeed == str(tmp_path / "ds.json")  # found beside the YAML, made absolute
    assert (config.zero_stage, config.offload) == (3, "optimizer")  # the YAML left them at their defaults
    warnings = "\n".join(map(str, config.warnings))
    assert "zero_stage: 3 taken from ds.json (zero_optimization.stage)" in warnings
    assert "'auto' in ds.json filled in from the run configuration: train_micro_batch_size_per_gpu ← " \
           "micro_batch_size, gradient_accumulation_steps ← gradient_accumulation" in warnings

    config = load_run_config(_ds_run(tmp_path, user, zero_stage=2, offload="optimizer"))
    assert config.zero_stage == 2  # what the YAML says wins, and the conflict says so
    warnings = "\n".join(map(str, config.warnings))
    assert "ds.json says zero_optimization.stage = 3, the run configuration says zero_stage: 2; zero_stage wins" \
        in warnings

    from core.train.deepspeed_config import deepspeed_config, merge_user_config

    cfg = config.to_dict()
    merged, notes = merge_user_config(deepspeed_config(cfg, 2, True, False), user)
    assert merged["zero_optimization"]["stage"] == 2 and merged["train_micro_batch_size_per_gpu"] == 1
    assert merged["gradient_accumulation_steps"] == 8 and merged["train_batch_size"] == 16
    assert merged["zero_optimization"]["overlap_comm"] is False  # the user's own choices are kept
    assert merged["zero_optimization"]["stage3_max_live_parameters"] == 5e8
    assert merged["communication_data_type"] == "fp32" and merged["bf16"] == {"enabled": True}
    assert "zero_optimization.stage: 3 -> 2" in notes and 'train_micro_batch_size_per_gpu: "auto" -> 1' in notes


def test_a_deepspeed_json_saved_with_a_bom_is_read(tmp_path):
    """A ds.json a Windows editor saved (UTF-8 with a byte-order mark) stopped the run: "ds.json:1: Unexpected
    UTF-8 BOM (decode using utf-8-sig)". The engine merges the file's values into its own DeepSpeed config,
    so the mark is no matter: it is read as without one."""
    from core.config.deepspeed_file import read_deepspeed_json

    path = _ds_run(tmp_path, {"zero_optimization": {"stage": 3}})
    ds = tmp_path / "ds.json"
    ds.write_bytes(b"\xef\xbb\xbf" + ds.read_bytes())
    assert read_deepspeed_json(ds) == {"zero_optimization": {"stage": 3}}
    assert load_run_config(path).zero_stage == 3


def test_invalid_deepspeed_json_names_file_and_line(tmp_path):
    path = _ds_run(tmp_path, '{\n  "zero_optimization": {\n    "stage": 2,\n  }\n}\n', zero_stage=2)
    with pytest.raises(ConfigError) as caught:
        load_run_config(path)
    assert f"deepspeed: {tmp_path / 'ds.json'}:4: not valid JSON" in str(caught.value)
    (tmp_path / "ds.json").unlink()
    with pytest.raises(ConfigError, match="DeepSpeed JSON not found"):
        load_run_config(path)


# -- through the CLI -----------------------------------------------------------------------------------
def test_import_command_prints_yaml_on_stdout_and_the_mapping_on_stderr(tmp_path):
    home = tmp_path / "home"
    peer = tmp_path / "llama3_lora_sft.yaml"
    peer.write_text(LLAMAFACTORY_YAML, encoding="utf-8")
    out = _tunedeck(home, "import", str(peer))
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["max_seq_len"] == 2048
    assert "  num_train_epochs: 3.0 → taken as epochs=3.0" in out.stderr
    assert "  overwrite_cache: true → dropped: tunedeck tokenizes on every run" in out.stderr
    assert "  max_samples: 1000 → needs you: " in out.stderr
    assert "(LLaMA-Factory) → tunedeck: 18 taken, 10 dropped, 1 need you" in out.stderr

    out = _tunedeck(home, "import", str(peer), "--json")
    data = json.loads(out.stdout)
    assert data["config"]["lora_targets"] == "all-linear"
    assert {"key": "bf16", "value": True, "verdict": "taken", "tunedeck": {"precision": "bf16"}, "reason": None,
            "peer_default": False} in data["mapping"]

    target = tmp_path / "converted.yaml"
    out = _tunedeck(home, "import", str(peer), "-o", str(target))
    assert out.returncode == 0 and out.stdout == "" and yaml.safe_load(target.read_text())["epochs"] == 3.0
    again = _tunedeck(home, "import", str(peer), "-o", str(target))
    assert again.returncode == 2  # never overwritten
    # said before any conversion: one line, not at the end of the whole mapping
    assert again.stderr.strip().splitlines() == [f"tunedeck: {target} exists; remove it or choose another -o"]
    # the mode a plain write gives there (the umask's), not write_atomic's private 0600
    assert target.stat().st_mode & 0o777 == umask_modes(tmp_path)[1]
    nested = tmp_path / "new" / "folder" / "x.yaml"  # its folder made, as `plan --save` makes one: no traceback
    out = _tunedeck(home, "import", str(peer), "-o", str(nested))
    assert out.returncode == 0 and yaml.safe_load(nested.read_text())["epochs"] == 3.0, out.stderr

    out = _tunedeck(home, "import", "--", "swift", "sft", "--model", "Qwen/Qwen2.5-7B-Instruct",
                    "--train_type", "lora", "--dataset", "d.jsonl", "--lora_rank", "4")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["lora_rank"] == 4 and "swift: sft → dropped" in out.stderr

    out = _tunedeck(home, "import", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2 and "file not found" in out.stderr


def test_import_takes_one_file_and_says_so(tmp_path):
    """The usage says one FILE or a swift command after --, not FILE [FILE ...]; two files are refused in
    one line, not read as a swift command ("is not a training command")."""
    home = tmp_path / "home"
    usage = _tunedeck(home, "import", "--help")
    assert usage.returncode == 0
    assert "[FILE ...]" not in usage.stdout and "(FILE | -- swift sft ARG ...)" in usage.stdout
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    for peer in (first, second):
        peer.write_text(LLAMAFACTORY_YAML, encoding="utf-8")
    out = _tunedeck(home, "import", str(first), str(second))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"tunedeck: import takes one file, got 2: {first} {second}; import each on its own (tunedeck import "
        f"{first}), or give a swift command after --: tunedeck import -- swift sft ..."]


def test_train_check_validates_everything_and_starts_nothing(tmp_path):
    home = tmp_path / "home"
    data = _data(tmp_path / "data.jsonl")
    run = tmp_path / "run.yaml"
    run.write_text(f"model: tiny\ndataset: {data}\nmax_seq_len: 64\nprecision: fp32\nmax_steps: 2\n", encoding="utf-8")
    out = _tunedeck(home, "train", str(run), "--check", "lora_rank=4")
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert resolved["lora_rank"] == 4 and resolved["learning_rate"] == 1e-4 and resolved["name"] == "tiny-lora"
    assert "all checks passed; nothing was started" in out.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())

    out = _tunedeck(home, "train", str(run), "--check", "--json", "lora_targets=[q_proj,qkv]")
    assert out.returncode == 2
    problem = json.loads(out.stdout)["problems"][0]
    assert problem.startswith("lora_targets: qkv: no module of tiny has this name") and "gate_proj" in problem
    assert "lora_targets: qkv" in out.stderr

    out = _tunedeck(home, "train", str(run), "--check", "bf16=true", "lora_rank=0")
    assert out.returncode == 2
    assert "bf16: LLaMA-Factory / ms-swift name; tunedeck says 'precision: bf16'" in out.stderr
    assert "lora_rank: got 0; must be at least 1" in out.stderr

    data.write_text("{not json\n", encoding="utf-8")
    out = _tunedeck(home, "train", str(run), "--check")
    assert out.returncode == 2 and "data.jsonl:1" in out.stderr  # the data is checked too


def test_train_takes_a_peers_file_directly(tmp_path):
    home = tmp_path / "home"
    _data(tmp_path / "data.jsonl")
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}}', encoding="utf-8")
    peer = tmp_path / "tiny_lora_sft.yaml"
    peer.write_text(textwrap.dedent("""\
        model_name_or_path: tiny
        stage: sft
        do_train: true
        finetuning_type: lora
        lora_target: q_proj,v_proj
        dataset: data.jsonl
        template: qwen
        cutoff_len: 64
        per_device_train_batch_size: 2
        gradient_accumulation_steps: 1
        max_steps: 1
        fp16: false
        deepspeed: ds.json
        """), encoding="utf-8")
    out = _tunedeck(home, "train", str(peer), "--check", cwd=tmp_path)
    assert out.returncode == 2  # this box has no GPU for the DeepSpeed file's ZeRO-2: the box is checked too
    assert "zero_stage: 2 taken from ds.json" in out.stderr and "needs GPUs" in out.stderr

    peer.write_text(peer.read_text().replace("deepspeed: ds.json\n", ""), encoding="utf-8")
    out = _tunedeck(home, "train", str(peer), "--check", "--json", "precision=fp32", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["config"]["lora_targets"] == ["q_proj", "v_proj"] and data["config"]["micro_batch_size"] == 2
    assert data["config"]["lora_alpha"] == 16 and data["config"]["max_seq_len"] == 64
    assert data["config"]["dataset"] == str(tmp_path / "data.jsonl")
    assert any(line["key"] == "template" and line["verdict"] == "dropped" for line in data["mapping"])
    assert "is a LLaMA-Factory configuration: trained as converted below" in out.stderr
    assert "  cutoff_len: 64 → taken as max_seq_len=64" in out.stderr

    peer.write_text(peer.read_text().replace("stage: sft", "stage: dpo"), encoding="utf-8")
    out = _tunedeck(home, "train", str(peer), cwd=tmp_path)
    assert out.returncode == 2 and "cannot be trained as it is" in out.stderr
    assert "stage: dpo → needs you: stage 'dpo': tunedeck trains SFT only" in out.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_a_swift_command_line_trains_as_converted(tmp_path):
    """train FILE on a `swift sft` script: the run's config.yaml holds the converted values, and it trains."""
    import time

    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory

    home = tmp_path / "home"
    data = _data(tmp_path / "data.jsonl")
    script = tmp_path / "sft.sh"
    script.write_text(f"swift sft --model tiny --train_type lora --dataset {data} --target_modules q_proj v_proj "
                      "--torch_dtype float32 --max_length 64 --per_device_train_batch_size 3 "
                      "--gradient_accumulation_steps 1 --max_steps 1 --save_steps 1 --logging_steps 1 "
                      "--model_author swift\n", encoding="utf-8")
    out = _tunedeck(home, "train", str(script))
    assert out.returncode == 0, out.stderr
    assert "  target_modules: [\"q_proj\", \"v_proj\"] → taken as lora_targets=[\"q_proj\", \"v_proj\"]" in out.stderr
    run = RunDirectory(home / "runs" / out.stdout.strip())
    config = yaml.safe_load(run.config_path.read_text())
    assert (config["lora_targets"], config["lora_rank"], config["lora_alpha"], config["max_steps"]) == \
        (["q_proj", "v_proj"], 8, 32, 1)
    deadline = time.monotonic() + 180
    while effective_status(run).active and time.monotonic() < deadline:
        time.sleep(0.3)  # polling the detached run's end, in-process
    status = run.status()
    assert status.status == "finished", (status, (run.path / "train.log").read_text()[-2000:])


def test_swift_pretraining_and_loss_scale_and_preference_commands():
    from core.config.importers import blocking_lines

    result = import_command(["swift", "pt", "--model", "tiny", "--dataset", "corpus.txt", "--loss_scale", "all"])
    assert result.config["loss_on"] == "all" and _line(result, "swift").verdict == TAKEN
    result = import_command(["swift", "sft", "--model", "tiny", "--dataset", "d.jsonl", "--loss_scale", "last_round"])
    # a loss on the last answer only is not what tunedeck trains: train stops there, it does not train another loss
    assert _line(result, "loss_scale").verdict == NEEDS_YOU
    assert [line.key for line in blocking_lines(result)] == ["loss_scale"]
    result = import_command(["swift", "rlhf", "--rlhf_type", "dpo", "--model", "tiny", "--dataset", "p.jsonl"])
    assert [line.key for line in blocking_lines(result)] == ["swift", "rlhf_type"]


@pytest.mark.parametrize("method", ["lora", "full"])
def test_llamafactory_dataset_names_are_looked_up_in_its_default_data_folder(tmp_path, monkeypatch, method):
    """LLaMA-Factory's examples name datasets (``dataset: identity``) and give no ``dataset_dir``: it reads
    ``./data/dataset_info.json`` from the folder it runs in. Run from there, ``train --check
    examples/x.yaml`` said the name was in no dataset_info.json; the default is now taken, and said."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "identity.jsonl").write_text('{"instruction": "Who are you?", "output": "tiny."}\n')
    (tmp_path / "data" / "dataset_info.json").write_text('{"identity": {"file_name": "identity.jsonl"}}')
    (tmp_path / "examples").mkdir()
    peer = tmp_path / "examples" / "tiny_sft.yaml"
    peer.write_text(f"model_name_or_path: tiny\nstage: sft\nfinetuning_type: {method}\ndataset: identity\n"
                    "cutoff_len: 64\nmax_steps: 1\nbf16: false\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    result = import_file(peer)
    assert result.config["dataset_dir"] == str(tmp_path / "data")
    [line] = [line for line in result.mapping if line.key == "dataset_dir"]
    assert line.default and "LLaMA-Factory's default dataset_dir" in line.text()
    out = _tunedeck(tmp_path / "home", "train", "examples/tiny_sft.yaml", "--check", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # Without ./data nothing is added; a file that names its own dataset_dir keeps it.
    monkeypatch.chdir(tmp_path / "examples")
    assert "dataset_dir" not in import_file(peer).config
    monkeypatch.chdir(tmp_path)
    peer.write_text(peer.read_text() + "dataset_dir: elsewhere\n", encoding="utf-8")
    assert import_file(peer).config["dataset_dir"] == "elsewhere"


@pytest.mark.parametrize("key, value", [
    ("max_samples", 2), ("enable_thinking", "maybe"), ("neftune_noise_alpha", 5), ("lr_scheduler_type", "cosine_with_min_lr"),
    ("lr_scheduler_kwargs", {"num_cycles": 3}), ("additional_target", "embed_tokens"), ("optim", "lion_8bit"),
    ("model_revision", "v1.0"), ("resume_from_checkpoint", "saves/checkpoint-100"), ("val_size", 100),
    ("lora_rank", 0), ("quantization_method", "gptq"),
])
def test_train_refuses_an_imported_key_that_would_change_what_trains(tmp_path, key, value):
    """Before, only a preference stage, a method, 8-bit and a conflict stopped ``train FILE``: a LLaMA-Factory
    file with max_samples, NEFTune, a scheduler, extra trained modules, ... trained something else than it
    describes, said only in the mapping. Now train refuses it, names the key and says what to do."""
    home = tmp_path / "home"
    data = _data(tmp_path / "d.jsonl")
    peer = tmp_path / "lf.yaml"
    peer.write_text(yaml.safe_dump({"model_name_or_path": "tiny", "stage": "sft", "finetuning_type": "lora",
                                    "dataset": str(data), "cutoff_len": 64, "max_steps": 1, key: value}),
                    encoding="utf-8")
    out = _tunedeck(home, "train", str(peer), "--check")
    assert out.returncode == 2, out.stderr
    refusal = out.stderr[out.stderr.index("cannot be trained as it is"):]
    assert f"  {key}: " in refusal and "→ needs you" in refusal
    assert f"tunedeck import {peer} -o run.yaml" in refusal
    # the converted file is the explicit acceptance of the difference: it trains (checked here)
    converted = tmp_path / "run.yaml"
    assert _tunedeck(home, "import", str(peer), "-o", str(converted)).returncode == 0
    out = _tunedeck(home, "train", str(converted), "--check")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("dataset_info", [False, True])
def test_a_llamafactory_webui_training_args_yaml_trains(tmp_path, dataset_info):
    """LLaMA-Factory's WebUI saves enable_thinking: true (its default) and a max_samples cap (100000) in its
    training_args.yaml: train refused the file for both, though neither changes what trains. Thinking on is
    tunedeck's thinking: true (a template that never reads it is said, and goes on), and a cap at least each dataset's record count
    selects them all (LLaMA-Factory takes range(min(N, len))); counted for local files, a named dataset too."""
    home = tmp_path / "home"
    (tmp_path / "data").mkdir()
    data = _data(tmp_path / "data" / "d.jsonl")  # 3 records
    if dataset_info:  # LLaMA-Factory's own entry for a file of OpenAI-style messages
        (tmp_path / "data" / "dataset_info.json").write_text(json.dumps({"mine": {
            "file_name": "d.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                     "assistant_tag": "assistant"}}}), encoding="utf-8")
    peer = tmp_path / "training_args.yaml"
    settings = {"model_name_or_path": "tiny", "stage": "sft", "finetuning_type": "lora", "cutoff_len": 64,
                "max_steps": 1, "dataset": "mine" if dataset_info else str(data), "dataset_dir": str(tmp_path / "data"),
                "enable_thinking": True, "max_samples": 100000}
    peer.write_text(yaml.safe_dump(settings), encoding="utf-8")
    out = _tunedeck(home, "train", str(peer), "--check", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "max_samples: 100000 → dropped: at least the records of each dataset (at most 3)" in out.stderr
    assert "enable_thinking: true → taken as thinking=true" in out.stderr
    assert "thinking: true does nothing here: the chat template of tiny never reads enable_thinking" in out.stderr
    settings["max_samples"] = 3  # exactly the count: still all of them
    peer.write_text(yaml.safe_dump(settings), encoding="utf-8")
    assert _tunedeck(home, "train", str(peer), "--check", cwd=tmp_path).returncode == 0
    settings["max_samples"] = 2  # fewer: the first 2, which tunedeck cannot do
    peer.write_text(yaml.safe_dump(settings), encoding="utf-8")
    out = _tunedeck(home, "train", str(peer), "--check", cwd=tmp_path)
    assert out.returncode == 2 and "max_samples: 2 → needs you" in out.stderr


def test_train_goes_on_past_an_imported_key_that_trains_the_same(tmp_path):
    """An attention implementation or unsloth changes how fast, not what trains: train goes on, saying it."""
    home = tmp_path / "home"
    data = _data(tmp_path / "d.jsonl")
    peer = tmp_path / "lf.yaml"
    peer.write_text(yaml.safe_dump({"model_name_or_path": "tiny", "stage": "sft", "finetuning_type": "lora",
                                    "dataset": str(data), "cutoff_len": 64, "max_steps": 1,
                                    "use_unsloth": True, "flash_attn": "xformers"}), encoding="utf-8")
    out = _tunedeck(home, "train", str(peer), "--check")
    assert out.returncode == 0, out.stderr
    assert "use_unsloth: true → needs you" in out.stderr


# ms-swift's own arguments as its args.json lists them (every one, mostly at its default), after transformers'
# Seq2SeqTrainingArguments; ms-swift's own defaults where they differ (adam_beta2 0.95, weight_decay 0.1, ...).
SWIFT_OWN_ARGS = json.loads("""\
{"output_dir": "/root/output/v0-20260101-120000", "learning_rate": 0.0001, "weight_decay": 0.1, "adam_beta2": 0.95,
 "per_device_train_batch_size": 1, "per_device_eval_batch_size": 1, "gradient_accumulation_steps": 1,
 "num_train_epochs": 1.0, "max_steps": 1, "lr_scheduler_type": "cosine", "warmup_ratio": 0.05,
 "logging_dir": "/root/output/v0-20260101-120000/runs", "logging_first_step": true, "logging_steps": 5,
 "save_steps": 50.0, "save_total_limit": 2, "data_seed": 42, "bf16": false, "dataloader_num_workers": 4,
 "run_name": "/root/output/v0-20260101-120000", "metric_for_best_model": "loss", "greater_is_better": false,
 "accelerator_config": {"dispatch_batches": false}, "optim": "adamw_torch", "report_to": ["tensorboard"],
 "gradient_checkpointing": true, "ddp_timeout": 18000000, "eval_strategy": "no",
 "tuner_backend": "peft", "vit_gradient_checkpointing": null, "router_aux_loss_coef": 0.0, "enable_dft_loss": false,
 "enable_channel_loss": false, "check_model": true, "acc_strategy": "token", "train_dataloader_shuffle": true,
 "max_epochs": null, "aligner_lr": null, "vit_lr": null, "use_logits_to_keep": null, "ds3_gather_for_generation": true,
 "resume_only_model": false, "optimizer": null, "loss_type": null, "metric": null, "eval_use_evalscope": false,
 "eval_dataset": [], "eval_dataset_args": null, "eval_limit": null, "eval_generation_config": null,
 "extra_eval_args": null, "use_flash_ckpt": false,
 "model": "tiny", "model_type": "qwen2_5", "model_revision": null, "task_type": "causal_lm", "torch_dtype": "float32",
 "attn_impl": null, "new_special_tokens": [], "num_labels": null, "problem_type": null, "rope_scaling": null,
 "device_map": null, "max_memory": {}, "max_model_len": null, "local_repo_path": null, "init_strategy": null,
 "template": "qwen2_5", "system": null, "max_length": 64, "truncation_strategy": "delete", "max_pixels": null,
 "agent_template": null, "norm_bbox": null, "use_chat_template": true, "padding_free": false, "padding_side": "right",
 "loss_scale": "default", "sequence_parallel_size": 1, "response_prefix": null, "template_backend": "swift",
 "dataset": ["DATA"], "val_dataset": [], "split_dataset_ratio": 0.0, "dataset_num_proc": 1,
 "load_from_cache_file": true, "dataset_shuffle": true, "val_dataset_shuffle": false, "streaming": false,
 "interleave_prob": null, "stopping_strategy": "first_exhausted", "shuffle_buffer_size": 1000,
 "download_mode": "reuse_dataset_if_exists", "columns": {}, "strict": false, "model_name": null, "model_author": null,
 "custom_dataset_info": [], "quant_method": null, "quant_bits": null, "hqq_axis": null,
 "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
 "bnb_4bit_quant_storage": null, "max_new_tokens": 64, "temperature": 0.0, "top_k": null, "top_p": null,
 "repetition_penalty": null, "num_beams": 1, "stream": false, "stop_words": [], "logprobs": false, "top_logprobs": null,
 "ckpt_dir": null, "lora_modules": [], "tuner_type": "lora", "adapters": [], "external_plugins": [], "model_kwargs": {},
 "load_args": false, "load_data_args": false, "packing": false, "packing_length": null, "lazy_tokenize": false,
 "cached_dataset": [], "custom_register_path": [], "use_hf": false, "ignore_args_error": false, "use_swift_lora": false,
 "freeze_parameters": [], "freeze_parameters_regex": null, "freeze_parameters_ratio": 0.0, "trainable_parameters": [],
 "trainable_parameters_regex": null, "freeze_llm": false, "freeze_vit": true, "freeze_aligner": true,
 "target_modules": ["all-linear"], "target_regex": null, "target_parameters": null, "modules_to_save": [],
 "lora_rank": 8, "lora_alpha": 32, "lora_dropout": 0.05, "lora_bias": "none", "lora_dtype": null,
 "lorap_lr_ratio": null, "use_rslora": false, "use_dora": false, "lora_ga_batch_size": 2, "lora_ga_iters": 2,
 "lora_ga_max_length": 1024, "lora_ga_direction": "ArB2r", "lora_ga_scale": "stable", "lora_ga_stable_gamma": 16,
 "init_weights": true, "fourier_n_frequency": 2000, "fourier_scaling": 300.0, "boft_block_size": 4,
 "boft_block_num": 0, "boft_n_butterfly_factor": 1, "boft_dropout": 0.0, "vera_rank": 256,
 "vera_projection_prng_key": 0, "vera_dropout": 0.0, "vera_d_initial": 0.1, "adapter_act": "gelu",
 "adapter_length": 128, "use_galore": false, "galore_target_modules": null, "galore_rank": 128,
 "galore_update_proj_gap": 50, "galore_scale": 1.0, "galore_proj_type": "std", "galore_optim_per_parameter": false,
 "galore_with_embedding": false, "galore_quantization": false, "galore_proj_quant": false, "galore_proj_bits": 4,
 "galore_proj_group_size": 256, "galore_cos_threshold": 0.4, "galore_gamma_proj": 2, "galore_queue_size": 5,
 "adalora_target_r": 8, "adalora_init_r": 12, "adalora_tinit": 0, "adalora_tfinal": 0, "adalora_deltaT": 1,
 "adalora_beta1": 0.85, "adalora_beta2": 0.85, "adalora_orth_reg_weight": 0.5, "llamapro_num_new_blocks": 4,
 "llamapro_num_groups": null, "lisa_activated_layers": 0, "lisa_step_interval": 20, "reft_layer_key": null,
 "reft_layers": null, "reft_rank": 4, "reft_intervention_type": "LoreftIntervention", "reft_args": null,
 "swanlab_token": null, "swanlab_project": "ms-swift", "swanlab_workspace": null, "swanlab_exp_name": null,
 "swanlab_notification_method": null, "swanlab_webhook_url": null, "swanlab_secret": null, "swanlab_mode": "cloud",
 "add_version": true, "create_checkpoint_symlink": false, "zero_hpz_partition_size": null,
 "deepspeed_autotp_size": null, "fsdp": "", "early_stop_interval": null, "rank": -1, "global_world_size": 1,
 "local_world_size": 1, "model_suffix": "tiny"}
""")


def _swift_args_json(path: Path, data: Path, **changes) -> Path:
    """A full args.json as ms-swift writes it into its output folder: transformers' real TrainingArguments
    defaults (of the installed transformers), then ms-swift's arguments, then ``changes``."""
    import dataclasses

    from transformers import Seq2SeqTrainingArguments

    values = {}
    for spec in dataclasses.fields(Seq2SeqTrainingArguments):
        if not spec.init or (spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING):
            continue
        value = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
        values[spec.name] = value if isinstance(value, (str, int, float, bool, list, dict, type(None))) else str(value)
    values.update(SWIFT_OWN_ARGS, dataset=[str(data)], **changes)
    path.write_text(json.dumps(values, indent=2), encoding="utf-8")
    return path


def test_a_full_swift_args_json_is_stopped_only_by_values_that_train_otherwise(tmp_path):
    """ms-swift writes all of its ~200 arguments into args.json, with its own adam_beta2: 0.95 and
    truncation_strategy: delete. tunedeck had no key for either, so every real args.json was refused by
    ``train``. Now they are run keys (adam_beta2, overlong: drop), taken; a value tunedeck does not train
    (truncation_strategy: left, a beta out of range, a setting it has no key for at another value) still
    stops train, named."""
    from core.config.importers import blocking_lines

    home = tmp_path / "home"
    data = _data(tmp_path / "d.jsonl")
    peer = _swift_args_json(tmp_path / "args.json", data)  # ms-swift's own defaults
    result = import_file(peer)
    assert blocking_lines(result) == [] and result.counts()[NEEDS_YOU] == 0
    assert len(result.mapping) > 250
    assert _line(result, "adam_beta2").text() == "adam_beta2: 0.95 → taken as adam_beta2=0.95"
    assert _line(result, "truncation_strategy").text() == "truncation_strategy: delete → taken as overlong=drop"
    assert (result.config["adam_beta1"], result.config["adam_beta2"], result.config["adam_epsilon"]) == \
        (0.9, 0.95, 1e-08)
    for key in ("tuner_backend", "data_seed", "freeze_vit", "init_weights"):
        assert _line(result, key).verdict == DROPPED, _line(result, key).text()
    assert "read only together with predict_with_generate" in _line(result, "max_new_tokens").text()
    assert "read only together with use_galore" in _line(result, "galore_rank").text()
    # global_world_size 1 asks one GPU (ms-swift's effective batch); this box has none: its CPU, gpus=all
    out = _tunedeck(home, "train", str(peer), "gpus=all", "--check")
    assert out.returncode == 0, out.stderr
    checked = yaml.safe_load(out.stdout)
    assert (checked["adam_beta1"], checked["adam_beta2"], checked["adam_epsilon"], checked["overlong"]) == \
        (0.9, 0.95, 1e-08, "drop")

    # transformers' betas and a sample cut at its end: tunedeck's defaults, written out
    peer = _swift_args_json(tmp_path / "args.json", data, adam_beta2=0.999, truncation_strategy="right")
    out = _tunedeck(home, "train", str(peer), "gpus=all", "--check")
    assert out.returncode == 0, out.stderr
    assert "truncation_strategy: right → taken as overlong=cut" in out.stderr
    assert yaml.safe_load(out.stdout)["adam_beta2"] == 0.999

    # what tunedeck does not train stops it, named: one key changed at a time
    for key, value in (("truncation_strategy", "left"), ("adam_beta2", 1.5), ("data_seed", 7),
                       ("train_dataloader_shuffle", False), ("label_smoothing_factor", 0.1),
                       ("average_tokens_across_devices", False)):
        peer = _swift_args_json(tmp_path / "args.json", data, **{key: value})
        assert [line.key for line in blocking_lines(import_file(peer))] == [key]
    peer = _swift_args_json(tmp_path / "args.json", data, truncation_strategy="left")
    out = _tunedeck(home, "train", str(peer), "--check")
    assert out.returncode == 2
    assert "  truncation_strategy: left → needs you: tunedeck cannot do truncation_strategy left" in out.stderr


def test_the_peer_values_said_to_be_tunedecks_are_the_engines():
    """The table's transformers defaults are the installed transformers' (the engine leaves them to it), and the
    run keys that stand for TrainingArguments (adam_beta1/2, adam_epsilon) default to transformers' values: a
    config without them trains as before they existed."""
    import dataclasses

    from transformers import TrainingArguments

    from core.config.peers import PEER_KEYS
    from core.config.schema import default_for

    defaults = {spec.name: spec.default for spec in dataclasses.fields(TrainingArguments)}
    for key in ("average_tokens_across_devices", "train_sampling_strategy", "label_smoothing_factor"):
        assert PEER_KEYS[key].convert(defaults[key]).verdict == DROPPED, key
    engine = (ROOT / "core" / "train" / "worker.py").read_text(encoding="utf-8")
    for key in ("average_tokens_across_devices", "train_sampling_strategy", "label_smoothing_factor"):
        assert f"{key}=" not in engine, key  # left to transformers: the default is what trains
    for key in ("adam_beta1", "adam_beta2", "adam_epsilon"):
        assert default_for(key) == defaults[key], key
        assert f"{key}=" in engine, key
        assert PEER_KEYS[key].convert(0.5).values == {key: 0.5}, key  # both peers' key, taken


def test_rslora_and_one_cycle_restarts_are_taken_and_train(tmp_path):
    """use_rslora and lr_scheduler_type: cosine_with_restarts were "needs you" and trained without rsLoRA's
    alpha/sqrt(r) scaling. rsLoRA is now tunedeck's lora_rslora (peft's use_rslora: the adapter saved says so,
    and its scaling is alpha/sqrt(r)); one restart cycle is cosine's curve."""
    import math
    import time

    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory

    home = tmp_path / "home"
    data = _data(tmp_path / "d.jsonl")
    peer = tmp_path / "lf.yaml"
    peer.write_text(yaml.safe_dump({"model_name_or_path": "tiny", "stage": "sft", "finetuning_type": "lora",
                                    "lora_target": "q_proj,v_proj", "lora_rank": 4, "use_rslora": True,
                                    "lr_scheduler_type": "cosine_with_restarts", "dataset": str(data),
                                    "cutoff_len": 64, "max_steps": 1, "save_steps": 1,
                                    "per_device_train_batch_size": 3, "gradient_accumulation_steps": 1}),
                    encoding="utf-8")
    result = import_file(peer)
    assert (result.config["lora_rslora"], result.config["lr_scheduler"]) == (True, "cosine")
    out = _tunedeck(home, "train", str(peer))
    assert out.returncode == 0, out.stderr
    run = RunDirectory(home / "runs" / out.stdout.strip())
    assert yaml.safe_load(run.config_path.read_text())["lora_rslora"] is True
    deadline = time.monotonic() + 180
    while effective_status(run).active and time.monotonic() < deadline:
        time.sleep(0.3)  # polling the detached run's end, in-process
    assert run.status().status == "finished", (run.path / "train.log").read_text()[-2000:]
    saved = [json.loads(path.read_text()) for path in run.path.rglob("adapter_config.json")]
    assert saved and all(entry["use_rslora"] is True for entry in saved)

    # the engine's own LoRA: every adapted layer scaled by alpha/sqrt(r) (16/sqrt(4) = 8, not 16/4 = 4)
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.assets import resolve_model_name
    from core.train.model_setup import wrap_lora

    model = wrap_lora(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model_name("tiny"))),
                      {"method": "lora", "lora_rank": 4, "lora_alpha": 16, "lora_targets": ["q_proj"],
                       "lora_rslora": True, "lora_grouped": False})
    scalings = [module.scaling["default"] for module in model.modules() if isinstance(getattr(module, "scaling", None), dict)]
    assert scalings and all(math.isclose(value, 16 / math.sqrt(4)) for value in scalings)


def test_a_peers_constant_scheduler_keeps_no_warmup_and_constant_with_warmup_keeps_it():
    """transformers' constant ignores the warmup (tunedeck's constant warms up): imported as constant with
    warmup_ratio 0; a warmup the file also gives is two keys saying different things, and stops train."""
    from core.config.importers import blocking_lines

    result = import_command(["swift", "sft", "--model", "tiny", "--dataset", "d.jsonl", "--lr_scheduler_type", "constant"])
    assert (result.config["lr_scheduler"], result.config["warmup_ratio"]) == ("constant", 0.0)
    result = import_command(["swift", "sft", "--model", "tiny", "--dataset", "d.jsonl", "--lr_scheduler_type",
                             "constant_with_warmup", "--warmup_ratio", "0.1"])
    assert (result.config["lr_scheduler"], result.config["warmup_ratio"]) == ("constant", 0.1)
    result = import_command(["swift", "sft", "--model", "tiny", "--dataset", "d.jsonl", "--lr_scheduler_type",
                             "constant", "--warmup_ratio", "0.1"])
    assert [line.key for line in blocking_lines(result)] == ["warmup_ratio"]


@pytest.mark.parametrize("value", [False, True])
def test_llamafactory_enable_thinking_is_the_run_key_thinking(tmp_path, value):
    """Before, a LLaMA-Factory file with enable_thinking: false blocked ``train`` (tunedeck had no such
    setting). Now it is the run key ``thinking``, both values: taken, recorded in the converted YAML and the
    checked config, and said at ``train --check`` when the model's template never reads it (the tiny one)."""
    home = tmp_path / "home"
    data = _data(tmp_path / "d.jsonl")
    peer = tmp_path / "lf.yaml"
    peer.write_text(yaml.safe_dump({"model_name_or_path": "tiny", "stage": "sft", "finetuning_type": "lora",
                                    "dataset": str(data), "cutoff_len": 64, "max_steps": 1,
                                    "enable_thinking": value}), encoding="utf-8")
    result = import_file(peer)
    assert _line(result, "enable_thinking").verdict == TAKEN and result.config["thinking"] is value
    out = _tunedeck(home, "train", str(peer), "--check", "--json")
    assert out.returncode == 0, out.stderr
    checked = json.loads(out.stdout)
    assert checked["config"]["thinking"] is value
    assert any("never reads enable_thinking" in str(warning) for warning in checked["warnings"]), checked["warnings"]


def test_the_thinking_key_is_checked_and_unset_by_default(tmp_path):
    """``thinking`` is a bool (unset: the template's own default, nothing given to it); another value is
    refused naming the key; an override sets it; the resolved file records it."""
    data = _data(tmp_path / "d.jsonl")
    run = tmp_path / "run.yaml"
    run.write_text(f"model: tiny\ndataset: {data}\n", encoding="utf-8")
    assert load_run_config(run).thinking is None
    assert load_run_config(run, ["thinking=false"]).to_dict()["thinking"] is False
    run.write_text(f"model: tiny\ndataset: {data}\nthinking: maybe\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"run.yaml:3.*thinking"):
        load_run_config(run)


def test_swift_enable_thinking_is_inference_only(tmp_path):
    """ms-swift 4.6 reads enable_thinking only at inference (its template_args.py): an args.json's value
    trains the same, so it is dropped, said, and stops nothing; LLaMA-Factory's spelling still maps."""
    from core.config.importers import blocking_lines

    data = _data(tmp_path / "d.jsonl")
    peer = _swift_args_json(tmp_path / "args.json", data, enable_thinking=False)
    result = import_file(peer)
    line = _line(result, "enable_thinking")
    assert line.verdict == DROPPED and "only at inference" in line.text() and "thinking: false" in line.text()
    assert "thinking" not in result.config and blocking_lines(result) == []


def test_max_samples_counts_a_large_jsonl_in_bounded_memory(tmp_path):
    """``import`` (and ``train --check`` on a peer's file) counted a dataset's records for max_samples by loading
    every record: a 20 GB jsonl took as much memory (and minutes). Now a JSON Lines file's non-blank lines are
    counted in chunks: here a 24 MB file (a long line among them, a blank one, no newline at the end) is
    counted while Python's allocations peak far below its size, and the same file named twice is read once."""
    import tracemalloc

    from core.config.peers import count_jsonl_rows

    row = json.dumps({"messages": [{"role": "user", "content": "q" * 200}, {"role": "assistant", "content": "a" * 200}]})
    big = tmp_path / "big.jsonl"
    rows = 0
    with big.open("w", encoding="utf-8") as stream:
        long_row = json.dumps({"messages": [{"role": "user", "content": "x" * 3_000_000},
                                            {"role": "assistant", "content": "y"}]})
        stream.write(long_row + "\n\n")
        rows += 1
        while stream.tell() < 24 * 1024 * 1024:
            stream.write((row + "\n") * 1000)
            rows += 1000
        stream.write(row)  # the last row without its newline
        rows += 1
    assert count_jsonl_rows(big) == rows
    peer = tmp_path / "lf.yaml"
    peer.write_text(yaml.safe_dump({"model_name_or_path": "tiny", "stage": "sft", "finetuning_type": "lora",
                                    "dataset": f"{big},{big}", "max_samples": rows}), encoding="utf-8")
    tracemalloc.start()
    try:
        result = import_file(peer)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    line = _line(result, "max_samples")
    assert line.verdict == DROPPED and f"(at most {rows})" in line.text(), line.text()
    assert peak < 12 * 1024 * 1024, peak  # the file is 24 MB; loading its records took several times that
    peer.write_text(peer.read_text(encoding="utf-8").replace(f"max_samples: {rows}", f"max_samples: {rows - 1}"),
                    encoding="utf-8")
    assert _line(import_file(peer), "max_samples").verdict == NEEDS_YOU


def test_max_samples_counts_a_compressed_jsonl_streaming_and_never_reads_a_compressed_file_whole(tmp_path):
    """A .jsonl.gz (read since compressed data files are) was not a JSON Lines file to the max_samples count (its
    suffix is .gz) and, being small on disk, was loaded whole: a 40 KB archive of 24 MB of rows held its every
    record, and a 60 MB one GBs, where the count promises bounded memory. Now it is counted streaming as it is
    decompressed; another compressed file is not read at all (no count claimed: the needs-you line stays), and
    a .txt.gz, as a .txt, is not counted (LLaMA-Factory reads a line per row, tunedeck a block)."""
    import gzip
    import tracemalloc

    row = json.dumps({"messages": [{"role": "user", "content": "q" * 200}, {"role": "assistant", "content": "a" * 200}]})
    rows = 60_000
    big = tmp_path / "big.jsonl.gz"
    with gzip.open(big, "wt", encoding="utf-8") as stream:
        stream.write((row + "\n") * rows)

    def imported(dataset: Path, count: int):
        peer = tmp_path / "lf.yaml"
        peer.write_text(yaml.safe_dump({"model_name_or_path": "tiny", "stage": "sft", "finetuning_type": "lora",
                                        "dataset": str(dataset), "max_samples": count}), encoding="utf-8")
        return _line(import_file(peer), "max_samples")

    tracemalloc.start()
    try:
        line = imported(big, rows)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert line.verdict == DROPPED and f"(at most {rows})" in line.text(), line.text()
    assert peak < 12 * 1024 * 1024, peak  # 25 MB of rows; loading their records took several times that
    array = tmp_path / "rows.json.gz"
    array.write_bytes(gzip.compress(json.dumps([json.loads(row)] * 3).encode()))
    assert imported(array, 3).verdict == NEEDS_YOU
    text = tmp_path / "corpus.txt.gz"
    text.write_bytes(gzip.compress(b"one\ntwo\nthree\n"))
    assert imported(text, 1).verdict == NEEDS_YOU  # one block to tunedeck, three rows to LLaMA-Factory


def test_nproc_per_node_that_agrees_with_cuda_visible_devices_is_no_conflict():
    """``CUDA_VISIBLE_DEVICES=0,1 NPROC_PER_NODE=2 swift sft ...`` is ms-swift's way to train on two GPUs: the two
    said one thing, but NPROC_PER_NODE was marked "needs you: gpus is already taken", so `train` refused the line.
    Now they agree on gpus [0, 1]; a count below the list takes its first GPUs, as torchrun does; a count past it
    still needs the user."""
    base = ["swift", "sft", "--model", "Qwen/A", "--dataset", "a.jsonl"]
    for env in (["CUDA_VISIBLE_DEVICES=0,1", "NPROC_PER_NODE=2"], ["NPROC_PER_NODE=2", "CUDA_VISIBLE_DEVICES=0,1"]):
        result = import_command([*env, *base])
        assert result.config["gpus"] == [0, 1]
        assert _line(result, "NPROC_PER_NODE").verdict == TAKEN and result.counts()[NEEDS_YOU] == 0
    result = import_command(["CUDA_VISIBLE_DEVICES=2,3,4", "NPROC_PER_NODE=2", *base])
    assert result.config["gpus"] == [2, 3]
    assert _line(result, "CUDA_VISIBLE_DEVICES").outcome.values == {"gpus": [2, 3]}
    result = import_command(["CUDA_VISIBLE_DEVICES=0,1", "NPROC_PER_NODE=4", *base])
    assert result.config["gpus"] == [0, 1] and _line(result, "NPROC_PER_NODE").verdict == NEEDS_YOU


def test_cuda_visible_devices_without_nproc_keeps_ms_swifts_effective_batch():
    """``CUDA_VISIBLE_DEVICES=0,1 swift sft ...`` without NPROC_PER_NODE is ONE ms-swift process with the model spread
    over both GPUs (device_map): micro 2 x accumulation 8 = 16. tunedeck took gpus [0, 1] (one process per GPU) with
    the accumulation of 8, a run at an effective batch of 32 that the mapping did not mention. The batch per process
    is divided now (16 over 2 processes) and both lines say why; where the batch does not split over every GPU, the
    most GPUs it splits over. Hardware: none (a conversion)."""
    base = ["swift", "sft", "--model", "Qwen/A", "--dataset", "a.jsonl"]

    def effective(config):
        return config["micro_batch_size"] * config["gradient_accumulation"] * len(config["gpus"])

    result = import_command(["CUDA_VISIBLE_DEVICES=0,1", *base, "--per_device_train_batch_size", "2",
                             "--gradient_accumulation_steps", "8"])
    assert (result.config["gpus"], result.config["micro_batch_size"], result.config["gradient_accumulation"]) == \
        ([0, 1], 2, 4)
    assert "ONE process" in _line(result, "CUDA_VISIBLE_DEVICES").text()
    assert "effective batch of 16" in _line(result, "gradient_accumulation_steps").text()
    assert result.counts()[NEEDS_YOU] == 0
    # ms-swift's own accumulation (ceil(16 / 1 / 1 process)) is divided likewise
    assert effective(import_command(["CUDA_VISIBLE_DEVICES=0,1", *base]).config) == 16
    # 2 x 1 over 3 GPUs: 2 of them, one sample each
    config = import_command(["CUDA_VISIBLE_DEVICES=0,1,2", *base, "--per_device_train_batch_size", "2",
                             "--gradient_accumulation_steps", "1"]).config
    assert (config["gpus"], config["micro_batch_size"], config["gradient_accumulation"]) == ([0, 1], 1, 1)
    # with NPROC_PER_NODE the processes are ms-swift's too: nothing divided
    config = import_command(["CUDA_VISIBLE_DEVICES=0,1", "NPROC_PER_NODE=2", *base,
                             "--gradient_accumulation_steps", "8"]).config
    assert config["gradient_accumulation"] == 8


def test_eval_strategy_says_what_the_converted_run_evaluates(tmp_path):
    """``eval_strategy: steps`` was dropped as "tunedeck ... evaluates at each save" where the file holds nothing out
    (no val_size): the converted run evaluates nothing. It says so now, and how to evaluate; with a share held out it
    says that share is evaluated at each save, and a strategy ``no`` beside a held-out share that tunedeck evaluates
    it all the same. Hardware: none (a conversion)."""
    head = "model_name_or_path: Qwen/A\nstage: sft\ndo_train: true\nfinetuning_type: lora\ndataset: a.jsonl\n"

    def line(text):
        path = tmp_path / "lf.yaml"
        path.write_text(head + text, encoding="utf-8")
        return _line(import_file(path), "eval_strategy")

    nothing = line("eval_strategy: steps\n")
    assert nothing.verdict == DROPPED and "evaluates at each save" not in nothing.text()
    assert "holds nothing out" in nothing.text() and "set eval_split" in nothing.text(), nothing.text()
    held = line("eval_strategy: steps\nval_size: 0.1\n")
    assert "held out (eval_split) at each save" in held.text(), held.text()
    off = line("eval_strategy: 'no'\nval_size: 0.1\n")
    assert "the peer evaluates nothing, but the converted run evaluates" in off.text(), off.text()
    result = import_command(["swift", "sft", "--model", "Qwen/A", "--dataset", "a.jsonl", "--eval_strategy", "no",
                             "--save_strategy", "steps"])
    assert "neither does the converted run" in _line(result, "eval_strategy").text()
    assert "evaluates" not in _line(result, "save_strategy").text()


def test_qdora_says_why_tunedeck_cannot_and_which_key_to_remove(tmp_path):
    """``quantization_bit: 4`` with ``use_dora: true`` (DoRA on a 4-bit model, QDoRA) read "method is already taken as
    qlora from quantization_bit; keep one of the two": no word of why, nor of what each choice trains. It says now
    that tunedeck has no DoRA on 4-bit weights and which key to remove for qlora and for dora, naming the keys as
    each peer's file spells them. Hardware: none (a conversion)."""
    path = tmp_path / "lf.yaml"
    path.write_text("model_name_or_path: Qwen/A\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
                    "dataset: a.jsonl\nquantization_bit: 4\nuse_dora: true\n", encoding="utf-8")
    line = _line(import_file(path), "use_dora")
    assert line.verdict == NEEDS_YOU and "QDoRA" in line.text() and "already taken" not in line.text()
    assert "remove use_dora for method: qlora" in line.text(), line.text()
    assert "remove quantization_bit for method: dora" in line.text(), line.text()
    result = import_command(["swift", "sft", "--model", "Qwen/A", "--dataset", "a.jsonl", "--train_type", "lora",
                             "--use_dora", "true", "--quant_bits", "4"])
    line = _line(result, "quant_bits")
    assert "remove use_dora for method: qlora" in line.text() and "remove quant_bits for method: dora" in line.text()


def test_cuda_visible_devices_by_uuid_or_hiding_every_gpu_is_said_as_such():
    """``CUDA_VISIBLE_DEVICES=GPU-<uuid> swift sft ...`` read "tunedeck refuses gpus: the list must not be empty"
    (the UUIDs left out as not digits), and ``CUDA_VISIBLE_DEVICES=`` or ``-1`` (no GPU: the peer trained on the
    CPU) "an environment variable tunedeck does not read". A UUID list needs the user with the indices as the way
    on; a list that hides every GPU is dropped saying tunedeck uses the GPUs it finds. Hardware: none."""
    base = ["swift", "sft", "--model", "Qwen/A", "--dataset", "a.jsonl"]
    uuid = "GPU-8f3a2b1c-1111-2222-3333-444455556666"
    for value in (uuid, f"0,{uuid}"):
        line = _line(import_command([f"CUDA_VISIBLE_DEVICES={value}", *base]), "CUDA_VISIBLE_DEVICES")
        assert line.verdict == NEEDS_YOU and "names GPUs by UUID" in line.text() and "gpus=0,1" in line.text()
        assert "must not be empty" not in line.text()
    for value in ("", "-1"):
        result = import_command([f"CUDA_VISIBLE_DEVICES={value}", *base])
        line = _line(result, "CUDA_VISIBLE_DEVICES")
        assert line.verdict == DROPPED and "hides every GPU" in line.text(), line.text()
        assert "gpus" not in result.config and result.counts()[NEEDS_YOU] == 0


def test_lazy_tokenize_is_dropped_with_what_tunedeck_does_instead():
    """ms-swift's ``--lazy_tokenize true`` (tokenize each sample as the loader reaches it) was dropped as
    "tunedeck's data loading has no worker setting", a reason about another key; it says tunedeck tokenizes the
    whole dataset once before the first step. Hardware: none."""
    result = import_command(["swift", "sft", "--model", "Qwen/A", "--dataset", "a.jsonl", "--lazy_tokenize", "true"])
    line = _line(result, "lazy_tokenize")
    assert line.verdict == DROPPED and "tokenizes the whole dataset once" in line.text(), line.text()


def test_an_ms_swift_2_script_converts_its_renamed_keys():
    """ms-swift 2's script keys (``--dtype``, ``--batch_size``, ``--lora_target_modules``, ``--lora_dropout_p``,
    ``--custom_train_dataset_path``, ``--dataset_test_ratio``; ms-swift 3 renamed them) were unknown keys, each
    "needs you", so `train` refused a script of that day that says nothing tunedeck cannot do. They convert now;
    ``DEFAULT`` targets (the modules ms-swift 2 listed per model type) still need the user. Hardware: none."""
    base = ["swift", "sft", "--model_id_or_path", "qwen/Qwen1.5-7B-Chat", "--sft_type", "lora"]
    result = import_command([*base, "--dtype", "bf16", "--batch_size", "2", "--lora_target_modules", "ALL",
                             "--lora_dropout_p", "0.1", "--custom_train_dataset_path", "data/train.jsonl",
                             "--dataset_test_ratio", "0.01"])
    assert result.counts()[NEEDS_YOU] == 0, [line.text() for line in result.lines if line.verdict == NEEDS_YOU]
    assert {key: result.config[key] for key in ("precision", "micro_batch_size", "lora_targets", "lora_dropout",
                                                "dataset", "eval_split")} == {
        "precision": "bf16", "micro_batch_size": 2, "lora_targets": "all-linear", "lora_dropout": 0.1,
        "dataset": "data/train.jsonl", "eval_split": 0.01}
    line = _line(import_command([*base, "--lora_target_modules", "DEFAULT"]), "lora_target_modules")
    assert line.verdict == NEEDS_YOU and "q_proj, k_proj, v_proj" in line.text()


def test_padding_free_is_a_speed_setting_not_a_blocker(tmp_path):
    """``--padding_free true`` (ms-swift: the batch flattened without padding, the same loss) was an unknown key, "needs
    you", so `train` refused a swift line that has it; now it is dropped with what tunedeck does instead. Hardware:
    none (the conversion only)."""
    from core.config.importers import blocking_lines

    result = import_command(["swift", "sft", "--model", "Qwen/A", "--dataset", "a.jsonl", "--padding_free", "true"])
    line = _line(result, "padding_free")
    assert line.verdict == DROPPED and "packing: true" in line.text()
    assert blocking_lines(result) == []


def test_eval_steps_where_nothing_is_held_out_is_dropped_not_refused(tmp_path):
    """``--split_dataset_ratio 0 --eval_steps 50`` (ms-swift) or ``eval_steps: 500`` without ``val_size``
    (LLaMA-Factory): the peer evaluates nothing, but eval_steps was taken and tunedeck refused the converted file
    ("eval_steps is set but eval_split is 0"), so `train` refused a script that trains there. Now eval_steps is
    dropped, saying how to evaluate; with a split it is taken as before. Hardware: none (the conversion only)."""
    base = ["swift", "sft", "--model", "Qwen/A", "--dataset", "a.jsonl", "--eval_steps", "50"]
    result = import_command([*base, "--split_dataset_ratio", "0"])
    assert "eval_steps" not in result.config and _line(result, "eval_steps").verdict == DROPPED
    assert "set eval_split" in _line(result, "eval_steps").text()
    assert import_command([*base, "--split_dataset_ratio", "0.05"]).config["eval_steps"] == 50
    peer = tmp_path / "lf.yaml"
    peer.write_text("model_name_or_path: Qwen/A\nstage: sft\nfinetuning_type: lora\ndataset: a.jsonl\n"
                    "eval_steps: 500\n")
    result = import_file(peer)
    assert "eval_steps" not in result.config and _line(result, "eval_steps").verdict == DROPPED
    peer.write_text(peer.read_text() + "val_size: 0.1\n")
    assert import_file(peer).config["eval_steps"] == 500


def test_llamafactory_quantisation_settings_tunedeck_uses_are_not_blockers(tmp_path):
    """LLaMA-Factory's ``double_quantization: true`` and ``quantization_type: nf4`` (its defaults, written out in many
    QLoRA files) were unknown keys that needed the user, so `train` refused the file, though tunedeck's QLoRA loads
    NF4 with double quantisation; now they are dropped as what tunedeck trains with anyway, and a value it does not
    use (fp4) still needs the user. Hardware: none (the conversion only)."""
    from core.config.importers import blocking_lines

    peer = tmp_path / "lf.yaml"
    peer.write_text("model_name_or_path: Qwen/A\nstage: sft\nfinetuning_type: lora\ndataset: a.jsonl\n"
                    "quantization_bit: 4\nquantization_type: nf4\ndouble_quantization: true\n")
    result = import_file(peer)
    assert result.config["method"] == "qlora"
    assert _line(result, "double_quantization").verdict == DROPPED
    assert _line(result, "quantization_type").verdict == DROPPED and blocking_lines(result) == []
    peer.write_text(peer.read_text().replace("nf4", "fp4"))
    assert _line(import_file(peer), "quantization_type").verdict == NEEDS_YOU


@pytest.mark.parametrize(("value", "expected"), [
    ("default-zero2", {"zero_stage": 2}), ("default-zero3", {"zero_stage": 3}),
    ("zero3-offload", {"zero_stage": 3, "offload": "all"}), ("zero2_offload", {"zero_stage": 2, "offload": "optimizer"}),
    ("zero2.json", {"deepspeed": "zero2.json"})])
def test_swift_deepspeed_shorthands_of_every_version(value, expected):
    """ms-swift 2's ``--deepspeed default-zero2`` (and ``default-zero3``, ``zero3-offload``) was taken as a DeepSpeed
    JSON path named "default-zero2", which no run finds; it is the ZeRO stage it names, as ms-swift 3's ``zero2`` is.
    A file name stays a path. Hardware: none (the conversion only)."""
    result = import_command(["swift", "sft", "--model", "Qwen/A", "--dataset", "a.jsonl", "--deepspeed", value])
    assert _line(result, "deepspeed").outcome.values == expected


def test_train_key_value_decides_a_line_that_needs_you(tmp_path):
    """``swift sft --model $MODEL ...``: ``train run.sh model=tiny`` was refused ("model: $MODEL → needs you") though
    the command line had just given the model; a ``key=value`` that sets a line's tunedeck key now decides that line
    (a scheduler the peer has and tunedeck lacks, decided by ``lr_scheduler=cosine``), the others still refuse, and
    the refusal says this way out too. Hardware: none needed (train --check of a CPU run, no GPU asked for)."""
    home = tmp_path / "home"
    data = _data(tmp_path / "d.jsonl")
    script = tmp_path / "run.sh"
    script.write_text(f"swift sft --model $MODEL --train_type lora --dataset {data} --max_length 64 "
                      "--lr_scheduler_type cosine_with_min_lr --torch_dtype float32\n", encoding="utf-8")
    out = _tunedeck(home, "train", str(script), "model=tiny", "--check")
    assert out.returncode == 2 and "model: $MODEL" not in out.stderr.partition("cannot be trained")[2]
    assert "lr_scheduler_type: cosine_with_min_lr → needs you" in out.stderr
    assert f"tunedeck train {script} model=" in out.stderr
    out = _tunedeck(home, "train", str(script), "model=tiny", "lr_scheduler=cosine", "--check")
    assert out.returncode == 0, out.stderr


def test_llamafactory_pretraining_packs_as_llamafactory_does(tmp_path):
    """LLaMA-Factory packs pre-training text (``stage: pt``, its packing None turns on), but the converted file
    trained unpacked: other rows, other steps than the file's. Now packing: true is taken as its default for pt, said
    so; a file that says packing: false keeps it, and SFT is not packed. Hardware: none (the conversion only)."""
    peer = tmp_path / "pt.yaml"
    base = "model_name_or_path: Qwen/A\nfinetuning_type: lora\ndataset: a.jsonl\n"
    peer.write_text(base + "stage: pt\n")
    result = import_file(peer)
    assert result.config["packing"] is True and result.config["loss_on"] == "all"
    assert "packs the text of pre-training" in next(line for line in result.mapping if line.key == "packing").text()
    peer.write_text(base + "stage: pt\npacking: false\n")
    assert import_file(peer).config.get("packing") in (None, False)
    peer.write_text(base + "stage: sft\n")
    assert "packing" not in import_file(peer).config


def test_gpus_override_keeps_the_peers_effective_batch():
    """``train sw.sh gpus=[0]`` of ``CUDA_VISIBLE_DEVICES=0,1 swift sft ...`` kept the accumulation import halved for
    two processes: one GPU then trained at half ms-swift's effective batch, unsaid. A gpus override now divides the
    peer's effective batch over the GPUs it gives (said as a warning); where it cannot, or the GPUs are the box's
    (all), the warning says the effective batch changes; a batch override on the command line is taken as given.
    Hardware: none (the configuration is checked, nothing runs)."""
    from core.config.importers import load_imported_config

    sample = Path(__file__).resolve().parents[2] / "core" / "data" / "samples" / "tiny_skills.jsonl"
    result = import_command(["CUDA_VISIBLE_DEVICES=0,1", "swift", "sft", "--model", "tiny", "--dataset", str(sample),
                             "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "8"])
    assert result.peer_batch == 16 and result.config["gradient_accumulation"] == 4
    config = load_imported_config(result, ["gpus=[0]"])
    assert (config.micro_batch_size, config.gradient_accumulation) == (2, 8)
    assert any("effective batch 16 kept" in str(warning) for warning in config.warnings), config.warnings
    config = load_imported_config(result, ["gpus=4"])
    assert (config.micro_batch_size, config.gradient_accumulation) == (2, 2)
    for gpus, now in (("gpus=3", "= 24"), ("gpus=all", "= 8 × the box's GPU count")):
        config = load_imported_config(result, [gpus])
        assert config.gradient_accumulation == 4
        assert any("no longer ms-swift's 16" in str(w) and now in str(w) for w in config.warnings), config.warnings
    config = load_imported_config(result, ["gpus=[0]", "gradient_accumulation=2"])
    assert config.gradient_accumulation == 2 and not any("effective batch" in str(w) for w in config.warnings)
    config = load_imported_config(result, ["gpus=[0,1]"])
    assert config.gradient_accumulation == 4 and not any("effective batch" in str(w) for w in config.warnings)


def test_args_json_keeps_its_world_size_as_the_gpu_count(tmp_path):
    """An ms-swift args.json says how many processes trained (``global_world_size``), each at the file's micro-batch and
    accumulation; import dropped it as the launcher's and wrote ``gpus: all``, so on a box with more GPUs than the
    original run the effective batch grew unsaid (2 x 4 x 2 = 16 became 2 x 4 x 8 on eight). It is the GPU count now,
    said, and ``gpus=N`` on the command line keeps the batch. Hardware: none (a conversion, checked)."""
    from core.config.importers import load_imported_config

    args = tmp_path / "args.json"
    args.write_text(json.dumps({"model": "tiny", "train_type": "lora",
                                "dataset": [str(ROOT / "core" / "data" / "samples" / "tiny_skills.jsonl")],
                                "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4,
                                "global_world_size": 2, "local_world_size": 2, "rank": 0}))
    result = import_file(args)
    assert result.config["gpus"] == 2 and result.peer_batch == 16
    line = _line(result, "global_world_size")
    assert line.verdict == TAKEN and "2 processes" in line.text(), line.text()
    config = load_imported_config(result, ["gpus=1"])
    assert (config.micro_batch_size, config.gradient_accumulation, config.gpus) == (2, 8, 1)
