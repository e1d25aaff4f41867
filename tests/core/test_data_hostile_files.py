"""Data files that are valid but unusual, or hostile: ``tunedeck data check`` and the trainer's loader.

U+2028 / U+2029 / U+0085 inside JSON strings (``json.dumps(ensure_ascii=False)`` writes them), CRLF line
ends, nesting deep enough to exhaust the decoder's recursion, CSV records over several lines, and tools
given as bare names.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SEPARATORS = "第一行\u2028第二行\u2029第三段\u0085结束"


def _conversation(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


@pytest.fixture
def check(tmp_path):
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8"}
    env.pop("LC_ALL", None)

    def _run(path: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "core", "--lang", "en", "data", "check", str(path), *args],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    return _run


def test_unicode_line_separators_inside_strings_are_valid_jsonl(tmp_path, check):
    path = tmp_path / "chinese.jsonl"
    rows = [_conversation(SEPARATORS, f"好的\u2028{i}") for i in range(3)]
    with path.open("w", encoding="utf-8", newline="") as handle:  # CRLF line ends too
        handle.write("".join(json.dumps(row, ensure_ascii=False) + "\r\n" for row in rows))
    assert "\u2028" in path.read_text(encoding="utf-8")  # the separators are raw, not escaped
    result = check(path, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["records"] == 3 and report["issues"] == []
    # The trainer reads its data through the same loader: the text arrives whole.
    from core.train.data_adapter import load_records

    records = load_records([str(path)])
    assert [r.messages[0].content for r in records] == [SEPARATORS] * 3
    assert records[2].origin == f"{path}:3"
    # ... and a JSON-lines file under a .json name, whose first line holds a separator.
    as_json = tmp_path / "chinese.json"
    as_json.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    assert [r.messages[0].content for r in load_records([str(as_json)])] == [SEPARATORS] * 3


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_deeply_nested_json_is_a_file_line_problem_not_a_traceback(tmp_path, check, suffix):
    good = json.dumps(_conversation("q", "a"))
    deep = '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path = tmp_path / f"deep{suffix}"
    if suffix == ".jsonl":
        path.write_text(f"{good}\n{deep}\n{good}\n", encoding="utf-8")
    else:
        path.write_text(f"[{good},\n{deep}]\n", encoding="utf-8")
    result = check(path, "--json")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    report = json.loads(result.stdout)
    assert [(i["line"], i["row"]) for i in report["issues"]] == [(2, 1)]
    # ``row`` is 0-based (kept for scripts); ``record`` counts from 1, as every message does ("row 2", ":2")
    assert report["issues"][0]["record"] == 2
    assert "nested too deeply" in report["issues"][0]["message"]
    assert report["records"] == (2 if suffix == ".jsonl" else 1)
    human = check(path)
    assert human.returncode == 1 and f"{path}:2: invalid JSON: lists/objects nested too deeply" in human.stdout


def test_csv_records_are_numbered_by_the_line_they_start_on(tmp_path, check):
    path = tmp_path / "alpaca.csv"
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["instruction", "input", "output"])  # line 1
        writer.writerow(["", "", "no instruction"])  # line 2: the first record
        writer.writerow(["Write two lines.", "", "one\ntwo\nthree"])  # lines 3-5
        handle.write("\r\n")  # line 6: blank, skipped
        writer.writerow(["Say yes.", "", ""])  # line 7: empty output
        writer.writerow(["Say no.", "", "No.", "extra"])  # line 8: one field too many
    report = json.loads(check(path, "--json").stdout)
    assert [(i["line"], i["row"]) for i in report["issues"]] == [(2, 0), (7, 2), (8, 3)], report["issues"]
    assert "'instruction' and 'input' are both empty" in report["issues"][0]["message"]
    assert "1 more field(s)" in report["issues"][2]["message"]
    assert report["records"] == 1 and report["rows"] == 4
    from core.data import read_dataset

    loaded = read_dataset(path)
    assert loaded.records[0].origin == f"{path}:3"
    assert loaded.records[0].messages[-1].content == "one\ntwo\nthree"


def test_a_csv_quote_never_closed_is_named_not_read_as_the_rest_of_the_file(tmp_path, check):
    """Python's csv reader, lenient, read an unclosed quote's field on to the end of the file: the rows after it
    vanished into one answer, and the check said "2 usable, problems none"."""
    path = tmp_path / "alpaca.csv"
    path.write_text('instruction,output\nq1,a1\nq2,"an opening quote\nq3,a3\nq4,a4\n', encoding="utf-8")
    report = json.loads(check(path, "--json").stdout)
    assert [(i["line"], i["row"]) for i in report["issues"]] == [(3, 1)], report["issues"]
    assert "quote opened in this record is never closed" in report["issues"][0]["message"]
    assert "(line 5)" in report["issues"][0]["message"] and report["records"] == 1
    closed = tmp_path / "closed.csv"  # quotes closed, doubled, or stray inside a bare value: as before
    closed.write_text('instruction,output\nq1,"a ""b""\nc"\nq2,a"b\n', encoding="utf-8")
    report = json.loads(check(closed, "--json").stdout)
    assert report["ok"] and report["records"] == 2, report["issues"]


def test_tools_given_as_names_get_a_message_that_says_what_is_expected(tmp_path, check):
    base = _conversation("Weather in Paris?", "Sunny.")
    path = tmp_path / "tools.jsonl"
    path.write_text("\n".join(json.dumps({**base, "tools": tools}) for tools in (
        ["get_weather"], "get_weather", '[{"type": "function", ', [{"type": "function", "function": {"name": "x"}}],
        json.dumps([{"type": "function", "function": {"name": "y"}}]))) + "\n", encoding="utf-8")
    report = json.loads(check(path, "--json").stdout)
    messages = {i["line"]: i["message"] for i in report["issues"]}
    assert sorted(messages) == [1, 2, 3], messages  # lines 4 and 5 are right: objects, or their JSON text
    assert messages[1].startswith("'tools' item 0 is text (\"get_weather\"), not a tool definition")
    assert "not a list" not in messages[1] and '"function": {"name": "get_weather"' in messages[1]
    assert "'tools' must be a list of tool definition objects (or that list as a JSON string), not text" in messages[2]
    assert "is a string but not valid JSON" in messages[3]
    assert report["with_tools"] == 2


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_bytes_that_are_not_utf8_are_named_by_their_line(tmp_path, check, suffix):
    path = tmp_path / f"latin1{suffix}"
    if suffix == ".csv":
        path.write_bytes("instruction,input,output\nq1,,a1\nq2,,caf\xe9\n".encode("latin-1"))
    else:
        path.write_bytes(b'{"text": "a"}\n{"text": "b"}\n{"text": "caf\xe9"}\n')
    result = check(path, "--json")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    issues = json.loads(result.stdout)["issues"]
    assert [(i["line"], i["row"]) for i in issues] == [(3, None)] and "not UTF-8" in issues[0]["message"]
    assert f"{path}:3: the file is not UTF-8 text" in check(path).stderr


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_files_with_a_byte_order_mark_are_read(tmp_path, check, encoding):
    """A UTF-16 file (what PowerShell 5's '>' and Notepad's "Unicode" write) was refused as "not UTF-8 text (bad
    byte at offset 0)"; its byte-order mark says how to read it, so it is read, CRLF ends and all."""
    path = tmp_path / "windows.jsonl"
    text = "".join(json.dumps(_conversation(f"问题 {i}", f"答案 {i}"), ensure_ascii=False) + "\r\n" for i in range(3))
    bom = {"utf-16-be": "\ufeff"}.get(encoding, "")  # Python writes the mark itself for utf-16 and utf-32
    path.write_bytes((bom + text).encode(encoding))
    result = check(path, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["records"] == 3


def test_utf16_without_its_mark_is_said_once_not_as_every_row_invalid_json(tmp_path, check):
    """UTF-16 without a byte-order mark decodes as UTF-8 full of NULs: each row was "invalid JSON: Expecting
    property name" with nothing said of why. Now the file is refused once, at the line of the first NUL, with
    the encoding it likely is and how to convert it."""
    path = tmp_path / "no_mark.jsonl"
    path.write_bytes('{"text": "a"}\n{"text": "b"}\n'.encode("utf-16-le"))
    result = check(path, "--json")
    assert result.returncode == 2, result.stdout
    issues = json.loads(result.stdout)["issues"]
    assert len(issues) == 1 and issues[0]["line"] == 1
    assert "NUL character (character 2 of the file" in issues[0]["message"]
    assert "iconv -f UTF-16LE -t UTF-8" in issues[0]["message"]
