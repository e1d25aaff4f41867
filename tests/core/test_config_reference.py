"""``core/config/REFERENCE.md`` is the user's table of run keys: every key of the schema has its row, no row
names a key the schema lacks, and the default a row gives is the schema's.

Pure file and schema reading: no GPU, no network.
"""

from __future__ import annotations

import re
from pathlib import Path

from core.config.schema import (
    DEFAULT_EPOCHS,
    DEFAULT_LR_FULL,
    DEFAULT_LR_LORA,
    DEFAULT_WARMUP_RATIO,
    KEY_SPECS,
    default_for,
)

REFERENCE = Path(__file__).resolve().parents[2] / "core" / "config" / "REFERENCE.md"
# Keys whose default is worked out from other keys (schema.resolve_defaults): what their row must say.
RESOLVED = {
    "name": "`<model>-<method>`",
    "epochs": f"{DEFAULT_EPOCHS:g} when `max_steps` is unset",
    "warmup_ratio": f"{DEFAULT_WARMUP_RATIO:g} when `warmup_steps` is unset",
    "learning_rate": f"{DEFAULT_LR_LORA:.0e} (LoRA methods), {DEFAULT_LR_FULL:.0e} (full)".replace("e-0", "e-"),
}


def key_rows() -> dict[str, str]:
    """key → the default column of each row of the "## Keys" table."""
    text = REFERENCE.read_text(encoding="utf-8")
    section = text.split("\n## Keys\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        found = re.match(r"\| `(\w+)` \|(.*)", line)
        if found:
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", found.group(2))]
            assert found.group(1) not in rows, f"{found.group(1)} has two rows"
            rows[found.group(1)] = cells[1]
    return rows


def shown(value: object) -> set[str]:
    """The ways a row may write a schema default."""
    if isinstance(value, bool):
        return {str(value).lower()}
    if isinstance(value, str):
        return {f"`{value}`"}
    short = str(value).replace("e-0", "e-")  # 1e-08 as a person writes it: 1e-8
    return {str(value), f"`{value}`", short, f"`{short}`"}


def test_reference_lists_every_key_of_the_schema_and_no_other():
    rows = key_rows()
    assert sorted(set(KEY_SPECS) - set(rows)) == [], "keys without a row in REFERENCE.md"
    assert sorted(set(rows) - set(KEY_SPECS)) == [], "rows in REFERENCE.md for keys the schema lacks"


def test_reference_gives_each_keys_default_as_the_schema_has_it():
    rows = key_rows()
    wrong = {}
    for key in KEY_SPECS:
        default, row = default_for(key), rows.get(key, "")
        if key in RESOLVED:
            ok = row == RESOLVED[key]
        elif default is None:
            ok = row.startswith(("unset", "**required**"))
        else:
            ok = row in shown(default)
        if not ok:
            wrong[key] = (default, row)
    assert wrong == {}, "REFERENCE.md default differs from the schema (key: (schema, row))"


def test_messages_name_the_reference_where_a_pip_install_puts_it(tmp_path):
    """Messages sent users to ``core/config/REFERENCE.md``, a path of the checkout: a wheel shipped no such file
    (not package data). The wheel built from this tree holds it now, and the path the messages give is the
    installed one (``reference_path``), relative to the package as in the wheel, and it exists."""
    import shutil
    import subprocess
    import sys
    import zipfile

    import core
    from core.config.checks import unknown_key_message
    from core.config.schema import reference_path

    root = REFERENCE.parents[2]
    source = tmp_path / "src"
    for part in ("core", "tui", "themes"):
        shutil.copytree(root / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel, = (tmp_path / "dist").glob("*.whl")
    inside = Path(reference_path()).relative_to(Path(core.__file__).parent.parent).as_posix()
    assert inside == "core/config/REFERENCE.md" and inside in zipfile.ZipFile(wheel).namelist()
    assert Path(reference_path()).is_file()
    assert f"see {reference_path()} for the keys" in unknown_key_message("zzzzzz_unlike_any_key")
