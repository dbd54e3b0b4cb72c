"""Outbox entry → published record (pure).

The record's value is the input envelope (:class:`aggregates.envelope.Message` as JSON), so
whatever consumes the broker topic or the JSON Lines directory — another aggbox pipeline in
particular — reads it with ``Message.from_dict``:

- ``message_id`` = entry id, ``type``, ``payload``;
- ``aggregate_type``/``aggregate_id`` = the entry's ``target`` when it is addressed to
  another aggregate, else the emitting aggregate;
- ``occurred_at`` = ``created_at``; ``source``, ``causation_id``, ``correlation_id``,
  ``headers`` and ``schema_version`` (``Emit(..., schema_version=N)``) as stored.

Two kinds of record, told apart by the header ``aggbox-kind`` (:data:`H_KIND`):

- ``input`` — the entry was addressed (``Emit(..., to=(type, id))``): the envelope is input
  for the aggregate it names; feed it to a pipeline that has that aggregate type.
- ``event`` — the entry was not addressed: the envelope names the *emitting* aggregate
  (so it stays a valid envelope, keyed and ordered like the rest) but it is a fact that
  aggregate published, not input for it. The envelope's own ``headers`` carry
  ``aggbox-kind: event`` as well, so a JSON Lines reader sees it too. Consumers that feed
  records back into aggbox must skip (or route elsewhere) records with ``aggbox-kind:
  event``; aggbox's own writer (pipeline, harness) reports such a record as ``duplicate``
  with reason ``aggbox_event`` and never hands it to a handler.

Broker headers carry the ids without parsing the value: :data:`HEADER_NAMES`.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from bson.tz_util import utc as _BSON_UTC

from aggregates.envelope import KIND_EVENT, KIND_HEADER, KIND_INPUT, MAX_ID_LENGTH, Message
from aggregates.errors import AggboxError, EnvelopeError
from aggregates.fence import FENCE_HEADER

__all__ = [
    "HEADER_NAMES",
    "H_KIND",
    "KIND_EVENT",
    "KIND_INPUT",
    "InvalidEntry",
    "OutboundRecord",
    "build_record",
    "check_template",
    "envelope_json",
    "render_topic",
]

H_MESSAGE_ID: Final = "message_id"
H_TYPE: Final = "type"
H_CAUSATION_ID: Final = "causation_id"
H_CORRELATION_ID: Final = "correlation_id"
H_SOURCE_TYPE: Final = "source_type"
H_SOURCE_ID: Final = "source_id"
H_SOURCE_SEQ: Final = "source_seq"
H_AGGREGATE_TYPE: Final = "aggregate_type"
H_AGGREGATE_ID: Final = "aggregate_id"
#: ``input`` (addressed to the aggregate the envelope names) or ``event`` (not addressed:
#: the emitting aggregate's event, not input for it); also in an event's envelope headers.
H_KIND: Final = KIND_HEADER
#: ``<database>.<collection>/<partition>:<epoch>`` of the lease under which the record was
#: published (set by the dispatcher, not by :func:`build_record`; read it with
#: :func:`aggregates.fence.parse_fence`). Epochs count per (database, collection,
#: partition); what a consumer may conclude from them: docs/design.md "Fencing".
H_FENCE: Final = FENCE_HEADER

#: Headers set on every record (the entry's own headers are added unless they clash).
HEADER_NAMES: Final = (
    H_MESSAGE_ID, H_TYPE, H_CAUSATION_ID, H_CORRELATION_ID, H_SOURCE_TYPE, H_SOURCE_ID,
    H_SOURCE_SEQ, H_AGGREGATE_TYPE, H_AGGREGATE_ID, H_KIND,
)

_PLACEHOLDER = re.compile(r"{([^{}]*)}")
_TEMPLATE_FIELDS: Final = frozenset({"aggregate_type", "target_type", "type", "collection"})


class InvalidEntry(AggboxError):
    """An outbox entry cannot become a record (it is dead-lettered, never retried)."""

    def __init__(self, entry_id: str, reason: str, *, entry: Any = None) -> None:
        self.entry_id = entry_id
        self.reason = reason
        self.entry = entry
        super().__init__(f"outbox entry {entry_id!r} cannot be published: {reason}")


@dataclass(frozen=True, slots=True)
class OutboundRecord:
    """One outbox entry ready for a publisher.

    ``collection``/``document_id`` locate the entry in MongoDB (the emitting aggregate);
    ``envelope`` is the input envelope (``Message.to_dict()`` form) and ``value`` its JSON;
    ``headers`` are :data:`HEADER_NAMES` plus the entry's own."""

    message_id: str
    collection: str
    document_id: Any
    source_type: str
    topic: str
    key: str
    value: bytes
    headers: dict[str, str]
    envelope: dict[str, Any]
    created_at: datetime | None = None
    entry: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def message(self) -> Message:
        """The envelope as a validated :class:`Message` (built on demand)."""
        return Message.from_dict(self.envelope, max_payload_bytes=0)


def check_template(template: str) -> None:
    """Raise :class:`aggregates.errors.ConfigurationError` for an unknown placeholder."""
    from aggregates.errors import ConfigurationError

    for name in _PLACEHOLDER.findall(template):
        if name not in _TEMPLATE_FIELDS:
            raise ConfigurationError(
                f"topic_template {template!r}: unknown placeholder {{{name}}}; use "
                f"{', '.join('{' + f + '}' for f in sorted(_TEMPLATE_FIELDS))}"
            )


@functools.lru_cache(maxsize=4096)  # few distinct topics; called once per entry
def render_topic(template: str, *, aggregate_type: str, target_type: str, type: str,
                 collection: str) -> str:
    values = {"aggregate_type": aggregate_type, "target_type": target_type, "type": type,
              "collection": collection}
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)  # ObjectId, Decimal128, UUID, …


def envelope_json(envelope: Mapping[str, Any]) -> bytes:
    """An envelope as compact UTF-8 JSON (one line)."""
    return _ENCODER.encode(envelope).encode()


# One encoder for every record (json.dumps with options builds a new one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_json_default)


def _id_ok(value: Any) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH
            and value.strip() == value)


def _utc_iso(value: datetime) -> str:
    tz = value.tzinfo
    if (tz is _BSON_UTC or tz is UTC) and not value.microsecond % 1000:
        return value.isoformat()  # what a tz-aware read gives: UTC, whole milliseconds
    dt = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000).isoformat()


def _fast_envelope(entry: Mapping[str, Any], entry_id: str, agg_type: str, agg_id: str,
                   src: Any) -> dict[str, Any] | None:
    """The envelope of a well-formed entry (what the writer stores) without the full
    validation of ``Message.from_dict`` — the dispatcher's hot path. ``None`` when anything
    looks unusual; the caller then validates properly (and names the problem). Payload key
    names are not re-checked here: the writer rejects ``$``/``.`` keys when it stores them."""
    etype = entry.get("type")
    payload = entry.get("payload")
    if not (_id_ok(etype) and _id_ok(agg_type) and _id_ok(agg_id)
            and isinstance(payload, dict)):
        return None
    env: dict[str, Any] = {"message_id": entry_id, "type": etype, "aggregate_type": agg_type,
                           "aggregate_id": agg_id, "payload": payload}
    created = entry.get("created_at")
    if isinstance(created, datetime):
        env["occurred_at"] = _utc_iso(created)
    elif created is not None:
        return None
    if src is not None:
        if not isinstance(src, Mapping):
            return None
        seq = src.get("seq")
        if not (_id_ok(src.get("type")) and _id_ok(src.get("id")) and isinstance(seq, int)
                and not isinstance(seq, bool) and seq >= 1):
            return None
        env["source"] = {"type": src["type"], "id": src["id"], "seq": seq}
    for name in ("correlation_id", "causation_id"):
        value = entry.get(name)
        if value is not None:
            if not _id_ok(value):
                return None
            env[name] = value
    headers = entry.get("headers")
    if headers:
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            return None
        env["headers"] = dict(headers)
    sv = entry.get("schema_version")
    if sv is not None:
        if not (isinstance(sv, int) and not isinstance(sv, bool) and 1 <= sv < 2**31):
            return None
        if sv != 1:
            env["schema_version"] = sv
    return env


def _slow_envelope(entry: Mapping[str, Any], entry_id: str, agg_type: str, agg_id: str,
                   src: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "message_id": entry_id,
        "type": entry.get("type"),
        "aggregate_type": agg_type,
        "aggregate_id": agg_id,
        "payload": entry.get("payload") if entry.get("payload") is not None else {},
        "occurred_at": entry.get("created_at"),
        "source": dict(src) if isinstance(src, Mapping) else src,
        "correlation_id": _str_or_none(entry.get("correlation_id")),
        "causation_id": _str_or_none(entry.get("causation_id")),
        "headers": entry.get("headers") or {},
        "schema_version": entry.get("schema_version"),
    }
    try:
        return Message.from_dict(raw, max_payload_bytes=0).to_dict()
    except EnvelopeError as exc:
        raise InvalidEntry(entry_id, str(exc), entry=entry) from None


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def build_record(entry: Mapping[str, Any], *, collection: str, document_id: Any,
                 source_type: str, topic_template: str) -> OutboundRecord:
    """Turn one stored outbox entry into a record. Raises :class:`InvalidEntry` when the
    entry cannot form a valid envelope (a corrupted or hand-edited document)."""
    entry_id = entry.get("id")
    if not isinstance(entry_id, str) or not entry_id:
        raise InvalidEntry(str(entry_id or "<missing>"), "the entry has no id", entry=entry)
    src = entry.get("source")
    src_map: Mapping[str, Any] = src if isinstance(src, Mapping) else {}
    emitter_type = str(src_map.get("type") or source_type)
    emitter_id = str(src_map.get("id") if src_map.get("id") is not None else document_id)
    target = entry.get("target")
    addressed = False
    if isinstance(target, Mapping) and target.get("type") and target.get("id") is not None:
        agg_type, agg_id, addressed = str(target["type"]), str(target["id"]), True
    else:
        agg_type, agg_id = emitter_type, emitter_id
    env = _fast_envelope(entry, entry_id, agg_type, agg_id, src)
    if env is None:
        env = _slow_envelope(entry, entry_id, agg_type, agg_id, src)
    if not addressed:  # the emitter's event, not input for it: say so in the envelope too
        env["headers"] = {**(env.get("headers") or {}), H_KIND: KIND_EVENT}
    etype: str = env["type"]
    topic = entry.get("topic") or render_topic(
        topic_template, aggregate_type=emitter_type, target_type=agg_type, type=etype,
        collection=collection)
    headers: dict[str, str] = dict(env.get("headers") or {})
    headers[H_MESSAGE_ID] = entry_id
    headers[H_TYPE] = etype
    headers[H_AGGREGATE_TYPE] = agg_type
    headers[H_AGGREGATE_ID] = agg_id
    headers[H_KIND] = KIND_INPUT if addressed else KIND_EVENT
    if "causation_id" in env:
        headers[H_CAUSATION_ID] = env["causation_id"]
    if "correlation_id" in env:
        headers[H_CORRELATION_ID] = env["correlation_id"]
    esrc = env.get("source")
    if esrc is not None:
        headers[H_SOURCE_TYPE] = esrc["type"]
        headers[H_SOURCE_ID] = esrc["id"]
        headers[H_SOURCE_SEQ] = str(esrc["seq"])
    key = entry.get("key")
    created = entry.get("created_at")
    return OutboundRecord(
        message_id=entry_id,
        collection=collection,
        document_id=document_id,
        source_type=emitter_type,
        topic=str(topic),
        key=str(key) if key not in (None, "") else emitter_id,
        value=envelope_json(env),
        headers=headers,
        envelope=env,
        created_at=(created if created.tzinfo else created.replace(tzinfo=UTC))
        if isinstance(created, datetime) else None,
        entry=entry,
    )
