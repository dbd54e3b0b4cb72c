"""The inbox archive: ids that left an aggregate document's inbox, kept for the dedup
horizon (docs/design.md "Dedup"). One collection per aggregate collection.

A document per archived id::

    {_id: "<len(aggregate id)>:<aggregate id><message id>",  # length-prefixed: no two
                                      # (aggregate, message) pairs share a key ("ab"+"c" is
                                      # "2:abc", "a"+"bc" is "1:abc")
     a: <aggregate id>, m: <message id>,
     t: <occurred_at>, h: <payload hash>, at: <archived at>,
     x: <expire at>,                              # TTL index; absent for undated ids
     w: <_v of the write that stored the entry>}  # run stamps only (aggregates.dedup.runs)

Writes are idempotent upserts (``$setOnInsert``), made *before* the conditional document
write that evicts the ids; lookups come *after* the document read they complete. Both
orders matter for the argument in docs/design.md "Dedup".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from pymongo import ASCENDING
from pymongo.database import Database
from pymongo.errors import BulkWriteError, OperationFailure

from aggregates.core.bulk import DUPLICATE_KEY, error_labels
from aggregates.core.errors import StoreError
from aggregates.core.keys import archive_key  # the archive ``_id`` (unambiguous)
from aggregates.core.unsupported import UnsupportedByServer, not_implemented
from aggregates.dedup.core import InboxEntry, RecordArchive

__all__ = ["InboxArchive", "archive_collection", "archive_key"]


class Expiry(Protocol):
    """What the archive needs of its strategy (the :class:`~aggregates.dedup.inbox.Inbox`,
    which creates the archive: a protocol, so the two modules do not import each other)."""

    def expire_at(self, entry: InboxEntry, now: datetime) -> datetime | None: ...

#: Ids per lookup query (keeps each query's ``$in`` well below the 16 MiB command limit).
LOOKUP_BATCH = 2000


def archive_collection(collection: str) -> str:
    """The archive collection of an aggregate collection."""
    return f"{collection}_inbox_archive"


class InboxArchive(RecordArchive):
    """Reads and writes the inbox archive of one aggregate collection."""

    def __init__(self, db: Database[Any], collection: str, inbox: Expiry) -> None:
        self.coll = db[archive_collection(collection)]
        self.inbox = inbox

    def ensure_indexes(self) -> None:
        # TTL: MongoDB removes a document some time after ``x`` (never before), and never
        # one without ``x`` (undated ids). The dedup argument needs only "never before".
        try:
            self.coll.create_index([("x", ASCENDING)], expireAfterSeconds=0,
                                   name="aggbox_ttl")
        except OperationFailure as exc:
            if not_implemented(exc):  # e.g. FerretDB 1.x: code 238 NotImplemented
                raise UnsupportedByServer(
                    f"the server does not support TTL indexes (expireAfterSeconds; code "
                    f"{exc.code}): aggbox needs one on {self.coll.name} to forget the ids "
                    "of Inbox dedup after the dedup horizon; use MongoDB (types with "
                    "HighWater dedup need no archive), and run `aggbox check-store` to see "
                    "what else this server lacks") from exc
            raise

    def write(self, entries: Iterable[tuple[str, InboxEntry]], *, now: datetime,
              store_now: datetime | None = None) -> int:
        """Archive ``(aggregate_id, entry)`` pairs; returns how many were sent.

        ``x`` is read by the server's TTL monitor against the server's clock: with
        ``store_now`` (a writer whose clock is not the wall clock: a test's fixed clock) it
        is put as far ahead of ``store_now`` as the expiry is of ``now``; otherwise the
        writer's clock is the store's, up to ``Inbox(clock_skew=...)``.

        Plain unordered inserts: an entry never changes, so an id archived before (a rerun,
        or a rival writer) is a duplicate-key error that means "already there" and is
        ignored — cheaper than upserts on MongoDB and on the stand-in."""
        docs: list[dict[str, Any]] = []
        for aggregate_id, e in entries:
            mid = str(e[0])
            doc: dict[str, Any] = {"_id": archive_key(aggregate_id, mid), "a": aggregate_id,
                                   "m": mid, "at": now}
            if isinstance(e[1], datetime):
                doc["t"] = e[1]
            if len(e) > 2 and e[2]:
                doc["h"] = e[2]
            if len(e) > 3:
                doc["w"] = e[3]
            expire = self.inbox.expire_at(e, now)
            if expire is not None:
                doc["x"] = expire if store_now is None else store_now + (expire - now)
            docs.append(doc)
        self.insert_documents(docs)
        return len(docs)

    def insert_documents(self, docs: Sequence[Any]) -> None:
        """Store archive documents as :meth:`write` builds them (dicts, or their BSON as
        ``RawBSONDocument``s: the batch fold's, aggregates/store/native_pass.py). An id
        archived before is a duplicate key: already there, ignored."""
        if not docs:
            return
        try:
            self.coll.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            labels = error_labels(exc)
            wc = exc.details.get("writeConcernErrors") or []
            if wc:
                raise StoreError(f"write concern not satisfied on {self.coll.name}; the "
                                 "batch fails so it is retried",
                                 code=_code(wc[0]), labels=labels) from exc
            others = [e for e in exc.details.get("writeErrors", [])
                      if e.get("code") != DUPLICATE_KEY]
            if others:
                raise StoreError(f"archiving inbox ids in {self.coll.name} failed: code "
                                 f"{others[0].get('code')}: {others[0].get('errmsg')}",
                                 code=_code(others[0]), labels=labels) from exc

    def lookup(self, pairs: Sequence[tuple[str, str]]) -> dict[str, dict[str, str | None]]:
        """Which of ``(aggregate_id, message_id)`` are archived: aggregate id → message id →
        payload hash."""
        return self.lookup_tagged(pairs)[0]

    def lookup_tagged(self, pairs: Sequence[tuple[str, str]]
                      ) -> tuple[dict[str, dict[str, str | None]], dict[str, dict[str, int]]]:
        out: dict[str, dict[str, str | None]] = {}
        tags: dict[str, dict[str, int]] = {}
        keys = {archive_key(a, m): (a, m) for a, m in pairs}
        ids = list(keys)
        for i in range(0, len(ids), LOOKUP_BATCH):
            for doc in self.coll.find({"_id": {"$in": ids[i:i + LOOKUP_BATCH]}},
                                      {"h": 1, "w": 1}):
                a, m = keys[doc["_id"]]
                out.setdefault(a, {})[m] = doc.get("h")
                w = doc.get("w")
                if isinstance(w, int):
                    tags.setdefault(a, {})[m] = w
        return out, tags


def _code(err: dict[str, Any]) -> int | None:
    code = err.get("code")
    return code if isinstance(code, int) else None
