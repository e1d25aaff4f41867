"""Local models, file choice, names, tokens and the ``tunedeck models`` commands."""

from __future__ import annotations

import io
import json
import os
import stat

import pytest

from core.cli import main
from core.hub.file_selection import select_files
from core.hub.local import DeleteRefusedError, LocalModel, delete_local_model, list_local_models
from core.hub.records import RepoFile, in_size_class, parameters_from_name
from core.hub.tokens import hub_token, save_hub_token, token_file
from tests.hubserver import FakeHubServer, closed_port_url, standard_hub


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms"))
    monkeypatch.setenv("MODELSCOPE_HOME", str(tmp_path / "ms-home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    for name in ("MODELSCOPE_API_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _write(path, size):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_local_models_from_both_caches_and_user_folders(home):
    _write(home / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B" / "model.safetensors", 100_000)
    (home / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B" / "config.json").write_text("{}")
    _write(home / "hf" / "hub" / "models--meta--Llama-3-8B" / "snapshots" / "abc" / "config.json", 10)
    _write(home / "mine" / "my-model" / "config.json", 10)
    models = {m.model_id: m for m in list_local_models([str(home / "mine")])}
    assert set(models) == {"Qwen/Qwen2.5-0.5B", "meta/Llama-3-8B", "my-model"}
    assert models["Qwen/Qwen2.5-0.5B"].source == "modelscope" and models["Qwen/Qwen2.5-0.5B"].size_bytes >= 100_000
    assert models["meta/Llama-3-8B"].has_config and models["my-model"].source == "folder"


def test_delete_frees_the_space_it_shows_and_refuses_strangers(home):
    folder = home / "ms" / "models" / "Qwen" / "Tiny"
    _write(folder / "model.safetensors", 50_000)
    model = list_local_models()[0]
    assert delete_local_model(model) == model.size_bytes and not folder.exists()
    stranger = LocalModel("folder", "etc", home / "elsewhere", 0, 0.0, False)
    (home / "elsewhere").mkdir()
    with pytest.raises(DeleteRefusedError):
        delete_local_model(stranger)
    assert (home / "elsewhere").exists()


def _live_run_of(model: str):
    """A run of base model ``model`` whose supervisor (a child holding its lock) is alive; its holder."""
    import subprocess
    import sys

    import psutil

    from core.runs.launch import create_run
    from core.runs.run_dir import RUNNING
    from tests.core.test_runs_unit import _Config

    run = create_run(_Config(name="long", model=model), ["tunedeck", "train", "long.yaml"], gpus=[])
    code = ("import fcntl, os, time\n"
            f"fd = os.open({str(run.lock_path)!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    run.update_record(supervisor={"pid": holder.pid, "start_time": psutil.Process(holder.pid).create_time()})
    run.write_status(RUNNING)
    return run, holder


@pytest.mark.parametrize("named_by", ["hub id", "path"])
def test_delete_refuses_the_model_a_live_run_trains_on(home, named_by):
    """x on the Local tab deleted the base model of a run still training on it (by its hub id, from the
    cache, or by its folder's path): nothing said so, and the run's resume, merge or evaluate then had no
    base to load. While a live run of this box trains on it, the delete is refused naming the run and how
    to stop it; once the run is over (its supervisor gone: crashed), it goes."""
    import signal

    folder = home / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B"
    _write(folder / "model.safetensors", 50_000)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    model = next(m for m in list_local_models() if m.path == folder)
    other = home / "ms" / "models" / "Qwen" / "Other"
    _write(other / "model.safetensors", 10)
    (other / "config.json").write_text("{}")
    run, holder = _live_run_of("Qwen/Qwen2.5-0.5B" if named_by == "hub id" else str(folder))
    try:
        with pytest.raises(DeleteRefusedError) as refused:
            delete_local_model(model)
        assert str(refused.value) == (f"Run {run.id} (running) trains on Qwen/Qwen2.5-0.5B in {folder}: nothing was "
                                      f"deleted. Stop the run first (tunedeck stop {run.id}, or k in the Runs "
                                      "screen), then delete it.")
        assert (folder / "model.safetensors").exists()
        unused = next(m for m in list_local_models() if m.path == other)
        assert delete_local_model(unused) > 0  # another model goes as before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert delete_local_model(model) == model.size_bytes and not folder.exists()


class _Terminal(io.StringIO):
    """Standard input that is a terminal someone answers on (``answer``)."""

    def isatty(self):
        return True


def test_cli_rm_refuses_as_the_app_does_asks_first_and_deletes(home, monkeypatch, capsys):
    """The Local tab's x had no headless twin: a script could not delete a model. ``models rm ID|PATH``
    refuses as the app does (a live run training on it: named, with ``tunedeck stop RUN``; exit 2, nothing
    deleted), asks y/N on a terminal (no: exit 4, kept), needs ``--yes`` where there is no terminal (exit 2),
    and deletes with ``--yes`` (``--json``: what went and the bytes freed)."""
    import signal

    folder = home / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B"
    _write(folder / "model.safetensors", 50_000)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    run, holder = _live_run_of("Qwen/Qwen2.5-0.5B")
    try:
        assert main(["models", "rm", "Qwen/Qwen2.5-0.5B", "--yes"]) == 2
        err = capsys.readouterr().err
        assert f"Run {run.id} (running) trains on Qwen/Qwen2.5-0.5B" in err and f"tunedeck stop {run.id}" in err
        assert "nothing was deleted" in err  # asked to delete, it says it did not (the app's dialog need not)
        monkeypatch.setattr("sys.stdin", _Terminal("y\n"))
        assert main(["models", "rm", str(folder)]) == 2  # refused before the question: the y is never read
        assert "Delete " not in capsys.readouterr().err and sys_stdin_left() == "y\n"
        assert (folder / "model.safetensors").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # a pipe: no terminal to ask on
    assert main(["models", "rm", "Qwen/Qwen2.5-0.5B"]) == 2
    assert "add --yes" in capsys.readouterr().err and folder.exists()
    monkeypatch.setattr("sys.stdin", _Terminal("n\n"))
    assert main(["models", "rm", "qwen/qwen2.5-0.5b"]) == 4
    err = capsys.readouterr().err
    assert f"Delete Qwen/Qwen2.5-0.5B ({folder}, " in err and "nothing was deleted" in err and folder.exists()
    monkeypatch.setattr("sys.stdin", _Terminal("y\n"))
    assert main(["models", "rm", "Qwen/Qwen2.5-0.5B", "--hub", "hf"]) == 2  # not that hub's
    assert "no model Qwen/Qwen2.5-0.5B on disk" in capsys.readouterr().err and folder.exists()
    assert main(["models", "rm", "tiny", "--yes"]) == 2
    assert "bundled" in capsys.readouterr().err
    assert main(["models", "rm", str(folder / ".."), "--yes"]) == 2  # a folder above a model is none
    assert "not a model folder" in capsys.readouterr().err and folder.exists()
    assert main(["models", "rm", str(folder), "--yes", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["deleted"] is True and out["model"]["id"] == "Qwen/Qwen2.5-0.5B" and out["freed_bytes"] >= 50_000
    assert not folder.exists()


def test_cli_rm_of_a_path_inside_a_model_refuses_and_names_the_model_folder(home, capsys):
    """`models rm ~/models/my-model/checkpoint-500 --yes` (or .../model.safetensors) matched the model that
    holds the path and deleted the whole ~/models/my-model. Only a model's own folder (or a hub cache's
    snapshots/<rev> in it) names it; any other path inside one is refused (exit 2), naming the folder to pass."""
    from core.settings import load_settings, save_settings

    mine = home / "mine"
    settings = load_settings()
    settings.extra["hub_model_dirs"] = [str(mine)]
    save_settings(settings)
    model = mine / "my-model"
    _write(model / "config.json", 10)
    _write(model / "model.safetensors", 1000)
    _write(model / "checkpoint-500" / "adapter_model.safetensors", 100)
    snapshot = home / "hf" / "hub" / "models--acme--Snap-1B" / "snapshots" / "abc"
    _write(snapshot / "model.safetensors", 1000)
    (snapshot / "config.json").write_text("{}")
    listed = {m.model_id: m for m in list_local_models([str(mine)])}
    assert "my-model" in listed and "acme/Snap-1B" in listed
    for inner in (model / "checkpoint-500", model / "model.safetensors", snapshot / "model.safetensors"):
        assert main(["models", "rm", str(inner), "--yes"]) == 2
        err = capsys.readouterr().err
        assert "Nothing was deleted" in err and "tunedeck models rm " in err
        assert inner.exists()
    assert main(["models", "rm", str(model / "checkpoint-500"), "--yes"]) == 2
    assert f"tunedeck models rm {model}" in capsys.readouterr().err
    assert main(["models", "rm", str(snapshot), "--yes"]) == 0  # a snapshot folder names its model
    assert not snapshot.parent.parent.exists()


def sys_stdin_left():
    import sys

    return sys.stdin.read()


def test_file_selection_prefers_safetensors_and_honours_include():
    files = [RepoFile(p, 1) for p in ("config.json", "model.safetensors", "pytorch_model.bin", "model.gguf",
                                      "original/consolidated.pth", "tokenizer.json")]
    chosen, skipped = select_files(files)
    assert {f.path for f in chosen} == {"config.json", "model.safetensors", "tokenizer.json"}
    assert len(skipped) == 3
    no_st = [f for f in files if not f.path.endswith(".safetensors")]
    assert "pytorch_model.bin" in {f.path for f in select_files(no_st)[0]}
    assert "model.gguf" not in {f.path for f in select_files(no_st)[0]}
    assert [f.path for f in select_files(files, ["*.gguf"])[0]] == ["model.gguf"]


def test_parameters_from_names():
    assert parameters_from_name("Qwen/Qwen2.5-7B-Instruct") == 7_000_000_000
    assert parameters_from_name("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B") == 1_500_000_000
    assert parameters_from_name("mistralai/Mixtral-8x7B-v0.1") == 56_000_000_000
    assert parameters_from_name("openai-community/gpt2") is None
    assert in_size_class(7e9, "medium") and not in_size_class(None, "small") and in_size_class(None, "any")


def test_token_file_is_private_and_ignored_when_readable_by_others(home, monkeypatch):
    path = save_hub_token("hf", "hf_secret")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and hub_token("hf") == "hf_secret"
    monkeypatch.setenv("HF_TOKEN", "from-env")
    assert hub_token("hf") == "from-env"
    monkeypatch.delenv("HF_TOKEN")
    os.chmod(token_file(), 0o644)
    assert hub_token("hf") is None


def test_cli_search_info_download_list_json(home, monkeypatch, capsys):
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        assert main(["models", "search", "qwen", "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
        assert found["total"] == 3 and found["models"][0]["id"] == "Qwen/Qwen2.5-7B-Instruct"
        assert main(["models", "info", "Qwen/Qwen2.5-7B-Instruct", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["facts"]["layers"] == 28 and 7.0e9 < info["facts"]["params"] < 8.0e9
        assert info["model"]["params"] == info["facts"]["params"]  # not the name's "7B"
        assert [row["method"] for row in info["fit"]] == ["full", "lora", "qlora"]
        assert main(["models", "download", "Qwen/Qwen2.5-7B-Instruct", "--json"]) == 0
        done = json.loads(capsys.readouterr().out)
        assert done["status"] == "done" and done["files_total"] == 4  # the .gguf was skipped
        assert main(["models", "list", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [m["id"] for m in listed["models"]] == ["Qwen/Qwen2.5-7B-Instruct"]
        assert main(["models", "info", "acme/private-model"]) == 3
        assert "401" in capsys.readouterr().err


def test_cli_search_under_a_size_class_counts_out_of_the_pages_read(home, monkeypatch, capsys):
    """`models search --size small` said "1 of 3 models": the hub's 3 are of every size. The count is out of
    the pages whose sizes were read."""
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        assert main(["models", "search", "qwen", "--size", "small"]) == 0
    err = capsys.readouterr().err
    assert "1 small among models 1-3 of the 3 on modelscope" in err and "1 of 3" not in err


def test_cli_cancel_with_no_download_running_says_so_and_succeeds(home, capsys):
    """`models download ID --cancel` with nothing running exited 1, as if it had failed: no download runs
    after it, as asked. It says none was running and exits 0 (`--json`: cancelled false); no hub is asked."""
    assert main(["models", "download", "Qwen/Qwen2.5-0.5B", "--cancel"]) == 0
    assert "No download of Qwen/Qwen2.5-0.5B is running." in capsys.readouterr().err
    assert main(["models", "download", "Qwen/Qwen2.5-0.5B", "--cancel", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cancelled"] is False


def test_cli_offline_message(home, monkeypatch, capsys):
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())
    assert main(["models", "search", "qwen"]) == 3
    err = capsys.readouterr().err
    assert "not reachable" in err and "MODELSCOPE_ENDPOINT" in err



def test_cli_info_of_a_model_on_disk_works_with_the_hub_out_of_reach(home, monkeypatch, capsys):
    """The QA's `models info` of a model it had downloaded failed offline ("not reachable … tunedeck models
    list") where the app's Local tab shows its facts. The copy on disk answers, the hub's failure said first."""
    from tests.hubserver import tiny_config

    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())
    folder = home / "ms" / "models" / "Qwen" / "Qwen2___5-Tiny"
    _write(folder / "model.safetensors", 1000)
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    assert main(["models", "info", "Qwen/Qwen2.5-Tiny", "--json"]) == 0
    captured = capsys.readouterr()
    info = json.loads(captured.out)
    assert info["model"] == {"id": "Qwen/Qwen2.5-Tiny", "hub": "modelscope", "path": str(folder), "offline": True}
    assert info["facts"]["layers"] == 2 and info["facts"]["params"] == 138_304 and info["fit"]
    assert "not reachable" in captured.err and str(folder) in captured.err
    assert main(["models", "info", "Qwen/Qwen2.5-Tiny"]) == 0
    assert "parameters       138.3K" in capsys.readouterr().out
    assert main(["models", "info", "Qwen/Not-Here"]) == 3  # nothing on disk: the hub's failure is the answer
    assert "not reachable" in capsys.readouterr().err

def test_cli_info_offline_reads_the_config_on_disk_as_the_estimate_does(home, monkeypatch, capsys):
    """``models info`` offline read config.json with its own JSON and dict checks beside the estimate's
    ``_read_config``; it goes through that reader now (``read_config_json``): one config that reads there
    reads here. One that does not read (not JSON, not an object) leaves the hub's failure as the answer."""
    from core.estimate import model_source
    from tests.hubserver import tiny_config

    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())
    folder = home / "ms" / "models" / "Qwen" / "Qwen2___5-Tiny"
    _write(folder / "model.safetensors", 1000)
    read: list[str] = []
    real_read = model_source._read_config

    def read_config(path):
        read.append(str(path))
        return real_read(path)

    monkeypatch.setattr(model_source, "_read_config", read_config)
    (folder / "config.json").write_text(json.dumps(tiny_config()))
    assert main(["models", "info", "Qwen/Qwen2.5-Tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["facts"]["layers"] == 2
    assert read == [str(folder / "config.json")]
    for broken in ("[1, 2]", "{not json", "\udcff"):
        (folder / "config.json").write_text(broken, encoding="utf-8", errors="surrogateescape")
        assert main(["models", "info", "Qwen/Qwen2.5-Tiny"]) == 3
        assert "not reachable" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["info", "nosuch"], ["download", "not-an-id"], ["download", "../../etc"],
                                     ["download", "/Qwen/x"], ["info", "Qwen/.."], ["download", "a/b/c"],
                                     ["download", "../etc", "--cancel"]])
def test_cli_refuses_what_is_not_a_hub_id_before_asking_a_hub(home, monkeypatch, capsys, command):
    """A typo or a path is the user's input to fix (exit 2), not an unreachable hub (exit 3): the hub, here
    a closed port, is never asked."""
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())
    assert main(["models", *command]) == 2
    err = capsys.readouterr().err
    assert "not a hub id" in err and "owner/name" in err and "not reachable" not in err


def test_cli_info_of_a_folder_gives_its_facts_as_the_local_tab_does(home, monkeypatch, capsys):
    """`models info /some/folder` said "not a hub id" where the app's Local tab shows the folder's facts and
    fit from its config.json. It gives them, named as the Local tab names the model (a hub cache's by its id),
    says what it lacks to be trained, and asks no hub (the hub here is out of reach). Fake GPUs: none (the
    fit is on the reference GPU)."""
    from tests.hubserver import tiny_config

    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())
    mine = home / "mine" / "my-model"
    _write(mine / "model.safetensors", 1000)
    (mine / "config.json").write_text(json.dumps(tiny_config()))
    assert main(["models", "info", str(mine), "--json"]) == 0
    out, err = capsys.readouterr()
    info = json.loads(out)
    assert info["model"]["id"] == "my-model" and info["model"]["path"] == str(mine) and info["model"]["complete"]
    assert info["facts"]["layers"] == 2 and [row["method"] for row in info["fit"]] == ["full", "lora", "qlora"]
    assert "not reachable" not in err and info["notes"] == []
    snapshot = home / "hf" / "hub" / "models--meta--Tiny-Base" / "snapshots" / "abc"
    (snapshot).mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(tiny_config()))  # config only: no weights yet
    assert main(["models", "info", str(snapshot)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("meta/Tiny-Base  (on disk: ") and "layers" in out
    assert "no weights (*.safetensors, *.bin), only config.json" in err
    assert "tunedeck models download meta/Tiny-Base --hub hf resumes it" in err
    empty = home / "nothing-here"
    empty.mkdir()
    assert main(["models", "info", str(empty)]) == 2
    assert f"{empty} holds no config.json: not a model folder." in capsys.readouterr().err
    (empty / "config.json").write_text("{not json")
    assert main(["models", "info", str(empty)]) == 2
    assert f"cannot read {empty / 'config.json'}: " in capsys.readouterr().err


def test_cli_info_of_a_bundled_model_needs_no_hub(home, monkeypatch, capsys):
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())
    assert main(["models", "info", "tiny", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["model"] == {"id": "tiny", "bundled": "builtin", "path": info["model"]["path"]}
    assert info["facts"]["layers"] == 4 and info["facts"]["params"] < 2_000_000 and info["fit"]
    assert main(["models", "info", "qwen2.5-7b"]) == 0  # a bundled config, by its listed name
    out = capsys.readouterr().out
    assert out.startswith("Qwen2.5-7B  (bundled with tunedeck") and "28" in out
    assert main(["models", "download", "tiny"]) == 2
    assert "nothing to download" in capsys.readouterr().err


def test_cli_list_sets_apart_a_folder_without_config(home, capsys):
    """A folder with files but no config.json (a download stopped, a stray copy): it is not listed as a
    model, but apart, with what to do."""
    _write(home / "ms" / "models" / "tinny" / "snapshots" / "README.md", 10)
    _write(home / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B" / "config.json", 10)
    _write(home / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B" / "model.safetensors", 10)
    assert main(["models", "list"]) == 0
    out, err = capsys.readouterr()
    models_part, _, incomplete_part = (err + out).partition("Incomplete (")
    assert "Qwen/Qwen2.5-0.5B" in out and "tinny" in out
    lines = out.splitlines()
    qwen = next(i for i, line in enumerate(lines) if "Qwen/Qwen2.5-0.5B" in line)
    tinny = next(i for i, line in enumerate(lines) if "tinny" in line)
    assert "models download" in incomplete_part and "delete the folder" in incomplete_part
    assert qwen < tinny  # after the models, under the header of the incomplete ones
    assert " tinny/snapshots " not in lines[tinny]  # not named as if it were a model: its folder only
    assert lines[tinny].split()[-1] == str(home / "ms" / "models" / "tinny" / "snapshots")


def test_a_folder_holding_no_file_is_no_model_unless_a_download_of_tunedeck_failed_into_it(home, capsys):
    """A ModelScope download that failed before its first file left an empty model folder (the SDK's notes and
    lock in it at most): `models list` and the Local tab showed it as a 0 B "incomplete" model. It is no model
    and is not listed; where tunedeck's own download failed into it, it is listed as that failed download
    with the command that resumes it."""
    from core.hub.download import job_dir_for

    stray = home / "ms" / "models" / "acme" / "Gone-1B"
    (stray / "sub").mkdir(parents=True)
    (stray / ".mdl").write_bytes(b"x")  # the SDK's note of the model id
    (stray / "weights.lock").write_bytes(b"")
    _write(home / "ms" / "models" / "Qwen" / "Whole" / "config.json", 10)
    _write(home / "ms" / "models" / "Qwen" / "Whole" / "model.safetensors", 10)
    assert [m.model_id for m in list_local_models()] == ["Qwen/Whole"]
    assert main(["models", "list"]) == 0
    out, err = capsys.readouterr()
    assert "Gone" not in out + err and "Incomplete" not in err
    failed = home / "ms" / "models" / "acme" / "Failed-1B"
    failed.mkdir(parents=True)
    job = job_dir_for("modelscope", "acme/Failed-1B")
    job.mkdir(parents=True)
    (job / "job.json").write_text(json.dumps({"hub": "modelscope", "model_id": "acme/Failed-1B", "revision": "master",
                                              "target_dir": str(failed), "files": [{"path": "x.bin", "size": 9}]}))
    (job / "state.json").write_text(json.dumps({"status": "failed", "error": "401", "bytes_done": 0,
                                                "bytes_total": 9, "updated": 1.0}))
    assert sorted(m.model_id for m in list_local_models()) == ["Qwen/Whole", "acme/Failed-1B"]
    assert main(["models", "list"]) == 0
    out, err = capsys.readouterr()
    incomplete = (err + out).partition("Incomplete (")[2]
    assert "acme/Failed-1B" in incomplete and "tunedeck models download acme/Failed-1B" in incomplete
    assert "Gone" not in out + err


def test_models_list_says_the_size_in_file_bytes_as_info_and_download_do(home, capsys):
    """`models list` (and the Local tab, from the same listing) counted disk blocks: 20 bytes of files took
    8.2 kB, and a model showed one size there and another in `models info` and `download`, which say the
    hub's file bytes. Both say file bytes; the SDK's bookkeeping files (.mdl) are no file of the model."""
    from core.hub.download import human_bytes

    folder = home / "ms" / "models" / "Qwen" / "Small"
    _write(folder / "config.json", 10)
    _write(folder / "model.safetensors", 1234)
    _write(folder / ".mdl", 50)
    (hf := home / "hf" / "hub" / "models--acme--Hf" / "blobs").mkdir(parents=True)
    _write(hf / "abc", 2000)  # the snapshot's link to the blob is not counted again
    (snapshot := hf.parent / "snapshots" / "rev").mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(hf / "abc")
    sizes = {m.model_id: m.size_bytes for m in list_local_models()}
    assert sizes == {"Qwen/Small": 1244, "acme/Hf": 2000}
    assert main(["models", "list"]) == 0
    assert f" {human_bytes(1244)} " in capsys.readouterr().out


def test_bundled_models_sort_by_size_not_as_text():
    from core.hub.local import bundled_models

    names = [model.name for model in bundled_models()]
    qwen = [name for name in names if name.startswith("Qwen2.5-")]
    assert names[0] == "tiny"
    assert qwen == ["Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-3B", "Qwen2.5-7B", "Qwen2.5-14B", "Qwen2.5-32B",
                    "Qwen2.5-72B"]


def _status(done, total, eta=3.0, current="model-00001-of-00004.safetensors"):
    from pathlib import Path

    from core.hub.download import DownloadStatus

    return DownloadStatus(job_dir=Path("."), hub="modelscope", model_id="qa/Big-Slow-7B", target_dir="",
                          status="running", bytes_done=done, bytes_total=total, current_file="x" * 100 + current,
                          rate_bps=1.5e6, eta_s=eta, files_done=0, files_total=4, error=None, pid=1, updated=0.0)


class _Terminal(io.StringIO):
    """stderr on an 80-column terminal."""

    def isatty(self):
        return True


def test_download_progress_fits_an_80_column_terminal(monkeypatch):
    from core.hub.commands import ProgressPrinter

    stream = _Terminal()
    printer = ProgressPrinter(stream)
    monkeypatch.setattr(printer, "width", lambda: 80)
    printer.show(_status(1_000_000, 10_000_000))
    printer.show(_status(2_000_000, 10_000_000, eta=65.0))
    printer.end()
    rows = stream.getvalue().split("\r")[1:]
    assert len(rows) == 2
    for row in rows:
        text = row.rstrip("\n").removesuffix("\x1b[K")
        assert len(text) < 80 and row.rstrip("\n").endswith("\x1b[K")  # cut to fit, the rest cleared
    assert "ETA 0:03" in rows[0] and "ETA 1:05" in rows[1]  # core.units.format_duration, as elsewhere
    assert stream.getvalue().endswith("\n")


def test_download_progress_in_a_log_is_a_line_at_once_every_tenth_at_a_stall_and_every_half_minute():
    """A log (stderr not a terminal) had its first line at a tenth of the download or after half a minute, and a
    stall said nothing until the downloader's retry, 15 s on, with the speed of before: tailed, it looked hung.
    A line comes at once, at every tenth, when no byte came for 5 s (saying so, no stale speed), and every 30 s."""
    from core.hub.commands import ProgressPrinter

    now = [0.0]
    stream = io.StringIO()
    printer = ProgressPrinter(stream, clock=lambda: now[0])
    for done in range(1, 101, 2):  # 2 % at a time, a second apart
        now[0] += 1.0
        printer.show(_status(done * 100_000, 10_000_000))
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and "\x1b" not in stream.getvalue()
    assert [line.split("%")[0].strip() for line in lines] == [str(p) for p in [1, *range(11, 100, 10)]]
    stream.truncate(0)
    stream.seek(0)
    stalled = ProgressPrinter(stream, clock=lambda: now[0])
    for _ in range(61):  # no progress for a minute: a line at once, at 5 s (the stall), then 30 s after that
        now[0] += 1.0
        stalled.show(_status(0, 10_000_000))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert "1.5 MB/s" in lines[0]
    assert "no data for 5 s" in lines[1] and "MB/s" not in lines[1] and "ETA" not in lines[1], lines
    assert "no data for 35 s" in lines[2], lines
    stalled.show(_status(100_000, 10_000_000))  # bytes again: the speed is back, no new stall line
    assert "MB/s" in stalled.line(_status(100_000, 10_000_000))


def test_download_progress_on_a_terminal_says_a_stall_instead_of_the_speed_of_before(monkeypatch):
    from core.hub.commands import ProgressPrinter

    now = [0.0]
    stream = _Terminal()
    printer = ProgressPrinter(stream, clock=lambda: now[0])
    monkeypatch.setattr(printer, "width", lambda: 200)
    for _ in range(7):
        now[0] += 1.0
        printer.show(_status(1_000_000, 10_000_000))
    rows = stream.getvalue().split("\r")[1:]
    assert "1.5 MB/s" in rows[0] and "no data for 5 s" in rows[1] and "no data for 6 s" in rows[2], rows


def test_cli_download_says_one_skipped_file_in_the_singular(home, monkeypatch, capsys):
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        assert main(["models", "download", "Qwen/Qwen2.5-7B-Instruct"]) == 0
    err = capsys.readouterr().err
    assert "Skipping 1 file (1.0 kB) in another weight format: model.gguf" in err and "1 files" not in err
    assert "Done: Qwen/Qwen2.5-7B-Instruct" in err



def test_cli_download_says_why_include_left_files_out(home, monkeypatch, capsys):
    """The QA's `--include config.json` said "Downloading 1 files" and "Skipping 4 files in other weight
    formats: README.md, …": README.md is no weight format; --include left them out."""
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        assert main(["models", "download", "Qwen/Qwen2.5-7B-Instruct", "--include", "config.json"]) == 0
    err = capsys.readouterr().err
    assert "Downloading 1 file (302 B) of Qwen/Qwen2.5-7B-Instruct" in err, err
    assert "Skipping 4 files (5.1 kB) that --include does not match: README.md, model-00001" in err, err
    assert "weight format" not in err
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        # patterns that match no file: a wrong request (exit 2, as a wrong option), not a hub failure (3)
        assert main(["models", "download", "Qwen/Qwen2.5-7B-Instruct", "--include", "*.nothing"]) == 2
    assert "No file of Qwen/Qwen2.5-7B-Instruct matches *.nothing" in capsys.readouterr().err

@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_search_leaves_out_a_result_whose_id_info_and_download_would_refuse(home, monkeypatch, capsys, hub):
    """``models search 中文`` listed 'qa/模型-中文', which ``models info`` then refused as no hub id: a dead end."""
    from tests.hubserver import FakeRepo

    fake = standard_hub()
    fake.add(FakeRepo("qa/模型-中文", files={"config.json": b"{}"}))
    fake.add(FakeRepo("qa/Model-zh", files={"config.json": b"{}"}))
    with FakeHubServer(fake) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        assert main(["models", "search", "qa", "--task", "any", "--hub", hub, "--json"]) == 0
        ids = [m["id"] for m in json.loads(capsys.readouterr().out)["models"]]
    assert "qa/Model-zh" in ids and "qa/模型-中文" not in ids


@pytest.mark.parametrize("page", ["0", "-1"])
def test_cli_search_refuses_a_page_below_one(home, monkeypatch, capsys, page):
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())  # never asked
    try:
        code = main(["models", "search", "qwen", "--page", page])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert f"invalid page '{page}': pages count from 1" in err and "not reachable" not in err


@pytest.mark.parametrize("hub", ["modelscope", "hf"])
def test_cli_search_past_the_last_page_says_so_not_that_nothing_matches(home, monkeypatch, capsys, hub):
    """``search qwen --page 5`` with 3 matches said "No models match 'qwen'" and to drop --task, which was not
    why; on Hugging Face --json counted the pages skipped as found (total 80). The page is past the last one."""
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        name = {"modelscope": "ModelScope", "hf": "Hugging Face"}[hub]
        assert main(["models", "search", "qwen", "--page", "5", "--hub", hub]) == 0
        out, err = capsys.readouterr()
        assert out == "" and err.strip() == \
            f"Page 5 is past the last page: 3 found on {name} make 1 page of 20 (--page 1)."
        assert main(["models", "search", "qwen", "--page", "5", "--hub", hub, "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
        assert (found["total"], found["page"], found["models"], found["has_more"]) == (3, 5, [], False)
        assert main(["models", "search", "nosuchmodel", "--page", "2", "--hub", hub]) == 0  # none at all:
        assert "No models match 'nosuchmodel'" in capsys.readouterr().err  # the filters may be why
        assert main(["models", "search", "qwen", "--hub", hub]) == 0  # the first page lists the three
        assert len(capsys.readouterr().out.splitlines()) == 3


def test_cli_search_cuts_a_long_query_and_info_formats_counts_as_search_does(home, monkeypatch, capsys):
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        assert main(["models", "search", "q" * 5000]) == 0
        err = capsys.readouterr().err
        assert "No models match 'qqq" in err and "q" * 200 not in err and "…'" in err
        assert main(["models", "info", "Qwen/Qwen2.5-7B-Instruct"]) == 0
        out = capsys.readouterr().out
        assert "downloads 900.0K" in out and "900000" not in out
        assert "parameters" in out and "7.6B" in out and "7615616512" not in out


def test_cli_list_hub_shows_that_hubs_models_only(home, capsys):
    _write(home / "ms" / "models" / "Qwen" / "Ms-Model" / "config.json", 10)
    _write(home / "ms" / "models" / "Qwen" / "Ms-Model" / "model.safetensors", 10)
    _write(home / "hf" / "hub" / "models--meta--Hf-Model" / "snapshots" / "abc" / "config.json", 10)
    _write(home / "hf" / "hub" / "models--meta--Hf-Model" / "snapshots" / "abc" / "model.safetensors", 10)
    assert main(["models", "list", "--hub", "hf", "--json"]) == 0
    assert [m["id"] for m in json.loads(capsys.readouterr().out)["models"]] == ["meta/Hf-Model"]
    assert main(["models", "list"]) == 0  # no --hub: both
    out = capsys.readouterr().out
    assert "Qwen/Ms-Model" in out and "meta/Hf-Model" in out
    assert main(["models", "list", "--hub", "modelscope"]) == 0
    out = capsys.readouterr().out
    assert "Qwen/Ms-Model" in out and "meta/Hf-Model" not in out


def test_a_run_loads_a_whole_cached_model_of_either_hub_without_asking_one(home, monkeypatch):
    """A model `tunedeck models download` left in a hub cache is what a run of its id loads: `train --check`
    passes it as cached, so the trainer must not ask a hub for it (out of reach, the run died at its start;
    downloaded from Hugging Face, a run naming ModelScope, the wizard's default, fetched it all again)."""
    import modelscope

    from core.train.model_setup import resolve_model_path

    asked: list[str] = []
    monkeypatch.setattr(modelscope, "snapshot_download", lambda model_id, *a, **k: asked.append(model_id) or "")
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", closed_port_url())
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    ms = home / "ms" / "models" / "Qwen" / "Qwen2___5-0___5B"
    _write(ms / "model.safetensors", 1000)
    (ms / "config.json").write_text("{}")
    hf = home / "hf" / "hub" / "models--meta--Llama-3-8B" / "snapshots" / "abc"
    _write(hf / "model.safetensors", 1000)
    (hf / "config.json").write_text("{}")
    assert resolve_model_path("Qwen/Qwen2.5-0.5B", "modelscope") == ms
    assert resolve_model_path("meta/Llama-3-8B", "modelscope") == hf
    assert asked == []
    # A download that is not finished is no copy to train: the hub is asked for the rest.
    (home / "hf" / "hub" / "models--meta--Llama-3-8B" / "blobs").mkdir()
    (home / "hf" / "hub" / "models--meta--Llama-3-8B" / "blobs" / "f00.incomplete").write_bytes(b"x")
    (ms / "model.safetensors").rename(ms / "model.safetensors.part")
    resolve_model_path("meta/Llama-3-8B", "modelscope")
    resolve_model_path("Qwen/Qwen2.5-0.5B", "modelscope")
    assert asked == ["meta/Llama-3-8B", "Qwen/Qwen2.5-0.5B"]
    # A half-finished copy in the Hugging Face cache does not hide a whole one in ModelScope's
    whole = home / "ms" / "models" / "meta" / "Llama-3-8B"
    _write(whole / "model.safetensors", 1000)
    (whole / "config.json").write_text("{}")
    assert resolve_model_path("meta/Llama-3-8B", "modelscope") == whole
    assert asked == ["meta/Llama-3-8B", "Qwen/Qwen2.5-0.5B"]


def test_a_run_loads_the_copy_of_the_hub_it_names_first(home, monkeypatch):
    """With whole copies in both caches, a run naming ModelScope (the default) loaded Hugging Face's: that
    cache was always looked in first. The cache of the hub the run names comes first, then the other's."""
    from core.hub.local import cached_hub, cached_model_folder
    from core.train.model_setup import resolve_model_path

    ms = home / "ms" / "models" / "acme" / "Both-1B"
    hf = home / "hf" / "hub" / "models--acme--Both-1B" / "snapshots" / "abc"
    for folder in (ms, hf):
        _write(folder / "model.safetensors", 1000)
        (folder / "config.json").write_text("{}")
    assert resolve_model_path("acme/Both-1B", "modelscope") == ms
    assert resolve_model_path("acme/Both-1B", "huggingface") == hf
    assert cached_model_folder("acme/Both-1B") == ms  # the run config's default hub
    assert cached_hub("acme/Both-1B") == "modelscope"  # so a saved plan keeps the default hub, and loads ms


def test_a_plan_of_a_model_downloaded_from_hugging_face_names_that_hub(home):
    """A model downloaded with --hub hf and planned (the Local tab's p) gave a run file with the default
    hub (ModelScope): on another box, or once the copy is gone, the run fetched it from there. The saved
    plan names the hub whose cache holds the whole copy; a ModelScope copy keeps the default. (CPU plan.)"""
    import yaml

    from core.data.samples import sample_dataset_path
    from core.plan import recommend, save_run_config
    from core.plan.hardware import parse_target
    from core.plan.request import PlanRequest
    from tests.hubserver import tiny_config

    for folder in (home / "hf" / "hub" / "models--acme--Hf-1B" / "snapshots" / "abc",
                   home / "ms" / "models" / "acme" / "Ms-1B"):
        _write(folder / "model.safetensors", 1000)
        (folder / "config.json").write_text(json.dumps(tiny_config()))
    hubs = {}
    for model in ("acme/Hf-1B", "acme/Ms-1B"):
        request = PlanRequest(model, parse_target("cpu"), dataset=str(sample_dataset_path()))
        saved = save_run_config(recommend(request).best, request, home / f"{model.split('/')[1]}.yaml")
        hubs[model] = yaml.safe_load(saved.read_text()).get("hub", "modelscope")
    assert hubs == {"acme/Hf-1B": "huggingface", "acme/Ms-1B": "modelscope"}


def test_a_model_in_the_modelscope_sdks_new_layout_is_planned_from_where_it_is_listed(home, capsys):
    """`models list` (and the Local tab) listed models/<org>--<name>/snapshots/<rev> as on disk, but estimate,
    plan, the wizard (Local p) and train --check did not look there: "no config.json found for model …"."""
    from core.estimate.model_source import load_model_config
    from core.hub.local import cached_model_folder
    from tests.hubserver import tiny_config

    snapshot = home / "ms" / "models" / "acme--Thing-1B" / "snapshots" / "master"
    _write(snapshot / "model.safetensors", 1000)
    (snapshot / "config.json").write_text(json.dumps(tiny_config()))
    assert [m.model_id for m in list_local_models()] == ["acme/Thing-1B"]
    assert load_model_config("acme/Thing-1B").config["hidden_size"] == 64
    assert cached_model_folder("acme/Thing-1B") == snapshot  # what a run of it loads
    assert main(["estimate", "--model", "acme/Thing-1B", "--method", "lora", "--batch-size", "1",
                 "--seq-len", "512"]) == 0


def test_train_check_passes_a_whole_copy_beside_a_half_downloaded_one_in_the_other_cache(home):
    """``train --check`` looked only at the first cached config.json (Hugging Face's): a half-finished Hugging
    Face download beside a whole ModelScope copy was refused as "download unfinished", though the run loads
    the whole copy. The check takes the copy the run loads; with none whole, the half one is still refused."""
    from core.config.issues import ERROR
    from core.config.model_checks import model_problem

    ms = home / "ms" / "models" / "acme" / "Half-1B"
    repo = home / "hf" / "hub" / "models--acme--Half-1B"
    hf = repo / "snapshots" / "abc"
    _write(hf / "model.safetensors", 1000)
    (hf / "config.json").write_text("{}")
    _write(repo / "blobs" / "f00d.incomplete", 10)
    severity, message = model_problem("acme/Half-1B", "modelscope", probe=False)
    assert severity == ERROR and "f00d" not in message and "1 " in message  # the unfinished file is counted
    _write(ms / "model.safetensors", 1000)
    (ms / "config.json").write_text("{}")
    assert model_problem("acme/Half-1B", "modelscope", probe=False) is None
    assert model_problem("acme/Half-1B", "huggingface", probe=False) is None


def test_models_info_judges_the_fit_by_what_other_processes_leave_free(home, monkeypatch, capsys):
    """Fake GPUs: the h200x8 recording, each H200 (140.4 GiB) holding 115-117 GiB of other processes. `models info`
    read "full 119.5 / 140 GiB fits" against the whole card, as if the box were idle; the planner sizes against what
    the others leave less its margin (``HardwareTarget.usable_now_gib``), and so does the fit now, saying so."""
    from pathlib import Path

    recording = Path(__file__).parents[1] / "fixtures" / "gpus" / "h200x8.json"
    monkeypatch.setenv("TUNEDECK_FAKE_GPUS", str(recording))
    with FakeHubServer(standard_hub()) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        assert main(["models", "info", "Qwen/Qwen2.5-7B-Instruct", "--json"]) == 0
        fit = {row["method"]: row for row in json.loads(capsys.readouterr().out)["fit"]}
        full = fit["full"]
        assert full["capacity_gib"] > 140 and full["peak_gib"] > 100, full  # fits the card...
        assert full["verdict"] == "fits_card_not_free" and 20 < full["free_gib"] < 30, full  # ...not what is free
        assert fit["qlora"]["verdict"] == "fits", fit  # a small one still fits beside them
        assert main(["models", "info", "Qwen/Qwen2.5-7B-Instruct"]) == 0
        out = capsys.readouterr().out
        assert 0 < full["usable_gib"] < full["free_gib"], full  # the planner's margin off what is free
        assert f"fits the card, not the {full['usable_gib']:.1f} GiB usable of the {full['free_gib']:.1f} GiB free now" \
            in out, out
    # the h200x2 recording as taken (1.6 GiB held on each, an idle GPU's context): the whole card, as before
    from core.estimate import load_model_config
    from core.hardware.snapshot import load_snapshot
    from core.hub.facts import fit_on_box
    from core.plan import target_from_snapshot

    idle = target_from_snapshot(load_snapshot(recording.with_name("h200x2.json")))
    rows = {row.method: row for row in fit_on_box(load_model_config("Qwen2.5-7B").config, idle)}
    assert rows["full"].verdict == "fits" and rows["full"].free_gib is None


def test_a_whole_model_in_the_cache_of_now_wins_over_a_failed_download_into_an_old_cache(home, monkeypatch, capsys):
    """The QA's download failed into one ModelScope cache; with MODELSCOPE_CACHE moved, the model came whole into
    the new one. The record, keyed by hub and id, was taken for the new folder's (`models list` said download
    "failed" beside the whole model; the app's download line showed the failure). The whole model wins."""
    from core.hub.download import job_dir_for, list_downloads
    from core.hub.local import download_of, superseded_download

    model_id = "Qwen/Qwen2.5-7B-Instruct"
    job = job_dir_for("modelscope", model_id)
    job.mkdir(parents=True)
    old = home / "old-ms" / "models" / "Qwen" / "Qwen2___5-7B-Instruct"
    (job / "job.json").write_text(json.dumps({"hub": "modelscope", "model_id": model_id, "revision": "master",
                                              "target_dir": str(old), "files": [{"path": "model.safetensors",
                                                                                 "size": 100}]}))
    (job / "state.json").write_text(json.dumps({"status": "failed", "error": "HTTP 500", "updated": 1.0}))
    new = home / "ms" / "models" / "Qwen" / "Qwen2___5-7B-Instruct"  # MODELSCOPE_CACHE of now (``home``)
    _write(new / "config.json", 10)
    [record] = list_downloads()
    assert not superseded_download(record)  # nothing whole yet: the failure is news, and d resumes it
    [listed] = list_local_models()
    assert download_of(listed, [record]) is record  # the unfinished folder's record, by its id
    _write(new / "model.safetensors", 100)  # now whole in the cache of now
    assert superseded_download(record)
    [whole] = list_local_models()
    assert whole.complete and download_of(whole, [record]) is None
    assert main(["models", "list", "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)["models"]
    assert shown["complete"] and shown["download"] is None  # it said "failed"
    # a record of the whole model's own folder is still its own
    same = job_dir_for("modelscope", "Qwen/Other")
    same.mkdir(parents=True)
    (same / "job.json").write_text(json.dumps({"hub": "modelscope", "model_id": "Qwen/Other", "target_dir": str(new),
                                               "files": []}))
    (same / "state.json").write_text(json.dumps({"status": "done", "updated": 2.0}))
    assert download_of(whole, list_downloads()).model_id == "Qwen/Other"


def test_models_search_says_one_model_and_why_a_result_is_left_out(home, monkeypatch, capsys):
    """`models search` said "1 of 1 models", and counted short of the hub's total without a word where a result's
    id is no valid ModelScope id (left out: it could not be opened or downloaded). Fake hub."""
    from tests.hubserver import FakeRepo

    hub = standard_hub()
    hub.add(FakeRepo("qa/模型-7B", files={"config.json": b"{}"}, downloads=1))
    with FakeHubServer(hub) as server:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
        assert main(["models", "search", "tiny"]) == 0
        err = capsys.readouterr().err
        assert "1 model on modelscope" in err and "1 of 1" not in err, err
        assert main(["models", "search", ""]) == 0
        err = capsys.readouterr().err
        assert "4 of 5 models on modelscope" in err, err
        assert "1 more left out: its id is not a valid ModelScope id" in err, err
        # --json says it too: "total" 5 beside 4 models, with no more pages, had no why
        assert main(["models", "search", "", "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
        assert (found["total"], len(found["models"]), found["unusable"]) == (5, 4, 1), found


@pytest.mark.parametrize("layout", ["huggingface", "modelscope-snapshots"])
def test_delete_refuses_a_cached_snapshot_a_live_run_trains_on(home, layout):
    """A run of a hub id loads the cache's snapshots/<rev> folder while the listing (and so the delete) names
    the repo folder above it: the two were compared for equality, so `models rm Qwen/Qwen3-0.6B --yes` (or x
    on the Local tab) deleted the base model under a running trainer on a Hugging Face cache (or the new
    ModelScope owner--name/snapshots/<rev> layout). The run's folder within the model's counts as in use."""
    import signal

    if layout == "huggingface":
        repo = home / "hf" / "hub" / "models--acme--Snap-1B"
    else:
        repo = home / "ms" / "models" / "acme--Snap-1B"
    snapshot = repo / "snapshots" / "abc"
    _write(snapshot / "model.safetensors", 50_000)
    (snapshot / "config.json").write_text('{"model_type": "qwen2"}')
    model = next(m for m in list_local_models() if m.model_id == "acme/Snap-1B")
    assert model.path == repo
    run, holder = _live_run_of("acme/Snap-1B")
    try:
        with pytest.raises(DeleteRefusedError) as refused:
            delete_local_model(model)
        assert f"Run {run.id} (running) trains on acme/Snap-1B" in str(refused.value)
        assert (snapshot / "model.safetensors").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert delete_local_model(model) > 0 and not repo.exists()


def test_the_modelscope_sdks_temporary_folder_is_no_model(home, capsys):
    """The ModelScope SDK downloads into ``models/._____temp/<owner>/<name>`` before moving each file into its
    place: `models list` (and the Local tab) showed that folder as a whole model named "._____temp/Qwen", one
    to train and to delete. It is no model; the models beside it are listed as before."""
    temp = home / "ms" / "models" / "._____temp" / "Qwen" / "Qwen2___5-7B-Instruct"
    _write(temp / "config.json", 10)
    _write(temp / "model-00001-of-00004.safetensors", 100)
    _write(home / "ms" / "models" / "Qwen" / "Whole" / "config.json", 10)
    _write(home / "ms" / "models" / "Qwen" / "Whole" / "model.safetensors", 10)
    assert [m.model_id for m in list_local_models()] == ["Qwen/Whole"]
    assert main(["models", "list"]) == 0
    out, err = capsys.readouterr()
    assert "_____temp" not in out + err and "Qwen/Whole" in out
