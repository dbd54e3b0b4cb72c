"""A published record in the configured ``record_format`` (pure; used by the publishers).

- ``aggbox``: the value is the envelope as JSON (:attr:`OutboundRecord.value`), the headers
  :data:`dispatcher.publishers.record.HEADER_NAMES` plus the entry's own.
- ``cloudevents``: CloudEvents 1.0 (:mod:`aggregates.wire.cloudevents`). Kafka: binary content
  mode — the payload as JSON, the attributes as ``ce_*`` headers and ``content-type``, the
  trace context as plain ``traceparent``/``tracestate`` headers (the entry's, or the
  producer span's when tracing replaced them: dispatcher/observe/tracing.py); the entry's
  other headers (and the dispatcher's ``fence``) stay plain headers as in the aggbox format, for
  consumers that read headers, while ``ce_aggboxheaders`` carries them for the envelope
  (plain copies of ``ce_*`` and ``content-type`` names are left out: they would clash).
  JSON Lines and stdout: structured content mode, one event object.
"""

from __future__ import annotations

from typing import Any, Final

from aggregates.core.tracecontext import TRACEPARENT, TRACESTATE
from aggregates.message.envelope import KIND_HEADER
from aggregates.wire import cloudevents
from dispatcher.core.settings import RecordFormat
from dispatcher.publishers.record import HEADER_NAMES, OutboundRecord, envelope_json

__all__ = ["json_line", "kafka_record", "structured"]

#: Record headers the CloudEvent attributes replace (or, for the trace context, set).
_REPLACED: Final = frozenset({*HEADER_NAMES, KIND_HEADER, TRACEPARENT, TRACESTATE})


def _emitter(record: OutboundRecord) -> tuple[str, str]:
    return record.source_type, str(record.document_id)


def kafka_record(record: OutboundRecord, record_format: RecordFormat
                 ) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The Kafka value and headers of ``record``."""
    if record_format == "aggbox":
        return record.value, [(k, v.encode()) for k, v in record.headers.items()]
    headers = [(k, v.encode()) for k, v in
               cloudevents.to_binary(record.envelope, emitter=_emitter(record))]
    own = (record.envelope.get("headers") or {}).get(TRACEPARENT)
    if record.headers.get(TRACEPARENT, own) != own:
        # A producer span replaced the record's trace context (dispatcher/observe/tracing.py): the
        # plain headers carry the span's, as in the aggbox format.
        headers = [(k, v) for k, v in headers if k not in (TRACEPARENT, TRACESTATE)]
        headers += [(k, record.headers[k].encode()) for k in (TRACEPARENT, TRACESTATE)
                    if k in record.headers]
    for k, v in record.headers.items():
        lower = k.lower()
        if (k not in _REPLACED and not lower.startswith(cloudevents.CE_PREFIX)
                and lower != cloudevents.CONTENT_TYPE_HEADER):
            headers.append((k, v.encode()))
    return envelope_json(record.envelope["payload"]), headers


def json_line(record: OutboundRecord, record_format: RecordFormat) -> bytes:
    """The JSON Lines line of ``record`` (no newline)."""
    if record_format == "aggbox":
        return record.value
    return envelope_json(structured(record))


def structured(record: OutboundRecord) -> dict[str, Any]:
    """``record`` as a structured-mode CloudEvent (a JSON-compatible dict)."""
    return cloudevents.to_structured(record.envelope, emitter=_emitter(record))
