"""install.sh as a new user meets it: its --help, and what it says at the end about the PATH.

The script runs for real (bash) against a stub virtual environment: a ``.venv/bin/python`` that answers every
call with success and a ``.venv/bin/tunedeck`` that prints a version, so nothing is downloaded or installed.
``--app-only`` keeps torch and the GPU out of it (no nvidia-smi is asked for anything that matters). An ``id``
stub first on the PATH makes the script take the box for a non-root user's: it never links into
/usr/local/bin here, even when the tests run as root."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _checkout(tmp_path: Path) -> Path:
    """A folder holding install.sh and a stub .venv, as a checkout that was installed once."""
    here = tmp_path / "checkout"
    here.mkdir(exist_ok=True)
    shutil.copy2(ROOT / "install.sh", here / "install.sh")
    if not (here / ".venv" / "bin" / "python").exists():  # a test's own stand-in (``_torch_venv``) stays
        _stub(here / ".venv" / "bin" / "python", "exit 0")
    _stub(here / ".venv" / "bin" / "tunedeck", 'echo "tunedeck 0.1.0"')
    _stub(tmp_path / "stubs" / "id", 'if [ "$1" = "-u" ]; then echo 1000; else exec /usr/bin/id "$@"; fi')
    return here


def _install(tmp_path: Path, *args: str, path_dirs: list[str],
             python: str | None = sys.executable) -> subprocess.CompletedProcess[str]:
    """``python``: PYTHON for the script (None: unset, the script picks one on the PATH)."""
    here = _checkout(tmp_path)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PATH", "HOME", "PYTHON")}
    if python is not None:
        env["PYTHON"] = python
    env.update(HOME=str(home),
               PATH=":".join([str(tmp_path / "stubs"), *path_dirs, "/usr/bin", "/bin"]))
    proc = subprocess.run(["bash", str(here / "install.sh"), *args], capture_output=True, text=True, env=env,
                          timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, ANSI.sub("", proc.stderr))


def test_help_prints_the_header_comment_and_no_line_of_the_script():
    proc = subprocess.run(["bash", str(ROOT / "install.sh"), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("tunedeck's one set-up command"), proc.stdout
    assert "--app-only" in proc.stdout and "TUNEDECK_FORCE_CPU" in proc.stdout, proc.stdout
    assert not any(line.startswith(("set ", "#!")) for line in lines), proc.stdout  # it printed `set -euo pipefail`


def test_a_user_without_local_bin_on_the_path_is_told_to_add_it_and_given_the_command_that_works(tmp_path):
    """/usr/local/bin is on every PATH but only root gets a link there: a user's install that linked only
    ~/.local/bin, not on their PATH, said nothing and ended "Start the app with: tunedeck" (command not found)."""
    proc = _install(tmp_path, "--app-only", path_dirs=["/usr/local/bin"])
    assert proc.returncode == 0, proc.stderr
    home_link = tmp_path / "home" / ".local" / "bin" / "tunedeck"
    assert home_link.is_symlink(), proc.stderr
    assert "add ~/.local/bin to your PATH" in proc.stderr, proc.stderr
    venv_tunedeck = tmp_path / "checkout" / ".venv" / "bin" / "tunedeck"
    assert proc.stderr.rstrip().endswith(f"Start the app with: {venv_tunedeck}"), proc.stderr


def test_a_user_with_local_bin_on_the_path_is_told_to_start_tunedeck(tmp_path):
    proc = _install(tmp_path, "--app-only", path_dirs=[str(tmp_path / "home" / ".local" / "bin"), "/usr/local/bin"])
    assert proc.returncode == 0, proc.stderr
    assert "to your PATH" not in proc.stderr, proc.stderr
    assert "Start the app with: tunedeck " in proc.stderr, proc.stderr


def test_a_link_to_another_checkout_is_replaced_and_said_so(tmp_path):
    """On a shared box a second checkout's install repoints `tunedeck` for every user of it: not silently."""
    local_bin = tmp_path / "home" / ".local" / "bin"
    local_bin.mkdir(parents=True)
    (local_bin / "tunedeck").symlink_to("/srv/other-checkout/.venv/bin/tunedeck")
    proc = _install(tmp_path, "--app-only", path_dirs=[str(local_bin)])
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(local_bin / "tunedeck") == str(tmp_path / "checkout" / ".venv" / "bin" / "tunedeck")
    assert f"{local_bin}/tunedeck started /srv/other-checkout/.venv/bin/tunedeck" in proc.stderr, proc.stderr
    again = _install(tmp_path, "--app-only", path_dirs=[str(local_bin)])  # its own link: nothing to say
    assert again.returncode == 0 and " started " not in again.stderr, again.stderr


def test_a_home_that_cannot_be_written_ends_the_install_with_the_command_that_starts_it(tmp_path):
    """A read-only home (or one whose ~/.local cannot hold a bin folder): install.sh had installed everything,
    then died at `mkdir ~/.local/bin` with mkdir's own message and exit 1, never saying the install had worked
    nor how to start it. It says the folder could not be made, exits 0 and names the command that works."""
    local = tmp_path / "home" / ".local"
    local.parent.mkdir(parents=True)
    local.write_text("")  # ~/.local is a file: mkdir -p ~/.local/bin fails as on a read-only home
    proc = _install(tmp_path, "--app-only", path_dirs=["/usr/local/bin"])
    assert proc.returncode == 0, proc.stderr
    assert f"could not create {tmp_path / 'home'}/.local/bin" in proc.stderr, proc.stderr
    assert "linked nowhere" in proc.stderr and "to your PATH:" not in proc.stderr, proc.stderr
    venv_tunedeck = tmp_path / "checkout" / ".venv" / "bin" / "tunedeck"
    assert proc.stderr.rstrip().endswith(f"Start the app with: {venv_tunedeck}"), proc.stderr


def _torch_venv(tmp_path: Path, torch_version: str, cuda: str | None) -> Path:
    """A checkout whose .venv holds a stand-in torch of this build (a module on its python's path) and a pip
    that only writes down what it was asked; an NVIDIA driver of CUDA 12.8 with one GPU on the PATH."""
    here = _checkout(tmp_path)
    fake = tmp_path / "fake-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"__version__ = {torch_version!r}\n"
                                      f"class version:\n    cuda = {cuda!r}\n"
                                      "class cuda:\n    device_count = staticmethod(lambda: 1)\n")
    log = tmp_path / "pip.log"
    _stub(here / ".venv" / "bin" / "python",
          f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$*" >> {log}; exit 0; fi\n'
          f'PYTHONPATH={fake.parent} exec {sys.executable} "$@"')
    _stub(tmp_path / "stubs" / "nvidia-smi",
          'if [ "$1" = "-L" ]; then echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"; '
          'else echo "| NVIDIA-SMI 570.1   Driver Version: 570.1   CUDA Version: 12.8 |"; fi')
    return here


def _torch_installs(tmp_path: Path) -> list[str]:
    log = tmp_path / "pip.log"
    return [line for line in log.read_text().splitlines() if "torch==" in line] if log.exists() else []


def test_a_cpu_torch_on_a_gpu_box_is_replaced_by_the_cuda_build(tmp_path):
    """A first install before the NVIDIA driver (or with TUNEDECK_FORCE_CPU=1) left the CPU build of torch: run
    again on the GPU box, install.sh said "torch 2.13.0+cpu already installed" and every run trained on the CPU.
    It installs the CUDA build now, by force (pip takes torch==2.13.0 as met by 2.13.0+cpu); hardware: one fake
    GPU (an nvidia-smi stub)."""
    _torch_venv(tmp_path, "2.13.0+cpu", None)
    version = re.search(r"torch_version=(\S+)", (ROOT / "install.sh").read_text()).group(1)
    proc = _install(tmp_path, path_dirs=[])
    assert proc.returncode == 0, proc.stderr
    assert "already installed" not in proc.stderr, proc.stderr
    [install] = _torch_installs(tmp_path)
    assert "--force-reinstall" in install and "whl/cu128" in install and f"torch=={version}" in install, install


def test_the_cuda_torch_on_a_gpu_box_is_kept_on_a_second_run(tmp_path):
    version = re.search(r"torch_version=(\S+)", (ROOT / "install.sh").read_text()).group(1)
    _torch_venv(tmp_path, f"{version}+cu128", "12.8")
    proc = _install(tmp_path, path_dirs=[])
    assert proc.returncode == 0, proc.stderr
    assert f"torch {version}+cu128 already installed" in proc.stderr and _torch_installs(tmp_path) == [], proc.stderr


def _pythons(tmp_path: Path, versions: dict[str, str | None]) -> None:
    """Stub interpreters first on the PATH: each name answers ``-V`` with its version and a version check
    (``-c``) as that version would; None: a name that does not run (a pyenv shim of an unselected version),
    hiding the box's own."""
    for name, version in versions.items():
        if version is None:
            _stub(tmp_path / "stubs" / name, "exit 127")
            continue
        newer = tuple(int(part) for part in version.split(".")[:2]) >= (3, 13)
        _stub(tmp_path / "stubs" / name,
              f'if [ "$1" = -V ]; then echo "Python {version}"; exit 0; fi\n'
              f'case "$2" in *"(3, 13)"*) exit {1 if newer else 0} ;; esac\nexit 0')


def test_the_newest_tested_python_is_chosen_over_a_newer_untested_python3(tmp_path):
    """A box whose python3 is 3.13 (untested) with 3.12 installed beside it: install.sh took python3, being tried
    first. It takes 3.12 now and says so; with no 3.10-3.12 at all, python3 still, with the untested note."""
    _pythons(tmp_path, {"python3": "3.13.1", "python3.12": "3.12.3", "python3.11": None, "python3.10": None})
    proc = _install(tmp_path, "--app-only", path_dirs=[], python=None)
    assert proc.returncode == 0, proc.stderr
    assert f"using Python 3.12.3 at {tmp_path / 'stubs' / 'python3.12'}" in proc.stderr, proc.stderr
    assert "untested" not in proc.stderr
    _pythons(tmp_path, {"python3.12": None})
    proc = _install(tmp_path, "--app-only", path_dirs=[], python=None)
    assert proc.returncode == 0, proc.stderr
    assert f"using Python 3.13.1 at {tmp_path / 'stubs' / 'python3'}" in proc.stderr, proc.stderr
    assert "Python 3.13.1 is newer than the tested 3.10-3.12: accepted, untested" in proc.stderr


def _python_stub(path: Path, version: str, made: Path) -> None:
    """An interpreter of this version as install.sh asks it things: ``-V``, a version check or print (``-c``),
    and ``-m venv DIR``, which makes DIR a stub .venv (a python answering success, a tunedeck printing a
    version) and writes DIR down in ``made``."""
    minor = ".".join(version.split(".")[:2])
    old = tuple(int(part) for part in minor.split(".")) < (3, 10)
    _stub(path,
          f'if [ "$1" = -V ]; then echo "Python {version}"; exit 0; fi\n'
          f'if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin"; echo "$3" >> {made}\n'
          f'  printf \'#!/bin/sh\\nexit 0\\n\' > "$3/bin/python"; printf \'#!/bin/sh\\necho tunedeck 0.1.0\\n\' > "$3/bin/tunedeck"\n'
          f'  chmod +x "$3/bin/python" "$3/bin/tunedeck"; exit 0; fi\n'
          f'case "$2" in *print*) echo {minor} ;; *"(3, 10)"*) exit {1 if old else 0} ;; esac\nexit 0')


def test_an_existing_venv_of_a_python_older_than_3_10_is_made_again(tmp_path):
    """A checkout whose .venv was made with Python 3.9: install.sh said "using Python 3.11.7", "reusing the
    virtual environment", and pip then failed on the first pinned dependency ("requires a different Python").
    It makes the .venv again with the Python it found, saying why; a 3.12 one is kept (3.10 or newer runs)."""
    here = _checkout(tmp_path)
    made = tmp_path / "made.log"
    _python_stub(here / ".venv" / "bin" / "python", "3.9.18", made)
    _python_stub(tmp_path / "stubs" / "python3.11", "3.11.7", made)
    proc = _install(tmp_path, "--app-only", path_dirs=[], python=str(tmp_path / "stubs" / "python3.11"))
    assert proc.returncode == 0, proc.stderr
    assert "runs Python 3.9, older than 3.10: making it again with Python 3.11.7" in proc.stderr, proc.stderr
    assert made.read_text().split() == [str(here / ".venv")], proc.stderr
    made.unlink()
    _python_stub(here / ".venv" / "bin" / "python", "3.12.1", made)
    _pythons(tmp_path, {"python3.12": None})  # the box's own 3.12, if any, hidden: python3.11 is found first
    proc = _install(tmp_path, "--app-only", path_dirs=[], python=None)  # python3.11 found on the PATH
    assert proc.returncode == 0, proc.stderr
    assert "reusing the virtual environment" in proc.stderr and "(Python 3.12)" in proc.stderr, proc.stderr
    assert "set PYTHON=python3.11 to make it again" in proc.stderr and not made.exists(), proc.stderr
    proc = _install(tmp_path, "--app-only", path_dirs=[], python=str(tmp_path / "stubs" / "python3.11"))
    assert proc.returncode == 0, proc.stderr
    assert "runs Python 3.12, PYTHON=" in proc.stderr and made.exists(), proc.stderr  # asked for by name


def test_a_python_that_does_not_run_is_said_so_not_called_too_old(tmp_path):
    """PYTHON=/opt/py/bin/python3 (a typo) or a pyenv shim of a version not selected: install.sh said
    "…: No such file or directory is too old: tunedeck needs Python 3.10 or newer". It says that it does not
    run, with the shell's or the shim's reason, and what to set."""
    missing = tmp_path / "no-such" / "python3"
    proc = _install(tmp_path, "--app-only", path_dirs=[], python=str(missing))
    assert proc.returncode == 1, proc.stderr
    assert f"PYTHON={missing} does not run: {missing}: No such file or directory" in proc.stderr, proc.stderr
    assert "too old" not in proc.stderr, proc.stderr
    _stub(tmp_path / "stubs" / "python3.12", 'echo "pyenv: python3.12: command not found" >&2; exit 127')
    proc = _install(tmp_path, "--app-only", path_dirs=[], python="python3.12")
    assert proc.returncode == 1 and "too old" not in proc.stderr, proc.stderr
    assert "PYTHON=python3.12 does not run: pyenv: python3.12: command not found" in proc.stderr, proc.stderr


def test_sh_install_sh_runs_it_under_bash(tmp_path):
    """`sh install.sh` (a habit; sh is dash on Debian and Ubuntu) stopped at once with "set: Illegal option
    -o pipefail". It runs itself under bash now: the help, and an install to the end."""
    sh = shutil.which("sh")
    proc = subprocess.run([sh, str(ROOT / "install.sh"), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.startswith("tunedeck's one set-up command"), proc.stderr
    here = _checkout(tmp_path)
    (tmp_path / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PATH", "HOME")}
    env.update(HOME=str(tmp_path / "home"), PYTHON=sys.executable,
               PATH=":".join([str(tmp_path / "stubs"), "/usr/bin", "/bin"]))
    proc = subprocess.run([sh, "install.sh", "--app-only"], cwd=here, capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Start the app with:" in ANSI.sub("", proc.stderr), proc.stderr
