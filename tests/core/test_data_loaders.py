"""Every loader (jsonl, json array, json lines under .json, csv, parquet) and file:line error reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.data import DataError, load_records, load_training_records, read_dataset
from core.data.loading import read_hub_dataset
from core.data.records import Conversation, TextRecord

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))


def test_json_array_alpaca():
    loaded = read_dataset(FIXTURES / "alpaca.json")
    assert loaded.format == "alpaca" and loaded.rows == 3 and not loaded.issues
    assert [r.messages[-1].content for r in loaded.records] == ["2 + 3 = 5.", "Blue.", "Yes."]
    # each record remembers the line its element starts on
    assert [r.origin.rsplit(":", 1)[1] for r in loaded.records] == ["2", "7", "14"]


def test_jsonl_sharegpt_and_messages_and_text():
    assert read_dataset(FIXTURES / "sharegpt.jsonl").format == "sharegpt"
    messages = load_records(FIXTURES / "messages.jsonl")
    assert len(messages) == 3 and all(isinstance(r, Conversation) for r in messages)
    text = load_records(FIXTURES / "text.jsonl")
    assert [type(r) for r in text] == [TextRecord, TextRecord]


def test_json_lines_under_a_json_name(tmp_path):
    path = tmp_path / "lines.json"
    path.write_text('{"text": "a"}\n{"text": "b"}\n', encoding="utf-8")
    assert [r.text for r in load_records(path)] == ["a", "b"]


def test_csv_with_a_multiline_field_reports_the_right_line():
    loaded = read_dataset(FIXTURES / "alpaca.csv")
    assert loaded.format == "alpaca" and loaded.rows == 3
    assert loaded.records[1].messages[-1].content == "line one\nline two"
    assert [(i.line, i.row) for i in loaded.issues] == [(5, 2)]
    assert "'output' is empty" in loaded.issues[0].message


def test_csv_json_columns_are_parsed(tmp_path):
    path = tmp_path / "chat.csv"
    messages = [{"role": "user", "content": "q, with comma"}, {"role": "assistant", "content": "a"}]
    import csv

    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["messages"])
        writer.writerow([json.dumps(messages)])
    (record,) = load_records(path)
    assert record.messages[0].content == "q, with comma"


def test_parquet_rows_and_row_index_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    table = pa.table({
        "instruction": ["a", "b", "c"],
        "input": ["", "x", ""],
        "output": ["A", "", "C"],
    })
    pq.write_table(table, path)
    loaded = read_dataset(path)
    assert loaded.format == "alpaca" and loaded.rows == 3 and len(loaded.records) == 2
    (issue,) = loaded.issues
    # row is the 0-based index (--json keeps it); a user reads the second row as "row 2", as lines count from 1
    assert issue.line is None and issue.row == 1
    assert str(issue) == f"{path} row 2: 'output' is empty: the assistant turn has nothing to learn"
    assert [r.origin for r in loaded.records] == [f"{path} row 1", f"{path} row 3"]
    from core import i18n

    i18n.set_language("zh")
    try:
        assert issue.location() == f"{path} 第 2 行"
    finally:
        i18n.set_language("en")


def test_parquet_with_nested_messages(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "chat.parquet"
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    (record,) = load_records(path)
    assert [m.content for m in record.messages] == ["q", "a"]


def test_malformed_jsonl_lists_every_bad_row_with_its_line():
    loaded = read_dataset(FIXTURES / "malformed.jsonl")
    assert loaded.format == "messages"
    assert len(loaded.records) == 2
    lines = [issue.line for issue in loaded.issues]
    assert lines == [2, 3, 5, 6, 7, 8, 9, 10]  # line 4 is blank and skipped, not miscounted
    by_line = {issue.line: issue.message for issue in loaded.issues}
    assert "message 2 (assistant) is empty" in by_line[2]
    assert "must start with the user" in by_line[3]
    assert by_line[5].startswith("invalid JSON:") and "(column " in by_line[5]
    assert "must be text, not a number" in by_line[6]
    assert "must alternate" in by_line[7]
    assert "ends with a user message" in by_line[8]
    assert "role 'wizard'" in by_line[9]
    assert "must be a list" in by_line[10]
    with pytest.raises(DataError) as info:
        load_records(FIXTURES / "malformed.jsonl")
    text = str(info.value)
    assert text.startswith("The data has 8 problems:")
    assert f"{FIXTURES / 'malformed.jsonl'}:6: " in text


def test_malformed_json_array_elements_report_their_lines():
    loaded = read_dataset(FIXTURES / "malformed_array.json")
    assert [(i.line, i.row) for i in loaded.issues] == [(3, 1), (4, 2)]
    assert len(loaded.records) == 2


def test_broken_json_array_stops_at_the_broken_element_with_its_line():
    loaded = read_dataset(FIXTURES / "broken_array.json")
    assert len(loaded.records) == 1
    (issue,) = loaded.issues
    assert issue.line == 3 and "invalid JSON" in issue.message


def test_issue_limit_counts_the_rest(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(['{"text": ""}'] * 30) + "\n", encoding="utf-8")
    loaded = read_dataset(path, max_issues=5)
    assert len(loaded.issues) == 5 and loaded.more_issues == 25 and loaded.issue_count == 30
    with pytest.raises(DataError) as info:
        loaded.raise_for_issues()
    assert "25 more problems" in str(info.value)


def test_unknown_format_and_whole_file_problems(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_text('{"question": "a", "answer": "b"}\n', encoding="utf-8")
    (issue,) = read_dataset(path).issues
    assert "cannot tell the format" in issue.message and "'question'" in issue.message
    assert str(issue).startswith(f"{path}:1: ")  # said at its line, as every other problem of the data
    # a JSONL line that is a JSON array was "cannot tell the format from the keys (list)", without a line
    listed = tmp_path / "listed.jsonl"
    listed.write_text('["What is 2+2?", "4"]\n["A pet?", "A dog."]\n', encoding="utf-8")
    (issue,) = read_dataset(listed).issues
    assert str(issue) == f"{listed}:1: a record must be a JSON object, not a list"
    with pytest.raises(DataError, match="unsupported file type '.xml'"):  # .txt is read: plain text
        read_dataset(_touch(tmp_path / "data.xml", "x"))
    with pytest.raises(DataError, match="file not found"):
        read_dataset(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match="this is a folder"):
        read_dataset(tmp_path)
    with pytest.raises(DataError, match="must be an array") as refused:
        read_dataset(_touch(tmp_path / "scalar.json", '"just a string"'))
    assert "{{" not in str(refused.value)  # t() without parameters does not format: no escaped braces in its text
    with pytest.raises(DataError, match="must be an array"):  # records under a key, as some exports write them
        read_dataset(_touch(tmp_path / "wrapped.json", '{\n  "data": [{"instruction": "a", "output": "b"}]\n}\n'))
    with pytest.raises(DataError, match="not UTF-8"):
        read_dataset(_touch(tmp_path / "latin.jsonl", b'{"text": "caf\xe9"}\n'))
    empty = read_dataset(_touch(tmp_path / "empty.jsonl", ""))
    assert "no records" in empty.issues[0].message


def test_mixed_formats_say_which_format_a_row_looks_like(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [{"text": "a"}, {"text": "b"}, {"messages": [{"role": "user", "content": "q"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    (issue,) = read_dataset(path).issues
    assert issue.line == 3 and "looks like messages" in issue.message and "detected as text" in issue.message


def test_training_records_from_a_list_of_files_and_a_folder(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "one"}\n', encoding="utf-8")
    (folder / "b.jsonl").write_text('{"text": "two"}\n', encoding="utf-8")
    (folder / "notes.md").write_text("ignored", encoding="utf-8")
    records = load_training_records([str(folder), str(FIXTURES / "text.jsonl")])
    assert [r.text for r in records][:2] == ["one", "two"] and len(records) == 4


def test_training_records_collect_problems_from_every_source(tmp_path):
    with pytest.raises(DataError) as info:
        load_training_records([str(FIXTURES / "malformed_array.json"), str(tmp_path / "absent.jsonl")])
    files = {Path(issue.file).name for issue in info.value.issues}
    assert files == {"malformed_array.json", "absent.jsonl"}


def test_hub_dataset_fails_fast_without_network(monkeypatch):
    # Point the hub at a closed local port. "Fast" is a property, not a speed: one TCP probe with bounded
    # waits (tests/core/test_hub_probe.py tries it on every way a network fails), and no hub client started
    # at all (its retries are what take minutes).
    import core.data.loading as loading

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    probes: list[tuple[str, bool]] = []
    reachable = loading.network_reachable

    def probe(hub, *args, **kwargs):
        probes.append((hub, reachable(hub, *args, **kwargs)))
        return probes[-1][1]

    def hub_client(*args, **kwargs):
        raise AssertionError("the hub client was started although the hub cannot be reached")

    monkeypatch.setattr(loading, "network_reachable", probe)
    monkeypatch.setattr(loading, "_hub_rows", hub_client)
    with pytest.raises(DataError) as info:
        read_hub_dataset("someone/some-dataset", hub="huggingface")
    assert probes == [("huggingface", False)]
    assert loading.DNS_PROBE_TIMEOUT_S + loading.NETWORK_PROBE_TIMEOUT_S <= 10  # the waits there can be are bounded
    assert "cannot reach 127.0.0.1" in str(info.value) and "someone/some-dataset" in str(info.value)


def test_hub_id_is_recognised_in_a_run_dataset(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(DataError, match="cannot reach"):
        load_training_records("owner/name", hub="huggingface")


def _touch(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_a_folder_with_split_named_files_trains_on_train_only(tmp_path):
    """A folder holding train.jsonl beside test.jsonl and validation.jsonl (as Hugging Face publishes a dataset,
    and as ``datasets`` / ms-swift read it split by split) was read whole: the held-out test and validation
    rows were trained on. Now a folder's files named for a split are read for that split only (train unless
    ``folder:SPLIT`` says another; a name that says none is train), and a split with no file is refused."""
    from core.data.loading import file_split, read_local_data

    folder = tmp_path / "ds"
    folder.mkdir()
    for name, count in (("train-00000-of-00002.jsonl", 3), ("train-00001-of-00002.jsonl", 2), ("test.jsonl", 4),
                        ("validation.jsonl", 5), ("extra.jsonl", 1)):
        (folder / name).write_text("".join(json.dumps({"text": f"{name} {i}"}) + "\n" for i in range(count)))
    assert len(load_training_records(str(folder))) == 6  # both train shards and the unnamed file
    assert len(load_training_records(f"{folder}:test")) == 4
    assert len(load_training_records(f"{folder}:dev")) == 5  # dev, val, valid: validation, as datasets says
    loaded, _ = read_local_data(str(folder))
    assert sorted(Path(p).name for p in loaded.left_out) == ["test.jsonl", "validation.jsonl"]
    only_test = tmp_path / "only_test"
    only_test.mkdir()
    (only_test / "test.jsonl").write_text('{"text": "x"}\n')
    assert len(load_training_records(f"{only_test}:eval")) == 1
    with pytest.raises(DataError, match=r"no file of the folder is named for the train split: it holds test\.jsonl"):
        load_training_records(str(only_test))
    # words inside other words are no split: devices, interval, contest
    assert [file_split(Path(n)) for n in ("devices.jsonl", "interval.json", "contest.csv", "my_eval_set.jsonl")] \
        == [None, None, None, "test"]


def test_a_split_on_a_single_file_is_refused(tmp_path):
    """``file.jsonl:test`` read the whole file, its ``:test`` ignored without a word (a split picks the files of a
    folder, DIR:split, or a hub dataset's split): the user trained on all of it where a part was meant. It is
    refused, saying why and what to write; the folder's form still reads its split."""
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    (folder / "test.jsonl").write_text('{"text": "c"}\n')
    with pytest.raises(DataError) as info:
        load_training_records(f"{folder / 'train.jsonl'}:test")
    assert f"':test' names a split, and {folder / 'train.jsonl'} is one file, read whole" in str(info.value)
    assert "Name the file without ':test', or its folder with it" in str(info.value)
    assert len(load_training_records(f"{folder}:test")) == 1
    assert len(load_training_records(f"{folder / 'train.jsonl'}#1")) == 1  # #N on a file stays as it was


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_compressed_data_files_are_read_alone_and_in_a_folder(tmp_path, suffix):
    """train.jsonl.gz (as Hugging Face datasets, LLaMA-Factory and ms-swift read it) was refused as "unsupported
    file type '.gz'", and a folder of such shards as holding no data files. Now a .gz, .bz2 or .xz file is read as
    the file inside (its lines numbered as they are there), alone or in a folder (split by name); a damaged one
    says so, and a compressed parquet is refused naming both suffixes."""
    import bz2
    import gzip
    import lzma

    from core.data.loading import read_local_data

    pack = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix]
    folder = tmp_path / "shards"
    folder.mkdir()
    rows = [json.dumps({"instruction": f"q{i}", "input": "", "output": f"a{i}"}) for i in range(4)]
    (folder / f"train.jsonl{suffix}").write_bytes(pack(("\n".join(rows[:3]) + "\n{broken\n").encode()))
    (folder / f"test.csv{suffix}").write_bytes(pack(b"instruction,input,output\nq,,a\n"))
    loaded = read_dataset(folder / f"train.jsonl{suffix}")
    assert loaded.format == "alpaca" and len(loaded.records) == 3
    assert [(issue.line, "invalid JSON" in issue.message) for issue in loaded.issues] == [(4, True)]
    merged, _ = read_local_data(str(folder))
    assert merged.rows == 4 and [Path(p).name for p in merged.left_out] == [f"test.csv{suffix}"]
    assert len(load_training_records(f"{folder}:test")) == 1
    (tmp_path / f"bad.jsonl{suffix}").write_bytes(b"not compressed at all")
    with pytest.raises(DataError, match=f"cannot decompress the \\{suffix} file"):
        read_dataset(tmp_path / f"bad.jsonl{suffix}")
    (tmp_path / f"x.parquet{suffix}").write_bytes(b"x")
    with pytest.raises(DataError, match=f"unsupported file type '.parquet\\{suffix}'"):
        read_dataset(tmp_path / f"x.parquet{suffix}")


def test_reading_a_file_holds_its_text_and_records_not_every_parsed_row_besides(tmp_path):
    """Reading a JSONL file held, at its peak, the text, a list of its lines, every parsed row and the records
    made of them: about four times the file, so a 2 GB file took some 8 GB before a check or a run could say
    anything. Rows are now parsed and normalised one at a time: beyond the records kept, the peak is the text
    and the row at hand (measured with tracemalloc, a state of the heap, not a speed)."""
    import tracemalloc

    path = tmp_path / "big.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(8000):
            handle.write(json.dumps({"instruction": f"question {i} " + "lorem ipsum " * 20, "input": "",
                                     "output": "answer " * 60}) + "\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        loaded = read_dataset(path)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(loaded.records) == 8000 and not loaded.issues
    assert peak - kept < 1.5 * size, (peak - kept) / size  # 1.9 before (the rows besides), 1.0 now


def test_a_folder_whose_data_is_in_a_folder_below_names_it(tmp_path):
    """A downloaded hub dataset (huggingface-cli download --repo-type dataset) keeps its files in data/ or in
    train/ and test/ beside a README.md: named by its top folder, it was "the folder holds no data files", with
    no word of where they are. Now the folders below that hold them are named, the train one as the one to give."""
    snapshot = tmp_path / "snapshot"
    for split in ("test", "train"):
        (snapshot / split).mkdir(parents=True)
        (snapshot / split / "part-0.jsonl").write_text('{"text": "x"}\n')
    (snapshot / ".cache").mkdir()
    (snapshot / ".cache" / "x.jsonl").write_text('{"text": "x"}\n')
    (snapshot / "README.md").write_text("# card\n")
    with pytest.raises(DataError) as info:
        load_training_records(str(snapshot))
    said = str(info.value)
    assert f"they are in {snapshot / 'test'}, {snapshot / 'train'}: name that folder (dataset: {snapshot / 'train'})" \
        in said and ".cache" not in said
    assert len(load_training_records(str(snapshot / "train"))) == 1


def test_the_folder_below_named_is_the_one_of_the_split_asked_for(tmp_path):
    """Asked for the test split of a downloaded dataset, the hint still said "dataset: .../train", which reads
    the training data: it now names the folder (or the split of data/'s files) that holds the split asked."""
    snapshot = tmp_path / "snapshot"
    for split in ("test", "train"):
        (snapshot / split).mkdir(parents=True)
        (snapshot / split / "part-0.jsonl").write_text(json.dumps({"text": split}) + "\n")
    with pytest.raises(DataError) as info:
        load_training_records(f"{snapshot}:test")
    assert f"(dataset: {snapshot / 'test'})" in str(info.value)
    assert [record.text for record in load_training_records(str(snapshot / "test"))] == ["test"]
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    for split in ("test", "train"):
        (hub / "data" / f"{split}-00000-of-00001.jsonl").write_text(json.dumps({"text": split}) + "\n")
    for asked, spec in (("", hub / "data"), (":test", f"{hub / 'data'}:test")):
        with pytest.raises(DataError) as info:
            load_training_records(f"{hub}{asked}")
        assert f"(dataset: {spec})" in str(info.value)
    assert [record.text for record in load_training_records(f"{hub / 'data'}:test")] == ["test"]


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_reading_a_jsonl_file_never_holds_its_whole_text(tmp_path, suffix):
    """Reading a JSONL file held its bytes and its decoded text side by side (twice the file) before its first
    row was parsed: with rows that keep little (here a long field no format reads) the peak was 2x the file
    while the records kept were a third of it, so a 2 GB file still took 4 GB. It is now read a line at a
    time: the peak is the records and the line at hand (tracemalloc: a state of the heap, not a speed)."""
    import gzip
    import tracemalloc

    text = "".join(json.dumps({"instruction": f"q {i}", "output": "a", "meta": "x" * 2000}) + "\n" for i in range(4000))
    path = tmp_path / f"big.jsonl{suffix}"
    path.write_bytes(gzip.compress(text.encode()) if suffix else text.encode())
    tracemalloc.start()
    try:
        loaded = read_dataset(path)
        _kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(loaded.records) == 4000 and not loaded.issues
    assert loaded.records[-1].origin == f"{path}:4000"
    assert peak < 0.8 * len(text), peak / len(text)  # 2.0 before (bytes + text), the records ~0.35 now


def test_a_jsonl_read_a_line_at_a_time_says_its_encoding_problems_as_before(tmp_path):
    """Line by line, a JSONL's problems are still said where they are: a bad UTF-8 byte at its line and offset,
    a NUL at its line and character, a damaged archive as such, UTF-16 with its mark read, CRLF lines read."""
    import gzip

    bad = _touch(tmp_path / "bad.jsonl", b'{"text": "a"}\n{"text": "b"}\n{"text": "\xff"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:3.*bad byte at offset 38"):
        read_dataset(bad)
    nul = _touch(tmp_path / "nul.jsonl", b'{"text": "a"}\n{"text": "b\x00"}\n')
    with pytest.raises(DataError, match=r"nul\.jsonl:2.*character 26 of the file"):
        read_dataset(nul)
    broken = _touch(tmp_path / "broken.jsonl.gz", gzip.compress(b'{"text": "a"}\n' * 100)[:-20])
    with pytest.raises(DataError, match=r"broken\.jsonl\.gz.*cannot be decompressed|broken\.jsonl\.gz.*\.gz"):
        read_dataset(broken)
    wide = _touch(tmp_path / "wide.jsonl", '{"text": "ä"}\r\n\r\n{"text": "b"}\r\n'.encode("utf-16"))
    loaded = read_dataset(wide)
    assert [r.origin for r in loaded.records] == [f"{wide}:1", f"{wide}:3"] and not loaded.issues


@pytest.mark.parametrize("name", ["corpus.txt", "rows.json"])
def test_a_text_file_or_a_json_file_of_lines_is_not_held_twice_while_its_rows_are_read(tmp_path, name):
    """A .txt was split into a list of all its lines beside its text, and a .json of JSON lines that opens with a
    blank line was copied whole (``lstrip``) and held while its rows were read: 3x the file at the peak, where
    reading it takes 2x (its bytes and text side by side as it is decoded; the text and the records after). Lines are taken one at a time from the text now (tracemalloc: a heap state)."""
    import tracemalloc

    path = tmp_path / name
    if name.endswith(".txt"):
        text = "".join(("word " * 100 + "\n") * 3 + "\n" for _ in range(4000))
    else:
        text = "\n" + "".join(json.dumps({"instruction": f"q {i}", "output": "a", "meta": "x" * 2000}) + "\n"
                              for i in range(4000))
    path.write_text(text, encoding="utf-8")
    tracemalloc.start()
    try:
        loaded = read_dataset(path)
        _kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(loaded.records) == 4000 and not loaded.issues
    assert loaded.records[1].origin == f"{path}:{5 if name.endswith('.txt') else 3}"
    assert peak < 2.5 * len(text), peak / len(text)  # 3.3 / 3.0 before, 2.15 / 2.0 now (bytes and text at decode)
