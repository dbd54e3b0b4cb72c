"""What a demo run records: per pipeline round and per dispatcher drain (plain data, so the
checks can be tested without Spark)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DrainResult", "OutcomeRow", "RoundResult", "RunRecord", "read_records"]


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """One row of the pipeline's outcome log (``spark.schema.OUTCOME_SCHEMA``)."""

    message_id: str
    aggregate_type: str | None
    aggregate_id: str | None
    outcome: str
    reason: str | None = None
    emitted_ids: tuple[str, ...] = ()
    from_parked: bool = False

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any]) -> OutcomeRow:
        return cls(
            message_id=str(row["message_id"]),
            aggregate_type=row.get("aggregate_type"),
            aggregate_id=row.get("aggregate_id"),
            outcome=str(row["outcome"]),
            reason=row.get("reason"),
            emitted_ids=tuple(row.get("emitted_ids") or ()),
            from_parked=bool(row.get("from_parked")),
        )


@dataclass(slots=True)
class RoundResult:
    """One pipeline run. ``lines`` are the records of its input as the demo read them
    (non-blank lines); ``counts`` are the pipeline's own."""

    number: int
    inputs: list[Path]
    lines: list[str]
    counts: dict[str, int]
    outcomes: list[OutcomeRow]
    seconds: float = 0.0
    #: copies of earlier published records added to this round's input (redelivery)
    redelivered: int = 0


@dataclass(slots=True)
class DrainResult:
    """One dispatcher run (``--once``) after round ``number``: the records it wrote."""

    number: int
    directory: Path
    published: int
    dead_lettered: int
    records: list[str]
    pending: int
    seconds: float = 0.0


@dataclass(slots=True)
class RunRecord:
    rounds: list[RoundResult] = field(default_factory=list)
    drains: list[DrainResult] = field(default_factory=list)
    #: the loop stopped because nothing was left to do (not because of --max-rounds)
    settled: bool = False


def read_records(paths: list[Path]) -> list[str]:
    """The records (non-blank lines) of JSON Lines files and directories of them, files in
    name order; hidden files (``.tmp-…``) are skipped, as Spark skips them."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(sorted(f for f in p.iterdir()
                                if f.is_file() and not f.name.startswith((".", "_"))))
        elif p.exists():
            files.append(p)
    out: list[str] = []
    for f in files:
        with f.open(encoding="utf-8") as fh:
            out.extend(line.rstrip("\n") for line in fh if line.strip())
    return out
