"""Timers: messages a handler schedules for later, in the same write as its state (pure).

A handler returns :class:`Schedule` and :class:`Cancel` beside its emits::

    @orders.handles(OrderPlaced)
    def placed(state: Order, p: OrderPlaced, msg: Message) -> Handled[Order]:
        return Order(status="awaiting_credit", ...), [
            Emit(ReserveCredit(...), to=customers.ref(p.customer_id)),
            Schedule(Emit(CreditDeadline(order_id=p.order_id)), key="credit",
                     after=timedelta(minutes=30)),
        ]

    @orders.handles(CreditReserved)
    def reserved(state: Order, p: CreditReserved, msg: Message) -> Handled[Order]:
        return replace(state, status="confirmed"), [Cancel("credit")]

The timer is stored in the aggregate's document (``timers``, beside the outbox: neither
waits for the other) by the one conditional write that stores the new state; the
dispatcher publishes it when it is due, as an ordinary input message — addressed to the
scheduling aggregate itself unless the ``Emit`` names another (``to=``). A key names one
pending timer per aggregate: scheduling a key again replaces the pending one, ``Cancel``
removes it. docs/design.md "Timers" gives the layout and the guarantee; docs/concepts.md
"Timers" the use.

Everything here is pure: no clock (the fold's ``now`` is the writer's), no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from aggregates.core.ids import AGGBOX_NAMESPACE, uuid5
from aggregates.core.keys import join_parts
from aggregates.message.emit import Cancel, Schedule

__all__ = [
    "MAX_TIMERS",
    "MAX_TIMER_KEY_LENGTH",
    "TIMER_HEADER",
    "TIMER_SOURCE_TYPE",
    "Cancel",
    "Schedule",
    "stored_due",
    "timer_message_id",
    "timer_source_id",
]

#: At most this many pending timers per aggregate (a step that would hold more is
#: dead-lettered ``invalid_timer``): the document stays small and the dispatcher's read of
#: a due document bounded.
MAX_TIMERS: Final = 100
#: A timer key is a non-empty string of at most this many characters.
MAX_TIMER_KEY_LENGTH: Final = 200
#: Header of a fired timer's message: its key (so a receiver can tell a timer from other
#: input, and which one).
TIMER_HEADER: Final = "aggbox-timer"
#: ``source.type`` of a fired timer's message; ``source.id`` is :func:`timer_source_id`
#: (one source per aggregate and key) and ``seq`` grows with every schedule of the
#: aggregate (its own counter ``_tseq``, apart from the emits' ``_seq``), so a high-water
#: receiver (``monotonic``) sees a replaced timer's message as newer and a fired one again
#: as a duplicate.
TIMER_SOURCE_TYPE: Final = "aggbox.timer"


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)


def stored_due(due: datetime) -> datetime:
    """``due`` as a timer stores it: UTC, rounded *up* to the whole millisecond (a BSON date
    holds milliseconds; rounding down would let the timer fire up to 0.999 ms before the
    instant asked for). A naive ``due`` is taken as UTC. Raises ``OverflowError`` past
    ``datetime.max``."""
    due = due.replace(tzinfo=UTC) if due.tzinfo is None else due.astimezone(UTC)
    sub_ms = due.microsecond % 1000
    return due + timedelta(microseconds=1000 - sub_ms) if sub_ms else due


def _due_ms(due: datetime) -> int:
    """Milliseconds since the epoch of :func:`stored_due` of ``due`` (exact integers)."""
    if due.tzinfo is None:  # as read by a client without tz_aware: BSON dates are UTC
        due = due.replace(tzinfo=UTC)
    return -(-((due - _EPOCH) // _US) // 1000)


def timer_message_id(aggregate_type: str, aggregate_id: str, key: str, due: datetime,
                     cause: str) -> str:
    """The id of a timer's message: from the scheduling aggregate, the key, the due time
    (UTC milliseconds, as :func:`stored_due` stores it: a due time with sub-millisecond
    precision counts as the next millisecond) and the message whose handling scheduled it.
    Same inputs → same id, so a timer published twice (a crash between the publish and its
    removal) is a duplicate for its receiver."""
    ms = _due_ms(due)
    # Length-prefixed parts: an unambiguous encoding.
    name = (f"timer:{len(aggregate_type)}:{aggregate_type}{len(aggregate_id)}:{aggregate_id}"
            f"{len(key)}:{key}{ms}:{len(cause)}:{cause}")
    return uuid5(AGGBOX_NAMESPACE, name)


def timer_source_id(aggregate_type: str, aggregate_id: str, key: str) -> str:
    """``source.id`` of a timer's message: type, id and key, each percent-encoded
    (:func:`aggregates.core.keys.join_parts`), so no two (aggregate, key) pairs share it."""
    return join_parts(aggregate_type, aggregate_id, key)
