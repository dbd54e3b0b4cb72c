"""The dedup core (pure): the in-memory dedup record, the strategy interface and
:class:`NoDedup`. The strategies live in their own modules (:mod:`aggregates.dedup.inbox`,
:mod:`aggregates.dedup.highwater`); :mod:`aggregates.dedup` is the public face of all of
it. See docs/design.md "Dedup".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

from aggregates.core.errors import AggboxError
from aggregates.core.keys import hw_key
from aggregates.message.envelope import Message

if TYPE_CHECKING:
    from pymongo.database import Database

    from aggregates.dedup.runstate import RunState

Verdict = Literal["apply", "duplicate", "dead_letter", "park"]

#: An inbox entry: ``[message_id, occurred_at | None, payload_hash | None]``.
InboxEntry = list[object]

# The dedup record's fields in the aggregate document (docs/design.md "Document layout";
# aggregates.fold.document re-exports them).
F_INBOX: Final = "inbox"
#: Newest occurred_at ever moved to the inbox archive / an undated id was moved there.
F_ARCHIVE_FLOOR: Final = "inbox_archive_floor"
F_ARCHIVE_UNDATED: Final = "inbox_archive_undated"
F_HW: Final = "hw"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reason: str | None = None
    detail: str | None = None


APPLY = Decision("apply")
DUPLICATE = Decision("duplicate")


class ArchiveNotConsulted(AggboxError):
    """A message needs the inbox archive and the caller did not look it up (a bug in the
    caller: the store writer and the helpers always do)."""


@dataclass(slots=True)
class DedupRecord:
    """The dedup part of an aggregate document, in memory.

    ``inbox`` holds ``[message_id, occurred_at, payload_hash]`` entries, newest last.
    ``archive_floor`` / ``archive_undated``: the newest ``occurred_at`` ever moved to the
    inbox archive / whether an undated entry ever was.

    ``archived`` is what the archive is known to hold (message id → payload hash) for the
    messages at hand, plus what this process archived itself; ``lookup_floor`` /
    ``lookup_undated`` are ``archive_floor`` / ``archive_undated`` of the document read that
    the lookup followed (``None``/``False`` and ``archive_known=False``: not looked up)."""

    inbox: list[InboxEntry] = field(default_factory=list)
    archive_floor: datetime | None = None
    archive_undated: bool = False
    hw: dict[str, int] = field(default_factory=dict)
    archived: dict[str, str | None] = field(default_factory=dict)
    lookup_floor: datetime | None = None
    lookup_undated: bool = False
    archive_known: bool = False
    #: Entries appended since the last write (never evicted before they are stored).
    pending: int = 0
    #: ``hw`` keys changed since the last write (a dict used as an ordered set).
    hw_changed: dict[str, None] = field(default_factory=dict)
    #: The run stamp (:mod:`aggregates.dedup.runs`); ``None``: neither the document nor the
    #: writer has one.
    run: RunState | None = None
    #: The write version an archived id was stored with (its inbox entry's fourth element),
    #: for the ids in ``archived`` that have one.
    archived_tags: dict[str, int] = field(default_factory=dict)
    _index: dict[str, str | None] | None = None

    def copy(self) -> DedupRecord:
        return DedupRecord(
            inbox=list(self.inbox), archive_floor=self.archive_floor,
            archive_undated=self.archive_undated, hw=dict(self.hw), archived=dict(self.archived),
            lookup_floor=self.lookup_floor, lookup_undated=self.lookup_undated,
            archive_known=self.archive_known,
            run=self.run.copy() if self.run is not None else None,
            archived_tags=dict(self.archived_tags) if self.archived_tags else {},
        )

    def looked_up(self, found: dict[str, str | None],
                  tags: dict[str, int] | None = None) -> None:
        """Record an archive lookup made *after* this record was read: ``found`` holds every
        message id (of those asked for) that the archive has, ``tags`` the write versions
        of those stored with one (:meth:`RecordArchive.lookup_tagged`)."""
        self.archived.update(found)
        if tags:
            self.archived_tags.update(tags)
        self.lookup_floor = self.archive_floor
        self.lookup_undated = self.archive_undated
        self.archive_known = True

    def inbox_hash(self, message_id: str) -> tuple[bool, str | None]:
        if self._index is None:
            self._index = {str(e[0]): (str(e[2]) if len(e) > 2 and e[2] else None)
                           for e in self.inbox}
        if message_id in self._index:
            return True, self._index[message_id]
        if message_id in self.archived:
            return True, self.archived[message_id]
        return False, None

    def add_inbox(self, entry: InboxEntry) -> None:
        self.inbox.append(entry)
        self.pending += 1
        if self._index is not None:
            self._index[str(entry[0])] = str(entry[2]) if entry[2] else None

    def evict(self, window: int) -> list[InboxEntry]:
        """Move the oldest entries beyond ``window`` out of the inbox, but never one that is
        not stored yet (``pending``): an id goes to the archive only once the document that
        applied it is written, so the archive never holds an id that was not applied."""
        keep = max(window, self.pending)
        excess = len(self.inbox) - keep
        if excess <= 0:
            return []
        evicted, self.inbox = self.inbox[:excess], self.inbox[excess:]
        for e in evicted:
            mid = str(e[0])
            h = str(e[2]) if len(e) > 2 and e[2] else None
            if self._index is not None:
                self._index.pop(mid, None)
            self.archived[mid] = h
            if len(e) > 3 and isinstance(e[3], int):
                self.archived_tags[mid] = e[3]
            t = e[1]
            if isinstance(t, datetime):
                if self.archive_floor is None or t > self.archive_floor:
                    self.archive_floor = t
            else:
                self.archive_undated = True
        return evicted


@dataclass(frozen=True, slots=True)
class DedupChanges:
    """What the write that stores a fold must do for the dedup record: its ``$set`` and
    ``$push`` fragments (merged into the conditional write) and the entries leaving the
    document, which the writer archives *before* that write."""

    set: Mapping[str, Any] = field(default_factory=dict)
    push: Mapping[str, Any] = field(default_factory=dict)
    archive: Sequence[InboxEntry] = ()

    def __bool__(self) -> bool:
        return bool(self.set or self.push)


#: Nothing to write for the dedup record (shared: never mutated).
NO_CHANGES: Final = DedupChanges()


class RecordArchive(ABC):
    """Where a strategy keeps ids after they left the document (I/O; one per aggregate
    collection, made by :meth:`DedupStrategy.archive`)."""

    @abstractmethod
    def ensure_indexes(self) -> None:
        """Create what the archive needs. Idempotent."""

    @abstractmethod
    def write(self, entries: Iterable[tuple[str, InboxEntry]], *, now: datetime,
              store_now: datetime | None = None) -> int:
        """Keep ``(aggregate_id, entry)`` pairs (idempotent); returns how many were sent.
        ``store_now``: the store's clock, when it is not ``now`` (for TTL fields)."""

    @abstractmethod
    def lookup(self, pairs: Sequence[tuple[str, str]]) -> dict[str, dict[str, str | None]]:
        """Which ``(aggregate_id, message_id)`` pairs are kept: aggregate id → message id →
        payload hash."""

    def lookup_tagged(self, pairs: Sequence[tuple[str, str]]
                      ) -> tuple[dict[str, dict[str, str | None]], dict[str, dict[str, int]]]:
        """:meth:`lookup`, and the write version each kept id was stored with, where it has
        one (aggregate id → message id → version; run stamps, :mod:`aggregates.dedup.runs`).
        Default: no versions."""
        return self.lookup(pairs), {}


def source_key(msg: Message) -> str | None:
    """The key of ``msg``'s source under ``hw``: :func:`aggregates.core.keys.hw_key` — type and
    id each escaped (also ``/``, so no two sources share a key), joined by ``/``."""
    if msg.source is None:
        return None
    return hw_key(msg.source.type, msg.source.id)


class DedupStrategy(ABC):
    """Base class. Subclasses are small immutable value objects."""

    name: str = "abstract"
    #: Whether :meth:`decide` and :meth:`record` use the payload hash (the fold computes it
    #: only then; other strategies get ``""``).
    uses_payload_hash: bool = False
    #: Whether a ``duplicate`` verdict proves that this very message was applied before (an
    #: id match does; a high-water mark cannot tell "applied" from "overtaken by a later
    #: seq of the same source").
    duplicate_means_applied: bool = True

    @abstractmethod
    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str, now: datetime
               ) -> Decision:
        """apply / duplicate / dead_letter / park for ``msg`` given the record; ``now`` is
        the writer's clock (the dedup horizon is measured from it)."""

    @abstractmethod
    def record(self, rec: DedupRecord, msg: Message, payload_hash: str) -> None:
        """Remember an applied message in the record."""

    def changes(self, rec: DedupRecord) -> DedupChanges:
        """Once per fold, after its messages were recorded: what the write storing ``rec``
        must set, push and archive first. May move entries out of ``rec`` (they leave the
        document with that write). Default: nothing."""
        return NO_CHANGES

    def needs_lookup(self, rec: DedupRecord, msg: Message) -> bool:
        """Whether :meth:`decide` needs the archive's answer about ``msg`` (asked by the
        writer after each read, see :meth:`DedupRecord.looked_up`). Default: never."""
        return False

    def may_need_lookup(self, rec: DedupRecord) -> bool:
        """``False`` when :meth:`needs_lookup` is ``False`` for every message given ``rec``
        (the writer then skips asking per message). Default: ``True`` (ask each)."""
        return True

    def archive(self, db: Database[Any], collection: str) -> RecordArchive | None:
        """Where ids leaving the documents of ``collection`` are kept; ``None``: nowhere."""
        return None

    def claim_key(self, msg: Message) -> str | None:
        """What identifies ``msg`` in the record for run stamps (:mod:`aggregates.dedup.runs`):
        two messages with the same key are copies of each other. Default: none."""
        return None

    def written_by(self, rec: DedupRecord, msg: Message) -> tuple[str, str] | None:
        """For a message :meth:`decide` found already recorded: its :meth:`claim_key` and
        the attempt of the record's run (``rec.run``) that recorded it, when that run did;
        ``None`` otherwise. Default: never."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoDedup(DedupStrategy):
    """For naturally idempotent messages (absolute values, set semantics)."""

    name = "none"

    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str, now: datetime
               ) -> Decision:
        return APPLY

    def record(self, rec: DedupRecord, msg: Message, payload_hash: str) -> None:
        return None
