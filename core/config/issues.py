"""Problems found in a run configuration: each names the file, the YAML line, the key and what to do."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import EXIT_USAGE, TunedeckError
from core.i18n import t

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a run configuration.

    ``file`` is the YAML path (or ``command line`` for a ``key=value`` override, ``<config>`` for a
    configuration built in code); ``line`` is 1-based or ``None`` when unknown; ``key`` is the
    configuration key concerned (``None`` for a file-level problem such as a YAML syntax error).
    """

    file: str
    line: int | None
    key: str | None
    message: str
    severity: str = ERROR

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def location(self) -> str:
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def __str__(self) -> str:
        prefix = t("config.warning_prefix") if self.severity == WARNING else ""
        key = f"{self.key}: " if self.key else ""
        return f"{self.location()}: {prefix}{key}{self.message}"

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "key": self.key, "message": self.message,
                "severity": self.severity}


class ConfigError(TunedeckError):
    """A run configuration that cannot be used; ``errors`` lists every problem found, not just the first."""

    exit_code = EXIT_USAGE

    def __init__(self, errors: list[ConfigIssue]) -> None:
        self.errors = list(errors)
        super().__init__(self._render())

    def _render(self) -> str:
        count = len(self.errors)
        head = t("config.error_header_one") if count == 1 else t("config.error_header_many", count=count)
        return "\n".join([head] + [f"  {issue}" for issue in self.errors])

    def __str__(self) -> str:
        return self._render()
