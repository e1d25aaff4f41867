"""Reasons written by the detached supervisor and trainer are shown in the reader's language.

They are written by processes that never learn the reader's language, so run files keep them as data
(English text plus a message record) and every reader renders them itself; old run directories, which
hold only the text, still read as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import i18n
from core.i18n import Message, render_stored
from core.runs.listing import summarize
from core.runs.run_dir import FAILED, STOPPED, RunDirectory
from core.runs.supervisor import Supervisor
from core.train.worker import _write_outcome, oom_advice, oom_tips

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def chinese():
    i18n.set_language("zh")
    yield
    i18n.set_language("en")


def _run(tmp_path: Path) -> RunDirectory:
    path = tmp_path / "home" / "runs" / "run-1"
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"id": "run-1", "created": "2026-11-30T01:00:00Z",
                                               "config_summary": {"model": "tiny", "method": "lora"}}))
    return RunDirectory(path)


CFG = {"micro_batch_size": 4, "gradient_accumulation": 2, "gradient_checkpointing": False, "method": "lora",
       "max_seq_len": 2048, "zero_stage": 0}


def test_message_round_trip_with_nested_tips(chinese):
    reason = Message("train.reason_oom", advice=oom_tips(CFG, 1))
    record = json.loads(json.dumps(reason.to_record()))
    assert Message.from_record(record) == reason
    english = reason.english()
    assert english.startswith("out of GPU memory; change one of: micro_batch_size 4 → 2 with gradient_accumulation 4; ")
    chinese_text = render_stored(english, record)
    assert chinese_text.startswith("显存不足（OOM）；可以修改以下任意一项：micro_batch_size 4 → 2，gradient_accumulation 设为 4；")
    assert "；更短的 max_seq_len（当前 2048）；" in chinese_text
    assert oom_advice(CFG, 1) in english  # events.jsonl and train.log keep the English line


def test_render_stored_falls_back_to_the_stored_text():
    assert render_stored("old text", None) == "old text"  # an old run: text only
    assert render_stored("old text", {"key": "no.such.key", "params": {}}) == "old text"  # a newer version's key
    assert render_stored("old text", {"key": "train.stopped_at", "params": {}}) == "old text"  # params missing
    assert render_stored("old text", {"key": 3}) == "old text"
    assert render_stored("old text", ["not", "a", "record"]) == "old text"


def test_trainer_outcome_to_status_file_to_readers(tmp_path, chinese):
    run = _run(tmp_path)
    _write_outcome(run, STOPPED, Message("train.stopped_at", step=40, id=run.id), rank=0)
    outcome = json.loads(run.outcome_path.read_text())
    assert outcome["reason"] == f"stopped at step 40; checkpoint saved (continue with tunedeck resume {run.id})"
    assert outcome["reason_message"] == {"key": "train.stopped_at", "params": {"step": 40, "id": run.id}}
    status, reason = Supervisor(run).final_status(0)  # the supervisor's own reading of the outcome
    assert status == STOPPED and reason == Message("train.stopped_at", step=40, id=run.id)
    run.write_status(status, reason)
    raw = json.loads(run.status_path.read_text())
    assert raw["reason"].startswith("stopped at step 40") and raw["reason_message"]["key"] == "train.stopped_at"
    assert run.status().reason_text == f"已在第 40 步停止；检查点已保存（用 tunedeck resume {run.id} 继续）"
    summary = summarize(run)
    assert summary.reason.startswith("stopped at step 40")  # JSON output stays data, in English
    assert summary.reason_text.startswith("已在第 40 步停止")
    i18n.set_language("en")
    assert run.status().reason_text.startswith("stopped at step 40")


def test_supervisor_reasons_and_old_outcomes(tmp_path, chinese):
    run = _run(tmp_path)
    status, reason = Supervisor(run).final_status(3)
    assert status == FAILED and reason.text() == "训练进程以退出码 3 结束；见 train.log"
    run.outcome_path.write_text(json.dumps({"status": "failed", "reason": "an older trainer's text"}))
    assert Supervisor(run).final_status(1) == (FAILED, "an older trainer's text")
    run.write_status(FAILED, "an older trainer's text")
    assert run.status().reason_text == "an older trainer's text" and run.status().reason_message is None


def test_old_status_file_is_read_as_before(tmp_path):
    run = _run(tmp_path)
    run.status_path.write_text(json.dumps({"status": "failed", "reason": "out of GPU memory; ...", "updated": "",
                                           "updated_ts": 0}))
    assert run.status().reason == run.status().reason_text == "out of GPU memory; ..."


def _cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TUNEDECK_HOME": str(home), "LANG": "C",
                                            "OMP_NUM_THREADS": "1", **env})


def test_forced_stop_written_in_chinese_reads_in_english(tmp_path):
    """A reason written by a Chinese CLI (tunedeck stop --force) is not stuck in Chinese for others."""
    run = _run(tmp_path)
    run.write_status("stopped", Message("runs.reason_forced"))
    home = tmp_path / "home"
    en = _cli(home, "status", "run-1")
    zh = _cli(home, "--lang", "zh", "status", "run-1")
    assert en.returncode == 0 and zh.returncode == 0, en.stderr + zh.stderr
    assert "tunedeck stop --force" in en.stdout and "强制结束" not in en.stdout
    assert "已停止 — 被 'tunedeck stop --force' 强制结束" in zh.stdout
    data = json.loads(_cli(home, "--lang", "zh", "status", "run-1", "--json").stdout)
    assert data["reason_message"] == {"key": "runs.reason_forced", "params": {}}
    assert "强制" not in data["reason"]


def test_real_detached_oom_run_reads_in_chinese(tmp_path):
    """End to end: a detached run that runs out of memory (injected), read back with --lang zh."""
    from tests.core.test_train_engine import _config

    home = tmp_path / "home"
    out = _cli(home, "train", str(_config(tmp_path)), "micro_batch_size=4", "max_steps=6", "optimizer=adamw_torch",
               TUNEDECK_INJECT_OOM_AT_STEP="3")
    assert out.returncode == 0, out.stderr
    run = RunDirectory(home / "runs" / out.stdout.strip())
    deadline = time.monotonic() + 180
    while run.status().status not in ("failed", "finished", "crashed", "stopped"):
        assert time.monotonic() < deadline, run.log_path.read_text()[-2000:]
        time.sleep(0.3)
    assert run.status().status == "failed", run.status()
    zh = _cli(home, "--lang", "zh", "status", run.id)
    assert "显存不足（OOM）；可以修改以下任意一项：micro_batch_size 4 → 2" in zh.stdout, zh.stdout + zh.stderr
    en = _cli(home, "status", run.id)
    assert "out of GPU memory; change one of: micro_batch_size 4 → 2" in en.stdout
    failed = [e for e in map(json.loads, run.events_path.read_text().splitlines()) if e["event"] == "failed"]
    assert failed and failed[-1]["reason_message"]["key"] == "train.reason_oom"


def test_model_setup_errors_are_messages_rendered_in_the_readers_language(chinese):
    from core.train.model_setup import ModelSetupError, attention_implementation

    with pytest.raises(ModelSetupError) as caught:
        attention_implementation("fast")
    message = caught.value.args[0]
    assert isinstance(message, Message) and message.key == "train.attn_unknown"
    assert "'fast'" in message.english() and "use auto, sdpa, eager or flash" in message.english()
    assert str(message) != message.english() and "'fast'" in str(message)  # rendered in Chinese here


def test_a_trainer_failing_on_its_data_stores_the_problem_for_each_readers_language(tmp_path):
    """A dataset gone after the run started (or a bad row met by the trainer) failed the run with the
    DataError's text only, so ``--lang zh`` showed it in English. CPU only: the trainer stops at the data,
    before any model is loaded."""
    import yaml

    run = _run(tmp_path)
    gone = tmp_path / "deleted.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")  # no answer
    home = tmp_path / "home"
    for dataset, zh_words, en_words in (
        (gone, f"数据有一个问题：{gone}：文件不存在", f"The data has a problem: {gone}: file not found"),
        (bad, f"数据有一个问题：{bad}:1：", f"The data has a problem: {bad}:1: "),
    ):
        (run.path / "config.yaml").write_text(yaml.safe_dump(
            {"model": "tiny", "dataset": str(dataset), "method": "lora", "precision": "fp32", "seed": 1}))
        worker = subprocess.run([sys.executable, "-m", "core.train.worker", str(run.path)], cwd=ROOT,
                                capture_output=True, text=True, timeout=120,
                                env={**os.environ, "TUNEDECK_HOME": str(home), "CUDA_VISIBLE_DEVICES": ""})
        assert worker.returncode == 1, worker.stderr[-2000:]
        status, reason = Supervisor(run).final_status(1)
        assert status == FAILED and isinstance(reason, Message) and reason.key == "data.error_reason"
        run.write_status(status, reason)
        zh = _cli(home, "--lang", "zh", "status", "run-1")
        en = _cli(home, "status", "run-1")
        assert zh_words in zh.stdout and "The data" not in zh.stdout, zh.stdout + zh.stderr
        assert en_words in en.stdout, en.stdout + en.stderr
    assert "对话" in zh.stdout or "助手" in zh.stdout  # the row's own problem is in Chinese too
