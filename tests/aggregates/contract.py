"""The store contract: every backend the writer runs on passes the same suite.

Subclasses provide the ``store_db`` fixture (a fresh pymongo-compatible ``Database``).
Run against the test double ``aggregates.testing.memory_database()`` (mongomock with the
bulk write the writer needs; pure logic, fast), the local server (mongod or
mongo-java-server) and a real MongoDB replica set when ``AGGBOX_MONGODB_URI`` is set."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pymongo import DeleteOne, InsertOne, UpdateOne
from pymongo.errors import OperationFailure

from aggregates import AggboxSettings, StoreError, StoreWriter
from aggregates.core.bulk import DUPLICATE_KEY, bulk_write_unordered
from aggregates.core.ids import emitted_message_id
from aggregates.core.reasons import Reason
from aggregates.fold.document import F_OUTBOX, F_VERSION
from aggregates.store.update import inserted_document
from tests.aggregates.domain import (
    Registry,
    counters,
    make_counter,
    msg,
    oracle,
    outcomes_add_up,
    registry,
    stored,
)

#: The writers' clock in these tests: the test messages occurred on 2026-01-01, within the
#: default dedup horizon of this time (a real clock would put them beyond it).
NOW = datetime(2026, 1, 2, tzinfo=UTC)


def writer(db: Any, reg: Registry = registry, **settings: Any) -> StoreWriter:
    w = StoreWriter(db, reg, settings=AggboxSettings(**settings), sleep=lambda s: None,
                    clock=lambda: NOW)
    w.ensure_indexes()
    return w


def kinds(outcomes: list[Any]) -> list[str]:
    return [o.outcome for o in outcomes]


class StoreContract:
    """Behaviour every store backend must show. See docs/design.md "Invariants"."""

    @pytest.fixture
    def store_db(self) -> Any:  # overridden per backend
        raise NotImplementedError

    # -- basics and invariant 6 ---------------------------------------------------------
    def test_applies_in_order_and_counts_add_up(self, store_db: Any) -> None:
        w = writer(store_db)
        inputs = [msg("m1", 3), msg("m2", 4), msg("m1", 3), msg("m3", 9, agg="a2")]
        out = w.process(inputs)
        assert kinds(out) == ["applied", "applied", "duplicate", "applied"]
        assert outcomes_add_up(inputs, out)
        doc = store_db.counters.find_one({"_id": "a1"})
        assert doc["state"] == {"total": 7, "items": [3, 4]}
        assert doc[F_VERSION] == 1  # one write for the whole chunk
        assert stored(store_db) == oracle(inputs)

    def test_redelivered_batch_is_all_duplicates(self, store_db: Any) -> None:
        w = writer(store_db)
        inputs = [msg(f"m{i}", i, agg=f"a{i % 3}") for i in range(1, 30)]
        w.process(inputs)
        before = stored(store_db)
        again = w.process(inputs)
        assert set(kinds(again)) == {"duplicate"}
        assert stored(store_db) == before

    def test_duplicate_with_different_payload_is_flagged(self, store_db: Any) -> None:
        w = writer(store_db)
        w.process([msg("m1", 3)])
        out = w.process([msg("m1", 5)])
        assert out[0].outcome == "dead_lettered"
        assert out[0].reason == Reason.DUPLICATE_WITH_DIFFERENT_PAYLOAD
        dl = store_db.aggbox_dead_letters.find_one({"message_id": "m1"})
        assert dl["reason"] == Reason.DUPLICATE_WITH_DIFFERENT_PAYLOAD
        assert store_db.counters.find_one()["state"]["total"] == 3

    # -- inbox window, archive and dedup horizon (docs/design.md "Dedup") ---------------
    def test_inbox_keeps_new_ids_and_archives_evicted_ones(self, store_db: Any) -> None:
        small = make_counter("Small", window=3)
        w = writer(store_db, Registry([small]))
        times = [f"2026-01-01T00:00:0{i}Z" for i in range(10)]
        w.process([msg(f"m{i}", 1, atype="Small", at=times[i]) for i in range(5)])
        doc = store_db.smalls.find_one()
        # One write added five ids: none of them leaves before it is stored.
        assert [e[0] for e in doc["inbox"]] == ["m0", "m1", "m2", "m3", "m4"]
        assert store_db.smalls_inbox_archive.count_documents({}) == 0
        out = w.process([msg("m0", 1, atype="Small", at=times[0]),
                         msg("m3", 1, atype="Small", at=times[3]),
                         msg("m9", 1, atype="Small", at=times[9])])
        assert kinds(out) == ["duplicate", "duplicate", "applied"]
        doc = store_db.smalls.find_one()
        assert [e[0] for e in doc["inbox"]] == ["m3", "m4", "m9"]
        assert doc["inbox_archive_floor"].replace(tzinfo=None).isoformat() == \
            "2026-01-01T00:00:02"
        archived = {d["m"]: d for d in store_db.smalls_inbox_archive.find()}
        assert sorted(archived) == ["m0", "m1", "m2"]
        assert all(d["a"] == "a1" and d["x"] > d["t"] for d in archived.values())
        # Evicted ids are still duplicates; a never-seen message older than the archive
        # floor (but within the horizon) is new and applied.
        out = w.process([msg("m1", 1, atype="Small", at=times[1]),
                         msg("late", 1, atype="Small", at=times[0])])
        assert kinds(out) == ["duplicate", "applied"]
        assert store_db.smalls.find_one()["state"]["total"] == 7

    def test_five_credits_reproduction(self, store_db: Any) -> None:
        # Five new credits from five payers; their occurred_at (the payers' write times) are
        # 900, 400, 950, 980, 500 ms after t0. Window 3, written one message per write so
        # entries are evicted in the middle of the run: all five must be applied.
        small = make_counter("Small", window=3)
        for slice_ in (1, 1000):
            w = writer(store_db, Registry([small]), slice_messages=slice_)
            agg = f"acct-{slice_}"
            ms = [msg(f"credit-{i}-{agg}", 10, atype="Small", agg=agg,
                      at=f"2026-01-01T00:00:00.{ms:03d}Z")
                  for i, ms in enumerate((900, 400, 950, 980, 500))]
            assert kinds(w.process(ms)) == ["applied"] * 5
            assert kinds(w.process(ms[1:2] + ms[4:])) == ["duplicate"] * 2
            assert store_db.smalls.find_one({"_id": agg})["state"]["total"] == 50

    def test_only_messages_older_than_the_horizon_are_refused(self, store_db: Any) -> None:
        from datetime import timedelta

        from aggregates import Inbox
        # Times relative to the real clock: the servers' TTL monitors run on it.
        small = make_counter("Small", dedup=Inbox(window=2, horizon=timedelta(days=7)))
        now = datetime.now(UTC).replace(microsecond=0)
        w = StoreWriter(store_db, Registry([small]), settings=AggboxSettings(slice_messages=1),
                        clock=lambda: now, sleep=lambda s: None)
        w.ensure_indexes()
        at = [(now - timedelta(days=30, seconds=10 - i)).isoformat() for i in range(8)]
        # 30 days old but provably new (nothing was ever archived): applied.
        assert kinds(w.process([msg(f"m{i}", 1, atype="Small", at=at[i])
                                for i in (2, 4, 6, 7)])) == ["applied"] * 4
        out = w.process([
            msg("m2", 1, atype="Small", at=at[2]),    # archived: still a duplicate
            msg("old", 1, atype="Small", at=at[3]),   # below the floor, 30 days old: refused
            msg("new", 1, atype="Small", at=at[7]),   # not below the floor: provably new
            msg("recent", 1, atype="Small", at=(now - timedelta(days=1)).isoformat()),
        ])
        assert [(o.outcome, o.reason) for o in out] == [
            ("duplicate", None), ("dead_lettered", Reason.BEYOND_DEDUP_HORIZON), ("applied", None),
            ("applied", None)]
        assert "dedup horizon (7d)" in (out[1].detail or "")
        assert store_db.smalls.find_one()["state"]["total"] == 6

    def test_undated_ids_are_archived_without_expiry(self, store_db: Any) -> None:
        small = make_counter("Small", window=2)
        w = writer(store_db, Registry([small]), slice_messages=1)
        w.process([msg("u1", 1, atype="Small", at=None), msg("d1", 1, atype="Small"),
                   msg("d2", 1, atype="Small", at="2026-01-01T00:00:05Z")])
        doc = store_db.smalls.find_one()
        assert doc["inbox_archive_undated"] is True
        entry = store_db.smalls_inbox_archive.find_one({"a": "a1", "m": "u1"})
        assert entry is not None and "x" not in entry  # no horizon for undated ids
        out = w.process([msg("d3", 1, atype="Small", at="2026-01-01T00:00:01Z"),
                         msg("u1", 1, atype="Small", at=None),
                         msg("u2", 1, atype="Small", at=None)])
        assert kinds(out) == ["applied", "duplicate", "applied"]

    def test_a_document_of_an_unknown_layout_is_refused_untouched(self, store_db: Any
                                                                  ) -> None:
        w = writer(store_db, Registry([make_counter("Small", window=2)]))
        assert kinds(w.process([msg("m1", 1, atype="Small")])) == ["applied"]
        assert store_db.smalls.find_one()["_lv"] == 1  # written at insert
        store_db.smalls.update_one({"_id": "a1"}, {"$set": {"_lv": 2}})  # a newer aggbox
        before = store_db.smalls.find_one()
        out = w.process([msg("m2", 1, atype="Small")])
        assert [(o.outcome, o.reason) for o in out] == [
            ("dead_lettered", Reason.UNKNOWN_DOCUMENT_LAYOUT)]
        assert "_lv=2" in (out[0].detail or "") and "newer aggbox" in (out[0].detail or "")
        assert store_db.smalls.find_one() == before
        store_db.smalls.update_one({"_id": "a1"}, {"$unset": {"_lv": ""}})  # absent: 1
        assert kinds(w.process([msg("m3", 1, atype="Small")])) == ["applied"]
        assert "_lv" not in store_db.smalls.find_one()  # never rewritten after the insert

    def test_archive_has_a_ttl_index(self, store_db: Any) -> None:
        writer(store_db, Registry([make_counter("Small", window=2)]))
        info = store_db.smalls_inbox_archive.index_information()
        assert info["aggbox_ttl"]["expireAfterSeconds"] == 0

    # -- high-water ---------------------------------------------------------------------
    def test_high_water_monotonic(self, store_db: Any) -> None:
        w = writer(store_db)
        src = "Up"
        out = w.process(
            [
                msg("x1", 1, atype="Mono", source=(src, "u1", 1)),
                msg("x3", 3, atype="Mono", source=(src, "u1", 3)),
                msg("x2", 2, atype="Mono", source=(src, "u1", 2)),
                msg("y1", 5, atype="Mono", source=(src, "u.2$", 1)),
            ]
        )
        assert kinds(out) == ["applied", "applied", "duplicate", "applied"]
        doc = store_db.monos.find_one()
        assert doc["hw"] == {"Up/u1": 3, "Up/u%2E2%24": 1}  # keys escaped: no injection

    def test_high_water_contiguous_parks_gaps_and_releases_them(self, store_db: Any) -> None:
        w = writer(store_db)
        first = w.process(
            [
                msg("s1", 1, atype="Seq", source=("Up", "u", 1)),
                msg("s3", 3, atype="Seq", source=("Up", "u", 3)),
                msg("s4", 4, atype="Seq", source=("Up", "u", 4)),
            ]
        )
        assert [(o.outcome, o.reason) for o in first] == [
            ("applied", None),
            ("parked", Reason.SEQUENCE_GAP),
            ("parked", Reason.SEQUENCE_GAP),
        ]
        assert store_db.aggbox_parked.count_documents({}) == 2
        second = w.process([msg("s2", 2, atype="Seq", source=("Up", "u", 2))])
        mine = [o for o in second if not o.from_parked]
        released = [o for o in second if o.from_parked]
        assert kinds(mine) == ["applied"]
        assert sorted(o.message_id for o in released) == ["s3", "s4"]
        assert {o.outcome for o in released} == {"applied"}
        assert store_db.aggbox_parked.count_documents({}) == 0
        doc = store_db.seqs.find_one()
        assert doc["state"]["items"] == [1, 2, 3, 4]
        assert doc["hw"] == {"Up/u": 4}

    def test_high_water_map_is_bounded(self, store_db: Any) -> None:
        w = writer(store_db)
        inputs = [msg(f"s{i}", 1, atype="Seq", source=("Up", f"u{i}", 1)) for i in range(4)]
        out = w.process(inputs)
        assert kinds(out) == ["applied"] * 3 + ["dead_lettered"]
        assert out[-1].reason == Reason.HIGH_WATER_MAP_FULL
        assert "max_sources" in (out[-1].detail or "")

    # -- guards ---------------------------------------------------------------------------
    def test_outbox_backlog_limit_parks_then_resumes(self, store_db: Any) -> None:
        tight = make_counter("Tight", max_outbox=2)
        w = writer(store_db, Registry([tight]))
        out = w.process([msg(f"t{i}", 3, atype="Tight") for i in range(4)])
        assert [(o.outcome, o.reason) for o in out] == [
            ("applied", None),
            ("applied", None),
            ("parked", Reason.OUTBOX_FULL),
            ("parked", Reason.OUTBOX_FULL),
        ]
        # The dispatcher drains the outbox; the parked messages go through next time.
        store_db.tights.update_one(
            {"_id": "a1"},
            {
                "$pull": {
                    "outbox": {
                        "id": {"$in": [e["id"] for e in store_db.tights.find_one()["outbox"]]}
                    }
                }
            },
        )
        again = w.process([msg("t9", 1, atype="Tight")])
        assert sorted((o.message_id, o.outcome) for o in again) == [
            ("t2", "applied"),
            ("t3", "applied"),
            ("t9", "parked"),
        ]  # full again
        assert store_db.tights.find_one()["state"]["total"] == 12

    def test_document_size_budget_parks_instead_of_failing(self, store_db: Any) -> None:
        w = writer(store_db, max_document_bytes=64 * 1024)
        out = w.process(
            [
                msg("b1", mtype="Big", payload={"size": 40_000}),
                msg("b2", mtype="Big", payload={"size": 40_000}),
            ]
        )
        assert [(o.outcome, o.reason) for o in out] == [
            ("applied", None),
            ("parked", Reason.DOCUMENT_SIZE_BUDGET),
        ]

    def test_injection_keys_are_rejected(self, store_db: Any) -> None:
        w = writer(store_db)
        out = w.process([msg("i1", mtype="Inject"), msg("i2", mtype="BadEmit"), msg("i3", 2)])
        assert [(o.outcome, o.reason) for o in out] == [
            ("dead_lettered", Reason.INVALID_STATE),
            ("dead_lettered", Reason.INVALID_EMIT),
            ("applied", None),
        ]
        doc = store_db.counters.find_one()
        assert "$where" not in doc["state"]

    def test_values_mongodb_cannot_store_are_dead_lettered(self, store_db: Any) -> None:
        w = writer(store_db)
        out = w.process([msg("w1", 1), msg("w2", mtype="Weird"), msg("w3", mtype="WeirdEmit"),
                         msg("w4", 2)])
        assert [(o.outcome, o.reason) for o in out] == [
            ("applied", None), ("dead_lettered", Reason.INVALID_STATE),
            ("dead_lettered", Reason.INVALID_EMIT), ("applied", None)]
        assert store_db.counters.find_one()["state"] == {"total": 3, "items": [1, 2]}

    def test_handler_error_skip_policy(self, store_db: Any) -> None:
        w = writer(store_db)
        out = w.process([msg("e1", 1), msg("e2", mtype="Boom"), msg("e3", 2)])
        assert kinds(out) == ["applied", "dead_lettered", "applied"]
        dl = store_db.aggbox_dead_letters.find_one({"message_id": "e2"})
        assert dl["reason"] == Reason.HANDLER_ERROR
        assert "RuntimeError: boom" in dl["error"] and "Traceback" in dl["traceback"]

    def test_handler_error_park_policy_blocks_aggregate_until_released(self, store_db: Any) -> None:
        strict = make_counter("Strict", on_handler_error="park")
        w = writer(store_db, Registry([strict]))
        out = w.process(
            [
                msg("p1", 1, atype="Strict"),
                msg("p2", atype="Strict", mtype="Boom"),
                msg("p3", 2, atype="Strict"),
            ]
        )
        assert [(o.outcome, o.reason) for o in out] == [
            ("applied", None),
            ("dead_lettered", Reason.HANDLER_ERROR),
            ("parked", Reason.AGGREGATE_BLOCKED),
        ]
        later = w.process([msg("p4", 4, atype="Strict")])
        assert [(o.outcome, o.reason) for o in later] == [("parked", Reason.AGGREGATE_BLOCKED)]
        # An operator releases the aggregate: clear the block, retry parked messages.
        store_db.stricts.update_one({"_id": "a1"}, {"$unset": {"_blocked": ""}, "$inc": {"_v": 1}})
        released = w.retry_parked("Strict", ["a1"])
        assert sorted((o.message_id, o.outcome) for o in released) == [
            ("p3", "applied"),
            ("p4", "applied"),
        ]
        assert store_db.stricts.find_one()["state"]["total"] == 7

    def test_unknown_types_are_dead_lettered_not_lost(self, store_db: Any) -> None:
        w = writer(store_db)
        inputs = [msg("u1", atype="Nope"), msg("u2", mtype="Nope"), msg("u3", 1)]
        out = w.process(inputs)
        assert outcomes_add_up(inputs, out)
        reasons = {o.message_id: o.reason for o in out}
        assert reasons == {
            "u1": Reason.UNKNOWN_AGGREGATE_TYPE,
            "u2": Reason.UNKNOWN_MESSAGE_TYPE,
            "u3": None,
        }

    def test_dead_letter_write_is_idempotent(self, store_db: Any) -> None:
        w = writer(store_db)
        w.process([msg("d1", mtype="Boom")])
        w.process([msg("d1", mtype="Boom")])
        docs = list(store_db.aggbox_dead_letters.find({"message_id": "d1"}))
        assert len(docs) == 1
        assert docs[0]["attempts"] == 2
        assert docs[0]["first_seen"] <= docs[0]["last_seen"]

    # -- invariants 1-4 -------------------------------------------------------------------
    def test_one_conditional_write_per_aggregate_and_appends_only(self, store_db: Any) -> None:
        seen: list[Any] = []
        w = writer(store_db)
        w.before_write = seen.extend
        w.process([msg("m1", 3), msg("m2", 6), msg("m3", 1, agg="a2")])
        assert len(seen) == 2  # invariant 1: one write per aggregate
        # New documents: inserted whole (conditional on the _id being free), as the upsert
        # would have created them.
        assert all(isinstance(op, InsertOne) for op in seen)
        first = seen[0]._doc
        assert first["_id"] == "a1" and first[F_VERSION] == 1
        emitted = len(first["outbox"])
        assert emitted and [e["source"]["seq"] for e in first["outbox"]] == list(
            range(1, emitted + 1))
        stored_doc = store_db.counters.find_one({"_id": "a1"})
        assert stored_doc[F_VERSION] == 1 and len(stored_doc["outbox"]) == emitted
        seen.clear()
        w.process([msg("m4", 3), msg("m5", 1, agg="a2")])
        assert len(seen) == 2
        for op in seen:  # documents read: updated, filtered on the version read
            doc = op._doc
            assert isinstance(op, UpdateOne)
            assert set(op._filter) == {"_id", F_VERSION}
            assert op._upsert is True
            assert "outbox" not in doc.get("$set", {}) and "inbox" not in doc.get("$set", {})
        update = seen[0]._doc
        assert update["$push"]["outbox"]["$each"][0]["source"]["seq"] == emitted + 1
        assert update["$push"]["inbox"]["$slice"] == -10_000

    def test_an_insert_is_the_document_the_upsert_would_create(self, store_db: Any) -> None:
        update = {"$inc": {F_VERSION: 1},
                  "$setOnInsert": {"_type": "Counter", "_p": 7, "_lv": 1},
                  "$set": {"state": {"total": 3, "tags": ["a"]}, "_seq": 2, "hw.S%2Ex": 4,
                           "hw.T": 1},
                  "$push": {"outbox": {"$each": [{"id": "o1"}, {"id": "o2"}]},
                            "inbox": {"$each": [["m1", None, "h"], ["m2", None, "h"],
                                                ["m3", None, "h"]], "$slice": -2}}}
        coll = store_db["insert_contract"]
        coll.update_one({"_id": "u", F_VERSION: 0}, update, upsert=True)
        coll.insert_one(inserted_document("i", 0, update))
        upserted = coll.find_one({"_id": "u"})
        inserted = coll.find_one({"_id": "i"})
        assert {**inserted, "_id": "u"} == upserted
        assert inserted["inbox"] == [["m2", None, "h"], ["m3", None, "h"]]
        assert inserted["hw"] == {"S%2Ex": 4, "T": 1}

    def test_pulled_entries_are_never_resurrected(self, store_db: Any) -> None:
        w = writer(store_db)
        w.process([msg("m1", 3)])
        first_id = store_db.counters.find_one()["outbox"][0]["id"]

        def dispatcher_pulls(ops: list[UpdateOne]) -> None:
            # The dispatcher publishes and pulls between the writer's read and its write.
            store_db.counters.update_one(
                {"_id": "a1"}, {"$pull": {F_OUTBOX: {"id": {"$in": [first_id]}}}}
            )

        w.before_write = dispatcher_pulls
        w.process([msg("m2", 6)])
        ids = [e["id"] for e in store_db.counters.find_one()["outbox"]]
        assert first_id not in ids
        assert ids == [emitted_message_id("Counter", "a1", "m2", 0)]

    def test_version_conflicts_are_retried_with_same_ids(self, store_db: Any) -> None:
        w = writer(store_db)
        rival = writer(store_db)
        inputs = [msg("m1", 3), msg("m2", 9), msg("m3", 1, agg="a2")]
        calls = {"n": 0}

        def rival_writes_first(ops: list[UpdateOne]) -> None:
            calls["n"] += 1
            if calls["n"] == 1:  # a concurrent task processes the same messages first
                rival.process(inputs[:2])

        w.before_write = rival_writes_first
        out = w.process(inputs)
        assert w.stats.conflicts == 1
        assert {o.message_id: o.outcome for o in out} == {
            "m1": "duplicate",
            "m2": "duplicate",
            "m3": "applied",
        }
        assert stored(store_db) == oracle(inputs)  # same ids, nothing doubled

    def test_conflict_storm_gives_up_by_parking(self, store_db: Any) -> None:
        w = writer(store_db, max_conflict_retries=2)

        def always_bump(ops: list[UpdateOne]) -> None:
            store_db.counters.update_one(
                {"_id": "a1"}, {"$inc": {F_VERSION: 1}, "$set": {"state.total": 0}}, upsert=True
            )

        w.before_write = always_bump
        out = w.process([msg("m1", 1), msg("m2", 2)])
        assert [(o.outcome, o.reason) for o in out] == [
            ("parked", Reason.VERSION_CONFLICT_RETRIES_EXHAUSTED)] * 2
        w.before_write = None
        again = w.retry_parked("Counter", ["a1"])
        assert sorted((o.message_id, o.outcome) for o in again) == [
            ("m1", "applied"),
            ("m2", "applied"),
        ]

    def test_a_redelivery_settles_messages_parked_after_conflicts(self, store_db: Any) -> None:
        """docs/design.md "Parking and blocking": redelivered, a message parked after version
        conflicts is retried from parking first — ``applied``, or ``duplicate`` when another
        writer applied it while it was being parked — and the redelivered copy is then a
        ``duplicate``; its parked record is gone either way."""
        w = writer(store_db, max_conflict_retries=2)
        rival = writer(store_db)
        seed = msg("m0", 5)
        assert kinds(w.process([seed])) == ["applied"]
        inputs = [msg("m1", 1), msg("m2", 2)]

        def bump(ops: list[UpdateOne]) -> None:  # another writer, every time
            store_db.counters.update_one({"_id": "a1"}, {"$inc": {F_VERSION: 1}})

        def rival_applies_m1(point: str) -> None:
            # w decided to park m1 but has not written its parked record yet (the race in
            # tests/aggregates/test_inbox_horizon.py): a concurrent writer applies m1.
            if point == "before_parked":
                assert kinds(rival.process(inputs[:1])) == ["applied"]

        w.before_write, w.fault = bump, rival_applies_m1
        assert [(o.outcome, o.reason) for o in w.process(inputs)] == [
            ("parked", Reason.VERSION_CONFLICT_RETRIES_EXHAUSTED)] * 2
        w.before_write = w.fault = None
        assert store_db.aggbox_parked.count_documents({}) == 2  # m1 applied and parked

        again = w.process(inputs)
        assert sorted((o.message_id, o.outcome, o.from_parked) for o in again) == [
            ("m1", "duplicate", False), ("m1", "duplicate", True),
            ("m2", "applied", True), ("m2", "duplicate", False)]
        assert store_db.aggbox_parked.count_documents({}) == 0
        assert stored(store_db) == oracle([seed, *inputs])

    def test_hot_aggregate_is_written_in_slices(self, store_db: Any) -> None:
        w = writer(store_db, slice_messages=50, chunk_messages=120)
        inputs = [msg(f"h{i}", i % 7) for i in range(500)]
        out = w.process(inputs)
        assert kinds(out).count("applied") == 500
        assert w.stats.writes >= 10  # 500 / 50
        assert stored(store_db) == oracle(inputs)
        assert store_db.counters.find_one()["_seq"] == oracle(inputs)["a1"].seq

    def test_emitted_messages_carry_contiguous_source_seq(self, store_db: Any) -> None:
        w = writer(store_db)
        w.process([msg("m1", 3), msg("m2", 9)])
        w.process([msg("m3", 6)])
        outbox = store_db.counters.find_one()["outbox"]
        assert [e["source"]["seq"] for e in outbox] == [1, 2, 3, 4]
        assert {e["source"]["type"] for e in outbox} == {"Counter"}
        assert [e["causation_id"] for e in outbox] == ["m1", "m2", "m2", "m3"]
        assert outbox[2]["target"] == {"type": "Counter", "id": "sink"}

    def test_ensure_indexes_is_idempotent(self, store_db: Any) -> None:
        w = writer(store_db)
        w.ensure_indexes()
        names = {ix["name"] for ix in store_db.counters.list_indexes()}
        assert "aggbox_id_v" in names
        assert counters.collection == "counters"

    # -- the bulk write the writer relies on (the test double is held to it too) ---------
    def test_bulk_reports_each_failed_operation_at_its_index(self, store_db: Any) -> None:
        coll = store_db["bulk_contract"]
        coll.insert_one({"_id": "a", F_VERSION: 1, F_OUTBOX: "not an array"})
        ops: list[UpdateOne | DeleteOne] = [
            UpdateOne({"_id": "b", F_VERSION: 0}, {"$inc": {F_VERSION: 1}}, upsert=True),
            UpdateOne({"_id": "a", F_VERSION: 0}, {"$inc": {F_VERSION: 1}}, upsert=True),
            UpdateOne({"_id": "a", F_VERSION: 1},
                      {"$inc": {F_VERSION: 1}, "$push": {F_OUTBOX: {"$each": [1]}}}),
            DeleteOne({"_id": "nothing"}),
            UpdateOne({"_id": "c", F_VERSION: 0}, {"$inc": {F_VERSION: 1}}, upsert=True),
        ]
        errors = bulk_write_unordered(coll, ops)
        assert [e.index for e in errors] == [1, 2]  # unordered: the others were applied
        assert errors[0].code == DUPLICATE_KEY and errors[0].duplicate_key
        assert isinstance(errors[1].code, int) and errors[1].code != DUPLICATE_KEY
        # A failed update changes nothing, not even the parts before the failing operator.
        assert coll.find_one({"_id": "a"}) == {"_id": "a", F_VERSION: 1,
                                                F_OUTBOX: "not an array"}
        assert {d["_id"]: d[F_VERSION] for d in coll.find({"_id": {"$in": ["b", "c"]}})} == {
            "b": 1, "c": 1}

    def test_a_write_error_other_than_a_conflict_fails_with_its_code(self, store_db: Any
                                                                      ) -> None:
        w = writer(store_db)
        w.process([msg("m1", 1)])

        def corrupt(ops: list[UpdateOne]) -> None:  # the next $push onto the inbox fails
            store_db.counters.update_one({"_id": "a1"}, {"$set": {"inbox": "corrupt"}})

        w.before_write = corrupt
        with pytest.raises(StoreError) as info:
            w.process([msg("m2", 2)])
        err = info.value
        assert isinstance(err.code, int) and err.code != DUPLICATE_KEY
        assert isinstance(err.labels, frozenset)
        assert isinstance(err.__cause__, OperationFailure)
        assert err.__cause__.code == err.code
        assert f"code {err.code}" in str(err)

