"""Producer spans of the dispatcher (docs/design.md "Tracing").

With a tracer provider configured in the daemon's process, every record published gets a
span ``send <topic>`` (kind ``PRODUCER``, OpenTelemetry messaging semantic conventions:
``messaging.system``, ``messaging.destination.name``, ``messaging.message.id``,
``messaging.operation.type`` = ``send``), a child of the ``traceparent`` the entry carries
(the span that handled the message that emitted it). The span's own context replaces the
record's ``traceparent`` *header*, so a consumer continues the trace from the publish; the
envelope in the record's value keeps the entry's headers as stored. The span ends with the
broker's answer: OK, or an error status with the reason of a retryable or permanent failure.

Without a provider (or without the OpenTelemetry API) :func:`publish_spans` returns ``None``
and records keep the entry's ``traceparent`` as they are."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from aggregates.tracing import format_traceparent, parent_context, tracer
from dispatcher.publishers.base import PublishResult
from dispatcher.record import OutboundRecord

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["PublishSpans", "messaging_system", "publish_spans"]


def messaging_system(publisher_name: str) -> str:
    """``messaging.system`` for a publisher: ``kafka`` for Kafka (also behind the effect
    router, ``kafka+effects``), else the publisher's name (``jsonl``, ``stdout``)."""
    return publisher_name.split("+", 1)[0]


class PublishSpans:
    """One producer span per record of a batch; the records' headers get their context."""

    def __init__(self, tracer: Tracer, system: str, records: Sequence[OutboundRecord]) -> None:
        from opentelemetry.trace import SpanKind

        self.spans: list[Span] = []
        for r in records:
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
            self.spans.append(span)

    def finish(self, results: Sequence[PublishResult]) -> None:
        """End each span with its record's outcome."""
        from opentelemetry.trace import Status, StatusCode

        for span, res in zip(self.spans, results, strict=False):
            if res.status != "ok":
                span.set_attribute("aggbox.publish.outcome", res.status)
                if res.reason:
                    span.set_attribute("error.type", res.reason)
                span.set_status(Status(StatusCode.ERROR, res.error or res.reason or res.status))
            span.end()
        for span in self.spans[len(results):]:  # no answer (cancelled)
            span.set_status(Status(StatusCode.ERROR, "no outcome"))
            span.end()


def publish_spans(publisher_name: str, records: Sequence[OutboundRecord]
                  ) -> PublishSpans | None:
    """Producer spans for a batch when a tracer provider is configured, else ``None``."""
    t = tracer()
    if t is None or not records:
        return None
    return PublishSpans(t, messaging_system(publisher_name), records)
