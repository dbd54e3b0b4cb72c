"""Outbox entry → input envelope (pure): how the dispatcher turns a stored outbox entry into
the message it publishes, shared by the dispatcher (:mod:`dispatcher.publishers.record`) and the
in-memory scenarios of :mod:`aggregates.testing`, so both deliver the same message.

- ``message_id`` = entry id, ``type``, ``payload`` — in its JSON form
  (:func:`aggregates.core.jsonvalue.json_payload`, docs/design.md "JSON values"): an entry
  the fold stored is plain JSON already and goes out as it is; one stored some other way (by
  hand, an older aggbox, a restore) has its BSON values converted by the same rule
  (``Decimal128`` and ``datetime`` as text, ``Int64`` as a number) or, for a value the rule
  refuses (NaN, infinity, bytes, …), is an :class:`InvalidEntry` naming the field — so every
  publisher and record format sees the same JSON;
- ``aggregate_type``/``aggregate_id`` = the entry's ``target`` when it is addressed to
  another aggregate, else the emitting aggregate (and then the envelope's ``headers`` carry
  ``aggbox-kind: event``: the emitter's event, not input for it);
- ``occurred_at`` = ``created_at`` (UTC, milliseconds); ``source``, ``causation_id``,
  ``correlation_id``, ``headers`` and ``schema_version`` as stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from bson.tz_util import utc as _BSON_UTC

from aggregates.core.errors import AggboxError, EnvelopeError
from aggregates.core.jsonvalue import NotJSONValue, json_payload
from aggregates.message.envelope import KIND_EVENT, KIND_HEADER, Message
from aggregates.message.fastpath import (
    headers_ok,
    id_ok,
    plain_payload,
    schema_version_ok,
    source_ok,
)

__all__ = ["EntryEnvelope", "InvalidEntry", "entry_envelope", "entry_message"]


class InvalidEntry(AggboxError):
    """An outbox entry cannot become a record (it is dead-lettered, never retried)."""

    def __init__(self, entry_id: str, reason: str, *, entry: Any = None) -> None:
        self.entry_id = entry_id
        self.reason = reason
        self.entry = entry
        super().__init__(f"outbox entry {entry_id!r} cannot be published: {reason}")


class EntryEnvelope(NamedTuple):
    """What :func:`entry_envelope` finds: the envelope (``Message.to_dict()`` form), whether
    the entry is addressed (``input``) or the emitter's event, and the emitter."""

    entry_id: str
    envelope: dict[str, Any]
    addressed: bool
    emitter_type: str
    emitter_id: str


def entry_envelope(entry: Mapping[str, Any], *, document_id: Any,
                   source_type: str) -> EntryEnvelope:
    """The input envelope of one stored outbox entry (or timer) of the document
    ``document_id`` of aggregate type ``source_type``. The emitter is the entry's ``source``
    aggregate, except for a timer (an entry with a ``timer`` field), whose emitter is the
    scheduling aggregate: ``source_type``/``document_id``. Raises :class:`InvalidEntry` when
    the entry cannot form a valid envelope (a corrupted or hand-edited document)."""
    entry_id = entry.get("id")
    if not isinstance(entry_id, str) or not entry_id:
        raise InvalidEntry(str(entry_id or "<missing>"), "the entry has no id", entry=entry)
    src = entry.get("source")
    if "timer" in entry:
        # A timer (docs/design.md "Timers"): its source is the timer's own
        # (``aggbox.timer``), its emitter the aggregate that scheduled it — the document
        # that holds it.
        emitter_type, emitter_id = source_type, str(document_id)
    else:
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
        env["headers"] = {**(env.get("headers") or {}), KIND_HEADER: KIND_EVENT}
    return EntryEnvelope(entry_id, env, addressed, emitter_type, emitter_id)


def entry_message(entry: Mapping[str, Any], *, document_id: Any, source_type: str) -> Message:
    """:func:`entry_envelope` as a validated :class:`Message` (what a consumer reads)."""
    env = entry_envelope(entry, document_id=document_id, source_type=source_type).envelope
    return Message.from_dict(env, max_payload_bytes=0)


def _utc_iso(value: datetime) -> str:
    tz = value.tzinfo
    if (tz is _BSON_UTC or tz is UTC) and not value.microsecond % 1000:
        return value.isoformat()  # what a tz-aware read gives: UTC, whole milliseconds
    dt = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000).isoformat()


def _fast_envelope(entry: Mapping[str, Any], entry_id: str, agg_type: str, agg_id: str,
                   src: Any) -> dict[str, Any] | None:
    """The envelope of a well-formed entry (what the writer stores) proven valid by the field
    rules of :mod:`aggregates.message.fastpath` (the envelope check's fast path) instead of
    ``Message.from_dict`` — the dispatcher's hot path. ``None`` when anything looks unusual;
    the caller then validates properly (and names the problem). Every string is checked for
    lone surrogates (``escapes``): an entry built in memory, not read from BSON, may hold
    one. A payload the field rules accept is plain JSON, its own JSON form (``json_payload``
    would return it as it is); anything else takes the slow path, which converts it."""
    etype = entry.get("type")
    payload = entry.get("payload")
    if not (id_ok(entry_id, True) and id_ok(etype, True) and id_ok(agg_type, True)
            and id_ok(agg_id, True) and type(payload) is dict
            and plain_payload(payload, True)):
        return None
    env: dict[str, Any] = {"message_id": entry_id, "type": etype, "aggregate_type": agg_type,
                           "aggregate_id": agg_id, "payload": payload}
    created = entry.get("created_at")
    if isinstance(created, datetime):
        try:
            env["occurred_at"] = _utc_iso(created)
        except (OverflowError, ValueError):  # out of range in UTC: from_dict names it
            return None
    elif created is not None:
        return None
    if src is not None:
        if not source_ok(src, True):
            return None
        env["source"] = {"type": src["type"], "id": src["id"], "seq": src["seq"]}
    for name in ("correlation_id", "causation_id"):
        value = entry.get(name)
        if value is not None:
            if not id_ok(value, True):
                return None
            env[name] = value
    headers = entry.get("headers")
    if headers:
        if not headers_ok(headers, True):
            return None
        env["headers"] = dict(headers)
    sv = entry.get("schema_version")
    if sv is not None:
        if not schema_version_ok(sv):
            return None
        if sv != 1:
            env["schema_version"] = sv
    return env


def _slow_envelope(entry: Mapping[str, Any], entry_id: str, agg_type: str, agg_id: str,
                   src: Any) -> dict[str, Any]:
    payload = entry.get("payload")
    if payload is None:
        payload = {}
    elif isinstance(payload, Mapping):  # (anything else: from_dict names it)
        try:
            payload = json_payload(payload)
        except NotJSONValue as exc:
            raise InvalidEntry(entry_id, f"field {exc.path!r}: {exc.reason}",
                               entry=entry) from None
    raw: dict[str, Any] = {
        "message_id": entry_id,
        "type": entry.get("type"),
        "aggregate_type": agg_type,
        "aggregate_id": agg_id,
        "payload": payload,
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
