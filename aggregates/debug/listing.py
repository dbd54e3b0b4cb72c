"""Dead letters and parked messages as flat records (for tables) and DataFrames."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pymongo.database import Database

from aggregates.core.settings import AggboxSettings
from aggregates.debug._deps import make_frame, require_pandas
from aggregates.store.deadletters import DeadLetterStore
from aggregates.store.parking import ParkedStore

if TYPE_CHECKING:
    import pandas as pd

#: Columns of :func:`dead_letters`, in order.
DEAD_LETTER_COLUMNS = ("id", "message_id", "aggregate_type", "aggregate_id", "message_type",
                       "reason", "error", "attempts", "status", "first_seen", "last_seen",
                       "message", "raw", "traceback")
#: Columns of :func:`parked_messages`, in order.
PARKED_COLUMNS = ("id", "message_id", "aggregate_type", "aggregate_id", "collection",
                  "message_type", "reason", "detail", "attempts", "parked_at", "last_seen",
                  "message")


def dead_letter_record(doc: Mapping[str, Any]) -> dict[str, Any]:
    """One stored dead letter as a flat record (keys :data:`DEAD_LETTER_COLUMNS`)."""
    message = doc.get("message") or None
    return {
        "id": doc.get("_id"),
        "message_id": doc.get("message_id"),
        "aggregate_type": doc.get("aggregate_type"),
        "aggregate_id": doc.get("aggregate_id"),
        "message_type": message.get("type") if isinstance(message, Mapping) else None,
        "reason": doc.get("reason"),
        "error": doc.get("error"),
        "attempts": doc.get("attempts"),
        "status": doc.get("status"),
        "first_seen": doc.get("first_seen"),
        "last_seen": doc.get("last_seen"),
        "message": message,
        "raw": doc.get("raw"),
        "traceback": doc.get("traceback"),
    }


def parked_record(doc: Mapping[str, Any]) -> dict[str, Any]:
    """One stored parked message as a flat record (keys :data:`PARKED_COLUMNS`)."""
    message = doc.get("message") or None
    return {
        "id": doc.get("_id"),
        "message_id": doc.get("message_id"),
        "aggregate_type": doc.get("aggregate_type"),
        "aggregate_id": doc.get("aggregate_id"),
        "collection": doc.get("collection"),
        "message_type": message.get("type") if isinstance(message, Mapping) else None,
        "reason": doc.get("reason"),
        "detail": doc.get("detail"),
        "attempts": doc.get("attempts"),
        "parked_at": doc.get("parked_at"),
        "last_seen": doc.get("last_seen"),
        "message": message,
    }


def dead_letters(
    db: Database[Any],
    *,
    reason: str | None = None,
    aggregate_type: str | None = None,
    status: str | None = "open",
    limit: int = 100,
    settings: AggboxSettings | None = None,
) -> pd.DataFrame:
    """Dead letters, newest first, as a DataFrame (columns :data:`DEAD_LETTER_COLUMNS`).

    ``status``: ``"open"`` (default), ``"replayed"``, ``"parked"`` or ``None`` for all.
    Needs pandas (``pip install aggbox[notebook]``)."""
    require_pandas("dead_letters()")
    s = settings or AggboxSettings.load()
    store = DeadLetterStore(db, collection=s.dead_letter_collection)
    docs = store.list(reason=reason, aggregate_type=aggregate_type, status=status, limit=limit)
    return make_frame("dead_letters()", [dead_letter_record(d) for d in docs],
                      DEAD_LETTER_COLUMNS)


def parked_messages(
    db: Database[Any],
    *,
    reason: str | None = None,
    aggregate_type: str | None = None,
    limit: int = 100,
    settings: AggboxSettings | None = None,
) -> pd.DataFrame:
    """Parked messages, oldest first, as a DataFrame (columns :data:`PARKED_COLUMNS`).
    Needs pandas (``pip install aggbox[notebook]``)."""
    require_pandas("parked_messages()")
    s = settings or AggboxSettings.load()
    store = ParkedStore(db, collection=s.parked_collection)
    docs = store.list(aggregate_type=aggregate_type, reason=reason, limit=limit)
    return make_frame("parked_messages()", [parked_record(d) for d in docs], PARKED_COLUMNS)


__all__ = ["DEAD_LETTER_COLUMNS", "PARKED_COLUMNS", "dead_letter_record", "dead_letters",
           "parked_messages", "parked_record"]
