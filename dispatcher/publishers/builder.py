"""The record builder: outbox entry → record on the dispatcher's hot path (issue 35; pure).

:class:`RecordBuilder` returns what :func:`~dispatcher.publishers.record.reference_record`
returns — the same fields, the same header order, the same value bytes (``tests/dispatcher/
test_record_builder.py`` holds the two equal over every shape of entry) — at less than half
its instructions (bench/RESULTS.md): what is per collection, emitter type and template is
done once; topics are kept per (emitter type, target type, message type); names that passed
the id check (types, aggregate ids, source, correlation and causation ids: the same for many
entries) are remembered; the ISO form of the last ``created_at`` (one per write, shared by
its entries) is kept; the envelope dict is built directly and its JSON assembled from its
parts — a flat payload of strings, numbers, booleans and nulls written here, anything else
through the reference's encoder. Anything unusual — a timer, a missing or odd source or
target, a datetime not in UTC milliseconds, a value the field rules of
:mod:`aggregates.message.fastpath` do not prove valid — takes ``reference_record``, which
validates properly and names the problem (docs/design.md "The dispatcher", step 2).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any, Final

from bson.tz_util import utc as _BSON_UTC

from aggregates.core.fastbuild import slot_builder, utf8_encodable
from aggregates.message.envelope import KIND_EVENT, KIND_HEADER, KIND_INPUT, MAX_SEQ
from aggregates.message.fastpath import headers_ok, id_ok, plain_payload, schema_version_ok
from dispatcher.publishers.record import (
    _ENCODER,
    H_AGGREGATE_ID,
    H_AGGREGATE_TYPE,
    H_CAUSATION_ID,
    H_CORRELATION_ID,
    H_KIND,
    H_MESSAGE_ID,
    H_SOURCE_ID,
    H_SOURCE_SEQ,
    H_SOURCE_TYPE,
    H_TYPE,
    OutboundRecord,
    reference_record,
    render_topic,
)

__all__ = ["RecordBuilder", "build_record", "record_builder"]

_new_record: Callable[..., OutboundRecord] = slot_builder(OutboundRecord, (
    "message_id", "collection", "document_id", "source_type", "topic", "key", "value",
    "headers", "envelope", "created_at", "entry"))
_KIND_EVENT_JSON: Final = _ENCODER.encode({KIND_HEADER: KIND_EVENT})
_CACHE_CAP: Final = 8192
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
#: Payloads with more keys go through the encoder (its C loop is cheaper there).
_FLAT_MAX: Final = 16


def _flat_json(payload: dict[str, Any]) -> str | None:
    """The encoder's JSON of a flat payload (string keys; string, int, float, bool or null
    values) that :func:`plain_payload` accepts — the same text; ``None`` for anything else
    (nested, or a value or key the field rules might refuse: the caller checks it)."""
    if len(payload) > _FLAT_MAX:
        return None
    enc = encode_basestring
    out, sep = "{", ""
    for k, v in payload.items():
        if (type(k) is not str or k[:1] == "$" or "." in k or "\x00" in k
                or not (k.isascii() or utf8_encodable(k))):
            return None
        t = type(v)
        if t is str:
            if not (v.isascii() or utf8_encodable(v)):
                return None
            js = enc(v)
        elif t is int:
            if not _INT64_MIN <= v <= _INT64_MAX:
                return None
            js = int.__repr__(v)
        elif t is bool:
            js = "true" if v else "false"
        elif v is None:
            js = "null"
        elif t is float:
            if v - v != 0.0:  # NaN or infinity: not JSON
                return None
            js = float.__repr__(v)
        else:
            return None
        out = f"{out}{sep}{enc(k)}:{js}"
        sep = ","
    return out + "}"


class RecordBuilder:
    """Records of the entries of one collection, emitter type and topic template (get one
    with :func:`record_builder`)."""

    __slots__ = ("_at", "_ok", "_topics", "collection", "source_type", "topic_template")

    def __init__(self, collection: str, source_type: str, topic_template: str) -> None:
        self.collection = collection
        self.source_type = source_type
        self.topic_template = topic_template
        self._topics: dict[tuple[str, str, str], str] = {}
        self._ok: set[str] = set()  #: strings id_ok accepted (it is a function of the value)
        #: the last ``created_at`` (UTC) and its ISO form
        self._at: tuple[datetime, str] = (datetime.min.replace(tzinfo=UTC), "")

    def build(self, entry: Mapping[str, Any], document_id: Any) -> OutboundRecord:
        """The record of ``entry`` of the document ``document_id``; raises
        :class:`~dispatcher.publishers.record.InvalidEntry` as ``reference_record`` does."""
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
                if len(ok) >= _CACHE_CAP:
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
                                             and tz is not UTC) or created.microsecond % 1000:
            return None
        pjson = _flat_json(payload)
        if pjson is None:
            if not plain_payload(payload, True):
                return None
            pjson = _ENCODER.encode(payload)
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
        enc = encode_basestring
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
            opt = f'{opt},"headers":{_ENCODER.encode(env_headers)}'
        if sv is not None and sv != 1:
            env["schema_version"] = sv
            opt = f'{opt},"schema_version":{sv}'
        if not headers and not addressed:  # the emitter's event says so, last
            env["headers"] = {KIND_HEADER: KIND_EVENT}
            opt = f'{opt},"headers":{_KIND_EVENT_JSON}'
        value = (f'{{"message_id":{enc(eid)},"type":{enc(etype)},"aggregate_type":'
                 f'{enc(agg_type)},"aggregate_id":{enc(agg_id)},"payload":{pjson},'
                 f'"occurred_at":"{at}","source":{{"type":{enc(stype)},"id":{enc(sid)},'
                 f'"seq":{seq}}}{opt}}}').encode()
        topic = get("topic")
        if not topic:
            tkey = (stype, agg_type, etype)
            topic = self._topics.get(tkey)
            if topic is None:
                if len(self._topics) >= _CACHE_CAP:
                    self._topics.clear()
                topic = self._topics[tkey] = render_topic(
                    self.topic_template, aggregate_type=stype, target_type=agg_type,
                    type=etype, collection=self.collection)
        # The record's headers: the envelope's own first, then the ids (reference order).
        if headers:
            rheaders = {**env["headers"], H_MESSAGE_ID: eid, H_TYPE: etype,
                        H_AGGREGATE_TYPE: agg_type, H_AGGREGATE_ID: agg_id,
                        H_KIND: KIND_INPUT if addressed else KIND_EVENT}
        elif addressed:
            rheaders = {H_MESSAGE_ID: eid, H_TYPE: etype, H_AGGREGATE_TYPE: agg_type,
                        H_AGGREGATE_ID: agg_id, H_KIND: KIND_INPUT}
        else:
            rheaders = {H_KIND: KIND_EVENT, H_MESSAGE_ID: eid, H_TYPE: etype,
                        H_AGGREGATE_TYPE: agg_type, H_AGGREGATE_ID: agg_id}
        if caus is not None:
            rheaders[H_CAUSATION_ID] = caus
        if corr is not None:
            rheaders[H_CORRELATION_ID] = corr
        rheaders[H_SOURCE_TYPE] = stype
        rheaders[H_SOURCE_ID] = sid
        rheaders[H_SOURCE_SEQ] = str(seq)
        key = get("key")
        return _new_record(eid, self.collection, document_id, stype, str(topic),
                           str(key) if key not in (None, "") else sid, value, rheaders, env,
                           created, entry)


_BUILDERS: dict[tuple[str, str, str], RecordBuilder] = {}  # record_builder's


def build_record(entry: Mapping[str, Any], *, collection: str, document_id: Any,
                 source_type: str, topic_template: str) -> OutboundRecord:
    """Turn one stored outbox entry into a record. Raises
    :class:`~dispatcher.publishers.record.InvalidEntry` when the entry cannot form a valid
    envelope (a corrupted or hand-edited document).

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
