"""CloudEvent → envelope (pure): :func:`from_structured` and :func:`from_binary` give an
envelope dict for :meth:`aggregates.message.envelope.Message.from_dict`, or raise
:class:`~aggregates.wire.ce_attributes.CloudEventError` naming the attribute (the mapping:
:mod:`aggregates.wire.cloudevents`, which re-exports these functions)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from aggregates.core import jsonnumbers
from aggregates.core.errors import EnvelopeError
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
from aggregates.wire.ce_attributes import (
    _DECIMAL,
    _JSON_MEDIA,
    _MAX_TRACE_HEADER_BYTES,
    _PRINTABLE_ASCII,
    _RFC3339,
    CE_PREFIX,
    CONTENT_TYPE_HEADER,
    EXT_AGGREGATE_TYPE,
    EXT_CAUSATION_ID,
    EXT_CORRELATION_ID,
    EXT_HEADERS,
    EXT_KIND,
    EXT_SCHEMA_VERSION,
    EXT_SOURCE_SEQ,
    MAX_ATTRIBUTE_BYTES,
    SOURCE_PREFIX,
    SPECVERSION,
    CloudEventError,
    _short,
    decode_source,
)

__all__ = ["ATTRIBUTE_OF", "attribute_of", "from_binary", "from_structured", "is_binary"]


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
        return jsonnumbers.loads(value)  # NaN/Infinity: not JSON, naming the field
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
