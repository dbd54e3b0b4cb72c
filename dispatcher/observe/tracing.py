"""Producer spans of the dispatcher (docs/design.md "Tracing").

With a tracer provider configured in the daemon's process, every record published gets a
span ``send <topic>`` (kind ``PRODUCER``, OpenTelemetry messaging semantic conventions:
``messaging.system``, ``messaging.destination.name``, ``messaging.message.id``,
``messaging.operation.type`` = ``send``), a child of the ``traceparent`` the entry carries
(the span that handled the message that emitted it). The span's own context replaces the
record's ``traceparent`` *header*, so a consumer continues the trace from the publish; the
envelope in the record's value keeps the entry's headers as stored. The span ends with the
broker's answer: OK, or an error status with the reason of a retryable or permanent failure.

An effect entry (docs/design.md "Side effects") is not sent but executed: it gets a span
``aggbox.effect <type>`` (kind ``CLIENT``) around the runner's work instead, whose context
the result message carries back to the aggregate.

Without a provider (or without the OpenTelemetry API) these functions return ``None`` and
records keep the entry's ``traceparent`` as they are."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from aggregates.domain.effects import Effect
from aggregates.store.tracing import format_traceparent, parent_context, tracer
from dispatcher.publishers.base import Publisher, PublishResult
from dispatcher.publishers.record import OutboundRecord

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["PublishSpans", "effect_span", "end_with", "messaging_system", "publish_spans"]


def messaging_system(publisher_name: str) -> str:
    """``messaging.system`` for a publisher: ``kafka`` for Kafka (also behind the effect
    router, ``kafka+effects``), else the publisher's name (``jsonl``, ``stdout``)."""
    return publisher_name.split("+", 1)[0]


class PublishSpans:
    """One producer span per record of a batch that is sent (not an effect entry: the
    effect runner traces those, :func:`effect_span`); the records' headers get their
    context."""

    def __init__(self, tracer: Tracer, system: str, records: Sequence[OutboundRecord],
                 skip: Callable[[OutboundRecord], bool] | None = None) -> None:
        from opentelemetry.trace import SpanKind

        self.spans: list[tuple[int, Span]] = []
        for i, r in enumerate(records):
            if skip is not None and skip(r):
                continue
            attributes: dict[str, str] = {
                "messaging.system": system,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": r.topic,
                "messaging.message.id": r.message_id,
                "aggbox.aggregate.type": r.source_type,
                "aggbox.collection": r.collection,
            }
            if system == "kafka":
                attributes["messaging.kafka.message.key"] = r.key
            span = tracer.start_span(f"send {r.topic}", context=parent_context(r.headers),
                                     kind=SpanKind.PRODUCER, attributes=attributes)
            r.headers.update(format_traceparent(span))
            self.spans.append((i, span))

    def finish(self, results: Sequence[PublishResult]) -> None:
        """End each span with its record's outcome (no outcome: cancelled)."""
        for i, span in self.spans:
            end_with(span, results[i] if i < len(results) else None)


def end_with(span: Span, res: PublishResult | None) -> None:
    """End ``span`` with a publish or effect outcome: OK, or an error status naming the
    reason (``None``: no outcome, the batch was cancelled)."""
    from opentelemetry.trace import Status, StatusCode

    if res is None:
        span.set_status(Status(StatusCode.ERROR, "no outcome"))
    elif res.status != "ok":
        span.set_attribute("aggbox.publish.outcome", res.status)
        if res.reason:
            span.set_attribute("error.type", res.reason)
        span.set_status(Status(StatusCode.ERROR, res.error or res.reason or res.status))
    span.end()


def publish_spans(publisher: Publisher, records: Sequence[OutboundRecord]
                  ) -> PublishSpans | None:
    """Producer spans for a batch when a tracer provider is configured, else ``None``.
    Records the publisher executes as effects (its ``is_effect``) get none here."""
    t = tracer()
    if t is None or not records:
        return None
    skip: Callable[[OutboundRecord], bool] | None = getattr(publisher, "is_effect", None)
    return PublishSpans(t, messaging_system(publisher.name), records, skip)


def effect_span(record: OutboundRecord, effect: Effect) -> Span | None:
    """A span ``aggbox.effect <type>`` (kind ``CLIENT``) for executing an effect entry, a
    child of the entry's ``traceparent``; ``None`` without a tracer provider. End it with
    :func:`end_with`; its context goes into the result message's headers."""
    t = tracer()
    if t is None:
        return None
    from opentelemetry.trace import SpanKind

    return t.start_span(
        f"aggbox.effect {effect.type}", context=parent_context(record.headers),
        kind=SpanKind.CLIENT,
        attributes={"aggbox.effect.type": effect.type,
                    "aggbox.effect.idempotency_key": record.message_id,
                    "aggbox.effect.guarantee": effect.guarantee,
                    "aggbox.aggregate.type": record.source_type,
                    "aggbox.aggregate.id": str(record.document_id)})
