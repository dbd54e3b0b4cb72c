"""The CloudEvents attributes aggbox maps (names, limits), :class:`CloudEventError` and the
``source`` URI-reference (pure): shared by the encoding (:mod:`aggregates.wire.cloudevents`)
and the decoding (:mod:`aggregates.wire.ce_decode`); the mapping is documented in
:mod:`aggregates.wire.cloudevents`."""

from __future__ import annotations

import re
from typing import Final

from aggregates.core.errors import AggboxError
from aggregates.core.tracecontext import TRACEPARENT, TRACESTATE

__all__ = ["CE_PREFIX", "CONTENT_TYPE", "CONTENT_TYPE_HEADER", "EXTENSIONS",
           "MAX_ATTRIBUTE_BYTES", "SOURCE_PREFIX", "SPECVERSION", "STRUCTURED_CONTENT_TYPE",
           "CloudEventError", "decode_source", "encode_source"]

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
