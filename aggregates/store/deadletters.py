"""The dead-letter collection: messages that cannot be applied, with the reason.

Writing a dead letter is idempotent: one document per (message, aggregate), ``attempts``
counts how often it was dead-lettered, ``first_seen``/``last_seen`` bracket it.

``status`` is ``open`` until a replay settles it (``replayed``, ``superseded``, ``parked``) or
an operator dismisses it (``dismissed``, with ``dismissed_at`` and an optional
``dismiss_note``). Dead letters are never deleted; one dead-lettered again is ``open`` again."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pymongo import ASCENDING, UpdateOne
from pymongo.database import Database

from aggregates.core.bulk import upsert_all
from aggregates.core.errors import ConfigurationError
from aggregates.core.ids import raw_message_id
from aggregates.core.keys import dead_letter_key
from aggregates.fold import DeadLetter

#: ``status`` of a dead letter an operator dismissed (see :meth:`DeadLetterStore.dismiss`).
DISMISSED = "dismissed"


def dead_letter_id(letter: DeadLetter) -> str:
    """The ``_id`` of ``letter``: ``<aggregate type>/<aggregate id>/<message id>`` with each
    part escaped (:func:`aggregates.core.keys.dead_letter_key`, unambiguous) for a message;
    ``raw_message_id`` of the text for a raw input line (so, for a line without a usable
    ``message_id``, the same id its outcome reports); of the ``repr`` of the text and the
    record headers when the input had headers that matter (a binary-mode CloudEvent); for
    an outbox entry or timer as stored (a mapping, the dispatcher's ``invalid_outbox_entry``)
    with its entry id and aggregate, the key of a message's (``<type>/<id>/<entry id>``);
    of ``repr`` for other raw values."""
    if letter.message is not None:
        m = letter.message
        return dead_letter_key(m.aggregate_type, m.aggregate_id, m.message_id)
    if (isinstance(letter.raw, Mapping) and letter.message_id is not None
            and letter.aggregate_type is not None and letter.aggregate_id is not None):
        return dead_letter_key(letter.aggregate_type, letter.aggregate_id, letter.message_id)
    if letter.record_headers is not None:  # the same value with other headers: another input
        return raw_message_id(repr((letter.raw, letter.record_headers)))
    if isinstance(letter.raw, str):
        return raw_message_id(letter.raw)
    return raw_message_id(repr(letter.raw))


def raw_line_id(line: str) -> str:
    """The identity of an input line that is no valid message, as its outcome reports it:
    the line's ``message_id`` when it is JSON with a non-empty string ``message_id``, else
    ``raw_message_id(line)``."""
    try:
        decoded = json.loads(line)
    except (ValueError, RecursionError):
        decoded = None
    mid = decoded.get("message_id") if isinstance(decoded, dict) else None
    return mid if isinstance(mid, str) and mid else raw_message_id(line)


def letter_message_id(letter: DeadLetter) -> str | None:
    """The ``message_id`` stored with ``letter`` (``aggbox deadletters show`` finds it by
    it): the one given (the dispatcher gives the entry id of every dead letter it writes),
    else the message's, else :func:`raw_line_id` of a raw line; ``None`` for other raw
    values."""
    if letter.message_id is not None:
        return letter.message_id
    if letter.message is not None:
        return letter.message.message_id
    if isinstance(letter.raw, str):
        return raw_line_id(letter.raw)
    return None


def dead_letter_update(letter: DeadLetter, *, now: datetime
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``(filter, update)`` of the idempotent upsert that records ``letter`` — shared
    with writers that use another client (the dispatcher's async one), so every dead letter
    has the same shape."""
    msg = letter.message
    extra: dict[str, Any] = {}
    if letter.record_headers is not None and msg is None:
        # BSON binary values: header bytes need not be UTF-8.
        extra["record_headers"] = [{"key": k, "value": v} for k, v in letter.record_headers]
    return (
        {"_id": dead_letter_id(letter)},
        {
            "$setOnInsert": {"first_seen": now},
            "$set": {
                **extra,
                "message_id": letter_message_id(letter),
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
        upsert_all(self.coll, ops)

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
        before: datetime | None = None,
        since: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """Dead letters, newest first; ``before``/``since`` bound ``last_seen``; ``limit=0``:
        no limit."""
        query = _query(reason=reason, aggregate_type=aggregate_type, status=status,
                       before=before, since=since)
        return list(self.coll.find(query).sort("last_seen", -1).limit(limit))

    def counts_by_reason(
        self,
        *,
        ids: Sequence[str] | None = None,
        reason: str | None = None,
        aggregate_type: str | None = None,
        status: str | None = "open",
        before: datetime | None = None,
        since: datetime | None = None,
    ) -> dict[str, int]:
        """How many dead letters (open ones by default) there are of each reason."""
        query = _query(ids=ids, reason=reason, aggregate_type=aggregate_type, status=status,
                       before=before, since=since)
        out: dict[str, int] = {}
        for d in self.coll.find(query, {"reason": 1}):
            out[d["reason"]] = out.get(d["reason"], 0) + 1
        return out

    def dismiss(
        self,
        *,
        ids: Sequence[str] | None = None,
        reason: str | None = None,
        aggregate_type: str | None = None,
        before: datetime | None = None,
        since: datetime | None = None,
        note: str | None = None,
        now: datetime | None = None,
        dry_run: bool = False,
    ) -> int:
        """Mark the matching open dead letters ``dismissed``; returns how many (would be)."""
        if isinstance(ids, str):
            raise ConfigurationError(
                f"ids must be a list of dead-letter ids or message ids, not the string "
                f"{ids!r}: pass ids=[{ids!r}] (on the command line: --id ID, repeatable)")
        if not (ids or reason or aggregate_type or before or since):
            raise ConfigurationError(
                "say which dead letters to dismiss: ids=[...], reason=..., "
                "aggregate_type=..., before=... or since=... (on the command line: --id, "
                "--reason, --aggregate-type, --before or --since); there is no 'dismiss all'")
        query = _query(ids=ids, reason=reason, aggregate_type=aggregate_type, status="open",
                       before=before, since=since)
        if dry_run:
            return int(self.coll.count_documents(query))
        at = now or datetime.now(UTC)
        fields: dict[str, Any] = {"status": DISMISSED, "status_at": at, "dismissed_at": at}
        if note:
            fields["dismiss_note"] = note
        # status "open" is part of the filter: running it again dismisses nothing.
        return int(self.coll.update_many(query, {"$set": fields}).modified_count)

    def mark(self, ids: Sequence[str], *, status: str, now: datetime) -> int:
        res = self.coll.update_many({"_id": {"$in": list(ids)}},
                                    {"$set": {"status": status, "status_at": now}})
        return int(res.modified_count)


def _query(
    *,
    ids: Sequence[str] | None = None,
    reason: str | None = None,
    aggregate_type: str | None = None,
    status: str | None = None,
    before: datetime | None = None,
    since: datetime | None = None,
) -> dict[str, Any]:
    before, since = _utc(before), _utc(since)
    if before is not None and since is not None and since >= before:
        raise ConfigurationError(
            f"since ({since.isoformat()}) is not earlier than before ({before.isoformat()}): "
            "no dead letter can match; swap them or widen the range (on the command line: "
            "--since must be earlier than --before)")
    query: dict[str, Any] = {}
    if ids:
        wanted = list(ids)
        query["$or"] = [{"_id": {"$in": wanted}}, {"message_id": {"$in": wanted}}]
    if reason:
        query["reason"] = reason
    if aggregate_type:
        query["aggregate_type"] = aggregate_type
    if status:
        query["status"] = status
    seen: dict[str, datetime] = {}
    if since is not None:
        seen["$gte"] = since
    if before is not None:
        seen["$lt"] = before
    if seen:
        query["last_seen"] = seen
    return query


def _utc(at: datetime | None) -> datetime | None:
    """``at`` with a time zone: naive times are UTC, as MongoDB stores them."""
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


def _raw_text(raw: Any, limit: int = 64 * 1024) -> str:
    text = raw if isinstance(raw, str) else repr(raw)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars, truncated)"
