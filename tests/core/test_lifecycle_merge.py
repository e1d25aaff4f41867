"""Merging a real tiny LoRA run: same logits as base + adapter, disk check, atomic output."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from tests.fixtures.lifecycle.finished_run import ROOT, tunedeck


def test_merged_model_gives_the_logits_of_base_plus_adapter(lora_run):
    import torch

    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import load_finetuned, load_model_dir, resolve_model_source

    _home, run = lora_run
    result = merge_run(run)
    assert result.out == run.path / "merged" / "checkpoint-30" and result.step == 30 and result.adapter
    names = {p.name for p in result.out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tunedeck_merge.json"} <= names
    assert not any(n.startswith("adapter") for n in names)  # a standalone model, not an adapter
    assert not (run.path / "merged" / "checkpoint-30.tmp").exists()
    merged = load_model_dir(result.out, "cpu")
    assert merged.tokenizer.chat_template  # the chat template travels with the model
    tuned = load_finetuned(resolve_model_source(run), "cpu")
    ids = torch.tensor([[1, 17, 99, 250, 3, 640, 12, 800]])
    with torch.no_grad():
        a = tuned.model(input_ids=ids).logits
        b = merged.model(input_ids=ids).logits
        with tuned.model.disable_adapter():
            base = tuned.model(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()
    assert (a - base).abs().max() > 0.05  # the adapter changed something: the comparison means something
    event = run.last_event("merged")
    assert event and event["out"] == str(result.out)


def test_earlier_checkpoint_and_existing_output(lora_run):
    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import LifecycleError

    _home, run = lora_run
    with pytest.raises(LifecycleError, match="complete checkpoints: 15, 30"):
        merge_run(run, checkpoint=7)
    first = merge_run(run, checkpoint=15)
    assert first.out.name == "checkpoint-15"
    assert json.loads((first.out / "tunedeck_merge.json").read_text())["step"] == 15
    with pytest.raises(LifecycleError, match="--force"):
        merge_run(run, checkpoint=15)
    again = merge_run(run, checkpoint=15, force=True)
    assert again.out == first.out and (again.out / "model.safetensors").is_file()
    assert not (again.out.parent / "checkpoint-15.old").exists()
    # reuse (the TUI's M, export): the whole merge of checkpoint 15 is the result, not rewritten
    files = {p.name: p.stat().st_mtime_ns for p in again.out.iterdir()}
    reused = merge_run(run, checkpoint=15, reuse=True)
    assert reused.reused and reused.out == again.out and reused.step == 15 and reused.bytes == again.bytes
    assert reused.dtype == again.dtype and {p.name: p.stat().st_mtime_ns for p in again.out.iterdir()} == files
    assert not merge_run(run, checkpoint=15, reuse=True, force=True).reused  # force merges again
    (again.out / "tunedeck_merge.json").write_text(json.dumps({"checkpoint": "elsewhere", "step": 15}))
    with pytest.raises(LifecycleError, match="--force"):  # not a whole merge of this checkpoint
        merge_run(run, checkpoint=15, reuse=True)


def test_merge_refuses_when_the_disk_is_too_small(lora_run, tmp_path):
    import shutil

    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import LifecycleError

    _home, run = lora_run
    out = tmp_path / "deep" / "merged"
    # More than is free by far: the disk is shared, and others' files come and go while the model loads.
    headroom = shutil.disk_usage(tmp_path).free + 10**10
    with pytest.raises(LifecycleError) as info:
        merge_run(run, out=out, headroom_bytes=headroom)
    message = str(info.value)
    assert "not enough disk space" in message and str(tmp_path) in message and "--out" in message
    assert not out.exists() and not out.with_name("merged.tmp").exists()
    # The tiny model's own size (a few MB) and the headroom kept free are said apart: the headroom used to be
    # counted as the model ("the merged model needs 0.27 GB" for a 3.7 MB model).
    import re

    from core.units import format_disk

    model = re.search(r"the merged model is ([\d.]+) (\w+)", message)
    assert model is not None and model.group(2) == "MB", message
    assert f"{format_disk(headroom)} is kept free beside it" in message


def test_a_merge_that_fails_while_writing_leaves_no_directory(lora_run, tmp_path):
    """A real write failure: the file-size limit (EFBIG) hits model.safetensors half way."""
    home, run = lora_run
    out = tmp_path / "merged"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    proc = subprocess.run([sys.executable, "-m", "core", "merge", run.id, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, preexec_fn=limit,
                          env={**__import__("os").environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "nothing was left behind" in proc.stderr and str(out) in proc.stderr
    assert not out.exists() and not (tmp_path / "merged.tmp").exists()
    assert list(tmp_path.iterdir()) == []


def test_merge_cli_json_and_unknown_run(lora_run, tmp_path):
    home, run = lora_run
    out = tmp_path / "cli-merged"
    proc = tunedeck(home, "merge", run.id[:12], "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["out"] == str(out) and result["step"] == 30 and result["bytes"] > 1_000_000
    assert result["method"] == "lora"  # as export --json says it (a script tells a QLoRA merge by it)
    assert (out / "model.safetensors").is_file()
    proc = tunedeck(home, "merge", "no-such-run")
    assert proc.returncode == 2 and "no-such-run" in proc.stderr


def test_a_second_merge_into_the_same_folder_is_refused_while_the_first_runs(lora_run):
    import fcntl
    import os

    from core.lifecycle.merge import default_merge_dir, merge_run
    from core.lifecycle.source import LifecycleError

    _home, run = lora_run
    out = default_merge_dir(run, 30)
    lock = out.with_name(out.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)  # the first merge, holding the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(LifecycleError, match="already running") as info:
            merge_run(run, force=True)
        assert str(out) in str(info.value)
        assert not out.with_name(out.name + ".tmp").exists()  # the second one touched nothing
    finally:
        os.close(fd)
    os.unlink(lock)
    result = merge_run(run, force=True)  # once the first has ended, a merge goes ahead
    assert result.out == out and not lock.exists()  # and its lock file goes with it


def test_a_cancelled_merge_stops_at_the_next_stage_and_leaves_nothing(lora_run, tmp_path):
    from core.lifecycle.merge import MergeCancelled, merge_run

    _home, run = lora_run
    out = tmp_path / "cancelled"
    stages: list[str] = []
    with pytest.raises(MergeCancelled):
        merge_run(run, out=out, progress=stages.append, cancelled=lambda: "merge" in stages)
    assert stages == ["load", "merge"]  # stopped before writing
    assert list(tmp_path.iterdir()) == []  # no folder, no .tmp, no .lock
    with pytest.raises(MergeCancelled):
        merge_run(run, out=out, progress=stages.append, cancelled=lambda: True)
    assert stages == ["load", "merge"] and list(tmp_path.iterdir()) == []


def test_a_full_fine_tune_reports_no_merge_stage(lora_run, tmp_path):
    """A checkpoint without an adapter (here: a merged copy of the run, a full model) is taken as it is."""
    import dataclasses

    from core.lifecycle.merge import merge_run, merged_model
    from core.lifecycle.source import resolve_model_source

    _home, run = lora_run
    stages: list[str] = []
    merged = merge_run(run, out=tmp_path / "full", progress=stages.append)
    assert stages == ["load", "merge", "write", "done"]  # the LoRA run folds its adapter in
    full = dataclasses.replace(resolve_model_source(run), checkpoint=merged.out)
    assert not full.is_adapter and resolve_model_source(run).is_adapter
    from core.lifecycle.source import run_has_adapter
    from core.runs.run_dir import RunDirectory

    assert run_has_adapter(run) and not run_has_adapter(RunDirectory(tmp_path / "no-such-run"))
    stages.clear()
    model, _tokenizer = merged_model(full, "cpu", stages.append)
    assert stages == [] and model is not None


@pytest.mark.parametrize("command", [["merge"], ["export", "--format", "merged"]])
def test_an_interrupted_merge_or_export_says_so_and_leaves_the_target_as_it_was(lora_run, tmp_path, monkeypatch,
                                                                                 capsys, command):
    """Ctrl+C during ``merge`` / ``export`` exited 130 with no word. Now one line says it was interrupted and
    that nothing was written; an earlier merge at the target (replaced with --force) is still there, whole.
    Ctrl+C comes as the KeyboardInterrupt it raises, while the model loads; CPU only."""
    import core.lifecycle.merge as merge
    from core.cli import main

    _home, run = lora_run
    out = tmp_path / "merged"
    merge.merge_run(run, out=out)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(merge, "merged_model", interrupted)
    capsys.readouterr()
    assert main([*command, run.id, "--out", str(out), "--force"]) == 130
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert "interrupted" in lines[-1] and "nothing was written" in lines[-1], captured.err
    assert captured.out == ""
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # no .tmp or .old- folder left beside it


def test_a_killed_merges_leftover_is_removed_before_the_free_space_is_measured(lora_run, tmp_path):
    """A merge killed while writing (SIGKILL, the box rebooted) leaves ``OUT.tmp``, as big as the model. The
    retry measured the free space with it still there and refused ("not enough disk space") a disk that had
    room once the leftover, which it removes anyway, was gone. A real 30 MB tmpfs (root; skipped where the
    kernel refuses the mount); CPU only."""
    from core.lifecycle.merge import WRITING_MARKER, merge_run
    from tests.fixtures.disk import free, tmpfs

    _home, run = lora_run
    with tmpfs(tmp_path / "disk", size="30m") as mount:
        out = mount / "merged"
        leftover = mount / "merged.tmp"
        leftover.mkdir()
        (leftover / WRITING_MARKER).touch()
        with open(leftover / "model.safetensors", "wb") as handle:
            handle.write(b"\1" * 20_000_000)
        headroom = 15_000_000  # with the tiny model's 3.7 MB: more than is free beside the leftover
        assert free(mount) < headroom + 3_600_000 < free(mount) + 20_000_000
        result = merge_run(run, out=out, headroom_bytes=headroom)
        assert result.out == out and (out / "model.safetensors").is_file()
        assert sorted(p.name for p in mount.iterdir()) == ["merged"]


def test_the_disk_check_counts_tied_weights_once_as_they_are_saved(lora_run, tmp_path):
    """The tiny model ties its embedding and lm_head, as most small models do (Qwen2.5-0.5B: a quarter of its
    weights). The state dict names the tensor twice, safetensors writes it once: ``model_bytes`` counted it
    twice, so the disk check said 4.2 MB for a 3.7 MB merge (a 0.99 GB model said 1.26 GB) and refused
    disks with room for it. CPU only."""
    from core.lifecycle.merge import merge_run, merged_model, model_bytes
    from core.lifecycle.source import resolve_model_source

    _home, run = lora_run
    result = merge_run(run, out=tmp_path / "merged")
    model, _tokenizer = merged_model(resolve_model_source(run), "cpu")
    assert model.config.tie_word_embeddings
    saved = (result.out / "model.safetensors").stat().st_size  # the tensors and a header of a few KB
    assert saved - 64_000 < model_bytes(model) <= saved


# Run as a script: the merge or export of argv[2:], held where the tokenizer is saved (the weights are in
# OUT.tmp by then) once it has touched the gate file argv[1]; transformers' save_pretrained, not ours.
_HELD_AT_WRITE = """
import sys, time
from pathlib import Path
import transformers.tokenization_utils_base as base

def held(self, *args, **kwargs):
    Path(sys.argv[1]).touch()
    while True:
        time.sleep(0.05)

base.PreTrainedTokenizerBase.save_pretrained = held
from core.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _held_cli(home, tmp_path, script: str, gate, *args: str) -> subprocess.Popen:
    """``tunedeck ARGS`` run through ``script`` (a ``_HELD_AT_*`` text: argv[1] the gate it touches where it holds),
    returned once it holds there; killed if it never gets there (240 s: a ceiling, not a speed target)."""
    import os
    import time

    path = tmp_path / "held.py"
    path.write_text(script)
    proc = subprocess.Popen([sys.executable, str(path), str(gate), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1",
                                 "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 240
        while not gate.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gate.exists(), proc.communicate(timeout=30)[1][-3000:]
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    return proc


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP"])
@pytest.mark.parametrize("command", [["merge"], ["export", "--format", "merged"]])
def test_a_merge_or_export_ended_by_sigterm_or_sighup_leaves_nothing_behind(lora_run, tmp_path, signum, command):
    """``kill``, a job's time limit (SIGTERM) or the SSH connection lost (SIGHUP) ended a merge or export
    where it was: ``OUT.tmp`` with the weights written so far (tens of GB for a real model) and ``OUT.lock``
    stayed. Now they end it as Ctrl+C does: the folder and the lock go, one line says so, and the exit is a
    killed process's, 128 + the signal. Held at a state (the weights in OUT.tmp), then signalled; CPU only."""
    import signal

    home, run = lora_run
    target = tmp_path / "target"
    target.mkdir()
    out = target / "merged"
    proc = _held_cli(home, tmp_path, _HELD_AT_WRITE, tmp_path / "writing", *command, run.id, "--out", str(out))
    try:
        assert (target / "merged.tmp" / "model.safetensors").is_file()  # the state: weights half-published
        proc.send_signal(getattr(signal, signum))
        _stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + getattr(signal, signum), stderr[-3000:]
    assert f"interrupted ({signum})" in stderr.strip().splitlines()[-1], stderr[-3000:]
    assert list(target.iterdir()) == []  # no OUT.tmp, no OUT.lock


# Run as a script: ``merge`` of argv[3:], held in torch's first CUDA query (the device, asked once torch is
# imported: the seconds of that import) until the test's go file argv[2] is there, once it touched argv[1].
_HELD_AT_TORCH = """
import sys, time
from pathlib import Path
import torch

real = torch.cuda.is_available
def held():
    Path(sys.argv[1]).touch()
    while not Path(sys.argv[2]).exists():
        time.sleep(0.05)
    torch.cuda.is_available = real
    return real()

torch.cuda.is_available = held
from core.cli import main
sys.exit(main(sys.argv[3:]))
"""


def test_merge_of_a_live_run_takes_the_newest_checkpoint_after_the_seconds_torch_takes_to_import(lora_run,
                                                                                                 tmp_path):
    """``tunedeck merge RUN`` on a run still training chose its newest checkpoint, then imported torch
    (seconds), then pinned it: a run saving often (save_total_limit) rotated it away meanwhile, and the merge
    failed on a checkpoint "no longer there" that the user had not asked for. Torch is imported before the
    choice now. Held in that import's CUDA query while the run saves checkpoint 45 and rotates 15 and 30 away
    (the trainer's own rotation, keep 1); CPU only."""
    import shutil

    from core.runs.checkpoints import rotate_checkpoints

    home, run = lora_run
    go = tmp_path / "go"
    out = tmp_path / "merged"
    proc = _held_cli(home, tmp_path, _HELD_AT_TORCH, tmp_path / "importing", str(go), "merge", run.id, "--out",
                     str(out), "--json")
    try:
        checkpoints = run.path / "checkpoints"
        shutil.copytree(checkpoints / "checkpoint-30", checkpoints / "checkpoint-45")  # its COMPLETE marker too
        removed = rotate_checkpoints(checkpoints, 1, on_remove=lambda path, why: run.append_event(
            "checkpoint_removed", path=str(path), why=why))
        assert sorted(p.name for p in removed) == ["checkpoint-15", "checkpoint-30"]
        go.touch()
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    assert json.loads(stdout)["step"] == 45 and (out / "model.safetensors").is_file()


def test_merge_run_chooses_the_newest_checkpoint_again_once_torch_is_there(lora_run, tmp_path, monkeypatch):
    """The app's M (``merge_run`` with no checkpoint and no device): the device query that imports torch comes
    between the choice and the pin; a checkpoint rotated away in it is not the one merged, the newest is.
    The run's rotation happens inside torch's CUDA query here (a state, not a race); CPU only."""
    import shutil

    import torch

    from core.lifecycle.merge import merge_run
    from core.runs.checkpoints import rotate_checkpoints

    _home, run = lora_run
    checkpoints = run.path / "checkpoints"
    real = torch.cuda.is_available

    def saved_and_rotated() -> bool:
        monkeypatch.setattr(torch.cuda, "is_available", real)
        shutil.copytree(checkpoints / "checkpoint-30", checkpoints / "checkpoint-45")
        rotate_checkpoints(checkpoints, 1, on_remove=lambda path, why: run.append_event(
            "checkpoint_removed", path=str(path), why=why))
        return real()

    monkeypatch.setattr(torch.cuda, "is_available", saved_and_rotated)
    result = merge_run(run, out=tmp_path / "merged")
    assert result.step == 45 and (result.out / "model.safetensors").is_file()


def _as_method(run, method: str) -> None:
    """The copied tiny LoRA run's config.yaml rewritten to say ``method`` (what a merge reads of it)."""
    import yaml

    cfg = yaml.safe_load(run.config_path.read_text(encoding="utf-8"))
    run.config_path.write_text(yaml.safe_dump({**cfg, "method": method}), encoding="utf-8")


def test_a_qlora_merge_says_it_is_the_unquantised_base_plus_the_adapter(lora_run, tmp_path):
    """A QLoRA adapter trained against the NF4 weights is merged into the unquantised base: nothing said so,
    and the merged model answering slightly unlike the 4-bit one trained came as a surprise. The merge
    says it (stderr, --json or not, and a reused merge too); a LoRA merge says nothing of the kind. CPU
    only: the tiny run's adapter stands for a QLoRA one (the merge never loads the 4-bit base)."""
    home, run = lora_run
    proc = tunedeck(home, "merge", run.id, "--out", str(tmp_path / "lora"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "QLoRA" not in proc.stderr and "4-bit" not in proc.stderr
    _as_method(run, "qlora")
    for args in (("--json",), ()):  # written, then reused as it is
        proc = tunedeck(home, "merge", run.id, *args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        note = [line for line in proc.stderr.splitlines() if line.startswith("QLoRA:")]
        assert len(note) == 1, proc.stderr[-2000:]
        assert "4-bit (NF4)" in note[0] and "may differ slightly" in note[0] and "peft" in note[0]
        assert "QLoRA" not in proc.stdout
    assert "already holds the whole merge" in proc.stderr  # the second was the reuse


def test_a_merge_into_a_base_stored_already_quantized_is_refused_before_anything_is_loaded(lora_run, tmp_path):
    """A run on a hub's ``*-bnb-4bit`` model (config.json carries bitsandbytes' quantization_config): loaded,
    the base is the 4-bit model again, and merging into it quantizes the merged weights a second time,
    written as if it were the model trained. Refused (exit 2) before anything is loaded or written, saying
    what to do (the full-precision model's id), for merge and for a quantized export alike. The tiny model,
    its config given a quantization_config, stands for one (no GPU: nothing of bitsandbytes runs)."""
    import shutil

    import yaml

    from core.lifecycle.export import export_run
    from core.lifecycle.merge import merge_run
    from tests.fixtures.lifecycle.finished_run import TINY

    home, run = lora_run
    base = tmp_path / "tiny-bnb-4bit"
    shutil.copytree(TINY, base)
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                                     "bnb_4bit_quant_type": "nf4"}
    (base / "config.json").write_text(json.dumps(config))
    cfg = yaml.safe_load(run.config_path.read_text())
    run.config_path.write_text(yaml.safe_dump({**cfg, "model": str(base)}))
    out = tmp_path / "merged"
    from core.lifecycle.source import LifecycleError

    for attempt in (lambda: merge_run(run, out=out), lambda: export_run(run, "bnb-4bit", out=out)):
        with pytest.raises(LifecycleError) as info:
            attempt()
        message = str(info.value)
        assert info.value.exit_code == 2
        assert "bitsandbytes 4-bit" in message and str(base / "config.json") in message, message
        assert "full-precision (bf16) model" in message and "-bnb-4bit" in message, message
        assert not out.exists() and not out.with_name("merged.lock").exists()
    proc = tunedeck(home, "merge", run.id)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "stored already quantized" in proc.stderr and "merging" not in proc.stderr.split("quantized")[0]
    assert not (run.path / "merged").exists()


def test_merge_base_takes_the_full_precision_model_of_a_run_on_a_quantized_one(lora_run, tmp_path):
    """A run on a hub's ``*-bnb-4bit`` model could not be merged at all: refused with "train on the bf16 model
    instead" (a new run). ``merge RUN --base ID`` merges its adapter into the full-precision model named (the
    quantized one's bf16 original), the base said in the merge's provenance; the refusal now names that command; a
    base of other shapes is refused before anything is loaded. The tiny model stands for both: its copy with a
    quantization_config for the 4-bit one (no GPU: nothing of bitsandbytes runs), itself for the original."""
    import shutil

    import yaml

    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import LifecycleError
    from tests.fixtures.lifecycle.finished_run import TINY

    home, run = lora_run
    quantized = tmp_path / "tiny-bnb-4bit"
    shutil.copytree(TINY, quantized)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                                     "bnb_4bit_quant_type": "nf4"}
    (quantized / "config.json").write_text(json.dumps(config))
    other = tmp_path / "tiny-wider"
    shutil.copytree(TINY, other)
    (other / "config.json").write_text(json.dumps({**json.loads((TINY / "config.json").read_text()),
                                                   "hidden_size": 2 * config["hidden_size"]}))
    original = run.config_path.read_text()
    run.config_path.write_text(yaml.safe_dump({**yaml.safe_load(original), "model": str(quantized)}))
    try:
        with pytest.raises(LifecycleError) as info:
            merge_run(run, out=tmp_path / "refused")
        assert f"tunedeck merge {run.id} --base" in str(info.value), str(info.value)
        with pytest.raises(LifecycleError) as info:
            merge_run(run, out=tmp_path / "wider", base=str(other))
        assert "is not the shape of" in str(info.value) and "hidden_size" in str(info.value), str(info.value)
        assert not (tmp_path / "wider").exists()
        result = merge_run(run, out=tmp_path / "merged", base=str(TINY))
        assert result.adapter and (result.out / "model.safetensors").is_file()
        assert json.loads((result.out / "tunedeck_merge.json").read_text())["base_model"] == str(TINY)
        proc = tunedeck(home, "merge", run.id, "--base", str(TINY), "--out", str(tmp_path / "cli"))
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (tmp_path / "cli" / "model.safetensors").is_file()
    finally:
        run.config_path.write_text(original)


@pytest.mark.parametrize("size, said", [(15_000_000_000, "15.0 GB"), (3_700_000, "3.7 MB"),
                                        (1_200_000_000_000, "1.2 TB")])
def test_the_cli_and_the_app_say_a_merges_size_alike(tmp_path, size, said):
    """The app's merge notification said f"{bytes/1e6:.1f} MB": a 15 GB merge read "15000.0 MB" there while
    the CLI said "15.00 GB". Both report a merge (written or reused) with ``merge_words``, its size by the
    project's ``format_disk``; the reused line always did so in the app."""
    from core.lifecycle.merge import MergeResult, merge_words

    for reused in (False, True):
        text = merge_words(MergeResult(tmp_path / "m", 30, size, 12.5, "bfloat16", True, reused=reused))
        assert said in text and "000.0" not in text, text


def test_merge_base_of_the_same_shapes_written_another_way_is_not_refused(tmp_path):
    """--base compared the two config.json files key by key, a key one of them leaves out included: a model
    saved before grouped-query attention (no num_key_value_heads: as many as its attention heads) against its
    re-save that writes it out (a hub's *-bnb-4bit copy) read "num_key_value_heads 32 ≠ None", not the shape,
    and the merge was refused. A left-out num_key_value_heads is the attention heads' count, as transformers
    reads it; another key left out by one file is not compared. A real shape difference is still refused.
    Config files only (nothing loaded), no GPU."""
    from core.lifecycle.source import LifecycleError, ModelSource, with_base

    shapes = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
              "num_attention_heads": 4}
    checkpoint = tmp_path / "checkpoint-10"
    checkpoint.mkdir()
    (checkpoint / "adapter_config.json").write_text("{}")
    folders = {}
    for name, config in (("resaved-bnb-4bit", {**shapes, "num_key_value_heads": 4}), ("original", shapes),
                         ("older", {k: v for k, v in shapes.items() if k != "intermediate_size"}),
                         ("grouped", {**shapes, "num_key_value_heads": 2})):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "config.json").write_text(json.dumps(config))
    source = ModelSource(run_id="r", base_model=str(folders["resaved-bnb-4bit"]), hub="huggingface",
                         method="qlora", seed=0, precision="bf16", trained_on="cuda", checkpoint=checkpoint, step=10)
    for name in ("original", "older"):
        assert with_base(source, str(folders[name])).base_model == str(folders[name])
    with pytest.raises(LifecycleError) as info:
        with_base(source, str(folders["grouped"]))
    assert "num_key_value_heads 4 ≠ 2" in str(info.value), str(info.value)
