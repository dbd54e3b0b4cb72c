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

A record that cannot be encoded is that entry's problem, never the batch's: each publisher
encodes record by record and turns a failure into :func:`encode_failure` — a *permanent*
result, so the entry is dead-lettered ``invalid_outbox_entry`` (naming the field at fault
when there is one) and the rest of the batch is published once. (The envelope holds JSON
values only — aggregates/wire/outbound.py applies the one rule of
:mod:`aggregates.core.jsonvalue` — so this is the second line of defence.)
"""

from __future__ import annotations

from typing import Any, Final

from aggregates.core.jsonvalue import NotJSONValue, json_payload
from aggregates.core.reasons import Reason
from aggregates.core.tracecontext import TRACEPARENT, TRACESTATE
from aggregates.message.envelope import KIND_HEADER
from aggregates.wire import cloudevents
from dispatcher.core.settings import RecordFormat
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.record import HEADER_NAMES, OutboundRecord, envelope_json

__all__ = ["encode_failure", "json_line", "kafka_record", "structured"]

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


def encode_failure(record: OutboundRecord, what: str, exc: Exception) -> PublishResult:
    """The result of a record ``what`` (e.g. ``"a CloudEvent for stdout"``) could not be
    built or encoded for: permanent, ``invalid_outbox_entry``, the error naming the payload
    field at fault when one is (else the header or the exception's text)."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > 300:
        text = text[:297] + "..."
    where = _field_at_fault(record)
    return PublishResult.permanent(
        Reason.INVALID_OUTBOX_ENTRY,
        f"cannot encode it as {what}" + (f": field {where}" if where else "") + f" ({text})")


def _field_at_fault(record: OutboundRecord) -> str | None:
    payload = record.envelope.get("payload")
    try:
        json_payload(payload if isinstance(payload, dict) else {})
    except NotJSONValue as exc:
        return f"{exc.path!r}: {exc.reason}"
    for k, v in record.headers.items():
        if type(k) is not str or type(v) is not str:
            return f"header {k!r}: not a string"
        try:
            k.encode()
            v.encode()
        except UnicodeEncodeError:
            return f"header {k!r}: not UTF-8 text"
    return None
