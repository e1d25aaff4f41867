"""``core`` is the product logic without a terminal: importing it must not pull in Textual or Rich,
and building the CLI parser must not load heavy or hardware libraries (torch, NVML, psutil)."""

from __future__ import annotations

import json
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import core

ROOT = Path(__file__).parents[2]
UI = {"textual", "rich", "tui"}


def modules_after(code: str) -> set[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def top_level(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def core_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(core.__path__, "core.") if not m.name.endswith("__main__"))


def test_every_core_module_imports_without_textual_rich_or_tui():
    """Each module of core, imported in a fresh interpreter (harlequin's import-hygiene test)."""
    names = core_modules()
    assert len(names) > 80 and "core.train.worker" in names and "core.cli" in names
    loaded = modules_after("import importlib\n" + "".join(f"importlib.import_module({n!r})\n" for n in names))
    assert set(names) <= loaded  # every one of them was imported
    loaded = top_level(loaded)
    assert not UI & loaded, sorted(UI & loaded)


def test_core_hardware_and_cli_leave_textual_and_rich_out():
    loaded = top_level(modules_after("import core, core.hardware, core.cli, core.hardware.commands"))
    assert "core" in loaded  # the probe did import something
    assert not UI & loaded


def test_building_the_cli_parser_loads_nothing_heavy():
    loaded = top_level(modules_after("from core.cli import build_parser\nbuild_parser()"))
    assert "core" in loaded
    assert not (UI | {"torch", "transformers", "pynvml"}) & loaded


def test_importing_core_hardware_loads_no_nvml_binding():
    loaded = top_level(modules_after("import core.hardware\nfrom core.hardware import open_monitor"))
    assert "pynvml" not in loaded
    assert "pynvml" in top_level(modules_after("from core.hardware import fake_monitor_from_recording"))


def test_import_linter_contracts_hold():
    """The contracts in pyproject.toml, lazy imports inside functions included."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (./install.sh --dev installs it)")
    result = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken" in result.stdout, result.stdout
