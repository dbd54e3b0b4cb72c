"""The record builder's fast path equals the reference record (pure): the same fields, the
same header order and the same value bytes for every shape of entry — the usual ones it
builds itself and the unusual ones it hands to :func:`reference_record` (issue 35: the
published bytes must not change)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import bson
import bson.errors
import pytest
from bson.codec_options import CodecOptions

from dispatcher.publishers.builder import RecordBuilder, build_record
from dispatcher.publishers.record import (
    InvalidEntry,
    OutboundRecord,
    reference_record,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)


def entry(**over: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "id": "e-1", "type": "Tick", "topic": None, "key": "agg-1",
        "payload": {"i": 1, "note": "x", "nested": {"a": [1, 2.5, None, True, "é"]}},
        "headers": {}, "causation_id": "in-1", "correlation_id": "corr-1",
        "source": {"type": "Emitter", "id": "agg-1", "seq": 3}, "created_at": NOW,
    }
    e.update(over)
    return e


def _bson(e: dict[str, Any]) -> dict[str, Any] | None:
    """The entry as the dispatcher reads it (BSON, tz-aware: bson's own UTC zone); None
    when BSON cannot hold it (then it is never read from a document)."""
    try:
        raw = bson.encode({"e": e})
    except (OverflowError, UnicodeEncodeError, bson.errors.InvalidDocument):
        return None
    return dict(bson.decode(raw, codec_options=CodecOptions(tz_aware=True))["e"])


SHAPES: list[dict[str, Any]] = [
    {},
    {"headers": {"tenant": "t1", "z": "ü"}},
    {"headers": {"aggbox-kind": "input", "tenant": "t1"}},  # a forged kind: event wins
    {"target": {"type": "Order", "id": "o-9"}},
    {"target": {"type": "Order", "id": "o-9"}, "headers": {"tenant": "t1"}},
    {"target": {"type": "Order", "id": "o-9"}, "topic": "explicit", "key": None},
    {"target": {"type": "", "id": "o-9"}},  # not a target: the emitter's event
    {"target": {"type": "Order", "id": 7}},  # an odd id: the reference path
    {"target": "Order"},
    {"correlation_id": None, "causation_id": None, "headers": None},
    {"correlation_id": "", "causation_id": "c"},
    {"correlation_id": 0},
    {"causation_id": " padded "},
    {"schema_version": 1},
    {"schema_version": 3},
    {"schema_version": 3, "headers": {"tenant": "t1"}},
    {"schema_version": 3, "target": {"type": "Order", "id": "o-9"}},
    {"schema_version": 0},
    {"schema_version": True},
    {"key": ""},
    {"key": 42},
    {"topic": "explicit"},
    {"created_at": NOW.replace(microsecond=123456)},  # µs: cut to ms by the reference
    {"created_at": NOW.replace(tzinfo=None)},  # naive = UTC
    {"created_at": NOW.astimezone(timezone(timedelta(hours=2)))},
    {"created_at": None},
    {"created_at": "2026-03-01T12:00:00Z"},
    {"source": {"type": "Emitter", "id": "agg-1", "seq": 7.0}},
    {"source": {"type": "Emitter", "id": "agg-1", "seq": 0}},
    {"source": {"type": "Emitter", "id": "agg-1", "seq": True}},
    {"source": {"type": "", "id": "agg-1", "seq": 1}},
    {"source": None},
    {"source": "Emitter"},
    {"payload": {}},
    {"payload": {"f": 1.5, "g": -0.0, "h": 1e300, "b": False, "n": None, "s": "a\"b\n\u2028"}},
    {"payload": {"k": "ü", "ü": 1, "e": "", "big": 2**63 - 1, "neg": -(2**63)}},
    {"payload": {str(i): i for i in range(20)}},  # more keys than the flat path writes
    {"payload": {"inf": float("inf")}},
    {"payload": {"x\x00": 1}},
    {"payload": {"$x": 1, "a": 2}},
    {"payload": {1: "int key"}},
    {"payload": {"s\ud800": 1}},
    {"payload": {"t": (1, 2)}},
    {"payload": {"b": b"bytes"}},
    {"payload": {"when": NOW}},  # not JSON: the reference path (an ISO string)
    {"payload": {"$set": 1}},
    {"payload": {"a.b": 1}},
    {"payload": {"big": 2**63}},
    {"payload": {"f": float("nan")}},
    {"payload": {"s": "\ud800"}},  # a lone surrogate
    {"payload": [1, 2]},
    {"payload": None},
    {"type": None},
    {"type": "T" * 513},
    {"id": None},
    {"id": "e\x00"},
    {"type": "Tick\ud800"},
    {"timer": {"due": NOW}, "target": {"type": "Order", "id": "o-1"}},
]


def _fields(r: OutboundRecord) -> tuple[Any, ...]:
    return (r.message_id, r.collection, r.document_id, r.source_type, r.topic, r.key,
            r.value, list(r.headers.items()), list(r.envelope.items()), r.created_at,
            r.entry)


def _outcome(build: Any, e: dict[str, Any]) -> Any:
    try:
        return _fields(build(e))
    except InvalidEntry as exc:
        return ("invalid", exc.entry_id, exc.reason)
    except Exception as exc:  # e.g. ValueError of the encoder: the same one either way
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("over", SHAPES, ids=[repr(s)[:60] for s in SHAPES])
@pytest.mark.parametrize("template", ["{aggregate_type}.events", "{target_type}-{type}",
                                      "{collection}.{aggregate_type}"])
def test_builder_equals_the_reference_record(over: dict[str, Any], template: str) -> None:
    builder = RecordBuilder("emitters", "Emitter", template)
    for e in (entry(**over), _bson(entry(**over))):
        if e is None:
            continue
        kept = copy.deepcopy(e)
        ref = _outcome(lambda x: reference_record(
            x, collection="emitters", document_id="agg-1", source_type="Emitter",
            topic_template=template), e)
        for _ in range(2):  # the second time through the builder's caches
            assert _outcome(lambda x: builder.build(x, "agg-1"), e) == ref
            assert _outcome(lambda x: build_record(
                x, collection="emitters", document_id="agg-1", source_type="Emitter",
                topic_template=template), e) == ref
        assert e == kept  # the entry is not changed


def test_consecutive_entries_share_nothing_they_should_not() -> None:
    """The caches (ISO time, checked ids, topics) never leak one entry's values into the
    next: a run of varied entries through one builder gives each its reference record."""
    builder = RecordBuilder("emitters", "Emitter", "{aggregate_type}.{type}")
    times = [NOW, NOW + timedelta(milliseconds=1), NOW, NOW.replace(tzinfo=None)]
    for i in range(40):
        e = _bson(entry(id=f"e-{i}", type=f"T{i % 3}", created_at=times[i % 4],
                        source={"type": f"S{i % 2}", "id": f"a-{i % 5}", "seq": i + 1},
                        correlation_id=None if i % 4 == 0 else f"c-{i % 3}",
                        target={"type": "Order", "id": f"o-{i}"} if i % 3 == 0 else None))
        assert e is not None
        ref = reference_record(e, collection="emitters", document_id=f"a-{i % 5}",
                               source_type="Emitter", topic_template="{aggregate_type}.{type}")
        assert _fields(builder.build(e, f"a-{i % 5}")) == _fields(ref)
