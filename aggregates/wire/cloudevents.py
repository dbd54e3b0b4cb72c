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
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from aggregates.core.errors import AggboxError, EnvelopeError
from aggregates.core.tracecontext import TRACEPARENT, TRACESTATE, trace_headers
from aggregates.message.envelope import (
    KIND_EVENT,
    KIND_HEADER,
    KIND_INPUT,
    MAX_RECORD_DEPTH,
    MAX_SCHEMA_VERSION,
    MAX_SEQ,
    json_depth,
    parse_time,
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

SPECVERSION: Final = "1.0"
#: ``datacontenttype`` of the data aggbox writes (binary mode: the ``content-type`` header).
CONTENT_TYPE: Final = "application/json"
#: The media type of a structured-mode record (the Kafka ``content-type`` header).
STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json"
#: Kafka header name prefix of the attributes in binary mode.
CE_PREFIX: Final = "ce_"
CONTENT_TYPE_HEADER: Final = "content-type"
#: ``source`` URI-reference prefix: ``/aggbox/<aggregate type>/<aggregate id>``.
SOURCE_PREFIX: Final = "/aggbox/"
#: The longest attribute (header) value read, in UTF-8 bytes: ids are at most 512
#: characters (four bytes each, percent-encoded three characters per byte in ``source``);
#: ``aggboxheaders`` holds all other headers.
MAX_ATTRIBUTE_BYTES: Final = 64 * 1024
#: The longest ``traceparent``/``tracestate`` Kafka header carried (as the pipeline's rule
#: for native records, spark/sources.py).
_MAX_TRACE_HEADER_BYTES: Final = 512

EXT_AGGREGATE_TYPE: Final = "aggregatetype"
EXT_CAUSATION_ID: Final = "causationid"
EXT_CORRELATION_ID: Final = "correlationid"
EXT_SOURCE_SEQ: Final = "sourceseq"
EXT_SCHEMA_VERSION: Final = "schemaversion"
EXT_KIND: Final = "aggboxkind"
EXT_HEADERS: Final = "aggboxheaders"
#: The extension attributes aggbox writes (lower-case alphanumeric, as the spec requires).
EXTENSIONS: Final = (EXT_AGGREGATE_TYPE, EXT_CAUSATION_ID, EXT_CORRELATION_ID, EXT_SOURCE_SEQ,
                     EXT_SCHEMA_VERSION, EXT_KIND, EXT_HEADERS, TRACEPARENT, TRACESTATE)

#: Characters left as they are in a ``source`` path segment (RFC 3986 unreserved); every
#: other UTF-8 byte is ``%XX``. A segment of dots only has its dots encoded too (``.`` and
#: ``..`` are dot segments, which URI normalisation removes).
_UNRESERVED: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                               b"abcdefghijklmnopqrstuvwxyz0123456789-._~")
_SEGMENT: Final = re.compile(r"(?:[A-Za-z0-9\-._~]|%[0-9A-Fa-f]{2})+")
_RFC3339: Final = re.compile(
    r"(\d{4}-\d\d-\d\d)[Tt](\d\d:\d\d:\d\d)(?:\.(\d+))?([Zz]|[+-]\d\d:\d\d)")
_JSON_MEDIA: Final = re.compile(r"(?:application|text)/(?:[A-Za-z0-9\-.]+\+)?json\s*(?:;.*)?",
                                re.IGNORECASE | re.DOTALL)
_DECIMAL: Final = re.compile(r"[1-9][0-9]{0,18}")
_PRINTABLE_ASCII: Final = re.compile(r"[ -~]*")


class CloudEventError(AggboxError, ValueError):
    """A record is a CloudEvent aggbox cannot read as an envelope; ``attribute`` names the
    attribute (or Kafka header) at fault."""

    def __init__(self, attribute: str, reason: str) -> None:
        self.attribute = attribute
        self.reason = reason
        super().__init__(f"invalid CloudEvent: attribute {attribute!r}: {reason}; fix the "
                         "producer (docs/design.md \"CloudEvents\")")


# -- source ------------------------------------------------------------------------------

def _encode_segment(text: str) -> str:
    data = text.encode("utf-8")
    dots_only = not data.strip(b".")
    return "".join(chr(b) if b in _UNRESERVED and not (dots_only and b == 0x2E) else f"%{b:02X}"
                   for b in data)


def encode_source(aggregate_type: str, aggregate_id: str) -> str:
    """``/aggbox/<type>/<id>``, each percent-encoded byte by byte (UTF-8; only RFC 3986
    unreserved characters stay), so ``/``, ``%``, ``$``, spaces and any Unicode in a name
    decode back exactly (:func:`decode_source`)."""
    return SOURCE_PREFIX + _encode_segment(aggregate_type) + "/" + _encode_segment(aggregate_id)


def _decode_segment(segment: str, what: str) -> str:
    if not _SEGMENT.fullmatch(segment):
        raise CloudEventError("source", f"the {what} segment {_short(segment)} is empty or has "
                              "characters that must be percent-encoded")
    out = bytearray()
    i = 0
    while i < len(segment):
        if segment[i] == "%":
            out.append(int(segment[i + 1:i + 3], 16))
            i += 3
        else:
            out.append(ord(segment[i]))
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CloudEventError("source", f"the {what} segment does not decode to UTF-8 "
                              f"({exc.reason} at byte {exc.start})") from None


def decode_source(source: str) -> tuple[str, str]:
    """The ``(aggregate type, aggregate id)`` of an aggbox ``source``; raises
    :class:`CloudEventError` for anything :func:`encode_source` does not produce a decodable
    form of."""
    if not source.startswith(SOURCE_PREFIX):
        raise CloudEventError("source", f"{_short(source)} is not /aggbox/<aggregate type>/"
                              "<aggregate id>, needed with sourceseq")
    parts = source[len(SOURCE_PREFIX):].split("/")
    if len(parts) != 2:
        raise CloudEventError("source", f"{_short(source)} must have exactly two segments "
                              "after /aggbox/ (percent-encode '/' in names as %2F)")
    return _decode_segment(parts[0], "aggregate type"), _decode_segment(parts[1], "aggregate id")


def _short(value: str, limit: int = 80) -> str:
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"… ({len(value)} chars)"


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


# -- CloudEvent → envelope ------------------------------------------------------------------

def is_binary(headers: Iterable[tuple[str, Any]] | None) -> bool:
    """Whether Kafka record headers make the record a binary-mode CloudEvent."""
    return headers is not None and any(k.lower() == CE_PREFIX + "specversion"
                                       for k, _ in headers)


def _string(attrs: Mapping[str, Any], name: str, *, required: bool) -> str | None:
    value = attrs.get(name)
    if value is None:
        if required:
            raise CloudEventError(name, "is required")
        return None
    if not isinstance(value, str):
        raise CloudEventError(name, f"must be a string, got {_kind(value)}")
    if not value:
        raise CloudEventError(name, "must not be empty")
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _integer(attrs: Mapping[str, Any], name: str, limit: int) -> int | None:
    value = attrs.get(name)
    if value is None:
        return None
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        shown = _short(value) if isinstance(value, str) else _kind(value)
        raise CloudEventError(name, "must be a decimal integer without sign or leading "
                              f"zeros, got {shown}")
    if not 1 <= number <= limit:
        raise CloudEventError(name, f"must be between 1 and {limit}, got {number}")
    return number


def _time(attrs: Mapping[str, Any]) -> str | None:
    value = _string(attrs, "time", required=False)
    if value is None:
        return None
    m = _RFC3339.fullmatch(value)
    if m is None:
        raise CloudEventError("time", f"{_short(value)} is not an RFC 3339 timestamp "
                              "(e.g. 2024-05-01T12:00:00.000Z)")
    fraction = f".{m.group(3)[:6]}" if m.group(3) else ""
    zone = "+00:00" if m.group(4) in ("Z", "z") else m.group(4)
    text = f"{m.group(1)}T{m.group(2)}{fraction}{zone}"
    try:
        dt = parse_time(text, "time")
    except EnvelopeError as exc:
        raise CloudEventError("time", exc.reason) from None
    assert dt is not None
    return dt.isoformat()


def _extra_headers(attrs: Mapping[str, Any]) -> dict[str, str]:
    text = _string(attrs, EXT_HEADERS, required=False)
    if text is None:
        return {}
    if json_depth(text, 1) > 1:
        raise CloudEventError(EXT_HEADERS, "must be a JSON object of string → string "
                              "(nested values found)")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CloudEventError(EXT_HEADERS, f"is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise CloudEventError(EXT_HEADERS, "must be a JSON object of string → string")
    return value


def _to_envelope(attrs: Mapping[str, Any], data: Any, *, binary_trace: dict[str, str] | None
                 ) -> dict[str, Any]:
    specversion = attrs.get("specversion")
    if specversion != SPECVERSION:
        shown = _short(specversion) if isinstance(specversion, str) else _kind(specversion)
        raise CloudEventError("specversion", f"must be '{SPECVERSION}', got {shown}; aggbox "
                              "reads CloudEvents 1.0")
    message_id = _string(attrs, "id", required=True)
    source = _string(attrs, "source", required=True)
    assert source is not None
    etype = _string(attrs, "type", required=True)
    subject = _string(attrs, "subject", required=True)
    atype = _string(attrs, EXT_AGGREGATE_TYPE, required=True)
    content_type = _string(attrs, "datacontenttype", required=False)
    if content_type is not None and not _JSON_MEDIA.fullmatch(content_type):
        raise CloudEventError("datacontenttype", f"{_short(content_type)} is not JSON; aggbox "
                              "payloads are JSON objects (application/json)")
    seq = _integer(attrs, EXT_SOURCE_SEQ, MAX_SEQ)
    if seq is not None or source.startswith(SOURCE_PREFIX):
        src_type, src_id = decode_source(source)
    kind = _string(attrs, EXT_KIND, required=False)
    if kind not in (None, KIND_INPUT, KIND_EVENT):
        raise CloudEventError(EXT_KIND, f"must be '{KIND_INPUT}' or '{KIND_EVENT}', got "
                              f"{_short(str(kind))}")
    if data is None:
        raise CloudEventError("data", "is required: the payload, a JSON object")
    if not isinstance(data, dict):
        raise CloudEventError("data", f"must be a JSON object (the payload), got {_kind(data)}")
    envelope: dict[str, Any] = {"message_id": message_id, "type": etype,
                                "aggregate_type": atype, "aggregate_id": subject,
                                "payload": data}
    occurred_at = _time(attrs)
    if occurred_at is not None:
        envelope["occurred_at"] = occurred_at
    if seq is not None:
        envelope["source"] = {"type": src_type, "id": src_id, "seq": seq}
    for ext, name in ((EXT_CAUSATION_ID, "causation_id"), (EXT_CORRELATION_ID, "correlation_id")):
        value = _string(attrs, ext, required=False)
        if value is not None:
            envelope[name] = value
    version = _integer(attrs, EXT_SCHEMA_VERSION, MAX_SCHEMA_VERSION)
    if version is not None:
        envelope["schema_version"] = version
    headers: dict[str, str] = {}
    if kind == KIND_EVENT:
        headers[KIND_HEADER] = KIND_EVENT
    if binary_trace is None:  # structured: trace context as extension attributes
        for name in (TRACEPARENT, TRACESTATE):
            value = _string(attrs, name, required=False)
            if value is not None:
                headers[name] = value
    extra = _extra_headers(attrs)
    if binary_trace and TRACEPARENT not in extra:  # the envelope's own trace context wins
        headers.update(binary_trace)
    headers.update(extra)
    if headers:
        envelope["headers"] = headers
    return envelope


def from_structured(event: Mapping[str, Any]) -> dict[str, Any]:
    """The envelope dict of a structured-mode CloudEvent (decoded JSON object)."""
    if "data_base64" in event:
        raise CloudEventError("data_base64", "binary data is not accepted; send the payload "
                              "as a JSON object in 'data' (datacontenttype application/json)")
    return _to_envelope(event, event.get("data"), binary_trace=None)


def _header_text(name: str, value: Any, limit: int) -> str:
    if value is None:
        raise CloudEventError(name, "has no value")
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")
    if len(value) > limit:
        raise CloudEventError(name, f"is {len(value)} bytes; at most {limit} are accepted")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CloudEventError(name, f"is not valid UTF-8: byte 0x{value[exc.start]:02x} at "
                              f"byte offset {exc.start} ({exc.reason})") from None


def _record_trace(headers: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """The record's ``traceparent``/``tracestate`` headers worth carrying, by the rule the
    pipeline applies to native records (spark/sources.py, spark.messages.with_record_trace):
    each present once, at most 512 bytes, printable ASCII; a well-formed ``traceparent``."""
    found: dict[str, list[Any]] = {TRACEPARENT: [], TRACESTATE: []}
    for key, value in headers:
        if key in found:
            found[key].append(value)
    pair: dict[str, str] = {}
    for name, values in found.items():
        if len(values) != 1 or values[0] is None:
            continue
        raw = values[0]
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogatepass")
        if len(raw) > _MAX_TRACE_HEADER_BYTES:
            continue
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if _PRINTABLE_ASCII.fullmatch(text):
            pair[name] = text
    return trace_headers(pair) or {} if TRACEPARENT in pair else {}


def from_binary(headers: Iterable[tuple[str, bytes | str | None]],
                value: bytes | str | None) -> dict[str, Any]:
    """The envelope dict of a binary-mode Kafka record: its headers (``ce_*``,
    ``content-type``, ``traceparent``, ``tracestate``; others are ignored) and its value,
    the data as JSON text (``None``: a record without a value). The trace context comes
    from the plain ``traceparent``/``tracestate`` headers, else from the distributed-tracing
    extension ``ce_traceparent``/``ce_tracestate``."""
    headers = list(headers)
    attrs: dict[str, Any] = {}
    for key, hvalue in headers:
        lower = key.lower()
        if lower.startswith(CE_PREFIX):
            name = lower[len(CE_PREFIX):]
        elif lower == CONTENT_TYPE_HEADER:
            name = "datacontenttype"
        else:
            continue
        if name in attrs:
            raise CloudEventError(key, "appears more than once")
        attrs[name] = _header_text(key, hvalue, MAX_ATTRIBUTE_BYTES)
    for name in ("data", "data_base64"):
        if name in attrs:
            raise CloudEventError(CE_PREFIX + name, "is not an attribute; the record value "
                                  "holds the data")
    trace = _record_trace(headers)
    if not trace and TRACEPARENT in attrs:
        # No usable plain header: the distributed-tracing extension (ce_traceparent, what
        # the CloudEvents SDKs write) carries the context instead.
        trace = trace_headers({k: attrs[k] for k in (TRACEPARENT, TRACESTATE)
                               if k in attrs}) or {}
    try:
        return _to_envelope(attrs, _data(value), binary_trace=trace)
    except CloudEventError as exc:
        if exc.attribute == "data":
            raise
        name = (CONTENT_TYPE_HEADER if exc.attribute == "datacontenttype"
                else CE_PREFIX + exc.attribute)
        raise CloudEventError(name, exc.reason) from None


def _data(value: bytes | str | None) -> Any:
    """The record value of a binary-mode record as JSON (``None`` when it has none)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CloudEventError("data", f"is not valid UTF-8: byte offset {exc.start} "
                                  f"({exc.reason})") from None
    depth = json_depth(value)
    if depth > MAX_RECORD_DEPTH:  # never recurse that deep (the envelope rule is stricter)
        raise CloudEventError("data", f"nests arrays/objects {depth} levels deep; at most "
                              f"{MAX_RECORD_DEPTH} are accepted: flatten the payload")
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise CloudEventError("data", f"is not valid JSON: {exc}") from None


#: Envelope field → the CloudEvent attribute it comes from (for error details).
ATTRIBUTE_OF: Final[Mapping[str, str]] = {
    "message_id": "id", "type": "type", "aggregate_id": "subject",
    "aggregate_type": EXT_AGGREGATE_TYPE, "payload": "data", "occurred_at": "time",
    "source": "source", "source.type": "source", "source.id": "source",
    "source.seq": EXT_SOURCE_SEQ, "causation_id": EXT_CAUSATION_ID,
    "correlation_id": EXT_CORRELATION_ID, "schema_version": EXT_SCHEMA_VERSION,
    "headers": EXT_HEADERS,
}


def attribute_of(field: str) -> str:
    """The CloudEvent attribute an envelope field (as :class:`EnvelopeError` names it, e.g.
    ``payload.items[0]``) comes from."""
    return ATTRIBUTE_OF.get(field) or ATTRIBUTE_OF.get(field.split(".")[0].split("[")[0],
                                                       "data")
