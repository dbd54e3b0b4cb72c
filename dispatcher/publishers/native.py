"""The record builder of the native core (native/src/records.rs, issue 42): records of
entries read as raw BSON, without decoding the page into Python objects first.

``maker(...).build(entry_bson, document_id)`` returns what :class:`~dispatcher.publishers.
builder.RecordBuilder` returns for the decoded entry — the same record, header order and
value bytes (``tests/dispatcher/test_record_builder.py`` holds the two equal) — or ``None``
for anything it does not prove the same; :func:`record_of` then decodes the entry and takes
RecordBuilder (which itself falls back to the reference). :func:`scan` turns a document
read as raw BSON into a :class:`ScannedDoc`: its ``_id``, ``_type`` and ``_p`` (a dict, as
a sweep's projection reads them) and its outbox entries' ids and bytes. Without the native
core, or with ``AGGBOX_PURE=1``, documents are read and decoded as before (:data:`NATIVE`
is false, :data:`READ_OPTIONS` decodes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import bson
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from bson.tz_util import utc

from aggregates.core.native_core import native_core
from dispatcher.publishers.builder import record_builder
from dispatcher.publishers.record import OutboundRecord, render_topic

__all__ = ["DECODED", "NATIVE", "RAW", "ScannedDoc", "decoded_entry", "maker", "pending",
           "raw_builder", "record_of", "scan"]

#: How documents are decoded (the dispatcher's client is tz-aware).
DECODED: Final[CodecOptions[dict[str, Any]]] = CodecOptions(tz_aware=True, tzinfo=utc)
#: Raw BSON reads (for the native builder).
RAW: Final[CodecOptions[RawBSONDocument]] = CodecOptions(document_class=RawBSONDocument,
                                                         tz_aware=True, tzinfo=utc)


def _decode(raw: bytes | memoryview) -> dict[str, Any]:
    return bson.decode(raw, codec_options=DECODED)


def _load() -> Any:
    core = native_core(needs="RecordMaker")
    if core is None:
        return None
    core.records_init(OutboundRecord, render_topic, utc, _decode)
    Mapping.register(core.BsonEntry)
    return core


_core = _load()
#: Whether records of raw BSON are built natively.
NATIVE: Final = _core is not None


class ScannedDoc(dict[str, Any]):
    """A document read as raw BSON: ``_id``, ``_type`` and ``_p`` (as a projection reads
    them), and :attr:`entries` — its outbox entries as (id or ``None``, BSON or ``None``)."""

    __slots__ = ("entries",)

    entries: list[tuple[str | None, bytes | None]]


def scan(doc: Any) -> Mapping[str, Any]:
    """A document as read: a :class:`ScannedDoc` for raw BSON of the usual shape, else the
    decoded document (a dict read decoded is returned as it is)."""
    if type(doc) is not RawBSONDocument:
        return doc  # type: ignore[no-any-return]
    raw = doc.raw
    if _core is not None:
        if type(raw) is not bytes:  # a read batch's slice (memoryview)
            raw = bytes(raw)
        found = _core.outbox_of(raw)
        if found is not None:
            view, entries = found
            out = ScannedDoc(view)
            out.entries = entries
            return out
    return _decode(raw)


_MAKERS: dict[tuple[str, str], Any] = {}


def maker(collection: str, topic_template: str) -> Any:
    """The native maker of these two (kept: its caches live on), ``None`` without native."""
    if _core is None:
        return None
    key = (collection, topic_template)
    m = _MAKERS.get(key)
    if m is None:
        if len(_MAKERS) >= 256:
            _MAKERS.clear()
        m = _MAKERS[key] = _core.RecordMaker(collection, topic_template)
    return m


def record_of(raw: bytes, document_id: Any, *, collection: str, source_type: str,
              topic_template: str) -> OutboundRecord:
    """The record of one entry read as BSON: native where it proves the same, else the
    decoded entry through RecordBuilder (raising
    :class:`~dispatcher.publishers.record.InvalidEntry` as it does)."""
    m = maker(collection, topic_template)
    if m is not None:
        rec = m.build(raw, document_id)
        if rec is not None:
            return rec  # type: ignore[no-any-return]
    return record_builder(collection, source_type, topic_template).build(_decode(raw),
                                                                        document_id)


def decoded_entry(entry: tuple[str | None, bytes | None]) -> Mapping[str, Any]:
    """A (id, BSON) entry of a :class:`ScannedDoc`, decoded (for its dead letter); ``{}``
    when it cannot be."""
    try:
        return _decode(entry[1]) if entry[1] is not None else {}
    except Exception:
        return {}


def pending(doc: Mapping[str, Any]) -> bool:
    """Whether a document as read (decoded or scanned) has outbox entries."""
    if type(doc) is ScannedDoc:
        return bool(doc.entries)
    return bool(doc.get("outbox"))


def raw_builder(collection: str, source_type: str, topic_template: str
                ) -> Callable[[tuple[str, bytes], Any], OutboundRecord]:
    """The cycle's records of a :class:`ScannedDoc`'s (id, BSON) entries: the native
    builder's, else the decoded entry's (:func:`record_of`)."""
    m = maker(collection, topic_template)
    native_build = m.build if m is not None else None

    def build(entry: tuple[str, bytes], key: Any) -> OutboundRecord:
        rec: OutboundRecord | None = (native_build(entry[1], key)
                                      if native_build is not None else None)
        if rec is None:
            rec = record_of(entry[1], key, collection=collection, source_type=source_type,
                            topic_template=topic_template)
        return rec
    return build
