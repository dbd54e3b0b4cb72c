"""The dispatcher's record building as loops of their own, for bench/instructions.py
(callgrind).

Input: bench/dispatch.py's outbox (``Emitter`` documents of ``PER`` ``Tick`` entries each,
folded by the writer's own fold), stored and read back as BSON the way the dispatcher reads
it (tz-aware). The set-up builds ``n_max`` entries; a loop covers entries [start,
stop) (whole documents). Figures are per outbox entry.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

PER = 10
NOW = datetime(2026, 1, 2, tzinfo=UTC)
TOPIC_TEMPLATE = "bench-{aggregate_type}"
COMPONENTS = {
    "read_decode": "bson.decode of the documents as read (tz-aware), per entry",
    "record": "build_record of each entry: envelope, headers, key, topic, envelope JSON",
    "envelope_json": "the envelope JSON alone (the reference path's encoder)",
    "builder": "what the dispatcher's cycle did before issue 42 (after read_decode): "
               "record_builder once per document, its build per entry",
    "native": "what the dispatcher's cycle does since issue 42, from the documents' BSON "
              "to the records (its own decode included): a RawBSONDocument per document "
              "as pymongo makes it, the native scan of its outbox, the native record of "
              "each entry (Python's builder where the native core is not built)",
}


DERIVED = {"record_rest": "record − envelope_json (meaningful before issue 35's builder, "
                          "which writes its JSON itself: the record without its JSON)",
           "decode_and_build": "read_decode + builder: the path before issue 42, to compare "
                               "with native"}


def derived(per_msg: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    if "record" in per_msg and "envelope_json" in per_msg:
        out["record_rest"] = per_msg["record"] - per_msg["envelope_json"]
    if "read_decode" in per_msg and "builder" in per_msg:
        out["decode_and_build"] = per_msg["read_decode"] + per_msg["builder"]
    return out


def setup(n_max: int, uri: str | None, components: list[str]) -> dict[str, Any]:
    import bson
    from bson.codec_options import CodecOptions
    from dispatch_common import emitters

    from aggregates import Message
    from aggregates.fold import fold
    from aggregates.fold.document import snapshot_from_document
    from dispatcher import build_record

    options: CodecOptions[dict[str, Any]] = CodecOptions(tz_aware=True)
    raw: list[bytes] = []
    for d in range(n_max // PER):
        doc_id = f"agg-{d:06d}"
        res = fold(emitters, snapshot_from_document(None, doc_id),
                   [Message(message_id=f"m-{d}", type="Emit", aggregate_type="Emitter",
                            aggregate_id=doc_id, payload={"n": PER})], now=NOW)
        raw.append(bson.encode({"_id": doc_id, "outbox": res.changes.outbox}))
    ctx: dict[str, Any] = {"raw": raw, "options": options}
    docs = [bson.decode(r, codec_options=options) for r in raw]
    ctx["docs"] = docs
    ctx["envelopes"] = [_record(build_record, doc, e).envelope for doc in docs
                            for e in doc["outbox"]]
    # The reference path's encoder (the builder writes its own JSON).
    from dispatcher.publishers.record import envelope_json

    ctx["envelope_json"] = envelope_json
    return ctx


def _record(build_record: Any, doc: dict[str, Any], entry: dict[str, Any]) -> Any:
    return build_record(entry, collection="emitters", document_id=doc["_id"],
                        source_type="Emitter", topic_template=TOPIC_TEMPLATE)


def teardown(ctx: dict[str, Any]) -> None:
    pass


def run(ctx: dict[str, Any], component: str, start: int, stop: int) -> None:
    """``component``'s loop over entries [start, stop) (whole documents)."""
    d0, d1 = start // PER, stop // PER
    if component == "read_decode":
        import bson

        for r in ctx["raw"][d0:d1]:
            bson.decode(r, codec_options=ctx["options"])
    elif component == "record":
        from dispatcher import build_record

        for doc in ctx["docs"][d0:d1]:
            for e in doc["outbox"]:
                _record(build_record, doc, e)
    elif component == "builder":
        from dispatcher.publishers.builder import record_builder

        for doc in ctx["docs"][d0:d1]:
            build = record_builder("emitters", "Emitter", TOPIC_TEMPLATE).build
            for e in doc["outbox"]:
                build(e, doc["_id"])
    elif component == "native":
        from bson.raw_bson import RawBSONDocument

        from dispatcher.publishers.builder import record_builder
        from dispatcher.publishers.native import RAW, maker, record_of, scan

        for r in ctx["raw"][d0:d1]:
            doc = scan(RawBSONDocument(r, RAW))
            key = doc["_id"]
            entries = getattr(doc, "entries", None)
            if entries is None:  # no native core: decoded, through the builder
                build = record_builder("emitters", "Emitter", TOPIC_TEMPLATE).build
                for e in doc["outbox"]:
                    build(e, key)
                continue
            build = maker("emitters", TOPIC_TEMPLATE).build  # as the cycle: per document
            for _eid, raw in entries:
                if build(raw, key) is None:
                    record_of(raw, key, collection="emitters", source_type="Emitter",
                              topic_template=TOPIC_TEMPLATE)
    elif component == "envelope_json":
        encode = ctx["envelope_json"]
        for env in ctx["envelopes"][start:stop]:
            encode(env)
    else:
        raise SystemExit(f"unknown component {component!r}: {', '.join(COMPONENTS)}")
