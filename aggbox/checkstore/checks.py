"""The store checks that need no change stream (I/O: each writes into the scratch database it
is given and nowhere else). Each returns ``(status, what was seen, what aggbox does)``; the
runner (:mod:`aggbox.checkstore.runner`) turns an exception into a FAIL line.

They exercise what aggbox itself does — the writer's conditional upsert on ``{_id, _v}``,
:func:`aggregates.core.bulk.bulk_write_unordered`, the codec of :mod:`aggregates.codec.bson`,
:meth:`aggregates.store.writer.StoreWriter.ensure_indexes` — rather than a copy of it."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Final

from pymongo import DeleteOne, UpdateOne
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError, OperationFailure, PyMongoError

from aggbox.checkstore import library
from aggbox.checkstore.logic import MIB, Probe, padded, retryable_writes
from aggbox.checkstore.report import Status
from aggregates.core.bulk import DUPLICATE_KEY, WriteError, bulk_write_unordered
from aggregates.core.settings import AggboxSettings
from aggregates.core.unsupported import UnsupportedByServer

__all__ = ["CHECKS", "Check", "Context", "Outcome"]

Outcome = tuple[Status, str, str]


@dataclass(frozen=True)
class Context:
    """What every check gets: the scratch database and what the server said about itself."""

    db: Database[Any]
    settings: AggboxSettings
    hello: Mapping[str, Any]
    uri_options: Mapping[str, str]
    #: for the checks that need a client of their own (the dispatcher's async one)
    uri: str = ""
    client_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    run: Callable[[Context], Outcome]
    #: what breaks when the check fails with an error
    if_failed: str
    #: what aggbox does when the server says it does not implement what the check sends
    #: (``UNSUPPORTED``); ``None``: nothing, the check FAILs
    fallback: str | None = None


# -- the writer's optimistic concurrency -------------------------------------------------------
def conditional_update(ctx: Context) -> Outcome:
    coll = ctx.db["check_versions"]
    coll.insert_one({"_id": "a", "_v": 1, "state": {"n": 1}})
    fresh = coll.update_one({"_id": "a", "_v": 1}, {"$inc": {"_v": 1}, "$set": {"state.n": 2}})
    stale = coll.update_one({"_id": "a", "_v": 1}, {"$inc": {"_v": 1}, "$set": {"state.n": 3}})
    collided = False
    try:  # the writer's form: a stale upsert must collide on _id, never insert a second doc
        coll.update_one({"_id": "a", "_v": 1}, {"$inc": {"_v": 1}, "$set": {"state.n": 4}},
                        upsert=True)
    except DuplicateKeyError:
        collided = True
    doc = coll.find_one({"_id": "a"}) or {}
    seen = (f"fresh _v matched {fresh.matched_count}, stale _v matched {stale.matched_count}, "
            f"stale upsert {'collided (E11000)' if collided else 'did NOT collide'}; "
            f"stored _v={doc.get('_v')}, {coll.count_documents({})} document(s)")
    if (fresh.modified_count == 1 and stale.matched_count == 0 and collided
            and doc.get("_v") == 2 and doc.get("state") == {"n": 2}):
        return (Status.PASS, seen, "one conditional write per aggregate: a writer that read an "
                "older version changes nothing, re-reads and folds again")
    return (Status.FAIL, seen, "a writer holding a stale version could overwrite a newer one: "
            "effects could be lost or applied twice")


def bulk_errors(ctx: Context) -> Outcome:
    coll = ctx.db["check_bulk"]
    coll.insert_one({"_id": "a", "_v": 1, "outbox": "not an array"})
    ops: list[UpdateOne | DeleteOne] = [
        UpdateOne({"_id": "b", "_v": 0}, {"$inc": {"_v": 1}}, upsert=True),
        UpdateOne({"_id": "a", "_v": 0}, {"$inc": {"_v": 1}}, upsert=True),  # stale: E11000
        UpdateOne({"_id": "a", "_v": 1},                                  # fails: not an array
                  {"$inc": {"_v": 1}, "$push": {"outbox": {"$each": [1]}}}),
        DeleteOne({"_id": "nothing"}),
        UpdateOne({"_id": "c", "_v": 0}, {"$inc": {"_v": 1}}, upsert=True),
    ]
    errors = bulk_write_unordered(coll, ops)
    found = {e.index: e.code for e in errors}
    untouched = coll.find_one({"_id": "a"}) == {"_id": "a", "_v": 1, "outbox": "not an array"}
    applied = {d["_id"]: d["_v"] for d in coll.find({"_id": {"$in": ["b", "c"]}})}
    seen = (f"errors at {sorted(found)} with codes {[found[i] for i in sorted(found)]}; "
            f"the failed update {'changed nothing' if untouched else 'CHANGED the document'}; "
            f"the others {'applied' if applied == {'b': 1, 'c': 1} else f'gave {applied}'}")
    if (sorted(found) == [1, 2] and found[1] == DUPLICATE_KEY
            and isinstance(found[2], int) and found[2] != DUPLICATE_KEY
            and untouched and applied == {"b": 1, "c": 1}):
        return (Status.PASS, seen, "a chunk's writes go in one unordered bulk; each conflict "
                "is found at its operation's index (E11000) and only that aggregate is retried")
    return (Status.FAIL, seen, "the writer cannot tell which aggregates of a bulk conflicted "
            "or failed")


def upsert_race(ctx: Context) -> Outcome:
    coll = ctx.db["check_race"]
    coll.create_index([("_id", 1), ("_v", 1)], unique=True, name="aggbox_id_v")
    n = 50
    barrier = threading.Barrier(2)
    results: dict[str, list[WriteError]] = {}
    failures: list[BaseException] = []

    def writer(name: str) -> None:
        ops: list[UpdateOne | DeleteOne] = [
            UpdateOne({"_id": f"r{i}", "_v": 0},
                      {"$inc": {"_v": 1}, "$push": {"outbox": {"$each": [{"id": name}]}}},
                      upsert=True) for i in range(n)]
        try:
            barrier.wait(timeout=30)
            results[name] = bulk_write_unordered(coll, ops)
        except BaseException as exc:  # reported below, in this thread
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(name,), daemon=True)
               for name in ("w1", "w2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if failures:
        raise failures[0]
    lost = {name: {e.index for e in errs} for name, errs in results.items()}
    codes = {e.code or 0 for errs in results.values() for e in errs}
    docs = list(coll.find({}, {"_v": 1, "outbox": 1}))
    once = all(d.get("_v") == 1 and len(d.get("outbox") or []) == 1 for d in docs)
    each_once = (len(results) == 2 and not (lost["w1"] & lost["w2"])
                 and len(lost["w1"]) + len(lost["w2"]) == n)
    seen = (f"two writers upserted the same {n} new ids at once: {len(docs)} documents, "
            f"each written {'once' if once else 'MORE than once'}; the losers got "
            f"{sum(len(v) for v in lost.values())} per-operation errors, codes {sorted(codes)}")
    if len(docs) == n and once and each_once and codes == {DUPLICATE_KEY}:
        return (Status.PASS, seen, "two writers of one new aggregate: one inserts it, the "
                "other sees E11000 at that operation, re-reads and folds again (nothing "
                "doubled)")
    return (Status.FAIL, seen, "concurrent writers of a new aggregate could both apply a "
            "message, or lose one")


# -- values ------------------------------------------------------------------------------------
def bson_types(ctx: Context) -> Outcome:
    from bson.binary import Binary
    from bson.decimal128 import Decimal128

    from aggregates.codec.bson import from_bson, to_bson

    values: dict[str, Any] = {
        "amount": Decimal("12345678901234567890.123456789012"),
        "tiny": Decimal("-0.000000000000000000000000000001"),
        "id": uuid.UUID("3f2c7d4e-9a1b-4c8d-8e2f-0123456789ab"),
        "at": datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
        "offset": datetime(2026, 6, 30, 23, 59, 59, 999000,
                           tzinfo=timezone(timedelta(hours=2))),
        # the inbox's shape: an array of [message id, occurred_at, payload hash] arrays
        "inbox": [["m1", datetime(2026, 1, 2, 3, 4, 5, 1000, tzinfo=UTC), "h1"],
                  ["m2", None, None]],
    }
    coll = ctx.db["check_types"]
    try:
        coll.insert_one({"_id": "t", "state": to_bson(values)})
    except PyMongoError:  # which values: each on its own
        refused = _refused_values(coll, values)
        return (Status.FAIL, "a document holding them was refused: " + "; ".join(
            f"{k}: {why}" for k, why in refused.items()) if refused else
            "a document holding them all was refused, each alone was stored",
            "state, payloads or the inbox could not be stored")
    back = from_bson((coll.find_one({"_id": "t"}) or {}).get("state"))
    wrong = [k for k, v in values.items()
             if not isinstance(back, dict) or back.get(k) != v or type(back.get(k)) is not type(v)]
    queries: dict[str, dict[str, Any]] = {
        "Decimal128": {"state.amount": Decimal128(values["amount"])},
        "UUID": {"state.id": Binary.from_uuid(values["id"])},
        "datetime range": {"state.at": {"$gte": values["at"], "$lt": values["offset"]}},
    }
    unmatched = [name for name, q in queries.items() if coll.count_documents(q) != 1]
    seen = ("Decimal128 (34 digits), UUID (binary subtype 4), tz-aware datetimes (ms), "
            "nested arrays (the inbox) "
            + ("read back equal" if not wrong else f"read back DIFFERENT: {', '.join(wrong)}")
            + ("; queries by value match" if not unmatched
               else f"; queries by {', '.join(unmatched)} did NOT match"))
    if not wrong and not unmatched:
        return (Status.PASS, seen, "state, payloads and inbox times keep their Decimal, UUID "
                "and datetime values (aggregates.codec.bson)")
    return (Status.FAIL, seen, "state or dedup times would change on their way through the "
            "store")


def _refused_values(coll: Any, values: Mapping[str, Any]) -> dict[str, str]:
    from aggregates.codec.bson import to_bson
    from dispatcher.core.errors import describe_store_error

    refused = {}
    for key, value in values.items():
        try:
            coll.insert_one({"_id": key, "state": to_bson({key: value})})
        except PyMongoError as exc:  # said in the check's line
            refused[key] = describe_store_error(exc, limit=100)
    return refused


# -- indexes -----------------------------------------------------------------------------------
#: name → (keys, options that must hold) of what StoreWriter.ensure_indexes creates
_AGGREGATE_INDEXES: Final = {
    "aggbox_id_v": ({"_id": 1, "_v": 1}, {"unique": True}),
    "aggbox_outbox_pending": ({"outbox.0": 1}, {"sparse": True}),
    "aggbox_partition_pending": ({"_p": 1, "outbox.0": 1}, {"sparse": True}),
}
_ARCHIVE_INDEXES: Final = {"aggbox_ttl": ({"x": 1}, {"expireAfterSeconds": 0})}
_SIDE_KEYS: Final = {
    "dead letters": [{"reason": 1, "last_seen": 1}, {"aggregate_type": 1, "aggregate_id": 1},
                     {"message_id": 1}],
    "parked": [{"collection": 1, "aggregate_id": 1}, {"reason": 1}],
}


def indexes(ctx: Context) -> Outcome:
    from aggregates import AggregateType, Inbox, Registry
    from aggregates.dedup.archive import archive_collection
    from aggregates.store.writer import StoreWriter

    settings = ctx.settings.model_copy(update={
        "dead_letter_collection": "check_dead_letters", "parked_collection": "check_parked"})
    atype = AggregateType("CheckStoreProbe", state=Probe, collection="check_aggregates",
                          dedup=Inbox(window=10))
    error: BaseException | None = None
    try:
        StoreWriter(ctx.db, Registry([atype]), settings=settings).ensure_indexes()
    except (OperationFailure, UnsupportedByServer) as exc:  # what is missing: said below
        error = exc
    missing = _missing(ctx.db["check_aggregates"], _AGGREGATE_INDEXES)
    missing += _missing(ctx.db[archive_collection("check_aggregates")], _ARCHIVE_INDEXES)
    for what, keys in _SIDE_KEYS.items():
        coll = settings.dead_letter_collection if what == "dead letters" else \
            settings.parked_collection
        present = [dict(ix["key"]) for ix in ctx.db[coll].list_indexes()]
        missing += [f"{what} {k}" for k in keys if k not in present]
    if not missing and error is None:
        return (Status.PASS, "StoreWriter.ensure_indexes created them; list_indexes shows "
                "aggbox_id_v (unique), aggbox_outbox_pending and aggbox_partition_pending "
                "(sparse), the archive's TTL index aggbox_ttl (expireAfterSeconds 0), the "
                "dead-letter and parked indexes",
                "`aggbox indexes` / the pipeline create them; the archive's entries expire "
                "after the dedup horizon (TTL removal itself was not waited for)")
    from dispatcher.core.errors import describe_store_error

    said = str(error) if isinstance(error, UnsupportedByServer) else \
        describe_store_error(error) if error else ""
    failed = f"ensure_indexes failed: {said}; " if error else ""
    return (Status.FAIL, f"{failed}missing or different: {', '.join(missing) or '-'}",
            "without them the writer cannot ensure its indexes (the pipeline stops), or the "
            "inbox archive is never trimmed")


def _missing(coll: Any, expected: Mapping[str, tuple[dict[str, int], dict[str, Any]]]
             ) -> list[str]:
    present = {ix["name"]: ix for ix in coll.list_indexes()}
    out = []
    for name, (keys, options) in expected.items():
        ix = present.get(name)
        if (ix is None or dict(ix["key"]) != keys
                or any(ix.get(k) != v for k, v in options.items())):
            out.append(name)
    return out


# -- sizes -------------------------------------------------------------------------------------
def size_budget(ctx: Context) -> Outcome:
    budget = ctx.settings.max_document_bytes
    coll = ctx.db["check_budget"]
    doc = padded({"_id": "b", "_v": 1, "state": {}}, budget, field="pad")
    pad = doc.pop("pad")
    # The writer's form: a conditional upsert that sets the state.
    coll.update_one({"_id": "b", "_v": 0}, {"$inc": {"_v": 1}, "$set": {"state": {},
                                                                       "pad": pad}},
                    upsert=True)
    back = coll.find_one({"_id": "b"}) or {}
    ok = back.get("pad") == pad
    seen = (f"a document of {budget:,} bytes (max_document_bytes) "
            + ("stored and read back" if ok else "NOT read back intact"))
    if ok:
        return (Status.PASS, seen, "the writer keeps every document within this budget; a "
                "message that would exceed it is parked (document_size_budget)")
    return (Status.FAIL, seen, "lower max_document_bytes to what this server stores")


def size_limit(ctx: Context) -> Outcome:
    coll = ctx.db["check_limit"]
    budget = ctx.settings.max_document_bytes
    near = 16 * MIB - 16 * 1024
    doc = padded({"_id": "near"}, near)
    try:
        coll.insert_one(doc)
    except OperationFailure as exc:
        return (Status.UNSUPPORTED, f"a document of {near:,} bytes (just under 16 MiB) was "
                f"refused (code {exc.code}): this server's limit is lower",
                f"aggbox's own budget guards it: documents stay within max_document_bytes "
                f"({budget:,} bytes), which this server stores")
    del doc
    stored = coll.count_documents({"_id": "near"}) == 1
    try:
        coll.update_one({"_id": "near"}, {"$set": {"more": "y" * (2 * MIB)}})
    except OperationFailure as exc:
        return (Status.PASS, f"{near:,} bytes {'stored' if stored else 'NOT found'}; an "
                f"update growing it past 16 MiB was refused (code {exc.code})",
                "aggbox never gets near it: documents stay within max_document_bytes "
                f"({budget:,} bytes)")
    return (Status.UNSUPPORTED, f"{near:,} bytes stored; an update growing it past 16 MiB "
            "was accepted: this server does not enforce 16 MiB",
            f"aggbox's own budget guards it: max_document_bytes ({budget:,} bytes) parks "
            "a message that would exceed it (document_size_budget)")


# -- sessions ----------------------------------------------------------------------------------
def retryable(ctx: Context) -> Outcome:
    supported, why = retryable_writes(ctx.hello, ctx.uri_options)
    if supported:
        return (Status.PASS, why, "pymongo retries a write once across a failover; "
                "transactions are not needed (one document per write)")
    return (Status.UNSUPPORTED, why, "not needed: a write that fails with a transient error "
            "is re-read and folded again by the writer, the batch is retried as a whole "
            "(transactions are not needed either)")


CHECKS: Final = (
    Check("conditional_update", "conditional update on {_id, _v}", conditional_update,
          "the writer's optimistic concurrency cannot be relied on"),
    Check("bulk_errors", "per-operation errors, unordered bulk", bulk_errors,
          "the writer cannot tell conflicts from other errors"),
    Check("upsert_race", "upsert race on a new _id (E11000)", upsert_race,
          "concurrent writers of a new aggregate are not detected"),
    Check("inbox_window", "inbox window: the writer's $slice", library.inbox_window,
          "the writer cannot keep the inbox within its window"),
    Check("set_on_insert", "$setOnInsert of side records", library.set_on_insert,
          "dead letters and parked messages cannot be recorded"),
    Check("outbox_pull", "the dispatcher's $pull of published entries", library.outbox_pull,
          "published entries cannot be removed from the outbox"),
    Check("bson_types", "Decimal128, UUID, datetime round trip", bson_types,
          "values may change on their way through the store"),
    Check("indexes", "indexes of writer and archive (TTL)", indexes,
          "the writer cannot create the indexes it needs"),
    Check("size_budget", "document at max_document_bytes", size_budget,
          "lower max_document_bytes"),
    Check("size_limit", "16 MiB: under stored, over refused", size_limit,
          "aggbox's budget (max_document_bytes) is the guard",
          fallback="aggbox's own budget guards it: documents stay within "
                   "max_document_bytes"),
)

#: After the change-stream checks (they need no writes of their own).
LAST: Final = Check("retryable_writes", "retryable writes", retryable,
                    "the writer retries transient errors itself",
                    fallback="not needed: the writer re-reads and folds again after a "
                             "transient error")
