"""Evolving schemas (docs/evolving-schemas.md): documents written with the OLD definitions
(tests/aggregates/evolving_v1.py: state and ``PlaceOrder`` at version 1) are processed with
the NEW ones (tests/aggregates/evolving_v2.py: state version 3, ``PlaceOrder`` version 2 with
an upcaster) — on mongomock, on the local server, and through the Spark pipeline. States are
migrated and stored with ``_sv``, inboxes and outboxes stay intact, redeliveries of old
messages stay duplicates; the harness and replay upcast too."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from aggregates import AggboxSettings, AggregateType, ConfigurationError, Message, StoreWriter
from aggregates.core.errors import EnvelopeError
from aggregates.core.reasons import Reason
from aggregates.debug.replay import replay_steps
from aggregates.debug.view import load_aggregate
from aggregates.fold.document import F_STATE_VERSION
from aggregates.testing import AggregateHarness, memory_database, message
from tests.aggregates import evolving_v1 as v1
from tests.aggregates import evolving_v2 as v2

NOW = datetime(2026, 3, 1, tzinfo=UTC)
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def env(mid: str, mtype: str, aid: str, payload: dict[str, Any], t: int,
        version: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "message_id": mid, "type": mtype, "aggregate_type": "Order", "aggregate_id": aid,
        "payload": payload,
        "occurred_at": (_EPOCH + timedelta(seconds=t)).isoformat().replace("+00:00", "Z")}
    if version is not None:
        out["schema_version"] = version
    return out


def place_v1(mid: str, aid: str, customer: str, address: str, t: int) -> dict[str, Any]:
    return env(mid, "PlaceOrder", aid, {"customer": customer, "address": address}, t)


#: Written with the OLD definitions.
OLD = [
    place_v1("o1-place", "o-1", "c-1", "Main St 1, Berlin", 1),
    env("o1-l1", "AddLine", "o-1", {"amount": 10}, 2),
    place_v1("o2-place", "o-2", "c-2", "High St 2, Leeds", 3),
    env("o2-l1", "AddLine", "o-2", {"amount": 7}, 4),
    place_v1("o3-place", "o-3", "c-3", "Rue 3, Paris", 5),
]

#: Processed with the NEW definitions: redeliveries, v1 and v2 messages, bad versions.
NEW = [
    OLD[1],  # redelivery (v1 AddLine): a duplicate
    env("o1-l2", "AddLine", "o-1", {"amount": 5}, 10),  # migrates o-1's state
    OLD[0],  # redelivery of a v1 PlaceOrder: still a duplicate (hash of the payload as sent)
    env("o2-place2", "PlaceOrder", "o-2",  # v2: no upcast
        {"customer_id": "c-22", "street": "Low St 9", "city": "York", "currency": "GBP"}, 11,
        version=2),
    place_v1("o4-place", "o-4", "c-4", "Via 4, Roma", 12),  # v1 on a new aggregate: upcast
    env("o4-l1", "AddLine", "o-4", {"amount": 3}, 13),
    OLD[4],  # o-3 sees only a duplicate: its document is not rewritten
    env("o5-place", "PlaceOrder", "o-5",  # newer than known → dead letter
        {"customer_id": "c-5", "street": "s", "city": "c", "currency": "EUR", "x": 1}, 14,
        version=3),
    place_v1("o6-place", "o-6", "c-6", "no comma here", 15),  # the upcaster raises
]


def messages(envs: list[dict[str, Any]]) -> list[Message]:
    return [Message.from_dict(e) for e in envs]


def writer(db: Any, registry: Any) -> StoreWriter:
    w = StoreWriter(db, registry, settings=AggboxSettings(), sleep=lambda s: None,
                    clock=lambda: NOW)
    w.ensure_indexes()
    return w


@pytest.fixture(params=["mongomock", pytest.param("local", marks=pytest.mark.mongo)])
def store_db(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "mongomock":
        yield memory_database("aggbox_test")
    else:
        yield request.getfixturevalue("db")


def write_old(db: Any) -> dict[str, dict[str, Any]]:
    """The OLD definitions write o-1 … o-3; o-2's ``_sv`` is removed (a document written
    before ``_sv`` existed: absent means 1). Returns the documents as written."""
    out = writer(db, v1.registry).process(messages(OLD))
    assert [o.outcome for o in out] == ["applied"] * len(OLD)
    db.orders.update_one({"_id": "o-2"}, {"$unset": {F_STATE_VERSION: ""}})
    docs = {d["_id"]: d for d in db.orders.find()}
    assert docs["o-1"][F_STATE_VERSION] == 1 and F_STATE_VERSION not in docs["o-2"]
    assert docs["o-1"]["state"] == {"customer": "c-1", "address": "Main St 1, Berlin",
                                    "total": 10, "lines": 1}
    return docs


def test_old_documents_under_new_definitions(store_db: Any) -> None:
    before = write_old(store_db)
    out = writer(store_db, v2.registry).process(messages(NEW))
    got = {o.message_id: (o.outcome, o.reason) for o in out}
    assert got == {
        "o1-l1": ("duplicate", None),
        "o1-l2": ("applied", None),
        "o1-place": ("duplicate", None),
        "o2-place2": ("applied", None),
        "o4-place": ("applied", None),
        "o4-l1": ("applied", None),
        "o3-place": ("duplicate", None),
        "o5-place": ("dead_lettered", Reason.UNKNOWN_SCHEMA_VERSION),
        "o6-place": ("dead_lettered", Reason.UPCAST_FAILED),
    }
    docs = {d["_id"]: d for d in store_db.orders.find()}
    # Migrated (rename, split, new required field) and stored with _sv = 3.
    assert docs["o-1"]["state"] == {"customer_id": "c-1", "street": "Main St 1",
                                    "city": "Berlin", "currency": "EUR", "total": 15,
                                    "lines": 2}
    assert docs["o-2"]["state"] == {"customer_id": "c-22", "street": "Low St 9",
                                    "city": "York", "currency": "GBP", "total": 7, "lines": 1}
    assert docs["o-4"]["state"] == {"customer_id": "c-4", "street": "Via 4", "city": "Roma",
                                    "currency": "EUR", "total": 3, "lines": 1}
    for aid in ("o-1", "o-2", "o-4"):
        assert docs[aid][F_STATE_VERSION] == 3
    # o-3 saw only a duplicate: not rewritten, still the old shape (migrated when read).
    assert docs["o-3"] == before["o-3"]
    view = load_aggregate(store_db, v2.registry, "Order", "o-3")
    assert view.state == v2.Order(currency="EUR", customer_id="c-3", street="Rue 3",
                                  city="Paris")
    # Dedup records and outboxes: the old entries intact, the new ones appended.
    for aid in ("o-1", "o-2"):
        old_inbox = [e[0] for e in before[aid]["inbox"]]
        assert [e[0] for e in docs[aid]["inbox"]][:len(old_inbox)] == old_inbox
        assert docs[aid]["outbox"][:len(before[aid]["outbox"])] == before[aid]["outbox"]
    assert [e[0] for e in docs["o-1"]["inbox"]] == ["o1-place", "o1-l1", "o1-l2"]
    assert [(e["type"], e["payload"]) for e in docs["o-1"]["outbox"]] == [
        ("OrderPlaced", {"customer": "c-1"}), ("LineAdded", {"amount": 10}),
        ("LineAdded", {"amount": 5})]
    assert [(e["type"], e["payload"]) for e in docs["o-2"]["outbox"]][-1] == (
        "OrderPlaced", {"customer_id": "c-22"})
    # Dead letters keep the message as delivered (not upcast), with the reason's detail.
    dl = {d["message_id"]: d for d in store_db.aggbox_dead_letters.find()}
    assert "newer than the latest" in dl["o5-place"]["error"]
    assert dl["o5-place"]["message"]["schema_version"] == 3
    assert "ValueError" in dl["o6-place"]["error"]
    assert "place_order_v1_to_v2" in dl["o6-place"]["error"]
    assert dl["o6-place"]["message"]["payload"] == {"customer": "c-6",
                                                    "address": "no comma here"}
    # Everything again: all duplicates (and the same dead letters).
    again = writer(store_db, v2.registry).process(messages(OLD + NEW))
    assert {o.message_id: o.outcome for o in again} == {
        **{m["message_id"]: "duplicate" for m in OLD + NEW},
        "o5-place": "dead_lettered", "o6-place": "dead_lettered"}
    assert {d["_id"]: d["_v"] for d in store_db.orders.find()} == {
        d["_id"]: d["_v"] for d in docs.values()}


def test_state_written_by_a_newer_version_or_failing_migration(store_db: Any) -> None:
    write_old(store_db)
    store_db.orders.update_one({"_id": "o-1"}, {"$set": {F_STATE_VERSION: 4}})
    store_db.orders.update_one({"_id": "o-2"}, {"$unset": {"state.address": ""}})
    before = {d["_id"]: d for d in store_db.orders.find()}
    out = writer(store_db, v2.registry).process(messages([
        env("o1-l9", "AddLine", "o-1", {"amount": 1}, 20),
        env("o2-l9", "AddLine", "o-2", {"amount": 1}, 21),
        env("o3-l9", "AddLine", "o-3", {"amount": 1}, 22),
    ]))
    got = {o.message_id: (o.outcome, o.reason, o.detail) for o in out}
    assert got["o1-l9"][:2] == ("dead_lettered", Reason.INVALID_STATE)
    assert "written by a newer version" in str(got["o1-l9"][2])
    assert got["o2-l9"][:2] == ("dead_lettered", Reason.INVALID_STATE)
    assert "rename_and_split" in str(got["o2-l9"][2])
    assert "KeyError" in str(got["o2-l9"][2])
    assert got["o3-l9"][:2] == ("applied", None)
    after = {d["_id"]: d for d in store_db.orders.find()}
    assert after["o-1"] == before["o-1"] and after["o-2"] == before["o-2"]


def test_harness_and_replay_upcast_and_migrate() -> None:
    h = AggregateHarness(v2.orders, aggregate_id="o-1")
    step = h.when(message("PlaceOrder", {"customer": "c-1", "address": "A 1, B"},
                          to=v2.orders, id="o-1"))
    assert step.outcome == "applied", step.detail
    assert h.state == v2.Order(currency="EUR", customer_id="c-1", street="A 1", city="B")
    assert step.emitted[0]["payload"] == {"customer_id": "c-1"}
    step = h.when(message("PlaceOrder", {"customer_id": "c-2", "street": "S", "city": "C",
                                         "currency": "USD"}, to=v2.orders, id="o-1",
                          schema_version=2))
    assert step.outcome == "applied" and h.state.currency == "USD"
    step = h.when(message("PlaceOrder", {}, to=v2.orders, id="o-1", schema_version=3))
    assert (step.outcome, step.reason) == ("dead_lettered", Reason.UNKNOWN_SCHEMA_VERSION)
    step = h.when(message("PlaceOrder", {"customer": "x"}, to=v2.orders, id="o-1"))
    assert (step.outcome, step.reason) == ("dead_lettered", Reason.UPCAST_FAILED)
    assert "KeyError" in str(step.detail)

    # Replay from a document the OLD definitions wrote (no _sv: version 1).
    db = memory_database("aggbox_test")
    writer(db, v1.registry).process(messages(OLD[:2]))
    db.orders.update_one({"_id": "o-1"}, {"$unset": {F_STATE_VERSION: ""}})
    doc = db.orders.find_one({"_id": "o-1"})
    run = replay_steps(v2.orders, [OLD[1], env("o1-x", "PlaceOrder", "o-1",
                                               {"customer": "c-9", "address": "X, Y"}, 30)],
                       start=doc, now=NOW)
    assert [(s.outcome, s.reason) for s in run.steps] == [("duplicate", None),
                                                           ("applied", None)]
    assert run.state == v2.Order(currency="EUR", customer_id="c-9", street="X", city="Y",
                                 total=10, lines=1)
    assert run.snapshot.state_version == 3


def test_definitions_and_envelope() -> None:
    assert v2.orders.message_version("PlaceOrder") == 2
    assert v2.orders.message_version("AddLine") == 1
    assert v1.orders.message_version("PlaceOrder") == 1
    with pytest.raises(ConfigurationError, match="expected from_version=2"):
        v2.orders.upcaster("PlaceOrder", from_version=1)
    with pytest.raises(ConfigurationError, match="expected from_version=3"):
        v2.orders.state_migration(from_version=1)
    t = AggregateType("T", state=dict, collection="ts", state_version=2)
    with pytest.raises(ConfigurationError, match="raise state_version"):
        t.state_migration(from_version=1)(lambda d: d)
        t.state_migration(from_version=2)
    with pytest.raises(ConfigurationError, match="state_version"):
        AggregateType("U", state=dict, state_version=0)
    # The envelope field: default 1 (not written back), validated.
    m = Message.from_dict(env("m", "AddLine", "o-1", {}, 1))
    assert m.schema_version == 1 and "schema_version" not in m.to_dict()
    m = Message.from_dict(env("m", "AddLine", "o-1", {}, 1, version=2))
    assert m.schema_version == 2 and Message.from_dict(m.to_dict()) == m
    for bad in (0, -1, "2", True, 1.5, 2**31):
        with pytest.raises(EnvelopeError, match="schema_version"):
            Message.from_dict(env("m", "AddLine", "o-1", {}, 1, version=bad))  # type: ignore[arg-type]


@pytest.mark.spark
@pytest.mark.mongo
def test_pipeline_over_old_documents(spark_session: Any, db: Any, mongo_uri: str,
                                     tmp_path: Path) -> None:
    from spark.pipeline import Pipeline
    from spark.settings import SparkSettings
    from tests.spark.helpers import write_jsonl

    write_old(db)
    write_jsonl(tmp_path / "in.jsonl", NEW)
    settings = AggboxSettings.load(mongodb_uri=mongo_uri, database=db.name)
    pipeline = Pipeline(spark_session, aggregates="tests.aggregates.evolving_v2",
                        settings=settings, spark_settings=SparkSettings.load(shuffle_partitions=2),
                        mongodb_uri=mongo_uri)
    result = pipeline.run_batch([str(tmp_path / "in.jsonl")])
    assert result.counts["applied"] == 4
    assert result.counts["duplicate"] == 3
    assert result.counts["dead_lettered"] == 2
    docs = {d["_id"]: d for d in db.orders.find()}
    assert docs["o-1"]["state"]["customer_id"] == "c-1" and docs["o-1"][F_STATE_VERSION] == 3
    assert docs["o-4"]["state"]["street"] == "Via 4"
    reasons = {d["message_id"]: d["reason"] for d in db.aggbox_dead_letters.find()}
    assert reasons == {"o5-place": Reason.UNKNOWN_SCHEMA_VERSION, "o6-place": Reason.UPCAST_FAILED}


def test_emit_with_a_schema_version_reaches_the_envelope() -> None:
    from aggregates import Emit, Handled
    from aggregates.fold import fold
    from aggregates.fold.document import Snapshot
    from dispatcher.publishers.builder import build_record

    shops = AggregateType("Shop", state=dict, collection="shops")

    @shops.handles("Sell")
    def sell(state: dict[str, Any], msg: Message) -> Handled[dict[str, Any]]:
        v2_payload = {"customer_id": "shop", "street": "S", "city": "C", "currency": "EUR"}
        return state, [Emit("PlaceOrder", v2_payload, to=v2.orders.ref("o-9"),
                            schema_version=msg.payload.get("sv", 2))]

    res = fold(shops, Snapshot("s-1"), [message("Sell", {}, to=shops, id="s-1")], now=NOW)
    (entry,) = res.changes.outbox
    assert entry["schema_version"] == 2
    # The dispatcher's fast path, and its validating one (an unusual correlation_id).
    for e in (entry, {**entry, "correlation_id": 5}):
        rec = build_record(e, collection="shops", document_id="s-1", source_type="Shop",
                           topic_template="{target_type}")
        msg = Message.from_dict(rec.envelope)
        assert msg.schema_version == 2 and v2.orders.upcast(msg) is msg
    bad = fold(shops, Snapshot("s-1"), [message("Sell", {"sv": 0}, to=shops, id="s-1")],
               now=NOW)
    assert [(o.outcome, o.reason) for o in bad.outcomes] == [("dead_lettered", Reason.INVALID_EMIT)]
    assert "schema_version" in str(bad.outcomes[0].detail)
