"""What a fold produces (pure data): the changes to write, dead letters and parked
messages. Shared by the fold, the writer, the side-record stores and the tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aggregates.dedup import NO_CHANGES, DedupChanges
from aggregates.fold.document import Snapshot
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome

__all__ = ["Changes", "DeadLetter", "FoldResult", "Parked"]


@dataclass(frozen=True, slots=True)
class Parked:
    """A message waiting in the parked store, with why it waits."""

    message: Message
    reason: str
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that cannot be applied, with the reason code and error text."""

    message: Message | None
    raw: Any
    reason: str
    detail: str | None
    traceback: str | None = None
    aggregate_type: str | None = None
    aggregate_id: str | None = None
    #: The identity its outcome reports, for input without a valid envelope (``raw``): the
    #: line's string ``message_id``, else ``raw_message_id(raw)``. ``None``: derived from
    #: ``message`` or ``raw`` (see :func:`aggregates.store.deadletters.letter_message_id`).
    message_id: str | None = None
    #: The broker record's headers (key, value bytes) when they are part of the input — a
    #: CloudEvent in binary content mode has its attributes there, not in ``raw``. Stored
    #: with the letter and part of its identity.
    record_headers: tuple[tuple[str, bytes | None], ...] | None = None


@dataclass(slots=True)
class Changes:
    """What one fold adds to the stored document (appends only; invariant 2)."""

    state: dict[str, Any] | None = None
    #: The dedup record's part of the write, made by the aggregate type's strategy
    #: (:meth:`aggregates.dedup.DedupStrategy.changes`), with the entries it archives first.
    dedup: DedupChanges = NO_CHANGES
    outbox: list[dict[str, Any]] = field(default_factory=list)
    seq: int | None = None
    blocked: dict[str, Any] | None = None
    #: The pending timers after the fold, when it changed them (``$set`` as a whole: the
    #: write is conditional on ``_v``, and the dispatcher's removal of fired timers
    #: increments ``_v``, so the two never undo each other; docs/design.md "Timers").
    timers: list[dict[str, Any]] | None = None
    #: ``_tseq`` after the fold, when timers were scheduled.
    timer_seq: int | None = None

    @property
    def empty(self) -> bool:
        return (
            self.state is None
            and not self.dedup
            and not self.outbox
            and self.blocked is None
            and self.timers is None
        )


@dataclass(slots=True)
class FoldResult:
    snapshot: Snapshot
    changes: Changes
    outcomes: list[Outcome]
    dead_letters: list[DeadLetter]
    parked: list[Parked]
    released: list[str]
