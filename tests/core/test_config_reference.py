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
    return {str(value), f"`{value}`"}


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
