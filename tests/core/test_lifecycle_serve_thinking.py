"""A run trained with ``thinking`` set (the chat template's enable_thinking) served by vLLM or LMDeploy: those
servers render each prompt with the merged folder's template, so without being told they answered in the
template's default mode (Qwen3: thinking), not the run's. vLLM 0.14+ takes the run's value as its default
(--default-chat-template-kwargs); an older vLLM, and LMDeploy (no server-wide default), are refused with the
run key and the way out. The backends are not installed here: a stand-in package with its metadata (the
version is all tunedeck reads of it) is put on the path, and the real functions build or refuse. CPU only."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.lifecycle.finished_run import TINY

OFF = {"enable_thinking": False}


def _install(tmp_path, monkeypatch, name: str, version: str):
    """A package ``name`` of ``version`` importable (find_spec) and with its metadata, as pip leaves one."""
    site = tmp_path / f"site-{name}-{version}"
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(site))


def _merged_folder(folder, template_kwargs):
    """A whole model folder (the bundled tokenizer, one real safetensors file) with a merge record as a
    tunedeck merge of a run with ``thinking`` leaves it."""
    import shutil

    import torch
    from safetensors.torch import save_file

    shutil.copytree(TINY, folder)
    save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    (folder / "tunedeck_merge.json").write_text(json.dumps({"run_id": "r1", "step": 30,
                                                            "template_kwargs": template_kwargs}))
    return folder


def _command(backend: str, folder, template_kwargs):
    from core.lifecycle.serve import _backend_command

    return _backend_command(backend, None, "m", folder, "127.0.0.1", 8000, None, folder,
                            template_kwargs=template_kwargs)


@pytest.mark.parametrize("version", ["0.14.0", "0.14.0rc1", "0.19.2"])
def test_vllm_from_0_14_is_given_the_runs_thinking_as_its_default(tmp_path, monkeypatch, version):
    _install(tmp_path, monkeypatch, "vllm", version)
    cmd = _command("vllm", tmp_path, OFF)
    at = cmd.index("--default-chat-template-kwargs")
    assert json.loads(cmd[at + 1]) == {"enable_thinking": False}
    assert "--default-chat-template-kwargs" not in _command("vllm", tmp_path, {})  # unset: the template decides


@pytest.mark.parametrize("version", ["0.13.0", "0.13.1.dev5+gabc", "0.8.5"])
def test_older_vllm_is_refused_naming_the_run_key_and_the_way_out(tmp_path, monkeypatch, version):
    from core.lifecycle.source import LifecycleError

    _install(tmp_path, monkeypatch, "vllm", version)
    with pytest.raises(LifecycleError) as caught:
        _command("vllm", tmp_path, OFF)
    said = str(caught.value)
    assert f"vLLM {version} cannot serve" in said and "thinking is false" in said
    assert "0.14" in said and "--backend transformers" in said
    assert "--model" in _command("vllm", tmp_path, {})  # a run without thinking is served as before


def test_lmdeploy_is_refused_when_thinking_is_set_and_serves_as_before_without(tmp_path):
    from core.lifecycle.source import LifecycleError

    for value in (False, True):
        with pytest.raises(LifecycleError) as caught:
            _command("lmdeploy", tmp_path, {"enable_thinking": value})
        said = str(caught.value)
        assert f"thinking is {str(value).lower()}" in said and "--backend transformers" in said
    cmd = _command("lmdeploy", tmp_path, {})
    assert cmd[1:5] == ["-m", "lmdeploy", "serve", "api_server"]


def test_serve_refuses_an_old_vllm_for_a_merge_with_thinking_before_starting_anything(tmp_path, monkeypatch):
    """Through start_server: the merge record's thinking is read, and the refusal comes before any state
    file or process (not a server that comes up in the other mode)."""
    from core.lifecycle.serve import start_server
    from core.lifecycle.source import LifecycleError

    home = tmp_path / "home"
    monkeypatch.setenv("TUNEDECK_HOME", str(home))
    _install(tmp_path, monkeypatch, "vllm", "0.13.0")
    folder = _merged_folder(tmp_path / "merged", OFF)
    with pytest.raises(LifecycleError) as caught:
        start_server(None, backend="vllm", model_dir=folder, timeout=30)
    assert "thinking is false" in str(caught.value) and "vLLM 0.13.0" in str(caught.value)
    assert not (home / "serve" / "merged" / "state.json").exists()
