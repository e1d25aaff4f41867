"""Chat, serve and evaluate of a LIVE run whose checkpoints rotate (save_total_limit).

They chose the newest checkpoint, then imported torch (seconds; evaluate tokenized its data too), then pinned
it: a run saving often rotated it away meanwhile, and ``tunedeck chat RUN``, the app's chat or evaluate failed
on a checkpoint "no longer there" that the user had not asked for. Merge had the same window and was fixed
first; all of them now hold their checkpoint with one mechanism (``core.lifecycle.source.held``): pinned from
before the seconds of torch's import to the end of loading, and the newest chosen again when the one chosen
went before the pin. A real tiny LoRA run (checkpoints 15 and 30), the trainer's own rotation (keep 1) run
inside torch's first CUDA query (a state, not a race); CPU only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.fixtures.lifecycle.finished_run import ROOT


def save_and_rotate(run) -> list[str]:
    """The live run saves checkpoint 45 and rotates (keep 1), recording each removal as the trainer does."""
    from core.runs.checkpoints import rotate_checkpoints

    shutil.copytree(run.checkpoints_dir / "checkpoint-30", run.checkpoints_dir / "checkpoint-45")
    return sorted(p.name for p in rotate_checkpoints(run.checkpoints_dir, 1, on_remove=lambda path, why:
                                                       run.append_event("checkpoint_removed", path=str(path),
                                                                        why=why)))


def test_held_chooses_the_newest_again_when_the_chosen_one_was_rotated_away(lora_run):
    """The mechanism itself: a checkpoint removed between its choice and its pin is the newest chosen again
    when no step was asked for, and said to be rotated away when it was asked for."""
    from core.lifecycle.source import LifecycleError, held, resolve_model_source

    _home, run = lora_run
    chosen = resolve_model_source(run)
    assert chosen.step == 30
    assert save_and_rotate(run) == ["checkpoint-15", "checkpoint-30"]
    with held(run, chosen, None) as source:
        assert source.step == 45 and source.checkpoint.name == "checkpoint-45"
        assert save_and_rotate_is_refused(run)  # held: the next rotation leaves it
    with pytest.raises(LifecycleError) as info, held(run, chosen, 30):
        pass
    assert "checkpoint 30 of run" in str(info.value) and "rotation" in str(info.value)


def save_and_rotate_is_refused(run) -> bool:
    """A save of checkpoint 60 and a rotation (keep 1) while checkpoint 45 is held leave 45 there."""
    from core.runs.checkpoints import rotate_checkpoints

    shutil.copytree(run.checkpoints_dir / "checkpoint-45", run.checkpoints_dir / "checkpoint-60")
    rotate_checkpoints(run.checkpoints_dir, 1)
    return (run.checkpoints_dir / "checkpoint-45" / "COMPLETE").is_file()


def rotate_at_first_cuda_query(run, monkeypatch) -> list[list[str]]:
    """The run saves and rotates (``save_and_rotate``) in torch's first CUDA query (the device's choice, within
    seconds of the checkpoint's): the folders each rotation removed, filled in as it happens."""
    import torch

    real = torch.cuda.is_available
    removed: list[list[str]] = []

    def saved_and_rotated() -> bool:
        monkeypatch.setattr(torch.cuda, "is_available", real)
        removed.append(save_and_rotate(run))
        return real()

    monkeypatch.setattr(torch.cuda, "is_available", saved_and_rotated)
    return removed


def test_evaluate_of_a_live_run_survives_a_rotation_while_torch_imports(lora_run, monkeypatch):
    """``evaluate_run`` (the CLI's evaluate, the app's e) with the run saving and rotating in torch's first
    CUDA query: the checkpoint it chose is held, not rotated away under it."""
    from core.lifecycle.evaluate import evaluate_run

    _home, run = lora_run
    removed = rotate_at_first_cuda_query(run, monkeypatch)
    result = evaluate_run(run, prompts=["Say yes."])
    assert removed == [["checkpoint-15"]]  # checkpoint 30 was held: the rotation passed it over
    assert result["step"] == 30 and result["tuned"]["loss"] < result["base"]["loss"]


# Run as a script: the run ``argv[1]`` saves checkpoint 45 and rotates (keep 1) in torch's first CUDA query;
# then ``argv[2]`` ("cli": ``python -m core``, "worker": the app's chat worker) runs with ``argv[3:]``.
_ROTATED_AT_TORCH = """
import shutil, sys
from pathlib import Path
import torch
from core.runs.checkpoints import rotate_checkpoints
from core.runs.run_dir import RunDirectory

run = RunDirectory(Path(sys.argv[1]))
real = torch.cuda.is_available
def rotated():
    torch.cuda.is_available = real
    shutil.copytree(run.checkpoints_dir / "checkpoint-30", run.checkpoints_dir / "checkpoint-45")
    rotate_checkpoints(run.checkpoints_dir, 1, on_remove=lambda path, why: run.append_event(
        "checkpoint_removed", path=str(path), why=why))
    return real()

torch.cuda.is_available = rotated
if sys.argv[2] == "cli":
    from core.cli import main
else:
    from core.lifecycle.chat_worker import main
sys.exit(main(sys.argv[3:]))
"""


def _rotated_at_torch(home, run, tmp_path, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "rotated.py"
    script.write_text(_ROTATED_AT_TORCH)
    return subprocess.run([sys.executable, str(script), str(run.path), *args], cwd=ROOT, input="",
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1",
                               "PYTHONPATH": str(ROOT)})


def test_chat_cli_of_a_live_run_survives_a_rotation_while_torch_imports(lora_run, tmp_path):
    """``tunedeck chat RUN`` (piped, no message): it loads the checkpoint it named, and ends 0."""
    home, run = lora_run
    proc = _rotated_at_torch(home, run, tmp_path, "cli", "chat", run.id)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no longer there" not in proc.stderr and "rotation" not in proc.stderr, proc.stderr[-3000:]
    assert f"{run.id} checkpoint-30" in proc.stderr
    assert (run.checkpoints_dir / "checkpoint-45").is_dir() and not (run.checkpoints_dir / "checkpoint-15").exists()


def test_the_apps_chat_worker_of_a_live_run_survives_a_rotation_while_torch_imports(lora_run, tmp_path):
    """The chat screen's worker (``--run`` without ``--checkpoint``): "ready", not the error record."""
    home, run = lora_run
    proc = _rotated_at_torch(home, run, tmp_path, "worker", "--run", str(run.path))
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 0, (records, proc.stderr[-3000:])
    assert [r["event"] for r in records if r["event"] != "warning"] == ["ready"], records
    assert records[-1]["step"] == 30


def test_benchmarks_of_a_live_run_survive_a_rotation_while_torch_imports(lora_run, tmp_path, monkeypatch):
    """``evaluate --benchmarks`` chose the newest step and passed it to the merge as if the user had asked
    for it: rotated away in torch's import, the benchmarks ended on a checkpoint "no longer there". Now the
    merge chooses (the newest, chosen again), and the benchmarks run on its step. A stand-in ``lm_eval``
    module (records its arguments) is the benchmark tool."""
    from core.lifecycle.evaluate import start_benchmarks

    _home, run = lora_run
    tools = tmp_path / "tools"
    (tools / "lm_eval").mkdir(parents=True)
    (tools / "lm_eval" / "__init__.py").write_text("")
    argv_file = tmp_path / "argv.json"
    (tools / "lm_eval" / "__main__.py").write_text(
        f"import json, sys\nopen({str(argv_file)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    monkeypatch.syspath_prepend(str(tools))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tools), os.environ.get("PYTHONPATH", "")]))
    rotate_at_first_cuda_query(run, monkeypatch)
    bench = start_benchmarks(run, ["gsm8k"])
    os.waitpid(bench["pid"], 0)
    assert f"pretrained={run.path / 'merged' / 'checkpoint-45'}" in json.loads(argv_file.read_text())
    assert bench["out"].endswith("bench-45")


def test_a_vllm_serve_of_a_live_run_serves_the_folder_its_merge_wrote(lora_run, monkeypatch):
    """vLLM and LMDeploy serve the run's merged folder, merged when not there: the merge of the newest
    checkpoint took the newest as it was then (the run saved 45, and rotated 15 and 30 away, in torch's
    import), wrote merged/checkpoint-45, and the backend was handed merged/checkpoint-30, which did not
    exist (and the server's record said step 30). Now the folder and step served are the merge's. The merge
    the server is started on is the real one; the backend is not started (none is installed here)."""
    from core.lifecycle.serve import _merged_for_serving
    from core.lifecycle.source import resolve_model_source

    _home, run = lora_run
    source = resolve_model_source(run)  # what start_server chose
    rotate_at_first_cuda_query(run, monkeypatch)
    folder, step = _merged_for_serving(run, source, None, "vllm", None)
    assert step == 45 and folder == run.path / "merged" / "checkpoint-45"
    assert (folder / "model.safetensors").is_file() and json.loads(
        (folder / "tunedeck_merge.json").read_text())["step"] == 45


def test_merge_cli_of_a_live_run_merges_the_newest_when_the_one_it_chose_is_rotated_away(lora_run, monkeypatch,
                                                                                        capsys):
    """``tunedeck merge RUN`` (no --checkpoint) chose the newest checkpoint itself and passed its step on as if
    the user had asked for it: a rotation between that choice and the merge's pin failed the merge on
    "checkpoint 30 … rotation", a step never asked for. Now only what the user asked is passed: the merge
    chooses again (the newest, 45) and says the step and folder it merges. The live run's save and rotation
    come at that point through a hook on the merge's quantized-base check (between its choice and its pin)."""
    from core import cli
    from core.lifecycle import merge

    _home, run = lora_run
    real = merge.refuse_quantized_base
    removed: list[list[str]] = []

    def then_the_run_saves_and_rotates(source):
        real(source)
        if not removed:
            removed.append(save_and_rotate(run))

    monkeypatch.setattr(merge, "refuse_quantized_base", then_the_run_saves_and_rotates)
    assert cli.main(["merge", run.id, "--json"]) == 0
    captured = capsys.readouterr()
    assert removed == [["checkpoint-15", "checkpoint-30"]]  # the one first chosen went before the pin
    folder = run.path / "merged" / "checkpoint-45"
    assert json.loads(captured.out)["step"] == 45 and (folder / "model.safetensors").is_file(), captured
    assert f"merging {run.id} checkpoint 45 into {folder}" in captured.err, captured.err
