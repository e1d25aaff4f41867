"""What ``train`` and ``train --check`` check beyond the file itself (``for_training``): a model that can be
had, dataset entries that name something, an empty ``output`` folder, each at its key's file:line.

No GPU and no network assumed: the hub probe is replaced where a test needs an answer from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from core.config import ConfigError, load_run_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    (tmp_path / "data.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n")
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_run_config(path, for_training=True)
    return [str(issue) for issue in caught.value.errors]


def test_a_misspelt_model_is_refused_with_the_closest_name(tmp_path):
    path = write(tmp_path, "dataset: data.jsonl\nmodel: tinny\n")
    found = problems(path)
    assert len(found) == 1
    assert found[0].startswith(f"{path}:2: model: model 'tinny' is neither a local folder")
    assert "did you mean 'tiny'?" in found[0]
    # The same file without for_training (the wizard, plan, an edited config) is not checked against the box.
    assert load_run_config(path).model == "tinny"


def test_a_hub_id_not_downloaded_is_refused_when_the_hub_cannot_be_reached(tmp_path, monkeypatch):
    monkeypatch.setattr("core.data.loading.network_reachable", lambda hub, timeout=3.0: False)
    path = write(tmp_path, "model: Qwen/Qwen2.5-0.5B-Instruct\ndataset: data.jsonl\n")
    found = problems(path)
    assert len(found) == 1 and f"{path}:1: model:" in found[0]
    assert "not in the local hub cache" in found[0] and "www.modelscope.cn cannot be reached" in found[0]


def test_a_hub_id_not_downloaded_is_refused_offline_and_a_warning_when_the_hub_answers(tmp_path, monkeypatch):
    path = write(tmp_path, "model: Qwen/Qwen2.5-0.5B-Instruct\ndataset: data.jsonl\n")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE is set" in problems(path)[0]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("core.data.loading.network_reachable", lambda hub, timeout=3.0: True)
    config = load_run_config(path, for_training=True)
    assert [w.key for w in config.warnings] == ["model"]
    assert "downloads it from www.modelscope.cn" in config.warnings[0].message


def test_a_hub_id_in_the_local_cache_passes_without_a_probe(tmp_path, monkeypatch):
    def no_probe(hub, timeout=3.0):
        raise AssertionError("a cached model needs no network")

    monkeypatch.setattr("core.data.loading.network_reachable", no_probe)
    snapshot = tmp_path / "hf" / "hub" / "models--Org--Model" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"x")  # a whole copy: config and weights (a config alone is fetched)
    config = load_run_config(write(tmp_path, "model: Org/Model\ndataset: data.jsonl\n"), for_training=True)
    assert config.warnings == []


def test_a_local_folder_without_config_json_is_refused_and_tiny_passes(tmp_path):
    (tmp_path / "empty-model").mkdir()
    found = problems(write(tmp_path, f"model: {tmp_path / 'empty-model'}\ndataset: data.jsonl\n"))
    assert len(found) == 1 and "has no config.json" in found[0]
    assert load_run_config(write(tmp_path, "model: tiny\ndataset: data.jsonl\n"), for_training=True).model == "tiny"


def test_a_missing_dataset_file_names_the_config_line(tmp_path):
    path = write(tmp_path, "model: tiny\ndataset: missing.jsonl\n")
    found = problems(path)
    assert len(found) == 1
    assert found[0].startswith(f"{path}:2: dataset: missing.jsonl: file not found")


def test_a_dataset_next_to_the_yaml_is_found_from_another_directory(tmp_path, monkeypatch):
    path = write(tmp_path, "model: tiny\ndataset: data.jsonl\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_run_config(path, for_training=True).dataset == "data.jsonl"


def test_an_output_folder_that_holds_files_is_refused_before_training(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "adapter_model.safetensors").write_bytes(b"")
    path = write(tmp_path, "model: tiny\ndataset: data.jsonl\noutput: out\n")
    found = problems(path)
    assert found == [f"{path}:3: output: {tmp_path / 'out'} already holds 1 entries (adapter_model.safetensors…); "
                     "tunedeck never overwrites a model there: give a new or empty folder, or empty this one"]
    (tmp_path / "out" / "adapter_model.safetensors").unlink()
    assert load_run_config(path, for_training=True).output == "out"  # an empty one is fine


def test_a_bound_above_a_value_reads_more_than(tmp_path):
    found = problems(write(tmp_path, "model: tiny\ndataset: data.jsonl\nepochs: -1\n"))
    assert found == [f"{tmp_path / 'run.yaml'}:3: epochs: got -1; must be more than 0"]


def _tunedeck(tmp_path: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    # PYTHONPATH: this checkout's core, whatever the current directory (not another install's)
    env = {**os.environ, "TUNEDECK_HOME": str(tmp_path / "home"), "HF_HOME": str(tmp_path / "hf"),
           "MODELSCOPE_CACHE": str(tmp_path / "ms"), "TUNEDECK_FAKE_GPUS": str(ROOT / "tests" / "fixtures" / "gpus" / "none.json"),
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "core", *args], cwd=cwd or tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)


def test_train_check_makes_the_checks_train_makes(tmp_path):
    """``train --check`` refuses what ``train`` would: a misspelt model, a full output folder."""
    write(tmp_path, "model: tinny\ndataset: data.jsonl\n", "tinny.yaml")
    proc = _tunedeck(tmp_path, "train", "tinny.yaml", "--check", "--json")
    assert proc.returncode == 2, proc.stderr
    assert json.loads(proc.stdout)["ok"] is False and "did you mean 'tiny'?" in proc.stderr
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    write(tmp_path, "model: tiny\ndataset: data.jsonl\noutput: out\n", "full.yaml")
    for extra in (["--check"], []):
        proc = _tunedeck(tmp_path, "train", "full.yaml", *extra)
        assert proc.returncode == 2 and "full.yaml:3: output:" in proc.stderr and "already holds 1" in proc.stderr
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())


def test_train_check_json_lists_the_precision_fallback_it_warns_about(tmp_path):
    """No GPU (the fake box has none): bf16 falls back to fp32; the warning printed on stderr is in the
    JSON's warnings as well, not an empty list beside it."""
    write(tmp_path, "model: tiny\ndataset: data.jsonl\n")
    proc = _tunedeck(tmp_path, "train", "run.yaml", "--check", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["config"]["precision"] == "fp32"
    assert [w for w in data["warnings"] if "precision bf16 needs a GPU" in w] and "needs a GPU" in proc.stderr


def _model_folder(folder: Path, *weights: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    for name in weights:
        (folder / name).write_bytes(b"x" * 16)
    return folder


def test_a_model_folder_without_complete_weights_is_refused_at_the_model_line(tmp_path):
    """A stopped download (config, tokenizer and a ``.part``) would train from random weights: refused at
    the model key's file:line with the way on; a folder of the hub cache with no weights at all too."""
    partial = _model_folder(tmp_path / "partial", "model.safetensors.part")
    path = write(tmp_path, f"dataset: data.jsonl\nmodel: {partial}\n")
    [found] = problems(path)
    assert found.startswith(f"{path}:2: model: model folder {partial} holds a download that is not finished")
    assert "random weights" in found and "tunedeck models download OWNER/NAME resumes it" in found
    cached = _model_folder(tmp_path / "ms" / "models" / "Org" / "Model")
    [found] = problems(write(tmp_path, f"dataset: data.jsonl\nmodel: {cached}\n"))
    assert "has a config.json but no weights" in found and "tunedeck models download Org/Model resumes it" in found
    whole = _model_folder(tmp_path / "whole", "model.safetensors")
    assert load_run_config(write(tmp_path, f"model: {whole}\ndataset: data.jsonl\n"), for_training=True).warnings == []


def test_a_config_only_folder_of_the_user_trains_from_random_weights_with_a_warning(tmp_path):
    """A bare config.json is the random-init path (the benchmarks' folders): allowed, never silent."""
    bare = _model_folder(tmp_path / "bench-7b")
    config = load_run_config(write(tmp_path, f"model: {bare}\ndataset: data.jsonl\n"), for_training=True)
    assert [w.key for w in config.warnings] == ["model"]
    assert "starts from random weights" in config.warnings[0].message


def test_train_check_refuses_a_partial_model_folder_given_as_an_override(tmp_path):
    partial = _model_folder(tmp_path / "partial", "model.safetensors.part")
    write(tmp_path, "model: tiny\ndataset: data.jsonl\n")
    proc = _tunedeck(tmp_path, "train", "run.yaml", "--check", f"model={partial}")
    assert proc.returncode == 2, proc.stderr
    assert "not finished" in proc.stderr and "all checks passed" not in proc.stderr + proc.stdout


def _model_beside_the_yaml(tmp_path, monkeypatch, files):
    """A run YAML naming ``sub/model`` (a hub id's shape) that is a folder next to the YAML, not under the
    current directory: loading checks it as a hub id (the probe answers yes); the run gets the folder."""
    monkeypatch.setattr("core.data.loading.network_reachable", lambda hub, timeout=3.0: True)
    folder = tmp_path / "project" / "sub" / "model"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    path = write(tmp_path / "project", "model: sub/model\ndataset: data.jsonl\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return path, folder


def test_a_model_folder_found_beside_the_yaml_is_checked_as_a_folder(tmp_path, monkeypatch):
    from core.runs import RunError
    from core.runs.lifecycle import load_run_file

    path, folder = _model_beside_the_yaml(tmp_path, monkeypatch, {"config.json": "{}", "model.safetensors.part": "x"})
    with pytest.raises(RunError) as caught:
        load_run_file(path, warn=lambda text: None)
    assert str(caught.value).startswith(f"model folder {folder} holds a download that is not finished (1 .part")


def test_a_model_folder_beside_the_yaml_without_config_json_is_refused(tmp_path, monkeypatch):
    from core.runs import RunError
    from core.runs.lifecycle import load_run_file

    path, folder = _model_beside_the_yaml(tmp_path, monkeypatch, {"README.md": "no config"})
    with pytest.raises(RunError) as caught:
        load_run_file(path, warn=lambda text: None)
    assert str(caught.value) == f"model directory {folder} has no config.json: check the 'model' key " \
        "(a local directory, or a hub id such as Qwen/Qwen2.5-7B-Instruct)"


def test_a_model_folder_beside_the_yaml_with_weights_passes_without_a_second_warning(tmp_path, monkeypatch):
    from core.runs.lifecycle import load_run_file

    path, folder = _model_beside_the_yaml(tmp_path, monkeypatch, {"config.json": "{}", "model.safetensors": "w"})
    said: list[str] = []
    assert load_run_file(path, warn=said.append).config.model == str(folder)
    assert [line for line in said if str(folder) in line] == []  # whole: nothing to say about the folder


def _tiny_model_beside_the_yaml(tmp_path, model: str = "./m") -> tuple[Path, Path, Path]:
    """project/run.yaml naming ``model`` and ./data.jsonl, with a copy of the bundled tiny model in
    project/m; the current directory is another folder: (run file, model folder, that folder)."""
    import shutil

    from core.assets import tiny_model_dir

    project = tmp_path / "project"
    project.mkdir()
    folder = project / "m"
    shutil.copytree(tiny_model_dir(), folder)
    path = write(project, f"model: {model}\ndataset: ./data.jsonl\nmax_steps: 2\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return path, folder, elsewhere


def test_a_model_folder_beside_the_yaml_started_from_elsewhere_is_taken_as_the_launch_takes_it(tmp_path,
                                                                                                 monkeypatch):
    """``model: ./m`` was refused ("is not a directory") when ./m was not under the current directory, before
    the launch's own fallback to the YAML's directory could find it: the check now looks where the launch
    looks. The folder is checked once (its one warning: a copy of tiny has no weights, said once)."""
    from core.runs.lifecycle import load_run_file

    path, folder, elsewhere = _tiny_model_beside_the_yaml(tmp_path)
    monkeypatch.chdir(elsewhere)
    said: list[str] = []
    config = load_run_file(path, warn=said.append).config
    assert config.model == str(folder.resolve()) and config.dataset == str((path.parent / "data.jsonl").resolve())
    assert len([line for line in said if str(folder) in line]) == 1, said
    # the CLI, from that other directory and with the file named relative to it
    proc = _tunedeck(tmp_path, "train", "../project/run.yaml", "--check", "--json", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["model"] == str(folder.resolve())
    assert "not a directory" not in proc.stderr


def test_a_model_path_in_neither_place_is_refused_saying_where_it_looked(tmp_path, monkeypatch):
    path, folder, elsewhere = _tiny_model_beside_the_yaml(tmp_path, model="./nope")
    monkeypatch.chdir(elsewhere)
    [found] = problems(path)
    assert found.startswith(f"{path}:1: model: './nope' looks like a local path but is not a directory")
    assert f"(looked in {elsewhere.resolve() / 'nope'}, {path.parent.resolve() / 'nope'})" in found, found
    # from the project folder itself, both places are one
    monkeypatch.chdir(path.parent)
    [found] = problems(path)
    assert f"(looked in {path.parent.resolve() / 'nope'});" in found, found


@pytest.mark.parametrize(("options", "said"), [
    (["--nnodes", "2"], "needs --master-port"),
    (["--hostfile", "missing-hostfile"], "cannot read the hostfile"),
    (["--node-rank", "5"], "--node-rank 5 does not fit --nnodes 1"),
])
def test_train_check_refuses_the_multi_node_options_train_refuses(tmp_path, options, said):
    """``--check`` said "all checks passed" for options ``train`` then refused (no --master-port, a hostfile
    that cannot be read); a rank outside 0 .. nnodes-1 was refused by neither and started a run."""
    write(tmp_path, "model: tiny\ndataset: data.jsonl\n")
    for extra in (["--check"], []):
        proc = _tunedeck(tmp_path, "train", "run.yaml", *extra, *options)
        assert proc.returncode == 2 and said in proc.stderr, (extra, proc.stderr)
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())


def test_a_config_warning_is_said_with_its_file_line_and_one_warning_prefix(tmp_path, monkeypatch):
    """A warning of the run file (here ``pure_bf16: true`` with LoRA, which it does not apply to) reads
    ``FILE:LINE: warning: KEY: ...`` once; it read ``warning: FILE:LINE: warning: KEY: ...`` (the run's prefix
    before the issue's own). No GPU assumed: the check is the file's."""
    from core.runs.lifecycle import load_run_file

    path, _folder, elsewhere = _tiny_model_beside_the_yaml(tmp_path)
    monkeypatch.chdir(elsewhere)
    path.write_text(path.read_text() + "method: lora\npure_bf16: true\n")
    said: list[str] = []
    load_run_file(path, warn=said.append)
    warned = [line for line in said if "pure_bf16" in line]
    assert len(warned) == 1, said
    assert warned[0].startswith(f"{path}:") and warned[0].count("warning: ") == 1, warned
