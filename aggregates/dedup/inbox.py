"""The inbox dedup strategy (pure): exact dedup by message id within the dedup horizon,
newest ids in the document, older ones in the inbox archive (docs/design.md "Dedup")."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from aggregates.core.errors import ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.dedup.core import (
    APPLY,
    DUPLICATE,
    F_ARCHIVE_FLOOR,
    F_ARCHIVE_UNDATED,
    F_INBOX,
    NO_CHANGES,
    ArchiveNotConsulted,
    Decision,
    DedupChanges,
    DedupRecord,
    DedupStrategy,
    InboxEntry,
    RecordArchive,
)
from aggregates.message.envelope import Message

if TYPE_CHECKING:
    from pymongo.database import Database

__all__ = ["Inbox", "needs_archive"]


def needs_archive(rec: DedupRecord, msg: Message, *, always: bool = False) -> bool:
    """Whether the inbox archive must be asked about ``msg``: it is not in the inbox, and it
    could have been archived before ``rec`` was read (its ``occurred_at`` is not after the
    newest archived one, or it is undated and an undated entry was archived). Messages
    newer than everything ever archived are new without asking — unless ``always``
    (``Inbox(lookup="always")``): then every message not in the inbox of an aggregate that
    has archived ids is asked about, whatever its ``occurred_at``."""
    if always:
        if rec.archive_floor is None and not rec.archive_undated:
            return False
    elif not _could_be_archived(msg.occurred_at, rec.archive_floor, rec.archive_undated):
        return False
    found, _ = rec.inbox_hash(msg.message_id)
    return not found


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
                 clock_skew: timedelta = timedelta(minutes=5),
                 lookup: Literal["by_time", "always"] = "by_time") -> None:
        if not isinstance(window, int) or window < 1:
            raise ConfigurationError("Inbox(window=...) must be an int ≥ 1")
        if not isinstance(horizon, timedelta) or horizon <= timedelta(0):
            raise ConfigurationError("Inbox(horizon=...) must be a positive timedelta, "
                                     "e.g. timedelta(days=7)")
        if not isinstance(clock_skew, timedelta) or clock_skew < timedelta(0):
            raise ConfigurationError("Inbox(clock_skew=...) must be a timedelta ≥ 0: the "
                                     "largest difference between the writers' and the "
                                     "MongoDB servers' clocks")
        if lookup not in ("by_time", "always"):
            raise ConfigurationError(f"Inbox(lookup=...) must be 'by_time' or 'always', got "
                                     f"{lookup!r}")
        self.window = window
        self.horizon = horizon
        self.clock_skew = clock_skew
        #: ``"by_time"``: the archive is asked only about messages not newer than the newest
        #: archived one (a redelivery carries its first ``occurred_at``); ``"always"``: about
        #: every message not in the inbox once ids were archived — for producers that
        #: re-stamp ``occurred_at`` when they resend (docs/design.md "Dedup").
        self.lookup = lookup

    def decide(self, rec: DedupRecord, msg: Message, payload_hash: str, now: datetime
               ) -> Decision:
        seen, first_hash = rec.inbox_hash(msg.message_id)
        if seen:
            if first_hash is not None and first_hash != payload_hash:
                return Decision(
                    "dead_letter",
                    Reason.DUPLICATE_WITH_DIFFERENT_PAYLOAD,
                    f"message id {msg.message_id!r} was already applied with a different "
                    f"payload (hash {first_hash}, now {payload_hash}); the producer reuses ids",
                )
            return DUPLICATE
        t = msg.occurred_at
        if not rec.archive_known:
            if self.needs_lookup(rec, msg):
                raise ArchiveNotConsulted(
                    f"message {msg.message_id!r} needs the inbox archive and it was not looked "
                    "up; use StoreWriter, AggregateHarness or replay(), which do")
        elif (_could_be_archived(t, rec.lookup_floor, rec.lookup_undated)
              and t is not None and t < now - self.horizon):
            # Could have been archived, is not there, and is older than the horizon: its
            # archive entry may have expired, so it cannot be proven new.
            return Decision(
                "dead_letter", Reason.BEYOND_DEDUP_HORIZON,
                f"occurred_at {t.isoformat()} is more than the dedup horizon "
                f"({_span(self.horizon)}) before now and the message is in neither the "
                "inbox nor the inbox archive: it may have been applied before and "
                "forgotten. If it was, dismiss it (aggbox deadletters dismiss --reason "
                "beyond_dedup_horizon); if it is new, resend it with a current "
                "occurred_at, or raise Inbox(horizon=...)",
            )
        return APPLY

    def record(self, rec: DedupRecord, msg: Message, payload_hash: str) -> None:
        # The entry keeps the message's own occurred_at (None when it has none): the archive
        # floor must only ever hold producers' times, never our processing time.
        rec.add_inbox([msg.message_id, msg.occurred_at, payload_hash])

    def changes(self, rec: DedupRecord) -> DedupChanges:
        """Push the entries this fold added, keeping the window but never dropping one it
        adds (``$slice``, the same rule as :meth:`DedupRecord.evict`, so the stored inbox
        equals the one in memory); the older entries that leave go to the archive first,
        and the archive floor moves with them."""
        added = rec.pending
        if not added:
            return NO_CHANGES
        run = rec.run
        if run is not None and run.stamp is not None:
            # Run stamps: each entry this write adds carries the write's _v (fourth element).
            for e in rec.inbox[-added:]:
                if len(e) == 3:
                    e.append(run.write_version)
        floor, undated = rec.archive_floor, rec.archive_undated
        evicted = rec.evict(self.window)
        set_: dict[str, Any] = {}
        if rec.archive_floor != floor:
            set_[F_ARCHIVE_FLOOR] = rec.archive_floor
        if rec.archive_undated and not undated:
            set_[F_ARCHIVE_UNDATED] = True
        push = {F_INBOX: {"$each": rec.inbox[-added:], "$slice": -max(self.window, added)}}
        return DedupChanges(set_, push, evicted)

    def needs_lookup(self, rec: DedupRecord, msg: Message) -> bool:
        return needs_archive(rec, msg, always=self.lookup == "always")

    def may_need_lookup(self, rec: DedupRecord) -> bool:
        # needs_archive is False for every message of a record that never archived an id.
        return rec.archive_floor is not None or rec.archive_undated

    def claim_key(self, msg: Message) -> str | None:
        return msg.message_id

    def written_by(self, rec: DedupRecord, msg: Message) -> tuple[str, str] | None:
        run = rec.run
        if run is None:
            return None
        mid = msg.message_id
        if run.inbox_tags is None:
            run.inbox_tags = {str(e[0]): e[3] for e in rec.inbox if len(e) > 3}
        label = run.by_version(run.inbox_tags.get(mid, rec.archived_tags.get(mid)))
        return None if label is None else (mid, label)

    def archive(self, db: Database[Any], collection: str) -> RecordArchive:
        from aggregates.dedup.archive import InboxArchive  # I/O: not imported by the pure parts

        return InboxArchive(db, collection, self)

    def expire_at(self, entry: InboxEntry, now: datetime) -> datetime | None:
        """When the archive may forget ``entry`` (evicted at ``now``): ``None`` = never
        (undated ids: no horizon can be measured for them)."""
        t = entry[1]
        if not isinstance(t, datetime):
            return None
        return max(t, now) + self.horizon + self.clock_skew

    def __repr__(self) -> str:
        lookup = ", lookup='always'" if self.lookup == "always" else ""
        return f"Inbox(window={self.window}, horizon={_span(self.horizon)}{lookup})"


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
