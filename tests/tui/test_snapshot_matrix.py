"""The English cells of the #18 snapshot matrix that no screen's own test draws (see snapshot_matrix.py),
and the check that every cell of the matrix, English and Chinese, has its snapshot."""

from __future__ import annotations

import pytest

from tests.tui.snapshot_matrix import EN, draw, missing_cells
from tests.tui.test_models_screen import hub_env  # noqa: F401  (a fixture, for the scenarios that search)


@pytest.mark.parametrize(("stem", "size"), EN, ids=[f"{stem}-{w}x{h}" for stem, (w, h) in EN])
def test_matrix_cell(stem, size, request):
    draw(stem, size, "en", request)


def test_every_cell_of_the_matrix_has_its_snapshot():
    assert missing_cells() == []
