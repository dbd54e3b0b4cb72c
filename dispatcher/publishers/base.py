"""The publisher interface. Adding a broker means writing one class like this:

    class MyPublisher:
        name = "mybroker"

        async def start(self) -> None:          # connect; raise PublisherError if misconfigured
            ...

        async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
            # Send every record, in order, and return once the broker has acknowledged
            # (durably) or refused each one: one result per record, same order.
            return [PublishResult.ok() for _ in records]

        async def close(self) -> None:          # flush and disconnect; idempotent
            ...

Rules the dispatcher relies on:

- ``publish`` returns only after the outcome of every record is known. ``ok`` means the
  broker has it durably; the dispatcher then removes the entry from the outbox.
- ``retryable`` (broker down, timeout): the entry stays in the outbox and is sent again
  later with the same id — so records with the same key must stay in order: never report a
  later record of a key delivered while an earlier one of that key failed, if avoidable.
- ``permanent`` (too large, invalid topic, …): the broker will never take it; the
  dispatcher dead-letters it with ``reason`` and removes it, so the aggregate is not blocked.
- ``publish`` never raises for a per-record problem; raising means "the whole batch failed,
  retry it" (treated as retryable for every record).

Register the class in :func:`dispatcher.publishers.create_publisher` or pass an instance to
:class:`dispatcher.daemon.Dispatcher`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from aggregates.core.errors import AggboxError
from aggregates.core.reasons import Reason
from dispatcher.publishers.record import OutboundRecord

__all__ = ["PublishResult", "PublishStatus", "Publisher", "PublisherError"]

PublishStatus = Literal["ok", "retryable", "permanent"]


class PublisherError(AggboxError):
    """A publisher is misconfigured or cannot start (the message says what to fix)."""


@dataclass(frozen=True, slots=True)
class PublishResult:
    """The outcome of one record. ``reason`` is a short code for dead letters and metrics
    (e.g. ``message_too_large``, ``invalid_topic``); ``error`` the broker's text."""

    status: PublishStatus
    reason: str | None = None
    error: str | None = None
    #: the record was an effect entry, executed (dispatcher.effects), not published
    effect: bool = False

    @classmethod
    def ok(cls) -> PublishResult:
        return _OK

    @classmethod
    def retryable(cls, error: str, reason: str = Reason.BROKER_UNAVAILABLE
                  ) -> PublishResult:
        return cls("retryable", reason, error)

    @classmethod
    def permanent(cls, reason: str, error: str) -> PublishResult:
        return cls("permanent", reason, error)


_OK = PublishResult("ok")


@runtime_checkable
class Publisher(Protocol):
    """See the module documentation."""

    name: str

    async def start(self) -> None: ...

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]: ...

    async def close(self) -> None: ...
