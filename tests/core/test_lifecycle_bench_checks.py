"""bench/lifecycle_gpu.py's checks on a CPU: they pass a right merge and right usage, and fail (with the
numbers) a merge that lost its adapter or a reply that reports no tokens.

The GPU run of the bench uses the same functions on a 7B model; here they run on a real finished tiny
LoRA run, a real ``tunedeck merge`` and a real server over loopback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.fixtures.lifecycle.finished_run import ROOT, finished_run, tunedeck

sys.path.insert(0, str(ROOT / "bench"))
import lifecycle_gpu  # noqa: E402  (the bench script, imported for its checks)


@pytest.fixture()
def merged_run(shared, monkeypatch):
    home, run_id = finished_run(shared)
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    done = tunedeck(home, "merge", run_id, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    return home, run_id, json.loads(done.stdout)


def _save_as(model, tokenizer, path):
    model.save_pretrained(str(path), safe_serialization=True)
    tokenizer.save_pretrained(str(path))
    return path


def test_logits_check_passes_a_right_merge_and_fails_one_without_its_adapter(merged_run, tmp_path):
    import torch

    from core.lifecycle.source import (
        load_base_model,
        load_model_dir,
        load_tokenizer_for,
        resolve_model_source,
    )
    from core.runs.run_dir import RunDirectory

    home, run_id, merged = merged_run
    numbers = lifecycle_gpu.logits_check(home, run_id, Path(merged["out"]))
    assert lifecycle_gpu.check_logits(numbers) == [], numbers
    assert numbers["adapter_effect_max"] > 0.5  # the run memorised its answers: the adapter matters
    assert numbers["merge_rounding_max"] == 0.0 and numbers["max_abs_diff"] <= numbers["tolerance"] < 0.01
    assert numbers["weights_compared"] > 10 and numbers["weights_max_ulp"] == 0.0  # fp32: the same sums
    # The same merge stored in bf16: the rounding is measured (not zero) and the merge still passes.
    bf16 = load_model_dir(Path(merged["out"]), "cpu")
    bf16_dir = _save_as(bf16.model.to(torch.bfloat16), bf16.tokenizer, tmp_path / "merged-bf16")
    rounded = lifecycle_gpu.logits_check(home, run_id, bf16_dir)
    assert rounded["dtype"] == "torch.bfloat16" and rounded["merge_rounding_max"] > 0
    assert 0 < rounded["weights_max_ulp"] <= 0.5  # rounding the exact merge: half a unit at most
    assert lifecycle_gpu.check_logits(rounded) == [], rounded
    # A "merge" that lost the adapter (the base alone): failed, with its numbers.
    source = resolve_model_source(RunDirectory(home / "runs" / run_id))
    lost = _save_as(load_base_model(source, "cpu"), load_tokenizer_for(source), tmp_path / "base-only")
    wrong = lifecycle_gpu.logits_check(home, run_id, lost)
    problems = lifecycle_gpu.check_logits(wrong)
    assert len(problems) == 2 and problems[0].startswith("merged logits differ from base + adapter by "), problems
    assert f"{wrong['max_abs_diff']:.4g}" in problems[0] and f"{wrong['tolerance']:.4g}" in problems[0]
    assert problems[1].startswith("merged weight ") and "units in the last place" in problems[1]
    assert wrong["merged_vs_base_max"] == 0.0 and wrong["weights_max_ulp"] > 100
    # ... and in bf16 too: the rounding allowance does not swallow a lost adapter.
    lost_bf16 = _save_as(load_base_model(source, "cpu").to(torch.bfloat16), load_tokenizer_for(source),
                         tmp_path / "base-only-bf16")
    assert len(lifecycle_gpu.check_logits(lifecycle_gpu.logits_check(home, run_id, lost_bf16))) == 2


def test_serve_check_passes_real_replies_and_fails_a_reply_without_tokens(merged_run):
    home, run_id, _merged = merged_run
    started = tunedeck(home, "serve", run_id, "--json")
    assert started.returncode == 0, started.stderr[-2000:]
    state = json.loads(started.stdout)
    try:
        served = lifecycle_gpu.chat_requests(state["url"], run_id)
    finally:
        assert tunedeck(home, "serve", run_id, "--stop").returncode == 0
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs (OMP_NUM_THREADS=1): the same sums, the same argmax
    try:
        expected = lifecycle_gpu.expected_reply(home, run_id, lifecycle_gpu.PROMPT, lifecycle_gpu.MAX_TOKENS, None)
    finally:
        torch.set_num_threads(threads)
    assert expected["completion_tokens"] >= 1
    assert lifecycle_gpu.check_serve(served, expected) == [], (served, expected)
    assert served["stream_usage"]["completion_tokens"] == served["completion_tokens"] == expected["completion_tokens"]
    zero = {**served, "completion_tokens": 0}
    problems = lifecycle_gpu.check_serve(zero, expected)
    assert any("reports 0 completion tokens" in p for p in problems), problems
    assert any(p.startswith("completion_tokens is 0, but generate() on the same weights gives") for p in problems)
    off_by_one = {**served, "stream_usage": {**served["stream_usage"],
                                             "completion_tokens": served["completion_tokens"] - 1}}
    assert lifecycle_gpu.check_serve(off_by_one, expected)
