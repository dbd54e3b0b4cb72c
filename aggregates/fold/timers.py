"""A handler's :class:`~aggregates.domain.timers.Schedule` and
:class:`~aggregates.domain.timers.Cancel` applied to the aggregate's pending timers (pure;
used by the fold). docs/design.md "Timers".

A timer is stored as an outbox entry (:func:`aggregates.fold.handler_result.outbox_entries`
builds and checks its message like any emit) with three more fields — ``timer`` (the key),
``due`` and ``scheduled_at`` — and these differences: its ``id`` is
:func:`~aggregates.domain.timers.timer_message_id`, it is always addressed (``target``: the
``Emit``'s ``to``, else the scheduling aggregate), its ``source`` is the timer's own
(``aggbox.timer``, :func:`~aggregates.domain.timers.timer_source_id`, the aggregate's next
``_tseq``: timers never take a number of ``_seq``, so the emits' seqs stay gapless), its
``created_at`` (the published ``occurred_at``) is the due time, and its headers carry
``aggbox-timer: <key>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aggregates.core.errors import AggboxError
from aggregates.core.fastbuild import storable_text
from aggregates.domain.aggregate import AggregateType
from aggregates.domain.timers import (
    MAX_TIMER_KEY_LENGTH,
    MAX_TIMERS,
    TIMER_HEADER,
    TIMER_SOURCE_TYPE,
    Cancel,
    Schedule,
    stored_due,
    timer_message_id,
    timer_source_id,
)
from aggregates.fold.document import Snapshot
from aggregates.fold.handler_result import EmitError, EmitHeaders, outbox_entries
from aggregates.message.emit import Emit
from aggregates.message.envelope import Message
from aggregates.wire.outbound import entry_message

__all__ = ["TimerError", "TimerStep", "maybe_fired", "split_timer_ops", "timer_step"]

TimerOp = Schedule | Cancel


class TimerError(AggboxError):
    """A handler's Schedule or Cancel is invalid (the message is dead-lettered
    ``invalid_timer``)."""


@dataclass(slots=True)
class TimerStep:
    """What one message does to the pending timers."""

    #: The pending timers after the step (the whole list, as it is stored).
    timers: list[dict[str, Any]]
    #: The timers this step scheduled.
    added: list[dict[str, Any]] = field(default_factory=list)
    #: Pending timers this step removed (cancelled, or replaced by a new one of their key).
    removed: list[dict[str, Any]] = field(default_factory=list)


def split_timer_ops(returned: Sequence[Any]) -> tuple[Sequence[Any], list[TimerOp]]:
    """The emits a handler returned, and its timer operations in their order."""
    for x in returned:  # a loop, not any(<generator>): this runs once per message
        if type(x) is Schedule or type(x) is Cancel:
            break
    else:
        return returned, []  # the common case: no timers
    emits = [x for x in returned if not isinstance(x, Schedule | Cancel)]
    return emits, [x for x in returned if isinstance(x, Schedule | Cancel)]


def _due(op: Schedule, i: int, now: datetime) -> datetime:
    at, after = op.at, op.after
    if (at is None) == (after is None):
        raise TimerError(f"Schedule #{i} ({op.key!r}): give exactly one of at= and after=")
    try:
        if at is not None:
            if not isinstance(at, datetime) or at.tzinfo is None:
                raise TimerError(f"Schedule #{i} ({op.key!r}): at must be an aware datetime "
                                 f"(with a timezone); got {at!r}")
            due = at.astimezone(UTC)
        else:
            if not isinstance(after, timedelta):
                raise TimerError(f"Schedule #{i} ({op.key!r}): after must be a timedelta; "
                                 f"got {after!r}")
            due = now.astimezone(UTC) + after
        # Stored as a BSON date: whole milliseconds, rounded up, so the timer never fires
        # before the instant asked for.
        return stored_due(due)
    except (OverflowError, ValueError) as exc:
        raise TimerError(f"Schedule #{i} ({op.key!r}): the due time is out of range "
                         f"({exc})") from None


def _check_key(op: TimerOp, i: int) -> str:
    key = op.key
    if not (isinstance(key, str) and storable_text(key) and len(key) <= MAX_TIMER_KEY_LENGTH
            and "\x00" not in key):
        raise TimerError(f"{type(op).__name__} #{i}: key must be a non-empty string of at "
                         f"most {MAX_TIMER_KEY_LENGTH} characters without NUL; got {key!r}")
    return key


def _entry(atype: AggregateType[Any], snap: Snapshot, msg: Message, op: Schedule, key: str,
           i: int, seq: int, now: datetime, emit_headers: EmitHeaders) -> dict[str, Any]:
    if not isinstance(op.emit, Emit):
        raise TimerError(f"Schedule #{i} ({key!r}): the message must be an Emit; got "
                         f"{type(op.emit).__name__}")
    due = _due(op, i, now)
    try:
        (entry,) = outbox_entries(atype, snap, msg, [op.emit], now, emit_headers)
    except EmitError as exc:
        raise TimerError(f"Schedule #{i} ({key!r}): {exc}") from None
    aid = snap.aggregate_id
    entry["id"] = timer_message_id(atype.name, aid, key, due, msg.message_id)
    entry["target"] = entry.get("target") or {"type": atype.name, "id": aid}
    entry["source"] = {"type": TIMER_SOURCE_TYPE,
                       "id": timer_source_id(atype.name, aid, key), "seq": seq}
    entry["headers"] = {**entry["headers"], TIMER_HEADER: key}
    entry["created_at"] = due
    entry["timer"] = key
    entry["due"] = due
    entry["scheduled_at"] = now
    return entry


def timer_step(atype: AggregateType[Any], snap: Snapshot, msg: Message, ops: list[TimerOp],
               *, first_seq: int, now: datetime, emit_headers: EmitHeaders = None,
               ) -> TimerStep:
    """Apply ``ops`` in order to ``snap.timers`` (not changed: the result is a new list).
    New timers take ``seq`` from ``first_seq`` on. Raises :class:`TimerError` naming the
    bad operation, or when more than :data:`MAX_TIMERS` would be pending."""
    timers = list(snap.timers)
    step = TimerStep(timers)
    seq = first_seq
    for i, op in enumerate(ops):
        key = _check_key(op, i)
        for j, t in enumerate(timers):
            if t.get("timer") == key:
                step.removed.append(timers.pop(j))
                break
        if isinstance(op, Schedule):
            entry = _entry(atype, snap, msg, op, key, i, seq, now, emit_headers)
            seq += 1
            timers.append(entry)
            step.added.append(entry)
    if len(timers) > MAX_TIMERS:
        raise TimerError(f"the aggregate would hold {len(timers)} pending timers, more than "
                         f"{MAX_TIMERS}: cancel timers that are no longer needed, or key "
                         "them so a new one replaces an old one")
    return step


def maybe_fired(atype: AggregateType[Any], aggregate_id: str, step: TimerStep,
                stored_ids: frozenset[str]) -> list[Message]:
    """The messages of the timers ``step`` removed that may be firing right now — stored
    before this fold (``stored_ids``: read by the dispatcher, perhaps published, not yet
    removed) and not scheduled again with the same id — and that are addressed to this
    aggregate. The fold records them as handled, so such a message, if it comes, is a
    duplicate and never reaches the handler (docs/design.md "Timers")."""
    pending = {str(t.get("id")) for t in step.timers}
    out = []
    for t in step.removed:
        tid, target = str(t.get("id")), t.get("target") or {}
        if (tid in stored_ids and tid not in pending and target.get("type") == atype.name
                and target.get("id") == aggregate_id):
            out.append(entry_message(t, document_id=aggregate_id, source_type=atype.name))
    return out
