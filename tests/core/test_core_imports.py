"""``core`` is the product logic without a terminal: importing it must not pull in Textual or Rich,
and building the CLI parser must not load heavy or hardware libraries (torch, NVML, psutil)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def modules_after(code: str) -> set[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.splitlines()[-1]))


def top_level(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_core_hardware_and_cli_leave_textual_and_rich_out():
    loaded = top_level(modules_after("import core, core.hardware, core.cli, core.hardware.commands"))
    assert "core" in loaded  # the probe did import something
    assert not {"textual", "rich"} & loaded


def test_building_the_cli_parser_loads_nothing_heavy():
    loaded = top_level(modules_after("from core.cli import build_parser\nbuild_parser()"))
    assert "core" in loaded
    assert not {"textual", "rich", "torch", "transformers", "pynvml"} & loaded


def test_importing_core_hardware_loads_no_nvml_binding():
    loaded = top_level(modules_after("import core.hardware\nfrom core.hardware import open_monitor"))
    assert "pynvml" not in loaded
    assert "pynvml" in top_level(modules_after("from core.hardware import fake_monitor_from_recording"))
