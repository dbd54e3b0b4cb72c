"""The order in which one aggregate's messages are handled (pure; docs/design.md "Order").

Rules, for the messages of one aggregate:

1. Messages of one source (``source.type``, ``source.id``) keep that source's ``seq`` order.
   Sequence numbers of *different* sources are never compared.
2. Different sources, and messages without a source, are interleaved by time. A sourced
   message's time is its **effective time**: the newest ``occurred_at`` among itself and the
   earlier messages (by ``seq``) of its source. Effective times never decrease along a source,
   so sorting by it keeps rule 1, and a message is never ordered before its own source's
   predecessor even when the producer's clock went backwards.
3. Ties: sourced before unsourced at the same time, then source type, source id, ``seq``,
   ``occurred_at``, and finally the input position (stable). A missing time sorts first.

:func:`delivery_order` (with :func:`effective_times`) is the one definition; the Spark pipeline
computes the same key with a window function and is tested against this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeAlias

from aggregates.message.envelope import Message

__all__ = ["OrderKey", "delivery_order", "effective_times"]

#: (has_time, effective time µs, unsourced, source type, source id, seq, has own time,
#: own time µs, position)
OrderKey: TypeAlias = tuple[bool, int, bool, str, str, int, bool, int, int]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(t: datetime | None) -> int:
    # Exact integer arithmetic: int(t.timestamp()) truncates towards zero, which mapped
    # times before 1970 with a fraction onto later ones (-0.5 s and +0.5 s both gave 500000).
    if t is None:
        return 0
    if t.tzinfo is None:  # as Message.from_dict reads a time without offset
        t = t.replace(tzinfo=UTC)
    return (t - _EPOCH) // _MICROSECOND


def effective_times(messages: Sequence[Message]) -> list[datetime | None]:
    """Rule 2's effective time of each message (``None``: neither it nor its source's
    earlier messages carry ``occurred_at``)."""
    by_source: dict[tuple[str, str], list[int]] = {}
    for i, m in enumerate(messages):
        if m.source is not None:
            by_source.setdefault((m.source.type, m.source.id), []).append(i)
    out: list[datetime | None] = [m.occurred_at for m in messages]
    for idx in by_source.values():
        idx.sort(key=lambda i: (messages[i].source.seq, i))  # type: ignore[union-attr]
        newest: datetime | None = None
        for i in idx:
            t = messages[i].occurred_at
            if t is not None and (newest is None or t > newest):
                newest = t
            out[i] = newest
    return out


def delivery_order(messages: Sequence[Message]) -> list[Message]:
    """``messages`` (all of one aggregate) in handling order; see the module docstring."""
    eff = effective_times(messages)
    keys: list[tuple[OrderKey, int]] = []
    for i, (m, t) in enumerate(zip(messages, eff, strict=True)):
        src = m.source
        key: OrderKey = (
            t is not None, _micros(t), src is None,
            src.type if src else "", src.id if src else "", src.seq if src else 0,
            m.occurred_at is not None, _micros(m.occurred_at), i,
        )
        keys.append((key, i))
    keys.sort()
    return [messages[i] for _, i in keys]
