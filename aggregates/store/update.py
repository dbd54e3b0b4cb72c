"""The one conditional write per aggregate per slice (docs/design.md "The writer", step 4)."""

from __future__ import annotations

from typing import Any

from pymongo import UpdateOne

from aggregates.core.partitions import partition_of
from aggregates.domain.aggregate import AggregateType
from aggregates.fold.document import (
    F_BLOCKED,
    F_LAYOUT_VERSION,
    F_OUTBOX,
    F_PARTITION,
    F_SEQ,
    F_STATE,
    F_STATE_VERSION,
    F_TIMER_SEQ,
    F_TIMERS,
    F_TYPE,
    F_VERSION,
    LAYOUT_VERSION,
    Snapshot,
)
from aggregates.fold.result import Changes

__all__ = ["build_update"]


def build_update(atype: AggregateType[Any], snap: Snapshot, ch: Changes) -> UpdateOne:
    """The one conditional write for one aggregate: appends only for the outbox and the
    dedup record (invariant 2), everything conditional on the version that was read
    (invariant 1). The dedup record's part (``$set``/``$push``) is the strategy's own
    (:meth:`aggregates.dedup.DedupStrategy.changes`)."""
    set_: dict[str, Any] = {}
    if ch.state is not None:
        set_[F_STATE] = ch.state
        # The state is always written in the current shape (migrated on load if older).
        set_[F_STATE_VERSION] = atype.state_version
    if ch.seq is not None:
        set_[F_SEQ] = ch.seq
    if ch.blocked is not None:
        set_[F_BLOCKED] = ch.blocked
    if ch.timers is not None:
        set_[F_TIMERS] = ch.timers
    if ch.timer_seq is not None:
        set_[F_TIMER_SEQ] = ch.timer_seq
    set_.update(ch.dedup.set)
    update: dict[str, Any] = {"$inc": {F_VERSION: 1}}
    if not snap.exists:
        # Written once: the partition and the layout version never change (docs/design.md
        # "Document layout", "Compatibility").
        update["$setOnInsert"] = {F_TYPE: atype.name,
                                  F_PARTITION: partition_of(snap.aggregate_id),
                                  F_LAYOUT_VERSION: LAYOUT_VERSION}
    if set_:
        update["$set"] = set_
    push: dict[str, Any] = {}
    if ch.outbox:
        push[F_OUTBOX] = {"$each": ch.outbox}
    push.update(ch.dedup.push)
    if push:
        update["$push"] = push
    # Filter on _id and _v only, equality only: with upsert=True a stale _v makes the
    # insert collide on _id (E11000 at this op's index), a missing document is inserted.
    return UpdateOne({"_id": snap.aggregate_id, F_VERSION: snap.version}, update, upsert=True)
