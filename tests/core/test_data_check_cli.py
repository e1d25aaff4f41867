"""``tunedeck data check`` as a real subprocess: exit codes, human output, --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "data"


@pytest.fixture
def run(tmp_path):
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8"}
    env.pop("LC_ALL", None)

    def _run(*args: str, home: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "core", "--lang", "en", "data", "check", *args],
                              cwd=REPO, env={**env, "HOME": str(home)} if home else env, capture_output=True,
                              text=True, timeout=120)

    return _run


def test_good_file_exits_zero_with_a_human_report(run):
    result = run(str(FIXTURES / "sharegpt.jsonl"))
    assert result.returncode == 0, result.stderr
    assert "sharegpt" in result.stdout
    assert "3 usable of 3 rows" in result.stdout
    assert "approximate" in result.stdout


def test_malformed_file_exits_one_and_lists_file_line_errors(run):
    path = FIXTURES / "malformed.jsonl"
    result = run(str(path))
    assert result.returncode == 1
    for line in (2, 3, 5, 6, 7, 8, 9, 10):
        assert f"{path}:{line}: " in result.stdout


def test_json_output_is_only_json_on_stdout(run):
    result = run(str(FIXTURES / "malformed_array.json"), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["format"] == "alpaca"
    assert report["records"] == 2 and report["rows"] == 4
    assert [(i["line"], i["row"]) for i in report["issues"]] == [(3, 1), (4, 2)]
    assert report["tokens"]["exact"] is False


def test_model_tiny_gives_exact_token_counts_and_over_length(run):
    result = run(str(FIXTURES / "messages.jsonl"), "--model", "tiny", "--max-seq-len", "40", "--json")
    assert result.returncode == 0, result.stderr
    tokens = json.loads(result.stdout)["tokens"]
    assert tokens["exact"] is True and tokens["method"] == "tokenizer: tiny"
    assert tokens["count"] == 3 and tokens["min"] <= tokens["p50"] <= tokens["max"]
    assert tokens["max_seq_len"] == 40 and tokens["over_max"] == 1


def test_overlong_drop_says_the_long_samples_are_left_out(run):
    """data check said every long sample 'will be cut'; a run with overlong: drop leaves them out: the flag
    says so, and --json records which one the count is for."""
    args = (str(FIXTURES / "messages.jsonl"), "--model", "tiny", "--max-seq-len", "40")
    assert "1 of 3 samples are longer than 40 tokens and will be cut" in run(*args).stdout
    result = run(*args, "--overlong", "drop")
    assert result.returncode == 0, result.stderr
    assert "1 of 3 samples are longer than 40 tokens and will be left out (overlong: drop)" in result.stdout
    assert json.loads(run(*args, "--overlong", "drop", "--json").stdout)["tokens"]["overlong"] == "drop"


def test_missing_file_and_unreadable_file(run, tmp_path):
    result = run(str(tmp_path / "absent.jsonl"))
    assert result.returncode == 2 and "file not found" in result.stderr  # a user error (it was 1)
    result = run(str(tmp_path / "absent.jsonl"), "--json")
    assert result.returncode == 2 and json.loads(result.stdout)["ok"] is False


def test_model_that_is_not_local_is_a_usage_error(run, tmp_path):
    result = run(str(FIXTURES / "text.jsonl"), "--model", "Qwen/Qwen2.5-0.5B", "--json")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "never downloads" in result.stderr


def test_importing_config_and_data_loads_nothing_heavy():
    probe = ("import json, sys\nimport core.config, core.data, core.assets, core.data.commands\n"
             "core.config.default_demo_config()\nprint(json.dumps(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = {name.split(".")[0] for name in json.loads(result.stdout.splitlines()[-1])}
    assert "core" in loaded
    assert not {"torch", "transformers", "tokenizers", "pyarrow", "datasets", "modelscope", "textual",
                "rich"} & loaded


def test_a_huge_record_is_cut_before_tokenising_and_said_so(run, tmp_path):
    """A 50 MB message took 90 s and 10 GB to tokenise whole, with a raw transformers warning. Records
    beyond the cap (1 M characters with the default max_seq_len) are cut first, and the report names them
    at file:line; ordinary records keep exact counts. A 1.2 M-character message stands for the huge one."""
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"messages": [{"role": "user", "content": "word " * 240_000}, {"role": "assistant", "content": "ok"}]}]
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    result = run(str(path), "--model", "tiny")
    assert result.returncode == 0, result.stderr
    assert f"{path}:2: record is 1.2M characters; only its first" in result.stdout
    assert "Token indices sequence length" not in result.stderr + result.stdout
    data = json.loads(run(str(path), "--model", "tiny", "--json").stdout)
    assert [c["origin"] for c in data["capped"]] == [f"{path}:2"]
    assert data["capped"][0]["chars"] > 1_000_000 and data["tokens"]["max"] == data["capped"][0]["tokens_counted"]
    assert data["tokens"]["min"] < 50  # the short record is counted whole


def test_a_folder_a_sample_suffix_and_home_are_checked_and_a_hub_id_is_said(run, tmp_path):
    """data check took one file: a folder, ``x.jsonl#5`` and ``~/x.jsonl`` (which train all accept) were
    refused. They are read as train reads them (``#N``: the whole file, what the source holds); a hub id is
    said to be one rather than "file not found"."""
    folder = tmp_path / "data"
    folder.mkdir()
    good = (FIXTURES / "sharegpt.jsonl").read_text()
    (folder / "a.jsonl").write_text(good)
    (folder / "b.jsonl").write_text(good)
    rows = len(good.splitlines())
    for spec, records in ((str(folder), 2 * rows), (f"{folder / 'a.jsonl'}#1", rows), ("~/data/a.jsonl", rows)):
        result = run(spec, "--json", home=tmp_path)
        assert result.returncode == 0, (spec, result.stderr)
        assert json.loads(result.stdout)["records"] == records, spec
    hub = run("owner/name")
    assert hub.returncode == 2 and "owner/name: a hub dataset: data check reads data on this machine" in hub.stderr


def test_overlong_drop_that_leaves_no_sample_says_so_and_fails(run):
    """With --overlong drop and every sample past --max-seq-len, data check said only "3 of 3 ... will be left
    out" and exited 0, though the run would then fail with nothing to train on. Now it says so in the
    trainer's words, and exits 1 (--json: ok false, none_left)."""
    args = (str(FIXTURES / "messages.jsonl"), "--model", "tiny", "--max-seq-len", "16")
    result = run(*args, "--overlong", "drop")
    assert result.returncode == 1, result.stderr
    assert "3 samples longer than max_seq_len 16 tokens are left out (overlong: drop)" in result.stdout
    # the summary counts it: "problems none" next to a failing exit said the opposite of the exit status
    problems = [line.split() for line in result.stdout.splitlines() if line.strip().startswith("problems")]
    assert problems == [["problems", "1"]], result.stdout
    report = json.loads(run(*args, "--overlong", "drop", "--json").stdout)
    assert report["ok"] is False and "raise max_seq_len" in report["none_left"]
    assert run(*args).returncode == 0  # cut: every sample trains on its first 16 tokens


def test_thinking_false_counts_the_empty_think_block_a_run_renders(run, tmp_path):
    """data check counted a Qwen3-style model's samples with the template's default, a few tokens short per
    answer for a run with thinking: false (it renders an empty think block before each); --thinking false
    counts them as that run renders them, --thinking true as the default does here, a bad value is refused."""
    import shutil

    from transformers import AutoTokenizer

    from core.data import load_records
    from tests.core.test_plan_cli import QWEN3_STYLE_TEMPLATE
    from tests.fixtures.lifecycle.finished_run import TINY

    model = tmp_path / "qwen3ish"
    shutil.copytree(TINY, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    tokenizer.save_pretrained(model)
    data = FIXTURES / "messages.jsonl"
    args = (str(data), "--model", str(model), "--json")
    counted = {}
    for extra in ((), ("--thinking", "false"), ("--thinking", "true")):
        result = run(*args, *extra)
        assert result.returncode == 0, result.stderr
        counted[extra[1:]] = json.loads(result.stdout)["tokens"]
    block = len(tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"])
    answers = [sum(1 for m in record.messages if m.role == "assistant") for record in load_records(data)]
    assert counted[("false",)]["max"] > counted[()]["max"]
    total = {key: round(tokens["mean"] * tokens["count"]) for key, tokens in counted.items()}
    assert total[("false",)] - total[()] == sum(answers) * block
    assert counted[("false",)]["thinking"] is False and counted[()]["thinking"] is None
    assert {**counted[("true",)], "thinking": None} == counted[()]
    bad = run(*args, "--thinking", "maybe")
    assert bad.returncode == 2 and "--thinking" in bad.stderr and "'maybe'" in bad.stderr, bad.stderr


def test_a_folder_with_a_test_file_checks_the_train_split_and_says_what_it_left_out(run, tmp_path):
    """data check of a folder holding train.jsonl and test.jsonl counted both as training data; now it counts
    the train split and names the file it left out (--json: left_out)."""
    folder = tmp_path / "data"
    folder.mkdir()
    good = (FIXTURES / "sharegpt.jsonl").read_text()
    (folder / "train.jsonl").write_text(good)
    (folder / "test.jsonl").write_text(good)
    rows = len(good.splitlines())
    result = run(str(folder))
    assert result.returncode == 0, result.stderr
    assert f"{rows} usable of {rows} rows" in result.stdout
    assert f"left out (named for another split; DIR:SPLIT reads them): {folder / 'test.jsonl'}" in result.stdout
    report = json.loads(run(f"{folder}:test", "--json").stdout)
    assert report["records"] == rows and report["left_out"] == [str(folder / "train.jsonl")]


def test_samples_the_cut_leaves_without_an_answer_are_counted_and_none_left_fails(run, tmp_path):
    """data check --max-seq-len said "3 of 3 samples are longer than 128 tokens and will be cut" and exited 0
    when every one's answer lay past the cut: the trainer drops such samples, so the run trained on nothing
    (and a partly such file trained on fewer samples than the check implied). Now it says how many the cut
    leaves without an answer, the first one's file:line, and with none left fails as the trainer would."""
    path = tmp_path / "long_prompts.jsonl"
    rows = [{"instruction": "word " * 400, "input": "", "output": "short answer"}] * 3
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = run(str(path), "--model", "tiny", "--max-seq-len", "128")
    assert result.returncode == 1, result.stderr
    assert f"the cut leaves 3 of them without an answer: left out of training (the first: {path}:1)" \
        in result.stdout
    assert "no training examples left" in result.stdout and "raise max_seq_len" in result.stdout
    report = json.loads(run(str(path), "--model", "tiny", "--max-seq-len", "128", "--json").stdout)
    assert report["tokens"]["cut_no_answer"] == 3 and report["ok"] is False and report["none_left"]
    with open(path, "a") as handle:  # one sample that fits: the run trains it, the other three are counted
        handle.write(json.dumps({"instruction": "hi", "input": "", "output": "hello"}) + "\n")
    result = run(str(path), "--model", "tiny", "--max-seq-len", "128")
    assert result.returncode == 0 and "the cut leaves 3 of them without an answer" in result.stdout


def test_overlong_drop_does_not_tokenize_the_long_samples_again_for_a_cut_it_never_makes(run, tmp_path):
    """With --overlong drop the check still ran every over-long sample through the tokenizer a second time to
    count the ones a cut leaves without an answer, a count it never shows under drop (nothing is cut): on a
    dataset long past max_seq_len that doubled the check. Under drop it is now not counted (null in --json);
    under cut it still is."""
    path = tmp_path / "long_prompts.jsonl"
    rows = [{"instruction": "word " * 400, "input": "", "output": "short answer"}] * 3
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = (str(path), "--model", "tiny", "--max-seq-len", "128", "--json")
    dropped = json.loads(run(*args, "--overlong", "drop").stdout)["tokens"]
    assert (dropped["over_max"], dropped["overlong"], dropped["cut_no_answer"]) == (3, "drop", None)
    assert json.loads(run(*args, "--overlong", "cut").stdout)["tokens"]["cut_no_answer"] == 3
