"""Release a blocked aggregate and retry its parked messages (``aggbox parked release``).

An aggregate type with ``on_handler_error="park"`` blocks an aggregate when a handler fails:
the failing message is dead-lettered, the aggregate gets ``_blocked`` and its later messages
are parked. Releasing clears ``_blocked`` — with ``$unset`` *and* ``$inc: {_v: 1}``, so a
writer that read the blocked document conflicts and re-reads instead of overwriting — and
then retries the aggregate's parked messages through :meth:`StoreWriter.retry_parked`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo import ReturnDocument
from pymongo.database import Database

from aggregates.core.settings import AggboxSettings
from aggregates.domain.aggregate import Registry
from aggregates.fold.document import F_BLOCKED, F_VERSION
from aggregates.message.outcomes import Outcome
from aggregates.store.writer import StoreWriter, utc_now


@dataclass
class ReleaseResult:
    """What :func:`release_aggregate` did. ``cleared`` is the ``_blocked`` value removed
    (``None``: the aggregate was not blocked); ``outcomes`` those of the parked messages
    settled by the retry (``from_parked``). Messages that still wait produce no outcome and
    stay in the parked collection."""

    aggregate_type: str
    aggregate_id: str
    cleared: dict[str, Any] | None = None
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def blocking_dead_letter(self) -> str | None:
        """The dead-letter id of the message whose handler failure blocked the aggregate."""
        if not self.cleared or not self.cleared.get("message_id"):
            return None
        return f"{self.aggregate_type}/{self.aggregate_id}/{self.cleared['message_id']}"


def clear_block(db: Database[Any], collection: str, aggregate_id: str) -> dict[str, Any] | None:
    """Remove ``_blocked`` from one aggregate document (``$unset`` + ``$inc: {_v: 1}``, so a
    concurrent writer holding the old version conflicts). Returns the removed value, or
    ``None`` when the aggregate was not blocked (nothing is written then)."""
    before = db[collection].find_one_and_update(
        {"_id": aggregate_id, F_BLOCKED: {"$exists": True}},
        {"$unset": {F_BLOCKED: ""}, "$inc": {F_VERSION: 1}},
        projection={F_BLOCKED: 1},
        return_document=ReturnDocument.BEFORE,
    )
    if before is None:
        return None
    blocked = before.get(F_BLOCKED)
    return dict(blocked) if isinstance(blocked, dict) else {"value": blocked}


def release_aggregate(
    db: Database[Any],
    registry: Registry,
    aggregate_type: str,
    aggregate_id: str,
    *,
    settings: AggboxSettings | None = None,
    clock: Callable[[], datetime] = utc_now,
) -> ReleaseResult:
    """Clear ``_blocked`` on one aggregate (if set), then retry its parked messages.

    The message that blocked it stays a dead letter: fix the handler and replay it with
    :func:`replay_dead_letters` (``aggbox deadletters replay --id …``)."""
    atype = registry.get(aggregate_type)
    s = settings or AggboxSettings.load()
    result = ReleaseResult(atype.name, aggregate_id)
    result.cleared = clear_block(db, atype.collection, aggregate_id)
    writer = StoreWriter(db, registry, settings=s, clock=clock)
    result.outcomes = writer.retry_parked(atype.name, [aggregate_id])
    return result


__all__ = ["ReleaseResult", "clear_block", "release_aggregate"]
