"""An install without the training stack (install.sh --app-only) refuses a run before making one.

`tunedeck demo` there made a run whose trainer died at once on ``import transformers``: the user saw
"failed — the trainer exited with code 1; see train.log" and a traceback. The packages are hidden here in the
child interpreter (``sys.modules[name] = None``), as if they were not installed; no GPU is asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tunedeck_without(hidden: list[str], args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    code = (f"import sys\nfor name in {hidden!r}:\n    sys.modules[name] = None\n"
            f"from core.cli import main\nsys.exit(main({args!r}))\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TUNEDECK_HOME": str(home)})


def test_demo_and_train_check_without_the_training_stack_say_what_to_install_and_make_no_run(tmp_path):
    home = tmp_path / "home"
    for args in (["demo", "--detach"], ["demo", "--headless"]):
        proc = _tunedeck_without(["transformers", "peft"], args, home)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "transformers, peft not installed" in lines[0] and "./install.sh without --app-only" in lines[0], proc.stderr
        assert not (home / "runs").exists() or not any((home / "runs").iterdir()), list((home / "runs").iterdir())
    run_file = tmp_path / "run.yaml"
    run_file.write_text(f"model: tiny\ndataset: {ROOT / 'core/data/samples/tiny_skills.jsonl'}\nmethod: full\n")
    proc = _tunedeck_without(["torch"], ["train", str(run_file), "--check"], home)
    assert proc.returncode == 2 and "torch not installed" in proc.stderr, proc.stderr


def test_a_command_that_imports_the_training_stack_says_what_is_missing_not_a_traceback(tmp_path):
    """`data check --model tiny` (and merge, chat, evaluate, export, serve) import transformers or torch when
    they get to work: an app-only install printed their ModuleNotFoundError's traceback."""
    data = ROOT / "core/data/samples/tiny_skills.jsonl"
    proc = _tunedeck_without(["transformers"], ["data", "check", str(data), "--model", "tiny"], tmp_path / "home")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("tunedeck: transformers not installed"), proc.stderr
