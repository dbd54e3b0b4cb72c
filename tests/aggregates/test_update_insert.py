"""The insert of a new document (``build_update`` for a document the read did not find) is
built directly by ``new_document``; it must be exactly what an upsert of the update would
create, ``inserted_document`` of it: the same fields, in the same order (the stored bytes)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import bson
import pytest
from pymongo import InsertOne, UpdateOne

from aggbox.examples.orders.domain import customers, orders
from aggregates import AggregateType, Message
from aggregates.core.partitions import partition_of
from aggregates.dedup.runs import RunStamp, read_run
from aggregates.fold import fold
from aggregates.fold.document import (
    F_LAYOUT_VERSION,
    F_PARTITION,
    F_TYPE,
    LAYOUT_VERSION,
    Snapshot,
)
from aggregates.fold.result import Changes
from aggregates.store.update import build_update, inserted_document

NOW = datetime(2026, 1, 2, tzinfo=UTC)


def _msg(mid: str, mtype: str, agg: str, payload: dict[str, Any],
         source: dict[str, Any] | None = None) -> Message:
    d: dict[str, Any] = {"message_id": mid, "type": mtype, "aggregate_type": agg.split("/")[0],
                         "aggregate_id": agg.split("/")[1], "payload": payload,
                         "occurred_at": "2026-01-01T00:00:00Z"}
    if source is not None:
        d["source"] = source
    return Message.from_dict(d)


def _reference(atype: AggregateType[Any], snap: Snapshot, ch: Changes) -> dict[str, Any]:
    """What the upsert of the update would insert: the update of an existing document
    (version 1: the filter does not matter here) with the new document's ``$setOnInsert``."""
    op = build_update(atype, Snapshot(aggregate_id=snap.aggregate_id, version=1), ch)
    assert isinstance(op, UpdateOne)
    assert isinstance(op._doc, dict)
    update: dict[str, Any] = dict(op._doc)
    update["$setOnInsert"] = {F_TYPE: atype.name, F_PARTITION: partition_of(snap.aggregate_id),
                              F_LAYOUT_VERSION: LAYOUT_VERSION}
    return inserted_document(snap.aggregate_id, snap.version, update)


def _changes(case: str) -> tuple[AggregateType[Any], Snapshot, Changes]:
    if case == "customer":  # state, outbox, inbox push with $slice
        msgs = [_msg("r", "CustomerRegistered", "Customer/c1",
                     {"name": "C", "credit_limit": 1000})]
        msgs += [_msg(f"o{k}", "OrderCreated", "Customer/c1",
                      {"order_id": f"o-{k}", "amount": 100 + k}) for k in range(3)]
        atype: AggregateType[Any] = customers
        snap = Snapshot(aggregate_id="c1")
    elif case == "order":  # high-water marks (dotted hw.<key> paths), a timer
        msgs = [_msg("p1", "PlaceOrder", "Order/o-1", {"customer_id": "c1", "amount": 5},
                     source={"type": "Web", "id": "w/1", "seq": 3})]
        atype, snap = orders, Snapshot(aggregate_id="o-1")
    else:  # a run stamp: the dedup record's $set holds _run
        msgs = [_msg("r", "CustomerRegistered", "Customer/c2",
                     {"name": "D", "credit_limit": 10})]
        atype, snap = customers, Snapshot(aggregate_id="c2")
        snap.dedup.run = read_run(None, RunStamp("run-1", "a1"), None)
    res = fold(atype, snap, msgs, now=NOW)
    return atype, snap, res.changes


@pytest.mark.parametrize("case", ["customer", "order", "stamped"])
def test_new_document_is_the_upserts_document(case: str) -> None:
    atype, snap, ch = _changes(case)
    op = build_update(atype, snap, ch)
    assert isinstance(op, InsertOne)
    expected = _reference(atype, snap, ch)
    assert op._doc == expected
    assert bson.encode(op._doc) == bson.encode(expected)  # the same order of fields
    assert list(op._doc) == list(expected)
