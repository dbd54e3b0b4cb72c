"""Reading what the run left in MongoDB: aggregate documents (with their outbox and pending
timers), dead letters, parked messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pymongo.database import Database

from aggbox.demo.oracle import Key
from aggregates.core.settings import AggboxSettings
from aggregates.domain.aggregate import Registry
from aggregates.fold.document import F_OUTBOX, F_TIMERS

__all__ = ["StoreView", "pending_outbox", "read_store"]


@dataclass(slots=True)
class StoreView:
    """Every aggregate document by ``(aggregate type, id)``, every dead letter and parked
    message."""

    documents: dict[Key, dict[str, Any]] = field(default_factory=dict)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    parked: list[dict[str, Any]] = field(default_factory=list)

    def of_type(self, aggregate_type: str) -> dict[str, dict[str, Any]]:
        return {aid: d for (t, aid), d in self.documents.items() if t == aggregate_type}

    @property
    def pending_outbox(self) -> int:
        return sum(len(d.get(F_OUTBOX) or []) for d in self.documents.values())

    @property
    def pending_timers(self) -> int:
        """Timers not yet due (or not yet fired): never counted as outbox entries."""
        return sum(len(d.get(F_TIMERS) or []) for d in self.documents.values())


def read_store(db: Database[Any], registry: Registry, settings: AggboxSettings) -> StoreView:
    view = StoreView()
    for atype in registry:
        for doc in db[atype.collection].find({}):
            view.documents[(atype.name, str(doc["_id"]))] = doc
    view.dead_letters = list(db[settings.dead_letter_collection].find({}))
    view.parked = list(db[settings.parked_collection].find({}))
    return view


def pending_outbox(db: Database[Any], registry: Registry) -> int:
    """Outbox entries still waiting for the dispatcher, over every aggregate collection."""
    total = 0
    for atype in registry:
        rows = db[atype.collection].aggregate([
            {"$match": {f"{F_OUTBOX}.0": {"$exists": True}}},
            {"$group": {"_id": None, "n": {"$sum": {"$size": f"${F_OUTBOX}"}}}},
        ])
        total += sum(int(r["n"]) for r in rows)
    return total
