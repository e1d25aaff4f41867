"""The training engine: LoRA/DoRA end to end through the CLI, injected OOM, and its building blocks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from core.train.data_adapter import IGNORE_INDEX, PaddingCollator, pack_examples
from core.train.deepspeed_config import deepspeed_config

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "core" / "assets" / "tiny"


def _dataset(path: Path) -> Path:
    pairs = [("Name a colour.", "Blue."), ("What is 1 + 1?", "1 + 1 = 2."), ("Say yes.", "Yes."),
             ("Opposite of up?", "Down."), ("A pet?", "A dog."), ("Spell sun.", "S-U-N.")]
    with open(path, "w", encoding="utf-8") as handle:
        for q, a in pairs:
            handle.write(json.dumps({"messages": [{"role": "user", "content": q},
                                                  {"role": "assistant", "content": a}]}) + "\n")
    return path


def _config(tmp: Path, **overrides) -> Path:
    import yaml

    values = {"model": str(TINY), "dataset": str(_dataset(tmp / "data.jsonl")), "method": "lora",
              "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.0, "precision": "fp32", "max_seq_len": 64,
              "micro_batch_size": 6, "gradient_accumulation": 1, "max_steps": 20, "learning_rate": 0.005,
              "warmup_steps": 0, "gradient_checkpointing": False, "save_steps": 10, "logging_steps": 1,
              "seed": 3}
    values.update(overrides)
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _tunedeck(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1", **env})


def _wait_final(home: Path, run_id: str, timeout: float = 180) -> dict:
    """Poll in-process (a CLI process per poll would steal the trainer's CPU), then ask the CLI."""
    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory

    run = RunDirectory(home / "runs" / run_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if effective_status(run).status in ("finished", "failed", "crashed", "stopped"):
            return json.loads(_tunedeck(home, "status", run_id, "--json").stdout)
        time.sleep(0.3)
    raise AssertionError(f"{run_id} did not end: {run.status()}")


def _wait_for_text(path: Path, text: str, timeout: float = 60) -> str:
    """The file's text once it holds ``text`` (the supervisor writes its last line after the trainer's)."""
    deadline = time.monotonic() + timeout
    while True:
        content = path.read_text(errors="replace")
        if text in content:
            return content
        assert time.monotonic() < deadline, f"{text!r} not in {path}: {content[-1500:]}"
        time.sleep(0.2)


def _records(run_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def test_lora_run_learns_and_saves_only_the_adapter(tmp_path):
    method = "lora"
    home = tmp_path / "home"
    out = _tunedeck(home, "train", str(_config(tmp_path, dataset="data.jsonl")))  # relative to the YAML
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    assert "tunedeck logs" in out.stderr  # human hints on stderr, only the id on stdout
    status = _wait_final(home, run_id)
    run_dir = home / "runs" / run_id
    assert status["status"] == "finished", (status, (run_dir / "train.log").read_text()[-2000:])
    losses = [r["loss"] for r in _records(run_dir, "metrics.jsonl") if r.get("kind") == "train"]
    header = _records(run_dir, "metrics.jsonl")[0]
    assert header["method"] == method and header["random_init"] is True
    assert f"dataset: {tmp_path / 'data.jsonl'}" in (run_dir / "config.yaml").read_text()
    # the MFU's numerator: LoRA's forward + backward FLOPs of this run's plan, not 6x params
    from core.estimate.run_plan import plan_for_run
    from core.estimate.speed import model_flops_per_token

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    plan = plan_for_run({**config, "model": header["model_dir"]}, 1)
    assert header["model_flops_per_token"] == round(model_flops_per_token(plan)) > 0
    full = model_flops_per_token(plan_for_run({**config, "model": header["model_dir"], "method": "full"}, 1))
    assert header["model_flops_per_token"] < full  # the frozen base computes no weight gradients
    last = status["last_checkpoint"]
    assert last and (Path(last) / "COMPLETE").is_file()
    adapter_config = json.loads((Path(last) / "adapter_config.json").read_text())
    assert adapter_config["r"] == 16 and adapter_config["use_dora"] is False
    assert not (Path(last) / "model.safetensors").exists()  # only the adapter is saved
    assert len(losses) == 20
    assert sum(losses[-4:]) / 4 < 0.8 * sum(losses[:3]) / 3, losses  # memorising 6 answers (random base: slow)
    # The log ends with the verdict: nothing of the interpreter's teardown after it (triton's nanobind
    # bindings printed ~30 "leaked" lines there after every run).
    log = _wait_for_text(run_dir / "train.log", "[supervisor] trainer exited with code 0")
    tail = log[log.rindex("training finished"):]
    assert "leaked" not in tail and "nanobind" not in tail, tail


def test_tokens_seen_counted_on_the_device_reach_the_metrics_and_the_checkpoints(tmp_path):
    """The token count stays on the device between logs (no host sync a micro-step): every log and every
    checkpoint, also one at a step that does not log, still counts every token trained so far."""
    home = tmp_path / "home"
    out = _tunedeck(home, "train", str(_config(tmp_path)), "max_steps=8", "logging_steps=3", "save_steps=4")
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    status = _wait_final(home, run_id)
    run_dir = home / "runs" / run_id
    assert status["status"] == "finished", (run_dir / "train.log").read_text()[-2000:]
    seen = {r["step"]: r["tokens_seen"] for r in _records(run_dir, "metrics.jsonl") if r.get("kind") == "train"}
    assert sorted(seen)[:2] == [3, 6]
    per_step = seen[3] // 3  # every step trains the same 6 examples (micro-batch 6)
    assert 0 < per_step <= 6 * 64 and seen[3] == 3 * per_step and seen[6] == 6 * per_step, seen
    for step in (4, 8):  # saved between logs: the pending count is added before the state is written
        state = json.loads((run_dir / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").read_text())
        assert state["num_input_tokens_seen"] == step * per_step, (step, state["num_input_tokens_seen"], seen)


def test_packed_batches_count_their_tokens_on_the_device_too(tmp_path):
    """Packed batches carry position_ids and no attention mask: their tokens are counted (non-padding
    ids) without the Trainer's sync as well, and reach the metrics and the checkpoints."""
    home = tmp_path / "home"
    out = _tunedeck(home, "train", str(_config(tmp_path)), "max_steps=8", "logging_steps=3", "save_steps=4",
                    "packing=true", "micro_batch_size=2")
    assert out.returncode == 0, out.stderr
    run_dir = home / "runs" / out.stdout.strip()
    assert _wait_final(home, out.stdout.strip())["status"] == "finished", (run_dir / "train.log").read_text()[-2000:]
    seen = {r["step"]: r["tokens_seen"] for r in _records(run_dir, "metrics.jsonl") if r.get("kind") == "train"}
    assert 0 < seen[3] < seen[6] <= 6 * 2 * 64, seen
    saved = {step: json.loads((run_dir / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").read_text())
             ["num_input_tokens_seen"] for step in (4, 8)}
    assert seen[3] < saved[4] < seen[6] < saved[8], (seen, saved)


def test_two_process_dora_run_stops_at_one_step_on_every_rank(tmp_path):
    """The multi-process path (torchrun, DDP over gloo on CPU) the GPU runs use, with DoRA."""
    from core.runs.liveness import effective_status
    from core.runs.run_dir import RunDirectory

    home = tmp_path / "home"
    env = {"TUNEDECK_CPU_PROCESSES": "2"}
    out = _tunedeck(home, "train", str(_config(tmp_path)), "method=dora", "micro_batch_size=2",
                    "max_steps=400", "save_steps=200", **env)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    run = RunDirectory(home / "runs" / run_id)
    deadline = time.monotonic() + 120
    while not (run.latest_metrics() or {}).get("step", 0) >= 2:
        assert time.monotonic() < deadline and effective_status(run).active, run.log_path.read_text()[-2000:]
        time.sleep(0.2)
    out = _tunedeck(home, "stop", run_id, "--wait", "--json")
    assert json.loads(out.stdout)["status"] == "stopped", run.log_path.read_text()[-2000:]
    ckpt = run.last_complete_checkpoint()
    assert ckpt is not None and ckpt.step < 400
    assert (ckpt.path / "rng_state_0.pth").is_file() and (ckpt.path / "rng_state_1.pth").is_file()
    assert json.loads((ckpt.path / "adapter_config.json").read_text())["use_dora"] is True
    header = _records(run.path, "metrics.jsonl")[0]
    assert header["world_size"] == 2 and header["global_batch"] == 4
    log = run.log_path.read_text().splitlines()
    assert any(line.startswith("[rank1] ") for line in log) and "torch.distributed.run" in log[0]
    stop_line = [line for line in log if "stop requested: saving a checkpoint at step" in line]
    assert stop_line and stop_line[0].endswith(f"step {ckpt.step} and stopping")


def test_a_worker_killed_under_torchrun_is_named_as_the_cause_not_the_ranks_that_lost_it(tmp_path):
    """One of two CPU processes (torchrun, DDP over gloo, as on GPUs) is SIGKILLed, as the host's OOM killer
    does: rank 0 then fails on the lost connection ("Connection reset by peer") and recorded that, so the
    run read as a gloo bug and the process that died was named nowhere."""
    import psutil

    from core.runs.run_dir import RunDirectory

    home = tmp_path / "home"
    out = _tunedeck(home, "train", str(_config(tmp_path)), "micro_batch_size=2", "max_steps=400",
                    "save_steps=200", TUNEDECK_CPU_PROCESSES="2")
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    run = RunDirectory(home / "runs" / run_id)
    deadline = time.monotonic() + 120
    while not (run.latest_metrics() or {}).get("step", 0) >= 2:
        assert time.monotonic() < deadline and run.status().active, run.log_path.read_text()[-2000:]
        time.sleep(0.2)
    workers = [p for p in psutil.process_iter(["cmdline", "environ"])
               if "core.train.worker" in (p.info["cmdline"] or []) and str(run.path) in (p.info["cmdline"] or [])]
    victim = next(p for p in workers if (p.info["environ"] or {}).get("RANK") == "1")
    victim.kill()
    status = _wait_final(home, run_id)
    assert status["status"] == "failed", status
    assert status["reason"].startswith("rank 1 was killed by SIGKILL (out of host memory?"), status["reason"]
    assert "and the other ranks failed with it: " in status["reason"]
    assert json.loads((run.path / "status.json").read_text())["reason_message"]["key"] == "runs.reason_rank_signal"


def test_injected_oom_fails_with_reason_event_and_advice(tmp_path):
    home = tmp_path / "home"
    out = _tunedeck(home, "train", str(_config(tmp_path)), "micro_batch_size=4",
                    TUNEDECK_INJECT_OOM_AT_STEP="3")
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    status = _wait_final(home, run_id)
    assert status["status"] == "failed"
    assert "out of GPU memory" in status["reason"] and "micro_batch_size 4 → 2" in status["reason"]
    run_dir = home / "runs" / run_id
    events = _records(run_dir, "events.jsonl")
    oom = [e for e in events if e["event"] == "oom"]
    assert len(oom) == 1
    assert oom[0]["config"]["micro_batch_size"] == 4 and oom[0]["config"]["method"] == "lora"
    # the memory switches of the engine are in the record too (the run's normalised config has them all)
    assert {k: oom[0]["config"][k] for k in ("fused_ce", "offload_activations", "qlora_upcast")} == {
        "fused_ce": "auto", "offload_activations": False, "qlora_upcast": False}
    assert oom[0]["step"] == 2 and "gradient_checkpointing" in oom[0]["advice"]
    assert events[-1]["event"] == "failed" and events[-1]["exit_code"] != 0
    steps = [r["step"] for r in _records(run_dir, "metrics.jsonl") if r.get("kind") == "train"]
    assert steps == [1, 2]


def test_train_refuses_bad_config_and_bad_data_before_starting(tmp_path):
    home = tmp_path / "home"
    out = _tunedeck(home, "train", str(_config(tmp_path)), "lora_rnak=4")
    assert out.returncode == 2 and "lora_rank" in out.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    out = _tunedeck(home, "train", str(_config(tmp_path)), f"dataset={bad}")
    assert out.returncode == 2 and f"{bad}:2" in out.stderr
    out = _tunedeck(home, "train", str(_config(tmp_path)), f"model={tmp_path}")  # a folder, no config.json
    assert out.returncode == 2 and "config.json" in out.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())  # nothing was started


def test_deepspeed_config_per_stage_and_offload():
    cfg = {"zero_stage": 2, "offload": "optimizer", "micro_batch_size": 2, "gradient_accumulation": 4,
           "max_grad_norm": 1.0}
    ds = deepspeed_config(cfg, world_size=2, use_bf16=True, use_fp16=False)
    assert ds["train_batch_size"] == 16 and ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    assert ds["zero_optimization"]["stage"] == 2
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "offload_param" not in ds["zero_optimization"] and ds["optimizer"]["type"] == "AdamW"
    ds3 = deepspeed_config({**cfg, "zero_stage": 3, "offload": "all"}, 4, True, False)
    zero = ds3["zero_optimization"]
    assert zero["offload_param"]["device"] == "cpu" and zero["stage3_gather_16bit_weights_on_model_save"]
    plain = deepspeed_config({**cfg, "zero_stage": 1, "offload": "none"}, 8, False, True)
    assert "offload_optimizer" not in plain["zero_optimization"] and "optimizer" not in plain


def test_packing_and_padding_collator():
    examples = [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4, 5], "labels": [-100, 5]},
                {"input_ids": [6, 7, 8, 9], "labels": [6, 7, 8, 9]}]
    rows = pack_examples(examples, max_seq_len=5)
    assert [r["input_ids"] for r in rows] == [[1, 2, 3, 4, 5], [6, 7, 8, 9]]
    assert rows[0]["position_ids"] == [0, 1, 2, 0, 1]
    assert rows[0]["labels"] == [IGNORE_INDEX, 2, 3, IGNORE_INDEX, 5]
    batch = PaddingCollator(pad_token_id=0, multiple_of=8)(rows)
    assert tuple(batch["input_ids"].shape) == (2, 8)
    assert "attention_mask" not in batch  # packed: the restarting positions separate the examples
    assert batch["position_ids"][1].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]  # the padding is a segment of its own
    assert batch["labels"][1].tolist()[4:] == [IGNORE_INDEX] * 4
    flat = PaddingCollator(pad_token_id=0, multiple_of=8, flatten=True)(rows)
    assert flat["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]  # one row, no padding (flash varlen)
    assert flat["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    plain = PaddingCollator(pad_token_id=0, multiple_of=8)(examples)
    assert plain["attention_mask"][1].tolist() == [1, 1, 0, 0, 0, 0, 0, 0] and "position_ids" not in plain


def test_metrics_callback_records_header_resume_and_nan_loss(tmp_path):
    from types import SimpleNamespace

    from core.runs.run_dir import RunDirectory
    from core.train.callbacks import RunMetricsCallback

    run = RunDirectory(tmp_path)
    run.write_status("starting")
    callback = RunMetricsCallback(run, {"method": "lora"}, resumed_from=str(tmp_path / "checkpoint-4"),
                                  prior_elapsed_s=100.0, global_batch=8, is_main=True)
    state = SimpleNamespace(global_step=4, max_steps=10, epoch=0.4, num_input_tokens_seen=1000)
    callback.on_train_begin(None, state, None)
    assert run.status().status == "running"
    state.global_step, state.num_input_tokens_seen, state.epoch = 5, 1800, 0.5
    callback.last_time -= 2.0  # two seconds for 800 tokens
    callback.on_log(None, state, None, logs={"loss": float("nan"), "learning_rate": 1e-4, "grad_norm": 2.0})
    records = _records(tmp_path, "metrics.jsonl")
    assert [r["kind"] for r in records] == ["header", "resumed", "train"]
    assert records[0]["schema"] == 1 and records[0]["total_steps"] == 10
    assert records[1]["step"] == 4
    train = records[2]
    assert train["loss"] is None and 390 < train["tokens_per_s"] <= 400 and train["elapsed_s"] >= 100
    assert train["samples_per_s"] == pytest.approx(4.0, rel=0.05)
    events = _records(tmp_path, "events.jsonl")
    assert [e["event"] for e in events] == ["resumed", "nan_loss"] and events[1]["step"] == 5
    callback.on_log(None, state, None, logs={"eval_loss": 1.25})
    assert _records(tmp_path, "metrics.jsonl")[-1] == {**_records(tmp_path, "metrics.jsonl")[-1],
                                                       "kind": "eval", "eval_loss": 1.25, "step": 5}


def test_a_record_written_a_step_late_carries_its_own_steps_time(tmp_path, monkeypatch):
    """On a GPU the trainer writes step N's record at the end of step N+1 and tells the callback when step N
    ended (``step_ended``): the record's elapsed time, tokens/s and ETA are step N's. Session 16's bench read
    14,043 tok/s from steps of 0.68 s when every record carried the next step's end instead."""
    from types import SimpleNamespace

    from core.runs.run_dir import RunDirectory
    from core.train import callbacks
    from core.train.callbacks import RunMetricsCallback

    clock = SimpleNamespace(now=1000.0)  # the callback's wall clock, moved by hand: no real time in the test
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(time=lambda: clock.now))
    run = RunDirectory(tmp_path)
    run.write_status("starting")
    callback = RunMetricsCallback(run, {}, resumed_from=None, prior_elapsed_s=10.0, global_batch=4, is_main=True)
    state = SimpleNamespace(global_step=0, max_steps=4, epoch=0.0, num_input_tokens_seen=0)
    callback.on_train_begin(None, state, None)
    start = callback.session_start
    for step, ended in ((1, 2.0), (2, 6.0)):  # steps of 2 s and 4 s of 800 tokens, logged whenever
        state.global_step, state.num_input_tokens_seen = step, 800 * step
        callback.step_ended(start + ended)
        callback.on_log(None, state, None, logs={"loss": 1.0, "learning_rate": 1e-4})
    first, second = _records(tmp_path, "metrics.jsonl")[1:]
    assert (first["elapsed_s"], second["elapsed_s"]) == (12.0, 16.0)
    assert (first["tokens_per_s"], second["tokens_per_s"]) == (400.0, 200.0)
    assert second["eta_s"] == 8.0  # step 2's 4 s (the session's first interval left out), 2 steps left
    clock.now = start + 7.5
    callback.on_log(None, state, None, logs={"loss": 1.0})  # not told: the time it is written
    assert _records(tmp_path, "metrics.jsonl")[-1]["elapsed_s"] == 17.5


def test_the_eta_follows_the_steady_step_time_not_a_resumes_slow_start_or_a_pause(tmp_path, monkeypatch):
    """The ETA was the session's time over its steps: a resume's first interval (the data skip, the model
    load) or a SIGSTOP pause was spread over all the remaining steps (1.5x to 5x too long). It is the median
    step time of the recent logged intervals now. A hand-moved clock: no real time in the test."""
    from types import SimpleNamespace

    from core.runs.run_dir import RunDirectory
    from core.train import callbacks
    from core.train.callbacks import RunMetricsCallback

    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(time=lambda: clock.now))
    run = RunDirectory(tmp_path)
    run.write_status("starting")
    callback = RunMetricsCallback(run, {}, resumed_from="checkpoint-1500", prior_elapsed_s=900.0, global_batch=4,
                                  is_main=True)
    state = SimpleNamespace(global_step=1500, max_steps=2000, epoch=0.0, num_input_tokens_seen=0)
    callback.on_train_begin(None, state, None)

    def log_at(step: int, seconds_later: float) -> float:
        clock.now += seconds_later
        state.global_step = step
        callback.on_log(None, state, None, logs={"loss": 1.0, "learning_rate": 1e-4})
        return _records(tmp_path, "metrics.jsonl")[-1]["eta_s"]

    # The session's first log has one logged interval: the heartbeat's step times (each step noted) stand in,
    # where it said the session's average (30 s a step: 14,700 s).
    from core.runs import heartbeat

    beats = heartbeat.HeartbeatWriter(tmp_path, rank=0)
    for step, at in ((1500, 0.0), (1501, 291.0), *((s, 291.0 + s - 1501) for s in range(1502, 1511))):
        beats.step_times.note(step, at)  # the first step took 291 s (the data skip), then 1 s a step
    monkeypatch.setattr(heartbeat, "_current", beats)
    assert log_at(1510, 300.0) == 490.0  # the first 10 steps took 300 s: skipping 1500 steps of data first
    for step in range(1520, 1600, 10):
        log_at(step, 10.0)  # then 1 s a step
    assert log_at(1600, 10.0) == 400.0  # 400 steps left at 1 s (the session's average would say 2,000 s)
    assert log_at(1610, 3600.0) == 390.0  # an hour stopped (SIGSTOP) within these 10 steps: not spread over
    assert log_at(1620, 10.0) == 380.0


def test_the_eta_counts_steps_a_busy_cpu_slows_now_and_then(tmp_path, monkeypatch):
    """On a busy 2-core CPU one step in three took 4 s, the others 1 s: the median's 1 s made the ETA half the
    time the run really took (2 s a step). The ETA's step time is the mean of the recent intervals less the
    slowest tenth: 2 s a step here, steady from log to log; a rare pause is still left out (the test above).
    Step times fed by hand: no real time in the test."""
    from types import SimpleNamespace

    from core.runs.run_dir import RunDirectory
    from core.train import callbacks
    from core.train.callbacks import RunMetricsCallback

    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(time=lambda: clock.now))
    run = RunDirectory(tmp_path)
    run.write_status("starting")
    callback = RunMetricsCallback(run, {}, resumed_from=None, prior_elapsed_s=0.0, global_batch=4, is_main=True)
    state = SimpleNamespace(global_step=0, max_steps=1000, epoch=0.0, num_input_tokens_seen=0)
    callback.on_train_begin(None, state, None)
    etas = []
    for step in range(1, 301):  # logged every step
        clock.now += 4.0 if step % 3 == 0 else 1.0
        state.global_step = step
        callback.on_log(None, state, None, logs={"loss": 1.0, "learning_rate": 1e-4})
        etas.append(_records(tmp_path, "metrics.jsonl")[-1]["eta_s"])
    truth = 2.0 * 700  # 700 steps left at 2 s a step on average
    assert etas[-1] == pytest.approx(truth, rel=0.1)  # the median said 700 s
    per_step = [eta / (1000 - step) for step, eta in zip(range(200, 301), etas[199:], strict=True)]
    assert max(per_step) / min(per_step) < 1.1  # no flapping from log to log


def test_a_checkpoint_save_among_the_first_logs_is_not_spread_over_the_eta(tmp_path, monkeypatch):
    """With fewer than ten intervals the slowest tenth rounded down to none: a 60 s checkpoint save among the
    first four logs of 1 s steps counted in full (ETA 16x too long until the tenth log). From four intervals on
    the slowest one is left out; with three (too few to tell a save from the pace) all count. Hand-moved clock."""
    from types import SimpleNamespace

    from core.runs.run_dir import RunDirectory
    from core.train import callbacks
    from core.train.callbacks import RunMetricsCallback

    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(time=lambda: clock.now))
    run = RunDirectory(tmp_path)
    run.write_status("starting")
    callback = RunMetricsCallback(run, {}, resumed_from=None, prior_elapsed_s=0.0, global_batch=4, is_main=True)
    state = SimpleNamespace(global_step=0, max_steps=100, epoch=0.0, num_input_tokens_seen=0)
    callback.on_train_begin(None, state, None)
    etas = []
    for step, seconds in ((10, 10.0), (20, 10.0), (30, 10.0 + 60.0), (40, 10.0), (50, 10.0)):  # a save at 30
        clock.now += seconds
        state.global_step = step
        callback.on_log(None, state, None, logs={"loss": 1.0, "learning_rate": 1e-4})
        etas.append(_records(tmp_path, "metrics.jsonl")[-1]["eta_s"])
    assert etas[3] == pytest.approx(60 * (1 + 7 + 1) / 3)  # three intervals: the save counts (no trim yet)
    assert etas[4] == pytest.approx(50.0)  # four intervals: the save left out, 50 steps left at 1 s


def test_the_first_steps_warm_up_is_not_an_eta(tmp_path, monkeypatch):
    """The demo logs every step: its first record's ETA was the first step's time (the warm-up, 5x to 8x a step)
    times the rest, "eta 2:34" for a run that took 20 s. With one step of the session behind and no step times
    of the heartbeat (the warm-up alone) there is no ETA yet; the next log has one. Step times fed by hand: no real time in the test."""
    from types import SimpleNamespace

    from core.runs import heartbeat
    from core.runs.run_dir import RunDirectory
    from core.train import callbacks
    from core.train.callbacks import RunMetricsCallback

    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(time=lambda: clock.now))
    beats = heartbeat.HeartbeatWriter(tmp_path, rank=0)
    monkeypatch.setattr(heartbeat, "_current", beats)
    run = RunDirectory(tmp_path)
    run.write_status("starting")
    callback = RunMetricsCallback(run, {}, resumed_from=None, prior_elapsed_s=0.0, global_batch=8, is_main=True)
    state = SimpleNamespace(global_step=0, max_steps=240, epoch=0.0, num_input_tokens_seen=0)
    callback.on_train_begin(None, state, None)
    beats.step_times.note(0, clock.now)
    for step, seconds in ((1, 5.0), (2, 0.1)):  # a first step of 5 s (the warm-up), then 0.1 s a step
        clock.now += seconds
        beats.step_times.note(step, clock.now)
        state.global_step = step
        callback.on_log(None, state, None, logs={"loss": 1.0, "learning_rate": 1e-4})
    first, second = [r["eta_s"] for r in _records(tmp_path, "metrics.jsonl")[1:]]
    assert first is None  # it said 1,195 s
    assert second == pytest.approx(23.8)  # 238 steps at 0.1 s


def test_optimizer_auto_is_fused_adamw_on_cuda_only():
    from core.train.worker import optimizer_name

    assert optimizer_name({}, cuda=True) == "adamw_torch_fused"
    assert optimizer_name({"optimizer": "auto"}, cuda=False) == "adamw_torch"
    assert optimizer_name({"optimizer": "adamw_torch"}, cuda=True) == "adamw_torch"  # asked for: kept
    assert optimizer_name({"optimizer": "adamw_8bit"}, cuda=True) == "adamw_bnb_8bit"


def test_setup_objects_leave_the_garbage_collectors_sweeps_when_training_begins():
    """A full collection walks every tracked object: the trainer's setup (modules, model, data) is over a
    million of them, 0.3-0.6 s a sweep on the H200 box. Once training begins they are frozen out of it."""
    import gc
    import weakref

    from core.train.callbacks import FreezeSetupObjectsCallback

    setup = [[i] for i in range(50_000)]  # containers the collector tracks, alive for the whole "run"

    class Node:
        pass

    cycle = Node()
    cycle.me = cycle  # a cycle the setup left behind: collected first, not frozen for ever
    gone = weakref.ref(cycle)
    del cycle
    assert any(o is setup[123] for o in gc.get_objects())
    try:
        FreezeSetupObjectsCallback().on_train_begin(None, None, None)
        assert gc.get_freeze_count() >= len(setup)
        assert not any(o is setup[123] for o in gc.get_objects())  # no generation holds it any more
        assert gone() is None
        fresh = [[1]]
        assert any(o is fresh[0] for o in gc.get_objects())  # what the steps make is still collected
    finally:
        gc.unfreeze()


def test_a_log_read_one_step_later_is_the_log_the_trainer_writes(tmp_path):
    """On a GPU a step's loss, grad norm and tokens go to the host without blocking and are logged at the end
    of the next step (no host synchronisation). ``TUNEDECK_DEFER_LOGS=1`` does the same on this CPU: the
    metrics (every value, in the same order with the evaluations) and the checkpoints' log history equal a
    run that logs at once, the last step's log included. Hardware: CPU."""
    home = tmp_path / "home"
    runs = {}
    for defer in ("0", "1"):
        work = tmp_path / defer
        work.mkdir()
        out = _tunedeck(home, "train", str(_config(work)), "max_steps=9", "logging_steps=1", "save_steps=4",
                        "eval_split=0.34", "eval_steps=4", "micro_batch_size=1", TUNEDECK_DEFER_LOGS=defer)
        assert out.returncode == 0, out.stderr
        runs[defer] = home / "runs" / out.stdout.strip()
    kept = ("kind", "step", "epoch", "loss", "learning_rate", "grad_norm", "tokens_seen", "eval_loss")
    seen, history = {}, {}
    for defer, run_dir in runs.items():
        assert _wait_final(home, run_dir.name)["status"] == "finished", (run_dir / "train.log").read_text()[-2000:]
        assert _records(run_dir, "metrics.jsonl")[0]["logs_deferred"] is (defer == "1")  # what benches read
        seen[defer] = [{k: r.get(k) for k in kept} for r in _records(run_dir, "metrics.jsonl")[1:]]
        state = json.loads((run_dir / "checkpoints" / "checkpoint-9" / "trainer_state.json").read_text())
        history[defer] = [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k}
                          for entry in state["log_history"]]
    expected = [(kind, step) for step in range(1, 10) for kind in ("train", "eval") if kind == "train" or step in (4, 8, 9)]
    assert [(r["kind"], r["step"]) for r in seen["0"]] == expected, seen["0"]
    assert seen["1"] == seen["0"]  # the last step's log too: it comes before its checkpoint
    assert all(r["grad_norm"] is not None and r["tokens_seen"] > 0 for r in seen["1"] if r["kind"] == "train")
    assert history["1"] == history["0"] and history["1"]


def test_the_last_step_is_logged_whatever_logging_steps_says(tmp_path):
    """A run of 5 steps logging every 2 ends with a record of step 5 (epoch and all): ``status`` reads
    5/5, not 4/4 (the QA run of 54 steps logged every 10 read "step 50/50 · epoch 2.78"). Hardware: CPU."""
    home = tmp_path / "home"
    out = _tunedeck(home, "train", str(_config(tmp_path)), "max_steps=5", "logging_steps=2", "save_steps=100")
    assert out.returncode == 0, out.stderr
    status = _wait_final(home, out.stdout.strip())
    run_dir = home / "runs" / out.stdout.strip()
    assert status["status"] == "finished", (run_dir / "train.log").read_text()[-2000:]
    train = [r for r in _records(run_dir, "metrics.jsonl") if r.get("kind") == "train"]
    assert [r["step"] for r in train] == [2, 4, 5]
    assert train[-1]["epoch"] == 5.0  # one step an epoch: 6 examples, batches of 6
    assert (status["step"], status["total_steps"]) == (5, 5)
    assert status["last_checkpoint_step"] == 5


def test_a_stop_logs_the_step_it_stops_at():
    """A stop between logging steps still leaves a record of the step it stopped at (and a checkpoint)."""
    from types import SimpleNamespace

    from core.train.callbacks import GracefulStopCallback, StopFlag

    flag = StopFlag()
    callback = GracefulStopCallback(flag)
    control = SimpleNamespace(should_save=False, should_log=False, should_training_stop=False)
    callback.on_step_end(None, SimpleNamespace(global_step=7, max_steps=100), control)
    assert not (control.should_log or control.should_save or control.should_training_stop)
    flag.set()
    callback.on_step_end(None, SimpleNamespace(global_step=8, max_steps=100), control)
    assert control.should_log and control.should_save and control.should_training_stop
    assert callback.stopped_at == 8


def test_resume_of_a_tied_model_does_not_warn_of_its_tied_weight_but_of_a_really_missing_one(tmp_path, monkeypatch):
    """The tiny model ties lm_head.weight to embed_tokens.weight; its checkpoint stores that tensor once,
    and every resume of a full run logged "There were missing keys in the checkpoint model loaded:
    ['lm_head.weight']", read as a damaged checkpoint. The tied key is left out of the warning; a key the
    checkpoint really lacks (a layer's norm here) is still reported, and an unexpected one too."""
    import safetensors.torch
    import transformers.trainer
    from transformers import AutoConfig, AutoModelForCausalLM

    from core.train.trainer import AtomicCheckpointTrainer, untied_missing_keys

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(TINY)))  # no weights are bundled
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: one tensor, two names
    model.save_pretrained(tmp_path / "checkpoint")  # as the Trainer's checkpoint save does
    state = safetensors.torch.load_file(str(tmp_path / "checkpoint" / "model.safetensors"))
    assert "lm_head.weight" not in state and "model.embed_tokens.weight" in state
    warned: list[str] = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda message, *a, **k: warned.append(message))
    trainer = AtomicCheckpointTrainer.__new__(AtomicCheckpointTrainer)  # only its model matters here
    trainer.model = model

    loaded = model.load_state_dict(state, False)  # what the Trainer's resume does
    assert loaded.missing_keys == ["lm_head.weight"]
    assert untied_missing_keys(model, loaded.missing_keys) == []
    trainer._issue_warnings_after_load(loaded)
    assert warned == []

    norm = "model.layers.0.input_layernorm.weight"
    broken = {k: v for k, v in state.items() if k != norm} | {"extra.weight": state[norm]}
    loaded = model.load_state_dict(broken, False)
    assert sorted(loaded.missing_keys) == sorted(["lm_head.weight", norm])
    trainer._issue_warnings_after_load(loaded)
    assert warned[0] == f"There were missing keys in the checkpoint model loaded: {[norm]}."
    assert "extra.weight" in warned[1]

    # A tied pair both missing: nothing loaded either name, both are reported.
    gone = {k: v for k, v in state.items() if k != "model.embed_tokens.weight"}
    loaded = model.load_state_dict(gone, False)
    assert sorted(untied_missing_keys(model, loaded.missing_keys)) == ["lm_head.weight", "model.embed_tokens.weight"]


def test_constant_scheduler_warms_up_as_the_config_says(tmp_path):
    """lr_scheduler: constant went to transformers' constant, which ignores the warmup: a run with
    warmup_steps: 3 (or the 0.03 default ratio) started at the full learning rate. Now the rate climbs over
    the warmup and then stays (CPU, the tiny model)."""
    home = tmp_path / "home"
    out = _tunedeck(home, "train", str(_config(tmp_path, lr_scheduler="constant", warmup_steps=3, max_steps=5,
                                               save_steps=5)))
    assert out.returncode == 0, out.stderr
    run_dir = home / "runs" / out.stdout.strip()
    status = _wait_final(home, out.stdout.strip())
    assert status["status"] == "finished", (status, (run_dir / "train.log").read_text()[-2000:])
    rates = [r["learning_rate"] for r in _records(run_dir, "metrics.jsonl") if r.get("kind") == "train"]
    assert len(rates) == 5 and rates[0] < rates[1] < rates[2] < 0.005 and rates[3:] == [0.005, 0.005], rates


def test_adam_betas_and_overlong_drop_reach_the_real_optimizer_and_data(tmp_path):
    """adam_beta1/adam_beta2/adam_epsilon were not run keys: every run trained with transformers' (0.9, 0.999),
    so an ms-swift args.json (adam_beta2: 0.95) could not be trained as written. Now the optimizer the Trainer
    builds (read back from the checkpoint's optimizer state) has the config's betas, and the default run keeps
    transformers' own. overlong: drop leaves a sample longer than max_seq_len out, said in events.jsonl and
    train.log. CPU, the tiny model, no GPU assumed."""
    import torch

    home = tmp_path / "home"
    data = _dataset(tmp_path / "data.jsonl")
    with open(data, "a", encoding="utf-8") as handle:  # one sample far past max_seq_len 64
        handle.write(json.dumps({"messages": [{"role": "user", "content": "Count."},
                                              {"role": "assistant", "content": "one two three " * 60}]}) + "\n")
    betas = {}
    for name, extra in (("swift", ["adam_beta2=0.95", "adam_epsilon=1e-6", "overlong=drop"]), ("default", [])):
        work = tmp_path / name
        work.mkdir()
        config = _config(work, max_steps=1, save_steps=1)
        out = _tunedeck(home, "train", str(config), f"dataset={data}", *extra)
        assert out.returncode == 0, out.stderr
        run_dir = home / "runs" / out.stdout.strip()
        status = _wait_final(home, out.stdout.strip())
        assert status["status"] == "finished", (run_dir / "train.log").read_text()[-2000:]
        state = torch.load(run_dir / "checkpoints" / "checkpoint-1" / "optimizer.pt", map_location="cpu",
                           weights_only=False)
        betas[name] = {(tuple(group["betas"]), group["eps"]) for group in state["param_groups"]}
        events = [e for e in _records(run_dir, "events.jsonl") if e.get("event") == "data_overlong_dropped"]
        log = (run_dir / "train.log").read_text()
        if name == "swift":
            assert [e["samples"] for e in events] == [1], events
            assert "1 samples longer than max_seq_len 64 were left out (overlong: drop)" in log
        else:
            assert events == [] and "were truncated" in log
    assert betas["swift"] == {((0.9, 0.95), 1e-6)}
    assert betas["default"] == {((0.9, 0.999), 1e-8)}


def test_samples_with_no_trained_turn_are_said_as_left_out(tmp_path):
    """A sample whose every assistant turn is at weight 0 has no token to train on: the trainer left it out
    without a word, where a sample cut or dropped as too long is counted in train.log and events.jsonl. Now it
    is said the same way: how many, and where the first came from. CPU, the tiny model, no GPU assumed."""
    home = tmp_path / "home"
    data = _dataset(tmp_path / "data.jsonl")
    with open(data, "a", encoding="utf-8") as handle:  # line 7: its one answer excluded from training
        handle.write(json.dumps({"messages": [{"role": "user", "content": "Hi."},
                                              {"role": "assistant", "content": "Hello.", "weight": 0}]}) + "\n")
    work = tmp_path / "work"  # _config writes its own data.jsonl beside the config
    work.mkdir()
    out = _tunedeck(home, "train", str(_config(work, max_steps=1, save_steps=1)), f"dataset={data}")
    assert out.returncode == 0, out.stderr
    run_dir = home / "runs" / out.stdout.strip()
    status = _wait_final(home, out.stdout.strip())
    log = (run_dir / "train.log").read_text()
    assert status["status"] == "finished", log[-2000:]
    events = [e for e in _records(run_dir, "events.jsonl") if e.get("event") == "data_no_trained_turn"]
    assert [(e["samples"], e["file"]) for e in events] == [(1, f"{data}:7")], events
    assert f"1 samples have no turn to train on (every assistant turn excluded: weight 0) and were left out " \
           f"(the first: {data}:7)" in log, log[-2000:]


def _all_too_long(path: Path) -> Path:
    """Two samples, each far past max_seq_len 64 with the tiny model's tokenizer."""
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(2):
            handle.write(json.dumps({"messages": [{"role": "user", "content": "Count."},
                                                  {"role": "assistant", "content": "one two three " * 60}]}) + "\n")
    return path


def test_a_run_whose_every_sample_is_dropped_as_too_long_says_so_not_that_they_are_empty(tmp_path, monkeypatch):
    """With overlong: drop and every sample longer than max_seq_len, the trainer failed with "every example
    empty, or no assistant turn", which was untrue and hid the way out. Now it says the samples were left out
    as too long, how many, the max_seq_len, and to raise it or set overlong: cut. The trainer process runs on
    a run made without the launch's data check (as one whose model was not here at launch is). CPU, the
    tiny model, no GPU assumed."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    from core.config import load_run_config
    from core.runs.lifecycle import prepare_run

    data = _all_too_long(tmp_path / "long.jsonl")
    config = load_run_config(_config(tmp_path, dataset=str(data), overlong="drop", max_steps=1), for_training=True)
    run = prepare_run(config, ["tunedeck", "train"], warn=lambda _message: None)
    worker = subprocess.run([sys.executable, "-m", "core.train.worker", str(run.path)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})
    assert worker.returncode == 1
    shown = run.outcome_path.read_text(encoding="utf-8")  # the reason the supervisor copies to status.json
    assert "2 samples longer than max_seq_len 64 tokens are left out (overlong: drop)" in shown, shown
    assert "set overlong: cut" in shown and "every example empty" not in shown


def test_a_run_whose_every_answer_the_cut_removes_says_so_not_that_they_are_empty(tmp_path, monkeypatch):
    """overlong: cut and every sample's answer past max_seq_len: the trainer dropped them all and failed with
    "every example empty, or no assistant turn", untrue of data with an answer in every sample. Now it says
    the cut left them without an answer, how many, the first one's file:line, and to raise max_seq_len. The
    trainer process runs on a run made without the launch's data check. CPU, the tiny model, no GPU assumed."""
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    from core.config import load_run_config
    from core.runs.lifecycle import prepare_run

    data = tmp_path / "long_prompts.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "word " * 200},
                                                     {"role": "assistant", "content": "ok"}]}) + "\n"
                            for _ in range(2)))
    config = load_run_config(_config(tmp_path, dataset=str(data), max_steps=1), for_training=True)
    run = prepare_run(config, ["tunedeck", "train"], warn=lambda _message: None)
    worker = subprocess.run([sys.executable, "-m", "core.train.worker", str(run.path)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})
    assert worker.returncode == 1
    shown = run.outcome_path.read_text(encoding="utf-8")
    assert f"the cut to their first 64 leaves none of them an answer to learn (the first: {data}:1)" in shown, shown
    assert "every example empty" not in shown


def test_train_and_train_check_refuse_data_whose_every_sample_overlong_drop_leaves_out(tmp_path):
    """The same data was accepted by `train --check` and by `train`, which launched a trainer only for it to
    fail. Both now say it before anything starts, in the trainer's words; overlong: cut still passes."""
    home = tmp_path / "home"
    config = _config(tmp_path, dataset=str(_all_too_long(tmp_path / "long.jsonl")), max_steps=1)
    for args in (["--check"], []):
        out = _tunedeck(home, "--lang", "en", "train", str(config), *args, "overlong=drop")
        assert out.returncode == 2, out.stderr
        assert "2 samples longer than max_seq_len 64 tokens are left out (overlong: drop)" in out.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
    assert _tunedeck(home, "train", str(config), "--check").returncode == 0


def test_train_check_of_short_samples_under_a_small_max_seq_len_loads_no_tokenizer(tmp_path):
    """The check that some sample keeps its answer after the cut skipped the tokenizer only for a sample shorter
    than max_seq_len less 512 template tokens: under max_seq_len 64 (this file's runs, the demo's size) none is,
    so every `train`, `train --check` and `resume` imported transformers and loaded the tokenizer (3 s where the
    check took 0.3 s) for samples of a few words. A sample the estimate puts at half max_seq_len or less is
    taken to fit now: the check imports no transformers (a state of the process, not a time)."""
    home = tmp_path / "home"
    config = _config(tmp_path)
    probe = ("import sys\nfrom core.runs.lifecycle import check_run_file\n"
             f"check_run_file({str(config)!r})\nprint('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", out.stdout


def test_train_check_refuses_data_whose_every_answer_the_cut_removes(tmp_path):
    """Every sample's prompt longer than max_seq_len (overlong: cut): the trainer drops each, its answer past the
    cut, and failed after launch with "every example empty, or no assistant turn", which was untrue. `train
    --check` now says it before anything starts: how many, the first one's file:line, and to raise
    max_seq_len."""
    home = tmp_path / "home"
    data = tmp_path / "long_prompts.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "word " * 200},
                                                     {"role": "assistant", "content": "ok"}]}) + "\n"
                            for _ in range(2)))
    out = _tunedeck(home, "--lang", "en", "train", str(_config(tmp_path, dataset=str(data))), "--check")
    assert out.returncode == 2, out.stderr
    assert "2 samples are longer than max_seq_len 64 tokens and the cut to their first 64 leaves none of them an " \
        f"answer to learn (the first: {data}:1); raise max_seq_len" in out.stderr


def test_train_check_with_overlong_drop_leaves_a_template_that_refuses_a_sample_to_the_trainer(tmp_path):
    """The look before launch for overlong: drop tokenizes samples with the model's chat template; a template
    that refuses one (jinja's raise_exception: "no system role") escaped it as a traceback out of `train
    --check`. The look answers only whether some sample fits: such a sample is the trainer's to report."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(TINY, model)
    settings_path = model / "tokenizer_config.json"
    settings = json.loads(settings_path.read_text(encoding="utf-8"))
    settings["chat_template"] = ("{%- if messages[0].role == 'system' %}{{ raise_exception('System role not "
                                 "supported') }}{%- endif %}" + settings["chat_template"])
    settings_path.write_text(json.dumps(settings), encoding="utf-8")
    data = tmp_path / "system.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Count."},
                                             {"role": "assistant", "content": "one two"}]}) + "\n",
                    encoding="utf-8")
    config = _config(tmp_path, model=str(model), dataset=str(data), max_steps=1)
    out = _tunedeck(tmp_path / "home", "--lang", "en", "train", str(config), "--check", "overlong=drop")
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr
