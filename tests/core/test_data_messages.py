"""Every message key the config and data code asks for exists in the English catalogue, and the
placeholders it is given match the text (a wrong one would raise only when that error happens)."""

from __future__ import annotations

import ast
import string
from pathlib import Path

import pytest

from core.i18n import catalogue

CORE = Path(__file__).resolve().parents[2] / "core"
SOURCES = sorted([*CORE.glob("config/*.py"), *CORE.glob("data/*.py"), *CORE.glob("data/samples/*.py"),
                  *CORE.glob("assets/*.py")])


def message_calls():
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "t"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                yield path.name, node.args[0].value, {kw.arg for kw in node.keywords}


CALLS = list(message_calls())


def test_the_scan_found_the_calls():
    assert len(CALLS) > 80


@pytest.mark.parametrize(("source", "key", "params"), CALLS, ids=[f"{c[0]}:{c[1]}" for c in CALLS])
def test_key_exists_and_placeholders_match(source, key, params):
    text = catalogue("en").get(key)
    assert text is not None, f"{source} uses '{key}', missing from core/i18n/en"
    wanted = {name for _, name, _, _ in string.Formatter().parse(text) if name}
    assert wanted <= params, f"'{key}' needs {wanted - params} but {source} gives {params}"
