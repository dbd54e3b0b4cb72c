"""What a read of the change stream makes of its events (dispatcher/outbox/changes.py, pure;
docs/design.md "How stream mode finds new entries"): a view of the outbox where the events
show a prefix of it, a read otherwise — never a view that starts after an entry it does
not show."""

from __future__ import annotations

from typing import Any

import pytest
from bson import Timestamp

from aggregates.core.partitions import partition_of
from dispatcher.outbox.changes import ChangeSet, DocMeta, NoDocumentKey


def e(i: int) -> dict[str, Any]:
    return {"id": f"m{i}"}


def insert(key: str, *entries: dict[str, Any], p: int | None = 3,
           atype: str = "Order") -> dict[str, Any]:
    doc: dict[str, Any] = {"_id": key, "_type": atype, "outbox": list(entries)}
    if p is not None:
        doc["_p"] = p
    return {"operationType": "insert", "documentKey": {"_id": key}, "fullDocument": doc}


def update(key: str, fields: dict[str, Any], removed: tuple[str, ...] = (),
           truncated: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """An update event as MongoDB reports it."""
    return {"operationType": "update", "documentKey": {"_id": key},
            "updateDescription": {"updatedFields": fields, "removedFields": list(removed),
                                  "truncatedArrays": list(truncated)}}


def changes(*events: dict[str, Any], meta: DocMeta | None = None,
            parts: frozenset[int] | None = None, fresh_after: Timestamp | None = None,
            looked_up: bool = False) -> tuple[list[Any], list[Any]]:
    cs = ChangeSet(meta if meta is not None else DocMeta(), lambda: parts,
                   fresh_after=fresh_after, looked_up=looked_up)
    for event in events:
        cs.add(event)
    return cs.resolve()


def known(*keys: str, p: int = 3) -> DocMeta:
    meta = DocMeta()
    for key in keys:
        meta.learn({"_id": key, "_type": "Order", "_p": p})
    return meta


def test_an_insert_is_its_own_view_and_teaches_type_and_partition() -> None:
    meta = DocMeta()
    views, reads = changes(insert("a", e(1), e(2)), meta=meta)
    assert views == [{"_id": "a", "_type": "Order", "_p": 3, "outbox": [e(1), e(2)]}]
    assert reads == []
    assert meta.view("a", [e(3)]) == {"_id": "a", "_type": "Order", "_p": 3, "outbox": [e(3)]}


def test_an_append_to_an_empty_outbox_is_a_view_of_the_whole_outbox() -> None:
    views, reads = changes(update("a", {"outbox.0": e(1), "outbox.1": e(2)}), meta=known("a"))
    assert views == [{"_id": "a", "_type": "Order", "_p": 3, "outbox": [e(1), e(2)]}]
    assert reads == []


def test_an_append_after_entries_it_does_not_show_is_read() -> None:
    """``outbox.2`` alone: entries 0 and 1 are pending or not, unknown — publishing m3 now
    could put it before them."""
    views, reads = changes(update("a", {"outbox.2": e(3)}), meta=known("a"))
    assert views == [] and reads == ["a"]


def test_appends_that_follow_a_known_prefix_in_the_same_read_extend_it() -> None:
    views, reads = changes(update("a", {"outbox.0": e(1)}), update("a", {"outbox.1": e(2)}),
                           update("a", {"outbox.2": e(3), "outbox.3": e(4)}),
                           meta=known("a"))
    assert [v["outbox"] for v in views] == [[e(1), e(2), e(3), e(4)]] and reads == []


def test_a_gap_in_the_indexes_is_read() -> None:
    views, reads = changes(update("a", {"outbox.0": e(1)}), update("a", {"outbox.2": e(3)}),
                           meta=known("a"))
    assert views == [] and reads == ["a"]


def test_a_whole_outbox_is_a_view_and_an_empty_one_publishes_nothing() -> None:
    views, reads = changes(update("a", {"outbox": [e(2), e(3)]}),
                           update("b", {"outbox": []}), meta=known("a", "b"))
    assert [v["_id"] for v in views] == ["a"] and views[0]["outbox"] == [e(2), e(3)]
    assert reads == []


@pytest.mark.parametrize("event", [
    update("a", {"outbox.0.payload": 1}),  # a deeper path
    update("a", {"outbox.0": e(1)}, truncated=({"field": "outbox", "newSize": 1},)),
    {"operationType": "update", "documentKey": {"_id": "a"}},  # no update description
])
def test_what_an_event_cannot_show_as_a_prefix_is_read(event: dict[str, Any]) -> None:
    views, reads = changes(event, meta=known("a"))
    assert views == [] and reads == ["a"]


def test_a_removed_outbox_or_an_update_of_other_fields_publishes_nothing() -> None:
    views, reads = changes(update("a", {}, removed=("outbox",)), update("b", {"_v": 3}),
                           meta=known("a", "b"))
    assert views == [] and reads == []


def test_a_document_whose_type_and_partition_are_not_known_is_read() -> None:
    views, reads = changes(update("a", {"outbox.0": e(1)}))
    assert views == [] and reads == ["a"]


def test_the_last_event_of_a_document_decides_and_orders_it() -> None:
    views, reads = changes(update("a", {"outbox.3": e(4)}), update("b", {"outbox.0": e(1)}),
                           update("a", {"outbox": [e(4)]}), meta=known("a", "b"))
    assert [v["_id"] for v in views] == ["b", "a"] and reads == []


def test_a_partition_update_is_remembered() -> None:
    meta = DocMeta()
    meta.learn({"_id": "a", "_type": "Order"})  # no _p: partition 0
    views, _ = changes(update("a", {"_p": 7, "outbox.0": e(1)}), meta=meta)
    assert views[0]["_p"] == 7
    views, _ = changes(update("a", {"outbox.0": e(2)}), meta=meta, parts=frozenset({7}))
    assert views[0]["_p"] == 7


def test_documents_of_partitions_not_held_are_neither_viewed_nor_read() -> None:
    mine, theirs = "a", next(k for k in (f"k{i}" for i in range(1000))
                             if partition_of(k) not in (0, partition_of("a")))
    parts = frozenset({partition_of(mine)})
    meta = known(mine, p=partition_of(mine))
    views, reads = changes(update(mine, {"outbox.0": e(1)}),
                           update(theirs, {"outbox.0": e(2)}), meta=meta, parts=parts)
    assert [v["_id"] for v in views] == [mine] and reads == []
    # Partition 0 also holds the documents without _p: an unknown one is read to know.
    views, reads = changes(update(theirs, {"outbox.0": e(2)}), parts=frozenset({0}))
    assert views == [] and reads == [theirs]


def test_a_view_without_a_partition_field_is_partition_0() -> None:
    meta = DocMeta()
    meta.learn({"_id": "a", "_type": "Order"})
    views, _ = changes(update("a", {"outbox.0": e(1)}), meta=meta, parts=frozenset({0}))
    assert views == [{"_id": "a", "_type": "Order", "outbox": [e(1)]}]  # no _p: fence 0
    views, _ = changes(update("a", {"outbox.0": e(1)}), meta=meta, parts=frozenset({5}))
    assert views == []


def test_a_looked_up_document_is_a_view() -> None:
    looked_up = {"operationType": "update", "fullDocument": {"_id": "a", "outbox": [e(1)]}}
    views, reads = changes(looked_up)
    assert views == [{"_id": "a", "outbox": [e(1)]}] and reads == []


def test_an_update_event_that_names_no_document_asks_for_lookup() -> None:
    """mongo-java-server's own oplog: the documentKey of an update is the update."""
    stock = {"operationType": "update", "documentKey": {"$inc": {"_v": 1}},
             "fullDocument": {"state": {"n": 1}}}
    with pytest.raises(NoDocumentKey):
        changes(stock)


def test_remembered_documents_are_bounded() -> None:
    meta = DocMeta(capacity=3)
    for key in "abcd":
        meta.learn({"_id": key, "_type": "T", "_p": 1})
    assert len(meta) <= 3 and meta.view("d", []) is not None


def at(event: dict[str, Any], seconds: int, inc: int = 1) -> dict[str, Any]:
    return {**event, "clusterTime": Timestamp(seconds, inc)}


def test_events_older_than_the_stream_are_read_not_viewed() -> None:
    """A replayed event shows the outbox as it was: its entries may have been published and
    pulled since by the partition's previous owner (issue 42: the new owner republished
    them, after newer ones, in test_kafka's kill/join/stop run). Its document is read."""
    opened = Timestamp(100, 5)
    views, reads = changes(at(update("a", {"outbox.0": e(1)}), 100, 5),
                           at(insert("b", e(2)), 100, 2),
                           at(update("c", {"outbox.0": e(3)}), 100, 6),
                           at(update("d", {"_v": 4}), 99),  # no outbox change: nothing
                           meta=known("a", "c", "d"), fresh_after=opened)
    assert reads == ["a", "b"] and [v["_id"] for v in views] == ["c"]
    # An event without a cluster time is not known to be newer: read.
    views, reads = changes(update("a", {"outbox.0": e(1)}), meta=known("a"),
                           fresh_after=opened)
    assert reads == ["a"] and views == []


def test_a_looked_up_document_is_current_whatever_its_event_time() -> None:
    looked_up = at({"operationType": "update", "fullDocument": {"_id": "a", "outbox": [e(1)]}},
                   1, 1)
    views, reads = changes(looked_up, fresh_after=Timestamp(100, 1), looked_up=True)
    assert [v["_id"] for v in views] == ["a"] and reads == []
    inserted = at(insert("b", e(2)), 1, 1)  # an insert's document is as inserted
    views, reads = changes(inserted, fresh_after=Timestamp(100, 1), looked_up=True)
    assert views == [] and reads == ["b"]
