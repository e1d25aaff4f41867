"""One error hierarchy: every domain error is a ``TunedeckError``, and ``core.cli`` is the one place that
turns one into ``tunedeck: <message>`` on stderr and its exit code."""

from __future__ import annotations

import ast
import builtins
import errno
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core import cli
from core.errors import EXIT_HUB, EXIT_USAGE, CliError, TunedeckError

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core"

# Exceptions that never reach the user: each is caught where it is raised and becomes something else.
CONTROL_FLOW = {
    "core.config.checks._Invalid": "one value's refusal, collected into a ConfigError's issues",
    "core.hardware.nvml_backend._NvmlGone": "NVML went away mid-poll: the snapshot says so instead",
    "core.hardware.nvml_backend._GpuLost": "a GPU answered GPU_IS_LOST mid-read: the snapshot marks it lost instead",
    "core.hub.download._BadNumber": "a download record's value that is no number, inside read_status: the record "
                                     "then reads 'unreadable', naming the file and key",
    "core.hub.downloader.Cancelled": "the download job's cancel signal, inside the downloader process",
    "core.hub.downloader.LinkRefused": "a storage server's 403 to a signed download link, inside the downloader "
                                       "process: tried again with a new link, said when its tries are spent",
    "core.hub.downloader.LocalWriteError": "a failed write on this box, kept apart from the link's OSErrors until "
                                           "the downloader's run() says it (a full disk) and ends the job",
    "core.hub.hf_source._Abandoned": "ends an HF call thread whose caller gave up on it; nobody reads it",
    "core.stop_signals.StopSignal": "SIGTERM or SIGHUP during merge, export or a watched download, raised as Ctrl+C's "
                                    "KeyboardInterrupt so that their cleanup runs; the command exits 128+N",
}


def _exception_classes() -> list[str]:
    """``module.Class`` of every exception class defined in core, found in the source (so a new one
    cannot be missed): a class whose base is a built-in exception or another such class."""
    known = {name for name, value in vars(builtins).items() if isinstance(value, type)
             and issubclass(value, BaseException)}
    classes: dict[str, tuple[str, list[str]]] = {}
    for path in sorted(CORE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases]
                classes[f"{module}.{node.name}"] = (node.name, bases)
    found: set[str] = set()
    changed = True
    while changed:  # a class whose base is an exception class (by name) is one too
        changed = False
        names = known | {classes[q][0] for q in found}
        for qualified, (_name, bases) in classes.items():
            if qualified not in found and any(b in names for b in bases):
                found.add(qualified)
                changed = True
    return sorted(found)


def _load(qualified: str) -> type:
    module, _, name = qualified.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_every_domain_error_is_a_tunedeck_error():
    found = _exception_classes()
    assert "core.runs.errors.RunError" in found and "core.hub.errors.NotEnoughDiskError" in found  # the finder finds
    not_ours = [q for q in found if q not in CONTROL_FLOW and not issubclass(_load(q), TunedeckError)]
    assert not_ours == []
    assert set(CONTROL_FLOW) <= set(found), "a control-flow exception listed here is gone: drop it from the list"


@pytest.mark.parametrize(("qualified", "builtin"), [
    ("core.estimate.plan.PlanError", ValueError),
    ("core.data.readers.FileProblem", ValueError),
    ("core.runs.listing.RunNotFound", LookupError),
    ("core.watch.source.SourceNotFound", LookupError),
    ("core.plan.probe.ProbeError", RuntimeError),
    ("core.runs.disk_space.DiskFullError", OSError),
])
def test_domain_errors_keep_the_builtin_base_they_were_caught_by(qualified, builtin):
    assert issubclass(_load(qualified), builtin)


def test_exit_codes_by_domain():
    from core.config import ConfigError
    from core.hub.errors import HubUnavailableError
    from core.lifecycle.source import LifecycleError, NoCheckpoint
    from core.runs.errors import RunError
    from core.runs.listing import RunNotFound
    from core.settings import SettingsError

    assert ConfigError([]).exit_code == EXIT_USAGE
    assert RunNotFound("x").exit_code == EXIT_USAGE
    assert SettingsError("x").exit_code == EXIT_USAGE
    assert HubUnavailableError("x").exit_code == EXIT_HUB
    assert LifecycleError("x").exit_code == 1
    assert NoCheckpoint("x").exit_code == EXIT_USAGE  # nothing to merge/serve …: as resume says (2)
    assert RunError("x").exit_code == 1 and RunError("x", 2).code == 2  # ``code`` stays its older name
    assert CliError("x", 2).exit_code == 2 and CliError("x").code == 1
    assert issubclass(CliError, TunedeckError) and cli.CliError is CliError  # still importable from core.cli


def test_message_of_an_error_carrying_an_i18n_message():
    from core.i18n import Message, t
    from core.train.worker import TrainingSetupError

    error = TrainingSetupError(Message("train.zero_needs_gpu"))
    assert error.message == t("train.zero_needs_gpu")
    assert isinstance(error.args[0], Message)  # what the trainer's status file reads


def test_cli_prints_a_missing_config_and_exits_2(tmp_path, monkeypatch):
    """A real invocation: ``train`` on a file that is not there fails with its message and exit code."""
    from core.runs.errors import RunError
    from core.runs.lifecycle import check_run_file

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    done = subprocess.run([sys.executable, "-m", "core", "train", "missing.yaml"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120)
    with pytest.raises(RunError) as raised:  # what train checks first, raised here in-process
        check_run_file("missing.yaml")
    assert isinstance(raised.value, TunedeckError)
    assert done.returncode == raised.value.exit_code == EXIT_USAGE
    assert done.stderr == f"tunedeck: {raised.value.message}\n"
    assert "missing.yaml" in done.stderr and done.stdout == ""


def _command_raising(monkeypatch, error: BaseException) -> None:
    """``tunedeck runs`` raising ``error``: the CLI's handling, whatever the command."""
    import core.runs.commands as commands

    def handler(_args):
        raise error

    monkeypatch.setattr(commands, "cmd_runs", handler)


def test_any_tunedeck_error_from_a_command_is_one_line_and_its_code(monkeypatch, capsys, tmp_path):
    from core.hub.errors import HubUnavailableError

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    _command_raising(monkeypatch, HubUnavailableError("the hub did not answer"))
    assert cli.main(["runs"]) == EXIT_HUB
    assert capsys.readouterr().err == "tunedeck: the hub did not answer\n"


def test_a_full_disk_keeps_its_own_message(monkeypatch, capsys, tmp_path):
    from core.runs.disk_space import DiskFullError, cannot_write_message

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    error = DiskFullError(tmp_path / "run" / "metrics.jsonl", None, 0)
    assert error.errno == errno.ENOSPC
    _command_raising(monkeypatch, error)
    assert cli.main(["runs"]) == 1
    assert capsys.readouterr().err == f"tunedeck: {cannot_write_message(error)}\n"


def test_a_read_only_disk_under_a_bytes_file_name_is_one_line_not_a_traceback(monkeypatch, capsys, tmp_path):
    """An OSError whose file name is bytes (an os call given a bytes path) made the message's Path(...) raise
    TypeError: the command ended in a traceback instead of "cannot write FILE". Now the name is decoded as
    the file system spells it, for a file of a run and for tunedeck's own folder alike."""
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    target = tmp_path / "数据" / "metrics.jsonl"
    _command_raising(monkeypatch, OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsencode(target)))
    assert cli.main(["runs"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tunedeck: cannot write {target}: Read-only file system; ") and err.count("\n") == 1, err
    home = tmp_path / "home"
    _command_raising(monkeypatch, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsencode(home)))
    assert cli.main(["runs"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tunedeck: cannot write {home}: No space left on device; tunedeck keeps its runs") \
        and "TUNEDECK_HOME" in err, err


def test_output_that_fails_for_any_reason_names_its_stream(monkeypatch, capsys, tmp_path):
    """A terminal gone (EIO on the write of stdout) is not a full disk, and ended in a traceback; the
    output's own failures name the stream (it has no file name), whatever the errno, EPIPE aside."""
    import io

    class Gone(io.StringIO):
        def write(self, text):
            raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", Gone())
    assert cli.main(["runs", "--json"]) == 1
    assert capsys.readouterr().err.startswith(f"tunedeck: cannot write standard output: {os.strerror(errno.EIO)};")
    _command_raising(monkeypatch, OSError(errno.EIO, os.strerror(errno.EIO)))  # not the output: a bug's traceback
    with pytest.raises(OSError):
        cli.main(["runs"])


def test_anything_else_is_not_swallowed(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path))
    _command_raising(monkeypatch, KeyError("a bug"))
    with pytest.raises(KeyError):
        cli.main(["runs"])
