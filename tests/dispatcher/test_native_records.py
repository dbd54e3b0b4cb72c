"""The native record builder (native/src/records.rs) equals the record builder — hence the
reference record — for entries read as BSON (issue 42): the same fields, header order and
value bytes; an entry it does not prove the same goes the Python way (decoded, through
RecordBuilder). Documents read as raw BSON are split into their outbox entries the way the
decoded documents are read. Without the native core (not built, or ``AGGBOX_PURE=1``) the
same tests hold the raw reads' Python way to the reference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.publishers import native
from dispatcher.publishers.builder import RecordBuilder
from dispatcher.publishers.record import reference_record
from tests.dispatcher.test_record_builder import SHAPES, _fields, _outcome, entry
from tests.hypo import examples

TEMPLATES = ["{aggregate_type}.events", "{target_type}-{type}", "{collection}.{aggregate_type}"]


def _raw(e: dict[str, Any]) -> bytes | None:
    try:
        return bson.encode(e)
    except Exception:  # BSON cannot hold it: never read from a document
        return None


def _native_outcome(raw: bytes, template: str) -> Any:
    return _outcome(lambda _x: native.record_of(raw, "agg-1", collection="emitters",
                                                source_type="Emitter",
                                                topic_template=template), {})


@pytest.mark.parametrize("over", SHAPES, ids=[repr(s)[:60] for s in SHAPES])
@pytest.mark.parametrize("template", TEMPLATES)
def test_the_native_record_of_an_entry_is_its_reference_record(over: dict[str, Any],
                                                                template: str) -> None:
    raw = _raw(entry(**over))
    if raw is None:
        return
    decoded = bson.decode(raw, codec_options=native.DECODED)
    ref = _outcome(lambda x: reference_record(
        x, collection="emitters", document_id="agg-1", source_type="Emitter",
        topic_template=template), decoded)
    for _ in range(2):  # the second time through the maker's caches
        assert _native_outcome(raw, template) == ref


def test_the_usual_entries_are_built_natively() -> None:
    """Not only equal: the usual shapes (what the writer stores) never leave Rust."""
    maker = native.maker("emitters", "{aggregate_type}.events")
    if not native.NATIVE:
        assert maker is None  # pure Python: every entry is decoded first
        return
    usual: list[dict[str, Any]] = [
        {}, {"headers": {"tenant": "t1"}}, {"target": {"type": "Order", "id": "o-9"}},
        {"schema_version": 3}, {"topic": "explicit"}, {"correlation_id": None},
        {"payload": {str(i): [i, {"x": 1.5}] for i in range(20)}}]
    for over in usual:
        raw = _raw(entry(**over))
        assert raw is not None and maker.build(raw, "agg-1") is not None, over


def test_a_run_of_varied_entries_shares_nothing_it_should_not() -> None:
    from datetime import timedelta

    from tests.dispatcher.test_record_builder import NOW

    times = [NOW, NOW + timedelta(milliseconds=1), NOW]
    for i in range(40):
        e = entry(id=f"e-{i}", type=f"T{i % 3}", created_at=times[i % 3],
                  source={"type": f"S{i % 2}", "id": f"a-{i % 5}", "seq": i + 1},
                  correlation_id=None if i % 4 == 0 else f"c-{i % 3}",
                  key=f"a-{i % 5}" if i % 2 else f"k{i}",
                  target={"type": "Order", "id": f"o-{i}"} if i % 3 == 0 else None)
        raw = bson.encode(e)
        decoded = bson.decode(raw, codec_options=native.DECODED)
        ref = reference_record(decoded, collection="emitters", document_id=f"a-{i % 5}",
                               source_type="Emitter", topic_template="{aggregate_type}.{type}")
        got = native.record_of(raw, f"a-{i % 5}", collection="emitters", source_type="Emitter",
                               topic_template="{aggregate_type}.{type}")
        assert _fields(got) == _fields(ref)


_text = st.text(st.characters(codec="utf-8"), max_size=6)
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**31), 2**31 - 1),
                  st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True), _text)
_json = st.recursive(_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(_text, inner, max_size=4)), max_leaves=12)


@settings(max_examples=examples(400), deadline=None)
@given(payload=st.dictionaries(_text, _json, max_size=6),
       headers=st.one_of(st.none(), st.dictionaries(_text, _text, max_size=3)),
       ids=st.tuples(_text, _text, _text))
def test_any_payload_and_headers_equal_the_reference(payload: dict[str, Any],
                                                      headers: dict[str, str] | None,
                                                      ids: tuple[str, str, str]) -> None:
    e = entry(payload=payload, headers=headers, correlation_id=ids[0] or None,
              type=ids[1] or "Tick", source={"type": "Emitter", "id": ids[2] or "a", "seq": 1})
    raw = _raw(e)
    if raw is None:
        return
    decoded = bson.decode(raw, codec_options=native.DECODED)
    ref = _outcome(lambda x: RecordBuilder("emitters", "Emitter", "{aggregate_type}.events")
                   .build(x, "agg-1"), decoded)
    assert _native_outcome(raw, "{aggregate_type}.events") == ref


def test_a_raw_document_is_split_into_its_entries_as_the_decoded_one_reads() -> None:
    doc = {"_id": "agg-1", "_v": 3, "_type": "Emitter", "_p": 7, "state": {"n": 1},
           "outbox": [entry(id="e-1"), entry(id="e-2"), {"no": "id"}, 5]}
    scanned = native.scan(RawBSONDocument(bson.encode(doc), native.RAW))
    if not native.NATIVE:  # pure Python: decoded as a projection-less read
        assert scanned == bson.decode(bson.encode(doc), codec_options=native.DECODED)
        return
    assert isinstance(scanned, native.ScannedDoc)
    assert dict(scanned) == {"_id": "agg-1", "_type": "Emitter", "_p": 7}
    # A find's documents are slices of its batch (memoryview): the same.
    sliced = native.scan(RawBSONDocument(memoryview(bson.encode(doc)), native.RAW))
    assert isinstance(sliced, native.ScannedDoc) and sliced.entries == scanned.entries
    assert [eid for eid, _ in scanned.entries] == ["e-1", "e-2", None, None]
    first = scanned.entries[0][1]
    assert first is not None
    assert bson.decode(first, codec_options=native.DECODED) == \
        bson.decode(bson.encode(entry(id="e-1")), codec_options=native.DECODED)
    # Not the usual shape (an ObjectId _id): decoded instead.
    odd = native.scan(RawBSONDocument(bson.encode({"_id": bson.ObjectId(), "outbox": []}),
                                      native.RAW))
    assert not isinstance(odd, native.ScannedDoc) and isinstance(odd, Mapping)
    # Without _p: partition 0 (no field), as decoded documents read.
    assert "_p" not in native.scan(RawBSONDocument(bson.encode({"_id": "a", "outbox": []}),
                                                   native.RAW))


def test_a_record_keeps_its_stored_entry_as_a_mapping() -> None:
    raw = bson.encode(entry(headers={"tenant": "t1"}))
    rec = native.record_of(raw, "agg-1", collection="emitters", source_type="Emitter",
                           topic_template="{aggregate_type}.events")
    assert isinstance(rec.entry, Mapping)
    assert rec.entry["headers"] == {"tenant": "t1"} and rec.entry.get("nope", 1) == 1
    assert {**rec.entry}["id"] == "e-1"
