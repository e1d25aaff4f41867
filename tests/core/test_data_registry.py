"""The dataset registry (#17): LLaMA-Factory ``dataset_info.json`` names, ``:split``, ``#N`` sampling.

The dataset_info.json files and data files are written here in LLaMA-Factory's documented shape
(data/README.md): ``file_name``, ``formatting``, ``columns``, ``tags``, ``ranking``, hub URLs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.data import DataError, load_training_records
from core.data import loading as loading_module
from core.data.readers import RawRow
from core.data.registry import parse_spec, resolve_sources, sample_records

REPO = Path(__file__).resolve().parents[2]


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value, ensure_ascii=False, indent=2), encoding="utf-8")
    return path


@pytest.fixture
def lf_data(tmp_path):
    """A LLaMA-Factory style data folder: identity + alpaca_en_demo + a sharegpt file with custom tags."""
    data = tmp_path / "data"
    data.mkdir()
    write_json(data / "identity.json", [
        {"instruction": "hi", "input": "", "output": "Hello! I am {{name}}, made by {{author}}."},
        {"instruction": "Who are you?", "input": "", "output": "I am {{name}}."},
    ])
    write_json(data / "alpaca_en_demo.json", [
        {"instruction": f"Task {i}", "input": "", "output": f"Answer {i}"} for i in range(5)
    ])
    write_json(data / "custom_chat.json", [
        {"dialog": [{"speaker": "me", "says": "Hi"}, {"speaker": "bot", "says": "Hello"}], "sys": "Be nice."},
        {"dialog": [{"speaker": "me", "says": "Bye"}, {"speaker": "bot", "says": "Goodbye"}]},
    ])
    write_json(data / "renamed_alpaca.json", [{"q": "Question", "ctx": "context", "a": "Reply"}])
    write_json(data / "dpo_en_demo.json", [
        {"conversations": [{"from": "human", "value": "Pick"}], "chosen": {"from": "gpt", "value": "A"},
         "rejected": {"from": "gpt", "value": "B"}},
    ])
    write_json(data / "dataset_info.json", {
        "identity": {"file_name": "identity.json"},
        "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"},
        "custom_chat": {"file_name": "custom_chat.json", "formatting": "sharegpt",
                        "columns": {"messages": "dialog", "system": "sys"},
                        "tags": {"role_tag": "speaker", "content_tag": "says", "user_tag": "me",
                                 "assistant_tag": "bot"}},
        "renamed_alpaca": {"file_name": "renamed_alpaca.json",
                           "columns": {"prompt": "q", "query": "ctx", "response": "a"}},
        "dpo_en_demo": {"file_name": "dpo_en_demo.json", "formatting": "sharegpt", "ranking": True,
                        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"}},
        "ultrachat_200k": {"hf_hub_url": "HuggingFaceH4/ultrachat_200k", "ms_hub_url": "AI-ModelScope/ultrachat_200k",
                           "split": "train_sft", "formatting": "sharegpt", "columns": {"messages": "messages"},
                           "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                                    "assistant_tag": "assistant"}},
    })
    return data


def test_names_resolve_through_dataset_info(lf_data):
    records = load_training_records("identity,alpaca_en_demo", dataset_info=str(lf_data / "dataset_info.json"))
    assert len(records) == 2 + 5
    assert records[0].messages[1].content.startswith("Hello! I am")
    assert records[2].messages[0].content == "Task 0"


def test_dataset_dir_and_next_to_the_config(lf_data, tmp_path):
    assert len(load_training_records(["identity"], dataset_dir=str(lf_data))) == 2
    assert len(load_training_records(["alpaca_en_demo"], base_dir=lf_data)) == 5


def test_sharegpt_with_custom_tags_and_columns(lf_data):
    records = load_training_records("custom_chat", dataset_dir=str(lf_data))
    assert len(records) == 2
    assert records[0].system == "Be nice."
    assert [(m.role, m.content) for m in records[0].messages] == [("user", "Hi"), ("assistant", "Hello")]


def test_alpaca_columns_mapping(lf_data):
    (record,) = load_training_records("renamed_alpaca", dataset_dir=str(lf_data))
    assert record.messages[0].content == "Question\ncontext" and record.messages[1].content == "Reply"


def test_an_undeclared_tag_is_located_and_named(lf_data):
    write_json(lf_data / "custom_chat.json", [
        {"dialog": [{"speaker": "me", "says": "Hi"}, {"speaker": "narrator", "says": "..."}]}])
    with pytest.raises(DataError) as info:
        load_training_records("custom_chat", dataset_dir=str(lf_data))
    (issue,) = info.value.issues
    assert issue.line == 2 and "\"narrator\"" in issue.message and "dataset 'custom_chat'" in issue.message


def test_chat_rows_under_the_default_alpaca_name_their_keys_and_the_formatting_that_reads_them(lf_data):
    """An entry with no formatting (alpaca) over a file of chat ``messages`` rows: the problem names the keys
    the row has ('messages', not "none" after the mapping) and the entry keys that read it, which do."""
    write_json(lf_data / "chat.json", [
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}])
    info = json.loads((lf_data / "dataset_info.json").read_text(encoding="utf-8"))
    info["mychat"] = {"file_name": "chat.json"}
    write_json(lf_data / "dataset_info.json", info)
    with pytest.raises(DataError) as error:
        load_training_records("mychat", dataset_dir=str(lf_data))
    (issue,) = error.value.issues
    assert "the row has keys 'messages'" in issue.message and "keys none" not in issue.message
    assert "no 'instruction' column, which alpaca formatting reads (dataset 'mychat')" in issue.message
    entry = issue.message.split(f"add to the entry of 'mychat' in {lf_data / 'dataset_info.json'}: ", 1)[1]
    info["mychat"].update(json.loads("{" + entry + "}"))
    assert info["mychat"]["formatting"] == "sharegpt"
    write_json(lf_data / "dataset_info.json", info)
    (record,) = load_training_records("mychat", dataset_dir=str(lf_data))
    assert [(m.role, m.content) for m in record.messages] == [("user", "Hi"), ("assistant", "Hello")]


def test_a_ranking_entry_is_refused_as_preference_data(lf_data):
    with pytest.raises(DataError, match=r"preference \(DPO\) data"):
        load_training_records("dpo_en_demo", dataset_dir=str(lf_data))


def test_unknown_names_are_reported_with_a_suggestion(lf_data):
    with pytest.raises(DataError) as info:
        load_training_records("identiti,alpaca_en_demo", dataset_dir=str(lf_data))
    (issue,) = info.value.issues
    assert issue.file == "identiti" and "did you mean 'identity'?" in issue.message


def test_a_name_without_any_dataset_info_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="no dataset_info.json"):
        load_training_records("identity")


def test_a_bad_entry_names_the_file_line_and_key(lf_data):
    info = json.loads((lf_data / "dataset_info.json").read_text())
    info["broken"] = {"file_name": "identity.json", "formatting": "yaml"}
    write_json(lf_data / "dataset_info.json", info)
    with pytest.raises(DataError) as caught:
        load_training_records("broken", dataset_dir=str(lf_data))
    (issue,) = caught.value.issues
    assert issue.file.endswith("dataset_info.json") and issue.line is not None
    assert "'formatting' is yaml; allowed: alpaca, sharegpt, openai" in issue.message


def test_parse_spec_reads_split_and_sample_suffixes():
    assert parse_spec("data/x.json#100") == ("data/x.json", None, 100)
    assert parse_spec("HuggingFaceH4/ultrachat_200k:train_sft#5") == ("HuggingFaceH4/ultrachat_200k", "train_sft", 5)
    assert parse_spec("name#500") == ("name", None, 500)
    with pytest.raises(ValueError, match="at least 1"):
        parse_spec("x.json#0")


def test_hub_ids_get_their_split_and_never_the_suffixes(lf_data, monkeypatch):
    calls = []

    def fake_hub_rows(dataset_id, hub, split, subset=None):
        calls.append((dataset_id, hub, split))
        return iter([RawRow({"messages": [{"role": "user", "content": f"q{i}"},
                                          {"role": "assistant", "content": f"a{i}"}]}, None, i) for i in range(10)])

    monkeypatch.setattr(loading_module, "_hub_rows", fake_hub_rows)
    monkeypatch.setattr(loading_module, "network_reachable", lambda hub: True)
    records = load_training_records("HuggingFaceH4/ultrachat_200k:train_sft#3", hub="huggingface", seed=1)
    assert calls[-1] == ("HuggingFaceH4/ultrachat_200k", "huggingface", "train_sft") and len(records) == 3
    load_training_records("owner/data", hub="huggingface", split="test")
    assert calls[-1] == ("owner/data", "huggingface", "test")
    load_training_records("owner/data", hub="huggingface")
    assert calls[-1] == ("owner/data", "huggingface", "train")
    # A registry entry with hub URLs: the hub's id, its split, its tags (role/content).
    records = load_training_records("ultrachat_200k#4", hub="modelscope", dataset_dir=str(lf_data))
    assert calls[-1] == ("AI-ModelScope/ultrachat_200k", "modelscope", "train_sft") and len(records) == 4


def test_sampling_local_files_is_deterministic_with_the_seed(lf_data):
    path = str(lf_data / "alpaca_en_demo.json")
    first = load_training_records(f"{path}#3", seed=7)
    again = load_training_records(f"{path}#3", seed=7)
    assert len(first) == 3 and [r.origin for r in first] == [r.origin for r in again]
    other = {tuple(r.origin for r in load_training_records(f"{path}#3", seed=s)) for s in range(6)}
    assert len(other) > 1  # the seed picks which
    assert len(load_training_records(f"{path}#12", seed=7)) == 12  # more than there are: repeated, then drawn
    assert len(load_training_records("alpaca_en_demo#2", dataset_dir=str(lf_data))) == 2


def test_sample_records_keeps_file_order():
    picked = sample_records(list(range(100)), 10, seed=3)
    assert picked == sorted(picked) and len(set(picked)) == 10


def test_resolve_sources_keeps_local_paths_with_suffixes(lf_data):
    (source,) = resolve_sources(f"{lf_data / 'identity.json'}#1")
    assert source.kind == "file" and source.sample == 1 and source.location == str(lf_data / "identity.json")


# -- the whole path a run takes: the YAML, train's data check, the trainer's reading ----------------
def test_a_config_naming_datasets_resolves_through_train_checks(lf_data, tmp_path, monkeypatch):
    from core.runs import load_run_file

    config_path = lf_data / "run.yaml"  # LLaMA-Factory keeps its dataset_info.json beside the data
    config_path.write_text("model: tiny\ndataset: identity,alpaca_en_demo#3\nseed: 5\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # elsewhere: the names must resolve from the config's folder
    config = load_run_file(config_path).config  # train's checks, the data's included: RunError on a problem
    assert config.dataset_info == str((lf_data / "dataset_info.json").resolve())
    from core.train.data_adapter import load_records

    records = load_records(config.datasets, config.hub, config.to_dict())  # what the trainer reads
    assert len(records) == 2 + 3


def test_dataset_dir_key_in_a_config(lf_data, tmp_path, monkeypatch):
    from core.runs import load_run_file

    config_path = tmp_path / "run.yaml"
    config_path.write_text("model: tiny\ndataset: [custom_chat]\ndataset_dir: data\nsplit: train\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path / "..")
    config = load_run_file(config_path).config
    assert config.dataset_dir == str(lf_data.resolve())


def test_train_check_data_refuses_a_dpo_name(lf_data):
    from core.runs import RunError, load_run_file

    config_path = lf_data / "run.yaml"
    config_path.write_text("model: tiny\ndataset: dpo_en_demo\n", encoding="utf-8")
    with pytest.raises(RunError, match=r"dpo_en_demo.json:2: preference \(DPO\) data"):
        load_run_file(config_path)


def test_data_check_json_names_the_format_and_the_refusal(tmp_path):
    good = tmp_path / "qr.jsonl"
    good.write_text(json.dumps({"query": "q", "response": "r", "history": [["a", "b"]]}) + "\n", encoding="utf-8")
    kto = tmp_path / "kto.jsonl"
    kto.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "q"},
                                                    {"role": "assistant", "content": "a"}], "label": flag}) + "\n"
                           for flag in (True, False)), encoding="utf-8")
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8"}
    env.pop("LC_ALL", None)
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from core.cli import main; "
         "rcs = [main(['--lang', 'en', 'data', 'check', p, '--json']) for p in sys.argv[1:]]; "
         "sys.stderr.write(repr(rcs))", str(good), str(kto)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    first, second = (json.loads(line) for line in out.stdout.splitlines())
    assert out.stderr.strip() == "[0, 1]"
    assert first["format"] == "query_response" and first["records"] == 1 and first["assistant_turns"] == 2
    assert second["format"] == "kto" and second["records"] == 0 and not second["ok"]
    (issue,) = second["issues"]
    assert issue["line"] == 1 and issue["message"].startswith("KTO data (2 rows")


def test_train_check_resolves_names_and_refuses_dpo(lf_data, tmp_path):
    (lf_data / "run.yaml").write_text("model: tiny\ndataset: identity,alpaca_en_demo#3\n", encoding="utf-8")
    (lf_data / "dpo.yaml").write_text("model: tiny\ndataset: dpo_en_demo\n", encoding="utf-8")
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8"}
    env.pop("LC_ALL", None)

    def train_check(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "core", "--lang", "en", "train", str(lf_data / name), "--check"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    ok = train_check("run.yaml")
    assert ok.returncode == 0, ok.stderr
    assert "dataset: [identity, alpaca_en_demo#3]" in ok.stdout
    assert f"dataset_info: {(lf_data / 'dataset_info.json').resolve()}" in ok.stdout
    refused = train_check("dpo.yaml")
    assert refused.returncode == 2
    assert "dpo_en_demo.json:2: preference (DPO) data (1 rows" in refused.stderr + refused.stdout


def test_resume_fingerprint_follows_a_sampled_file(lf_data):
    from core.runs.fingerprint import data_fingerprint

    (entry,) = data_fingerprint([f"{lf_data / 'alpaca_en_demo.json'}#3"])
    assert entry["kind"] == "file" and entry["files"][0]["records"] == 5


def test_a_dataset_info_folder_is_read_whole_whatever_its_files_are_named(tmp_path):
    """A dataset_info.json entry whose file_name is a folder is read whole by LLaMA-Factory (every file in it,
    one train split), as the loader says it reads it; the split-by-file-name reading of a folder named in a
    run's dataset left its test.json out, silently (no left_out), so a run trained on fewer rows than
    LLaMA-Factory does on the same entry."""
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, count in (("train.json", 2), ("test.json", 3)):
        write_json(folder / name, [{"instruction": f"{name} {i}", "input": "", "output": "a"} for i in range(count)])
    write_json(tmp_path / "dataset_info.json", {"mine": {"file_name": "mine"}})
    records = load_training_records("mine", dataset_info=str(tmp_path / "dataset_info.json"))
    assert len(records) == 5
