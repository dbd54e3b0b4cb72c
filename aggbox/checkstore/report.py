"""The results of ``aggbox check-store`` and what they mean for aggbox: one
:class:`CheckResult` per check, the :class:`Report` with its verdict and exit status, and
its two renderings (a plain-text table, one JSON object). Pure: no server, no clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

__all__ = ["CHANGE_STREAM", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "CheckResult", "Report",
           "Status", "render_table"]

EXIT_OK: Final = 0
#: a check aggbox needs failed, or the store could not be reached
EXIT_FAILED: Final = 1
#: bad options, no MongoDB given, a database that is not empty
EXIT_USAGE: Final = 2

#: The id of the check whose UNSUPPORTED means "the dispatcher polls".
CHANGE_STREAM: Final = "change_stream"


class Status(StrEnum):
    """The outcome of one check."""

    PASS = "PASS"
    #: aggbox needs this and the server does not do it: the guarantees do not hold
    FAIL = "FAIL"
    #: the server does not do it, and aggbox has a fallback (said in ``aggbox``)
    UNSUPPORTED = "UNSUPPORTED"


@dataclass(frozen=True)
class CheckResult:
    """One line of the report: what was checked, what the server did, what aggbox does."""

    id: str
    title: str
    status: Status
    #: what was seen on the server
    detail: str
    #: what aggbox does about it (relies on it, falls back, or what breaks)
    aggbox: str

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "check": self.title, "status": self.status.value,
                "detail": self.detail, "aggbox": self.aggbox}


@dataclass(frozen=True)
class Report:
    """Every check's result against one server, in a scratch database."""

    uri: str  # without password
    server: str
    database: str
    checks: Sequence[CheckResult]
    #: the scratch database was dropped at the end (``False``: say so, the user drops it)
    dropped: bool = True

    @property
    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status is Status.FAIL]

    @property
    def polling(self) -> bool:
        """The dispatcher will poll: change streams are refused here."""
        return any(c.id == CHANGE_STREAM and c.status is Status.UNSUPPORTED
                   for c in self.checks)

    @property
    def verdict(self) -> str:
        if self.failed:
            return ("aggbox's guarantees do not hold here: "
                    + ", ".join(c.title for c in self.failed))
        if self.polling:
            return "aggbox's guarantees hold here with the dispatcher polling"
        return "aggbox's guarantees hold here"

    @property
    def exit_status(self) -> int:
        return EXIT_FAILED if self.failed else EXIT_OK

    def as_dict(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "server": self.server,
            "database": self.database,
            "database_dropped": self.dropped,
            "checks": [c.as_dict() for c in self.checks],
            "verdict": self.verdict,
            "usable": not self.failed,
            "dispatcher": "poll" if self.polling else "stream",
            "exit_status": self.exit_status,
        }


def render_table(report: Report) -> Any:
    """The checks as a ``rich`` table without borders: one row per check (status first, so
    ``grep FAIL`` finds it); long texts wrap within their column."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, safe_box=True, show_edge=False, pad_edge=False, leading=1,
                  header_style="bold")
    table.add_column("result", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("seen on this server", overflow="fold", ratio=1)
    table.add_column("what aggbox does", overflow="fold", ratio=1)
    styles = {Status.PASS: "green", Status.FAIL: "bold red", Status.UNSUPPORTED: "yellow"}
    for c in report.checks:
        # Text, not markup: server messages may contain "[".
        table.add_row(Text(c.status.value, style=styles[c.status]), Text(c.title),
                      Text(c.detail), Text(c.aggbox))
    return table


def header_lines(report: Report) -> list[str]:
    dropped = "dropped" if report.dropped else "NOT dropped: drop it yourself"
    return [f"MongoDB at {report.uri}: {report.server}",
            f"scratch database {report.database} ({dropped})"]
