"""Problems found in data files: each names the file and the line (or row) and says what is wrong."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import EXIT_FAILED, TunedeckError
from core.i18n import t

DEFAULT_MAX_ISSUES = 50


@dataclass(frozen=True)
class DataIssue:
    """One malformed row (or a problem with the whole file when ``line`` and ``row`` are ``None``).

    ``line`` is the 1-based line in the file (JSONL, CSV, JSON arrays); ``row`` the 0-based record index
    (parquet, hub datasets, and alongside ``line`` where both are known; ``--json`` keeps it so, for scripts that
    read it). A user reads it counted from 1, as lines are (``row_location``): ``--json`` gives that number too,
    as ``record`` (``row`` + 1), the one every message says.
    """

    file: str
    line: int | None
    row: int | None
    message: str

    def location(self) -> str:
        if self.line is not None:
            return f"{self.file}:{self.line}"
        if self.row is not None:
            return row_location(self.file, self.row)
        return self.file

    def __str__(self) -> str:
        return f"{self.location()}: {self.message}"

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "row": self.row,
                "record": None if self.row is None else self.row + 1, "message": self.message}


def row_location(file: str, row: int) -> str:
    """Where the row of 0-based index ``row`` is, as a user reads it: counted from 1 as lines are ("row 1" is the
    first row, "第 1 行" too)."""
    return f"{file} {t('data.row', row=row + 1)}"


class DataError(TunedeckError):
    """Data that cannot be trained on; ``issues`` lists the problems found (up to a limit)."""

    exit_code = EXIT_FAILED

    def __init__(self, issues: list[DataIssue], more: int = 0) -> None:
        self.issues = list(issues)
        self.more = more  # problems found beyond the ones listed
        super().__init__(self._render())

    def _render(self) -> str:
        count = len(self.issues)
        head = t("data.error_header_one") if count == 1 else t("data.error_header_many", count=count)
        lines = [head] + [f"  {issue}" for issue in self.issues]
        if self.more:
            lines.append("  " + t("data.more_issues", count=self.more))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._render()

    def brief(self) -> str:
        """One problem as its own line (``x.jsonl:3: invalid JSON``), with no heading to nest in another
        sentence; several as the list ``str`` gives."""
        if len(self.issues) == 1 and not self.more:
            return str(self.issues[0])
        return self._render()
