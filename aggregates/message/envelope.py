"""The message envelope: what every input message and every emitted message looks like.

One schema, declared here once (``ENVELOPE_FIELDS``) and shared with the Spark pipeline.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from aggregates.core.errors import EnvelopeError
from aggregates.core.fieldnames import MAX_DEPTH, check_field_names
from aggregates.core.reasons import Reason

MAX_ID_LENGTH: Final = 512
MAX_SEQ: Final = 2**63 - 1
#: Largest ``schema_version`` an envelope may carry (a 32-bit int, Spark's ``IntegerType``).
MAX_SCHEMA_VERSION: Final = 2**31 - 1
#: Header the dispatcher sets on published records: ``event`` for an untargeted emit (a
#: fact the emitting aggregate published, not input for it), ``input`` for an addressed one.
KIND_HEADER: Final = "aggbox-kind"
KIND_EVENT: Final = "event"
KIND_INPUT: Final = "input"
DEFAULT_MAX_PAYLOAD_BYTES: Final = 512 * 1024
#: ``occurred_at`` as epoch milliseconds: 0001-01-01T00:00:00Z … 9999-12-31T23:59:59.999Z
#: (what a datetime and a BSON date both hold; epoch seconds or nanoseconds are outside).
MIN_EPOCH_MILLIS: Final = -62_135_596_800_000
MAX_EPOCH_MILLIS: Final = 253_402_300_799_999
#: Deepest nesting of a whole input record: the envelope object (level 1), the payload
#: (level 2) and ``fieldnames.MAX_DEPTH`` levels under it. Deeper records are rejected by a
#: scan of the raw text before any (recursive) JSON parse.
MAX_RECORD_DEPTH: Final = MAX_DEPTH + 2

#: The envelope schema, field → (python type name, required). The Spark pipeline derives
#: its input schema from this table so both sides agree.
ENVELOPE_FIELDS: Final[dict[str, tuple[str, bool]]] = {
    "message_id": ("string", True),
    "type": ("string", True),
    "aggregate_type": ("string", True),
    "aggregate_id": ("string", True),
    "payload": ("object", True),
    "occurred_at": ("timestamp", False),
    "source": ("source", False),
    "correlation_id": ("string", False),
    "causation_id": ("string", False),
    "headers": ("map<string,string>", False),
    "schema_version": ("int", False),
}


@dataclass(frozen=True, slots=True)
class Source:
    """The aggregate that emitted a message and its position in that aggregate's stream."""

    type: str
    id: str
    seq: int

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "id": self.id, "seq": self.seq}


@dataclass(frozen=True, slots=True)
class Message:
    """A validated message envelope. Build it with :meth:`from_dict` from untrusted input."""

    message_id: str
    type: str
    aggregate_type: str
    aggregate_id: str
    payload: dict[str, Any]
    occurred_at: datetime | None = None
    source: Source | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    #: The payload's schema version (docs/evolving-schemas.md): 1 when the envelope has none.
    #: The fold upcasts older payloads to the handler's version before the handler runs.
    schema_version: int = 1

    @property
    def aggregate_key(self) -> tuple[str, str]:
        return (self.aggregate_type, self.aggregate_id)

    @classmethod
    def from_dict(
        cls, raw: Any, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    ) -> Message:
        """Validate an untrusted mapping. Raises :class:`EnvelopeError` naming the field."""
        if not isinstance(raw, Mapping):
            raise EnvelopeError("<envelope>", f"expected a JSON object, got {_kind(raw)}")
        unknown = set(raw) - set(ENVELOPE_FIELDS)
        if unknown:
            raise EnvelopeError(sorted(unknown)[0], "unknown envelope field")
        payload = raw.get("payload")
        if payload is None:
            raise EnvelopeError("payload", "is required")
        if not isinstance(payload, Mapping):
            raise EnvelopeError("payload", f"must be a JSON object, got {_kind(payload)}")
        payload = dict(payload)
        check_field_names(payload, "payload", envelope=True)
        if max_payload_bytes and _payload_size(payload) > max_payload_bytes:
            raise EnvelopeError(
                "payload",
                f"larger than the limit of {max_payload_bytes} bytes (BSON); split the "
                "message or raise max_payload_bytes",
                code=Reason.PAYLOAD_TOO_LARGE,
            )
        headers = raw.get("headers") or {}
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise EnvelopeError("headers", "must be an object of string → string")
        for k, v in headers.items():
            if k[:1] == "$" or "\x00" in k:  # BSON cannot store these field names
                raise EnvelopeError("headers", f"key {k!r} must not start with '$' or "
                                    "contain NUL")
            _check_text(k, "headers", f"key {k!r} ")
            _check_text(v, "headers", f"value of {k!r} ")
        return cls(
            message_id=_req_str(raw, "message_id"),
            type=_req_str(raw, "type"),
            aggregate_type=_req_str(raw, "aggregate_type"),
            aggregate_id=_req_str(raw, "aggregate_id"),
            payload=payload,
            occurred_at=parse_time(raw.get("occurred_at"), "occurred_at"),
            source=_source(raw.get("source")),
            correlation_id=_opt_str(raw, "correlation_id"),
            causation_id=_opt_str(raw, "causation_id"),
            headers=dict(headers),
            schema_version=_schema_version(raw.get("schema_version")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The envelope as a JSON-compatible dict (times as ISO-8601 strings)."""
        out: dict[str, Any] = {
            "message_id": self.message_id,
            "type": self.type,
            "aggregate_type": self.aggregate_type,
            "aggregate_id": self.aggregate_id,
            "payload": self.payload,
        }
        if self.occurred_at is not None:
            out["occurred_at"] = self.occurred_at.isoformat()
        if self.source is not None:
            out["source"] = self.source.to_dict()
        if self.correlation_id is not None:
            out["correlation_id"] = self.correlation_id
        if self.causation_id is not None:
            out["causation_id"] = self.causation_id
        if self.headers:
            out["headers"] = dict(self.headers)
        if self.schema_version != 1:
            out["schema_version"] = self.schema_version
        return out


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _req_str(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if value is None:
        raise EnvelopeError(name, "is required")
    if not isinstance(value, str):
        raise EnvelopeError(name, f"must be a string, got {_kind(value)}")
    if not value or value.strip() != value:
        raise EnvelopeError(name, "must be non-empty without surrounding white space")
    if len(value) > MAX_ID_LENGTH:
        raise EnvelopeError(name, f"longer than {MAX_ID_LENGTH} characters")
    if "\x00" in value:
        raise EnvelopeError(name, "must not contain NUL characters")
    _check_text(value, name)
    return value


def _check_text(value: str, name: str, what: str = "") -> None:
    """Every string of an envelope must be storable (valid UTF-8): JSON escapes can spell a
    lone surrogate (``"\\ud800"``), which MongoDB's driver cannot encode."""
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EnvelopeError(name, f"{what}is not valid Unicode: lone surrogate "
                            f"{value[exc.start]!r} at character {exc.start}") from None


def _opt_str(raw: Mapping[str, Any], name: str) -> str | None:
    return None if raw.get(name) is None else _req_str(raw, name)


def _schema_version(value: Any) -> int:
    if value is None:
        return 1
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if (not isinstance(value, int) or isinstance(value, bool)
            or not 1 <= value <= MAX_SCHEMA_VERSION):
        raise EnvelopeError("schema_version", f"must be an integer ≥ 1 and ≤ 2^31-1, "
                            f"got {value!r}")
    return value


def _source(value: Any) -> Source | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise EnvelopeError("source", f"must be an object {{type, id, seq}}, got {_kind(value)}")
    seq = value.get("seq")
    if isinstance(seq, float) and seq.is_integer():
        seq = int(seq)
    if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq <= MAX_SEQ:
        raise EnvelopeError("source.seq", f"must be an integer ≥ 1 and ≤ 2^63-1 (BSON int64), "
                            f"got {seq!r}")
    return Source(
        type=_sub_str(value, "type"),
        id=_sub_str(value, "id"),
        seq=seq,
    )


def _sub_str(value: Mapping[str, Any], name: str) -> str:
    try:
        return _req_str(value, name)
    except EnvelopeError as exc:
        raise EnvelopeError(f"source.{name}", exc.reason) from None


def parse_time(value: Any, field_name: str) -> datetime | None:
    """ISO-8601 string, datetime or epoch milliseconds → aware UTC datetime (ms precision,
    which is what BSON stores)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise EnvelopeError(field_name, f"not an ISO-8601 time: {value!r}") from None
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if not MIN_EPOCH_MILLIS <= value <= MAX_EPOCH_MILLIS:
            raise EnvelopeError(
                field_name,
                f"epoch milliseconds out of range: got {value!r}; accepted "
                f"{MIN_EPOCH_MILLIS} to {MAX_EPOCH_MILLIS} (years 1 to 9999; epoch seconds, "
                "microseconds or nanoseconds are not accepted)")
        try:
            dt = datetime.fromtimestamp(value / 1000.0, tz=UTC)
        except (OverflowError, ValueError, OSError) as exc:
            raise EnvelopeError(field_name, f"epoch milliseconds out of range: {exc}") from None
    else:
        raise EnvelopeError(field_name, f"must be an ISO-8601 string, got {_kind(value)}")
    try:
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        dt = dt.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        raise EnvelopeError(field_name, f"time out of range: {exc}") from None
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000)


def _payload_size(payload: dict[str, Any]) -> int:
    import bson

    try:
        return len(bson.encode(payload))
    except Exception as exc:  # non-encodable values (e.g. huge ints)
        raise EnvelopeError("payload", f"cannot be stored in MongoDB: {exc}") from None


_STRING: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET: Final = re.compile(r"[^\[\]{}]+")


def json_depth(text: str, limit: int = MAX_RECORD_DEPTH) -> int:
    """How deeply ``text`` (JSON) nests arrays and objects, counting brackets outside
    strings; without recursion, so it is safe before ``json.loads``. Cheap when ``text`` has
    at most ``limit`` opening brackets (the depth cannot exceed that: returns the count)."""
    opening = text.count("[") + text.count("{")
    if opening <= limit:
        return opening
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for ch in brackets:
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest
