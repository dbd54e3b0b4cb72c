"""The oracle's own check of the documented envelope contract (:mod:`aggbox.demo.oracle`):
an input line's object → :class:`Envelope`, or :class:`InvalidEnvelope`. Independent of
:meth:`aggregates.message.envelope.Message.from_dict` on purpose; only the field table
``ENVELOPE_FIELDS`` is shared. The other way, :func:`plain_payload`: an emitted payload
as an envelope carries it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from aggbox.demo.errors import DemoError
from aggregates.message.envelope import ENVELOPE_FIELDS

__all__ = ["Envelope", "EnvelopeSource", "InvalidEnvelope", "Key", "parse_envelope",
           "plain_payload"]

#: An aggregate: (aggregate type, aggregate id).
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class EnvelopeSource:
    type: str
    id: str
    seq: int


@dataclass(frozen=True, slots=True)
class Envelope:
    """A message as the oracle reads it: the envelope's fields, nothing derived. Handlers
    take it in place of :class:`aggregates.message.envelope.Message` (they read its attributes)."""

    message_id: str
    type: str
    aggregate_type: str
    aggregate_id: str
    payload: dict[str, Any]
    occurred_at: datetime | None = None
    source: EnvelopeSource | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    schema_version: int = 1

    @property
    def aggregate_key(self) -> Key:
        return (self.aggregate_type, self.aggregate_id)


class InvalidEnvelope(Exception):
    """The line is not a valid envelope (``invalid_envelope``)."""


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidEnvelope("must be a non-empty string")
    return value


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidEnvelope("must be a JSON object")
    return value


def _time(value: Any) -> datetime:
    if isinstance(value, str):  # ISO-8601 (``Z`` accepted by Python ≥ 3.11)
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidEnvelope("not an ISO-8601 time") from None
        return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):  # epoch milliseconds
        try:
            return datetime.fromtimestamp(value / 1000, tz=UTC)
        except (OverflowError, ValueError, OSError):
            raise InvalidEnvelope("epoch milliseconds out of range") from None
    raise InvalidEnvelope("must be an ISO-8601 string or epoch milliseconds")


def _positive_int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidEnvelope("must be an integer ≥ 1")
    return value


def _source(value: Any) -> EnvelopeSource:
    src = _object(value)
    seq = src.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise InvalidEnvelope("source.seq must be an integer ≥ 1")
    return EnvelopeSource(_string(src.get("type")), _string(src.get("id")), seq)


def _headers(value: Any) -> dict[str, str]:
    h = _object(value)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in h.items()):
        raise InvalidEnvelope("headers must map strings to strings")
    return dict(h)


#: How the oracle checks each kind of the field table (``ENVELOPE_FIELDS``: field → (kind,
#: required)). Written from the envelope contract (docs/concepts.md, docs/design.md "The
#: pipeline", the table's comments), not from ``Message.from_dict``. Rules the generator
#: never exercises are not modelled: id length and NUL characters, white space around ids,
#: ``$``/``.`` in payload keys, the payload's BSON size, float seqs, time ranges.
_KINDS: Final[dict[str, Callable[[Any], Any]]] = {
    "string": _string,
    "object": lambda v: dict(_object(v)),
    "timestamp": _time,
    "source": _source,
    "map<string,string>": _headers,
    "int": _positive_int,  # schema_version (docs/evolving-schemas.md)
}


def parse_envelope(raw: Any) -> Envelope:
    """``raw`` (parsed JSON) as an :class:`Envelope`; :class:`InvalidEnvelope` if it breaks the
    contract: not an object, an unknown field, a required field missing (``null`` is
    missing), a field of the wrong kind."""
    if not isinstance(raw, dict):
        raise InvalidEnvelope("not a JSON object")
    if set(raw) - set(ENVELOPE_FIELDS):
        raise InvalidEnvelope("unknown envelope field")
    values: dict[str, Any] = {}
    for name, (kind, required) in ENVELOPE_FIELDS.items():
        check = _KINDS.get(kind)
        if check is None:
            raise DemoError(f"envelope field {name!r} has kind {kind!r}, which the demo's "
                            "oracle does not know; teach aggbox/demo/oracle.py the new kind")
        value = raw.get(name)
        if value is None:
            if required:
                raise InvalidEnvelope(f"{name} is required")
            continue
        values[name] = check(value)
    return Envelope(**values)


def plain_payload(payload: Any) -> dict[str, Any]:
    """An emitted payload as the outbox must hold it: a dict as is; a typed payload object
    (the domain's dataclass or pydantic model) as its fields — the oracle's own conversion,
    not the library's (aggregates.domain.aggregate.dump_payload)."""
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        plain: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(payload)))
        return plain
    if hasattr(payload, "model_dump"):
        dumped: dict[str, Any] = payload.model_dump(mode="json")
        return dumped
    return dict(payload)
