"""The backlog gauges: pending entries, documents with a pending outbox, the oldest entry's
age (one aggregation per collection, every ``metrics_interval_s``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection

from aggregates.fold.document import F_OUTBOX
from dispatcher.observe.metrics import Metrics
from dispatcher.outbox.sweep import PENDING

__all__ = ["measure_backlog", "pending_entries"]

_PIPELINE: list[dict[str, Any]] = [
    {"$match": PENDING},
    {"$project": {"n": {"$size": f"${F_OUTBOX}"},
                  "first": {"$arrayElemAt": [f"${F_OUTBOX}.created_at", 0]}}},
    {"$group": {"_id": None, "n": {"$sum": "$n"}, "docs": {"$sum": 1},
                "oldest": {"$min": "$first"}}},
]


async def measure_backlog(coll: AsyncCollection[Any], metrics: Metrics, name: str,
                          *, now: datetime | None = None,
                          where: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """Pending entries, documents and the oldest entry's age (of the partitions ``where``
    selects, if given: this instance's share), into the gauges."""
    stages = _PIPELINE
    if where:
        stages = [{"$match": {**PENDING, **where}}, *_PIPELINE[1:]]
    rows = await (await coll.aggregate(stages)).to_list()
    row = rows[0] if rows else {"n": 0, "docs": 0, "oldest": None}
    age = 0.0
    oldest = row.get("oldest")
    if isinstance(oldest, datetime):
        if oldest.tzinfo is None:
            oldest = oldest.replace(tzinfo=UTC)
        age = max(0.0, ((now or datetime.now(UTC)) - oldest).total_seconds())
    metrics.backlog.labels(name).set(float(row.get("n") or 0))
    metrics.backlog_documents.labels(name).set(float(row.get("docs") or 0))
    metrics.oldest_pending_age.labels(name).set(age)
    return {"entries": row.get("n", 0), "documents": row.get("docs", 0), "oldest_age_s": age}


async def pending_entries(coll: AsyncCollection[Any]) -> int:
    """Pending entries of the whole collection (every partition): what ``--once`` leaves
    behind (its summary says it)."""
    rows = await (await coll.aggregate(_PIPELINE)).to_list()
    return int(rows[0].get("n") or 0) if rows else 0
