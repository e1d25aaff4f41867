"""The hub's dynamic message keys (verdicts, download states) exist for every value they can take.
Literal keys and their placeholders are checked for all code in tests/core/test_i18n_catalogue.py."""

from __future__ import annotations

from core.hub.download import STATUSES
from core.i18n import catalogue


def test_dynamic_keys_cover_every_value():
    messages = catalogue("en")
    for verdict in ("fits", "tight", "does_not_fit", "impossible"):
        assert f"hub.cli.verdict.{verdict}" in messages and f"modelsscreen.verdict.{verdict}" in messages
    for status in set(STATUSES) - {"queued", "running"}:
        assert f"modelsscreen.download_status.{status}" in messages
