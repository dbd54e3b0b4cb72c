"""The parked-message collection: messages that wait (sequence gap, full outbox, blocked
aggregate). They are retried whenever their aggregate is processed again, and can be listed
and released from the command line."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DeleteOne, UpdateOne
from pymongo.database import Database

from aggregates.core.bulk import upsert_all
from aggregates.core.keys import parked_key
from aggregates.fold import Parked
from aggregates.message.envelope import Message


def parked_id(collection: str, aggregate_id: str, message_id: str) -> str:
    """``<collection>/<aggregate id>/<message id>``, each part escaped
    (:func:`aggregates.core.keys.parked_key`): no two messages share a parked document."""
    return parked_key(collection, aggregate_id, message_id)


class ParkedStore:
    """Reads and writes ``aggbox_parked`` (name configurable)."""

    def __init__(self, db: Database[Any], *, collection: str = "aggbox_parked") -> None:
        self.coll = db[collection]

    def ensure_indexes(self) -> None:
        self.coll.create_index([("collection", ASCENDING), ("aggregate_id", ASCENDING)])
        self.coll.create_index([("reason", ASCENDING)])

    def load(self, collection: str, aggregate_ids: Sequence[str]) -> dict[str, list[Parked]]:
        out: dict[str, list[Parked]] = defaultdict(list)
        if not aggregate_ids:
            return out
        for doc in self.coll.find(
            {"collection": collection, "aggregate_id": {"$in": list(aggregate_ids)}}
        ):
            out[doc["aggregate_id"]].append(
                Parked(Message.from_dict(doc["message"], max_payload_bytes=0), doc["reason"],
                       doc.get("detail")))
        return out

    def apply(
        self,
        collection: str,
        parked: Sequence[Parked],
        released: Sequence[tuple[str, str]],
        *,
        now: datetime,
    ) -> None:
        """Upsert newly parked messages, delete released ones (``(aggregate_id, message_id)``)."""
        ops: list[Any] = []
        for p in parked:
            m = p.message
            ops.append(
                UpdateOne(
                    {"_id": parked_id(collection, m.aggregate_id, m.message_id)},
                    {
                        "$setOnInsert": {"parked_at": now},
                        "$set": {
                            "collection": collection,
                            "aggregate_type": m.aggregate_type,
                            "aggregate_id": m.aggregate_id,
                            "message_id": m.message_id,
                            "message": m.to_dict(),
                            "reason": p.reason,
                            "detail": p.detail,
                            "last_seen": now,
                        },
                        "$inc": {"attempts": 1},
                    },
                    upsert=True,
                )
            )
        for aid, mid in released:
            ops.append(DeleteOne({"_id": parked_id(collection, aid, mid)}))
        if ops:
            upsert_all(self.coll, ops)

    def for_aggregate(self, aggregate_type: str, aggregate_id: str) -> list[dict[str, Any]]:
        """The parked entries of one aggregate, oldest first."""
        query = {"aggregate_type": aggregate_type, "aggregate_id": aggregate_id}
        return list(self.coll.find(query).sort("parked_at", 1))

    def list(self, *, aggregate_type: str | None = None, reason: str | None = None,
             limit: int = 100) -> list[dict[str, Any]]:
        query: dict[str, Any] = {}
        if aggregate_type:
            query["aggregate_type"] = aggregate_type
        if reason:
            query["reason"] = reason
        return list(self.coll.find(query).sort("parked_at", 1).limit(limit))

    def count(self) -> int:
        return int(self.coll.count_documents({}))
