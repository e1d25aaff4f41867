"""What the planner reads of the data: the share of its tokens that have a target, cut as the engine cuts."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.data import load_records
from core.data.records import Conversation, Message, TextRecord
from core.plan import PlanRequest, summarise_dataset
from core.plan.dataset import DatasetSummary, approximate_counts
from core.plan.hardware import parse_target

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "core" / "data" / "samples" / "tiny_skills.jsonl"


def summary(lengths, targets):
    return DatasetSummary("d.jsonl", "messages", len(lengths), 0, tuple(lengths), True, tuple(targets))


def test_the_share_counts_the_targets_a_cut_leaves():
    data = summary((100, 300), (40, 200))
    assert data.target_share() == 240 / 400
    # at 200 tokens the second record loses its last 100, all of them targets (an answer ends a record)
    assert data.target_share(200) == (40 + 100) / (100 + 200)
    # at 60 the first keeps 0 of its 40 and is dropped by the engine, as the second (200 - 240 < 0)
    assert data.target_share(60) is None
    assert summary((10,), ()).target_share() is None  # not counted


def test_approximate_targets_are_the_trained_texts_share_of_the_characters():
    chat = Conversation([Message("user", "q" * 300), Message("assistant", "a" * 100),
                         Message("user", "r" * 50), Message("assistant", "b" * 50, trainable=False)])
    text = TextRecord("t" * 400, prompt="p" * 400)
    (n_chat, k_chat), (n_text, k_text) = approximate_counts([chat, text])
    assert abs(k_chat / n_chat - 100 / len(chat.approx_text())) < 0.01  # the answer the data does not exclude
    assert k_text / n_text == 0.5
    assert approximate_counts([Conversation([Message("user", "q"), Message("assistant", "")])])[0][1] == 0


def test_the_sample_is_counted_with_the_models_tokenizer_and_the_request_takes_its_share():
    exact = summarise_dataset(SAMPLE, "tiny")
    approx = summarise_dataset(SAMPLE)
    assert exact.exact and not approx.exact
    assert len(exact.targets) == exact.records == len(load_records(SAMPLE))
    for data in (exact, approx):
        assert 0.1 < data.target_share() < 0.6  # short questions and answers, the template's tokens
    request = PlanRequest("tiny", parse_target("cpu"), overrides={"seq_len": 64}).with_dataset(exact)
    assert request.dataset_tokens == exact.total_tokens and request.dataset_p95_tokens == exact.p95
    assert request.dataset_target_share == exact.target_share(64)
    assert PlanRequest("tiny", parse_target("cpu")).with_dataset(None).dataset_target_share is None
    assert exact.to_json()["target_tokens"] == sum(exact.targets)


def test_a_runs_tokens_are_each_record_cut_to_the_sequence_as_the_engine_cuts_it():
    # 50 documents of 29,000 tokens, every token a target (text), and one chat whose answer a cut at 128 removes
    data = summary((29_000,) * 50 + (5_000,), (29_000,) * 50 + (10,))
    assert data.total_tokens == 50 * 29_000 + 5_000
    assert data.trained_tokens(128) == 50 * 128  # the chat is left without its answer: dropped, as the engine does
    assert data.trained_tokens(8192) == 50 * 8192 + 5_000
    assert data.trained_tokens() == data.total_tokens
    assert summary((300, 20), ()).trained_tokens(100) == 120  # targets not counted: every record stays


def test_the_plans_time_is_the_tokens_its_sequence_length_reads_not_the_datas_full_length():
    # hardware: --hardware 1xH200 (a typed target, no GPU of this box)
    from core.plan import recommend

    data = summary((29_000,) * 50, (29_000,) * 50)
    request = PlanRequest("Qwen2.5-7B", parse_target("1xH200"), epochs=1.0,
                          overrides={"seq_len": 128}).with_dataset(data)
    best = recommend(request).best
    assert best.plan.seq_len == 128
    assert best.hours * 3600.0 * best.tokens_per_s == pytest.approx(50 * 128)


def test_counting_a_record_longer_than_the_model_says_nothing_of_transformers_on_stderr(tmp_path):
    import json
    import subprocess
    import sys

    data = tmp_path / "long.jsonl"
    rows = [{"messages": [{"role": "user", "content": "x " * 3000}, {"role": "assistant", "content": "ok"}]}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    # a fresh interpreter: transformers' log handler holds the stderr it found first; the bundled tiny model has
    # 2,048 positions
    code = ("import sys; from core.plan import summarise_dataset; s = summarise_dataset(sys.argv[1], 'tiny'); "
            "print(s.exact, s.max_length)")
    proc = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    exact, longest = proc.stdout.split()
    assert exact == "True" and int(longest) > 2048
    assert "Token indices sequence length" not in proc.stderr


def test_the_data_is_read_as_train_reads_a_runs_dataset(tmp_path, monkeypatch):
    """The planner read one local file only, where train takes a folder, a comma list, ``#N`` and ``~``: each
    refused ("this is a folder", "file not found"). Now each is read as the run reads it, the statistics over
    all of it; a hub id is not read (no statistics, said by ``on_hub``) rather than "file not found"."""
    sample = SAMPLE
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.jsonl").write_text(sample.read_text())
    (folder / "b.jsonl").write_text(sample.read_text())
    monkeypatch.setenv("HOME", str(tmp_path))
    single = summarise_dataset(sample)
    assert single.records == len(load_records(sample)) and single.measured
    for spec, records in ((str(folder), 2 * single.records), (f"{sample},{folder / 'a.jsonl'}", 2 * single.records),
                          ("~/data/a.jsonl", single.records), (f"{sample}#5", 5), (f"~/data#7,{sample}#3", 10)):
        summary = summarise_dataset(spec)
        assert (summary.records, summary.format, summary.measured) == (records, "messages", True), spec
    assert summarise_dataset(str(folder)).total_tokens == 2 * single.total_tokens
    hub = summarise_dataset(f"owner/name,{sample}")
    assert not hub.measured and hub.on_hub == ("owner/name",) and hub.records == 0


def test_chinese_data_without_a_tokenizer_is_counted_a_token_a_character(tmp_path):
    """Counted as characters / 4, Chinese answers of 1,000 characters (1,000 or so tokens with Qwen's or
    Llama's tokenizer) read as ~260 tokens: the plan's default sequence length, the data's 95th percentile
    rounded up, was 512 and cut most of each record, with no truncation warning (same short count)."""
    import json

    data = tmp_path / "中文数据.jsonl"
    answer = "这是一个用于测试的中文回答。" * 72  # 1,008 characters
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "请详细解释一下。"},
                                                     {"role": "assistant", "content": answer}]},
                                       ensure_ascii=False) + "\n" for _ in range(20)), encoding="utf-8")
    summary = summarise_dataset(data)  # no model: no tokenizer
    assert not summary.exact and summary.p95 >= len(answer)
    request = PlanRequest("Qwen2.5-7B", parse_target("cpu")).with_dataset(summary)
    assert request.seq_len >= 1024
    (length, targets), = approximate_counts(load_records(data)[:1])
    assert targets >= len(answer) and targets / length > 0.9  # the answer is nearly all of the record's tokens
    # English keeps four characters a token.
    assert approximate_counts([TextRecord("t" * 400)]) == [(100, 100)]


def test_the_histogram_ends_at_the_longest_record():
    """Lengths 1-10 in 8 bins: the width rounds up to 2, and bins 13-14 and 15-16 were drawn empty past the
    longest record (10). The bins end at it, and every record is counted once."""
    summary = DatasetSummary("d.jsonl", "text", 10, 0, tuple(range(1, 11)))
    bins = summary.histogram()
    assert bins == [(1, 2, 2), (3, 4, 2), (5, 6, 2), (7, 8, 2), (9, 10, 2)]
    assert DatasetSummary("d.jsonl", "text", 3, 0, (100, 101, 130)).histogram()[-1][1] == 130
    few = DatasetSummary("d.jsonl", "text", 3, 0, (5, 6, 6)).histogram()
    assert few == [(5, 5, 1), (6, 6, 2)]  # fewer lengths than bins: no empty bins after them
    assert sum(c for _, _, c in DatasetSummary("d.jsonl", "text", 5, 0, (1, 9, 17, 25, 40)).histogram()) == 5


def test_overlong_drop_counts_a_long_record_as_nothing_and_the_planners_own_length_keeps_them_all():
    # hardware: --hardware 1xH200 (a typed target, no GPU of this box)
    from core.plan import recommend

    # four chats of 100 tokens (40 of them the answer), one of 3,000: with overlong: drop the engine leaves
    # the long one out at any sequence shorter than it, where cut keeps its first tokens
    data = summary((100,) * 4 + (3_000,), (40,) * 4 + (2_900,))
    assert data.trained_tokens(512) == 4 * 100 + 512 and data.trained_tokens(512, "drop") == 4 * 100
    assert data.target_share(512, "drop") == 40 / 100
    assert summary((300, 20), ()).trained_tokens(100, "drop") == 20  # targets not counted: the length alone
    assert data.no_answer_left("d.jsonl", 50, overlong="drop") is not None  # every record longer: nothing left
    assert data.no_answer_left("d.jsonl", 512, overlong="drop") is None

    cut = PlanRequest("Qwen2.5-0.5B", parse_target("1xH200"), epochs=1.0).with_dataset(data)
    drop = PlanRequest("Qwen2.5-0.5B", parse_target("1xH200"), epochs=1.0, overlong="drop").with_dataset(data)
    # the planner's own length: the 95th percentile's power of two (the long one cut), or the longest record's
    # under drop, so that its choice leaves nothing out (a tail within twice the 95th percentile)
    assert cut.seq_len == 4096 and drop.seq_len == 4096  # p95 of five records is the longest one
    few = summary((100,) * 40 + (3_000,), (40,) * 40 + (2_900,))
    assert PlanRequest("m", parse_target("1xH200")).with_dataset(few).seq_len == 128
    # under drop a tail past twice the 95th percentile does not size every plan for itself (3,000 tokens for one
    # record among 100-token ones: 32x the activations): the 95th percentile is covered and the one left out said
    assert PlanRequest("m", parse_target("1xH200"), overlong="drop").with_dataset(few).seq_len == 128
    near = summary((100,) * 40 + (180,), (40,) * 40 + (80,))  # a tail within twice the 95th percentile: kept
    assert PlanRequest("m", parse_target("1xH200"), overlong="drop").with_dataset(near).seq_len == 256
    own = recommend(PlanRequest("Qwen2.5-0.5B", parse_target("1xH200"), overlong="drop").with_dataset(few)).best
    warned = [w for w in own.warnings if w.key == "plan.warn.overlong_drop"]
    assert len(warned) == 1 and dict(warned[0].params) == {"count": 1, "total": 41, "seq": 128, "need": 3_000}
    best = recommend(PlanRequest("Qwen2.5-0.5B", parse_target("1xH200"), overlong="drop",
                                 goal="longest_context").with_dataset(few)).best
    assert best.plan.seq_len >= 3_000
    assert not any(w.key == "plan.warn.overlong_drop" for w in best.warnings)
    pinned = recommend(replace_overrides(PlanRequest("Qwen2.5-0.5B", parse_target("1xH200"), overlong="drop"),
                                         {"seq_len": 512}).with_dataset(few))
    warned = [w for w in pinned.best.warnings if w.key == "plan.warn.overlong_drop"]
    assert len(warned) == 1 and dict(warned[0].params) == {"count": 1, "total": 41, "seq": 512, "need": 3_000}
    assert not any(w.key == "plan.warn.truncation" for w in pinned.best.warnings)


def replace_overrides(request, overrides):
    from dataclasses import replace

    return replace(request, overrides=overrides)


def test_the_shorter_sequences_way_out_says_how_many_samples_drop_leaves_out_there():
    """Nothing fits at the sequence asked for; the way out "shorter sequences: 32768 tokens fit" said nothing of
    the data, though under overlong: drop every sample longer than that is then left out whole (here 10 of 40,
    none at the 131,072 asked). It now says the count and how many more than now, from the same summary the drop
    warning counts; under cut (their first tokens kept) it reads as before. Hardware: --hardware 1xRTX-4090
    (typed, no GPU of this box)."""
    from core.plan import recommend

    data = summary((100,) * 30 + (40_000,) * 10, (50,) * 30 + (20_000,) * 10)
    pinned = {"seq_len": 131072, "method": "lora"}
    drop = recommend(PlanRequest("Qwen2.5-7B", parse_target("1xRTX-4090"), overlong="drop",
                                 overrides=pinned).with_dataset(data))
    cut = recommend(PlanRequest("Qwen2.5-7B", parse_target("1xRTX-4090"), overrides=pinned).with_dataset(data))
    assert not drop.feasible and not cut.feasible
    shorter = [f for f in drop.way_out if f.key.startswith("plan.way_out.shorter")]
    assert len(shorter) == 1 and shorter[0].key == "plan.way_out.shorter_drop"
    assert "but under overlong: drop 10 of 40 samples are longer and left out (10 more than at 131072)" in shorter[0].text()
    assert dict(shorter[0].params)["seq"] < 40_000
    assert [f.key for f in cut.way_out if f.key.startswith("plan.way_out.shorter")] == ["plan.way_out.shorter"]


def test_the_drop_warning_advises_no_seq_len_past_the_models_positions():
    """The drop warning's "seq_len 40000 keeps them all" went past the 32,768 positions Qwen2.5-0.5B takes: no
    seq_len the model takes keeps such a sample. The warning now names the positions, the seq_len that keeps all
    but the samples longer than them (how many), or that none within them keeps the ones dropped. Hardware:
    --hardware 1xH200 (typed, no GPU of this box)."""
    from core.plan import recommend

    data = summary((100,) * 40 + (5_000,) * 3 + (40_000,), (50,) * 40 + (2_000,) * 3 + (20_000,))
    request = PlanRequest("Qwen2.5-0.5B", parse_target("1xH200"), overlong="drop")

    def warned(seq_len):
        best = recommend(replace_overrides(request, {"seq_len": seq_len}).with_dataset(data)).best
        found = [w for w in best.warnings if w.key.startswith("plan.warn.overlong_drop")]
        assert len(found) == 1, best.warnings
        return found[0]

    some = warned(512)  # 4 left out, 3 of which a seq_len within the positions keeps
    assert some.key == "plan.warn.overlong_drop_positions"
    assert dict(some.params) == {"count": 4, "total": 44, "seq": 512, "positions": 32768, "past": 1}
    assert "seq_len 32768 keeps all but the 1 longer than that" in some.text() and "40000" not in some.text()
    only_past = warned(8192)  # the one left out is past the positions
    assert only_past.key == "plan.warn.overlong_drop_past_positions"
    assert "no seq_len within them keeps them" in only_past.text()
    inside = summary((100,) * 40 + (5_000,), (50,) * 40 + (2_000,))  # the longest within them: as before
    best = recommend(replace_overrides(request, {"seq_len": 512}).with_dataset(inside)).best
    assert [dict(w.params)["need"] for w in best.warnings if w.key == "plan.warn.overlong_drop"] == [5_000]


def test_approximate_targets_count_the_tool_calls_an_answer_makes():
    """Without a tokenizer, a conversation's targets were the share of its answers' text alone: an answer that
    only calls a tool (content "", the call in tool_calls) counted nothing, so a tool-calling dataset planned
    with about no targets (1 of 55 here) where the model's own template trains on the calls (100 of 137 with
    the tiny model's). The calls' JSON now counts as the approx length already counted it."""
    from core.data.records import ToolCall
    from core.data.stats import load_tokenizer
    from core.data.tokenize import token_counts

    call = ToolCall("get_weather", {"city": "Paris", "unit": "c", "details": "full forecast with hourly values"})
    record = Conversation([Message("user", "weather in Paris?"), Message("assistant", "", tool_calls=[call]),
                           Message("tool", '{"temp": 21}'), Message("assistant", "21C")])
    (length, targets), = approximate_counts([record])
    (exact_length, exact_targets), = token_counts([record], load_tokenizer("tiny"))
    assert abs(targets / length - exact_targets / exact_length) < 0.2, (targets, length, exact_targets, exact_length)
