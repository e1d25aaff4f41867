"""Problems found in data files: each names the file and the line (or row) and says what is wrong."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import EXIT_FAILED, TunedeckError
from core.i18n import Message, t

DEFAULT_MAX_ISSUES = 50


@dataclass(frozen=True)
class DataIssue:
    """One malformed row (or a problem with the whole file when ``line`` and ``row`` are ``None``).

    ``line`` is the 1-based line in the file (JSONL, CSV, JSON arrays); ``row`` the 0-based record index
    (parquet, hub datasets, and alongside ``line`` where both are known; ``--json`` keeps it so, for scripts that
    read it). A user reads it counted from 1, as lines are (``row_location``): ``--json`` gives that number too,
    as ``record`` (``row`` + 1), the one every message says.

    ``message`` may be given as a ``core.i18n.Message``: it reads as its text in the current language, and
    ``said`` keeps it as data, so that a run that fails on it stores a reason each reader words in its own
    language (``DataError.reason``).
    """

    file: str
    line: int | None
    row: int | None
    message: str
    said: Message | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.message, Message):
            object.__setattr__(self, "said", self.message)
            object.__setattr__(self, "message", self.message.text())

    def location(self) -> str:
        if self.line is not None:
            return f"{self.file}:{self.line}"
        if self.row is not None:
            return row_location(self.file, self.row)
        return self.file

    def __str__(self) -> str:
        return f"{self.location()}: {self.message}"

    def as_message(self) -> Message:
        """The issue as ``__str__`` words it, kept as data (a problem given as plain text stays text)."""
        problem = self.said if self.said is not None else self.message
        if self.line is None and self.row is not None:
            return Message("data.issue_at_row", file=self.file, row=self.row + 1, problem=problem)
        return Message("data.issue_at", location=self.location(), problem=problem)

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

    def reason(self) -> Message:
        """The problems as one line kept as data, for a run's stored failure reason: each reader shows it
        in its own language (``stored_reason`` / ``render_stored``)."""
        count = len(self.issues)
        header = Message("data.error_header_one") if count == 1 else Message("data.error_header_many", count=count)
        listed = [issue.as_message() for issue in self.issues]
        if self.more:
            listed.append(Message("data.more_issues", count=self.more))
        return Message("data.error_reason", header=header, issues=listed)

    def brief(self) -> str:
        """One problem as its own line (``x.jsonl:3: invalid JSON``), with no heading to nest in another
        sentence; several as the list ``str`` gives."""
        if len(self.issues) == 1 and not self.more:
            return str(self.issues[0])
        return self._render()
