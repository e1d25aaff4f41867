"""Where a merge or export may write, and what it may replace: a real tiny LoRA run, real folders.

``--force`` used to rename whatever ``--out`` named aside and delete it: the run directory, the data root,
the checkpoint being merged. Now such a folder is refused before anything is loaded, and ``--force``
replaces only an earlier tunedeck merge or export (its tunedeck_merge.json) or an empty folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from tests.fixtures.lifecycle.finished_run import TINY, tunedeck


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``folder``: (size, mtime_ns), so that any removal or rewrite shows."""
    return {str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def test_force_never_replaces_a_run_the_data_root_or_the_checkpoint_it_reads(lora_run, tmp_path):
    """The tester's three losses, by merge and export: each refused with exit 2, one line, nothing touched."""
    home, run = lora_run
    checkpoint = run.path / "checkpoints" / "checkpoint-15"
    assert (run.path / "run.json").is_file() and (checkpoint / "COMPLETE").is_file()
    before = tree(home)
    cases = [
        (["--out", str(run.path)], f"is or holds the run directory {run.path}"),
        (["--out", str(home)], f"is, holds or lies inside tunedeck's data folder {home}"),
        (["--out", str(home / "runs")], "is or holds the run directory"),
        (["--checkpoint", "15", "--out", str(checkpoint)], "(the checkpoint being merged)"),
        (["--out", str(checkpoint)], "lies inside the run directory"),  # checkpoint 30 merged: not the source
        (["--out", str(run.path / "checkpoints")], "(the checkpoint being merged)"),
        (["--out", str(run.path / "logs-copy")], "outside its merged/ and export/ folders"),
        (["--out", str(home / "somewhere")], f"inside tunedeck's data folder {home}"),
    ]
    for command in ("merge", "export"):
        for args, words in cases:
            proc = tunedeck(home, command, run.id, *args, "--force")
            assert proc.returncode == 2, (command, args, proc.stderr[-2000:])
            assert words in proc.stderr and "Nothing was touched" in proc.stderr, (command, args, proc.stderr)
            assert "Traceback" not in proc.stderr, proc.stderr
    assert tree(home) == before  # not one file of the run (nor of the data root) removed or rewritten
    proc = tunedeck(home, "status", run.id)
    assert proc.returncode == 0, proc.stderr


def test_force_never_replaces_the_base_model_folder(lora_run, tmp_path):
    """A run on a local base model: --out naming that folder (or one holding it) is refused."""
    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import LifecycleError

    _home, run = lora_run
    base = shutil.copytree(TINY, tmp_path / "models" / "tiny-copy")
    cfg = yaml.safe_load(run.config_path.read_text())
    cfg["model"] = str(base)
    run.config_path.write_text(yaml.safe_dump(cfg))
    before = tree(tmp_path)
    for out in (base, tmp_path / "models", base / "merged"):
        with pytest.raises(LifecycleError, match="the run's base model folder") as info:
            merge_run(run, out=out, force=True)
        assert info.value.exit_code == 2 and str(base) in str(info.value)
    assert tree(tmp_path) == before


def test_force_replaces_only_an_earlier_merge_or_an_empty_folder(lora_run, tmp_path):
    from core.lifecycle.merge import merge_run
    from core.lifecycle.source import OutputExists, OutputNotReplaceable

    _home, run = lora_run
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.md").write_text("the user's own notes")
    (mine / "data").mkdir()
    before = tree(tmp_path)
    for force in (False, True):
        with pytest.raises(OutputNotReplaceable) as info:
            merge_run(run, out=mine, force=force)
        message = str(info.value)
        assert str(mine) in message and "2 entries: data/, notes.md" in message and "tunedeck_merge.json" in message
        assert "move or delete it yourself" in message and info.value.exit_code == 1
    proc = tunedeck(run.path.parent.parent, "export", run.id, "--out", str(mine), "--force")
    assert proc.returncode == 1 and "2 entries: data/, notes.md" in proc.stderr and "Traceback" not in proc.stderr
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(OutputNotReplaceable, match="a file"):
        merge_run(run, out=a_file, force=True)
    # a folder of the user's named like the merge's scratch folder is not "a leftover" to delete
    (tmp_path / "fresh.tmp").mkdir()
    (tmp_path / "fresh.tmp" / "keep.txt").write_text("mine")
    before = tree(tmp_path)
    with pytest.raises(OutputNotReplaceable, match="fresh.tmp holds 1 entry: keep.txt"):
        merge_run(run, out=tmp_path / "fresh")
    assert tree(tmp_path) == before

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(OutputExists):  # an empty folder: replaced, but only when asked to
        merge_run(run, out=empty)
    first = merge_run(run, out=empty, force=True)
    assert (first.out / "model.safetensors").is_file() and (first.out / "tunedeck_merge.json").is_file()
    again = merge_run(run, out=empty, force=True)  # an earlier merge: replaced
    assert json.loads((again.out / "tunedeck_merge.json").read_text())["merged"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "empty", "fresh.tmp", "mine"]


def test_an_out_that_cannot_be_made_is_one_line_not_a_traceback(lora_run, tmp_path):
    """A file where a folder is needed above --out, and a pseudo filesystem (/proc): FileExistsError and
    merge_lock's FileNotFoundError tracebacks before. Now one line naming the path (exit 2), nothing loaded."""
    home, run = lora_run
    (tmp_path / "afile").write_text("x")
    for command in ("merge", "export"):
        proc = tunedeck(home, command, run.id, "--out", str(tmp_path / "afile" / "sub"))
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"{tmp_path / 'afile'} is a file, not a folder" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
        proc = tunedeck(home, command, run.id, "--out", "/proc/tunedeck-out")
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "--out /proc/tunedeck-out cannot be written (" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"] and (tmp_path / "afile").read_text() == "x"


def test_chat_and_serve_on_a_merge_with_cut_weights_say_so_in_one_line(lora_run, tmp_path):
    """A merged folder whose model.safetensors was cut: chat ended in safetensors' bare "invalid header
    length" traceback, serve in the server log's traceback. Now both refuse before loading (exit 2)."""
    import os
    import subprocess
    import sys

    import core.lifecycle.serve as serve
    from core.lifecycle.merge import merge_run
    from tests.fixtures.lifecycle.finished_run import ROOT

    home, run = lora_run
    bad = merge_run(run, out=tmp_path / "bad").out
    weights = bad / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(weights.stat().st_size // 2)
    proc = subprocess.run([sys.executable, "-m", "core", "chat", "--model-dir", str(bad)], input="hi\n",
                          cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--model-dir {bad} cannot be loaded: model.safetensors is " in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    proc = tunedeck(home, "serve", "--model-dir", str(bad))  # a folder is served without a run
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--model-dir {bad} cannot be loaded: model.safetensors is " in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (serve.serve_dir(bad.name) / "state.json").exists()  # nothing was started


def test_merge_run_again_on_its_default_folder_reuses_the_whole_merge(lora_run):
    """`tunedeck merge RUN` twice failed the second time ("... exists already", exit 1) while the TUI's M
    and export reuse a whole merge of the same checkpoint. Now the CLI does too: exit 0, said, --json
    "reused": true, the folder untouched. --force still merges again."""
    home, run = lora_run
    first = tunedeck(home, "merge", run.id, "--json")
    assert first.returncode == 0, first.stderr[-2000:]
    out = Path(json.loads(first.stdout)["out"])
    assert out == run.path / "merged" / "checkpoint-30" and not json.loads(first.stdout)["reused"]
    written = tree(out)
    again = tunedeck(home, "merge", run.id, "--json")
    assert again.returncode == 0, again.stderr[-2000:]
    result = json.loads(again.stdout)
    assert result["reused"] is True and result["out"] == str(out) and result["step"] == 30
    assert result["bytes"] == json.loads(first.stdout)["bytes"]
    plain = tunedeck(home, "merge", run.id)
    assert plain.returncode == 0 and plain.stdout.strip() == str(out), plain.stderr[-2000:]
    assert "already holds the whole merge of checkpoint 30: kept as it is, nothing merged again" in plain.stderr
    assert tree(out) == written  # not rewritten
    merges = [json.loads(line) for line in run.events_path.read_text().splitlines() if '"merged"' in line]
    assert len([e for e in merges if e.get("event") == "merged"]) == 1  # a reuse is no new merge
    forced = tunedeck(home, "merge", run.id, "--force", "--json")
    assert forced.returncode == 0 and json.loads(forced.stdout)["reused"] is False, forced.stderr[-2000:]


@pytest.mark.parametrize("umask,folder,file", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_the_exported_folder_has_the_modes_the_umask_gives(lora_run, tmp_path, umask, folder, file):
    """With umask 022 an export was drwx------ and its model.safetensors -rw------- (config.json -rw-r--r--):
    a serving container running as another user could not read it. Now every file and folder of it has
    what a plain mkdir / open gives under the umask; a stricter umask keeps it private."""
    import os
    import stat
    import subprocess
    import sys

    from tests.fixtures.lifecycle.finished_run import ROOT

    home, run = lora_run
    out = tmp_path / "exported"
    proc = subprocess.run([sys.executable, "-m", "core", "export", run.id, "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=180, preexec_fn=lambda: os.umask(umask),
                          env={**os.environ, "TUNEDECK_HOME": str(home), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in [out, *out.rglob("*")]}
    assert "exported/model.safetensors" in modes and "exported/config.json" in modes
    expected = {name: folder if (tmp_path / name).is_dir() else file for name in modes}
    assert modes == expected, {k: oct(v) for k, v in modes.items()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]  # no probe, no .tmp left


def test_merge_says_the_folder_it_writes_to_and_nothing_before_a_refusal_or_a_reuse(lora_run, tmp_path):
    """It printed "merging … into RUN_DIR/merged …", a literal placeholder, even before a refusal."""
    home, run = lora_run
    default = run.path / "merged" / "checkpoint-30"
    proc = tunedeck(home, "merge", run.id)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == f"merging {run.id} checkpoint 30 into {default} …", lines
    assert "RUN_DIR" not in proc.stderr
    proc = tunedeck(home, "merge", run.id, "--checkpoint", "15", "--out", str(tmp_path / "m15"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[0] == f"merging {run.id} checkpoint 15 into {tmp_path / 'm15'} …"
    for args in ([], ["--out", str(home), "--force"]):  # a reuse, a refusal: one line, no "merging"
        proc = tunedeck(home, "merge", run.id, *args)
        assert len(proc.stderr.strip().splitlines()) == 1 and "merging" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [["merge"], ["export", "--format", "merged"]])
def test_an_out_under_the_home_folder_written_with_a_tilde_goes_there(lora_run, tmp_path, command):
    """``--out=~/models/x``: the shell leaves a ~ after "=" as it is. The location checks looked in the home
    folder, and the merge was written into a folder named "~" in the current one, said as "written to
    ~/models/x" where the user then found nothing. CPU only."""
    import os
    import subprocess
    import sys

    from tests.fixtures.lifecycle.finished_run import ROOT

    data_root, run = lora_run
    home, cwd = tmp_path / "user-home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    proc = subprocess.run([sys.executable, "-m", "core", *command, run.id, "--out=~/models/x", "--json"], cwd=cwd,
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TUNEDECK_HOME": str(data_root), "HOME": str(home),
                               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["out"] == str(home / "models" / "x")
    assert (home / "models" / "x" / "model.safetensors").is_file()
    assert list(cwd.iterdir()) == []


def test_chat_and_serve_take_a_model_dir_under_the_home_folder_written_with_a_tilde(lora_run, tmp_path):
    """``--model-dir=~/models/x`` (the shell leaves a ~ after "=" as it is) was refused as "not a folder (it
    does not exist)" by chat, and serve --status looked for a server of another folder. CPU only."""
    import os
    import subprocess
    import sys

    from core.lifecycle.merge import merge_run
    from tests.fixtures.lifecycle.finished_run import ROOT

    data_root, run = lora_run
    home = tmp_path / "user-home"
    merge_run(run, out=home / "models" / "x")
    env = {**os.environ, "TUNEDECK_HOME": str(data_root), "HOME": str(home), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "core", "chat", "--model-dir=~/models/x", "--max-tokens", "2"],
                          cwd=tmp_path, input="Say yes.\n", capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0 and "not a folder" not in proc.stderr, proc.stderr[-2000:]
    assert str(home / "models" / "x") in proc.stderr  # "loading <the folder> …"
    from core.cli import build_parser

    args = build_parser().parse_args(["serve", "--model-dir=~/models/x", "--status"])  # this process's home
    assert args.model_dir == os.path.expanduser("~/models/x") != "~/models/x"


def test_a_quantized_export_goes_to_the_runs_export_folder_only(lora_run):
    """A bitsandbytes export with --out inside the run was refused offering merged/ ("outside its merged/ and
    export/ folders … the merge goes to merged/checkpoint-30"), and one into merged/checkpoint-30 was accepted:
    there it passed for the run's full-precision merge, which merge, serve and evaluate reuse. Now a quantized
    export is refused anywhere in the run but export/, offered its own default; a quantized export found in
    merged/ is not taken for a merge. (The check itself: a bitsandbytes export needs CUDA, and this box has none.)"""
    from core.lifecycle.export import default_export_dir
    from core.lifecycle.merge import check_out_location, complete_merge, default_merge_dir
    from core.lifecycle.source import LifecycleError, resolve_model_source

    _home, run = lora_run
    source = resolve_model_source(run)
    default = default_export_dir(run, "bnb-4bit", source.step)
    merged = default_merge_dir(run, source.step)
    for out in (merged, run.path / "logs-copy"):
        with pytest.raises(LifecycleError) as info:
            check_out_location(out, run, source, quantized=default)
        assert info.value.exit_code == 2
        assert str(info.value) == (
            f"--out {out} lies inside the run directory {run.path}, outside its export/ folder: a quantized export "
            "is written there only (in merged/ it would pass for the run's full-precision merge, which merge, "
            "serve and evaluate reuse; elsewhere it could destroy the run's checkpoints, logs or config). Nothing "
            f"was touched; leave --out out (the export goes to {default}) or choose a folder outside the run"), \
            str(info.value)
    check_out_location(run.path / "export" / "mine", run, source, quantized=default)  # its folder: taken
    # --out naming the run or the data root: the way out named the run's merged/ folder for a bitsandbytes export
    # too, where leaving --out out writes to export/: each refusal names the default of the command at hand
    from core.paths import data_root

    for out, key in ((run.path, "is or holds the run directory"), (data_root(), "tunedeck's data folder")):
        for quantized, said in ((default, default), (None, merged)):
            with pytest.raises(LifecycleError) as info:
                check_out_location(out, run, source, quantized=quantized)
            assert key in str(info.value) and str(info.value).endswith(f"leave --out out (the default is {said})"), \
                str(info.value)
    check_out_location(merged, run, source)  # a merge's own default

    # One an earlier version let through: a quantized export's folder (its provenance names its format)
    merged.mkdir(parents=True)
    for name in ("model.safetensors", "config.json"):
        (merged / name).write_text("{}")
    provenance = {"exported": "2026-12-07T19:00:00Z", "format": "bnb-4bit", **source.to_dict()}
    (merged / "tunedeck_merge.json").write_text(json.dumps(provenance))
    assert complete_merge(run, source) is None  # merged again, not reused as the full-precision merge
    del provenance["format"]
    (merged / "tunedeck_merge.json").write_text(json.dumps(provenance))
    assert complete_merge(run, source) == merged  # the same folder as a merge's: reused
