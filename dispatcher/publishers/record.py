"""Outbox entry → published record (pure).

The record's value is the input envelope (:class:`aggregates.message.envelope.Message` as JSON), so
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring as _encode_str
from typing import Any, Final

from bson.tz_util import utc as _BSON_UTC

from aggregates.core.fastbuild import slot_builder
from aggregates.message.envelope import KIND_EVENT, KIND_HEADER, KIND_INPUT, MAX_SEQ, Message
from aggregates.message.fastpath import headers_ok, id_ok, plain_payload, schema_version_ok
from aggregates.wire.fence import FENCE_HEADER

# The envelope of an entry is built by aggregates.wire.outbound (shared with the in-memory
# scenarios of aggregates.testing); its helpers are re-exported for the tests that use them.
from aggregates.wire.outbound import (  # noqa: F401
    InvalidEntry,
    _fast_envelope,
    _slow_envelope,
    entry_envelope,
)

__all__ = [
    "HEADER_NAMES",
    "H_KIND",
    "KIND_EVENT",
    "KIND_INPUT",
    "InvalidEntry",
    "OutboundRecord",
    "RecordBuilder",
    "build_record",
    "check_template",
    "envelope_json",
    "record_builder",
    "reference_record",
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
#: :func:`aggregates.wire.fence.parse_fence`). Epochs count per (database, collection,
#: partition); what a consumer may conclude from them: docs/design.md "Fencing".
H_FENCE: Final = FENCE_HEADER

#: Headers set on every record (the entry's own headers are added unless they clash).
HEADER_NAMES: Final = (
    H_MESSAGE_ID, H_TYPE, H_CAUSATION_ID, H_CORRELATION_ID, H_SOURCE_TYPE, H_SOURCE_ID,
    H_SOURCE_SEQ, H_AGGREGATE_TYPE, H_AGGREGATE_ID, H_KIND,
)

_PLACEHOLDER = re.compile(r"{([^{}]*)}")
_TEMPLATE_FIELDS: Final = frozenset({"aggregate_type", "target_type", "type", "collection"})


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
    """Raise :class:`aggregates.core.errors.ConfigurationError` for an unknown placeholder."""
    from aggregates.core.errors import ConfigurationError

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
    """An envelope as compact UTF-8 JSON (one line); ``ValueError`` for a float NaN or
    infinity (not JSON)."""
    return _ENCODER.encode(envelope).encode()


# One encoder for every record (json.dumps with options builds a new one per call). NaN and
# infinities raise ValueError (not JSON): an envelope never holds one (Message.from_dict and
# the fast path refuse them: the entry is dead-lettered invalid_outbox_entry naming the
# field); this is the last guard, for whatever else is encoded here.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=_json_default,
                            allow_nan=False)


_new_record: Callable[..., OutboundRecord] = slot_builder(OutboundRecord, (
    "message_id", "collection", "document_id", "source_type", "topic", "key", "value",
    "headers", "envelope", "created_at", "entry"))
_KIND_EVENT_JSON: Final = _ENCODER.encode({KIND_HEADER: KIND_EVENT})


def _c_encoder() -> Callable[[Any], str]:
    """:data:`_ENCODER`'s ``encode`` of a dict, without the encoder object it builds per call
    (``JSONEncoder.iterencode`` makes a new C encoder each time): the same C encoder, made
    once, with the same options. No circular-reference check — for values the field rules
    walked (at most 60 levels deep, so never circular)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the encoder itself
        return _ENCODER.encode
    c_encode = make(None, _json_default, _encode_str, None, ":", ",", False, False, False)
    return lambda value: "".join(c_encode(value, 0))


_encode_dict: Final = _c_encoder()
_OK_CAP: Final = 8192


class RecordBuilder:
    """Records of the entries of one collection, emitter type and topic template.

    :meth:`build` equals :func:`reference_record` (the same fields, the same header order,
    the same value bytes — ``tests/dispatcher/test_record_builder.py`` holds them equal)
    at a fraction of its cost (docs/design.md "The dispatcher", record building): what is
    per collection and template is done once, topics are kept per (emitter type, target
    type, message type), names that passed the id check (types, aggregate ids, source,
    correlation and causation ids: the same for many entries) are remembered, the envelope
    dict is built directly and its JSON assembled from its parts (the payload, the entry's
    own headers through the same encoder). Anything unusual — a timer, a missing or odd
    source or target, a datetime not in UTC milliseconds, a value the field rules of
    :mod:`aggregates.message.fastpath` do not prove valid — takes :func:`reference_record`,
    which validates properly and names the problem."""

    __slots__ = ("_at", "_ok", "_topics", "collection", "source_type", "topic_template")

    def __init__(self, collection: str, source_type: str, topic_template: str) -> None:
        self.collection = collection
        self.source_type = source_type
        self.topic_template = topic_template
        self._topics: dict[tuple[str, str, str], str] = {}
        self._ok: set[str] = set()  #: strings id_ok accepted (it is a function of the value)
        #: the last ``created_at`` (UTC) and its ISO form: one per write, shared by its entries
        self._at: tuple[datetime, str] = (datetime.min.replace(tzinfo=UTC), "")

    def build(self, entry: Mapping[str, Any], document_id: Any) -> OutboundRecord:
        """The record of ``entry`` of the document ``document_id``; raises
        :class:`InvalidEntry` as :func:`build_record` does."""
        rec = self._fast(entry, document_id) if type(entry) is dict else None
        if rec is None:
            rec = reference_record(entry, collection=self.collection, document_id=document_id,
                                   source_type=self.source_type,
                                   topic_template=self.topic_template)
        return rec

    def _ids_ok(self, *values: Any) -> bool:
        ok = self._ok
        for v in values:
            if type(v) is not str:
                return False
            if v not in ok:
                if not id_ok(v, True):
                    return False
                if len(ok) >= _OK_CAP:
                    ok.clear()
                ok.add(v)
        return True

    def _fast(self, entry: dict[str, Any], document_id: Any) -> OutboundRecord | None:
        get: Callable[[str], Any] = entry.get
        eid, etype, payload, src = get("id"), get("type"), get("payload"), get("source")
        created, target = get("created_at"), get("target")
        if (type(src) is not dict or type(payload) is not dict or "timer" in entry
                or type(eid) is not str or not id_ok(eid, True)):
            return None
        sget: Callable[[str], Any] = src.get
        stype, sid, seq = sget("type"), sget("id"), sget("seq")  # (checked below: _ids_ok)
        if type(seq) is not int or not 1 <= seq <= MAX_SEQ:
            return None
        if target is None:
            agg_type, agg_id, addressed = stype, sid, False
        elif type(target) is dict and type(target.get("type")) is str and target["type"] \
                and type(target.get("id")) is str:
            agg_type, agg_id, addressed = target["type"], target["id"], True
        else:
            return None
        corr, caus = get("correlation_id"), get("causation_id")
        if not self._ids_ok(etype, stype, sid, agg_type, agg_id, "-" if corr is None else corr,
                            "-" if caus is None else caus):  # ("-": absent, which is fine)
            return None
        if type(created) is not datetime or ((tz := created.tzinfo) is not _BSON_UTC
                                             and tz is not UTC) \
                or created.microsecond % 1000 or not plain_payload(payload, True):
            return None
        headers, sv = get("headers"), get("schema_version")
        if (headers and not headers_ok(headers, True)) or (
                sv is not None and not schema_version_ok(sv)):
            return None
        last, at = self._at
        if created != last:
            at = created.isoformat()
            self._at = (created, at)
        env: dict[str, Any] = {
            "message_id": eid, "type": etype, "aggregate_type": agg_type,
            "aggregate_id": agg_id, "payload": payload, "occurred_at": at,
            "source": {"type": stype, "id": sid, "seq": seq}}
        enc = _encode_str
        opt = ""  # the JSON of the fields after "source", in the envelope's order
        if corr is not None:
            env["correlation_id"] = corr
            opt = f',"correlation_id":{enc(corr)}'
        if caus is not None:
            env["causation_id"] = caus
            opt = f'{opt},"causation_id":{enc(caus)}'
        if headers:
            env_headers = dict(headers)
            if not addressed:
                env_headers[KIND_HEADER] = KIND_EVENT
            env["headers"] = env_headers
            opt = f'{opt},"headers":{_encode_dict(env_headers)}'
        if sv is not None and sv != 1:
            env["schema_version"] = sv
            opt = f'{opt},"schema_version":{sv}'
        if not headers and not addressed:  # the emitter's event says so, last
            env["headers"] = env_headers = {KIND_HEADER: KIND_EVENT}
            opt = f'{opt},"headers":{_KIND_EVENT_JSON}'
        else:
            env_headers = env.get("headers") or {}
        value = (f'{{"message_id":{enc(eid)},"type":{enc(etype)},"aggregate_type":'
                 f'{enc(agg_type)},"aggregate_id":{enc(agg_id)},"payload":'
                 f'{_encode_dict(payload)},"occurred_at":"{at}","source":{{"type":'
                 f'{enc(stype)},"id":{enc(sid)},"seq":{seq}}}{opt}}}').encode()
        topic = get("topic")
        if not topic:
            tkey = (stype, agg_type, etype)
            topic = self._topics.get(tkey)
            if topic is None:
                if len(self._topics) >= 4096:
                    self._topics.clear()
                topic = self._topics[tkey] = render_topic(
                    self.topic_template, aggregate_type=stype, target_type=agg_type,
                    type=etype, collection=self.collection)
        key = get("key")
        rheaders = {**env_headers, H_MESSAGE_ID: eid, H_TYPE: etype, H_AGGREGATE_TYPE: agg_type,
                    H_AGGREGATE_ID: agg_id, H_KIND: KIND_INPUT if addressed else KIND_EVENT}
        if caus is not None:
            rheaders[H_CAUSATION_ID] = caus
        if corr is not None:
            rheaders[H_CORRELATION_ID] = corr
        rheaders[H_SOURCE_TYPE] = stype
        rheaders[H_SOURCE_ID] = sid
        rheaders[H_SOURCE_SEQ] = str(seq)
        return _new_record(eid, self.collection, document_id, stype, str(topic),
                           str(key) if key not in (None, "") else sid,
                           value, rheaders, env, created, entry)


_BUILDERS: dict[tuple[str, str, str], RecordBuilder] = {}


def build_record(entry: Mapping[str, Any], *, collection: str, document_id: Any,
                 source_type: str, topic_template: str) -> OutboundRecord:
    """Turn one stored outbox entry into a record. Raises :class:`InvalidEntry` when the
    entry cannot form a valid envelope (a corrupted or hand-edited document).

    Through :func:`record_builder`'s builder (a loop over many entries takes it once)."""
    return record_builder(collection, source_type, topic_template).build(entry, document_id)


def record_builder(collection: str, source_type: str, topic_template: str) -> RecordBuilder:
    """The :class:`RecordBuilder` of these three, kept (its caches live on)."""
    key = (collection, source_type, topic_template)
    builder = _BUILDERS.get(key)
    if builder is None:
        if len(_BUILDERS) >= 256:
            _BUILDERS.clear()
        builder = _BUILDERS[key] = RecordBuilder(collection, source_type, topic_template)
    return builder


def reference_record(entry: Mapping[str, Any], *, collection: str, document_id: Any,
                     source_type: str, topic_template: str) -> OutboundRecord:
    """The record of one entry the long way (any entry; the definition): the envelope of
    :func:`aggregates.wire.outbound.entry_envelope`, then headers, key, topic and JSON. What
    :class:`RecordBuilder` returns when its fast path does not apply (and must equal when it
    does)."""
    entry_id, env, addressed, emitter_type, emitter_id = entry_envelope(
        entry, document_id=document_id, source_type=source_type)
    agg_type, agg_id = str(env["aggregate_type"]), str(env["aggregate_id"])
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
