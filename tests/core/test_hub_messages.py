"""Every message key the hub code and the models screen ask for exists, with matching placeholders;
the dynamic ones (verdicts, download states) exist for every value they can take."""

from __future__ import annotations

import ast
import string
from pathlib import Path

import pytest

from core.hub.download import STATUSES
from core.i18n import catalogue

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("core/hub/*.py"), ROOT / "tui" / "screens" / "models.py"])


def message_calls():
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "t"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                yield path.name, node.args[0].value, {kw.arg for kw in node.keywords}


CALLS = list(message_calls())


def test_the_scan_found_the_calls():
    assert len(CALLS) > 60


@pytest.mark.parametrize(("source", "key", "params"), CALLS, ids=[f"{c[0]}:{c[1]}" for c in CALLS])
def test_key_exists_and_placeholders_match(source, key, params):
    text = catalogue("en").get(key)
    assert text is not None, f"{source} uses '{key}', missing from core/i18n/en"
    wanted = {name for _, name, _, _ in string.Formatter().parse(text) if name}
    assert wanted <= params, f"'{key}' needs {wanted - params} but {source} gives {params}"


def test_dynamic_keys_cover_every_value():
    messages = catalogue("en")
    for verdict in ("fits", "tight", "does_not_fit", "impossible"):
        assert f"hub.cli.verdict.{verdict}" in messages and f"modelsscreen.verdict.{verdict}" in messages
    for status in set(STATUSES) - {"queued", "running"}:
        assert f"modelsscreen.download_status.{status}" in messages
