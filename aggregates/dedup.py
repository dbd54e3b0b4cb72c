"""Dedup strategies (pure logic, no I/O). Chosen per aggregate type; see docs/design.md
"Dedup".

A strategy looks at the aggregate's in-memory dedup record and one message and decides:
apply, duplicate, dead-letter (with reason) or park (with reason). After an apply it
records the message so later copies are recognised.

The inbox strategy keeps the newest ids in the document and moves older ones to the
per-collection **inbox archive** (written before the document write that evicts them; kept
for the dedup horizon). What the archive holds for the messages at hand is looked up by the
store writer (one query per chunk) and handed to the record as :attr:`DedupRecord.archived`;
the decision itself stays pure.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from aggregates.envelope import Message
from aggregates.errors import AggboxError, ConfigurationError
from aggregates.keys import hw_key

Verdict = Literal["apply", "duplicate", "dead_letter", "park"]

# Reason codes (stable strings: they end up in dead letters, parked entries and outcomes).
DUPLICATE_DIFFERENT_PAYLOAD = "duplicate_with_different_payload"
BEYOND_DEDUP_HORIZON = "beyond_dedup_horizon"
MISSING_SOURCE = "missing_source"
SEQUENCE_GAP = "sequence_gap"
HIGH_WATER_MAP_FULL = "high_water_map_full"

#: An inbox entry: ``[message_id, occurred_at | None, payload_hash | None]``.
InboxEntry = list[object]


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
    inbox archive / whether an undated entry ever was. ``legacy_floor`` /
    ``legacy_undated``: the same for entries evicted *without* an archive by aggbox 0.1
    (documents written before the archive existed; read, never written).

    ``archived`` is what the archive is known to hold (message id → payload hash) for the
    messages at hand, plus what this process archived itself; ``lookup_floor`` /
    ``lookup_undated`` are ``archive_floor`` / ``archive_undated`` of the document read that
    the lookup followed (``None``/``False`` and ``archive_known=False``: not looked up)."""

    inbox: list[InboxEntry] = field(default_factory=list)
    archive_floor: datetime | None = None
    archive_undated: bool = False
    legacy_floor: datetime | None = None
    legacy_undated: bool = False
    hw: dict[str, int] = field(default_factory=dict)
    archived: dict[str, str | None] = field(default_factory=dict)
    lookup_floor: datetime | None = None
    lookup_undated: bool = False
    archive_known: bool = False
    #: Entries appended since the last write (never evicted before they are stored).
    pending: int = 0
    _index: dict[str, str | None] | None = None

    def copy(self) -> DedupRecord:
        return DedupRecord(
            inbox=list(self.inbox), archive_floor=self.archive_floor,
            archive_undated=self.archive_undated, legacy_floor=self.legacy_floor,
            legacy_undated=self.legacy_undated, hw=dict(self.hw), archived=dict(self.archived),
            lookup_floor=self.lookup_floor, lookup_undated=self.lookup_undated,
            archive_known=self.archive_known,
        )

    def looked_up(self, found: dict[str, str | None]) -> None:
        """Record an archive lookup made *after* this record was read: ``found`` holds every
        message id (of those asked for) that the archive has."""
        self.archived.update(found)
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
            t = e[1]
            if isinstance(t, datetime):
                if self.archive_floor is None or t > self.archive_floor:
                    self.archive_floor = t
            else:
                self.archive_undated = True
        return evicted


def needs_archive(rec: DedupRecord, msg: Message) -> bool:
    """Whether the inbox archive must be asked about ``msg``: it is not in the inbox, and it
    could have been archived before ``rec`` was read (its ``occurred_at`` is not after the
    newest archived one, or it is undated and an undated entry was archived). Messages
    newer than everything ever archived are new without asking."""
    if not _could_be_archived(msg.occurred_at, rec.archive_floor, rec.archive_undated):
        return False
    found, _ = rec.inbox_hash(msg.message_id)
    return not found


def source_key(msg: Message) -> str | None:
    """The key of ``msg``'s source under ``hw``: :func:`aggregates.keys.hw_key` — type and
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

    @abstractmethod
    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str, now: datetime
               ) -> Decision:
        """apply / duplicate / dead_letter / park for ``msg`` given the record; ``now`` is
        the writer's clock (the dedup horizon is measured from it)."""

    @abstractmethod
    def record(self, rec: DedupRecord, msg: Message, payload_hash: str) -> None:
        """Remember an applied message in the record."""

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


class Inbox(DedupStrategy):
    """Exact dedup by message id within the dedup horizon.

    The document keeps the newest ``window`` ids; older ids move to the collection's inbox
    archive, which keeps each for ``horizon`` (plus ``clock_skew``) after the message
    occurred or left the document, whichever is later; undated ids are kept for good. A
    message is refused only when it is not in the inbox, not in the archive, could have
    been archived (see :func:`needs_archive`) and occurred more than ``horizon`` ago:
    then it is dead-lettered as ``beyond_dedup_horizon``. docs/design.md "Dedup" has the
    argument."""

    name = "inbox"
    uses_payload_hash = True

    def __init__(self, *, window: int = 1000, horizon: timedelta = timedelta(days=7),
                 clock_skew: timedelta = timedelta(minutes=5)) -> None:
        if not isinstance(window, int) or window < 1:
            raise ConfigurationError("Inbox(window=...) must be an int ≥ 1")
        if not isinstance(horizon, timedelta) or horizon <= timedelta(0):
            raise ConfigurationError("Inbox(horizon=...) must be a positive timedelta, "
                                     "e.g. timedelta(days=7)")
        if not isinstance(clock_skew, timedelta) or clock_skew < timedelta(0):
            raise ConfigurationError("Inbox(clock_skew=...) must be a timedelta ≥ 0: the "
                                     "largest difference between the writers' and the "
                                     "MongoDB servers' clocks")
        self.window = window
        self.horizon = horizon
        self.clock_skew = clock_skew

    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str, now: datetime
               ) -> Decision:
        seen, first_hash = rec.inbox_hash(msg.message_id)
        if seen:
            if first_hash is not None and first_hash != payload_hash:
                return Decision(
                    "dead_letter",
                    DUPLICATE_DIFFERENT_PAYLOAD,
                    f"message id {msg.message_id!r} was already applied with a different "
                    f"payload (hash {first_hash}, now {payload_hash}); the producer reuses ids",
                )
            return DUPLICATE
        t = msg.occurred_at
        if not rec.archive_known:
            if needs_archive(rec, msg):
                raise ArchiveNotConsulted(
                    f"message {msg.message_id!r} needs the inbox archive and it was not looked "
                    "up; use StoreWriter, AggregateHarness or replay(), which do")
        elif (_could_be_archived(t, rec.lookup_floor, rec.lookup_undated)
              and t is not None and t < now - self.horizon):
            # Could have been archived, is not there, and is older than the horizon: its
            # archive entry may have expired, so it cannot be proven new.
            return Decision(
                "dead_letter", BEYOND_DEDUP_HORIZON,
                f"occurred_at {t.isoformat()} is more than the dedup horizon "
                f"({_span(self.horizon)}) before now and the message is in neither the "
                "inbox nor the inbox archive: it may have been applied before and "
                "forgotten. If it was, dismiss it (aggbox deadletters dismiss --reason "
                "beyond_dedup_horizon); if it is new, resend it with a current "
                "occurred_at, or raise Inbox(horizon=...)",
            )
        if (t is None and rec.legacy_undated) or (
                t is not None and rec.legacy_floor is not None and t <= rec.legacy_floor):
            return Decision(
                "dead_letter", BEYOND_DEDUP_HORIZON,
                f"not in the inbox, and occurred_at {t.isoformat() if t else '(none)'} is "
                f"not after {rec.legacy_floor.isoformat() if rec.legacy_floor else 'the'} "
                "floor of ids evicted before the inbox archive existed (a document written "
                "by aggbox 0.1): it cannot be proven new. If it was applied before, dismiss "
                "it; if it is new, resend it with a current occurred_at",
            )
        return APPLY

    def record(self, rec: DedupRecord, msg: Message, payload_hash: str) -> None:
        # The entry keeps the message's own occurred_at (None when it has none): the archive
        # floor must only ever hold producers' times, never our processing time.
        rec.add_inbox([msg.message_id, msg.occurred_at, payload_hash])

    def expire_at(self, entry: InboxEntry, now: datetime) -> datetime | None:
        """When the archive may forget ``entry`` (evicted at ``now``): ``None`` = never
        (undated ids: no horizon can be measured for them)."""
        t = entry[1]
        if not isinstance(t, datetime):
            return None
        return max(t, now) + self.horizon + self.clock_skew

    def __repr__(self) -> str:
        return f"Inbox(window={self.window}, horizon={_span(self.horizon)})"


def _could_be_archived(t: datetime | None, floor: datetime | None, undated: bool) -> bool:
    if t is None:
        return undated
    return floor is not None and t <= floor


def _span(d: timedelta) -> str:
    s = int(d.total_seconds())
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n and s % n == 0:
            return f"{s // n}{unit}"
    return f"{d.total_seconds():g}s"


class HighWater(DedupStrategy):
    """Per source aggregate keep the highest applied ``source.seq``.

    ``monotonic``: any ``seq > hw`` applies (needs per-source ordered delivery).
    ``contiguous``: only ``hw + 1`` applies; later ones are parked until the gap fills."""

    name = "high-water"

    def __init__(
        self, *, mode: Literal["monotonic", "contiguous"] = "monotonic", max_sources: int = 10_000
    ) -> None:
        if mode not in ("monotonic", "contiguous"):
            raise ConfigurationError("HighWater(mode=...) is 'monotonic' or 'contiguous'")
        if max_sources < 1:
            raise ConfigurationError("HighWater(max_sources=...) must be ≥ 1")
        self.mode = mode
        self.max_sources = max_sources

    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str, now: datetime
               ) -> Decision:
        key = source_key(msg)
        if key is None or msg.source is None:
            return Decision(
                "dead_letter",
                MISSING_SOURCE,
                "high-water dedup needs source {type, id, seq} on every message",
            )
        hw = rec.hw.get(key, 0)
        seq = msg.source.seq
        if seq <= hw:
            return DUPLICATE
        if key not in rec.hw and len(rec.hw) >= self.max_sources:
            return Decision(
                "dead_letter",
                HIGH_WATER_MAP_FULL,
                f"the high-water map already tracks {self.max_sources} sources; raise "
                "HighWater(max_sources=...) or use the inbox strategy for this aggregate type",
            )
        if self.mode == "contiguous" and seq != hw + 1:
            return Decision(
                "park", SEQUENCE_GAP, f"expected seq {hw + 1} from {key}, got {seq}"
            )
        return APPLY

    def record(self, rec: DedupRecord, msg: Message, payload_hash: str) -> None:
        key = source_key(msg)
        assert key is not None and msg.source is not None
        rec.hw[key] = max(rec.hw.get(key, 0), msg.source.seq)

    def __repr__(self) -> str:
        return f"HighWater(mode={self.mode!r}, max_sources={self.max_sources})"
