"""Envelope ↔ CloudEvents 1.0 (pure: no I/O, no SDK): the mapping the dispatcher writes with
``record_format = "cloudevents"`` and the pipeline reads back (docs/design.md "CloudEvents").

=================== ========================== =============================================
envelope            CloudEvent attribute       notes
=================== ========================== =============================================
``message_id``      ``id``
``type``            ``type``
``aggregate_id``    ``subject``                the aggregate the envelope names
``aggregate_type``  ``aggregatetype``          extension
``payload``         ``data``                   ``datacontenttype: application/json``
``occurred_at``     ``time``                   RFC 3339, UTC, milliseconds
``source.type/id``  ``source``                 ``/aggbox/<type>/<id>``, both percent-encoded
                                               (:func:`encode_source`); without a ``source``
                                               the emitting aggregate
``source.seq``      ``sourceseq``              extension, decimal string (int64)
``causation_id``    ``causationid``            extension
``correlation_id``  ``correlationid``          extension
``schema_version``  ``schemaversion``          extension, integer, only when not 1
headers ``aggbox-   ``aggboxkind``             extension, ``input`` or ``event`` (always
kind: event``                                  set; ``event`` restores the header)
headers             ``traceparent``,           structured mode: extensions; binary mode:
``traceparent``,    ``tracestate``             plain Kafka record headers (W3C propagation)
``tracestate``
other headers       ``aggboxheaders``          extension: the headers no attribute above
                                               restores exactly, as a JSON object text
=================== ========================== =============================================

Binary content mode (Kafka): each attribute is a header ``ce_<name>`` (UTF-8), except
``datacontenttype`` → ``content-type``; the record value is the payload as JSON
(:func:`to_binary`). Structured content mode (JSON Lines, ``application/cloudevents+json``):
one JSON object with the attributes and ``data`` (:func:`to_structured`).

Decoding (:func:`from_structured`, :func:`from_binary`) gives an envelope *dict* for
:meth:`aggregates.message.envelope.Message.from_dict`, which applies the envelope's own rules;
whatever makes the record no usable CloudEvent raises :class:`CloudEventError` naming the
attribute (or Kafka header). A record is a CloudEvent when a Kafka record has the header
``ce_specversion`` (binary) or a JSON object has the key ``specversion`` (structured).
Extensions aggbox does not know (and ``dataschema``) are ignored; ``data_base64`` is refused
(aggbox payloads are JSON objects).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aggregates.core.tracecontext import TRACEPARENT, TRACESTATE, trace_headers
from aggregates.message.envelope import KIND_EVENT, KIND_HEADER, KIND_INPUT, parse_time
from aggregates.wire.ce_attributes import (
    _MAX_TRACE_HEADER_BYTES,
    _PRINTABLE_ASCII,
    CE_PREFIX,
    CONTENT_TYPE,
    CONTENT_TYPE_HEADER,
    EXT_AGGREGATE_TYPE,
    EXT_CAUSATION_ID,
    EXT_CORRELATION_ID,
    EXT_HEADERS,
    EXT_KIND,
    EXT_SCHEMA_VERSION,
    EXT_SOURCE_SEQ,
    EXTENSIONS,
    MAX_ATTRIBUTE_BYTES,
    SPECVERSION,
    STRUCTURED_CONTENT_TYPE,
    CloudEventError,
    decode_source,
    encode_source,
)
from aggregates.wire.ce_decode import (
    ATTRIBUTE_OF,
    attribute_of,
    from_binary,
    from_structured,
    is_binary,
)

__all__ = [
    "ATTRIBUTE_OF",
    "CE_PREFIX",
    "CONTENT_TYPE",
    "CONTENT_TYPE_HEADER",
    "EXTENSIONS",
    "MAX_ATTRIBUTE_BYTES",
    "SPECVERSION",
    "STRUCTURED_CONTENT_TYPE",
    "CloudEventError",
    "attribute_of",
    "attributes",
    "decode_source",
    "encode_source",
    "from_binary",
    "from_structured",
    "is_binary",
    "to_binary",
    "to_structured",
]


# -- envelope → CloudEvent ------------------------------------------------------------------

def _rfc3339(value: Any) -> str:
    dt = parse_time(value, "occurred_at")
    assert dt is not None
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _carried_trace(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The headers' ``traceparent``/``tracestate`` when a Kafka reader restores them exactly
    from plain record headers (:func:`_record_trace`), else ``None``."""
    if TRACEPARENT not in headers:
        return None
    pair = {k: headers[k] for k in (TRACEPARENT, TRACESTATE) if k in headers}
    if not all(_PRINTABLE_ASCII.fullmatch(v) and len(v) <= _MAX_TRACE_HEADER_BYTES
               for v in pair.values()):
        return None
    return pair if trace_headers(pair) == pair else None


def attributes(envelope: Mapping[str, Any], *, emitter: tuple[str, str] | None = None,
               binary: bool = False) -> dict[str, Any]:
    """The CloudEvent attributes of a valid envelope (``Message.to_dict()`` form), without
    ``data``. ``source`` names the envelope's ``source`` aggregate, else ``emitter``, else the
    aggregate the envelope names. ``binary``: ``traceparent``/``tracestate`` are left out when
    plain Kafka headers carry them exactly (see :func:`to_binary`)."""
    src = envelope.get("source")
    if src is not None:
        source = encode_source(src["type"], src["id"])
    else:
        etype, eid = emitter or (envelope["aggregate_type"], envelope["aggregate_id"])
        source = encode_source(etype, eid)
    out: dict[str, Any] = {
        "specversion": SPECVERSION,
        "id": envelope["message_id"],
        "source": source,
        "type": envelope["type"],
        "subject": envelope["aggregate_id"],
    }
    if envelope.get("occurred_at") is not None:
        out["time"] = _rfc3339(envelope["occurred_at"])
    out["datacontenttype"] = CONTENT_TYPE
    out[EXT_AGGREGATE_TYPE] = envelope["aggregate_type"]
    if src is not None:
        out[EXT_SOURCE_SEQ] = str(src["seq"])
    if envelope.get("causation_id") is not None:
        out[EXT_CAUSATION_ID] = envelope["causation_id"]
    if envelope.get("correlation_id") is not None:
        out[EXT_CORRELATION_ID] = envelope["correlation_id"]
    version = envelope.get("schema_version")
    if version is not None and version != 1:
        out[EXT_SCHEMA_VERSION] = int(version)
    rest: dict[str, str] = dict(envelope.get("headers") or {})
    is_event = rest.get(KIND_HEADER) == KIND_EVENT
    out[EXT_KIND] = KIND_EVENT if is_event else KIND_INPUT
    if is_event:
        del rest[KIND_HEADER]
    trace = _carried_trace(rest)
    if trace is not None:
        for k in trace:
            del rest[k]
        if not binary:
            out.update(trace)
    if rest:
        out[EXT_HEADERS] = json.dumps(rest, ensure_ascii=False, separators=(",", ":"),
                                      sort_keys=True)
    return out


def to_structured(envelope: Mapping[str, Any], *,
                  emitter: tuple[str, str] | None = None) -> dict[str, Any]:
    """The structured-mode CloudEvent (a JSON-compatible dict) of a valid envelope."""
    return {**attributes(envelope, emitter=emitter), "data": envelope["payload"]}


def to_binary(envelope: Mapping[str, Any], *, emitter: tuple[str, str] | None = None
              ) -> list[tuple[str, str]]:
    """The binary-mode Kafka headers of a valid envelope (the value is the payload as JSON):
    ``ce_<attribute>``, ``content-type``, and ``traceparent``/``tracestate`` as plain
    headers — unless the envelope's trace headers would not survive a reader's checks as
    they are, then they travel in ``ce_aggboxheaders``."""
    out: list[tuple[str, str]] = []
    for name, value in attributes(envelope, emitter=emitter, binary=True).items():
        if name == "datacontenttype":
            out.append((CONTENT_TYPE_HEADER, value))
        else:
            out.append((CE_PREFIX + name, str(value)))
    trace = _carried_trace(envelope.get("headers") or {})
    if trace is not None:
        out.extend(trace.items())
    return out
