"""The one conditional write per aggregate per slice (docs/design.md "The writer", step 4):
an update filtered on the version read, or, for a document the read did not find, the insert
of the document that update would create (conditional on ``_id`` being free)."""

from __future__ import annotations

from typing import Any

from pymongo import InsertOne, UpdateOne

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

__all__ = ["WriteOp", "build_update", "inserted_document", "new_document"]

#: What :func:`build_update` returns: an update of a document read, or an insert of a new one.
WriteOp = UpdateOne | InsertOne[dict[str, Any]]


def build_update(atype: AggregateType[Any], snap: Snapshot, ch: Changes) -> WriteOp:
    """The one conditional write for one aggregate: appends only for the outbox and the
    dedup record (invariant 2), everything conditional on the version that was read
    (invariant 1). The dedup record's part (``$set``/``$push``) is the strategy's own
    (:meth:`aggregates.dedup.DedupStrategy.changes`).

    A document the read did not find is inserted: :func:`inserted_document` of the update,
    exactly what the upsert would create, and with the same failure when another writer
    created it meanwhile (``E11000`` on ``_id``: a version conflict). An insert skips the
    upsert's query; on the embedded local server it costs the server about half as much."""
    if not snap.exists:
        return InsertOne(new_document(atype, snap, ch))
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


def new_document(atype: AggregateType[Any], snap: Snapshot, ch: Changes) -> dict[str, Any]:
    """The document :func:`build_update` inserts for ``snap``, which the read did not find:
    ``inserted_document(snap.aggregate_id, snap.version, update)`` of the update it would
    build (an upsert's ``$setOnInsert`` included), the same fields in the same order, built
    directly (tests/aggregates/test_update_insert.py holds the two equal)."""
    aid = snap.aggregate_id
    # Written once: the partition and the layout version never change (docs/design.md
    # "Document layout", "Compatibility").
    doc: dict[str, Any] = {"_id": aid, F_VERSION: snap.version + 1, F_TYPE: atype.name,
                           F_PARTITION: partition_of(aid), F_LAYOUT_VERSION: LAYOUT_VERSION}
    if ch.state is not None:
        doc[F_STATE] = ch.state
        doc[F_STATE_VERSION] = atype.state_version
    if ch.seq is not None:
        doc[F_SEQ] = ch.seq
    if ch.blocked is not None:
        doc[F_BLOCKED] = ch.blocked
    if ch.timers is not None:
        doc[F_TIMERS] = ch.timers
    if ch.timer_seq is not None:
        doc[F_TIMER_SEQ] = ch.timer_seq
    dedup = ch.dedup
    for path, value in dedup.set.items():
        if "." in path:
            _put(doc, path, value)
        else:
            doc[path] = value
    if ch.outbox:
        doc[F_OUTBOX] = list(ch.outbox)
    for path, spec in dedup.push.items():
        _put(doc, path, _pushed(spec))
    return doc


def _pushed(spec: Any) -> list[Any]:
    """What a ``$push`` of ``spec`` (``$each``, optional ``$slice``) puts in a new array."""
    items = spec["$each"]
    cut = spec.get("$slice")
    if cut is not None:
        items = items[cut:] if cut < 0 else items[:cut]
    return list(items)


def inserted_document(aggregate_id: str, version: int, update: dict[str, Any]
                      ) -> dict[str, Any]:
    """The document an upsert of ``update`` (as :func:`build_update` builds it: ``$inc`` of
    ``_v``, ``$setOnInsert``, ``$set``, ``$push`` with ``$each`` and ``$slice``) with filter
    ``{_id: aggregate_id, _v: version}`` inserts when no document matches (MongoDB's rule:
    the filter's equality fields, then the operators). Dotted paths (``hw.<key>``) nest."""
    doc: dict[str, Any] = {"_id": aggregate_id,
                           F_VERSION: version + update.get("$inc", {}).get(F_VERSION, 0)}
    for op in ("$setOnInsert", "$set"):
        for path, value in update.get(op, {}).items():
            if "." in path:
                _put(doc, path, value)
            else:
                doc[path] = value
    for path, spec in update.get("$push", {}).items():
        _put(doc, path, _pushed(spec))
    return doc


def _put(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for name in parents:
        doc = doc.setdefault(name, {})
    doc[last] = value
