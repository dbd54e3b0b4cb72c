"""Partitions (docs/design.md "Document layout", ``_p``): the stable hash, the writer storing
it once at insert, and ``aggbox migrate partitions`` for documents of earlier versions."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggbox.migrate_partitions import migrate_partitions
from aggregates.core.partitions import F_PARTITION, PARTITIONS, partition_of
from aggregates.fold.document import F_PARTITION as F_PARTITION_REEXPORTED
from tests.aggregates.cli import Run, migrate_cli  # noqa: F401 (the cli fixture)
from tests.aggregates.contract import kinds, writer
from tests.aggregates.domain import msg

# -- the hash -----------------------------------------------------------------------------------

#: Computed once with the documented formula; a change here re-partitions every document.
GOLDEN = {
    "o-1": 130,
    "c/1": 29,
    "a/b.c$d%e": 39,
    "$x": 63,
    "a.b": 239,
    "Müller": 206,
    "😀": 71,
    "": 20,
    "\ud800": 180,  # a lone surrogate (MongoDB cannot store it; still a partition)
}


def test_partition_of_golden_values() -> None:
    assert PARTITIONS == 256 and F_PARTITION == F_PARTITION_REEXPORTED == "_p"
    assert {i: partition_of(i) for i in GOLDEN} == GOLDEN


@given(st.text())
def test_partition_of_is_in_range(aggregate_id: str) -> None:
    assert 0 <= partition_of(aggregate_id) < PARTITIONS


def test_partitions_are_roughly_uniform() -> None:
    counts = Counter(partition_of(f"o-{i}") for i in range(10_000))
    assert len(counts) == PARTITIONS
    assert min(counts.values()) >= 10 and max(counts.values()) <= 80


# -- the writer ---------------------------------------------------------------------------------
IDS = ["o-1", "c/1", "a/b.c$d%e", "Müller"]


@pytest.mark.mongo
def test_the_writer_stores_the_partition_once_at_insert(db: Any) -> None:
    w = writer(db)
    assert "aggbox_partition_pending" in db.counters.index_information()
    assert kinds(w.process([msg(f"m-{a}", 1, agg=a) for a in IDS])) == ["applied"] * 4
    docs = {d["_id"]: d for d in db.counters.find()}
    assert {a: d[F_PARTITION] for a, d in docs.items()} == {a: GOLDEN[a] for a in IDS}
    # Later writes leave it alone (even a wrong one: it is written only at insert).
    db.counters.update_one({"_id": "o-1"}, {"$set": {F_PARTITION: 7}})
    assert kinds(w.process([msg(f"n-{a}", 2, agg=a) for a in IDS])) == ["applied"] * 4
    after = {d["_id"]: d for d in db.counters.find()}
    assert {a: d[F_PARTITION] for a, d in after.items()} == {**{a: GOLDEN[a] for a in IDS},
                                                            "o-1": 7}
    assert all(after[a]["_v"] == docs[a]["_v"] + 1 for a in IDS)


# -- aggbox migrate partitions ------------------------------------------------------------------
def _entry(eid: str) -> dict[str, Any]:
    return {"id": eid, "type": "Added", "topic": None, "key": "k", "payload": {},
            "headers": {}}


def seed_old_documents(db: Any) -> tuple[list[str], list[str]]:
    """Documents as an earlier version wrote them (no ``_p``): ``(free, busy)`` ids, busy
    ones with unpublished outbox entries; plus one document written by the writer."""
    free = [f"old-{i}" for i in range(5)] + ["x/y", "a.b$c", "Zürich"]
    busy = ["old-busy-1", "old-busy-2"]
    db.counters.insert_many(
        [{"_id": a, "_v": 3, "_type": "Counter", "_seq": 0, "state": {"total": 1},
          "outbox": []} for a in free]
        + [{"_id": a, "_v": 2, "_type": "Counter", "_seq": 1, "state": {"total": 2},
            "outbox": [_entry(f"e-{a}")]} for a in busy])
    # One without an outbox field at all.
    db.counters.insert_one({"_id": "old-bare", "_v": 1, "_type": "Counter", "state": {}})
    writer(db).process([msg("m-new", 1, agg="new-1")])
    return [*free, "old-bare"], busy


def _partitions(db: Any) -> dict[str, Any]:
    return {d["_id"]: d.get(F_PARTITION) for d in db.counters.find()}


@pytest.mark.mongo
def test_migrate_partitions_leaves_busy_documents_until_published(db: Any) -> None:
    free, busy = seed_old_documents(db)
    before = sorted(map(str, db.counters.find()))

    [dry] = migrate_partitions(db, ["counters"], dry_run=True, page=3)
    assert sorted(map(str, db.counters.find())) == before  # nothing changed
    [res] = migrate_partitions(db, ["counters"], page=3)  # several pages
    expected = dict(scanned=len(free) + len(busy) + 1, migrated=len(free), already=1,
                    pending=len(busy), passes=1)
    assert {k: dry.as_dict()[k] for k in expected} == expected
    assert {k: res.as_dict()[k] for k in expected} == expected
    parts = _partitions(db)
    assert {a: parts[a] for a in free} == {a: partition_of(a) for a in free}
    assert {a: parts[a] for a in busy} == {a: None for a in busy}
    assert parts["new-1"] == partition_of("new-1")
    # Layout, not state: _v unchanged.
    assert {d["_id"]: d["_v"] for d in db.counters.find({"_id": {"$in": free}})} == \
        {a: 1 if a == "old-bare" else 3 for a in free}

    # The dispatcher publishes the busy ones' entries: the next run moves them.
    for a in busy:
        db.counters.update_one({"_id": a}, {"$pull": {"outbox": {"id": {"$in": [f"e-{a}"]}}}})
    [res] = migrate_partitions(db, ["counters"])
    assert (res.migrated, res.already, res.pending) == (len(busy), len(free) + 1, 0)
    assert _partitions(db) == {a: partition_of(a) for a in _partitions(db)}

    # Idempotent: nothing left to do, nothing changed.
    snapshot = sorted(map(str, db.counters.find()))
    [res] = migrate_partitions(db, ["counters"])
    assert (res.migrated, res.pending) == (0, 0)
    assert sorted(map(str, db.counters.find())) == snapshot

    # Migrated documents carry on with the writer; _p stays.
    assert kinds(writer(db).process([msg("m-after", 1, agg="old-1")])) == ["applied"]
    assert db.counters.find_one({"_id": "old-1"})[F_PARTITION] == partition_of("old-1")


@pytest.mark.mongo
def test_migrate_partitions_wait_retries_the_pending_documents(db: Any) -> None:
    free, busy = seed_old_documents(db)
    now = [0.0]

    def sleep(seconds: float) -> None:  # meanwhile the dispatcher publishes one document
        now[0] += seconds
        if now[0] >= 3:
            a = busy[int(now[0]) - 3] if int(now[0]) - 3 < len(busy) else None
            if a is not None:
                db.counters.update_one({"_id": a}, {"$set": {"outbox": []}})

    [res] = migrate_partitions(db, ["counters"], wait=10, clock=lambda: now[0], sleep=sleep)
    assert (res.migrated, res.pending) == (len(free) + len(busy), 0)
    assert res.passes == 5 and now[0] == 4  # 1 + 3 polls + the one that found the last
    # Time up with documents still pending: counted.
    db.counters.insert_one({"_id": "old-late", "_v": 1, "outbox": [_entry("e-late")]})
    [res] = migrate_partitions(db, ["counters"], wait=2.5, clock=lambda: now[0],
                               sleep=sleep)
    assert (res.migrated, res.pending) == (0, 1) and res.passes == 4


@pytest.mark.mongo
def test_aggbox_migrate_partitions_command(db: Any, cli: Run) -> None:
    free, busy = seed_old_documents(db)
    n = len(free) + len(busy) + 1
    before = sorted(map(str, db.counters.find()))
    rc, out, _ = cli("migrate", "partitions", "--collection", "counters", "--dry-run")
    assert rc == 3 and "dry run: nothing changed" in out
    assert f"counters: scanned {n}, would be migrated {len(free)}, already 1, pending 2" in out
    assert sorted(map(str, db.counters.find())) == before

    rc, out, _ = cli("migrate", "partitions", "--aggregates", "tests.aggregates.domain")
    assert rc == 3, out
    assert f"counters: scanned {n}, migrated {len(free)}, already 1, pending 2" in out
    assert "pending: 2 documents still have unpublished entries; run again once the " \
           "dispatcher has published them" in out

    db.counters.update_many({"_id": {"$in": busy}}, {"$set": {"outbox": []}})
    rc, out, _ = cli("migrate", "partitions", "--collection", "counters", "--json")
    [counts] = json.loads(out)["items"]
    assert rc == 0 and (counts["migrated"], counts["pending"]) == (2, 0)
    rc, out, _ = cli("migrate", "partitions", "--collection", "counters")
    assert rc == 0 and f"scanned {n}, migrated 0, already {n}, pending 0" in out

    rc, _, err = cli("migrate", "partitions")
    assert rc == 1 and "--collection NAME" in err
