"""Re-submit dead-lettered messages through the store writer.

Dedup still applies, so replaying is safe: a message that was applied meanwhile comes back
``duplicate``. Dead letters whose message ends ``applied`` or ``duplicate`` are marked
``replayed``; ``parked`` ones are marked ``parked`` (they now wait in the parked collection
and are retried with their aggregate); ones dead-lettered again stay ``open`` with the new
reason and ``attempts`` + 1 (the writer records them again)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pymongo.database import Database

from aggregates.core.errors import ConfigurationError, EnvelopeError
from aggregates.core.settings import AggboxSettings
from aggregates.domain.aggregate import Registry
from aggregates.message.envelope import Message
from aggregates.message.outcomes import Outcome
from aggregates.store.deadletters import DeadLetterStore
from aggregates.store.writer import StoreWriter, utc_now

#: Dead-letter status after a replay, by the message's outcome.
STATUS_AFTER: dict[str, str] = {"applied": "replayed", "duplicate": "replayed",
                                "parked": "parked", "dead_lettered": "open"}


@dataclass
class DeadLetterReplay:
    """What :func:`replay_dead_letters` did.

    ``outcomes``: every outcome of the writer run (including parked messages of the same
    aggregates released on the way, ``from_parked``); ``status``: dead-letter id → status
    after the replay; ``outcome_of``: dead-letter id → its message's outcome; ``skipped``:
    dead-letter id → why it could not be re-submitted (no valid message stored);
    ``missing``: requested ids that matched no dead letter."""

    outcomes: list[Outcome] = field(default_factory=list)
    status: dict[str, str] = field(default_factory=dict)
    outcome_of: dict[str, Outcome] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def replayed(self) -> list[str]:
        """Dead-letter ids now marked ``replayed``."""
        return [i for i, s in self.status.items() if s == "replayed"]

    @property
    def ok(self) -> bool:
        """Every selected dead letter was replayed (applied or duplicate)."""
        return (not self.skipped and not self.missing
                and all(s == "replayed" for s in self.status.values()))


def replay_dead_letters(
    db: Database[Any],
    registry: Registry,
    ids: Sequence[str] | None = None,
    *,
    reason: str | None = None,
    aggregate_type: str | None = None,
    all_open: bool = False,
    limit: int | None = None,
    settings: AggboxSettings | None = None,
    clock: Callable[[], datetime] = utc_now,
) -> DeadLetterReplay:
    """Re-submit dead letters through :class:`StoreWriter` and mark the settled ones.

    Select them by ``ids`` (dead-letter ``_id`` or message id; any status), or by ``reason``
    and/or ``aggregate_type`` among the open ones, or ``all_open=True``; ``limit`` caps a
    filtered selection. Messages are re-submitted in the order they occurred (``occurred_at``,
    then source sequence, then when they were first dead-lettered)."""
    s = settings or AggboxSettings.load()
    store = DeadLetterStore(db, collection=s.dead_letter_collection)
    result = DeadLetterReplay()
    docs = _select(store, result, ids, reason=reason, aggregate_type=aggregate_type,
                   all_open=all_open, limit=limit)
    pending = _messages(docs, result)
    if not pending:
        return result
    writer = StoreWriter(db, registry, settings=s, clock=clock)
    letter_of = {(m.aggregate_type, m.aggregate_id, m.message_id): lid for lid, m in pending}
    was_replayed = {str(d["_id"]) for d in docs if d.get("status") == "replayed"}
    result.outcomes = writer.process(m for _, m in pending)
    for o in result.outcomes:
        lid = letter_of.get((o.aggregate_type, o.aggregate_id, o.message_id))
        if lid is None or o.from_parked:
            continue
        result.outcome_of[lid] = o
        result.status[lid] = STATUS_AFTER[o.outcome]
        if (o.outcome == "duplicate" and lid not in was_replayed
                and not writer.registry.get(o.aggregate_type).dedup.duplicate_means_applied):
            # E.g. a high-water mark cannot tell "applied before" from "overtaken by a later
            # seq of the same source": unless a replay applied it, its effect may never have
            # been applied, so do not claim "replayed".
            result.status[lid] = "superseded"
    now = clock()
    for status in ("replayed", "parked", "superseded"):
        marked = [i for i, st in result.status.items() if st == status]
        if marked:
            store.mark(marked, status=status, now=now)
    return result


def _select(store: DeadLetterStore, result: DeadLetterReplay, ids: Sequence[str] | None, *,
            reason: str | None, aggregate_type: str | None, all_open: bool,
            limit: int | None) -> list[dict[str, Any]]:
    """The selected dead-letter documents (requested ids that match none go to
    ``result.missing``)."""
    if ids:
        docs = store.get(ids)
        found = {str(d["_id"]) for d in docs} | {str(d.get("message_id")) for d in docs}
        result.missing = [i for i in ids if i not in found]
        return docs[:limit] if limit else docs
    if reason or aggregate_type or all_open:
        return store.list(reason=reason, aggregate_type=aggregate_type, status="open",
                          limit=limit or 0)
    raise ConfigurationError(
        "say which dead letters to replay: ids=[...], reason=..., aggregate_type=... or "
        "all_open=True (on the command line: --id, --reason, --type or --all)"
    )


def _messages(docs: Sequence[Mapping[str, Any]], result: DeadLetterReplay
              ) -> list[tuple[str, Message]]:
    """``(dead-letter id, message)`` in the order they occurred; dead letters without a
    valid message go to ``result.skipped``."""
    pending: list[tuple[tuple[Any, ...], str, Message]] = []
    for doc in docs:
        letter_id = str(doc["_id"])
        raw = doc.get("message")
        if not isinstance(raw, Mapping):
            result.skipped[letter_id] = ("no valid message was stored (the input could not be "
                                         "parsed); fix it at the source and send it again")
            continue
        try:
            msg = Message.from_dict(raw, max_payload_bytes=0)
        except EnvelopeError as exc:
            result.skipped[letter_id] = f"the stored message is not valid: {exc}"
            continue
        pending.append((_order(msg, doc), letter_id, msg))
    pending.sort(key=lambda p: p[0])
    return [(lid, m) for _, lid, m in pending]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _order(msg: Message, doc: Mapping[str, Any]) -> tuple[Any, ...]:
    first = doc.get("first_seen")
    if isinstance(first, datetime) and first.tzinfo is None:
        first = first.replace(tzinfo=UTC)
    first = first if isinstance(first, datetime) else _EPOCH
    return (msg.occurred_at or first, msg.source.seq if msg.source else 0, first,
            msg.message_id)


__all__ = ["STATUS_AFTER", "DeadLetterReplay", "replay_dead_letters"]
