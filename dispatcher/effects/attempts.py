"""The attempt records of effects, one document per effect entry in ``aggbox_effects``
(docs/design.md "Side effects").

    { _id:        "<collection>/<entry id>"      (keys.join_parts: unambiguous)
      collection, aggregate_id, type, entry_id
      state:      "attempting" | "succeeded" | "failed"
      attempts:   <int>       calls started (begun), across restarts and instances
      first_at, last_at, finished_at
      last_reason, last_error                    the last retryable failure
      result:     { ... }     succeeded: the success reply's payload
      reason, error           failed: why }

``state: attempting`` with ``attempts ≥ 1`` is an attempt without a recorded result: the
call may or may not have taken effect (a crash, a timeout, a dropped response). A final
state is written once: :meth:`Attempts.finish` matches only ``state: attempting``, so the
first result recorded wins and every later reader delivers that one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from pymongo import ReturnDocument
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from aggregates.core.keys import join_parts

__all__ = ["ATTEMPTING", "DEFAULT_COLLECTION", "FAILED", "SUCCEEDED", "AttemptRecord",
           "Attempts", "attempt_key"]

DEFAULT_COLLECTION: Final = "aggbox_effects"
ATTEMPTING: Final = "attempting"
SUCCEEDED: Final = "succeeded"
FAILED: Final = "failed"
State = Literal["attempting", "succeeded", "failed"]


def attempt_key(collection: str, entry_id: str) -> str:
    return join_parts(collection, entry_id)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    key: str
    state: State
    attempts: int
    result: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    error: str | None = None
    last_reason: str | None = None
    last_error: str | None = None
    finished_at: datetime | None = None

    @property
    def final(self) -> bool:
        return self.state != ATTEMPTING

    @property
    def open(self) -> bool:
        """A call was begun and no result recorded: its outcome is unknown."""
        return self.state == ATTEMPTING and self.attempts > 0

    @classmethod
    def from_document(cls, doc: dict[str, Any] | None, key: str = "") -> AttemptRecord:
        if doc is None:  # removed by an operator meanwhile: nothing recorded
            return cls(key=key, state=ATTEMPTING, attempts=0)
        return cls(key=doc["_id"], state=doc.get("state", ATTEMPTING),
                   attempts=int(doc.get("attempts", 0)), result=doc.get("result") or {},
                   reason=doc.get("reason"), error=doc.get("error"),
                   last_reason=doc.get("last_reason"), last_error=doc.get("last_error"),
                   finished_at=doc.get("finished_at"))


class Attempts:
    """Reads and writes attempt records (the runner's only store besides the aggregate)."""

    def __init__(self, db: AsyncDatabase[Any], *, collection: str = DEFAULT_COLLECTION) -> None:
        self.coll: AsyncCollection[Any] = db[collection]

    async def ensure_indexes(self) -> None:
        """``{state, last_at}``: operators list open and failed attempts (docs/operations.md)."""
        await self.coll.create_index([("state", 1), ("last_at", 1)], name="aggbox_effect_state")

    async def read(self, key: str) -> AttemptRecord | None:
        doc = await self.coll.find_one({"_id": key})
        return None if doc is None else AttemptRecord.from_document(doc)

    async def begin(self, key: str, *, meta: dict[str, Any], now: datetime) -> AttemptRecord:
        """Record durably that a call is about to be made (``attempts`` + 1) — unless a
        result is already recorded, which is then returned unchanged."""
        try:
            doc = await self.coll.find_one_and_update(
                {"_id": key, "state": ATTEMPTING},
                {"$inc": {"attempts": 1}, "$set": {"last_at": now},
                 "$setOnInsert": {**meta, "state": ATTEMPTING, "first_at": now}},
                upsert=True, return_document=ReturnDocument.AFTER)
        except DuplicateKeyError:
            # The filter did not match because the record is final (the upsert then
            # collides with it on _id): nothing to begin.
            doc = await self.coll.find_one({"_id": key})
        return AttemptRecord.from_document(doc, key)

    async def note_failure(self, key: str, *, reason: str, error: str) -> None:
        """A retryable failure: the attempt stays open (its outcome may be unknown)."""
        await self.coll.update_one({"_id": key, "state": ATTEMPTING},
                                   {"$set": {"last_reason": reason, "last_error": error}})

    async def finish(self, key: str, *, state: Literal["succeeded", "failed"], now: datetime,
                     result: dict[str, Any] | None = None, reason: str | None = None,
                     error: str | None = None, meta: dict[str, Any] | None = None
                     ) -> AttemptRecord:
        """Record the result once; if another result was recorded first, that one is
        returned (and is the one to deliver)."""
        update: dict[str, Any] = {"state": state, "finished_at": now, "last_at": now}
        if state == SUCCEEDED:
            update["result"] = result or {}
        else:
            update["reason"] = reason
            update["error"] = error
        try:
            doc = await self.coll.find_one_and_update(
                {"_id": key, "state": ATTEMPTING},
                {"$set": update, "$setOnInsert": {**(meta or {}), "attempts": 0,
                                                   "first_at": now}},
                upsert=True, return_document=ReturnDocument.AFTER)
        except DuplicateKeyError:
            doc = await self.coll.find_one({"_id": key})
        return AttemptRecord.from_document(doc, key)
