"""`train`, `train --check` and `resume` ask the estimator whether the run fits its GPUs before it starts.

They checked the config, model, data, host memory and disk, but not GPU memory: a hand-written or imported
YAML, or a plan launched with micro_batch_size=64 on top, loaded the model and only then died of CUDA OOM.

Hardware: one fake H100 80GB (NVML's 81559 MiB; compute capability 9.0) through the fake NVML
(``core.hardware.fake_nvml`` standing in for pynvml), idle or with a fake process holding 70 GiB. The model
is a folder holding Qwen2.5-7B's config.json alone (the bundled one): the estimator reads it, nothing loads
weights or torch models.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from core.hardware.fake_nvml import fake_nvml_from_recording
from core.hardware.snapshot import GpuProcess, load_snapshot

ROOT = Path(__file__).parents[2]
GIB, MIB = 1024**3, 1024**2


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return tmp_path / "home"


def _one_h100(monkeypatch, busy_gib: float = 0.0) -> None:
    """This box: one H100 80GB, ``busy_gib`` of it held by another process (and the driver's idle 0.5 GiB)."""
    box = load_snapshot(ROOT / "tests" / "fixtures" / "gpus" / "h200x1.json")
    held = int(busy_gib * GIB)
    processes = (GpuProcess(4242, held, visible=False, hidden_reason="not_in_namespace"),) if held else ()
    gpu = replace(box.gpus[0], name="NVIDIA H100 80GB HBM3", memory_total_bytes=81559 * MIB,
                  memory_used_bytes=held + 512 * MIB, processes=processes)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml_from_recording(replace(box, gpus=(gpu,)),
                                                                        compute_capability=(9, 0)))


def _run_file(tmp_path: Path, model_config: dict | None = None, **keys) -> Path:
    """A run YAML of a 7B LoRA (4096 tokens, micro_batch_size 32 unless ``keys`` say otherwise)."""
    from core.data.samples import sample_dataset_path

    model = tmp_path / "model"
    model.mkdir(parents=True, exist_ok=True)
    config = model_config or json.loads((ROOT / "core" / "estimate" / "known_configs" / "Qwen2.5-7B.json").read_text())
    (model / "config.json").write_text(json.dumps(config), encoding="utf-8")
    values = {"model": str(model), "dataset": str(sample_dataset_path()), "method": "lora", "max_seq_len": 4096,
              "micro_batch_size": 32, "gradient_accumulation": 2, **keys}
    path = tmp_path / "run.yaml"
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()), encoding="utf-8")
    return path


def _check(path: Path, *args: str, capsys) -> tuple[int, dict, str]:
    from core.cli import main

    code = main(["train", "--check", "--json", str(path), *args])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_a_run_past_the_card_is_refused_with_the_figures_and_the_batch_that_fits(home, tmp_path, monkeypatch,
                                                                                 capsys):
    """micro_batch_size=64 of a 7B LoRA needs more than the 80 GiB card by the estimate: `train` and
    `train --check` exit 2 before anything is created, saying the estimate, the card's memory, and the
    micro-batch that fits (one keeping the sequences per step with a gradient_accumulation); that batch
    then passes, and --allow-over-memory starts the refused one with a warning."""
    from core.cli import main
    from core.paths import runs_dir

    _one_h100(monkeypatch)
    path = _run_file(tmp_path, micro_batch_size=64)
    code, out, err = _check(path, capsys=capsys)
    assert code == 2 and not out["ok"], err
    memory = out["gpu_memory"]
    assert memory["verdict"] == "does_not_fit" and memory["peak_gib"] > 79.6, memory
    assert memory["gpus"] == [{"gpu": 0, "name": "NVIDIA H100 80GB HBM3", "total_gib": 79.6, "in_use_gib": 0.0,
                               "available_gib": 79.6}]
    fitting = memory["fitting_micro_batch_size"]
    assert fitting is not None and fitting < 64
    said = " ".join(out["problems"])
    assert f"needs about {memory['peak_gib']:.1f} GiB per GPU" in said and "has 79.6 GiB free" in said, said
    assert f"micro_batch_size={fitting} fits" in said and "--allow-over-memory" in said, said
    assert "micro_batch_size=32 gradient_accumulation=4" in said and "128 sequences" in said, said  # 64 x 2 kept
    assert f"tunedeck plan --model {tmp_path / 'model'}" in said, said

    assert main(["train", str(path)]) == 2  # train refuses the same, nothing created
    assert "has 79.6 GiB free" in capsys.readouterr().err
    assert not runs_dir().exists() or not any(runs_dir().iterdir())

    code, out, err = _check(path, f"micro_batch_size={fitting}", capsys=capsys)
    assert code == 0 and out["gpu_memory"]["verdict"] == "fits", err
    assert out["gpu_memory"]["peak_gib"] + out["gpu_memory"]["margin_gib"] <= 79.6

    code, out, err = _check(path, "--allow-over-memory", capsys=capsys)
    assert code == 0 and out["ok"] and out["gpu_memory"]["verdict"] == "does_not_fit"
    assert "starting anyway (--allow-over-memory)" in err, err


def test_a_fitting_run_passes_silently_and_a_tight_one_warns(home, tmp_path, monkeypatch, capsys):
    """micro_batch_size=32 fits the card with the estimator's margin: nothing said about memory. A run within
    the margin (under the card) is a warning, not a refusal."""
    from core.runs.gpu_memory import check_gpu_memory, read_room
    from core.runs.lifecycle import load_run_file

    _one_h100(monkeypatch)
    code, out, err = _check(_run_file(tmp_path), capsys=capsys)
    assert code == 0 and out["gpu_memory"]["verdict"] == "fits" and "GPU memory" not in err, err
    config = load_run_file(_run_file(tmp_path), warn=lambda text: None).config
    room = read_room([0])
    found = None
    for batch in range(33, 64):  # the first micro-batch past the margin is under the card: tight
        config.micro_batch_size = batch
        found = check_gpu_memory(config, room, 1)
        if found.verdict != "fits":
            break
    assert found is not None and found.verdict == "tight", found
    code, out, err = _check(_run_file(tmp_path, micro_batch_size=batch), capsys=capsys)
    assert code == 0 and out["gpu_memory"]["verdict"] == "tight"
    assert "warning: this run needs about" in err and "may run out of GPU memory" in err, err


def test_a_card_other_processes_hold_refuses_what_fits_an_empty_one(home, tmp_path, monkeypatch, capsys):
    """70 GiB of the card held by a process NVML lists (another container's): micro_batch_size=32, which fits
    the empty card, is refused, the memory in use named."""
    _one_h100(monkeypatch, busy_gib=70)
    code, out, err = _check(_run_file(tmp_path), capsys=capsys)
    assert code == 2 and out["gpu_memory"]["verdict"] == "does_not_fit", err
    assert out["gpu_memory"]["gpus"][0]["in_use_gib"] == 70.0
    said = " ".join(out["problems"])
    assert "has 9.6 GiB free (79.6 GiB, 70.0 GiB of it in use by other processes)" in said, said


def test_a_model_the_estimator_cannot_describe_passes_with_one_line(home, tmp_path, monkeypatch, capsys):
    """A model_type the estimator has no shape for: not refused, one line says memory was not checked and why."""
    _one_h100(monkeypatch)
    path = _run_file(tmp_path, model_config={"model_type": "rwkv5", "architectures": ["Rwkv5ForCausalLM"],
                                             "vocab_size": 65536, "hidden_size": 2048, "num_hidden_layers": 24},
                     lora_targets="[key]")
    code, out, err = _check(path, capsys=capsys)
    assert code == 0 and out["gpu_memory"]["verdict"] == "unchecked", err
    lines = [line for line in err.splitlines() if "GPU memory not checked" in line]
    assert len(lines) == 1 and "the estimator cannot describe this model" in lines[0], err


def test_a_cpu_run_is_not_asked(home, tmp_path, monkeypatch, capsys):
    """No GPU (NVML finds none): nothing about GPU memory, the JSON says null."""
    box = load_snapshot(ROOT / "tests" / "fixtures" / "gpus" / "none.json")
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml_from_recording(box))
    code, out, err = _check(_run_file(tmp_path, micro_batch_size=64, precision="fp32"), capsys=capsys)
    assert code == 0 and out["gpu_memory"] is None and "GPU memory" not in err, err


def test_resume_with_an_override_past_the_card_is_refused_unless_allowed(home, tmp_path, monkeypatch, capsys):
    """`resume RUN micro_batch_size=64` of a run that fitted at 32: refused as train refuses it, the run left
    stopped; --allow-over-memory resumes it (the supervisor is not started: ``_start`` records it)."""
    from core.cli import main
    from core.runs import lifecycle
    from core.runs.run_dir import STOPPED
    from tests.core.test_runs_gpus_in_use import _stopped_with_checkpoint

    _one_h100(monkeypatch)
    _run_file(tmp_path)
    stopped = _stopped_with_checkpoint([0], model=str(tmp_path / "model"), max_seq_len=4096, micro_batch_size=32,
                                       gradient_accumulation=2, precision="bf16", gpus=1)
    started: list[str] = []
    monkeypatch.setattr(lifecycle, "_start", lambda run, resume_from=None: started.append(run.id))
    assert main(["resume", stopped.id, "micro_batch_size=64"]) == 2
    said = capsys.readouterr().err
    assert "has 79.6 GiB free" in said and "--allow-over-memory" in said, said
    # the way out keeps the checkpoint's 32 x 2 = 64 sequences a step: resume refuses another number, so a
    # bare largest micro-batch (54 here, 64 x 2 = 128 a step if taken with the override's accumulation) is not said
    assert "micro_batch_size=32 gradient_accumulation=2 fits" in said and "keeps the 64 sequences" in said, said
    assert "micro_batch_size=54" not in said and "gradient_accumulation=4" not in said, said
    assert stopped.status().status == STOPPED and not started
    assert main(["resume", stopped.id, "micro_batch_size=64", "--allow-over-memory"]) == 0, capsys.readouterr().err
    assert started == [stopped.id]


def test_checkpoint_layers_auto_is_chosen_for_the_memory_free_now(home, tmp_path, monkeypatch):
    """``checkpoint_layers: auto`` took the fewest checkpointed layers that fit the empty card even when another
    process held part of it: the run then fitted the estimate of a card it did not have. It is chosen for the
    free memory now: more layers on the card 30 GiB busy than on the empty one (the run's config.yaml)."""
    import yaml

    from core.runs.lifecycle import load_run_file, prepare_run

    chosen = []
    for busy in (0, 30):
        _one_h100(monkeypatch, busy_gib=busy)
        path = _run_file(tmp_path / str(busy), micro_batch_size=16, checkpoint_layers="auto")
        config = load_run_file(path, warn=lambda text: None).config
        run = prepare_run(config, ["tunedeck", "train", str(path)], warn=lambda text: None,
                          allow_shared_gpus=True)  # the first, queued, holds the GPU as far as a launch can tell
        chosen.append(yaml.safe_load(run.config_path.read_text())["checkpoint_layers"])
    assert isinstance(chosen[0], int) and chosen[0] < (28 if chosen[1] == "all" else chosen[1]), chosen


def test_resume_of_a_run_that_trained_with_the_same_memory_keys_warns_not_refuses(home, tmp_path, monkeypatch,
                                                                                  capsys):
    """A run that trained 3 steps at micro_batch_size=64 (started before the check, or with
    --allow-over-memory) measured that it fits: a plain `resume RUN` (cron's) was refused with exit 2 on
    every try. Now it resumes with the estimate as a warning; an override that moves memory is still refused.
    A `train --allow-over-memory` records it in run.json for its resumes. Hardware: one fake idle H100."""
    from core.cli import main
    from core.runs import lifecycle
    from core.runs.run_dir import STOPPED
    from tests.core.test_runs_gpus_in_use import _stopped_with_checkpoint

    _one_h100(monkeypatch)
    path = _run_file(tmp_path, micro_batch_size=64)
    stopped = _stopped_with_checkpoint([0], model=str(tmp_path / "model"), max_seq_len=4096, micro_batch_size=64,
                                       gradient_accumulation=2, method="lora", precision="bf16", gpus=1)
    started: list[str] = []
    monkeypatch.setattr(lifecycle, "_start", lambda run, resume_from=None: started.append(run.id))
    assert main(["resume", stopped.id, "max_seq_len=8192"]) == 2  # more memory than it trained with: refused
    assert "has 79.6 GiB free" in capsys.readouterr().err and not started
    assert stopped.status().status == STOPPED
    assert main(["resume", stopped.id]) == 0
    said = capsys.readouterr().err
    assert "resuming anyway: this run already trained on these GPUs" in said and "has 79.6 GiB free" in said, said
    assert started == [stopped.id]

    assert main(["train", str(path), "--allow-over-memory", "--allow-shared-gpus"]) == 0, capsys.readouterr().err
    assert len(started) == 2
    from core.paths import runs_dir
    from core.runs.run_dir import RunDirectory

    run = RunDirectory(runs_dir() / started[1])
    assert run.read_launch_record()[0].get("allow_over_memory") is True


def test_the_refusal_names_the_gpu_as_nvidia_smi_does_under_cuda_visible_devices(home, tmp_path, monkeypatch,
                                                                                 capsys):
    """With CUDA_VISIBLE_DEVICES=4,5 the run's GPU 1 is the box's GPU 5: the refusal said "GPU 1 has 9.6 GiB
    free" while nvidia-smi's GPU 1 was idle. It names GPU 5 now. Hardware: 8 fake H100 80GB (the H200 x8
    recording renamed), GPU 5 with 70 GiB held by another process, the rest idle."""
    box = load_snapshot(ROOT / "tests" / "fixtures" / "gpus" / "h200x8.json")
    held = 70 * GIB
    gpus = tuple(replace(gpu, name="NVIDIA H100 80GB HBM3", memory_total_bytes=81559 * MIB,
                         memory_used_bytes=(held if gpu.index == 5 else 0) + 512 * MIB,
                         processes=(GpuProcess(4242, held, visible=False, hidden_reason="not_in_namespace"),)
                         if gpu.index == 5 else (), mig_enabled=False) for gpu in box.gpus)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml_from_recording(replace(box, gpus=gpus),
                                                                        compute_capability=(9, 0)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    code, out, err = _check(_run_file(tmp_path, gpus="all"), capsys=capsys)
    assert code == 2 and out["gpu_memory"]["verdict"] == "does_not_fit", err
    said = " ".join(out["problems"])
    assert "GPU 5 (NVIDIA H100 80GB HBM3) has 9.6 GiB free" in said, said
