"""The dead-letter collection: messages that cannot be applied, with the reason.

Writing a dead letter is idempotent: one document per (message, aggregate), ``attempts``
counts how often it was dead-lettered, ``first_seen``/``last_seen`` bracket it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, UpdateOne
from pymongo.database import Database

from aggregates.bulk import bulk_write_unordered
from aggregates.bulk import raise_on_errors as _raise_on_errors
from aggregates.fold import DeadLetter


def dead_letter_id(letter: DeadLetter) -> str:
    if letter.message is not None:
        m = letter.message
        return f"{m.aggregate_type}/{m.aggregate_id}/{m.message_id}"
    from aggregates.ids import raw_message_id

    return raw_message_id(repr(letter.raw))


def dead_letter_update(letter: DeadLetter, *, now: datetime
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``(filter, update)`` of the idempotent upsert that records ``letter`` — shared
    with writers that use another client (the dispatcher's async one), so every dead letter
    has the same shape."""
    msg = letter.message
    return (
        {"_id": dead_letter_id(letter)},
        {
            "$setOnInsert": {"first_seen": now},
            "$set": {
                "message_id": msg.message_id if msg else None,
                "aggregate_type": letter.aggregate_type,
                "aggregate_id": letter.aggregate_id,
                "message": msg.to_dict() if msg else None,
                "raw": None if msg else _raw_text(letter.raw),
                "reason": letter.reason,
                "error": letter.detail,
                "traceback": letter.traceback,
                "last_seen": now,
                "status": "open",
            },
            "$inc": {"attempts": 1},
        },
    )


class DeadLetterStore:
    """Reads and writes ``aggbox_dead_letters`` (name configurable)."""

    def __init__(self, db: Database[Any], *, collection: str = "aggbox_dead_letters") -> None:
        self.coll = db[collection]

    def ensure_indexes(self) -> None:
        self.coll.create_index([("reason", ASCENDING), ("last_seen", ASCENDING)])
        self.coll.create_index([("aggregate_type", ASCENDING), ("aggregate_id", ASCENDING)])
        self.coll.create_index([("message_id", ASCENDING)])

    def write(self, letters: Sequence[DeadLetter], *, now: datetime) -> None:
        if not letters:
            return
        ops = [UpdateOne(*dead_letter_update(dl, now=now), upsert=True) for dl in letters]
        _raise_on_errors(bulk_write_unordered(self.coll, ops))

    def get(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """The dead letters whose ``_id`` or ``message_id`` is in ``ids`` (any status)."""
        wanted = list(ids)
        if not wanted:
            return []
        query = {"$or": [{"_id": {"$in": wanted}}, {"message_id": {"$in": wanted}}]}
        return list(self.coll.find(query).sort("last_seen", -1))

    def list(
        self,
        *,
        reason: str | None = None,
        aggregate_type: str | None = None,
        status: str | None = "open",
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        query: dict[str, Any] = {}
        if reason:
            query["reason"] = reason
        if aggregate_type:
            query["aggregate_type"] = aggregate_type
        if status:
            query["status"] = status
        return list(self.coll.find(query).sort("last_seen", -1).limit(limit))

    def counts_by_reason(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.coll.find({"status": "open"}, {"reason": 1}):
            out[d["reason"]] = out.get(d["reason"], 0) + 1
        return out

    def mark(self, ids: Sequence[str], *, status: str, now: datetime) -> int:
        res = self.coll.update_many({"_id": {"$in": list(ids)}},
                                    {"$set": {"status": status, "status_at": now}})
        return int(res.modified_count)


def _raw_text(raw: Any, limit: int = 64 * 1024) -> str:
    text = raw if isinstance(raw, str) else repr(raw)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars, truncated)"
